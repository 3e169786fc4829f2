"""`python -m engine.cli ...` is `sopctl ...`."""

from engine.cli.commands import entry

entry()
