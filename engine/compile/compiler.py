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

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from engine.check.graph import build as build_graph
from engine.check.phases import PHASES
from engine.check.rules import Context, run_rules
from engine.compile import cache as compile_cache
from engine.compile.plan import RunPlan, build_plan, experience_unchanged
from engine.errors import (
    ActionFailed,
    CompileError,
    Diagnostic,
    LoadError,
    Related,
    SopError,
)
from engine.load import schema
from engine.load.includes import Overlay, resolve_includes, sources_digest
from engine.load.migrations import migrate
from engine.load.outputs import output_schema
from engine.load.source import (
    MAX_FILE_BYTES,
    Source,
    join_pointer,
    load_path,
    load_text,
)
from engine.load.spec import Sop, output_of
from engine.templates.code import compile_all

if TYPE_CHECKING:
    import networkx as nx

__all__ = ["CheckResult", "CompiledSop", "check_path", "check_text", "compile_path",
           "compile_text", "locate_failure", "source_lines"]


@dataclass(frozen=True)
class CompiledSop:
    """A checked SOP, ready to run: the spec, its output schemas, its watch graph, and its
    run plan (the facts a run needs, decided here once: engine.compile.plan)."""

    spec: Sop
    file: str                                   # path as given ("<string>" for text)
    source_hash: str                            # sha256 of the file's bytes (and its includes')
    output_schemas: Mapping[str, dict | None]   # action id -> JSON Schema (None: text/code)
    graph: nx.DiGraph | None = None             # the watch graph, frozen
    warnings: tuple[Diagnostic, ...] = field(default_factory=tuple)
    source: Source | None = field(default=None, compare=False, repr=False)
    """The loaded file (text and source map): run-time failures are located with it. Not
    compared: two compilations of the same file are equal whatever object holds the text."""
    include_dirs: tuple[str, ...] = ()
    """The folders named with --include-path when it was compiled (a resume needs them again)."""
    plan: RunPlan = field(default_factory=RunPlan)
    """Flags, tools, MCP servers, routes, experience: what the run reads instead of working it out."""
    templates: Mapping[tuple[str, str], bytes] | None = field(default=None, compare=False, repr=False)
    """The plan's templates and expressions compiled (marshalled code by (kind, text)), what
    the run renders with; None when only checked (`sopctl validate` does not compile them)."""


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
    library_lines: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """The lines of each included library, by file, for diagnostics located in one."""
    source: Source | None = field(default=None, compare=False, repr=False)
    """The loaded file, its libraries merged in, whenever it loaded (even with errors after
    loading): what an editor's navigation reads (engine/lsp)."""

    def lines_of(self, file: str) -> tuple[str, ...]:
        """The lines of the file a diagnostic is in: this file's or a library's."""
        return self.library_lines.get(file, self.lines) if file != self.file else self.lines

    @property
    def ok(self) -> bool:
        return not any(d.is_error for d in self.diagnostics)


IncludeDirs = tuple[str | Path, ...]


def check_path(path: str | Path, include_dirs: IncludeDirs = ()) -> CheckResult:
    """Load and check a file (and the libraries it includes); a file that cannot be read is a
    diagnostic too. `include_dirs`: folders besides the file's own that includes may name.

    A file that compiled is checked once per process while its bytes and its libraries'
    stay the same."""
    return _checked_path(path, include_dirs, with_templates=False)


def _checked_path(path: str | Path, include_dirs: IncludeDirs, with_templates: bool) -> CheckResult:
    """`check_path`; `with_templates`: its templates compiled too (and kept so, in this
    process and on disk), as a run needs them.

    A file an earlier process compiled comes from the on-disk cache (engine.compile.cache):
    about a tenth of a fresh process's CPU on the software company at 0 ms per call
    (`python -m bench.compile_share`), which issue 28 counts per call."""
    key = (str(path), os.getcwd(), tuple(str(d) for d in include_dirs))
    known = _remembered(key)
    if known is None:
        known = compile_cache.lookup(path, include_dirs)
        if known is None:
            return _remember(key, _check_new(path, include_dirs, with_templates))
        _remember(key, known)
    compiled = known.compiled
    if with_templates and compiled is not None and compiled.templates is None:  # only checked so far
        known = replace(known, compiled=_with_templates(compiled))
        _CHECKED[key] = compile_cache.store(path, include_dirs, known)
    return known


def _check_new(path: str | Path, include_dirs: IncludeDirs, with_templates: bool) -> CheckResult:
    """A file neither this process nor the disk cache knows: loaded, checked, and stored."""
    try:
        source = _with_includes(load_path(path), Path(path).parent, include_dirs)
    except LoadError as exc:
        return _load_failure(str(path), exc, source_lines(path))
    return compile_cache.store(path, include_dirs, _check_source(source, include_dirs, with_templates))


def _with_includes(source: Source, base: Path, include_dirs: IncludeDirs, overlay: Overlay | None = None) -> Source:
    """Deprecated spellings rewritten (each a warning), then the libraries merged in (theirs too)."""
    return resolve_includes(migrate(source), base, tuple(Path(d) for d in include_dirs), overlay)


def _load_failure(file: str, exc: LoadError, lines: tuple[str, ...], overlay: Overlay | None = None) -> CheckResult:
    """A file (or a library of it) that could not be loaded: its diagnostics, with the lines of
    every file they are in (an open document's from its text in the overlay)."""
    others = {d.file for d in exc.diagnostics if d.file and d.file != file}
    return CheckResult(file=file, diagnostics=tuple(exc.diagnostics), lines=lines,
                       library_lines={f: _lines_of(f, overlay or {}) for f in others})


def _lines_of(file: str, overlay: Overlay) -> tuple[str, ...]:
    text = overlay.get(Path(file).resolve())
    return source_lines(file) if text is None else tuple(text.splitlines())


def source_lines(path: str | Path) -> tuple[str, ...]:
    """The lines of a file, if it is readable text (for the excerpt under a diagnostic)."""
    try:
        file = Path(path)
        if not file.is_file() or file.stat().st_size > MAX_FILE_BYTES:
            return ()
        return tuple(file.read_bytes().decode("utf-8").splitlines())
    except (OSError, UnicodeDecodeError):
        return ()


def check_text(text: str, file: str = "<string>", include_dirs: IncludeDirs = (),
               overlay: Overlay | None = None) -> CheckResult:
    """Check SOP YAML given as text (its includes are relative to `file`'s folder, or to the
    current folder for a name such as `<string>`). `overlay`: the texts of libraries to read
    instead of their files, by real path (an editor's unsaved documents)."""
    base = Path.cwd() if file.startswith("<") else Path(file).parent
    try:
        source = _with_includes(load_text(text, file), base, include_dirs, overlay)
    except LoadError as exc:
        return _load_failure(file, exc, tuple(text.splitlines()), overlay)
    return _check_source(source, include_dirs)


def compile_path(path: str | Path, include_dirs: IncludeDirs = ()) -> CompiledSop:
    """The compiled SOP of a file (its templates compiled), or LoadError/CompileError
    carrying every diagnostic."""
    return _compiled(_checked_path(path, include_dirs, with_templates=True))


_CHECKED: dict[tuple[str, str, tuple[str, ...]], CheckResult] = {}
"""Files that compiled, by (path as given, current folder, include folders): a second
`check_path` of the same bytes (a second run of the file in one process: the API, a
benchmark, a server) reuses the result. Checked by content, not by time stamps."""


_MAX_CHECKED = 64


def _remembered(key: tuple[str, str, tuple[str, ...]]) -> CheckResult | None:
    found = _CHECKED.get(key)
    return found if found is not None and found.compiled is not None and _same_bytes(found.compiled) else None


def _remember(key: tuple[str, str, tuple[str, ...]], result: CheckResult) -> CheckResult:
    if result.compiled is not None and result.ok:
        if len(_CHECKED) >= _MAX_CHECKED:
            _CHECKED.clear()
        _CHECKED[key] = result
    return result


def _same_bytes(compiled: CompiledSop) -> bool:
    """Whether the file and its libraries still hash to what the SOP was compiled from (the
    hash a run records), and its experience files read as they did; a file that cannot be
    read now counts as changed."""
    source = compiled.source
    if source is None:
        return False
    try:
        raws = [_plain_file_bytes(s.file) for s in (source, *source.included)]
    except OSError:
        return False
    libraries = tuple(replace(lib, raw=raw) for lib, raw in zip(source.included, raws[1:], strict=False))
    return (sources_digest(raws[0], libraries) == compiled.source_hash
            and experience_unchanged(compiled.plan, compiled.file))


def _plain_file_bytes(file: str) -> bytes:
    if not Path(file).is_file():       # never block on a FIFO put where the file was
        raise OSError(f"{file} is not a plain file")
    return Path(file).read_bytes()


def compile_text(text: str, file: str = "<string>", include_dirs: IncludeDirs = ()) -> CompiledSop:
    """The compiled SOP of YAML text (its templates compiled), or LoadError/CompileError
    carrying every diagnostic."""
    result = check_text(text, file, include_dirs)
    compiled = _compiled(result)
    return _with_templates(compiled)


def _compiled(result: CheckResult) -> CompiledSop:
    if result.compiled is not None and result.ok:
        return result.compiled
    errors = [d for d in result.diagnostics if d.is_error]
    if errors and errors[0].code < "SOP100":
        raise LoadError(list(result.diagnostics))
    raise CompileError(list(result.diagnostics))


def _check_source(source: Source, include_dirs: IncludeDirs = (), with_templates: bool = False) -> CheckResult:
    found, compiled, graph = _pipeline(source)
    kept = [d for d in found if not _library_offer(d, source)]
    loading = [w for s in (source, *source.included) for w in s.warnings]  # located already
    located = sorted([*loading, *(_locate(d, source) for d in kept)], key=_order)
    if compiled is not None:
        compiled = replace(compiled, warnings=tuple(d for d in located if not d.is_error),
                           include_dirs=tuple(str(Path(d).resolve()) for d in include_dirs))
        if with_templates:
            compiled = _with_templates(compiled)
    return CheckResult(file=source.file, diagnostics=tuple(located), compiled=compiled,
                       lines=tuple(source.lines), graph=graph,
                       library_lines={lib.file: tuple(lib.lines) for lib in source.included}, source=source)


def _with_templates(compiled: CompiledSop) -> CompiledSop:
    """`compiled` with every template and expression of its plan compiled (the sandbox's
    compiler, its code from one bundle of the on-disk cache when it has it)."""
    plan = compiled.plan
    return replace(compiled, templates=compile_all(plan.templates, plan.expressions))


def _library_offer(diag: Diagnostic, source: Source) -> bool:
    """An included library offers actions; one that no role of this SOP runs is no mistake."""
    return diag.code == "SOP211" and source.owner_of(diag.pointer) is not source


def _pipeline(source: Source) -> tuple[list[Diagnostic], CompiledSop | None, nx.DiGraph | None]:
    """Run the phases in order; stop after the first one with an error.

    Returns the diagnostics, the compiled SOP (None on error) and the watch graph (None when
    an earlier phase failed)."""
    spec, found = _structure(source.data)
    if spec is None:
        return found, None, None
    ctx = Context(spec=spec, folder=None if source.file.startswith("<") else Path(source.file).resolve().parent)
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
    try:
        return Sop.model_validate(data), []
    except ValidationError as exc:
        return None, [_from_pydantic(err) for err in exc.errors(include_url=False)]


def _from_pydantic(err: Any) -> Diagnostic:
    loc = list(err["loc"])
    if len(loc) > 2 and loc[0] == "actions":
        del loc[2]   # the action union's tag (`llm`, `exec`...): the branch, not a key
    loc = [p for p in loc if isinstance(p, (str, int)) and not _is_branch(p)]
    return Diagnostic(code="SOP108", severity="error", pointer=join_pointer("", *loc),
                      message=f"invalid value: {err['msg']}", hint="the SOP models refuse this value")


def _is_branch(part: Any) -> bool:
    """pydantic names union branches in `loc` (e.g. `literal['text']`); they are not keys."""
    return isinstance(part, str) and ("[" in part or part in ("CodeOutput", "function-after"))


def _make(spec: Sop, source: Source, graph: nx.DiGraph | None) -> CompiledSop:
    schemas = {aid: output_schema(output_of(action)) for aid, action in spec.actions.items()}
    return CompiledSop(spec=spec, file=source.file, source_hash=sources_digest(source.raw, source.included),
                       output_schemas=MappingProxyType(schemas), graph=graph, source=source,
                       plan=build_plan(spec, source.file))


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
    owner = source.owner_of(diag.pointer)  # the including file, or the library defining it
    smap = owner.map
    line, col = smap.locate(diag.pointer, prefer_key=diag.code in _AT_KEY)
    if diag.line and diag.pointer in smap.literals:
        line, col = _template_position(owner, line + diag.line)
    if diag.code in _NAMES_A_WORD:
        col = _word_column(owner, line, col, diag.message)
    related = tuple(_locate_related(r, source, owner) for r in diag.related)
    return replace(diag, file=owner.file, line=line, col=col, related=related)


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


def _locate_related(rel: Related, source: Source, diag_owner: Source) -> Related:
    if rel.line or not rel.pointer:
        return rel
    owner = source.owner_of(rel.pointer)
    line, col = owner.map.locate(rel.pointer)
    return replace(rel, line=line, col=col, file="" if owner is diag_owner else owner.file)


def _order(diag: Diagnostic) -> tuple[int, int, str, str]:
    return (diag.line, diag.col, diag.code, diag.message)
