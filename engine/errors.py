"""Diagnostics and the one error family of sopctl.

Every problem a user can meet is either a `Diagnostic` (a located finding about an SOP file,
collected and reported together) or a `SopError` subclass raised by one phase of the
pipeline. Foreign exceptions (ruamel, pydantic, jsonschema, networkx, litellm, sqlite) are
converted into these at the edge so that no traceback ever reaches a user.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = ["install_hint", "Severity", "Related", "Diagnostic", "SopError", "LoadError", "CompileError",
           "UsageError", "RunError", "ActionFailed", "LLMError", "BudgetExceeded", "JournalError",
           "ReplayDivergence", "require_utf8", "PoolError", "diagnostic_header", "format_failure"]


Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Related:
    """Another place that explains a diagnostic (e.g. the other end of a cycle)."""

    message: str
    pointer: str = ""
    line: int = 0
    col: int = 0
    file: str = ""
    """The file of the place when it is not the diagnostic's own (an included library)."""


@dataclass(frozen=True)
class Diagnostic:
    """One finding about an SOP file, located by JSON pointer and (once resolved) line:col.

    Checks create diagnostics with a pointer only; the compiler resolves pointers to
    positions in one place, so no check computes its own location.
    """

    code: str
    severity: Severity
    message: str
    pointer: str = ""
    hint: str = ""
    file: str = ""
    line: int = 0
    col: int = 0
    related: tuple[Related, ...] = field(default_factory=tuple)

    @property
    def is_error(self) -> bool:
        return self.severity == "error"

    def to_json(self) -> dict:
        data = asdict(self)
        # a related place's `file` only when it is another file's, as before includes existed
        data["related"] = [{k: v for k, v in asdict(r).items() if k != "file" or v} for r in self.related]
        return data


def diagnostic_header(diagnostic: Diagnostic) -> str:
    """`file:line:col: severity[code]: message`, the line compilers and editors recognise."""
    where = f"{diagnostic.file}:{diagnostic.line}:{diagnostic.col}" if diagnostic.line else diagnostic.file
    return f"{where}: {diagnostic.severity}[{diagnostic.code}]: {diagnostic.message}"


def format_failure(diagnostic: Diagnostic) -> str:
    """A failed run's error: the diagnostic's header line (and its hint, as SopError says it).

    What the journal keeps and `sopctl show` prints; `format_diagnostic` adds the excerpt."""
    return diagnostic_header(diagnostic) + (f"\n  hint: {diagnostic.hint}" if diagnostic.hint else "")


class SopError(Exception):
    """Base of every error sopctl raises on purpose. `exit_code` is what the CLI returns."""

    exit_code = 1

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class UsageError(SopError):
    """A bad flag, a missing input, a file that cannot be used at all."""

    exit_code = 2


def require_utf8(text: str, what: str) -> None:
    """Refuse text that cannot be written as UTF-8, before anything is written (here, the
    bottom layer: the CLI checks its arguments with it before importing anything heavier).

    Python keeps the bytes of a non-UTF-8 command line (or file name) as lone surrogates;
    such text can be neither journaled nor printed, so it is a usage error naming where."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        char = ord(text[exc.start])
        what_char = (f"the byte 0x{char - 0xDC00:02x}, which is not UTF-8" if 0xDC80 <= char <= 0xDCFF
                     else f"a lone surrogate U+{char:04X}")
        raise UsageError(f"{what} is not valid UTF-8 text: {what_char}, at character {exc.start + 1}",
                         hint="give the text in UTF-8 (check the terminal's or the file's encoding)") from None


class LoadError(SopError):
    """The file could not be read or parsed as safe YAML (carries diagnostics)."""

    exit_code = 1

    def __init__(self, diagnostics: list[Diagnostic]) -> None:
        first = diagnostics[0].message if diagnostics else "cannot load file"
        super().__init__(first)
        self.diagnostics = diagnostics


class CompileError(LoadError):
    """The SOP has at least one error-severity diagnostic (schema, references, graph, templates)."""


class RunError(SopError):
    """A run could not start or go on (bad workspace, missing extra, exec not allowed...)."""

    exit_code = 2


class ActionFailed(SopError):
    """An action failed after its retries; ends the run with status `failed`.

    A failure that comes from something written in the SOP file (a template, an artifact
    path, a command, a `for_each`) names that place as the checker's diagnostics do: a code
    and a JSON pointer, plus the line inside a template. The run locates it (`file:line:col`)
    where it ends, in the one place that turns pointers into positions."""

    def __init__(self, action: str, message: str, hint: str = "", *, code: str = "",
                 pointer: str = "", template_line: int = 0) -> None:
        super().__init__(f"action {action} failed: {message}", hint)
        self.action = action
        self.code = code
        self.pointer = pointer
        self.template_line = template_line

    def at(self, code: str, pointer: str) -> ActionFailed:
        """Name the place in the SOP file, unless the raiser already named a more precise one."""
        if not self.pointer:
            self.code, self.pointer = code, pointer
        return self

    @property
    def diagnostic(self) -> Diagnostic | None:
        """The failure as a diagnostic (not yet located), or None when it names no place."""
        if not self.pointer:
            return None
        return Diagnostic(code=self.code, severity="error", message=self.message,
                          pointer=self.pointer, hint=self.hint, line=self.template_line)


class LLMError(SopError):
    """The model could not be reached or never gave a valid answer."""


class BudgetExceeded(SopError):
    """The next call would exceed the budget; ends the run with status `budget`."""


class JournalError(SopError):
    """The run journal is missing, torn, from another SOP, or cannot be written."""

    exit_code = 2


class PoolError(SopError):
    """The experience pool file is not a pool (corrupt, another database) or cannot be used."""

    exit_code = 2


class ReplayDivergence(SopError):
    """Replay asked for a model call that the journal does not have."""


def install_hint(extra: str) -> str:
    """How to install an optional extra. sopctl is installed from its clone (it is not on a
    package index yet, so `pip install 'sopctl[X]'` would find nothing)."""
    return f"pip install -e '.[{extra}]' in the sopctl clone"


def did_you_mean(word: Any, choices: Iterable[str]) -> str:
    """A `did you mean 'x'?` hint when a choice is a close spelling of `word`, else ''."""
    close = closest(word, choices)
    return f"did you mean '{close}'?" if close else ""


def closest(word: Any, choices: Iterable[str]) -> str:
    """The choice that is a close spelling of `word` (or differs only in case), else ''."""
    if not isinstance(word, str):
        return ""
    options = [c for c in choices if isinstance(c, str)]
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    if not close:
        lowered = {c.lower(): c for c in options}
        close = [lowered[word.lower()]] if word.lower() in lowered else []
    return close[0] if close else ""
