"""MCP stdio servers that misbehave. One writes lines that are not JSON-RPC (a stray print):
they are ignored, the server's tools still work, and the SDK's traceback for each line does
not flood stderr: one line says what was ignored. Another starts a `setsid` process, which
does not outlive the run."""

from __future__ import annotations

from pathlib import Path

import pytest
from run_helpers import TESTS, run_sop

from engine.compile.compiler import compile_text
from engine.testing import ScriptedModel

pytest.importorskip("mcp")

NOISY = TESTS / "mcp_servers" / "noisy_server.py"


def test_garbage_lines_are_ignored_with_one_line_not_400_tracebacks(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    text = f"""
apiVersion: sop/v1
name: mcp_noise
inputs:
  idea: {{required: true}}
mcp:
  noisy:
    command: [python, {NOISY}]
    tools: [echo]
actions:
  Use:
    prompt: "Use the server for {{{{ inputs.idea }}}}"
    tools: [mcp.noisy]
roles:
  User:
    actions: [Use]
    watch: [UserRequirement]
"""
    compiled = compile_text(text, file=str(NOISY.parent / "noise.sop.yaml"))
    model = ScriptedModel([{"thought": "t", "commands": [{"command_name": "noisy.echo", "args": {"text": "hi"}}]},
                           {"thought": "t", "commands": [{"command_name": "end", "args": {"answer": "done"}}]}])
    result = run_sop(compiled, model, tmp_path / "ws", allow_exec=True)
    assert result.status == "idle", result.error
    assert "echo: hi" in model.prompts()[1]
    sdk = [r for r in caplog.records if r.name.startswith("mcp")]   # what reaches stderr outside pytest
    assert len(sdk) == 1 and sdk[0].exc_info is None
    assert "wrote a line that is not JSON-RPC to its stdout; it is ignored" in sdk[0].getMessage()


SPAWNER = TESTS / "mcp_servers" / "spawner_server.py"


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"    # a zombie is gone too
    except OSError:
        return True


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="Linux: the subreaper")
def test_a_setsid_process_a_server_started_does_not_outlive_the_run(tmp_path: Path) -> None:
    text = f"""
apiVersion: sop/v1
name: mcp_spawn
inputs:
  idea: {{required: true}}
mcp:
  spawner:
    command: [python, {SPAWNER}]
    tools: [spawn]
actions:
  Use:
    prompt: "Use the server for {{{{ inputs.idea }}}}"
    tools: [mcp.spawner.spawn]
roles:
  User:
    actions: [Use]
    watch: [UserRequirement]
"""
    compiled = compile_text(text, file=str(SPAWNER.parent / "spawn.sop.yaml"))
    model = ScriptedModel([{"thought": "t", "commands": [{"command_name": "spawner.spawn", "args": {}}]},
                           {"thought": "t", "commands": [{"command_name": "end", "args": {"answer": "done"}}]}])
    result = run_sop(compiled, model, tmp_path / "ws", allow_exec=True)
    assert result.status == "idle", result.error
    pid = int(model.prompts()[1].split("spawner.spawn: ", 1)[1].split()[0])
    assert _gone(pid)


def test_a_server_that_never_answers_initialize_is_named_after_its_start_timeout(tmp_path: Path) -> None:
    """Not after a fixed two minutes: the file's start_timeout_s bounds starting a server."""
    import sys

    from engine import api
    from engine.compile.compiler import compile_text

    text = f"""
apiVersion: sop/v1
name: mcp_mute
inputs:
  idea: {{required: true}}
mcp:
  mute:
    command: [{sys.executable}, -c, "import sys; sys.stdin.read()"]
    start_timeout_s: 1
actions:
  Use:
    prompt: "Use it for {{{{ inputs.idea }}}}"
    tools: [mcp.mute]
roles:
  User: {{actions: [Use], watch: [UserRequirement]}}
"""
    result = api.run(compile_text(text), {"idea": "x"}, api.RunOptions(model="fake", workspace=tmp_path / "ws",
                                                                       allow_exec=True))
    assert result.status == "failed" and result.llm_calls == 0
    assert "MCP server mute did not start and answer within 1 s (start_timeout_s)" in result.error


BLOATED = TESTS / "mcp_servers" / "bloated_server.py"


def _bloated_sop(count: int, tools: str = "") -> str:
    return f"""
apiVersion: sop/v1
name: mcp_bloat
inputs:
  idea: {{required: true}}
mcp:
  big:
    command: [python, {BLOATED}, "{count}"]{tools}
actions:
  Use:
    prompt: "Use it for {{{{ inputs.idea }}}}"
    tools: [mcp.big]
roles:
  User: {{actions: [Use], watch: [UserRequirement]}}
"""


def test_a_server_offering_too_many_tools_fails_the_start_naming_the_fix(tmp_path: Path) -> None:
    """Every offered tool is described in every prompt: 150 would make each step huge."""
    from engine.run.mcp import MAX_SERVER_TOOLS

    result = run_sop(compile_text(_bloated_sop(150)), ScriptedModel([]), tmp_path / "ws", allow_exec=True)
    assert result.status == "failed" and result.llm_calls == 0
    assert f"MCP server big offers 151 tools, more than the {MAX_SERVER_TOOLS} an action may be shown" in result.error


def test_a_huge_tool_description_is_cut_in_the_prompt(tmp_path: Path) -> None:
    from engine.run.mcp import MAX_TOOL_DESCRIPTION_CHARS

    model = ScriptedModel([{"thought": "t", "commands": [{"command_name": "big.wordy", "args": {"text": "hi"}}]},
                           {"thought": "t", "commands": [{"command_name": "end", "args": {"answer": "done"}}]}])
    result = run_sop(compile_text(_bloated_sop(3)), model, tmp_path / "ws",
                     allow_exec=True)
    assert result.status == "idle", result.error
    first = "\n".join(m["content"] for m in model.requests[0].messages)
    assert f"[description cut at {MAX_TOOL_DESCRIPTION_CHARS:,} characters]" in first
    assert len(first) < 30_000 and "wordy: hi" in model.prompts()[1]
