"""sopctl's diagnostics as LSP diagnostics, and the quick fixes their did-you-means offer.

A diagnostic is located at one point (`file:line:col`); an editor underlines a range, so
the range is the word there: the name the message quotes when it starts at that point
(`'WritPRD'`, `'Product Goal'`), else the YAML token (a key up to its colon, a quoted or
plain scalar). The hint goes into the message, as `validate` prints it under the header;
a `did you mean 'X'?` also becomes related information at X's definition (when X is a
name of the file) and a quick fix that replaces the range with X. The related places a
diagnostic carries (the other end of a cycle, where a name was first defined) are related
information too.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lsprotocol import types

from engine.errors import Diagnostic
from engine.lsp.cursor import to_client
from engine.lsp.index import Index, Span

__all__ = ["SOURCE", "quick_fixes", "span_range", "to_lsp", "uri_of"]


SOURCE = "sopctl"


_DID_YOU_MEAN = re.compile(r"did you mean '([^']+)'\?")
_TOKEN = re.compile(r"""[^\s,\[\]{}#]+(?:[ \t]+[^\s,\[\]{}#:]+)*""")


def uri_of(file: str) -> str:
    return Path(file).absolute().as_uri()


def span_range(span: Span, lines: Sequence[str]) -> types.Range:
    text = lines[span.line] if span.line < len(lines) else ""
    return types.Range(start=types.Position(line=span.line, character=to_client(text, span.start)),
                       end=types.Position(line=span.line, character=to_client(text, span.end)))


def to_lsp(diag: Diagnostic, lines: Sequence[str], index: Index | None) -> types.Diagnostic:
    """One sopctl diagnostic in the file whose lines are `lines`."""
    line = max(diag.line - 1, 0)
    text = lines[line] if line < len(lines) else ""
    start, end = _extent(diag, text) if diag.line else (0, 0)
    fix = _suggestion(diag.hint)
    data: dict[str, Any] = {"fix": fix} if fix and text[start:end] != fix else {}
    return types.Diagnostic(
        range=types.Range(start=types.Position(line=line, character=to_client(text, start)),
                          end=types.Position(line=line, character=to_client(text, end))),
        severity=types.DiagnosticSeverity.Error if diag.is_error else types.DiagnosticSeverity.Warning,
        code=diag.code, source=SOURCE, message=diag.message + (f"\nhint: {diag.hint}" if diag.hint else ""),
        related_information=_related(diag, index, fix) or None, data=data or None)


def _suggestion(hint: str) -> str:
    match = _DID_YOU_MEAN.search(hint)
    return match.group(1) if match else ""


def _extent(diag: Diagnostic, text: str) -> tuple[int, int]:
    """The (start, end) columns of what the diagnostic names on its line."""
    col = min(max(diag.col - 1, 0), len(text))
    for word in reversed(re.findall(r"'([^']+)'", diag.message)):
        if text.startswith(word, col):
            return col, col + len(word)
    if text[col:col + 1] in ("'", '"'):
        close = text.find(text[col], col + 1)
        return (col + 1, close) if close > col else (col, len(text))
    match = _TOKEN.match(text, col)
    if match is None:
        return col, min(col + 1, len(text))
    token = match.group()
    colon = re.search(r":(\s|$)", token)
    return col, col + (colon.start() if colon else len(token.rstrip()))


def _related(diag: Diagnostic, index: Index | None, fix: str) -> list[types.DiagnosticRelatedInformation]:
    own = diag.file
    found = []
    for rel in diag.related:
        if rel.line:
            place = types.Position(line=rel.line - 1, character=max(rel.col - 1, 0))
            found.append(types.DiagnosticRelatedInformation(
                location=types.Location(uri=uri_of(rel.file or own), range=types.Range(start=place, end=place)),
                message=rel.message))
    span = _defined(index, fix) if fix else None
    if span is not None and index is not None:
        lines = index.files[span.file].lines if span.file in index.files else []
        found.append(types.DiagnosticRelatedInformation(
            location=types.Location(uri=uri_of(span.file), range=span_range(span, lines)),
            message=f"did you mean '{fix}'? (defined here)"))
    return found


def _defined(index: Index | None, name: str) -> Span | None:
    if index is None:
        return None
    for kind in ("action", "role", "input"):
        if (kind, name) in index.definitions:
            return index.definitions[(kind, name)]
    return None


def quick_fixes(uri: str, diagnostics: Sequence[types.Diagnostic]) -> list[types.CodeAction]:
    """A quick fix for each of sopctl's diagnostics that carries a did-you-mean."""
    actions = []
    for diag in diagnostics:
        fix = diag.data.get("fix") if diag.source == SOURCE and isinstance(diag.data, dict) else None
        if not isinstance(fix, str) or not fix:
            continue
        edit = types.WorkspaceEdit(changes={uri: [types.TextEdit(range=diag.range, new_text=fix)]})
        actions.append(types.CodeAction(title=f"Change to '{fix}'", kind=types.CodeActionKind.QuickFix,
                                        diagnostics=[diag], edit=edit, is_preferred=True))
    return actions
