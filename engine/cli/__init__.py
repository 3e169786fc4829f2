"""`sopctl`, the command line: the parser, the commands, the live display, the reports."""

from engine.cli.commands import entry, main
from engine.cli.parser import build_parser

__all__ = ["main", "entry", "build_parser"]
