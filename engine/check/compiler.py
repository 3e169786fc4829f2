"""source -> schema -> spec -> checks -> graph: an immutable CompiledSop.

The pipeline runs phase by phase: YAML (safe load) -> JSON Schema -> pydantic spec ->
references -> watch graph -> templates. Every problem of a phase is collected; the first
phase with an error ends the pipeline (later phases would only report its echoes). This is
the one place where JSON pointers become `file:line:col`.

`check_path`/`check_text` never raise for a bad file: they return every diagnostic (what
`sopctl validate` shows). `compile_path`/`compile_text` are for the interpreter: they return
a CompiledSop carrying its warnings, or raise `LoadError`/`CompileError` with the diagnostics.
The CompiledSop keeps its source (text and source map), so that a failure at run time
(`locate_failure`) is located here too, exactly as the checker's diagnostics are.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from engine.check.graph import build as build_graph
from engine.check.phases import PHASES
from engine.check.rules import Context, run_rules
from engine.errors import (
    ActionFailed,
    CompileError,
    Diagnostic,
    LoadError,
    Related,
    SopError,
)
from engine.load import schema
from engine.load.outputs import output_schema
from engine.load.source import (
    MAX_FILE_BYTES,
    Source,
    SourceMap,
    join_pointer,
    load_path,
    load_text,
)
from engine.load.spec import Sop

if TYPE_CHECKING:
    import networkx as nx

__all__ = ["CheckResult", "CompiledSop", "check_path", "check_text", "compile_path",
           "compile_text", "locate_failure", "source_lines"]


@dataclass(frozen=True)
class CompiledSop:
    """A checked SOP, ready to run: the spec, its output schemas and its watch graph."""

    spec: Sop
    file: str                                   # path as given ("<string>" for text)
    source_hash: str                            # sha256 of the file's bytes
    output_schemas: Mapping[str, dict | None]   # action id -> JSON Schema (None: text/code)
    graph: nx.DiGraph | None = None             # the watch graph, frozen
    warnings: tuple[Diagnostic, ...] = field(default_factory=tuple)
    source: Source | None = field(default=None, compare=False, repr=False)
    """The loaded file (text and source map): run-time failures are located with it. Not
    compared: two compilations of the same file are equal whatever object holds the text."""


@dataclass(frozen=True)
class CheckResult:
    """Everything `validate` reports about one file: located diagnostics, and the SOP if it compiled."""

    file: str
    diagnostics: tuple[Diagnostic, ...]
    compiled: CompiledSop | None = None
    lines: tuple[str, ...] = ()
    """The file's lines, for rendering the offending line under a diagnostic."""
    graph: nx.DiGraph | None = None
    """The watch graph whenever the checks got as far as building it, even if a later check
    failed: `sopctl graph` still draws it, with the offending loop marked."""

    @property
    def ok(self) -> bool:
        return not any(d.is_error for d in self.diagnostics)


def check_path(path: str | Path) -> CheckResult:
    """Load and check a file; a file that cannot be read is a diagnostic too."""
    try:
        source = load_path(path)
    except LoadError as exc:
        return CheckResult(file=str(path), diagnostics=tuple(exc.diagnostics), lines=source_lines(path))
    return _check_source(source)


def source_lines(path: str | Path) -> tuple[str, ...]:
    """The lines of a file, if it is readable text (for the excerpt under a diagnostic)."""
    try:
        file = Path(path)
        if not file.is_file() or file.stat().st_size > MAX_FILE_BYTES:
            return ()
        return tuple(file.read_bytes().decode("utf-8").splitlines())
    except (OSError, UnicodeDecodeError):
        return ()


def check_text(text: str, file: str = "<string>") -> CheckResult:
    """Check SOP YAML given as text."""
    try:
        source = load_text(text, file)
    except LoadError as exc:
        return CheckResult(file=file, diagnostics=tuple(exc.diagnostics), lines=tuple(text.splitlines()))
    return _check_source(source)


def compile_path(path: str | Path) -> CompiledSop:
    """The compiled SOP of a file, or LoadError/CompileError carrying every diagnostic."""
    return _compiled(check_path(path))


def compile_text(text: str, file: str = "<string>") -> CompiledSop:
    """The compiled SOP of YAML text, or LoadError/CompileError carrying every diagnostic."""
    return _compiled(check_text(text, file))


def _compiled(result: CheckResult) -> CompiledSop:
    if result.compiled is not None and result.ok:
        return result.compiled
    errors = [d for d in result.diagnostics if d.is_error]
    if errors and errors[0].code < "SOP100":
        raise LoadError(list(result.diagnostics))
    raise CompileError(list(result.diagnostics))


def _check_source(source: Source) -> CheckResult:
    found, compiled, graph = _pipeline(source)
    located = sorted((_locate(d, source) for d in found), key=_order)
    if compiled is not None:
        compiled = replace(compiled, warnings=tuple(d for d in located if not d.is_error))
    return CheckResult(file=source.file, diagnostics=tuple(located), compiled=compiled,
                       lines=tuple(source.lines), graph=graph)


def _pipeline(source: Source) -> tuple[list[Diagnostic], CompiledSop | None, nx.DiGraph | None]:
    """Run the phases in order; stop after the first one with an error.

    Returns the diagnostics, the compiled SOP (None on error) and the watch graph (None when
    an earlier phase failed)."""
    spec, found = _structure(source.data)
    if spec is None:
        return found, None, None
    ctx = Context(spec=spec)
    for phase, rules in PHASES:
        if phase == "graph":
            ctx.graph = build_graph(spec)
        found += run_rules(rules, ctx)
        if _has_error(found):
            return found, None, ctx.graph
    return found, _make(spec, source, ctx.graph), ctx.graph


def _structure(data: dict[str, Any]) -> tuple[Sop | None, list[Diagnostic]]:
    """The schema phase: the spec, or the JSON Schema's diagnostics.

    The models accept exactly what the schema accepts (a test runs every case and random
    documents through both), so a file the models accept skips the schema validator and its
    import: the common case, a valid file, stays fast. When the models refuse, the schema
    explains why, with better messages than pydantic's; if it finds nothing, the models'
    errors are reported (SOP108)."""
    spec, model_errors = _spec(data)
    if spec is not None:
        return spec, []
    found = schema.validate(data)
    return None, found if _has_error(found) else model_errors


def _has_error(found: list[Diagnostic]) -> bool:
    return any(d.is_error for d in found)


def _spec(data: dict[str, Any]) -> tuple[Sop | None, list[Diagnostic]]:
    """The pydantic models; their errors (if the schema let something through) are diagnostics."""
    from pydantic import ValidationError

    try:
        return Sop.model_validate(data), []
    except ValidationError as exc:
        return None, [_from_pydantic(err) for err in exc.errors(include_url=False)]


def _from_pydantic(err: Any) -> Diagnostic:
    loc = [p for p in err["loc"] if isinstance(p, (str, int)) and not _is_branch(p)]
    return Diagnostic(code="SOP108", severity="error", pointer=join_pointer("", *loc),
                      message=f"invalid value: {err['msg']}", hint="the SOP models refuse this value")


def _is_branch(part: Any) -> bool:
    """pydantic names union branches in `loc` (e.g. `literal['text']`); they are not keys."""
    return isinstance(part, str) and ("[" in part or part in ("CodeOutput", "function-after"))


def _make(spec: Sop, source: Source, graph: nx.DiGraph | None) -> CompiledSop:
    schemas = {aid: output_schema(action.output) for aid, action in spec.actions.items()}
    return CompiledSop(spec=spec, file=source.file, source_hash=hashlib.sha256(source.raw).hexdigest(),
                       output_schemas=MappingProxyType(schemas), graph=graph, source=source)


def locate_failure(compiled: CompiledSop, failure: SopError) -> Diagnostic | None:
    """A run-time failure at its place in the SOP file, located as the checker's diagnostics
    are; None when it names no place (or the SOP was built without its source)."""
    diagnostic = failure.diagnostic if isinstance(failure, ActionFailed) else None
    if diagnostic is None or compiled.source is None:
        return None
    return _locate(diagnostic, compiled.source)


_AT_KEY = frozenset({"SOP101", "SOP106"})
"""Codes about a key itself (unknown, badly named): the caret goes under the key."""


def _locate(diag: Diagnostic, source: Source) -> Diagnostic:
    """Fill file:line:col from the pointer (template lines are offset into the file).

    The one place where pointers become positions: the checker's diagnostics and run-time
    failures alike."""
    smap = source.map
    line, col = smap.locate(diag.pointer, prefer_key=diag.code in _AT_KEY)
    if diag.line and diag.pointer in smap.literals:
        line, col = _template_position(source, line + diag.line)
    if diag.code in _NAMES_A_WORD:
        col = _word_column(source, line, col, diag.message)
    related = tuple(_locate_related(r, smap) for r in diag.related)
    return replace(diag, file=source.file, line=line, col=col, related=related)


_NAMES_A_WORD = frozenset({"SOP402", "SOP403", "SOP404", "SOP406", "SOP407", "SOP408", "SOP409"})
"""Template codes whose message ends by quoting the offending name: the caret goes under it."""


def _word_column(source: Source, line: int, col: int, message: str) -> int:
    """The column of the last quoted word of `message` on `line` (from `col` on), else `col`."""
    quoted = re.findall(r"'([^']+)'", message)
    lines = source.lines
    if not quoted or not (0 < line <= len(lines)):
        return col
    found = lines[line - 1].find(quoted[-1], max(col - 1, 0))
    return found + 1 if found >= 0 else col


def _template_position(source: Source, line: int) -> tuple[int, int]:
    lines = source.lines
    text = lines[line - 1] if 0 < line <= len(lines) else ""
    return line, len(text) - len(text.lstrip()) + 1


def _locate_related(rel: Related, smap: SourceMap) -> Related:
    if rel.line or not rel.pointer:
        return rel
    line, col = smap.locate(rel.pointer)
    return replace(rel, line=line, col=col)


def _order(diag: Diagnostic) -> tuple[int, int, str, str]:
    return (diag.line, diag.col, diag.code, diag.message)
