"""plan_and_act as MetaGPT's Data Interpreter: tasks run by their type, a failed task is
retried with its error shown, and when its retries are spent the plan is updated."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from collections.abc import Callable

import pytest
from run_helpers import TESTS, default_answer, fenced, logs, run_sop, sop, sop_text

from engine.compile.compiler import check_text
from engine.models.types import CallSpec
from engine.testing import ScriptedModel, use_model

GOOD = fenced("print('ok')")
BAD = fenced("import sys\nsys.exit('boom: no such column')")
SOP = TESTS / "sops" / "plan_typed.sop.yaml"


def _task(tid: str, task_type: str, deps: list[str] | None = None) -> dict[str, Any]:
    return {"task_id": tid, "dependent_task_ids": deps or [], "instruction": f"do {tid}",
            "task_type": task_type}


def _script(plans: list[list[dict[str, Any]]], code: list[str] | None = None,
            answers: list[Any] | None = None) -> Callable[[CallSpec, int], Any]:
    """Plans in turn (the last one repeats), code answers in turn (then GOOD), Answer's answers
    in turn (then a valid one)."""
    plans, code, answers = list(plans), list(code or []), list(answers or [])

    def answer(spec: CallSpec, attempt: int) -> Any:
        if spec.action == "WritePlan":
            return {"tasks": plans.pop(0) if len(plans) > 1 else plans[0]}
        if spec.action == "WriteCode":
            return code.pop(0) if code else GOOD
        if spec.action == "Answer" and answers:
            return answers.pop(0)
        return default_answer(spec)
    return answer


def _run(model: ScriptedModel, tmp_path: Path) -> Any:
    return run_sop(sop("plan_typed"), model, tmp_path, allow_exec=True)


def _prompts(model: ScriptedModel, action: str) -> list[str]:
    return [r.spec.prompt for r in model.requests if r.spec.action == action]


def test_each_task_runs_the_actions_of_its_type(tmp_path: Path) -> None:
    model = ScriptedModel(_script([[_task("load", "code"), _task("tell", "answer", ["load"])]]))
    result = _run(model, tmp_path)
    assert result.status == "idle", result.error
    assert model.asked() == ["WritePlan", "WriteCode", "Answer"]
    assert "Write code for task load" in _prompts(model, "WriteCode")[0]
    assert "Answer task tell" in _prompts(model, "Answer")[0]
    assert "Give every task a task_type, one of: code, answer." in _prompts(model, "WritePlan")[0]


def test_a_failing_exec_step_is_retried_with_its_error_shown(tmp_path: Path) -> None:
    model = ScriptedModel(_script([[_task("load", "code")]], code=[BAD, GOOD]))
    result = _run(model, tmp_path)
    assert result.status == "idle", result.error
    first, second = _prompts(model, "WriteCode")
    assert "failed" not in first
    assert "Your previous attempt at this task failed" in second
    assert "exit code: 1" in second and "boom: no such column" in second
    assert any("task load failed (attempt 1 of 2)" in w for w in logs(result, "warning"))


def test_an_answer_that_stays_invalid_is_a_failed_task_retried(tmp_path: Path) -> None:
    model = ScriptedModel(_script([[_task("tell", "answer")]], answers=["not json at all"]))
    result = _run(model, tmp_path)
    assert result.status == "idle", result.error
    assert model.asked() == ["WritePlan", "Answer", "Answer"]
    assert "Your previous attempt at this task failed" in _prompts(model, "Answer")[1]


def test_when_retries_are_spent_the_plan_is_updated(tmp_path: Path) -> None:
    first_plan = [_task("prep", "answer"), _task("load", "code", ["prep"])]
    second_plan = [_task("prep", "answer"), _task("guess", "answer", ["prep"])]
    model = ScriptedModel(_script([first_plan, second_plan], code=[BAD, BAD]))
    result = _run(model, tmp_path)
    assert result.status == "idle", result.error
    assert model.asked() == ["WritePlan", "Answer", "WriteCode", "WriteCode", "WritePlan", "Answer"]
    replan = _prompts(model, "WritePlan")[1]
    assert "Task load (do load) failed 2 time(s)" in replan and "boom: no such column" in replan
    assert "Finished tasks (keep their task_id and instruction to keep their results): prep." in replan
    assert "Answer task guess" in _prompts(model, "Answer")[-1]  # prep, finished, is not run again


def test_when_replans_are_spent_the_run_fails_at_the_planner(tmp_path: Path) -> None:
    model = ScriptedModel(_script([[_task("load", "code")]], code=[BAD] * 10))
    result = _run(model, tmp_path)
    assert result.status == "failed"
    assert "task load still failed after 2 attempt(s) and 1 re-plan(s)" in result.error
    assert "boom: no such column" in result.error  # the last line of the error says why
    assert result.diagnostic.code == "SOP505" and result.diagnostic.pointer == "/roles/Interpreter/planner"
    assert model.asked().count("WriteCode") == 4


def test_a_task_of_an_unknown_type_makes_the_plan_asked_again(tmp_path: Path) -> None:
    free_text = SOP.read_text(encoding="utf-8").replace('"enum[code|answer]"', "str")
    model = ScriptedModel(_script([[_task("a", "dance")], [_task("a", "answer")]]))
    result = run_sop(sop_text(free_text), model, tmp_path, allow_exec=True)
    assert result.status == "idle", result.error
    assert "task a has task_type 'dance'; the task types are code, answer" in _prompts(model, "WritePlan")[1]


def test_a_finished_run_with_retries_resumes_without_a_call(tmp_path: Path) -> None:
    from engine import api

    model = ScriptedModel(_script([[_task("load", "code")]], code=[BAD, GOOD]))
    first = _run(model, tmp_path)
    again = ScriptedModel(lambda spec, attempt: pytest.fail(f"asked {spec.action} again"))
    with use_model(again):
        resumed = api.resume(tmp_path, api.ResumeOptions(allow_exec=True))
    assert resumed.status == first.status == "idle"
    assert resumed.llm_calls == 0 and resumed.history == first.history


def test_a_run_killed_between_retries_resumes_where_it_stopped(tmp_path: Path) -> None:
    from engine import api

    first_plan = [_task("prep", "answer"), _task("load", "code", ["prep"])]
    second_plan = [_task("prep", "answer"), _task("guess", "answer", ["prep"])]
    whole = _run(ScriptedModel(_script([first_plan, second_plan], code=[BAD, BAD])), tmp_path / "whole")
    script, asked = _script([first_plan, second_plan], code=[BAD, BAD]), []

    def killed_at_the_retry(spec: CallSpec, attempt: int) -> Any:
        asked.append(spec.action)
        if asked == ["WritePlan", "Answer", "WriteCode", "WriteCode"]:
            raise KeyboardInterrupt  # the process dies while the retry is asked
        return script(spec, attempt)
    with pytest.raises(KeyboardInterrupt):
        _run(ScriptedModel(killed_at_the_retry), tmp_path / "killed")
    rest = ScriptedModel(_script([second_plan], code=[BAD]))
    with use_model(rest):
        resumed = api.resume(tmp_path / "killed", api.ResumeOptions(allow_exec=True))
    assert rest.asked() == ["WriteCode", "WritePlan", "Answer"]  # nothing done is asked again
    assert resumed.status == whole.status == "idle"
    assert resumed.history == whole.history


# --- the checker ---------------------------------------------------------------------------

TYPED = SOP.read_text(encoding="utf-8")


def _codes(text: str) -> list[tuple[str, str]]:
    return [(d.code, d.pointer) for d in check_text(text).diagnostics]


def test_the_typed_planner_sop_is_clean() -> None:
    assert _codes(TYPED) == []


def test_task_actions_naming_an_unknown_action_is_located() -> None:
    text = TYPED.replace("code: [WriteCode, RunCode]", "code: [WriteCode, RunCod]")
    assert ("SOP205", "/roles/Interpreter/planner/task_actions/code/1") in _codes(text)


def test_a_planner_with_no_task_action_is_refused() -> None:
    text = TYPED.replace("      task_actions: {code: [WriteCode, RunCode], answer: Answer}\n", "")
    assert ("SOP206", "/roles/Interpreter/planner") in _codes(text)


def test_typed_tasks_need_a_task_type_in_the_plan() -> None:
    text = TYPED.replace('          task_type: {type: "enum[code|answer]"}\n', "")
    [(code, pointer)] = _codes(text)
    assert (code, pointer) == ("SOP207", "/actions/WritePlan/output")
    [found] = check_text(text).diagnostics
    assert "task_type: {type: str}" in found.hint     # following the hint fixes the error


def test_a_task_type_enum_may_offer_only_the_planners_types() -> None:
    [found] = check_text(TYPED.replace("enum[code|answer]", "enum[code|dance]")).diagnostics
    assert (found.code, found.pointer) == ("SOP207", "/actions/WritePlan/output")
    assert "task_type offers 'dance', which no entry of `task_actions` runs" in found.message


def test_the_typed_planner_runs_on_fake(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from engine.cli.commands import main

    code = main(["run", str(SOP), "--model", "fake", "--idea", "x", "--allow-exec",
                 "--out", str(tmp_path / "run")])
    assert code == 0, capsys.readouterr().err


def test_task_is_a_variable_of_every_mapped_action_only() -> None:
    text = TYPED.replace('prompt: "Plan the work for: {{ inputs.idea }}"',
                         'prompt: "Plan the work for: {{ task.instruction }}"')
    assert ("SOP402", "/actions/WritePlan/prompt") in _codes(text)


def test_one_task_action_still_works_alone() -> None:
    text = (TESTS / "sops" / "plan.sop.yaml").read_text(encoding="utf-8")
    assert sop_text(text).spec.roles["Planner"].planner.steps_for(None) == ["ExecuteTask"]
