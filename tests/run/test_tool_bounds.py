"""A tool loop against hostile answers and a hostile (shared) workspace: a deeply nested
answer is re-asked, never an internal RecursionError; an `editor.read` of a hard link
planted in the workspace does not show the outside file; an experience file that is a FIFO
fails the action instead of hanging the run."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from run_helpers import EDITOR_WRITER, run_sop, sop_text

from engine import api
from engine.models.answers import MAX_ANSWER_DEPTH
from engine.testing import ScriptedModel

WRITER = EDITOR_WRITER


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


def test_a_steps_outputs_together_are_bounded(tmp_path: Path) -> None:
    """Twenty full reads in one step: each output is cut at MAX_OUTPUT_CHARS, and all of them
    together at MAX_STEP_OUTPUT_CHARS; the ones past it say so instead of being shown."""
    from engine.run.toolloop import MAX_COMMANDS, MAX_STEP_OUTPUT_CHARS

    workspace = tmp_path / "ws"
    workspace.mkdir()
    for i in range(MAX_COMMANDS):
        (workspace / f"f{i}.txt").write_text("\n".join(f"line {n} " + "x" * 60 for n in range(400)))
    reads = [("editor.read", {"path": f"f{i}.txt"}) for i in range(MAX_COMMANDS)]
    model = ScriptedModel([step(*reads), end()])
    result = run_sop(sop_text(WRITER), model, workspace)
    assert result.status == "idle", result.error
    shown = model.prompts()[1].split("## Step 1: what came back", 1)[1]
    assert len(shown) < MAX_STEP_OUTPUT_CHARS + MAX_COMMANDS * 400
    assert shown.count("[output not shown: this step's outputs passed") >= MAX_COMMANDS // 2
    assert "editor.read: " in shown              # the first ones are shown


def test_a_huge_write_is_not_journaled_again_in_its_event(tmp_path: Path) -> None:
    from engine.journal.store import Journal
    from engine.run.tools.base import MAX_OUTPUT_CHARS

    content = "y" * 1_500_000                # past the editor's write limit, within an answer's
    model = ScriptedModel([step(("editor.write", {"path": "big.txt", "content": content})), end()])
    result = run_sop(sop_text(WRITER), model, tmp_path / "ws")
    assert result.status == "idle", result.error
    assert "a file the editor writes is at most" in model.prompts()[1]
    with Journal.open(tmp_path / "ws") as journal:
        called = [e.data for e in journal.events() if e.type == "ToolCalled"]
    assert len(called[0]["args"]["content"]) < MAX_OUTPUT_CHARS + 100
    assert called[0]["args"]["content"].endswith("characters cut]")


def test_a_header_naming_a_secret_is_a_warning_naming_the_host() -> None:
    """As a stdio server's `env` naming a key is: the user sees which key goes to which host."""
    from engine.compile.compiler import check_text

    text = WRITER.replace("tools: [editor]", "tools: [editor, mcp.web, search]") + """
mcp:
  web:
    url: https://mcp.example.com/mcp
    headers: {Authorization: STRIPE_SK, X-Trace: TRACE_ID}
search:
  url: https://search.example.org/search
  headers: {X-API-Key: SEARCH_API_KEY}
"""
    found = [(d.code, d.severity, d.pointer, d.message) for d in check_text(text).diagnostics]
    assert ("SOP223", "warning", "/mcp/web/headers/Authorization",
            "header Authorization sends the user's secret STRIPE_SK to mcp.example.com") in found
    assert ("SOP223", "warning", "/search/headers/X-API-Key",
            "header X-API-Key sends the user's secret SEARCH_API_KEY to search.example.org") in found
    assert not [f for f in found if "X-Trace" in f[2]]


def test_thousands_of_commands_in_one_step_run_at_most_max_commands(tmp_path: Path) -> None:
    """3,000 writes in one step (as the 3,000 plan appends that ran past 180 s): MAX_COMMANDS
    run, the others are named as not run, in one short output, and the next prompt stays small."""
    from engine.run.toolloop import MAX_COMMANDS, MAX_STEP_OUTPUT_CHARS

    writes = [("editor.write", {"path": f"f{i}.txt", "content": "x"}) for i in range(3000)]
    model = ScriptedModel([step(*writes), end()])
    result = run_sop(sop_text(WRITER), model, tmp_path / "ws")
    assert result.status == "idle", result.error
    written = sorted(p.name for p in (tmp_path / "ws").iterdir() if p.suffix == ".txt")
    assert len(written) == MAX_COMMANDS
    later = model.prompts()[1]
    assert f"at most {MAX_COMMANDS} commands run per step" in later
    assert len(later) < 3 * MAX_STEP_OUTPUT_CHARS


def test_a_tool_step_answer_past_the_answer_limit_is_re_asked(tmp_path: Path) -> None:
    """A 3 MB step (one huge write) is past --max-answer-chars here: cut, journaled cut, and
    re-asked with the limit named; the run goes on."""
    huge = step(("editor.write", {"path": "big.txt", "content": "z" * 3_000_000}))
    model = ScriptedModel([huge, end("small")])
    result = run_sop(sop_text(WRITER), model, tmp_path / "ws", max_answer_chars=100_000)
    assert result.status == "idle", result.error
    assert "longer than the 100,000 characters an answer may have" in model.prompts()[1]
    assert not (tmp_path / "ws" / "big.txt").exists()


def _with_experience(tmp_path: Path, make: Any) -> Any:
    (tmp_path / "exp").mkdir(exist_ok=True)
    make(tmp_path / "exp" / "write.md")
    sop = tmp_path / "w.sop.yaml"
    sop.write_text(WRITER.replace("    max_steps: 4\n", "    max_steps: 4\n    experience: [exp/write.md]\n"))
    return run_sop(api.load(sop), ScriptedModel([end()]), tmp_path / "ws")


def test_more_experience_files_that_are_refused(tmp_path: Path) -> None:
    """More of the class (issue 26): a symlink out of the folder, a hard link to an outside
    file, one past the limit, /dev/zero, not UTF-8: each fails the action, naming the file,
    and no model sees its text."""
    from engine.load.catalog import MAX_EXPERIENCE_BYTES

    outside = tmp_path / "private.txt"
    outside.write_text("the user's private notes")
    cases = {
        "symlink out": (lambda p: p.symlink_to(outside), "leaves the SOP's folder through a symlink"),
        "hard link": (lambda p: os.link(outside, p), "hard links"),
        "too large": (lambda p: p.write_bytes(b"x" * (MAX_EXPERIENCE_BYTES + 1)),
                      f"larger than {MAX_EXPERIENCE_BYTES:,} bytes"),
        "a device": (lambda p: p.symlink_to("/dev/zero"), "symlink"),
        "not UTF-8": (lambda p: p.write_bytes(b"caf\xe9"), "not UTF-8 text"),
    }
    for name, (make, words) in cases.items():
        folder = tmp_path / name.replace(" ", "_")
        folder.mkdir()
        result = _with_experience(folder, make)
        assert result.status == "failed", name
        assert "experience file 'exp/write.md'" in result.error and words in result.error, (name, result.error)
