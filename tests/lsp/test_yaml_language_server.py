"""Our JSON Schema in the real yaml-language-server (Red Hat's, from npm), driven over LSP on
stdio: what an editor shows from `schemas/sop.schema.json` without `sopctl lsp`.

The server is found as `$SOPCTL_YAML_LANGUAGE_SERVER` (its `bin/yaml-language-server`
script), on PATH, or in ~/.cache/sopctl/yaml-language-server; where none is and `npm` is
here, it is installed there once (`npm install yaml-language-server@1`, a few seconds).
Without node or npm the tests skip. docs/editors.md gives the same set-up by hand.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "schemas" / "sop.schema.json"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sopctl" / "yaml-language-server"

pytestmark = [pytest.mark.slow, pytest.mark.asyncio]


def _server() -> list[str] | None:
    """The command that starts yaml-language-server over stdio, or None."""
    node = shutil.which("node")
    given = os.environ.get("SOPCTL_YAML_LANGUAGE_SERVER")
    if given:
        return [node, given, "--stdio"] if node and _is_script(given) else [given, "--stdio"]
    found = shutil.which("yaml-language-server")
    if found:
        return [found, "--stdio"]
    script = CACHE / "node_modules" / "yaml-language-server" / "bin" / "yaml-language-server"
    if not script.is_file() and node and shutil.which("npm"):
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(["npm", "install", "--prefix", str(CACHE), "--no-audit", "--no-fund", "--silent",
                        "yaml-language-server@1"], check=False, timeout=300, capture_output=True)
    return [node, str(script), "--stdio"] if node and script.is_file() else None


def _is_script(path: str) -> bool:
    """A node script (`#!/usr/bin/env node`), run with node rather than as a program."""
    try:
        with open(path, "rb") as handle:
            return b"node" in handle.readline()
    except OSError:
        return False


@pytest_asyncio.fixture
async def yls() -> AsyncIterator[LanguageClient]:
    command = _server()
    if command is None:
        pytest.skip("yaml-language-server is not here (no node/npm, or npm install failed)")
    client = await ClientServerConfig(server_command=command).start()
    client.set_configuration({"yaml": {"validate": True, "hover": True, "completion": True}})
    markdown = [types.MarkupKind.Markdown]
    await client.initialize_session(types.InitializeParams(capabilities=types.ClientCapabilities(
        workspace=types.WorkspaceClientCapabilities(configuration=True),
        text_document=types.TextDocumentClientCapabilities(
            hover=types.HoverClientCapabilities(content_format=markdown),
            completion=types.CompletionClientCapabilities(completion_item=types.ClientCompletionItemOptions(
                documentation_format=markdown, snippet_support=True))))))
    yield client
    await client.shutdown_session()
    await client.stop()


SOP = f"""\
# yaml-language-server: $schema={SCHEMA.as_uri()}
apiVersion: sop/v1
name: in_the_editor
actions:
  Write:
    prompt: "Write about {{{{ inputs.idea }}}}."
    output:
      Title: {{type: str, instruction: a title}}
      Body:
        type: str
roles:
  Writer:
    react_mode: by_order
    actions: [Write]
    watch: [UserRequirement]
"""

MCP = """\
mcp:
  both: {command: [python, server.py], url: "http://localhost:8000/mcp"}
  neither: {tools: [search]}
"""


def _open(client: LanguageClient, path: Path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    client.text_document_did_open(types.DidOpenTextDocumentParams(text_document=types.TextDocumentItem(
        uri=path.as_uri(), language_id="yaml", version=1, text=text)))
    return path.as_uri()


async def _diagnostics(client: LanguageClient, uri: str) -> list[types.Diagnostic]:
    async def published() -> list[types.Diagnostic]:
        while uri not in client.diagnostics:
            await asyncio.sleep(0.05)
        return list(client.diagnostics[uri])
    return await asyncio.wait_for(published(), 60)


def _at(text: str, needle: str, offset: int = 0) -> types.Position:
    index = text.index(needle) + offset
    return types.Position(line=text.count("\n", 0, index), character=index - (text.rfind("\n", 0, index) + 1))


async def _hover(client: LanguageClient, uri: str, position: types.Position) -> str:
    found = await client.text_document_hover_async(types.HoverParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=position))
    assert found is not None and isinstance(found.contents, types.MarkupContent)
    return found.contents.value


async def _completion(client: LanguageClient, uri: str, position: types.Position) -> list[types.CompletionItem]:
    found = await client.text_document_completion_async(types.CompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=position))
    return found.items if isinstance(found, types.CompletionList) else list(found or [])


def _doc(item: types.CompletionItem) -> str:
    doc = item.documentation
    return doc.value if isinstance(doc, types.MarkupContent) else doc or ""


async def test_shipped_files_are_clean_in_the_editor(yls: LanguageClient) -> None:
    """Every shipped SOP (each names the schema in its modeline) has no schema problem there."""
    for path in sorted([*ROOT.glob("sops/*.sop.yaml"), *ROOT.glob("examples/*.sop.yaml")]):
        text = path.read_text(encoding="utf-8")
        assert text.startswith("# yaml-language-server: $schema="), path
        yls.text_document_did_open(types.DidOpenTextDocumentParams(text_document=types.TextDocumentItem(
            uri=path.as_uri(), language_id="yaml", version=1, text=text)))
        assert await _diagnostics(yls, path.as_uri()) == [], path.name


async def test_an_mcp_server_with_both_or_neither_transport_is_told_to_pick_one(yls: LanguageClient,
                                                                               tmp_path: Path) -> None:
    text = SOP + MCP
    found = await _diagnostics(yls, _open(yls, tmp_path / "mcp.sop.yaml", text))
    by_line = {d.range.start.line: d.message for d in found}
    assert by_line == {
        _at(text, "both:").line: "pick one of `command` (stdio) or `url` (HTTP): it has both; keep one",
        _at(text, "neither:").line: "pick one of `command` (stdio) or `url` (HTTP): it has neither"}


async def test_hovers_are_titled_with_what_the_key_is_in(yls: LanguageClient, tmp_path: Path) -> None:
    """A key's hover names its model (Role, Action (kind llm), Output node), not the file's root title."""
    uri = _open(yls, tmp_path / "hover.sop.yaml", SOP)
    assert await _diagnostics(yls, uri) == []
    titles = {}
    for needle in ("react_mode", "prompt", "instruction", "name: in"):
        text = await _hover(yls, uri, _at(SOP, needle, 2))
        titles[needle] = text.split("\n", 1)[0]
    assert titles == {"react_mode": "#### Role", "prompt": "#### Action (kind llm)",
                      "instruction": "#### Output node", "name: in": "#### sopctl SOP file (apiVersion sop/v1)"}


async def test_enum_values_each_say_what_they_mean(yls: LanguageClient, tmp_path: Path) -> None:
    text = SOP.replace("react_mode: by_order", "react_mode: ")
    uri = _open(yls, tmp_path / "enum.sop.yaml", text)
    await _diagnostics(yls, uri)
    items = {item.label: _doc(item) for item in await _completion(yls, uri, _at(text, "react_mode: ", 12))}
    assert items == {"react": "The model picks the next action (default).", "by_order": "The actions run in order.",
                     "plan_and_act": "A plan (the `planner`'s action), then its tasks."}


async def test_no_null_is_offered_as_an_output_node_type(yls: LanguageClient, tmp_path: Path) -> None:
    text = SOP.replace("        type: str\n", "        type: \n")
    uri = _open(yls, tmp_path / "node.sop.yaml", text)
    await _diagnostics(yls, uri)
    labels = [item.label for item in await _completion(yls, uri, _at(text, "        type: \n", 14))]
    assert "str" in labels and "list[str]" in labels
    assert "null" not in labels and "" not in labels
