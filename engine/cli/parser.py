"""`sopctl`'s command line: the parser, built per command and once per process, its help
formatting, and the flags of each command. The handlers are `engine.cli.commands`'.

Building an argparse parser costs: every option's help text is formatted and translated
as it is added. So each command's subparser is built by its own function (`_command`), and
a command line that names a command builds that command's alone (`parse_args`); `--help`
or a typo builds the whole parser. This module imports nothing heavy: `--help` and
`validate` load it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import re
import shutil
import threading
from typing import Any
from collections.abc import Callable, Iterator, Sequence

from engine import __version__
from engine.models.types import Price

__all__ = ["COMMANDS", "EXAMPLES", "build_parser", "parse_args"]


_ENTRIES: dict[str, Callable[[Any], None]] = {}
"""Each command's subparser builder, in the order `sopctl --help` lists them."""


def _command(name: str) -> Callable[[Callable[[Any], None]], Callable[[Any], None]]:
    """Register the decorated function as the builder of command `name`'s subparser."""
    def register(add: Callable[[Any], None]) -> Callable[[Any], None]:
        _ENTRIES[name] = add
        return add
    return register


# --- the commands' parsers ------------------------------------------------------------


@_command("validate")
def _validate(sub: Any) -> None:
    p = sub.add_parser("validate", help="check SOP files; every problem with file:line:col")
    p.add_argument("files", nargs="+", metavar="FILE", help="the SOP files to check (*.sop.yaml)")
    p.add_argument("--format", choices=["text", "json"], default="text",
                   help="diagnostics as compiler-style text (default) or one JSON object")
    p.add_argument("--strict", action="store_true", help="treat warnings as errors")
    _add_include_flag(p)


@_command("graph")
def _graph(sub: Any) -> None:
    p = sub.add_parser("graph", help="print the compiled watch graph")
    p.add_argument("file", metavar="FILE", help="the SOP file")
    p.add_argument("--format", choices=["mermaid", "dot", "json"], default="mermaid",
                   help="a mermaid flowchart (default), Graphviz dot, or JSON; loops are marked with their bounds")
    _add_include_flag(p)


@_command("init")
def _init(sub: Any) -> None:
    from engine.cli.scaffold import TEMPLATES   # a dict and a path: nothing heavy

    p = sub.add_parser("init", help="write a commented starter SOP file from a template",
                       description="Write NAME.sop.yaml, a commented starter SOP that validates and runs "
                       "on `fake`, with the schema modeline for editors. Templates: " +
                       "; ".join(f"{name}: {what}" for name, what in TEMPLATES.items()) + ".")
    p.add_argument("name", nargs="?", default="my_sop", metavar="NAME",
                   help="the file to write, NAME.sop.yaml (default my_sop); its stem is the SOP's name")
    p.add_argument("--template", "-t", choices=list(TEMPLATES), default="chain",
                   help="what the starter holds (default chain)")
    p.add_argument("--force", action="store_true", help="overwrite NAME.sop.yaml if it exists")


@_command("schema")
def _schema(sub: Any) -> None:
    sub.add_parser("schema", help="print the JSON Schema of SOP files")


@_command("migrate")
def _migrate(sub: Any) -> None:
    p = sub.add_parser("migrate", help="rewrite deprecated spellings in SOP files, in place",
                       description="Rewrite deprecated spellings (an exec action's `timeout_s`, "
                       "`retries`, ...: docs/writing.md, \"Deprecated spellings\") to the new ones, in "
                       "place. Only those tokens change: comments, key order, quoting and flow "
                       "style are kept. Exit 0 done, 1 --check found changes or a file has other "
                       "errors (run validate), 2 a file cannot be read or written.")
    p.add_argument("files", nargs="+", metavar="FILE", help="the SOP files to rewrite")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 if a file would change (for CI)")
    p.add_argument("--diff", action="store_true",
                   help="write nothing; print a unified diff of the changes on stdout")
    _add_include_flag(p)


@_command("lsp")
def _lsp(sub: Any) -> None:
    p = sub.add_parser("lsp", help="a language server over stdio: validate's diagnostics, completion, "
                       "navigation in an editor", description="Serve the Language Server Protocol on "
                       "stdin/stdout, for an editor to start: sopctl's own diagnostics as you type and on "
                       "save, completion, hover, definitions, references, symbols and quick fixes. It never "
                       "runs a model, a command or an MCP server. Needs the `lsp` extra (in a clone: pip install -e '.[lsp]').")
    p.add_argument("--debounce-ms", type=int, default=300, metavar="MS",
                   help="check this long after the last keystroke (default 300; 0 checks at every change)")
    _add_include_flag(p)


@_command("run")
def _run(sub: Any) -> None:
    p = sub.add_parser("run", help="run an SOP")
    p.add_argument("file", metavar="FILE", help="the SOP file to run")
    _add_run_flags(p)
    _add_include_flag(p)
    p.add_argument("--reuse-identical", action="store_true",
                   help="answer a request identical to one already answered in this run from the "
                        "journal (default: every request is asked); its resumes keep it")


@_command("resume")
def _resume(sub: Any) -> None:
    p = sub.add_parser("resume", help="continue an interrupted (or waiting) run from its journal")
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run's folder (its workspace, holding .sopctl/)")
    _add_resume_flags(p)


@_command("answer")
def _answer(sub: Any) -> None:
    p = sub.add_parser("answer", help="answer the question a waiting run waits for")
    p.add_argument("run_dir", metavar="RUN_DIR", help="the waiting run's folder")
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


@_command("replay")
def _replay(sub: Any) -> None:
    p = sub.add_parser("replay", help="re-run with every model answer taken from a run's journal")
    p.add_argument("run_dir", metavar="RUN_DIR", help="the journaled run to replay")
    p.add_argument("--out", metavar="DIR", required=True, help="workspace of the replay")
    p.add_argument("--allow-exec", action="store_true",
                   help="let actions of kind exec run their commands again (tools never run in a replay)")
    _add_allow_host_flag(p)
    _add_isolation_flags(p)
    _add_format_flag(p)
    _add_trace_flag(p)


@_command("batch")
def _batch(sub: Any) -> None:
    p = sub.add_parser("batch", help="one run per row of a JSONL or CSV file (or --replay a folder of runs)")
    p.add_argument("file", nargs="?", metavar="FILE", help="the SOP file (not with --replay)")
    p.add_argument("--inputs", metavar="ROWS", help="rows.jsonl (one JSON object a line) or rows.csv "
                   "(a header row): each row gives one run's inputs")
    p.add_argument("--replay", metavar="RUNS_DIR", help="replay every journaled run under RUNS_DIR "
                   "(a batch folder, or a folder of runs) with its recorded answers; report divergences")
    p.add_argument("--out", metavar="DIR", help="the batch folder: results.jsonl and rows/NNNNNN/ "
                   "(default runs/batch-<ROWS name>, or runs/replay-<RUNS_DIR name>)")
    p.add_argument("--concurrency", type=int, default=4, metavar="N", help="rows in flight at once (default 4)")
    p.add_argument("--budget", dest="batch_budget", type=float, default=0.0, metavar="USD",
                   help="budget of the whole batch (0 = none): no row starts once it is spent")
    p.add_argument("--model", help="the model of every row (as `sopctl run --model`)")
    p.add_argument("--rounds", type=int, metavar="N", help="override team.max_rounds")
    p.add_argument("--expect", action="append", default=[], metavar="EXPR",
                   help="a jinja expression every row must make true, over `run` and `msgs`, "
                        "e.g. \"{{ run.status == 'idle' }}\" (repeatable)")
    p.add_argument("--golden", metavar="RUN_DIR", help="score each row's (role, action) "
                   "trajectory against this run's")
    p.add_argument("--match", choices=["exact", "in_order", "any_order"], default="in_order",
                   help="how trajectories are compared with --golden (default in_order)")
    p.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                   help="run the rows as Ray tasks: on a local cluster, or the one at ADDRESS "
                        "(needs the `ray` extra; in a clone: pip install -e '.[ray]')")
    p.add_argument("--allow-exec", action="store_true",
                   help="allow actions of kind exec to run commands in each row's workspace")
    p.add_argument("--format", choices=["text", "json", "junit"], default="text",
                   help="the summary on stdout: a table, one JSON object, or JUnit XML (a test case per row)")
    _add_isolation_flags(p)
    _add_hosted_flags(p)
    _add_include_flag(p)


@_command("runs")
def _runs(sub: Any) -> None:
    p = sub.add_parser("runs", help="list runs under a folder (default ./runs)")
    p.add_argument("dir", nargs="?", default="runs", metavar="DIR", help="the folder to list (default ./runs)")
    _add_format_flag(p)


@_command("show")
def _show(sub: Any) -> None:
    p = sub.add_parser("show", help="a run's timeline, tokens and cost per action")
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run's folder")
    _add_format_flag(p)
    p.add_argument("--prompts", nargs="?", const="", default=None, metavar="ACTION",
                   help="print every request as sent (system and user messages, re-asks) "
                        "and its answer; only ACTION's (id or Role.action) when given")


@_command("report")
def _report(sub: Any) -> None:
    p = sub.add_parser("report", help="a run as one HTML file: graph, timeline, cost, messages, prompts")
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run's folder")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="the HTML file to write (default: RUN_DIR.html, beside the run folder)")


@_command("pool")
def _pool(sub: Any) -> None:
    p = sub.add_parser("pool", help="list, clear or prune the experience pool (--pool or $SOPCTL_POOL)")
    p.add_argument("pool_command", choices=["list", "clear", "prune"], metavar="list|clear|prune",
                   help="list the entries, clear them (all, or --action's), or prune them (--keep, --min-score)")
    p.add_argument("--pool", metavar="FILE", help="the pool file (default: $SOPCTL_POOL)")
    p.add_argument("--action", help="only this action's entries (list, clear)")
    p.add_argument("--keep", type=int, metavar="N", help="prune: keep the N best entries per action")
    p.add_argument("--min-score", type=float, metavar="S", help="prune: drop entries scored below S")
    _add_format_flag(p)


# --- flags shared by several commands -------------------------------------------------


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
    p.add_argument("--out", dest="workspace", metavar="DIR", help="workspace folder (default ./runs/<run-id>)")
    p.add_argument("--allow-exec", action="store_true",
                   help="allow actions of kind exec, the terminal tool and stdio MCP servers to run commands")
    _add_allow_host_flag(p)
    _add_isolation_flags(p)
    _add_format_flag(p)
    _add_hosted_flags(p)
    _add_no_input_flag(p)
    _add_trace_flag(p)
    _add_pool_flags(p)


def _add_format_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=["text", "json"], default="text",
                   help="human-readable text (default) or one JSON object on stdout")


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
    p.add_argument("--allow-exec", action="store_true",
                   help="allow exec actions, the terminal and notebook tools and stdio MCP servers again "
                        "(a resume asks for the run's flags anew)")
    _add_allow_host_flag(p)
    _add_isolation_flags(p)
    p.add_argument("--force", action="store_true", help="resume even if the SOP file changed")
    _add_format_flag(p)
    _add_hosted_flags(p)
    _add_no_input_flag(p)
    _add_trace_flag(p)
    _add_pool_flags(p)


def _add_hosted_flags(p: argparse.ArgumentParser) -> None:
    """Where hosted models live, what an unpriced one costs and how long an answer may be:
    the user's, never a file's."""
    p.add_argument("--api-base", metavar="URL", type=_api_base,
                   help="base URL of an OpenAI-compatible server for hosted models "
                        "(default: litellm's, e.g. $OPENAI_API_BASE)")
    p.add_argument("--response-format", choices=("json_schema", "json_object", "none"),
                   help="how that server takes a JSON action's output schema: json_schema (OpenAI's "
                        "structured outputs), json_object (JSON mode with the schema: llama.cpp's "
                        "Python server) or none (in the prompt only); over the file's "
                        "llm.response_format (default: found out per server)")
    p.add_argument("--price", metavar="IN,OUT", type=_price,
                   help="USD per million prompt and completion tokens of a model litellm "
                        "cannot price (a self-hosted one), e.g. 0.2,0.6")
    p.add_argument("--max-answer-chars", metavar="N", type=_positive_int,
                   help="the longest model answer accepted (default 2,000,000 characters): a "
                        "longer one is cut there before it is journaled and asked again")


def _positive_int(text: str) -> int:
    try:
        value = int(text.replace(",", "").replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text!r}")
    return value


def _api_base(text: str) -> str:
    if not re.match(r"https?://[^\s/]+", text):
        raise argparse.ArgumentTypeError(f"not an http(s) URL: {text!r}")
    return text


def _price(text: str) -> Price:
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
                   help="let the file's HTTP MCP servers, its search endpoint and the browser reach HOST; "
                        "repeatable")


def _add_isolation_flags(p: argparse.ArgumentParser) -> None:
    where = p.add_mutually_exclusive_group()
    where.add_argument("--isolate", dest="isolate", action="store_const", const=True, default=None,
                       help="commands run under bubblewrap or the run is refused (default: under "
                            "bubblewrap wherever it works here): / read-only, the workspace "
                            "writable, no view of other processes, no network")
    where.add_argument("--no-isolate", dest="isolate", action="store_const", const=False,
                       help="commands run as you, outside any sandbox: they can read your files "
                            "and sopctl's environment, and write anywhere you can")
    p.add_argument("--allow-network", action="store_true",
                   help="the browser tool may reach every host; isolated commands keep the network")


def _add_include_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--include-path", action="append", default=[], metavar="DIR",
                   help="a folder whose files `include:` may name, besides the SOP's own folder "
                        "(repeatable; a resume uses the run's again)")


EXAMPLES: dict[str, tuple[str, ...]] = {
    "validate": ("sopctl validate sops/*.sop.yaml --strict",),
    "graph": ("sopctl graph sops/software_company.sop.yaml --format dot | dot -Tsvg > graph.svg",),
    "init": ("sopctl init my_team --template team", "sopctl init"),
    "schema": ("sopctl schema > sop.schema.json",),
    "migrate": ("sopctl migrate --diff my.sop.yaml", "sopctl migrate my.sop.yaml"),
    "run": ('sopctl run sops/software_company.sop.yaml --idea "a command-line 2048 game"',
            'sopctl run sops/mgx_team.sop.yaml --allow-exec --send-to Alex --idea "add a --seed flag" --model fake'),
    "resume": ("sopctl resume runs/20261202-101500-ab12cd",),
    "answer": ('sopctl answer runs/20261202-101500-ab12cd --text "use SQLite" --resume',
               "sopctl answer runs/20261202-101500-ab12cd --approve"),
    "replay": ("sopctl replay runs/20261202-101500-ab12cd --out /tmp/replay --format json",),
    "batch": ("sopctl batch sops/software_company.sop.yaml --inputs ideas.jsonl --model fake --concurrency 8",
              "sopctl batch --replay runs/batch-ideas"),
    "runs": ("sopctl runs runs --format json",),
    "show": ("sopctl show runs/20261202-101500-ab12cd --prompts WritePRD",),
    "report": ("sopctl report runs/20261202-101500-ab12cd -o report.html",),
    "lsp": ("sopctl lsp --include-path shared/sops", "sopctl lsp --debounce-ms 150"),
    "pool": ("sopctl pool list --pool pool.sqlite", "sopctl pool prune --pool pool.sqlite --keep 3"),
}
"""What each command's `--help` ends with (tests parse every one)."""


def _examples(name: str) -> str | None:
    lines = EXAMPLES.get(name)
    return "examples:\n" + "\n".join(f"  {line}" for line in lines) if lines else None


# --- building -------------------------------------------------------------------------


class _Formatter(argparse.HelpFormatter):
    """argparse's, with the terminal's width asked once per parser build: argparse makes a
    formatter for every option it adds (only to check its metavar), and each one asks the
    terminal (an ioctl and two environment lookups). Help printed later asks afresh."""

    width: int | None = None   # set while a parser is built (`_building`)

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        super().__init__(prog, indent_increment, max_help_position,
                         width if width is not None else _Formatter.width)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        """Examples keep their lines (a command line wrapped would not run); the rest is filled."""
        if text.startswith("examples:"):
            return "\n".join(indent + line for line in text.splitlines())
        return super()._fill_text(text, width, indent)


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
    for name, add in _ENTRIES.items():
        if only in (None, name):
            add(sub)
            sub.choices[name].epilog = _examples(name)
    return parser




COMMANDS = tuple(_ENTRIES)
"""Every command, in the order `sopctl --help` lists them."""


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The command line parsed; a line that starts with a command, by that command's parser."""
    parser = _parser(argv[0] if argv and argv[0] in COMMANDS else None)
    return _fresh_lists(parser.parse_args(argv))


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
