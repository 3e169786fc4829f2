"""`when`: an action runs only when its condition holds, so a loop can end on a result."""

from __future__ import annotations

import json

from engine.api import run
from engine.compile.compiler import compile_text
from engine.testing import ScriptedModel, use_model

LOOP = """
apiVersion: sop/v1
name: fix_until_green
inputs:
  idea: {type: str, required: true}
actions:
  Work:
    prompt: "{{ inputs.idea }}"
    context: none
    max_runs: 5
    output:
      done: {type: bool, instruction: true when the work passes}
  Review:
    when: "{{ not msgs.Work[-1].out['done'] }}"
    prompt: "review it"
    context: none
    max_runs: 5
roles:
  Worker: {actions: [Work], watch: [UserRequirement, Review]}
  Reviewer: {actions: [Review], watch: [Work]}
"""


def _work_answers(done_on: int) -> ScriptedModel:
    """Work says done on its `done_on`-th run; Review answers text."""
    runs = {"Work": 0}

    def answer(spec, attempt):
        if spec.action == "Work":
            runs["Work"] += 1
            return json.dumps({"done": runs["Work"] >= done_on})
        return "please fix it"

    return ScriptedModel(answer)


def _causes(result) -> list[str]:
    return [m.cause_by for m in result.messages]


def test_a_true_result_ends_the_loop_before_max_runs(tmp_path):
    # Work asks the same request each time; a journaled run would reuse its first answer (a
    # paid call is never repeated), so this scripted model's change of mind needs no journal.
    with use_model(_work_answers(done_on=2)):
        result = run(compile_text(LOOP), {"idea": "x"}, model="fake", workspace=tmp_path / "ws",
                     journal=False)
    assert result.status == "idle"
    assert _causes(result) == ["UserRequirement", "Work", "Review", "Work"]


def test_without_a_true_result_max_runs_still_bounds_the_loop(tmp_path):
    with use_model(_work_answers(done_on=99)):
        result = run(compile_text(LOOP), {"idea": "x"}, model="fake", workspace=tmp_path / "ws")
    assert _causes(result).count("Work") == 5
    assert result.status == "idle"


def test_a_failing_condition_fails_the_action_by_name(tmp_path):
    bad = LOOP.replace("not msgs.Work[-1].out['done']", "msgs.Work[7].out['done']")
    with use_model(_work_answers(done_on=2)):
        result = run(compile_text(bad), {"idea": "x"}, model="fake", workspace=tmp_path / "ws")
    assert result.status == "failed"
    assert "Review" in result.error and "when" in result.error


def test_the_checker_reads_when_like_any_template():
    import pytest

    from engine.errors import CompileError

    with pytest.raises(CompileError) as info:
        compile_text(LOOP.replace("msgs.Work[-1].out['done']", "msgs.Work[-1].out['dnoe']"))
    assert any("dnoe" in d.message and d.pointer == "/actions/Review/when"
               for d in info.value.diagnostics)


def test_a_sandbox_refusal_in_when_or_for_each_is_a_located_run_error(tmp_path):
    """An unsafe attribute comes back from the sandbox as an undefined value, which raised
    only when used: the refusal is the action's located SOP504, not an internal error."""
    refused = "access to attribute '__class__' of 'str' object is unsafe"
    fan_out = LOOP.replace('    prompt: "review it"', '    for_each: "{{ X }}"\n    prompt: "review it"')
    cases = [(LOOP.replace("not msgs.Work[-1].out['done']", "inputs.idea.__class__"), "when"),
             (LOOP.replace("not msgs.Work[-1].out['done']", "''.__class__.__mro__"), "when"),
             (fan_out.replace("{{ X }}", "{{ inputs.idea.__class__ }}"), "for_each")]
    for index, (text, field) in enumerate(cases):
        with use_model(_work_answers(done_on=2)):
            result = run(compile_text(text), {"idea": "x"}, model="fake",
                         workspace=tmp_path / f"ws{index}", journal=False)
        assert result.status == "failed", field
        assert refused in result.error and "internal error" not in result.error, result.error
        diagnostic = result.diagnostic
        assert diagnostic is not None and diagnostic.code == "SOP504"
        assert diagnostic.pointer == f"/actions/Review/{field}"
