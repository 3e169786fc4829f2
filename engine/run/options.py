"""A run's options: the trusted switches of one invocation (command line or Python), never
read from the SOP file.

Three frozen types, each the one before plus what it adds, so that what a resume or a replay
may change is a type, not a keyword list:

- `ReplayOptions`: what every invocation gives afresh (a new run, a resume, a replay): what
  it may do (exec, isolation, hosts) and who watches (observers);
- `ResumeOptions`: plus what a resume may change: the model and limits (None: the run's own),
  where hosted models are and what they cost, who answers a person's questions, the pool;
- `RunOptions`: plus what only a new run chooses (its workspace, id and idea addresses) and
  the hooks resume and replay set (`store`, `replay`, `gateway`).

A wrong type or an unknown name is a UsageError when the options are made, before anything
runs; sequences are kept as tuples.
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

from engine.errors import UsageError, did_you_mean
from engine.models.gateway import Gateway
from engine.models.types import AnswerStore, Price, ResponseForm
from engine.run.events import RunObserver
from engine.run.experience import ExperiencePool
from engine.run.inputs import check_limits
from engine.run.people import Person

__all__ = ["ReplayOptions", "ResumeOptions", "RunOptions", "fields_of"]

_Options = TypeVar("_Options", bound="ReplayOptions")


@dataclass(frozen=True, kw_only=True)
class ReplayOptions:
    """What every invocation of a run gives afresh: what it may do and who watches."""

    allow_exec: bool = False
    """Let actions of kind exec, the terminal tool and stdio MCP servers run commands."""
    isolate: bool | None = None
    """Where commands run (engine/run/isolation.py). None (the default): under bubblewrap
    wherever it works here, else as the user, with a warning; True (`--isolate`): under
    bubblewrap or not at all (the run is refused); False (`--no-isolate`): as the user."""
    allow_network: bool = False
    """The browser tool may reach every host; isolated commands keep the network (without
    it, they see only a private loopback)."""
    allow_hosts: Sequence[str] = ()
    """`--allow-host`: hosts HTTP MCP servers, the search endpoint and the browser may reach."""
    observers: Sequence[RunObserver] = ()
    """Told every event of the run, in order (the CLI's display, tracing, your own)."""

    def __new__(cls: type[_Options], *args: object, **kwargs: object) -> _Options:
        # Before the dataclass's __init__, which would raise a TypeError for a misspelt name.
        if args:
            raise UsageError(f"{cls.__name__} takes its options by name, e.g. {cls.__name__}(allow_exec=True)")
        names = [f.name for f in fields(cls)]
        for name in kwargs:
            if name not in names:
                close = did_you_mean(name, names)
                raise UsageError(f"{cls.__name__} has no option {name!r}" + (f"; {close}" if close else ""),
                                 hint=f"its options: {', '.join(names)}")
        return super().__new__(cls)

    def __post_init__(self) -> None:
        for name, expected in _hints(type(self)).items():
            value = getattr(self, name)
            if not _fits(value, expected):
                raise UsageError(f"run option {name}: expected {_describe(expected)}, "
                                 f"got {type(value).__name__} {value!r:.80}")
            if isinstance(value, list):    # frozen means frozen: a list given is kept as a tuple
                object.__setattr__(self, name, tuple(value))


@dataclass(frozen=True, kw_only=True)
class ResumeOptions(ReplayOptions):
    """Plus what a resume may change (on a resume, None keeps the run's own)."""

    model: str | None = None
    """`--model`: beats $SOPCTL_MODEL, the action's, the role's and the file's model."""
    max_rounds: int | None = None
    """`--rounds`: instead of the file's team.max_rounds."""
    budget_usd: float | None = None
    """`--budget`: instead of the file's team.budget_usd (0 = no limit)."""
    api_base: str | None = None
    """`--api-base`: where hosted models are reached (never recorded)."""
    response_format: ResponseForm | None = None
    """`--response-format`: how that server takes an output schema, over the file's
    `llm.response_format` (never recorded)."""
    price: Price | None = None
    """`--price`: for models litellm cannot price (never recorded)."""
    max_answer_chars: int | None = None
    """`--max-answer-chars`: the longest model answer accepted (None: 2,000,000; a longer one
    is cut there before it is journaled, and re-asked)."""
    person: Person | None = None
    """Who answers a person's questions (None: the run waits, status `waiting`)."""
    pool: ExperiencePool | None = None
    """`--pool`: accepted answers across runs (`engine.journal.pool.Pool.open(path)`)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_limits(self.max_rounds, self.budget_usd)
        if self.max_answer_chars is not None and self.max_answer_chars < 1:
            raise UsageError(f"--max-answer-chars (max_answer_chars) must be at least 1; got "
                             f"{self.max_answer_chars}")


@dataclass(frozen=True, kw_only=True)
class RunOptions(ResumeOptions):
    """Plus what only a new run chooses, and the hooks resume and replay set."""

    workspace: str | Path | None = None
    """`--out`: the run's folder (default runs/<run-id>)."""
    run_id: str | None = None
    """The run's id (default: a new one, `new_run_id()`)."""
    send_to: Sequence[str] = ()
    """`--send-to`: the idea's addresses, beating the file's team.send_to."""
    reuse_identical: bool = False
    """`--reuse-identical`: a request identical to one already answered in the run takes that
    answer (default: every request is asked; resume and replay reuse by position). Recorded
    with the run: its resumes and replays keep it."""
    store: AnswerStore | None = None
    """Answers to reuse (the journal of a resume or a replay)."""
    replay: bool = False
    """Every answer comes from `store`: no model is called, none is checked for use."""
    gateway: Gateway | None = None
    """The model gateway to call through (tests and benchmarks bring their own)."""


def fields_of(options: ReplayOptions, kind: type[ReplayOptions], purpose: str) -> dict[str, Any]:
    """`options`' values of `kind`'s fields, for `purpose` (e.g. "a resume"), which takes
    `kind`; an option `kind` lacks that `options` sets is refused rather than dropped."""
    taken = [f.name for f in fields(kind)]
    extra = [f.name for f in fields(options)
             if f.name not in taken and getattr(options, f.name) != f.default]
    if extra:
        raise UsageError(f"{purpose} takes no {', '.join(extra)} (it keeps the run's own)",
                         hint=f"{purpose} takes {', '.join(taken)}")
    return {name: getattr(options, name) for name in taken}


# --- the type check of the fields ---------------------------------------------------------


def _hints(kind: type[ReplayOptions]) -> dict[str, Any]:
    """The fields' annotations, resolved once per class (they are strings: `from __future__`)."""
    if kind not in _HINTS:
        hints = typing.get_type_hints(kind)
        _HINTS[kind] = {f.name: hints[f.name] for f in fields(kind)}
    return _HINTS[kind]


_HINTS: dict[type, dict[str, Any]] = {}


def _fits(value: object, expected: Any) -> bool:
    origin = typing.get_origin(expected)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arg) for arg in typing.get_args(expected))
    if origin is typing.Literal:
        return any(value == arg and type(value) is type(arg) for arg in typing.get_args(expected))
    if origin is Sequence:           # a str is a sequence of str, and certainly a mistake here
        (item,) = typing.get_args(expected)
        return isinstance(value, (list, tuple)) and all(_fits(v, item) for v in value)
    if expected is type(None):
        return value is None
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if getattr(expected, "_is_protocol", False):    # duck-typed: has what the protocol names
        return all(hasattr(value, name) for name in _protocol_members(expected))
    return isinstance(value, expected)


@functools.cache
def _protocol_members(protocol: type) -> frozenset[str]:
    names: set[str] = set()
    for base in protocol.__mro__:
        if base in (object, typing.Protocol, typing.Generic):
            continue
        names |= {n for n in (*vars(base), *getattr(base, "__annotations__", {})) if not n.startswith("_")}
    return frozenset(names)


def _describe(expected: Any) -> str:
    origin = typing.get_origin(expected)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(arg) for arg in typing.get_args(expected))
    if origin is Sequence:
        return f"a list of {_describe(typing.get_args(expected)[0])}"
    if origin is typing.Literal:
        return " or ".join(repr(arg) for arg in typing.get_args(expected))
    return "None" if expected is type(None) else getattr(expected, "__name__", str(expected))
