"""`sopctl`: thin command line over the library. Parses flags, calls the library, renders.

Exit codes (contract §6): 0 ok, 1 diagnostics with an error / run stopped by failure or
budget, 2 usage or invalid file, 130 stopped by Ctrl-C, 143 stopped by SIGTERM (handled as
Ctrl-C is: the run ends `interrupted`, journaled), 75 (EX_TEMPFAIL: try again later) the run
waits for a person: its question is journaled (`sopctl answer`, then `sopctl resume`). No traceback ever reaches the user: every `SopError` is
rendered as a message, anything else as an internal error with a pointer to report it.
The parser is `engine.cli.parser`'s; a command is a handler here (`@handles(NAME)`) and a
subparser there. Heavy modules (the compiler, the run, asyncio, litellm) are imported inside
the handlers that need them, so that `--help` and `validate` load none they do not use.
"""

from __future__ import annotations

import argparse
import shlex
import contextlib
import logging
import json
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING, NoReturn
from collections.abc import Callable, Iterator, Sequence

from engine.cli.parser import COMMANDS, build_parser, parse_args
from engine.errors import SopError, UsageError, install_hint, require_utf8
from engine.load.files import FileRefused, read_bounded
from engine.load.schema import schema_text
from engine.models.hosted import import_litellm_in_background
from engine.models.registry import MODEL_ENV, default_model, is_hosted

if TYPE_CHECKING:
    from types import FrameType

    from engine.compile.compiler import CompiledSop
    from engine.journal.history import RunState
    from engine.run.events import RunObserver
    from engine.run.people import PersonAnswer
    from engine.run.team import RunResult

__all__ = ["main", "build_parser", "COMMANDS", "HANDLERS", "handles"]


Handler = Callable[[argparse.Namespace], int]

HANDLERS: dict[str, Handler] = {}
"""Each command's handler by name (`engine.cli.parser.COMMANDS` names the same commands)."""


def handles(name: str) -> Callable[[Handler], Handler]:
    """Register the decorated function as the handler of command `name`."""
    def register(handler: Handler) -> Handler:
        HANDLERS[name] = handler
        return handler
    return register


@handles("validate")
def cmd_validate(args: argparse.Namespace) -> int:
    from engine.compile.compiler import check_path   # here: `--help` needs no compiler (pydantic)
    from engine.check.diagnostics import format_report

    text, code = format_report([check_path(f, args.include_path) for f in args.files], args.format, args.strict)
    print(text)
    return code


@handles("graph")
def cmd_graph(args: argparse.Namespace) -> int:
    from engine.compile.compiler import check_path   # here: `--help` needs no compiler (pydantic)
    from engine.check.diagnostics import format_report
    from engine.check.graph import format_graph

    result = check_path(args.file, args.include_path)
    if result.graph is not None:  # drawn even when a loop is unbounded: it shows the loop
        print(format_graph(result.graph, args.format), end="")
    if not result.ok:
        print(format_report([result], "text", False)[0], file=sys.stderr)
        return 1
    return 0


@handles("lsp")
def cmd_lsp(args: argparse.Namespace) -> int:
    try:
        from engine.lsp.server import serve   # here: pygls is the optional `lsp` extra
    except ModuleNotFoundError as exc:
        raise UsageError(f"`sopctl lsp` needs the lsp extra ({exc.name} is not installed)",
                         hint=install_hint("lsp")) from None
    return serve(max(args.debounce_ms, 0) / 1000, tuple(args.include_path))


@handles("migrate")
def cmd_migrate(args: argparse.Namespace) -> int:
    from engine.cli.migrate import migrate_files  # here: only migrate needs ruamel's token positions

    return migrate_files(args)


@handles("init")
def cmd_init(args: argparse.Namespace) -> int:
    """Write a starter SOP from a template, check it, and say what to run next."""
    from engine.cli.scaffold import init_sop   # here: as every handler, only what its command needs
    from engine.compile.compiler import check_path   # here: `--help` needs no compiler (pydantic)

    path = init_sop(args.name, args.template, force=args.force)
    checked = check_path(str(path))
    if not checked.ok:   # a template that does not validate is our bug; never hide it
        raise UsageError(f"{path}: the {args.template} template does not validate; please report it")
    quoted = shlex.quote(str(path))
    print(f"sopctl: wrote {path} (template {args.template})")
    print(f"next:   sopctl validate {quoted}\n"
          f"        sopctl run {quoted} --idea \"...\" --model fake    # an offline dry run\n"
          f"        sopctl run {quoted} --idea \"...\"                 # on the embedded model")
    return 0


@handles("schema")
def cmd_schema(args: argparse.Namespace) -> int:
    print(schema_text(), end="")
    return 0


LOCAL_MODEL_NOTE = ("sopctl: the model is `local`: SmolLM2-135M, a small model embedded for offline runs. "
                    "Expect the run's structure (files, documents, messages) to be sound and their content "
                    "weak.")
"""Said when a run on the embedded model starts."""

REAL_MODEL_HINT = ("sopctl: for real work, give a real model: --model openai/gpt-4o-mini (with OPENAI_API_KEY; "
                   "any litellm model string works), or a server of your own: --model openai/NAME "
                   "--api-base http://localhost:8000/v1")
"""Said when a run on the embedded model ends."""


@handles("run")
def cmd_run(args: argparse.Namespace) -> int:
    """Compile, check inputs, refuse exec/unusable models before starting, run, report.

    Exit: 0 idle or max_rounds, 1 failed or budget, 130 interrupted (Ctrl-C; 143 for
    SIGTERM), 2 usage,
    invalid file, or a run that cannot start. Progress goes to stderr; the summary (or the
    one JSON object of `--format json`) to stdout.
    """
    from engine import api   # here: the run (and asyncio) only for the commands that run
    from engine.cli.options import run_options
    from engine.compile.compiler import check_path
    from engine.check.diagnostics import format_report

    _preload_hosted_stack(args.model or os.environ.get(MODEL_ENV, ""))  # known before compiling
    checked = check_path(args.file, args.include_path)
    if checked.compiled is None or not checked.ok:
        print(format_report([checked], "text", False)[0], file=sys.stderr)
        return 2
    if checked.diagnostics:  # warnings only: say them, then run
        print(format_report([checked], "text", False)[0], file=sys.stderr)
    model = default_model(checked.compiled, args.model)
    _preload_hosted_stack(model)
    inputs = api.parse_input_flags(args.input, args.idea)
    if model == "local":
        print(LOCAL_MODEL_NOTE, file=sys.stderr)
    with _display(checked.compiled) as display, _tracing(args, checked.compiled) as traced:
        result = api.run(checked.compiled, inputs, run_options(args, [display, *traced]))
    code = _print_result(result, args.format)
    if model == "local":
        print(REAL_MODEL_HINT, file=sys.stderr)
    return code


def _preload_hosted_stack(model: str) -> None:
    """A hosted model's run needs litellm (seconds to import): start importing it now, in a
    thread, so it overlaps compiling the SOP and preparing the run. An `openai/` model sent
    by the direct client (engine.models.openai_http) needs only the openai SDK and the cost map: it
    prepares those instead, and its first request never waits for litellm."""
    if not model or not is_hosted(model):
        return
    if model.startswith("openai/"):
        from engine.models import openai_http   # here: it imports asyncio (the SDK only in prepare)

        if openai_http.may_route_directly(model):   # the cost map is read in the thread
            openai_http.prepare()
            return
    import_litellm_in_background()


@handles("resume")
def cmd_resume(args: argparse.Namespace) -> int:
    """Continue an interrupted run from its journal; output and exit code as `sopctl run`."""
    from engine import api   # here: the run (and asyncio) only for the commands that run
    from engine.cli.options import run_options

    folder = api.open_for_resume(args.run_dir, force=args.force)
    origin = folder.origin
    print(f"sopctl: resuming run {origin.first.run_id} of {origin.first.sop_name} "
          f"({origin.ended_status or 'interrupted'})", file=sys.stderr)
    if args.model and args.model != origin.last.model:
        print(f"sopctl: note: the run used model '{origin.last.model}'; answers journaled for "
              f"it are not reused for '{args.model}'", file=sys.stderr)
    with _display(folder.compiled) as display, _tracing(args, folder.compiled) as traced:
        result = api.resume(folder, run_options(args, [display, *traced]), force=args.force)
    return _print_result(result, args.format)


@handles("pool")
def cmd_pool(args: argparse.Namespace) -> int:
    """`sopctl pool list|clear|prune`: look after the experience pool."""
    from engine.cli.options import open_pool   # here: the pool's types are the run's

    pool = open_pool(args)
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


@handles("answer")
def cmd_answer(args: argparse.Namespace) -> int:
    """Record a person's answer to a waiting run's question; with --resume, go on at once.

    Exit 0 when recorded (with --resume: as `sopctl resume`); 2 when the run is not waiting,
    --question names another question, or the answer does not fit (the run still waits)."""
    from engine import api   # here: the run (and asyncio) only for the commands that run

    question = api.answer(args.run_dir, _answer_of(args), question_id=args.question)
    print(f"sopctl: answer recorded for question {question.id} ({question.role}.{question.action})"
          + ("" if args.resume else f"; continue with `sopctl resume {args.run_dir}`"),
          file=sys.stderr)
    return cmd_resume(args) if args.resume else 0


def _answer_of(args: argparse.Namespace) -> PersonAnswer:
    """The answer the flags give: a review decision, or a value (text, file, JSON)."""
    from engine.run.people import PersonAnswer   # here: the run's types (pydantic) for `answer` only

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
        value = _json_answer(args.json)
    elif args.file is not None:
        value = _read_answer_file(args.file)
    else:
        value = args.text
    return PersonAnswer("answer", value)   # to a review question: an edit


def _json_answer(text: str) -> object:
    """`answer --json`: valid JSON, nested no deeper than a model's answer may be."""
    from engine.models.answers import MAX_ANSWER_DEPTH, nesting_depth   # here: `answer` only

    too_deep = UsageError(f"--json nests deeper than {MAX_ANSWER_DEPTH} levels",
                          "an answer is an object or a list of plain values")
    if len(text) > ANSWER_FILE_LIMIT:
        raise UsageError(f"--json is longer than {ANSWER_FILE_LIMIT:,} characters")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--json is not valid JSON: {exc.msg} (column {exc.colno})") from None
    except RecursionError:        # the C decoder's own depth limit
        raise too_deep from None
    if nesting_depth(value) > MAX_ANSWER_DEPTH:
        raise too_deep
    return value


ANSWER_FILE_LIMIT = 1_000_000
"""Most bytes `answer --file` reads: as `--input KEY=@FILE`, it goes into prompts."""


def _read_answer_file(path: str) -> str:
    """The text of `answer --file`: a regular file (never a FIFO or `/dev/zero`), bounded, UTF-8."""
    try:
        return read_bounded(path, ANSWER_FILE_LIMIT).decode("utf-8")
    except FileRefused as exc:
        raise UsageError(f"cannot read --file {path}: {exc.message}", exc.hint) from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"cannot read --file {path}: not UTF-8 text (offset {exc.start})",
                         "convert it to UTF-8 (e.g. iconv -t UTF-8)") from None


@handles("replay")
def cmd_replay(args: argparse.Namespace) -> int:
    """Re-run a recorded run in --out with every answer from its journal; exit 1 on divergence."""
    from engine import api   # here: the run (and asyncio) only for the commands that run
    from engine.cli.options import run_options

    folder = api.open_for_replay(args.run_dir)
    interrupted = not folder.origin.ended_status
    with _display(folder.compiled) as display, _tracing(args, folder.compiled) as traced:
        replayed = api.replay(folder, args.out, run_options(args, [display, *traced]))
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
    from engine.cli.live import make_display   # here: the display observes the run's events

    display = make_display(list(compiled.spec.roles))
    try:
        yield display
    finally:
        getattr(display, "close", lambda: None)()


@contextlib.contextmanager
def _tracing(args: argparse.Namespace, compiled: CompiledSop) -> Iterator[list[RunObserver]]:
    """OpenTelemetry spans of the run, when `--trace` or OTEL_* asks (none otherwise: the
    extra is not even imported); what is buffered is exported before the command exits."""
    from engine.run.tracing import start_tracing, tracing_wanted   # here: the run's

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
    from engine.cli.report import print_result   # here: the report reads journals (asyncio)

    return print_result(result, fmt)


@handles("batch")
def cmd_batch(args: argparse.Namespace) -> int:
    """Many runs of one SOP over a dataset, or a folder of runs replayed (`engine.cli.batch`)."""
    from engine.cli import batch   # here: the batch runs (the run, asyncio)

    return batch.cmd_batch(args)


@handles("runs")
def cmd_runs(args: argparse.Namespace) -> int:
    """List the runs under a folder from their journals; an unreadable one is a row, not a crash."""
    from engine.cli.report import format_runs, printable, runs_json   # here: journals import the run (asyncio)
    from engine.journal.history import list_runs

    rows = list_runs(args.dir)
    if args.format == "json":
        print(json.dumps(runs_json(rows), indent=2))
    elif not rows:
        print(f"no runs under {args.dir}")
    else:
        print(printable(format_runs(rows)))
    return 0


@handles("show")
def cmd_show(args: argparse.Namespace) -> int:
    """A run's timeline and usage, or (`--format json`) its result object, from the journal alone."""
    from engine.cli.report import format_show, printable, result_object   # here: journals import the run (asyncio)
    from engine.journal.history import read_run

    state = read_run(args.run_dir)
    if args.prompts is not None:
        return _show_prompts(args, state)
    if args.format == "json":
        print(json.dumps(result_object(state), indent=2, ensure_ascii=False))
    else:
        print(printable(format_show(state)))
    return 0


def _show_prompts(args: argparse.Namespace, state: RunState) -> int:
    """`show --prompts [ACTION]`: the requests as sent and their answers (JSON: the result
    object with a `prompts` list)."""
    from engine.cli.prompts import format_prompts   # here: journals import the run (asyncio)
    from engine.cli.report import printable, result_object
    from engine.journal.history import read_exchanges

    exchanges = read_exchanges(args.run_dir, args.prompts or None)
    if args.format == "json":
        data = {**result_object(state), "prompts": [e.to_json() for e in exchanges]}
        print(json.dumps(data, indent=2, ensure_ascii=False))
    else:
        print(printable(format_prompts(exchanges)))
    return 0


@handles("report")
def cmd_report(args: argparse.Namespace) -> int:
    """A run as one self-contained HTML file (`-o`, default RUN_DIR.html), from its journal."""
    from engine.cli.html_report import default_output, write_report   # here: journals import the run
    from engine.journal.history import read_run

    state = read_run(args.run_dir)
    written = write_report(state, args.output or default_output(args.run_dir))
    print(f"sopctl: report of run {state.run_id} ({state.status}) written to {written}",
          file=sys.stderr)
    return 0


_SIGTERM_EXIT = 128 + 15


def entry() -> None:
    """The `sopctl` program: `main`, then the process ends at once (`exit_promptly`)."""
    exit_promptly(main())


def exit_promptly(code: int) -> NoReturn:
    """End the process with `code` as soon as its work is done, without the interpreter's
    shutdown (freeing every module object, litellm's atexit hooks: from half a second with
    `fake` to several with litellm loaded). By the time `main` returns the journal is closed
    (every answer and event on disk), traces are flushed and MCP servers stopped; what is
    left is printed output, logging and the local model, closed here, so nothing is lost.
    Work still going on that the shutdown would wait for or end (a thread that is not a
    daemon, a child process, Ray) gets the ordinary exit."""
    if _still_working():
        sys.exit(code)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):   # a closed pipe: nothing left to say
            stream.flush()
    logging.shutdown()
    local = sys.modules.get("engine.models.local")
    if local is not None:
        with contextlib.suppress(Exception):   # freeing the model is courtesy, not data
            local._unload()
    os._exit(code)


def _still_working() -> bool:
    """Whether something the interpreter's shutdown takes care of is still running."""
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        return True
    children = sys.modules.get("multiprocessing")
    if children is not None and children.active_children():
        return True
    ray = sys.modules.get("ray")
    return ray is not None and bool(getattr(ray, "is_initialized", lambda: False)())


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    handler = HANDLERS[args.command]
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


_ARG_NAMES = {"file": "FILE", "files": "FILE", "run_dir": "RUN_DIR", "dir": "DIR", "workspace": "--out"}
"""The positional arguments, as `--help` names them, and the flags named otherwise than
`--dest` (the others are)."""
