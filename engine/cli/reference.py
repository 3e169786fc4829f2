"""The CLI reference, generated from the parser: `python -m engine.cli.reference` writes
docs/cli.md (`--check`: writes nothing, exit 1 when the committed page differs; a test runs
it). One section per command: what it does, its usage, every option with its help, and its
examples, so the page never drifts from `sopctl COMMAND --help`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from engine.cli.parser import COMMANDS, EXAMPLES, build_parser

__all__ = ["PAGE", "reference", "main"]

PAGE = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def reference() -> str:
    """The page's text."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help or "" for choice in sub._choices_actions}
    parts = ["# Command-line reference", "",
             "Generated from sopctl's parser by `python -m engine.cli.reference`; "
             "`sopctl COMMAND --help` prints the same.", ""]
    parts += [f"- [`sopctl {name}`](#sopctl-{name}): {helps.get(name, '')}" for name in COMMANDS]
    for name in COMMANDS:
        parts += _command(name, sub.choices[name], helps.get(name, ""))
    return "\n".join(parts) + "\n"


def _command(name: str, parser: argparse.ArgumentParser, summary: str) -> list[str]:
    usage = " ".join(parser.format_usage().split()).removeprefix("usage: ")
    lines = ["", f"## sopctl {name}", "", summary[:1].upper() + summary[1:] + ".", ""]
    if parser.description:
        lines += [parser.description, ""]
    lines += ["```", usage, "```", "", "| argument | what it does |", "|---|---|"]
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        metavar = action.metavar if isinstance(action.metavar, str) else action.dest
        flags = ", ".join(action.option_strings) or metavar
        if action.choices and not isinstance(action.choices, dict):
            flags += " {" + ",".join(map(str, action.choices)) + "}"
        text = (action.help or "").replace("|", "\\|")
        if action.default not in (None, False, [], argparse.SUPPRESS) and "default" not in text:
            text += f" (default: {action.default})"
        lines.append(f"| `{flags}` | {text} |")
    lines += ["", "Examples:", "", "```sh", *EXAMPLES.get(name, ()), "```"]
    return lines


def main(argv: list[str] | None = None) -> int:
    check = "--check" in (argv if argv is not None else sys.argv[1:])
    text = reference()
    if check:
        same = PAGE.exists() and PAGE.read_text(encoding="utf-8") == text
        if not same:
            print(f"{PAGE} is out of date: run python -m engine.cli.reference", file=sys.stderr)
        return 0 if same else 1
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(PAGE.parents[1])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
