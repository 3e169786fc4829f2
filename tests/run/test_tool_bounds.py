"""A tool loop against hostile answers and a hostile (shared) workspace: a deeply nested
answer is re-asked, never an internal RecursionError; an `editor.read` of a hard link
planted in the workspace does not show the outside file; an experience file that is a FIFO
fails the action instead of hanging the run."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from run_helpers import run_sop, sop_text

from engine import api
from engine.models.answers import MAX_ANSWER_DEPTH
from engine.testing import ScriptedModel

WRITER = """
apiVersion: sop/v1
name: tools_bounds
inputs:
  idea: {required: true}
actions:
  Write:
    prompt: "Write about {{ inputs.idea }}"
    tools: [editor]
    max_steps: 4
    output:
      Summary: {type: str}
roles:
  Writer:
    actions: [Write]
    watch: [UserRequirement]
"""


def step(*commands: tuple[str, dict[str, Any]]) -> str:
    return json.dumps({"thought": "next", "commands": [{"command_name": n, "args": a} for n, a in commands]})


def end(summary: str = "done") -> str:
    return step(("end", {"Summary": summary}))


def test_a_deeply_nested_answer_is_re_asked(tmp_path: Path) -> None:
    deep = "[" * 100_000 + "]" * 100_000                       # past the C decoder's own depth
    nested = json.dumps({"thought": "x", "commands": [{"command_name": "end", "args": {
        "Summary": json.loads("[" * (MAX_ANSWER_DEPTH + 5) + "]" * (MAX_ANSWER_DEPTH + 5))}}]})
    model = ScriptedModel([deep, nested, end("fine")])
    result = run_sop(sop_text(WRITER), model, tmp_path / "ws")
    assert result.status == "idle", result.error
    assert result.messages[-1].out == {"Summary": "fine"}
    assert f"nests deeper than {MAX_ANSWER_DEPTH} levels" in model.prompts()[1]


def test_editor_read_of_a_planted_hard_link_does_not_show_the_outside_file(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("the user's private notes\n", encoding="utf-8")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    os.link(outside, workspace / "notes.txt")
    model = ScriptedModel([step(("editor.read", {"path": "notes.txt"})),
                           step(("editor.search", {"term": "private"})), end()])
    result = run_sop(sop_text(WRITER), model, workspace)
    assert result.status == "idle", result.error
    later = "\n".join(model.prompts()[1:])
    assert "private notes" not in later
    assert "cannot read notes.txt: it has 2 hard links" in model.prompts()[1]


def test_an_experience_file_that_is_a_fifo_fails_the_action_without_hanging(tmp_path: Path) -> None:
    (tmp_path / "exp").mkdir()
    os.mkfifo(tmp_path / "exp" / "write.md")
    sop = tmp_path / "w.sop.yaml"
    sop.write_text(WRITER.replace("    max_steps: 4\n", "    max_steps: 4\n    experience: [exp/write.md]\n"))
    result = run_sop(api.load(sop), ScriptedModel([end()]), tmp_path / "ws")
    assert result.status == "failed"
    assert "cannot read experience file 'exp/write.md': not a regular file" in result.error
