"""`sopctl lsp` driven by a real LSP client over stdio (pytest-lsp): the server is the
command an editor starts, in its own process; every request and notification goes through
JSON-RPC on its stdin and stdout."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.asyncio


def _server(*extra: str, probe: str = "") -> list[str]:
    """The server as an editor starts it: `sopctl lsp`, from this checkout."""
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\n{probe}"
            f"from engine.cli import main\nsys.exit(main(['lsp', '--debounce-ms', '50', *{list(extra)!r}]))\n")
    return [sys.executable, "-c", code]


@pytest_lsp.fixture(config=ClientServerConfig(server_command=_server()))
async def client(lsp_client: LanguageClient):
    _keep_versions(lsp_client)
    await lsp_client.initialize_session(types.InitializeParams(capabilities=types.ClientCapabilities()))
    yield
    await lsp_client.shutdown_session()


SOP = """\
apiVersion: sop/v1
name: write_and_review
inputs:
  idea: {type: str, required: true, description: what to write about}
actions:
  WriteDraft:
    prompt: "Write a short article about {{ inputs.idea }}."
    output:
      Title: {type: str, instruction: a catchy title}
      Body: {type: str, instruction: the article}
  Review:
    prompt: |
      Review "{{ msgs.WriteDraft[-1].out['Title'] }}":
      {{ msgs.WriteDraft[-1].out['Body'] }}
    context: none
    output: text
    artifacts:
      - path: "review.md"
        content: "{{ out }}"
roles:
  Writer:
    actions: [WriteDraft]
    watch: [UserRequirement]
  Reviewer:
    profile: Editor
    actions: [Review]
    watch: [WriteDraft]
"""


def _keep_versions(client: LanguageClient) -> None:
    """Keep each publication's document version beside its diagnostics (pytest-lsp keeps only
    the diagnostics), so a test can wait for those about the text it sent last."""
    client.diagnostic_versions = {}   # type: ignore[attr-defined]
    client.sent_versions = {}   # type: ignore[attr-defined]

    def published(params: types.PublishDiagnosticsParams) -> None:
        client.diagnostics[params.uri] = params.diagnostics
        client.diagnostic_versions[params.uri] = params.version   # type: ignore[attr-defined]
    client.protocol.fm.features[types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS] = published


def _open(client: LanguageClient, path: Path, text: str | None = None) -> str:
    text = path.read_text(encoding="utf-8") if text is None else text
    uri = path.as_uri()
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="yaml", version=1, text=text)))
    return uri


def _change(client: LanguageClient, uri: str, text: str, version: int) -> None:
    client.diagnostics.pop(uri, None)
    if not hasattr(client, "sent_versions"):   # a client a test started itself
        _keep_versions(client)
    client.sent_versions[uri] = version   # type: ignore[attr-defined]
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
        content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)]))


async def _diagnostics(client: LanguageClient, uri: str, timeout: float = 60,
                       until: Callable[[list[types.Diagnostic]], bool] | None = None) -> list[types.Diagnostic]:
    """The next diagnostics published for `uri` (the client keeps the last of each file) about
    the text `_change` sent it last: publications about older text may still be on their way.
    `until`: for a document that did not change itself (an includer of an edited library), whose
    version cannot tell an older check's publication from the newer one's, the first
    publication that says what the test expects (an editor, too, shows the last one)."""
    def about_it() -> bool:
        if uri not in client.diagnostics:
            return False
        if until is not None and not until(list(client.diagnostics[uri])):
            return False
        sent = getattr(client, "sent_versions", {}).get(uri)
        seen = getattr(client, "diagnostic_versions", {}).get(uri)
        return sent is None or (seen is not None and seen >= sent)

    async def published() -> list[types.Diagnostic]:
        while not about_it():
            await asyncio.sleep(0.02)
        return list(client.diagnostics[uri])
    return await asyncio.wait_for(published(), timeout)


def _none(found: list[types.Diagnostic]) -> bool:
    return not found


def _at(text: str, needle: str, offset: int = 0) -> types.Position:
    """The position of `needle` (plus `offset` characters) in `text`."""
    index = text.index(needle) + offset
    line = text.count("\n", 0, index)
    return types.Position(line=line, character=index - (text.rfind("\n", 0, index) + 1))


def _doc(uri: str) -> types.TextDocumentIdentifier:
    return types.TextDocumentIdentifier(uri=uri)


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------- diagnostics


async def test_a_valid_file_has_no_diagnostics(client: LanguageClient, tmp_path: Path) -> None:
    uri = _open(client, _write(tmp_path, "ok.sop.yaml", SOP))
    assert await _diagnostics(client, uri) == []


async def test_diagnostics_on_open_are_validates_with_the_did_you_mean(client: LanguageClient,
                                                                       tmp_path: Path) -> None:
    text = SOP.replace("watch: [WriteDraft]", "watch: [WriteDraf]")
    uri = _open(client, _write(tmp_path, "bad.sop.yaml", text))
    (found,) = await _diagnostics(client, uri)
    assert (found.code, found.source, found.severity) == ("SOP202", "sopctl", types.DiagnosticSeverity.Error)
    assert found.range == types.Range(start=_at(text, "WriteDraf]"), end=_at(text, "WriteDraf]", 9))
    assert found.message == "watches unknown action 'WriteDraf'\nhint: did you mean 'WriteDraft'?"
    (related,) = found.related_information or []
    assert related.location.uri == uri and related.location.range.start == _at(text, "WriteDraft:")


async def test_diagnostics_follow_changes(client: LanguageClient, tmp_path: Path) -> None:
    uri = _open(client, _write(tmp_path, "edit.sop.yaml", SOP))
    assert await _diagnostics(client, uri) == []
    broken = SOP.replace("{{ inputs.idea }}", "{{ inputs.idae }}")
    _change(client, uri, broken, 2)
    (found,) = await _diagnostics(client, uri)
    assert found.code == "SOP404" and found.range.start == _at(broken, "idae }}")
    assert "did you mean 'idea'?" in found.message
    _change(client, uri, SOP, 3)
    assert await _diagnostics(client, uri) == []


async def test_ranges_count_columns_as_the_client_asked(tmp_path: Path) -> None:
    """Helix and Neovim offer UTF-8 columns first: a range after an emoji is in bytes then."""
    text = SOP.replace('prompt: "Write', 'prompt: "😀 Write').replace("{{ inputs.idea }}", "{{ inputs.idae }}")
    lsp = await ClientServerConfig(server_command=_server()).start()
    try:
        await lsp.initialize_session(types.InitializeParams(capabilities=types.ClientCapabilities(
            general=types.GeneralClientCapabilities(position_encodings=[types.PositionEncodingKind.Utf8]))))
        (found,) = await _diagnostics(lsp, _open(lsp, _write(tmp_path, "u.sop.yaml", text)))
        line = text.split("\n")[found.range.start.line]
        assert found.range.start.character == len(line[:line.index("idae")].encode("utf-8"))
        await lsp.shutdown_session()
    finally:
        await lsp.stop()


async def test_other_yaml_files_are_left_alone(client: LanguageClient, tmp_path: Path) -> None:
    text = "services:\n  web: {image: nginx}\n"
    uri = _open(client, _write(tmp_path, "compose.yaml", text))
    assert await _diagnostics(client, uri) == []
    assert await _labels(client, uri, types.Position(line=2, character=0)) == []
    assert await client.text_document_hover_async(types.HoverParams(
        text_document=_doc(uri), position=types.Position(line=0, character=2))) is None


async def test_a_file_that_is_not_yaml_yet_is_located(client: LanguageClient, tmp_path: Path) -> None:
    uri = _open(client, _write(tmp_path, "typing.sop.yaml", SOP + "  Extra: [\n"))
    (found,) = await _diagnostics(client, uri)
    assert found.code == "SOP005" and found.severity == types.DiagnosticSeverity.Error


async def test_quick_fix_applies_the_did_you_mean(client: LanguageClient, tmp_path: Path) -> None:
    text = SOP.replace("instruction: a catchy title", "instructon: a catchy title")
    uri = _open(client, _write(tmp_path, "fix.sop.yaml", text))
    (found,) = await _diagnostics(client, uri)
    assert found.code == "SOP101"
    actions = await client.text_document_code_action_async(types.CodeActionParams(
        text_document=_doc(uri), range=found.range, context=types.CodeActionContext(diagnostics=[found])))
    (fix,) = actions or []
    assert isinstance(fix, types.CodeAction) and fix.kind == types.CodeActionKind.QuickFix
    (edit,) = (fix.edit.changes or {})[uri]
    assert edit.new_text == "instruction" and edit.range == found.range
    lines = text.split("\n")
    line = lines[edit.range.start.line]
    lines[edit.range.start.line] = line[:edit.range.start.character] + edit.new_text + line[edit.range.end.character:]
    _change(client, uri, "\n".join(lines), 2)
    assert await _diagnostics(client, uri) == []


# ---------------------------------------------------------------- includes

LIBRARY = """\
apiVersion: sop/v1
actions:
  Shared:
    prompt: "Say something about {{ inputs.idea }}."
    output:
      Point: {type: str, instructions: one sentence}
"""

MAIN = """\
apiVersion: sop/v1
name: with_library
include: [lib/shared.sop.yaml]
inputs:
  idea: {type: str}
actions:
  Reply:
    prompt: "{{ msgs.Shared[-1].out['Point'] }}"
roles:
  Speaker: {actions: [Shared], watch: [UserRequirement]}
  Listener: {actions: [Reply], watch: [Shared]}
"""


async def test_an_includes_diagnostics_land_in_the_library(client: LanguageClient, tmp_path: Path) -> None:
    library = _write(tmp_path, "lib/shared.sop.yaml", LIBRARY)
    uri = _open(client, _write(tmp_path, "main.sop.yaml", MAIN))
    assert await _diagnostics(client, uri) == []
    (found,) = await _diagnostics(client, library.as_uri())
    assert found.code == "SOP101" and found.range.start == _at(LIBRARY, "instructions")
    assert "did you mean 'instruction'?" in found.message


async def test_saving_a_library_checks_its_includer_again(client: LanguageClient, tmp_path: Path) -> None:
    library = _write(tmp_path, "lib/shared.sop.yaml", LIBRARY)
    uri = _open(client, _write(tmp_path, "main.sop.yaml", MAIN))
    lib_uri = _open(client, library)
    assert [d.code for d in await _diagnostics(client, lib_uri)] == ["SOP101"]
    fixed = LIBRARY.replace("instructions", "instruction")
    library.write_text(fixed, encoding="utf-8")
    _change(client, lib_uri, fixed, 2)
    await asyncio.sleep(0.5)          # past the debounce: what comes next is the save's
    client.diagnostics.pop(uri, None)
    client.diagnostics.pop(lib_uri, None)
    client.text_document_did_save(types.DidSaveTextDocumentParams(text_document=_doc(lib_uri)))
    assert await _diagnostics(client, uri) == []
    assert await _diagnostics(client, lib_uri) == []


async def test_an_open_librarys_unsaved_edits_are_checked_in_its_includer(client: LanguageClient,
                                                                          tmp_path: Path) -> None:
    """A library edited but not saved: the includer is checked against the buffer (an action
    renamed there is unknown in the includer at once), and the library's own problems land
    in the library at the buffer's lines, not the file's; closing it unsaved goes back to
    the file on disk."""
    fixed = LIBRARY.replace("instructions", "instruction")
    library = _write(tmp_path, "lib/shared.sop.yaml", fixed)
    uri = _open(client, _write(tmp_path, "main.sop.yaml", MAIN))
    lib_uri = _open(client, library)
    assert await _diagnostics(client, uri) == []
    assert await _diagnostics(client, lib_uri) == []
    renamed = fixed.replace("  Shared:", "  Sharde:")
    client.diagnostics.pop(uri, None)
    _change(client, lib_uri, renamed, 2)
    found = await _diagnostics(client, uri, until=bool)
    assert found and all("'Shared'" in d.message for d in found)
    starts = sorted((d.range.start.line, d.range.start.character) for d in found)
    assert starts == [(p.line, p.character) for p in (_at(MAIN, "Shared], watch"), _at(MAIN, "Shared]}"))]
    typo = "# notes\n# more notes\n" + fixed.replace("instruction:", "instructon:")
    client.diagnostics.pop(lib_uri, None)   # wait for this change's, not the last ones kept
    _change(client, lib_uri, typo, 3)
    (in_library,) = await _diagnostics(client, lib_uri, )
    assert in_library.code == "SOP101" and in_library.range.start == _at(typo, "instructon")
    assert "did you mean 'instruction'?" in in_library.message
    client.diagnostics.pop(uri, None)
    client.diagnostics.pop(lib_uri, None)
    _change(client, lib_uri, fixed, 4)
    assert await _diagnostics(client, uri, until=_none) == []
    assert await _diagnostics(client, lib_uri, ) == []
    client.diagnostics.pop(uri, None)
    _change(client, lib_uri, renamed, 5)
    assert await _diagnostics(client, uri, until=bool) != []
    client.diagnostics.pop(uri, None)
    client.text_document_did_close(types.DidCloseTextDocumentParams(text_document=_doc(lib_uri)))
    assert await _diagnostics(client, uri, until=_none) == []


async def test_a_library_opened_alone_is_checked_through_its_includer(client: LanguageClient,
                                                                      tmp_path: Path) -> None:
    library = _write(tmp_path, "lib/shared.sop.yaml", LIBRARY)
    _write(tmp_path, "lib/main.sop.yaml", MAIN.replace("lib/shared.sop.yaml", "shared.sop.yaml"))
    (found,) = await _diagnostics(client, _open(client, library))
    assert found.code == "SOP101"     # not "missing required key 'roles'": it is a library


async def test_definition_of_an_include_and_of_a_library_action(client: LanguageClient, tmp_path: Path) -> None:
    library = _write(tmp_path, "lib/shared.sop.yaml", LIBRARY.replace("instructions", "instruction"))
    uri = _open(client, _write(tmp_path, "main.sop.yaml", MAIN))
    await _diagnostics(client, uri)
    (target,) = await client.text_document_definition_async(types.DefinitionParams(
        text_document=_doc(uri), position=_at(MAIN, "lib/shared", 2))) or []
    assert isinstance(target, types.Location) and target.uri == library.as_uri()
    (action,) = await client.text_document_definition_async(types.DefinitionParams(
        text_document=_doc(uri), position=_at(MAIN, "Shared]}", 1))) or []
    assert isinstance(action, types.Location) and action.uri == library.as_uri()
    assert action.range.start == _at(LIBRARY, "Shared:")


# ---------------------------------------------------------------- completion


async def _labels(client: LanguageClient, uri: str, position: types.Position) -> list[str]:
    result = await client.text_document_completion_async(types.CompletionParams(
        text_document=_doc(uri), position=position))
    items = result.items if isinstance(result, types.CompletionList) else result or []
    return [item.label for item in items]


async def test_completion_of_action_ids_in_watch(client: LanguageClient, tmp_path: Path) -> None:
    uri = _open(client, _write(tmp_path, "c.sop.yaml", SOP))
    await _diagnostics(client, uri)
    typing = SOP.replace("watch: [WriteDraft]", "watch: [Wri")
    _change(client, uri, typing, 2)
    labels = await _labels(client, uri, _at(typing, "watch: [Wri", 11))
    assert labels == ["WriteDraft", "Review", "UserRequirement"]


async def test_completion_of_template_variables(client: LanguageClient, tmp_path: Path) -> None:
    uri = _open(client, _write(tmp_path, "t.sop.yaml", SOP))
    await _diagnostics(client, uri)
    assert await _labels(client, uri, _at(SOP, "out['Title']", 5)) == ["Title", "Body"]
    assert await _labels(client, uri, _at(SOP, "inputs.idea", 7)) == ["idea"]
    assert await _labels(client, uri, _at(SOP, "msgs.WriteDraft", 5)) == ["WriteDraft", "Review", "UserRequirement"]
    bare = await _labels(client, uri, _at(SOP, "{{ out }}", 3))
    assert "out" in bare and "msgs" in bare and "inputs" in bare


async def test_key_completion_follows_the_actions_kind(client: LanguageClient, tmp_path: Path) -> None:
    text = SOP.replace("  Review:\n    prompt: |", "  Review:\n    kind: exec\n    \n    prompt: |")
    uri = _open(client, _write(tmp_path, "k.sop.yaml", text))
    await _diagnostics(client, uri)
    labels = await _labels(client, uri, _at(text, "kind: exec\n    ", 15))
    assert "command" in labels and "kind" not in labels and "system" not in labels
    kinds = await _labels(client, uri, _at(text, "kind: exec", 6))
    assert kinds == ["llm", "exec", "ask", "reply", "compute", "tool"]
    types_ = await _labels(client, uri, _at(text, "Title: {type: ", 14))
    assert "list[str]" in types_ and "str" in types_


async def test_completion_of_addresses_and_tools_in_a_file_opened_half_typed(client: LanguageClient,
                                                                              tmp_path: Path) -> None:
    text = SOP.replace("    context: none\n", "    context: none\n    send_to: [\n    tools: [\n")
    text += "mcp:\n  notes: {command: [python, notes.py], tools: [search]}\n"
    uri = _open(client, _write(tmp_path, "a.sop.yaml", text))
    assert [d.code for d in await _diagnostics(client, uri)] == ["SOP005"]
    addresses = await _labels(client, uri, _at(text, "send_to: [", 10))
    assert addresses[:2] == ["Writer", "Reviewer"] and "<all>" in addresses
    tools = await _labels(client, uri, _at(text, "tools: [", 8))
    assert "editor" in tools and "editor.write" in tools and "terminal" in tools
    assert "mcp.notes" in tools and "mcp.notes.search" in tools


async def test_completion_of_names_in_actions_context_send_to_and_role_vars(client: LanguageClient,
                                                                           tmp_path: Path) -> None:
    """Each list that names an action or a role offers them, with the item kinds an editor
    shows as icons; `role.vars.` offers the variables of the roles running the action."""
    text = (SOP.replace("    context: none\n", "    context: [WriteDraft]\n")
            .replace("the article}\n", "the article}\n    send_to: [Rita]\n")
            .replace("{{ inputs.idea }}", "{{ inputs.idea }} in {{ role.vars.tone }}")
            .replace("    watch: [UserRequirement]\n", "    watch: [UserRequirement]\n    vars: {tone: dry}\n")
            .replace("    profile: Editor\n", "    profile: Editor\n    name: Rita\n"))
    uri = _open(client, _write(tmp_path, "n.sop.yaml", text))
    assert await _diagnostics(client, uri) == []

    async def offered(needle: str, offset: int) -> list[tuple[str, types.CompletionItemKind | None]]:
        result = await client.text_document_completion_async(types.CompletionParams(
            text_document=_doc(uri), position=_at(text, needle, offset)))
        items = result.items if isinstance(result, types.CompletionList) else result or []
        return [(item.label, item.kind) for item in items]

    kind = types.CompletionItemKind
    assert await offered("actions: [WriteDraft]", 10) == [("WriteDraft", kind.Function), ("Review", kind.Function)]
    context = await offered("context: [WriteDraft]", 10)
    assert context[:3] == [("WriteDraft", kind.Function), ("Review", kind.Function),
                           ("UserRequirement", kind.Event)]
    assert await offered("send_to: [Rita]", 10) == [
        ("Writer", kind.Class), ("Reviewer", kind.Class), ("Rita", kind.Class),
        ("<all>", kind.Constant), ("<self>", kind.Constant), ("<none>", kind.Constant)]
    assert await offered("role.vars.tone", 10) == [("tone", kind.Variable)]


# ---------------------------------------------------------------- hover, navigation


async def _hover(client: LanguageClient, uri: str, position: types.Position) -> str:
    found = await client.text_document_hover_async(types.HoverParams(text_document=_doc(uri), position=position))
    assert found is not None and isinstance(found.contents, types.MarkupContent)
    return found.contents.value


async def test_hover_on_an_action_a_role_and_a_key(client: LanguageClient, tmp_path: Path) -> None:
    uri = _open(client, _write(tmp_path, "h.sop.yaml", SOP))
    await _diagnostics(client, uri)
    action = await _hover(client, uri, _at(SOP, "watch: [WriteDraft]", 10))
    assert "Write a short article about {{ inputs.idea }}." in action
    assert "`Title`, `Body`" in action
    role = await _hover(client, uri, _at(SOP, "Reviewer:", 2))
    assert "watch: `WriteDraft`" in role and "actions: `Review`" in role
    key = await _hover(client, uri, _at(SOP, "context: none", 2))
    assert "Which observed/remembered messages are shown" in key
    flow = await _hover(client, uri, _at(SOP, "instruction: a catchy", 3))
    assert "What the model must put in this key" in flow
    item = await _hover(client, uri, _at(SOP, 'path: "review.md"', 1))
    assert "Path relative to the workspace" in item


async def test_references_of_an_action_include_its_templates(client: LanguageClient, tmp_path: Path) -> None:
    uri = _open(client, _write(tmp_path, "r.sop.yaml", SOP))
    await _diagnostics(client, uri)
    found = await client.text_document_references_async(types.ReferenceParams(
        text_document=_doc(uri), position=_at(SOP, "WriteDraft:", 3),
        context=types.ReferenceContext(include_declaration=True))) or []
    starts = sorted((loc.range.start.line, loc.range.start.character) for loc in found)
    lines = SOP.split("\n")
    assert [lines[line][col:col + 10] for line, col in starts] == ["WriteDraft"] * 5
    assert len(starts) == 5     # the definition, two templates, actions and watch


async def test_definition_and_references_of_an_output_key(client: LanguageClient, tmp_path: Path) -> None:
    uri = _open(client, _write(tmp_path, "o.sop.yaml", SOP))
    await _diagnostics(client, uri)
    (target,) = await client.text_document_definition_async(types.DefinitionParams(
        text_document=_doc(uri), position=_at(SOP, "Body'] }}", 1))) or []
    assert isinstance(target, types.Location) and target.range.start == _at(SOP, "Body: {")


async def test_hover_and_references_of_an_input_and_an_output_key(client: LanguageClient,
                                                                   tmp_path: Path) -> None:
    uri = _open(client, _write(tmp_path, "io.sop.yaml", SOP))
    await _diagnostics(client, uri)
    idea = await _hover(client, uri, _at(SOP, "inputs.idea", 8))
    assert "**input `idea`** (str, required)" in idea and "what to write about" in idea
    title = await _hover(client, uri, _at(SOP, "Title: {", 1))
    assert "**output `Title`** of `WriteDraft`: `str`" in title and "a catchy title" in title
    for needle, used in (("Title: {", "Title'] }}"), ("idea: {", "idea }}")):
        found = await client.text_document_references_async(types.ReferenceParams(
            text_document=_doc(uri), position=_at(SOP, needle, 1),
            context=types.ReferenceContext(include_declaration=False))) or []
        assert [(loc.uri, loc.range.start) for loc in found] == [(uri, _at(SOP, used))]


async def test_references_of_an_include_file(client: LanguageClient, tmp_path: Path) -> None:
    library = _write(tmp_path, "lib/shared.sop.yaml", LIBRARY.replace("instructions", "instruction"))
    uri = _open(client, _write(tmp_path, "main.sop.yaml", MAIN))
    await _diagnostics(client, uri)
    found = await client.text_document_references_async(types.ReferenceParams(
        text_document=_doc(uri), position=_at(MAIN, "lib/shared", 2),
        context=types.ReferenceContext(include_declaration=True))) or []
    assert [(loc.uri, loc.range.start) for loc in found] == [(uri, _at(MAIN, "lib/shared"))]
    assert library.is_file()


async def test_document_symbols(client: LanguageClient, tmp_path: Path) -> None:
    uri = _open(client, _write(tmp_path, "s.sop.yaml", SOP))
    await _diagnostics(client, uri)
    found = await client.text_document_document_symbol_async(types.DocumentSymbolParams(text_document=_doc(uri)))
    named = [(s.name, s.kind) for s in found or [] if isinstance(s, types.DocumentSymbol)]
    assert named == [("idea", types.SymbolKind.Variable), ("WriteDraft", types.SymbolKind.Function),
                     ("Review", types.SymbolKind.Function), ("Writer", types.SymbolKind.Class),
                     ("Reviewer", types.SymbolKind.Class)]
    draft = next(s for s in found or [] if isinstance(s, types.DocumentSymbol) and s.name == "WriteDraft")
    assert [c.name for c in draft.children or []] == ["Title", "Body"]


# ---------------------------------------------------------------- what it never loads


async def test_the_server_never_imports_litellm(tmp_path: Path) -> None:
    """A whole session (diagnostics, completion, hover) on files with exec actions, tools and
    MCP servers, then the server's own sys.modules: no litellm, no model, no MCP SDK."""
    report = tmp_path / "modules.json"
    probe = ("import atexit, json\n"
             f"atexit.register(lambda: open({str(report)!r}, 'w').write(json.dumps(sorted(sys.modules))))\n")
    config = ClientServerConfig(server_command=_server(probe=probe))
    lsp = await config.start()
    await lsp.initialize_session(types.InitializeParams(capabilities=types.ClientCapabilities()))
    for name in ("researcher.sop.yaml", "software_company_with_tests.sop.yaml", "search_qa.sop.yaml"):
        path = ROOT / "examples" / name
        uri = _open(lsp, path)
        await _diagnostics(lsp, uri)
        await _labels(lsp, uri, types.Position(line=0, character=0))
        await lsp.text_document_hover_async(types.HoverParams(text_document=_doc(uri),
                                                              position=types.Position(line=0, character=1)))
    await lsp.shutdown_session()
    await lsp.stop()
    loaded = json.loads(report.read_text(encoding="utf-8"))
    heavy = [m for m in loaded if m.split(".")[0] in ("litellm", "openai", "httpx", "mcp", "llama_cpp", "playwright")
             or m.startswith(("engine.run", "engine.api", "engine.models.hosted.", "engine.models.local"))]
    assert "engine.lsp.server" in loaded and heavy == []



async def test_checks_wait_until_typing_stops(tmp_path: Path) -> None:
    """With a debounce, a burst of edits is checked once, at its last text: the errors of the
    edits in between are never published."""
    lsp = await ClientServerConfig(server_command=_server("--debounce-ms", "1000")).start()
    try:
        await lsp.initialize_session(types.InitializeParams(capabilities=types.ClientCapabilities()))
        uri = _open(lsp, _write(tmp_path, "burst.sop.yaml", SOP))
        assert await _diagnostics(lsp, uri) == []
        lsp.diagnostics.pop(uri, None)
        for version, typed in enumerate(("i", "id", "ide"), start=2):
            _change(lsp, uri, SOP.replace("{{ inputs.idea }}", "{{ inputs." + typed + " }}"), version)
        _change(lsp, uri, SOP, 5)
        assert await _diagnostics(lsp, uri) == []
        await lsp.shutdown_session()
    finally:
        await lsp.stop()


async def test_related_places_and_enum_hovers(client: LanguageClient, tmp_path: Path) -> None:
    text = SOP.replace("    profile: Editor\n", "    profile: Editor\n    react_mode: by_order\n    profile: Chief\n")
    uri = _open(client, _write(tmp_path, "dup.sop.yaml", text))
    (found,) = await _diagnostics(client, uri)
    assert found.code == "SOP007"
    (first,) = found.related_information or []
    assert first.message == "first defined here" and first.location.range.start == _at(text, "profile: Editor")
    _change(client, uri, text.replace("    profile: Chief\n", ""), 2)
    await _diagnostics(client, uri)
    value = await _hover(client, uri, _at(text, "by_order", 3))
    assert "The actions run in order." in value


async def test_definition_and_references_of_a_role_named_in_send_to(client: LanguageClient,
                                                                     tmp_path: Path) -> None:
    text = SOP.replace("      Body: {type: str, instruction: the article}\n",
                       "      Body: {type: str, instruction: the article}\n    send_to: [Reviewer]\n")
    uri = _open(client, _write(tmp_path, "to.sop.yaml", text))
    assert await _diagnostics(client, uri) == []
    (target,) = await client.text_document_definition_async(types.DefinitionParams(
        text_document=_doc(uri), position=_at(text, "[Reviewer]", 2))) or []
    assert isinstance(target, types.Location) and target.range.start == _at(text, "Reviewer:")
    found = await client.text_document_references_async(types.ReferenceParams(
        text_document=_doc(uri), position=_at(text, "Reviewer:", 1),
        context=types.ReferenceContext(include_declaration=False))) or []
    assert [loc.range.start for loc in found] == [_at(text, "Reviewer]")]


async def test_includes_found_under_an_include_path(tmp_path: Path) -> None:
    """`sopctl lsp --include-path DIR`: a library found only there is checked and navigable."""
    shared = tmp_path / "shared"
    library = _write(shared, "lib/shared.sop.yaml", LIBRARY)
    lsp = await ClientServerConfig(server_command=_server("--include-path", str(shared))).start()
    try:
        await lsp.initialize_session(types.InitializeParams(capabilities=types.ClientCapabilities()))
        uri = _open(lsp, _write(tmp_path, "project/main.sop.yaml", MAIN))
        assert await _diagnostics(lsp, uri) == []
        assert [d.code for d in await _diagnostics(lsp, library.as_uri())] == ["SOP101"]
        (target,) = await lsp.text_document_definition_async(types.DefinitionParams(
            text_document=_doc(uri), position=_at(MAIN, "lib/shared", 2))) or []
        assert isinstance(target, types.Location) and target.uri == library.as_uri()
        await lsp.shutdown_session()
    finally:
        await lsp.stop()
