"""The language server: pygls over stdio, sopctl's checker and index behind it.

A document is checked when it is opened or saved, and after the user stops typing for a
moment (`debounce_s`, 0.3 s by default): a check of a large file takes tens of
milliseconds, and checking at every keystroke would only queue them. Checks run on one
worker thread, so requests (completion, hover) are answered while one runs; a check whose
document changed meanwhile is dropped, not published. Each check publishes its
diagnostics to every file they land in (the document and its libraries), and clears the
files where the previous check had some and this one has none.

Every open document's text stands in for its file (an overlay): a change to an open
library checks, after the same debounce, the open documents that read it (its includers,
and it through them), against the unsaved text; closing it checks them against the file.

Completion and navigation read the document's latest text and the last index that loaded
(a half-typed line leaves the previous index in use until the text loads again).
"""

from __future__ import annotations

import asyncio
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path

from engine import __version__
from engine.lsp.analysis import Analysis, analyse, is_sop
from engine.lsp.completion import TRIGGERS, complete
from engine.lsp.cursor import from_client, use_encoding
from engine.lsp.index import Index
from engine.lsp.navigation import definition, hover, references, symbols
from engine.lsp.publish import quick_fixes, to_lsp, uri_of

__all__ = ["DEFAULT_DEBOUNCE_S", "SopServer", "serve"]


DEFAULT_DEBOUNCE_S = 0.3


@dataclass
class _State:
    """What the server keeps per open document."""

    analysis: Analysis | None = None
    index: Index | None = None
    """The last index that loaded."""
    pending: asyncio.Task[None] | None = None
    published: set[str] = field(default_factory=set)
    """The files (absolute) this document's last check published diagnostics to."""


class SopServer(LanguageServer):
    """sopctl's language server."""

    def __init__(self, debounce_s: float = DEFAULT_DEBOUNCE_S, include_dirs: tuple[str, ...] = ()) -> None:
        super().__init__("sopctl", __version__)
        self.debounce_s = debounce_s
        self.include_dirs = include_dirs
        self.documents: dict[str, _State] = {}
        self.checker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sopctl-check")
        self.shared: dict[str, dict[str, list[types.Diagnostic]]] = {}
        """For each file, the diagnostics each open document's check published to it: two
        open files including one library each contribute theirs."""

    # ------------------------------------------------------------------ checking

    def path_of(self, uri: str) -> str:
        return to_fs_path(uri) or uri

    def schedule(self, uri: str, delay: float) -> None:
        """Check the document after `delay` seconds, replacing a check not yet started."""
        state = self.documents.setdefault(uri, _State())
        if state.pending is not None and not state.pending.done():
            state.pending.cancel()
        state.pending = asyncio.get_running_loop().create_task(self._check(uri, delay))

    async def _check(self, uri: str, delay: float) -> None:
        if delay:
            await asyncio.sleep(delay)
        document = self.workspace.get_text_document(uri)
        text = document.source
        read_versions = {u: self.workspace.get_text_document(u).version for u in self.documents}
        others = {self.path_of(u): self.workspace.get_text_document(u).source
                  for u in self.documents if u != uri}
        try:
            analysis = await asyncio.get_running_loop().run_in_executor(
                self.checker, analyse, self.path_of(uri), text, self.include_dirs, others)
        except Exception as exc:  # noqa: BLE001 - a bug must not end the editor's session
            self.window_log_message(types.LogMessageParams(
                type=types.MessageType.Error, message=f"sopctl: internal error checking {uri}: "
                f"{type(exc).__name__}: {exc} (a bug in sopctl; please report it)"))
            return
        state = self.documents.get(uri)
        if state is None or self._read_changed(uri, read_versions, analysis):
            return   # closed, or it or a file it read changed meanwhile: a newer check is on its way
        state.analysis = analysis
        if analysis.index is not None:
            state.index = analysis.index
        self._publish(uri, state, analysis)

    def _read_changed(self, uri: str, read_versions: dict[str, int | None], analysis: Analysis) -> bool:
        """Whether an open document this check read was edited while it ran (the edit
        scheduled its readers again, so this check's findings are already stale)."""
        read = {os.path.realpath(f) for f in analysis.index.files} if analysis.index else None
        for other, before in read_versions.items():
            if other not in self.documents or self.workspace.get_text_document(other).version == before:
                continue
            if other == uri or read is None or os.path.realpath(self.path_of(other)) in read:
                return True
        return False

    def forget_readings_of(self, uri: str) -> None:
        """The document at `uri` changed: what other documents' checks said about its old text
        no longer counts (their new checks are scheduled), so its next publication is its own."""
        contributed = self.shared.get(self.path_of(uri), {})
        for other in [u for u in contributed if u != uri]:
            del contributed[other]

    def _publish(self, uri: str, state: _State, analysis: Analysis) -> None:
        index = analysis.index or state.index
        now = {file: [to_lsp(d, analysis.lines.get(file, ()), index) for d in diags]
               for file, diags in analysis.diagnostics.items()}
        for file in state.published - set(now):
            now[file] = []
        for file, found in now.items():
            self.shared.setdefault(file, {})[uri] = found
            merged = [d for contributed in self.shared[file].values() for d in contributed]
            target = uri if file == analysis.file else uri_of(file)
            self.text_document_publish_diagnostics(types.PublishDiagnosticsParams(
                uri=target, diagnostics=_unique(merged), version=self.version_of(target)))
        state.published = {file for file, found in now.items() if found or file == analysis.file}

    def dependents(self, uri: str) -> list[str]:
        """The other open documents whose last check read the document at `uri` (an includer
        of it, a library checked through it), or whose text has not loaded yet."""
        path = os.path.realpath(self.path_of(uri))
        return [other for other, state in self.documents.items() if other != uri and (
            state.index is None or any(os.path.realpath(f) == path for f in state.index.files))]

    def version_of(self, uri: str) -> int | None:
        """The open document's version the published diagnostics are about (LSP's `version`:
        a client can drop what was said about older text); None for a file not open."""
        return self.workspace.get_text_document(uri).version if uri in self.documents else None

    def close(self, uri: str) -> None:
        state = self.documents.pop(uri, None)
        if state is None:
            return
        if state.pending is not None:
            state.pending.cancel()
        for file in state.published:
            contributed = self.shared.get(file, {})
            contributed.pop(uri, None)
            merged = [] if file == self.path_of(uri) else [d for c in contributed.values() for d in c]
            self.text_document_publish_diagnostics(types.PublishDiagnosticsParams(
                uri=uri if file == self.path_of(uri) else uri_of(file), diagnostics=_unique(merged)))

    # ------------------------------------------------------------------ requests

    def position(self, uri: str, position: types.Position) -> tuple[list[str], int, int]:
        """The document's lines and the position as a Python (line, column)."""
        lines = self.workspace.get_text_document(uri).source.split("\n")
        text = lines[position.line] if position.line < len(lines) else ""
        return lines, position.line, from_client(text, position.character)

    def index_of(self, uri: str) -> Index | None:
        state = self.documents.get(uri)
        return state.index if state is not None else None

    def serves(self, uri: str) -> bool:
        """Whether the document is an SOP file (other YAML files get no answers)."""
        return is_sop(self.path_of(uri), self.workspace.get_text_document(uri).source)


def _unique(found: list[types.Diagnostic]) -> list[types.Diagnostic]:
    seen: list[types.Diagnostic] = []
    for diag in found:
        if diag not in seen:
            seen.append(diag)
    return seen


def build(debounce_s: float = DEFAULT_DEBOUNCE_S, include_dirs: tuple[str, ...] = ()) -> SopServer:
    """The server with its features registered."""
    server = SopServer(debounce_s, include_dirs)

    @server.feature(types.INITIALIZE)
    def initialize(ls: SopServer, params: types.InitializeParams) -> None:
        encoding = ls.workspace.position_encoding
        use_encoding(str(getattr(encoding, "value", encoding) or "utf-16"))
        options = params.initialization_options
        if isinstance(options, dict) and isinstance(options.get("debounceMs"), (int, float)):
            ls.debounce_s = max(float(options["debounceMs"]), 0.0) / 1000

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: SopServer, params: types.DidOpenTextDocumentParams) -> None:
        ls.schedule(params.text_document.uri, 0)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: SopServer, params: types.DidChangeTextDocumentParams) -> None:
        uri = params.text_document.uri
        ls.forget_readings_of(uri)
        for changed in (uri, *ls.dependents(uri)):   # an includer reads the unsaved text too
            ls.schedule(changed, ls.debounce_s)

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE)
    def did_save(ls: SopServer, params: types.DidSaveTextDocumentParams) -> None:
        ls.schedule(params.text_document.uri, 0)
        for uri in ls.documents:        # the files that include a saved library read it again
            if uri != params.text_document.uri:
                ls.schedule(uri, 0)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: SopServer, params: types.DidCloseTextDocumentParams) -> None:
        uri = params.text_document.uri
        readers = ls.dependents(uri)
        ls.close(uri)
        for reader in readers:     # the unsaved text is gone: they read the file again
            ls.schedule(reader, 0)

    _requests(server)
    return server


def _requests(server: SopServer) -> None:
    """The features that answer a request at a position."""

    @server.feature(types.TEXT_DOCUMENT_COMPLETION, types.CompletionOptions(trigger_characters=TRIGGERS))
    def completion(ls: SopServer, params: types.CompletionParams) -> types.CompletionList:
        uri = params.text_document.uri
        if not ls.serves(uri):
            return types.CompletionList(is_incomplete=False, items=[])
        lines, line, col = ls.position(uri, params.position)
        items = complete("\n".join(lines), line, col, ls.index_of(uri), ls.path_of(uri))
        return types.CompletionList(is_incomplete=False, items=items)

    @server.feature(types.TEXT_DOCUMENT_HOVER)
    def on_hover(ls: SopServer, params: types.HoverParams) -> types.Hover | None:
        uri = params.text_document.uri
        if not ls.serves(uri):
            return None
        lines, line, col = ls.position(uri, params.position)
        return hover(ls.index_of(uri), lines, ls.path_of(uri), line, col)

    @server.feature(types.TEXT_DOCUMENT_DEFINITION)
    def on_definition(ls: SopServer, params: types.DefinitionParams) -> list[types.Location]:
        uri = params.text_document.uri
        index = ls.index_of(uri)
        _, line, col = ls.position(uri, params.position)
        return definition(index, ls.path_of(uri), line, col) if index is not None else []

    @server.feature(types.TEXT_DOCUMENT_REFERENCES)
    def on_references(ls: SopServer, params: types.ReferenceParams) -> list[types.Location]:
        uri = params.text_document.uri
        index = ls.index_of(uri)
        _, line, col = ls.position(uri, params.position)
        declaration = params.context.include_declaration
        return references(index, ls.path_of(uri), line, col, declaration) if index is not None else []

    @server.feature(types.TEXT_DOCUMENT_DOCUMENT_SYMBOL)
    def on_symbols(ls: SopServer, params: types.DocumentSymbolParams) -> list[types.DocumentSymbol]:
        uri = params.text_document.uri
        index = ls.index_of(uri)
        return symbols(index, ls.path_of(uri)) if index is not None else []

    @server.feature(types.TEXT_DOCUMENT_CODE_ACTION, types.CodeActionOptions(
        code_action_kinds=[types.CodeActionKind.QuickFix]))
    def on_code_action(ls: SopServer, params: types.CodeActionParams) -> list[types.CodeAction]:
        return quick_fixes(params.text_document.uri, params.context.diagnostics)


def serve(debounce_s: float = DEFAULT_DEBOUNCE_S, include_dirs: tuple[str, ...] = ()) -> int:
    """Serve one editor over stdin/stdout until it says exit."""
    stream = sys.stdout.buffer
    sys.stdout = sys.stderr          # a stray print must never corrupt the JSON-RPC stream
    build(debounce_s, include_dirs).start_io(sys.stdin.buffer, stream)
    return 0
