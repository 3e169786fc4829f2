"""An MCP stdio server that writes lines that are not JSON-RPC (a print left in, a banner):
they are ignored, the server's tools still work, and the SDK's traceback for each line does
not flood stderr: one line says what was ignored."""

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
