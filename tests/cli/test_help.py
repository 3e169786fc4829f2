"""`--help` that helps: every option of every command says what it does, and every command's
help ends with examples that parse as written."""

from __future__ import annotations

import argparse
import shlex

import pytest

from engine.cli.parser import COMMANDS, EXAMPLES, build_parser, parse_args


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_and_argument_has_help_text(command: str) -> None:
    parser = _subparsers()[command]
    silent = [a.option_strings or a.dest for a in parser._actions if not a.help]
    assert silent == [], f"sopctl {command}: no help text for {silent}"


@pytest.mark.parametrize("command", COMMANDS)
def test_the_help_ends_with_examples_that_parse(command: str) -> None:
    examples = EXAMPLES.get(command)
    assert examples, f"sopctl {command} --help shows no example"
    text = _subparsers()[command].format_help()
    assert text.rstrip().endswith(examples[-1])     # kept on one line: it can be copied
    for line in examples:
        argv = shlex.split(line.split("|")[0].split(">")[0])
        assert argv[0] == "sopctl"
        args = parse_args(argv[1:])               # a typo in an example would exit here
        assert args.command == command


def test_the_cli_reference_page_is_the_parsers_output() -> None:
    """docs/cli.md is generated (python -m engine.cli.reference): it never drifts from --help."""
    from engine.cli.reference import main as reference

    assert reference(["--check"]) == 0
