"""`sopctl`, the command line: commands, the live display, the text and JSON reports."""

from engine.cli.commands import build_parser, main

__all__ = ["main", "build_parser"]
