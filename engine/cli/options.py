"""What a command's flags mean as run options: one function (`run_options`), used by `run`,
`resume`, `answer`, `replay` and `batch`.

A flag names its option the same way in every command that has it (`--rounds` is
`max_rounds`, `--out` of `run` is `workspace`); an option whose flag a command lacks keeps
its default (`replay` has no `--model`: the recorded run's). The handlers add what is not a
flag: the progress display and tracing (`observers`). Loaded by the handlers that run
something, never by `validate` (the run's types import the run's modules).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from engine.cli.person import TerminalPerson
from engine.journal.pool import POOL_ENV, Pool
from engine.run.events import RunObserver
from engine.run.options import RunOptions
from engine.run.people import Person

__all__ = ["run_options", "open_pool"]


def run_options(args: argparse.Namespace, observers: Sequence[RunObserver] = ()) -> RunOptions:
    """The run options of a command line; `observers` watch the run."""
    flags = vars(args)
    return RunOptions(
        model=flags.get("model"), max_rounds=flags.get("rounds"), budget_usd=flags.get("budget"),
        workspace=flags.get("workspace"), allow_exec=flags.get("allow_exec", False),
        isolate=flags.get("isolate"), allow_network=flags.get("allow_network", False),
        allow_hosts=flags.get("allow_host", ()), api_base=flags.get("api_base"),
        response_format=flags.get("response_format"),
        price=flags.get("price"), max_answer_chars=flags.get("max_answer_chars"), send_to=flags.get("send_to", ()), observers=tuple(observers),
        reuse_identical=flags.get("reuse_identical", False),
        person=_person(args) if "no_input" in flags else None,
        pool=open_pool(args) if "pool" in flags else None)


def open_pool(args: argparse.Namespace) -> Pool | None:
    """The experience pool of `--pool` (else $SOPCTL_POOL), opened and checked; None: none."""
    path = getattr(args, "pool", None) or os.environ.get(POOL_ENV, "").strip()
    if not path:
        return None
    return Pool.open(path, threshold=getattr(args, "pool_threshold", None) or 0.8)


def _person(args: argparse.Namespace) -> Person | None:
    """The terminal, when stdin and stderr (where questions are asked) are one and --no-input
    is not given; else nobody: a question makes the run wait."""
    if args.no_input or not (sys.stdin.isatty() and sys.stderr.isatty()):
        return None
    return TerminalPerson()
