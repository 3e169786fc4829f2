"""A run that ends having done nothing useful says why: a fan-out over no items, a tool loop
whose every command failed, and no file written though the file's actions were meant to
write some. (A context that can never be filled is the checker's: SOP408.)"""

from __future__ import annotations

from pathlib import Path

from run_helpers import logs, run_sop, sop_text

from engine.testing import ScriptedModel

FAN_OUT = """
apiVersion: sop/v1
name: fan_out
actions:
  List:
    prompt: "List topics for {{ inputs.idea }}"
    output: {Topics: {type: "list[str]"}}
  Write:
    prompt: "Write about {{ topic }}"
    context: none
    for_each: "msgs.List[-1].out.Topics"
    as: topic
    artifacts: [{path: "notes/{{ index }}.md", content: "{{ out }}"}]
roles:
  Lister: {actions: [List], watch: [UserRequirement]}
  Writer: {actions: [Write], watch: [List]}
inputs:
  idea: {required: true}
"""


def test_a_fan_out_over_no_items_says_nothing_ran(tmp_path: Path) -> None:
    result = run_sop(sop_text(FAN_OUT), ScriptedModel([{"Topics": []}]), tmp_path / "ws")
    assert result.status == "idle", result.error
    assert any("for_each gave no items (msgs.List[-1].out.Topics): nothing ran" in line
               for line in logs(result, "warning"))
    assert any("the run ended with no files written, though Write can write them: every role ran"
               in line for line in logs(result, "notice"))


LOOP = """
apiVersion: sop/v1
name: loop
actions:
  Edit: {prompt: "Fix {{ inputs.idea }}", tools: [editor]}
roles:
  Engineer: {actions: [Edit], watch: [UserRequirement]}
inputs:
  idea: {required: true}
"""


def step(*commands: tuple[str, dict]) -> dict:
    return {"thought": "t", "commands": [{"command_name": n, "args": a} for n, a in commands]}


def test_a_tool_loop_whose_every_command_failed_is_warned_about(tmp_path: Path) -> None:
    model = ScriptedModel([step(("editor.read", {"path": "missing.py"})), step(("editor.read", {"path": "gone.py"})),
                           step(("end", {"answer": "fixed"}))])
    result = run_sop(sop_text(LOOP), model, tmp_path / "ws")
    assert result.status == "idle", result.error
    assert "every command it ran failed (2 of 2): its output rests on no tool result" in logs(result, "warning")


def test_a_loop_with_one_good_command_is_not_warned_about(tmp_path: Path) -> None:
    model = ScriptedModel([step(("editor.read", {"path": "missing.py"})),
                           step(("editor.write", {"path": "a.py", "content": "x = 1\n"})),
                           step(("end", {"answer": "fixed"}))])
    result = run_sop(sop_text(LOOP), model, tmp_path / "ws")
    assert result.status == "idle", result.error
    assert not any("every command" in line for line in logs(result, "warning"))
    assert not logs(result, "notice")              # a file was written


def test_roles_no_message_reached_are_named_when_nothing_was_written(tmp_path: Path) -> None:
    text = FAN_OUT.replace("    output: {Topics:", "    send_to: [\"<none>\"]\n    output: {Topics:")
    result = run_sop(sop_text(text), ScriptedModel([{"Topics": ["a"]}]), tmp_path / "ws")
    assert result.status == "idle", result.error
    assert ("the run ended with no files written, though Write can write them: Writer never ran: "
            "no message reached them") in logs(result, "notice")


LED = """
apiVersion: sop/v1
name: led
team: {leader: Mike}
actions:
  Assign: {prompt: "Plan {{ inputs.idea }}", tools: [team], output: text, send_to: ["<none>"]}
  Write: {prompt: "Write {{ inputs.idea }}", tools: [editor]}
roles:
  Lead: {name: Mike, actions: [Assign], watch: [UserRequirement]}
  Writer: {actions: [Write], watch: [Assign]}
inputs:
  idea: {required: true}
"""


def test_a_leader_who_assigned_no_task_is_named(tmp_path: Path) -> None:
    """MGX's members wake only for the leader's tasks: a leader who answers the request
    himself (a small model's quick answer) and ends leaves a team that never ran."""
    result = run_sop(sop_text(LED), ScriptedModel([step(("end", {"answer": "done myself"}))]), tmp_path / "ws")
    assert result.status == "idle", result.error
    assert ("Writer never ran: no message reached them (the team leader, Lead, assigned no task)"
            in " ".join(logs(result, "notice")))
