"""`sopctl lsp` latency on the shipped software company, over real stdio.

An editor starts `sopctl lsp` and talks JSON-RPC to it; this bench does the same with
pygls's client (the `lsp` extra), on `sops/software_company.sop.yaml`:

1. First diagnostics on open: a fresh server per repetition (started and initialised
   first, not timed), then the time from sending `didOpen` to receiving its
   `publishDiagnostics`. The first check of a process pays its lazy imports (the models,
   jinja) and parses the schema's models: what a user waits for after opening a file.
2. Per change: in one server, an edit of a prompt (alternately a valid one and a misspelt
   `inputs.X`, so both the clean and the did-you-mean path are timed) from `didChange`
   to its `publishDiagnostics`, with `--debounce-ms 0`: the check itself. An editor adds
   the debounce (300 ms by default) after the last keystroke.
3. Completion: a `textDocument/completion` request in a `watch: [...]` list, round trip.
4. Per change of an open library: `examples/software_company_with_tests.sop.yaml` and the
   library it includes open, the library edited (unsaved; alternately `WriteDesign`
   renamed, which the includer's roles then name in vain, and back), from `didChange` to
   the includer's `publishDiagnostics`: the includer checked against the unsaved library.

Wall-clock milliseconds, min / median / max of the repetitions.

    python -m bench.lsp_bench
    python -c "from bench.lsp_bench import main; main(size_factor=0.2)"   # smoke
"""
from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from bench.compare import stats

__all__ = ["main"]

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "sops" / "software_company.sop.yaml"
INCLUDER = ROOT / "examples" / "software_company_with_tests.sop.yaml"
LIBRARY = ROOT / "examples" / "lib" / "software_company_documents.sop.yaml"


def _server_command() -> list[str]:
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
            "from engine.cli import main\nsys.exit(main(['lsp', '--debounce-ms', '0']))\n")
    return [sys.executable, "-c", code]


class _Session:
    """A server process and a client that notes when each file's diagnostics arrive."""

    def __init__(self) -> None:
        from lsprotocol import types
        from pygls.lsp.client import LanguageClient

        self.types = types
        self.client = LanguageClient("sopctl-bench", "1")
        self.arrived: dict[str, asyncio.Event] = {}
        self.last: dict[str, list[Any]] = {}

        @self.client.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
        def published(params: Any) -> None:
            self.last[params.uri] = list(params.diagnostics)
            self.arrived.setdefault(params.uri, asyncio.Event()).set()

    async def start(self) -> None:
        await self.client.start_io(*_server_command())
        await self.client.initialize_async(self.types.InitializeParams(
            capabilities=self.types.ClientCapabilities()))
        self.client.initialized(self.types.InitializedParams())

    async def stop(self) -> None:
        await self.client.shutdown_async(None)
        self.client.exit(None)
        await self.client.stop()

    async def timed(self, uri: str, send: Any) -> float:
        """Seconds from `send()` to the next diagnostics of `uri`."""
        event = self.arrived.setdefault(uri, asyncio.Event())
        event.clear()
        start = time.perf_counter()
        send()
        await asyncio.wait_for(event.wait(), 120)
        return time.perf_counter() - start

    def open(self, uri: str, text: str) -> None:
        types = self.types
        self.client.text_document_did_open(types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=uri, language_id="yaml", version=1, text=text)))

    def change(self, uri: str, text: str, version: int) -> None:
        types = self.types
        self.client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)]))


async def _open_once(text: str) -> float:
    session = _Session()
    await session.start()
    try:
        return await session.timed(TARGET.as_uri(), lambda: session.open(TARGET.as_uri(), text))
    finally:
        await session.stop()


def _edits(text: str, count: int) -> list[tuple[str, int]]:
    """`count` edited texts (a word added to the idea's line of WritePRD's prompt, or the
    input misspelt), with the number of diagnostics each should give."""
    marker = "{{ inputs.idea }}"
    assert marker in text, "the software company's prompt reads inputs.idea"
    out = []
    for i in range(count):
        if i % 2:
            out.append((text.replace(marker, "{{ inputs.idae }}", 1), 1))
        else:
            out.append((text.replace(marker, marker + f" (draft {i})", 1), 0))
    return out


async def _changes(text: str, count: int) -> tuple[list[float], list[float], list[int]]:
    session = _Session()
    await session.start()
    uri = TARGET.as_uri()
    try:
        await session.timed(uri, lambda: session.open(uri, text))
        change_s, counts = [], []
        for version, (edited, _) in enumerate(_edits(text, count), start=2):
            change_s.append(await session.timed(uri, lambda e=edited, v=version: session.change(uri, e, v)))
            counts.append(len(session.last[uri]))
        completion_s = [await _completion(session, uri, text) for _ in range(count)]
        return change_s, completion_s, counts
    finally:
        await session.stop()


async def _completion(session: _Session, uri: str, text: str) -> float:
    types = session.types
    needle = "watch: [WritePRD]"
    index = text.index(needle) + len("watch: [Wri")
    line = text.count("\n", 0, index)
    col = index - (text.rfind("\n", 0, index) + 1)
    start = time.perf_counter()
    result = await session.client.text_document_completion_async(types.CompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line=line, character=col)))
    elapsed = time.perf_counter() - start
    assert result is not None and any(item.label == "WritePRD" for item in result.items)
    return elapsed


async def _library_changes(count: int) -> tuple[list[float], list[bool]]:
    """Seconds from each library edit to the includer's diagnostics, and whether each edit's
    diagnostics were as expected (some for a renamed action, none for the original)."""
    session = _Session()
    await session.start()
    main, library = INCLUDER.as_uri(), LIBRARY.as_uri()
    text = LIBRARY.read_text(encoding="utf-8")
    renamed = text.replace("\n  WriteDesign:", "\n  WriteDesig:", 1)
    assert renamed != text, "the library defines WriteDesign"
    try:
        await session.timed(main, lambda: session.open(main, INCLUDER.read_text(encoding="utf-8")))
        await session.timed(library, lambda: session.open(library, text))
        took, right = [], []
        for version in range(2, count + 2):
            edited = renamed if version % 2 == 0 else text
            took.append(await session.timed(main, lambda e=edited, v=version: session.change(library, e, v)))
            right.append(bool(session.last[main]) == (edited is renamed))
        return took, right
    finally:
        await session.stop()


def _ms(values: list[float]) -> dict[str, float]:
    return {k: (v * 1000 if k != "n" else v) for k, v in stats(values).items()}


def main(size_factor: float = 1.0) -> dict[str, Any]:
    text = TARGET.read_text(encoding="utf-8")
    opens = max(2, round(5 * size_factor))
    changes = max(4, round(20 * size_factor))
    open_s = [asyncio.run(_open_once(text)) for _ in range(opens)]
    change_s, completion_s, counts = asyncio.run(_changes(text, changes))
    expected = [n for _, n in _edits(text, changes)]
    assert counts == expected, f"diagnostics per edit {counts}, expected {expected}"
    library_s, right = asyncio.run(_library_changes(changes))
    assert all(right), f"the includer's diagnostics did not follow the library's edits: {right}"
    res: dict[str, Any] = {"file": str(TARGET.relative_to(ROOT)), "open_ms": _ms(open_s),
                           "change_ms": _ms(change_s), "completion_ms": _ms(completion_s),
                           "library_change_ms": _ms(library_s)}
    rows = [("first diagnostics on open (fresh server)", "open_ms"),
            ("diagnostics per change (debounce 0)", "change_ms"), ("completion in `watch`", "completion_ms"),
            (f"an open library's change, to its includer's diagnostics (`{INCLUDER.relative_to(ROOT)}`)",
             "library_change_ms")]
    lines = [f"`sopctl lsp` on `{res['file']}`, over stdio (ms, wall clock):", "",
             "| what | n | min | median | max |", "|---|---|---|---|---|"]
    for label, key in rows:
        s = res[key]
        lines.append(f"| {label} | {s['n']} | {s['min']:.1f} | {s['median']:.1f} | {s['max']:.1f} |")
    res["markdown"] = "\n".join(lines)
    print(res["markdown"])
    return res


if __name__ == "__main__":
    main()
