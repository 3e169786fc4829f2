"""`sopctl`: thin command line over the library. Parses flags, calls the library, renders.

Exit codes (contract §6): 0 ok, 1 diagnostics with an error / run stopped by failure or
budget, 2 usage or invalid file, 130 stopped by Ctrl-C, 143 stopped by SIGTERM (handled as
Ctrl-C is: the run ends `interrupted`, journaled), 75 (EX_TEMPFAIL: try again later) the run
waits for a person: its question is journaled (`sopctl answer`, then `sopctl resume`). No traceback ever reaches the user: every `SopError` is
rendered as a message, anything else as an internal error with a pointer to report it.
Heavy modules (litellm, the interpreter) are imported inside the handlers that need them.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import re
import shutil
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any
from collections.abc import Callable, Iterator, Sequence

from engine import __version__
from engine.errors import SopError, UsageError, require_utf8

if TYPE_CHECKING:
    from types import FrameType

    from engine.compile.compiler import CompiledSop
    from engine.journal.history import RunState
    from engine.models.types import Price
    from engine.run.events import RunObserver
    from engine.run.people import Person, PersonAnswer
    from engine.run.team import RunResult

__all__ = ["main", "build_parser"]


Handler = Callable[[argparse.Namespace], int]


def cmd_validate(args: argparse.Namespace) -> int:
    from engine.compile.compiler import check_path
    from engine.check.diagnostics import format_report

    text, code = format_report([check_path(f, args.include_path) for f in args.files], args.format, args.strict)
    print(text)
    return code


def cmd_graph(args: argparse.Namespace) -> int:
    from engine.compile.compiler import check_path
    from engine.check.diagnostics import format_report
    from engine.check.graph import format_graph

    result = check_path(args.file, args.include_path)
    if result.graph is not None:  # drawn even when a loop is unbounded: it shows the loop
        print(format_graph(result.graph, args.format), end="")
    if not result.ok:
        print(format_report([result], "text", False)[0], file=sys.stderr)
        return 1
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from engine.load.schema import schema_text

    print(schema_text(), end="")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Compile, check inputs, refuse exec/unusable models before starting, run, report.

    Exit: 0 idle or max_rounds, 1 failed or budget, 130 interrupted (Ctrl-C; 143 for
    SIGTERM), 2 usage,
    invalid file, or a run that cannot start. Progress goes to stderr; the summary (or the
    one JSON object of `--format json`) to stdout.
    """
    from engine import api
    from engine.compile.compiler import check_path
    from engine.check.diagnostics import format_report
    from engine.models.registry import MODEL_ENV, default_model

    _preload_hosted_stack(args.model or os.environ.get(MODEL_ENV, ""))  # known before compiling
    checked = check_path(args.file, args.include_path)
    if checked.compiled is None or not checked.ok:
        print(format_report([checked], "text", False)[0], file=sys.stderr)
        return 2
    if checked.diagnostics:  # warnings only: say them, then run
        print(format_report([checked], "text", False)[0], file=sys.stderr)
    _preload_hosted_stack(default_model(checked.compiled, args.model))
    inputs = api.parse_input_flags(args.input, args.idea)
    with _display(checked.compiled) as display, _tracing(args, checked.compiled) as traced:
        result = api.run(checked.compiled, inputs, model=args.model, max_rounds=args.rounds,
                         budget_usd=args.budget, workspace=args.out, allow_exec=args.allow_exec,
                         api_base=args.api_base, price=args.price, isolate=args.isolate,
                         allow_network=args.allow_network, send_to=args.send_to,
                         observers=[display, *traced], person=_person(args), pool=_pool(args),
                         allow_hosts=args.allow_host)
    return _print_result(result, args.format)


def _preload_hosted_stack(model: str) -> None:
    """A hosted model's run needs litellm (seconds to import): start importing it now, in a
    thread, so it overlaps compiling the SOP and preparing the run. An `openai/` model sent
    by the direct client (engine.models.openai_http) needs only httpx and the cost map: it
    prepares those instead, and its first request never waits for litellm."""
    from engine.models.registry import is_hosted

    if not model or not is_hosted(model):
        return
    if model.startswith("openai/"):
        from engine.models import openai_http

        if openai_http.may_route_directly(model):   # the cost map is read in the thread
            openai_http.prepare()
            return
    from engine.models.hosted import import_litellm_in_background

    import_litellm_in_background()


def cmd_resume(args: argparse.Namespace) -> int:
    """Continue an interrupted run from its journal; output and exit code as `sopctl run`."""
    from engine import api

    folder = api.open_for_resume(args.run_dir, force=args.force)
    origin = folder.origin
    print(f"sopctl: resuming run {origin.first.run_id} of {origin.first.sop_name} "
          f"({origin.ended_status or 'interrupted'})", file=sys.stderr)
    if args.model and args.model != origin.last.model:
        print(f"sopctl: note: the run used model '{origin.last.model}'; answers journaled for "
              f"it are not reused for '{args.model}'", file=sys.stderr)
    with _display(folder.compiled) as display, _tracing(args, folder.compiled) as traced:
        result = api.resume(folder, budget=args.budget, rounds=args.rounds, model=args.model,
                            allow_exec=args.allow_exec, force=args.force, observers=(display, *traced),
                            api_base=args.api_base, price=args.price, isolate=args.isolate,
                            allow_network=args.allow_network, person=_person(args),
                            pool=_pool(args), allow_hosts=args.allow_host)
    return _print_result(result, args.format)


def _pool(args: argparse.Namespace) -> Any:
    """The experience pool of `--pool` (else $SOPCTL_POOL), opened and checked; None: none."""
    from engine.journal.pool import POOL_ENV, Pool

    path = getattr(args, "pool", None) or os.environ.get(POOL_ENV, "").strip()
    if not path:
        return None
    return Pool.open(path, threshold=getattr(args, "pool_threshold", None) or 0.8)


def cmd_pool(args: argparse.Namespace) -> int:
    """`sopctl pool list|clear|prune`: look after the experience pool."""
    pool = _pool(args)
    if pool is None:
        raise UsageError("no experience pool: give --pool FILE (or set $SOPCTL_POOL)")
    try:
        if args.pool_command == "list":
            entries = pool.entries(args.action)
            if args.format == "json":
                print(json.dumps([{"id": e.id, "action": e.action, "score": e.score, "uses": e.uses,
                                   "prompt": e.prompt, "answer": e.answer} for e in entries], indent=2))
            else:
                for e in entries:
                    print(f"{e.id:>5}  {e.action:<24} score {e.score:<6g} uses {e.uses:<4} "
                          f"{_one_line(e.prompt)}")
                print(f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'} in {pool.path}")
        elif args.pool_command == "clear":
            print(f"removed {pool.clear(args.action)} entries from {pool.path}")
        else:
            if args.keep is None and args.min_score is None:
                raise UsageError("prune needs --keep N and/or --min-score S")
            print(f"pruned {pool.prune(args.keep, args.min_score)} entries from {pool.path}")
    finally:
        pool.close()
    return 0


def _one_line(text: str, width: int = 60) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[:width - 1] + "…"


def _person(args: argparse.Namespace) -> Person | None:
    """The terminal, when stdin and stderr (where questions are asked) are one and --no-input
    is not given; else nobody: a question makes the run wait."""
    if getattr(args, "no_input", False) or not (sys.stdin.isatty() and sys.stderr.isatty()):
        return None
    from engine.cli.person import TerminalPerson

    return TerminalPerson()


def cmd_answer(args: argparse.Namespace) -> int:
    """Record a person's answer to a waiting run's question; with --resume, go on at once.

    Exit 0 when recorded (with --resume: as `sopctl resume`); 2 when the run is not waiting,
    --question names another question, or the answer does not fit (the run still waits)."""
    from engine import api

    question = api.answer(args.run_dir, _answer_of(args), question_id=args.question)
    print(f"sopctl: answer recorded for question {question.id} ({question.role}.{question.action})"
          + ("" if args.resume else f"; continue with `sopctl resume {args.run_dir}`"),
          file=sys.stderr)
    return cmd_resume(args) if args.resume else 0


def _answer_of(args: argparse.Namespace) -> PersonAnswer:
    """The answer the flags give: a review decision, or a value (text, file, JSON)."""
    from engine.run.people import PersonAnswer

    values = [name for name in ("text", "file", "json") if getattr(args, name) is not None]
    decisions = [name for name in ("approve", "reject") if getattr(args, name)]
    if len(values) + len(decisions) != 1:
        raise UsageError("give exactly one answer: --text, --file, --json, --approve or --reject",
                         "see the question (and what it takes) with `sopctl show RUN_DIR`")
    if args.comment is not None and not args.reject:
        raise UsageError("--comment goes with --reject")
    if args.approve:
        return PersonAnswer("approve")
    if args.reject:
        return PersonAnswer("reject", comment=args.comment or "")
    if args.json is not None:
        try:
            value = json.loads(args.json)
        except json.JSONDecodeError as exc:
            raise UsageError(f"--json is not valid JSON: {exc.msg} (column {exc.colno})") from None
    elif args.file is not None:
        value = _read_answer_file(args.file)
    else:
        value = args.text
    return PersonAnswer("answer", value)   # to a review question: an edit


def _read_answer_file(path: str) -> str:
    from engine.errors import UsageError

    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read --file {path}: {getattr(exc, 'strerror', None) or exc}") from None


def cmd_replay(args: argparse.Namespace) -> int:
    """Re-run a recorded run in --out with every answer from its journal; exit 1 on divergence."""
    from engine import api

    folder = api.open_for_replay(args.run_dir)
    interrupted = not folder.origin.ended_status
    with _display(folder.compiled) as display, _tracing(args, folder.compiled) as traced:
        replayed = api.replay(folder, args.out, allow_exec=args.allow_exec, observers=(display, *traced),
                              isolate=args.isolate, allow_network=args.allow_network,
                              allow_hosts=args.allow_host)
    code = _print_result(replayed.result, args.format)
    if replayed.diverged:
        note = (" (the recorded run was interrupted: its journal has answers only up to where "
                "it stopped)") if interrupted else ""
        print(f"sopctl: replay diverged from {args.run_dir}{note}", file=sys.stderr)
        return 1
    return code


@contextlib.contextmanager
def _display(compiled: CompiledSop) -> Iterator[RunObserver]:
    """The progress display of a run on stderr (a live table on a terminal), closed after."""
    from engine.cli.live import make_display

    display = make_display(list(compiled.spec.roles))
    try:
        yield display
    finally:
        getattr(display, "close", lambda: None)()


@contextlib.contextmanager
def _tracing(args: argparse.Namespace, compiled: CompiledSop) -> Iterator[list[RunObserver]]:
    """OpenTelemetry spans of the run, when `--trace` or OTEL_* asks (none otherwise: the
    extra is not even imported); what is buffered is exported before the command exits."""
    from engine.run.tracing import start_tracing, tracing_wanted

    if not tracing_wanted(getattr(args, "trace", False)):
        yield []
        return
    tools = {a: " ".join(s.command or []) for a, s in compiled.spec.actions.items() if s.kind == "exec"}
    tracing = start_tracing(getattr(args, "trace", False), tools)
    try:
        yield [tracing.observer] if tracing is not None else []
    finally:
        if tracing is not None:
            tracing.close()


def _print_result(result: RunResult, fmt: str) -> int:
    from engine.cli.report import print_result

    return print_result(result, fmt)


def cmd_runs(args: argparse.Namespace) -> int:
    """List the runs under a folder from their journals; an unreadable one is a row, not a crash."""
    import json

    from engine.cli.report import format_runs, runs_json
    from engine.journal.history import list_runs

    rows = list_runs(args.dir)
    if args.format == "json":
        print(json.dumps(runs_json(rows), indent=2))
    elif not rows:
        print(f"no runs under {args.dir}")
    else:
        print(format_runs(rows))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    """A run's timeline and usage, or (`--format json`) its result object, from the journal alone."""
    import json

    from engine.cli.report import format_show, result_object
    from engine.journal.history import read_run

    state = read_run(args.run_dir)
    if args.prompts is not None:
        return _show_prompts(args, state)
    if args.format == "json":
        print(json.dumps(result_object(state), indent=2, ensure_ascii=False))
    else:
        print(format_show(state))
    return 0


def _show_prompts(args: argparse.Namespace, state: RunState) -> int:
    """`show --prompts [ACTION]`: the requests as sent and their answers (JSON: the result
    object with a `prompts` list)."""
    import json

    from engine.cli.prompts import format_prompts
    from engine.cli.report import result_object
    from engine.journal.history import read_exchanges

    exchanges = read_exchanges(args.run_dir, args.prompts or None)
    if args.format == "json":
        data = {**result_object(state), "prompts": [e.to_json() for e in exchanges]}
        print(json.dumps(data, indent=2, ensure_ascii=False))
    else:
        print(format_prompts(exchanges))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """A run as one self-contained HTML file (`-o`, default RUN_DIR.html), from its journal."""
    from engine.cli.html_report import default_output, write_report
    from engine.journal.history import read_run

    state = read_run(args.run_dir)
    written = write_report(state, args.output or default_output(args.run_dir))
    print(f"sopctl: report of run {state.run_id} ({state.status}) written to {written}",
          file=sys.stderr)
    return 0


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--idea", help="the one-line requirement (sets the `idea` input)")
    p.add_argument("--input", action="append", default=[], metavar="KEY=VALUE",
                   help="set a declared input (KEY=@FILE: the file's text); repeatable")
    p.add_argument("--send-to", action="append", default=[], metavar="ROLE",
                   help="send the idea to this role (id or name) only, not to all; repeatable; "
                        "overrides the file's team.send_to")
    p.add_argument("--model", help="litellm model string, or `local` / `fake` "
                   "(default: $SOPCTL_MODEL, then the file's llm.model, then `local`)")
    p.add_argument("--rounds", type=int, metavar="N", help="override team.max_rounds")
    p.add_argument("--budget", type=float, metavar="USD", help="override team.budget_usd (0 = no limit)")
    p.add_argument("--out", metavar="DIR", help="workspace folder (default ./runs/<run-id>)")
    p.add_argument("--allow-exec", action="store_true",
                   help="allow actions of kind exec, the terminal tool and stdio MCP servers to run commands")
    _add_allow_host_flag(p)
    _add_isolation_flags(p)
    p.add_argument("--format", choices=["text", "json"], default="text", help="result format")
    _add_hosted_flags(p)
    _add_no_input_flag(p)
    _add_trace_flag(p)
    _add_pool_flags(p)


def _add_pool_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pool", metavar="FILE",
                   help="experience pool (SQLite) of accepted answers across runs: an exact hit "
                        "is reused with no model call, a near one offered as an example "
                        "(default: $SOPCTL_POOL; none when unset)")
    p.add_argument("--pool-threshold", type=float, metavar="S",
                   help="similarity (0-1, word sets) from which an entry is offered (default 0.8)")


def _add_no_input_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-input", action="store_true",
                   help="never ask on the terminal: a question for a person makes the run wait "
                        "(status waiting, exit 75) until `sopctl answer`")


def _add_trace_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", action="store_true",
                   help="send OpenTelemetry traces of the run (GenAI conventions) to "
                        "$OTEL_EXPORTER_OTLP_ENDPOINT (default http://localhost:4318); "
                        "needs the otel extra; the OTEL_* variables turn it on too")


def _add_resume_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--budget", type=float, metavar="USD", help="raise (or set) the budget")
    p.add_argument("--rounds", type=int, metavar="N", help="override max_rounds")
    p.add_argument("--model", help="override the model the run started with")
    p.add_argument("--allow-exec", action="store_true")
    _add_allow_host_flag(p)
    _add_isolation_flags(p)
    p.add_argument("--force", action="store_true", help="resume even if the SOP file changed")
    p.add_argument("--format", choices=["text", "json"], default="text")
    _add_hosted_flags(p)
    _add_no_input_flag(p)
    _add_trace_flag(p)
    _add_pool_flags(p)


def _add_hosted_flags(p: argparse.ArgumentParser) -> None:
    """Where hosted models live and what an unpriced one costs: the user's, never a file's."""
    p.add_argument("--api-base", metavar="URL", type=_api_base,
                   help="base URL of an OpenAI-compatible server for hosted models "
                        "(default: litellm's, e.g. $OPENAI_API_BASE)")
    p.add_argument("--price", metavar="IN,OUT", type=_price,
                   help="USD per million prompt and completion tokens of a model litellm "
                        "cannot price (a self-hosted one), e.g. 0.2,0.6")


def _api_base(text: str) -> str:
    if not re.match(r"https?://[^\s/]+", text):
        raise argparse.ArgumentTypeError(f"not an http(s) URL: {text!r}")
    return text


def _price(text: str) -> Price:
    from engine.models.types import Price

    parts = text.split(",")
    try:
        given, taken = (float(part) for part in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected IN,OUT in USD per million tokens (e.g. 0.2,0.6), got {text!r}") from None
    if not all(math.isfinite(v) and v >= 0 for v in (given, taken)):
        raise argparse.ArgumentTypeError(f"prices must be finite and >= 0, got {text!r}")
    return Price(given / 1e6, taken / 1e6)


def _add_allow_host_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-host", action="append", default=[], metavar="HOST",
                   help="let the file's HTTP MCP servers at HOST be reached; repeatable")


def _add_isolation_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--isolate", action="store_true",
                   help="run exec commands under bubblewrap: / read-only, the workspace writable, "
                        "no view of other processes, no network")
    p.add_argument("--allow-network", action="store_true", help="with --isolate: keep the network")


def _add_batch_common_flags(p: argparse.ArgumentParser) -> None:
    """The flags `batch` shares with `run`."""
    _add_isolation_flags(p)
    _add_hosted_flags(p)
    _add_include_flag(p)


def _add_include_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--include-path", action="append", default=[], metavar="DIR",
                   help="a folder whose files `include:` may name, besides the SOP's own folder "
                        "(repeatable; a resume uses the run's again)")


class _Formatter(argparse.HelpFormatter):
    """argparse's, with the terminal's width asked once per parser build: argparse makes a
    formatter for every option it adds (only to check its metavar), and each one asks the
    terminal (an ioctl and two environment lookups). Help printed later asks afresh."""

    width: int | None = None   # set while a parser is built (`_building`)

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        super().__init__(prog, indent_increment, max_help_position,
                         width if width is not None else _Formatter.width)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose formatter is `_Formatter`; its subparsers are `_Parser`s too
    (add_subparsers makes them of the parser's own class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)


@contextlib.contextmanager
def _building() -> Iterator[None]:
    """The terminal's width asked once while the parser is built (see `_Formatter`)."""
    with _BUILDING:   # one build at a time: each sets the width, then clears it
        _Formatter.width = shutil.get_terminal_size().columns
        try:
            yield
        finally:
            _Formatter.width = None


_BUILDING = threading.Lock()


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The `sopctl` parser; with `only` (one of COMMANDS), with that command's subparser
    alone: it parses that command's arguments as the whole parser does, and costs a tenth
    to build (a run pays it: argparse formats and translates every option as it is added)."""
    with _building():
        return _build_parser(only)


def _build_parser(only: str | None) -> argparse.ArgumentParser:
    parser = _Parser(prog="sopctl", description="Declarative multi-agent SOP pipelines: "
                     "validate, inspect and run SOP files (MetaGPT semantics).")
    parser.add_argument("--version", action="version", version=f"sopctl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    if only in (None, "validate"):
        p = sub.add_parser("validate", help="check SOP files; every problem with file:line:col")
        p.add_argument("files", nargs="+", metavar="FILE")
        p.add_argument("--format", choices=["text", "json"], default="text")
        p.add_argument("--strict", action="store_true", help="treat warnings as errors")
        _add_include_flag(p)
        p.set_defaults(handler=cmd_validate)

    if only in (None, "graph"):
        p = sub.add_parser("graph", help="print the compiled watch graph")
        p.add_argument("file", metavar="FILE")
        p.add_argument("--format", choices=["mermaid", "dot", "json"], default="mermaid")
        _add_include_flag(p)
        p.set_defaults(handler=cmd_graph)

    if only in (None, "schema"):
        p = sub.add_parser("schema", help="print the JSON Schema of SOP files")
        p.set_defaults(handler=cmd_schema)

    if only in (None, "run"):
        p = sub.add_parser("run", help="run an SOP")
        p.add_argument("file", metavar="FILE")
        _add_run_flags(p)
        _add_include_flag(p)
        p.set_defaults(handler=cmd_run)

    if only in (None, "resume"):
        p = sub.add_parser("resume", help="continue an interrupted (or waiting) run from its journal")
        p.add_argument("run_dir", metavar="RUN_DIR")
        _add_resume_flags(p)
        p.set_defaults(handler=cmd_resume)

    if only in (None, "answer"):
        p = sub.add_parser("answer", help="answer the question a waiting run waits for")
        p.add_argument("run_dir", metavar="RUN_DIR")
        p.add_argument("--question", metavar="ID", help="the question's id (`sopctl show`): refused "
                       "if the run waits for another one")
        p.add_argument("--text", help="the answer as text (for an output tree: a JSON object)")
        p.add_argument("--file", metavar="FILE", help="the answer read from a file (as --text)")
        p.add_argument("--json", metavar="JSON", help="the answer as JSON: an object for an output tree")
        p.add_argument("--approve", action="store_true", help="a review: publish the output as it is")
        p.add_argument("--reject", action="store_true", help="a review: ask the model again (--comment)")
        p.add_argument("--comment", help="with --reject: what the model should change")
        p.add_argument("--resume", action="store_true", help="resume the run right after (resume's flags apply)")
        _add_resume_flags(p)
        p.set_defaults(handler=cmd_answer)

    if only in (None, "replay"):
        p = sub.add_parser("replay", help="re-run with every model answer taken from a run's journal")
        p.add_argument("run_dir", metavar="RUN_DIR")
        p.add_argument("--out", metavar="DIR", required=True, help="workspace of the replay")
        p.add_argument("--allow-exec", action="store_true")
        _add_allow_host_flag(p)
        _add_isolation_flags(p)
        p.add_argument("--format", choices=["text", "json"], default="text")
        _add_trace_flag(p)
        p.set_defaults(handler=cmd_replay)

    if only in (None, "batch"):
        from engine.cli.batch import add_batch_parser   # flags only: nothing heavy is imported

        add_batch_parser(sub, _add_batch_common_flags)

    if only in (None, "runs"):
        p = sub.add_parser("runs", help="list runs under a folder (default ./runs)")
        p.add_argument("dir", nargs="?", default="runs", metavar="DIR")
        p.add_argument("--format", choices=["text", "json"], default="text")
        p.set_defaults(handler=cmd_runs)

    if only in (None, "show"):
        p = sub.add_parser("show", help="a run's timeline, tokens and cost per action")
        p.add_argument("run_dir", metavar="RUN_DIR")
        p.add_argument("--format", choices=["text", "json"], default="text")
        p.add_argument("--prompts", nargs="?", const="", default=None, metavar="ACTION",
                       help="print every request as sent (system and user messages, re-asks) "
                            "and its answer; only ACTION's (id or Role.action) when given")
        p.set_defaults(handler=cmd_show)

    if only in (None, "report"):
        p = sub.add_parser("report", help="a run as one HTML file: graph, timeline, cost, messages, prompts")
        p.add_argument("run_dir", metavar="RUN_DIR")
        p.add_argument("-o", "--output", metavar="FILE",
                       help="the HTML file to write (default: RUN_DIR.html, beside the run folder)")
        p.set_defaults(handler=cmd_report)

    if only in (None, "pool"):
        p = sub.add_parser("pool", help="list, clear or prune the experience pool (--pool or $SOPCTL_POOL)")
        p.add_argument("pool_command", choices=["list", "clear", "prune"], metavar="list|clear|prune")
        p.add_argument("--pool", metavar="FILE", help="the pool file (default: $SOPCTL_POOL)")
        p.add_argument("--action", help="only this action's entries (list, clear)")
        p.add_argument("--keep", type=int, metavar="N", help="prune: keep the N best entries per action")
        p.add_argument("--min-score", type=float, metavar="S", help="prune: drop entries scored below S")
        p.add_argument("--format", choices=["text", "json"], default="text")
        p.set_defaults(handler=cmd_pool)
    return parser


_SIGTERM_EXIT = 128 + 15


COMMANDS = ("validate", "graph", "schema", "run", "resume", "answer", "replay", "batch", "runs",
            "show", "report", "pool")
"""Every command, in the order `sopctl --help` lists them (a test keeps it in step)."""


@functools.cache
def _parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser, built once per process and command: building all of it (a hundred
    options, each help text looked up by gettext on disk) costs more than a run's engine
    time per call on a fast model. A command line that starts with a command gets a parser
    of that command alone; anything else (`--help`, a typo) the whole one."""
    return build_parser(only)


def _fresh_lists(args: argparse.Namespace) -> argparse.Namespace:
    """An `append` option left unused holds its default list itself, shared by every parse of
    the one parser: each command gets its own copy."""
    for name, value in vars(args).items():
        if isinstance(value, list):
            setattr(args, name, list(value))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _fresh_lists(_parser(argv[0] if argv and argv[0] in COMMANDS else None).parse_args(argv))
    handler: Handler = args.handler
    with _sigterm_as_ctrl_c() as terminated:
        code = _handle(handler, args)
    return _SIGTERM_EXIT if terminated and code == 130 else code


def _handle(handler: Handler, args: argparse.Namespace) -> int:
    try:
        _refuse_undecodable_args(args)
        return handler(args)
    except SopError as exc:
        print(f"sopctl: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:  # `sopctl show RUN | head`: the reader left, nothing is wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("sopctl: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the last line of defence against a traceback
        print(f"sopctl: internal error: {type(exc).__name__}: {exc}\n"
              "  hint: this is a bug in sopctl; please report it with the command you ran",
              file=sys.stderr)
        return 1


@contextlib.contextmanager
def _sigterm_as_ctrl_c() -> Iterator[list[int]]:
    """SIGTERM (`kill`, a service manager, a CI timeout) stops a run as Ctrl-C does.

    The handler hands the signal to whatever handles Ctrl-C at that moment: inside a run,
    asyncio's, which cancels the run so that it ends `interrupted` with its RunEnded
    journaled; elsewhere Python's, which raises KeyboardInterrupt. The list it yields is
    non-empty once SIGTERM came, so the exit code can say which signal it was (143)."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():   # signals are main-thread only
        yield received
        return

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        ctrl_c = signal.getsignal(signal.SIGINT)
        if not callable(ctrl_c):        # Ctrl-C ignored or default: stop as Python's would
            raise KeyboardInterrupt
        ctrl_c(signal.SIGINT, frame)

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield received
    finally:
        signal.signal(signal.SIGTERM, previous)


def _refuse_undecodable_args(args: argparse.Namespace) -> None:
    """Command-line text that is not UTF-8 cannot be journaled or printed: refused (exit 2)
    before anything starts, so no run folder is left behind half made."""
    for name, value in vars(args).items():
        for text in value if isinstance(value, list) else [value]:
            if isinstance(text, str):
                require_utf8(text, _ARG_NAMES.get(name, "--" + name.replace("_", "-")))


_ARG_NAMES = {"file": "FILE", "files": "FILE", "run_dir": "RUN_DIR", "dir": "DIR"}
"""The positional arguments, as `--help` names them (flags are named `--flag`)."""
