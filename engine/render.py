"""Diagnostics for people (compiler-style text) and for tools (JSON).

Text follows the shape users know from compilers::

    sops/review.sop.yaml:5:17: error[SOP102]: 'by_orderr' is not one of 'react', ...
        5 |     react_mode: by_orderr
          |                 ^
      at /roles/Reviewer/react_mode
      hint: did you mean 'by_order'?

JSON is one object: overall `ok`, counts, a summary per file and every diagnostic with all of
its fields, so an editor or CI can consume it without parsing text.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Iterable, Sequence

from .errors import Diagnostic

__all__ = ["strict", "render_text", "render_json", "summary", "report", "render_graph"]


def strict(diagnostics: Iterable[Diagnostic]) -> tuple[Diagnostic, ...]:
    """`--strict`: every warning becomes an error."""
    return tuple(replace(d, severity="error") if not d.is_error else d for d in diagnostics)


def render_text(diagnostic: Diagnostic, lines: Sequence[str] = ()) -> str:
    """One diagnostic: header, the offending line with a caret, its pointer, hint and notes."""
    where = f"{diagnostic.file}:{diagnostic.line}:{diagnostic.col}" if diagnostic.line else diagnostic.file
    out = [f"{where}: {diagnostic.severity}[{diagnostic.code}]: {diagnostic.message}"]
    out += _excerpt(lines, diagnostic.line, diagnostic.col)
    if diagnostic.pointer:
        out.append(f"  at {diagnostic.pointer}")
    if diagnostic.hint:
        out.append(f"  hint: {diagnostic.hint}")
    for rel in diagnostic.related:
        place = f"{diagnostic.file}:{rel.line}:{rel.col}" if rel.line else rel.pointer
        out.append(f"  note: {rel.message} ({place})")
    return "\n".join(out)


def _excerpt(lines: Sequence[str], line: int, col: int) -> list[str]:
    if not (0 < line <= len(lines)):
        return []
    text = lines[line - 1].replace("\t", " ")
    if len(text) > 200:
        text = text[:200] + "..."
    width = len(str(line))
    caret = " " * max(col - 1, 0) + "^" if col <= len(text) + 1 else ""
    return [f"  {line:>{width + 2}} | {text}", f"  {'':>{width + 2}} | {caret}".rstrip()]


def summary(file: str, diagnostics: Sequence[Diagnostic]) -> str:
    """`file: ok`, or `file: 2 errors, 1 warning`."""
    errors = sum(d.is_error for d in diagnostics)
    warnings = len(diagnostics) - errors
    if not diagnostics:
        return f"{file}: ok"
    parts = [f"{errors} error{'s' * (errors != 1)}"] if errors else []
    parts += [f"{warnings} warning{'s' * (warnings != 1)}"] if warnings else []
    return f"{file}: {', '.join(parts)}"


def render_json(results: Sequence[tuple[str, Sequence[Diagnostic]]]) -> str:
    """All files' diagnostics as one JSON document."""
    files: list[dict[str, Any]] = []
    every: list[dict[str, Any]] = []
    for file, diagnostics in results:
        errors = sum(d.is_error for d in diagnostics)
        files.append({"file": file, "ok": errors == 0, "errors": errors,
                      "warnings": len(diagnostics) - errors})
        every += [d.to_json() for d in diagnostics]
    total = sum(f["errors"] for f in files)
    document = {"ok": total == 0, "errors": total, "warnings": sum(f["warnings"] for f in files),
                "files": files, "diagnostics": every}
    return json.dumps(document, indent=2, ensure_ascii=False)


def report(results: Sequence[Any], fmt: str = "text", strict_mode: bool = False) -> tuple[str, int]:
    """What `sopctl validate` prints for some CheckResults, and its exit code (0 ok, 1 errors)."""
    checked = [(r.file, strict(r.diagnostics) if strict_mode else r.diagnostics, r.lines) for r in results]
    failed = any(d.is_error for _, diags, _ in checked for d in diags)
    if fmt == "json":
        return render_json([(file, diags) for file, diags, _ in checked]), int(failed)
    blocks = []
    for file, diags, lines in checked:
        blocks += [render_text(d, lines) + "\n" for d in diags]
        blocks.append(summary(file, diags))
    return "\n".join(blocks), int(failed)


def render_graph(graph: Any, fmt: str) -> str:
    """The watch graph as mermaid, dot or JSON text."""
    from . import graph as graphs

    if fmt == "json":
        return json.dumps(graphs.to_json(graph), indent=2, ensure_ascii=False) + "\n"
    return graphs.to_dot(graph) if fmt == "dot" else graphs.to_mermaid(graph)
