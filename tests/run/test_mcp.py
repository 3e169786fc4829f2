"""MCP servers through the official SDK: tools discovered at start and offered namespaced,
errors and timeouts back to the model, a dead server ends the run naming it, resumable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from run_helpers import ROOT, TESTS, run_sop

from engine import api
from engine.compile.compiler import compile_text
from engine.models.types import CallSpec
from engine.run.events import ToolCalled
from engine.testing import ScriptedModel, use_model

pytest.importorskip("mcp")

SERVER = TESTS / "mcp_servers" / "flaky_server.py"


def flaky_sop(tools: str = "[mcp.flaky]", declared: str = "[echo, slow, die]") -> Any:
    text = f"""
apiVersion: sop/v1
name: mcp_test
inputs:
  idea: {{required: true}}
mcp:
  flaky:
    command: [python, {SERVER}]
    tools: {declared}
    call_timeout_s: 2
actions:
  Use:
    prompt: "Use the server for {{{{ inputs.idea }}}}"
    tools: {tools}
roles:
  User:
    actions: [Use]
    watch: [UserRequirement]
"""
    return compile_text(text, file=str(SERVER.parent / "mcp_test.sop.yaml"))


def step(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"thought": "next", "commands": [{"command_name": name, "args": args}]}


def done() -> dict[str, Any]:
    return step("end", {"answer": "done"})


def test_tools_are_discovered_namespaced_and_called(tmp_path: Path) -> None:
    model = ScriptedModel([step("flaky.echo", {"text": "hi"}), step("flaky.echo", {"txt": "hi"}),
                           step("flaky.slow", {"seconds": 10}), done()])
    result = run_sop(flaky_sop(), model, tmp_path / "ws", allow_exec=True)
    assert result.status == "idle", result.error
    names = [n for n, _ in model.requests[0].spec.commands]
    assert names == ["flaky.echo", "flaky.slow", "flaky.die", "end"]
    prompts = model.prompts()
    assert "flaky.echo: echo: hi" in prompts[1]
    assert "flaky.echo failed: the arguments do not match" in prompts[2]
    assert "flaky.slow failed: flaky.slow timed out after 2 s" in prompts[3]


def test_only_a_tool_that_says_it_reads_runs_beside_its_neighbours() -> None:
    """MCP's annotations: readOnlyHint runs concurrently with neighbouring reads; a tool with
    none, or destructive, runs alone and in order (a create + write + move in one step failed
    when every MCP tool ran at once); the model is told which may delete or overwrite."""
    import asyncio

    from engine.run.mcp import McpServers

    async def listed() -> dict[str, Any]:
        servers = McpServers(flaky_sop())
        await servers.start()
        try:
            return {tool.name: tool for tool in servers.tools("flaky")}
        finally:
            await servers.close()

    tools = asyncio.run(listed())
    assert {name: tool.readonly for name, tool in tools.items()} == {
        "flaky.echo": True, "flaky.slow": False, "flaky.die": False}
    assert tools["flaky.die"].description.endswith("[may delete or overwrite]")
    assert "[may" not in tools["flaky.slow"].description     # no annotations: nothing claimed


def test_one_tool_of_a_server(tmp_path: Path) -> None:
    model = ScriptedModel([done()])
    run_sop(flaky_sop("[mcp.flaky.echo]"), model, tmp_path / "ws", allow_exec=True)
    assert [n for n, _ in model.requests[0].spec.commands] == ["flaky.echo", "end"]


def test_a_server_that_dies_mid_run_fails_the_run_naming_it(tmp_path: Path) -> None:
    model = ScriptedModel([step("flaky.echo", {"text": "hi"}), step("flaky.die", {}), done()])
    result = run_sop(flaky_sop(), model, tmp_path / "ws", allow_exec=True)
    assert result.status == "failed"
    assert "MCP server flaky failed during flaky.die" in result.error


def test_a_tool_the_server_does_not_offer_fails_before_any_model_call(tmp_path: Path) -> None:
    model = ScriptedModel([done()])
    result = run_sop(flaky_sop(declared="[echo, search]"), model, tmp_path / "ws", allow_exec=True)
    assert result.status == "failed"
    assert "MCP server flaky does not offer search" in result.error
    assert model.calls == 0


def test_a_server_that_cannot_start_is_named(tmp_path: Path) -> None:
    sop = compile_text(flaky_sop().source.text.replace(str(SERVER), "no_such_server.py"),
                       file=str(SERVER.parent / "x.sop.yaml"))
    model = ScriptedModel([done()])
    result = run_sop(sop, model, tmp_path / "ws", allow_exec=True)
    assert result.status == "failed" and "MCP server flaky could not start" in result.error
    assert model.calls == 0


def test_the_researcher_finds_notes_and_fans_out_over_them(tmp_path: Path) -> None:
    def answer(spec: CallSpec, attempt: int) -> Any:
        if spec.action == "FindNotes":
            if spec.tool_step == 0:
                return step("notes.search", {"query": "quantization"})
            return step("end", {"Notes": ["quantization.md", "small_models.md"]})
        if spec.tool_step == 0:
            note = "quantization.md" if "quantization.md" in spec.prompt.split("Read the note")[1][:40] \
                else "small_models.md"
            return step("notes.read", {"name": note})
        return step("end", {"answer": "summary of " + spec.prompt.split("Read the note ")[1].split()[0]})

    model = ScriptedModel(answer)
    result = run_sop(api.load(ROOT / "examples" / "researcher.sop.yaml"), model, tmp_path / "ws",
                     allow_exec=True)
    assert result.status == "idle", result.error
    found = [e for e in result.events if isinstance(e, ToolCalled)]
    assert found[0].tool == "notes.search" and found[0].output.startswith("quantization.md: # Quantization")
    assert sorted(e.args["name"] for e in found[1:]) == ["quantization.md", "small_models.md"]
    assert all("GGUF" in e.output or "laptop" in e.output for e in found[1:])
    report = (tmp_path / "ws" / "report.md").read_text()
    assert report == "summary of quantization.md\n\nsummary of small_models.md"


def test_the_failed_runs_journal_is_resumable(tmp_path: Path) -> None:
    from engine.journal.history import read_run
    from engine.testing import use_model

    path = tmp_path / "mcp_test.sop.yaml"
    path.write_text(flaky_sop().source.text)
    model = ScriptedModel([step("flaky.echo", {"text": "hi"}), step("flaky.die", {}), done()])
    with use_model(model):
        result = api.run(api.load(path), {"idea": "x"}, api.RunOptions(workspace=tmp_path / "ws", allow_exec=True))
    assert result.status == "failed"
    state = read_run(tmp_path / "ws")
    assert state.status == "failed" and "MCP server flaky" in state.error
    again = ScriptedModel([done()])
    with use_model(again):   # every answer so far comes from the journal, echo's result too
        resumed = api.resume(tmp_path / "ws", api.ResumeOptions(allow_exec=True))
    assert resumed.status == "failed" and "MCP server flaky failed during flaky.die" in resumed.error
    assert again.calls == 0


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for_port(port: int, proc: Any) -> None:
    import socket
    import time

    for _ in range(600):
        if proc.poll() is not None:
            raise AssertionError(f"the HTTP server exited with {proc.returncode}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError("the HTTP server did not start")


def test_a_streamable_http_server_on_an_allowed_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess
    import sys

    port = _free_port()
    proc = subprocess.Popen([sys.executable, str(SERVER), str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        _wait_for_port(port, proc)
        text = flaky_sop().source.text.replace(f"command: [python, {SERVER}]",
                                               f"url: http://127.0.0.1:{port}/mcp\n    headers: {{X-Token: FLAKY_TOKEN}}")
        sop = compile_text(text)
        model = ScriptedModel([step("flaky.echo", {"text": "over http"}), done()])
        monkeypatch.delenv("FLAKY_TOKEN", raising=False)
        missing = run_sop(sop, model, tmp_path / "ws0", allow_hosts=["127.0.0.1"])
        assert missing.status == "failed" and "FLAKY_TOKEN, which is not set" in missing.error
        monkeypatch.setenv("FLAKY_TOKEN", "secret-value")
        result = run_sop(sop, model, tmp_path / "ws", allow_hosts=["127.0.0.1"])
        assert result.status == "idle", result.error
        assert "flaky.echo: echo: over http" in model.prompts()[1]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# ----------------------------------------------------------------------------- replay without servers


def _recorded_run(tmp_path: Path) -> Path:
    """A finished run that called the stdio server (echo), its file on disk."""
    path = tmp_path / "mcp_test.sop.yaml"
    path.write_text(flaky_sop().source.text)
    model = ScriptedModel([step("flaky.echo", {"text": "hi"}), done()])
    with use_model(model):
        result = api.run(api.load(path), {"idea": "x"}, api.RunOptions(workspace=tmp_path / "ws", allow_exec=True))
    assert result.status == "idle", result.error
    return tmp_path / "ws"


def _no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay that starts a server fails the test."""
    from engine.run.mcp import McpServers

    async def refuse(self: Any, name: str, spec: Any) -> Any:
        raise AssertionError(f"a replay started MCP server {name}")

    monkeypatch.setattr(McpServers, "_connect", refuse)


def test_a_replay_needs_no_allow_exec_and_starts_no_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tool lists the run saw are journaled: the replay offers the same tools (so the same
    prompts, so every answer is found) and serves the calls from the journal."""
    ws = _recorded_run(tmp_path)
    _no_server(monkeypatch)
    with use_model(ScriptedModel([])):   # the run's provider (so its prompts), asked nothing
        replayed = api.replay(ws, tmp_path / "again")          # no allow_exec
        again = api.replay(tmp_path / "again", tmp_path / "third")   # the replay's journal replays too
    assert not replayed.diverged and replayed.result.status == "idle", replayed.result.error
    from engine.journal.store import Journal

    with Journal.open(tmp_path / "again") as journal:
        calls = [e.data for e in journal.events() if e.type == "ToolCalled"]
    assert [(c["tool"], c["output"], c["reused"]) for c in calls] == [("flaky.echo", "echo: hi", True)]
    assert not again.diverged and again.result.status == "idle", again.result.error


def test_sopctl_replay_of_an_mcp_run_without_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from run_helpers import sopctl_in_process

    ws = _recorded_run(tmp_path)
    _no_server(monkeypatch)
    with use_model(ScriptedModel([])):
        code, out, err = sopctl_in_process(capsys, "replay", str(ws), "--out", str(tmp_path / "again"))
    assert code == 0, err
    assert "--allow-exec" not in err


def test_a_journal_without_tool_lists_needs_the_flags_as_before(tmp_path: Path) -> None:
    """A run recorded before tool lists were journaled: its replay starts the server, so it
    needs --allow-exec, and says why."""
    import sqlite3

    from engine.journal.run_folder import journal_path
    from engine.run.mcp import tools_key

    ws = _recorded_run(tmp_path)
    with sqlite3.connect(journal_path(ws)) as db:
        assert db.execute("DELETE FROM answers WHERE request_hash = ?", (tools_key("flaky"),)).rowcount == 1
    with use_model(ScriptedModel([])):
        refused = api.replay(ws, tmp_path / "again")
        replayed = api.replay(ws, tmp_path / "third", api.ReplayOptions(allow_exec=True))
    assert refused.result.status == "failed"
    assert "no tool list of MCP server flaky" in refused.result.error and "--allow-exec" in refused.result.error
    assert not replayed.diverged and replayed.result.status == "idle", replayed.result.error
