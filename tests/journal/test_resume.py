"""`sopctl resume` and `sopctl replay`, in-process, with a model that counts its calls
(a ScriptedModel that answers as `fake` does)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any
from collections.abc import Iterator

import pytest
from run_helpers import TESTS, ForkedSopctl

from engine.cli.commands import main
from engine.errors import LLMError
from engine.journal.history import read_run
from engine.journal.store import Journal
from engine.models.fake import answer_text
from engine.models.types import CallSpec
from engine.testing import ScriptedModel, use_model

SOP = TESTS / "sops" / "journal_small.sop.yaml"


def fake_answers(spec: CallSpec, attempt: int) -> str:
    """`fake`'s answers (its requests hash alike: no schema support, same text), so a
    ScriptedModel counts the calls a test may not repeat, at the price the test sets."""
    return answer_text(spec)


@pytest.fixture()
def model(monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptedModel]:
    monkeypatch.delenv("SOPCTL_MODEL", raising=False)
    monkeypatch.delenv("SOPCTL_CRASH_AFTER_EVENT", raising=False)
    monkeypatch.delenv("SOPCTL_CRASH_AFTER_ANSWER", raising=False)
    counting = ScriptedModel(fake_answers)
    with use_model(counting, name="counting"):
        yield counting


def sopctl(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any], str]:
    """Run the CLI in-process; (exit code, the JSON result or {}, stderr)."""
    code = main(list(args))
    out, err = capsys.readouterr()
    try:
        return code, json.loads(out), err
    except json.JSONDecodeError:
        return code, {}, err


def run(capsys: pytest.CaptureFixture[str], ws: Path, *extra: str,
        sop: Path = SOP) -> tuple[int, dict[str, Any], str]:
    return sopctl(capsys, "run", str(sop), "--idea", "a snake game", "--model", "counting",
                  "--out", str(ws), "--format", "json", *extra)


def artifact_files(ws: Path) -> dict[str, bytes]:
    return {p.relative_to(ws).as_posix(): p.read_bytes() for p in ws.rglob("*")
            if p.is_file() and ".sopctl" not in p.parts}


def test_resume_after_max_rounds_continues_without_repaying(
        model: ScriptedModel, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, full, _ = run(capsys, tmp_path / "full")
    assert code == 0 and full["status"] == "idle"
    paid_full = model.calls
    code, first, _ = run(capsys, tmp_path / "short", "--rounds", "1")
    assert code == 0 and first["status"] == "max_rounds"
    paid_first = model.calls - paid_full
    code, resumed, err = sopctl(capsys, "resume", str(tmp_path / "short"), "--rounds", "5",
                                "--format", "json")
    assert code == 0, err
    assert resumed["status"] == "idle" and resumed["history"] == full["history"]
    assert resumed["llm_calls"] == paid_full - paid_first == model.calls - paid_full - paid_first
    assert resumed["artifacts"] == full["artifacts"]
    assert artifact_files(tmp_path / "short") == artifact_files(tmp_path / "full")
    state = read_run(tmp_path / "short")
    assert state.invocations == 2 and state.usage.llm_calls == paid_full
    assert set(state.completions.values()) == {1}


def test_resume_after_budget_with_a_raised_budget(
        model: ScriptedModel, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model.cost_per_call = 0.01
    ws = tmp_path / "run"
    code, first, _ = run(capsys, ws, "--budget", "0.025")
    assert code == 1 and first["status"] == "budget"
    paid = model.calls
    code, again, _ = sopctl(capsys, "resume", str(ws), "--format", "json")
    assert code == 1 and again["status"] == "budget"            # same budget: still spent
    code, resumed, err = sopctl(capsys, "resume", str(ws), "--budget", "1", "--format", "json")
    assert code == 0 and resumed["status"] == "idle", err
    state = read_run(ws)
    assert state.usage.llm_calls == model.calls and model.calls > paid
    assert state.usage.cost_usd == pytest.approx(0.01 * model.calls)   # no answer paid twice
    assert len(state.history) == 5


def test_resume_reuses_answers_of_an_unfinished_action(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        forked_sopctl: ForkedSopctl) -> None:
    """A real process dies right after its 3rd answer is journaled, before the action ends:
    the resume re-runs that action with the journaled answer and pays only for the rest."""
    monkeypatch.delenv("SOPCTL_MODEL", raising=False)
    args = ["run", str(SOP), "--idea", "a snake game", "--model", "fake", "--format", "json"]
    full = forked_sopctl(*args, "--out", str(tmp_path / "full"))
    total = read_run(tmp_path / "full").usage.llm_calls
    crashed = forked_sopctl(*args, "--out", str(tmp_path / "run"),
                            env={"SOPCTL_CRASH_AFTER_ANSWER": "3"})
    assert crashed.returncode == 137
    counting = ScriptedModel(fake_answers)
    with use_model(counting):                     # every call this process makes lands here
        code, resumed, err = sopctl(capsys, "resume", str(tmp_path / "run"), "--format", "json")
    assert code == 0, err
    assert resumed["reused_calls"] == 1 and counting.calls == total - 3 == resumed["llm_calls"]
    assert resumed["history"] == json.loads(full.stdout)["history"]


def test_resume_rewrites_only_missing_or_changed_artifacts(
        model: ScriptedModel, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ws = tmp_path / "run"
    run(capsys, ws)
    before = artifact_files(ws)
    paid = model.calls
    (ws / "docs" / "brief.md").unlink()
    (ws / "src" / "main.py").write_text("edited by hand\n")
    untouched = (ws / "docs" / "prd.json").stat()
    code, resumed, err = sopctl(capsys, "resume", str(ws), "--format", "json")
    assert code == 0, err
    assert artifact_files(ws) == before
    assert (ws / "docs" / "prd.json").stat().st_mtime_ns == untouched.st_mtime_ns
    assert (ws / "docs" / "prd.json").stat().st_ino == untouched.st_ino
    assert model.calls == paid and resumed["llm_calls"] == 0   # re-run from journaled answers
    assert resumed["reused_calls"] >= 2


def test_replay_calls_no_model_and_gives_the_same_run(
        model: ScriptedModel, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, original, _ = run(capsys, tmp_path / "run")
    paid = model.calls
    code, replayed, err = sopctl(capsys, "replay", str(tmp_path / "run"), "--out",
                                 str(tmp_path / "replay"), "--format", "json")
    assert code == 0, err
    assert model.calls == paid                                  # no model called
    assert replayed["llm_calls"] == 0 and replayed["cost_usd"] == 0
    assert replayed["reused_calls"] == paid
    assert replayed["history"] == original["history"]
    assert artifact_files(tmp_path / "replay") == artifact_files(tmp_path / "run")
    state = read_run(tmp_path / "replay")                      # its own, complete journal
    assert state.status == "idle" and state.journaled_calls == paid and state.usage.llm_calls == 0
    code, again, err = sopctl(capsys, "replay", str(tmp_path / "replay"), "--out",
                              str(tmp_path / "replay2"), "--format", "json")
    assert code == 0 and again["history"] == original["history"], err


def test_replay_of_a_changed_sop_diverges_clearly(
        model: ScriptedModel, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sop = tmp_path / "my.sop.yaml"
    shutil.copy(SOP, sop)
    run(capsys, tmp_path / "run", sop=sop)
    paid = model.calls
    sop.write_text(SOP.read_text().replace("Design {{ inputs.idea }}.",
                                           "Design {{ inputs.idea }} carefully."))
    code, result, err = sopctl(capsys, "replay", str(tmp_path / "run"), "--out",
                               str(tmp_path / "replay"), "--format", "json")
    assert code == 1
    assert "replay diverged at action WriteDesign" in err
    # what changed, not only a hash: the line of the prompt that differs, before and after
    assert "the nearest request WriteDesign made when it was recorded differs first at line" in err
    assert "recorded: user: Design" in err and "carefully." in err.split("now:", 1)[1]
    assert result["status"] == "failed" and model.calls == paid
    assert read_run(tmp_path / "replay").status == "failed"


def test_replay_refuses_a_used_folder(model: ScriptedModel, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    run(capsys, tmp_path / "run")
    run(capsys, tmp_path / "other")
    for out in ("run", "other"):
        code, _, err = sopctl(capsys, "replay", str(tmp_path / "run"), "--out", str(tmp_path / out))
        assert code == 2 and "sopctl: error:" in err


@pytest.mark.parametrize("command", ["resume", "replay"])
def test_missing_run_or_journal_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         command: str) -> None:
    extra = ["--out", str(tmp_path / "out")] if command == "replay" else []
    code, _, err = sopctl(capsys, command, str(tmp_path / "nope"), *extra)
    assert code == 2 and "does not exist" in err
    (tmp_path / "empty").mkdir()
    code, _, err = sopctl(capsys, command, str(tmp_path / "empty"), *extra)
    assert code == 2 and "has no journal" in err and "Traceback" not in err


def test_resume_with_a_bad_flag_is_exit_2(model: ScriptedModel, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    run(capsys, tmp_path / "run")
    for flags in (["--rounds", "0"], ["--budget", "-1"]):
        code, _, err = sopctl(capsys, "resume", str(tmp_path / "run"), *flags)
        assert code == 2 and "must be" in err


def test_resume_keeps_the_recorded_model(model: ScriptedModel, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """No --model on resume: the run's own model is used again (not the default `local`)."""
    code, _, _ = run(capsys, tmp_path / "run", "--rounds", "1")
    paid = model.calls
    code, resumed, err = sopctl(capsys, "resume", str(tmp_path / "run"), "--rounds", "9",
                                "--format", "json")
    assert code == 0, err
    assert model.calls > paid and resumed["status"] == "idle"


def test_resume_when_the_sop_file_is_gone(model: ScriptedModel, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    sop = tmp_path / "my.sop.yaml"
    shutil.copy(SOP, sop)
    run(capsys, tmp_path / "run", "--rounds", "1", sop=sop)
    sop.unlink()
    code, _, err = sopctl(capsys, "resume", str(tmp_path / "run"))
    assert code == 2 and "is gone" in err and "put the file back" in err


def test_replay_of_an_interrupted_run_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              forked_sopctl: ForkedSopctl) -> None:
    crashed = forked_sopctl("run", str(SOP), "--idea", "x", "--model", "fake", "--out",
                            str(tmp_path / "run"), env={"SOPCTL_CRASH_AFTER_ANSWER": "2"})
    assert crashed.returncode == 137
    code, result, err = sopctl(capsys, "replay", str(tmp_path / "run"), "--out",
                               str(tmp_path / "replay"), "--format", "json")
    assert code == 1 and "replay diverged" in err and "was interrupted" in err
    assert result["reused_calls"] == 2 and result["llm_calls"] == 0


def test_resume_with_an_sop_made_invalid_is_exit_2(model: ScriptedModel, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    sop = tmp_path / "my.sop.yaml"
    shutil.copy(SOP, sop)
    run(capsys, tmp_path / "run", "--rounds", "1", sop=sop)
    sop.write_text(SOP.read_text().replace("react_mode: by_order", "react_mode: by_orderr"))
    code, _, err = sopctl(capsys, "resume", str(tmp_path / "run"))
    assert code == 2 and "changed since the run started" in err
    code, _, err = sopctl(capsys, "resume", str(tmp_path / "run"), "--force")
    assert code == 2 and "no longer valid" in err and "my.sop.yaml:" in err
    assert "sopctl validate" in err


def test_resume_removes_temp_files_of_a_killed_write(model: ScriptedModel, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """kill -9 between writing an artifact's temp file and renaming it leaves the temp file."""
    ws = tmp_path / "run"
    run(capsys, ws, "--rounds", "1")
    before = artifact_files(ws)
    (ws / "docs" / ".sopctl-abc123.tmp").write_text("half a fi")
    (ws / "keep.tmp").write_text("not ours")
    code, _, err = sopctl(capsys, "resume", str(ws), "--format", "json")
    assert code == 0, err
    after = artifact_files(ws)
    assert "docs/.sopctl-abc123.tmp" not in after and after["keep.tmp"] == b"not ours"
    assert set(before) - {"keep.tmp"} <= set(after)


REWRITE = """
apiVersion: sop/v1
name: draft_then_review
actions:
  Draft:
    prompt: "Draft it."
    context: none
    output: text
    artifacts: [{path: out.txt, content: "draft: {{ out }}"}]
  Review:
    prompt: "Review it."
    context: none
    output: text
    artifacts: [{path: out.txt, content: "reviewed: {{ out }}"}]
roles:
  Writer: {actions: [Draft, Review], react_mode: by_order, watch: [UserRequirement]}
"""


def test_resume_of_a_finished_run_redoes_nothing_when_a_later_action_rewrote_a_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], model: ScriptedModel) -> None:
    sop = tmp_path / "rewrite.sop.yaml"
    sop.write_text(REWRITE)
    ws = tmp_path / "ws"
    code, first, _ = sopctl(capsys, "run", str(sop), "--idea", "x", "--model", "counting",
                            "--out", str(ws), "--format", "json")
    assert code == 0 and model.calls == 2
    final = (ws / "out.txt").read_text()
    assert final.startswith("reviewed: ")
    code, again, _ = sopctl(capsys, "resume", str(ws), "--format", "json")
    assert code == 0 and model.calls == 2
    assert (again["llm_calls"], again["reused_calls"]) == (0, 0)   # no action re-executed
    assert (ws / "out.txt").read_text() == final
    (ws / "out.txt").write_text("edited by hand")
    code, restored, _ = sopctl(capsys, "resume", str(ws), "--format", "json")
    assert code == 0 and model.calls == 2 and restored["reused_calls"] == 2
    assert (ws / "out.txt").read_text() == final


DECIDE = """
apiVersion: sop/v1
name: one_decision
actions:
  Decide:
    prompt: "Decide."
    context: none
    max_retries: 2
    output:
      Choice: {type: str, instruction: the decision}
    artifacts: [{path: choice.txt, content: "{{ out['Choice'] }}"}]
roles:
  Chooser: {actions: [Decide], watch: [UserRequirement]}
"""

VALID = '{"Choice": "yes"}'


def decide(tmp_path: Path, capsys: pytest.CaptureFixture[str], ws: Path) -> tuple[int, dict[str, Any], str]:
    sop = tmp_path / "decide.sop.yaml"
    sop.write_text(DECIDE)
    return sopctl(capsys, "run", str(sop), "--idea", "x", "--model", "scripted", "--out", str(ws),
                  "--format", "json")


def test_resume_after_no_valid_answer_asks_the_model_again(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each resume of a run whose attempts were all spent gets a fresh set of them (the
    conversation goes on with the last error); the journal keeps every answer, and a
    replay reproduces each invocation without calling anything."""
    model = ScriptedModel(["no json, sorry"] * 6 + [VALID])
    ws = tmp_path / "run"
    with use_model(model, name="scripted"):
        code, first, err = decide(tmp_path, capsys, ws)
        assert code == 1 and first["status"] == "failed" and model.calls == 3
        assert "no valid answer" in first["error"] and "after 3 attempt(s)" in first["error"]
        code, replayed, err = sopctl(capsys, "replay", str(ws), "--out", str(tmp_path / "r0"),
                                     "--format", "json")
        assert code == 1 and "after 3 attempt(s)" in replayed["error"] and "diverged" not in err
        assert model.calls == 3

        code, again, err = sopctl(capsys, "resume", str(ws), "--format", "json")
        assert code == 1 and again["status"] == "failed" and "after 6 attempt(s)" in again["error"]
        assert (again["llm_calls"], again["reused_calls"], model.calls) == (3, 3, 6)
        assert "could not be accepted" in model.prompts()[3]     # the chain goes on, error shown

        code, resumed, err = sopctl(capsys, "resume", str(ws), "--format", "json")
        assert code == 0 and resumed["status"] == "idle", err
        assert (resumed["llm_calls"], resumed["reused_calls"], model.calls) == (1, 6, 7)
        assert (ws / "choice.txt").read_text() == "yes"

        code, replayed, err = sopctl(capsys, "replay", str(ws), "--out", str(tmp_path / "r1"),
                                     "--format", "json")
        assert code == 0 and replayed["history"] == resumed["history"], err
        assert (replayed["llm_calls"], replayed["reused_calls"], model.calls) == (0, 7, 7)

    with Journal.open(ws) as journal:
        texts = [row.answer.text for row in journal.answers()]
    assert texts == ["no json, sorry"] * 6 + [VALID]             # old answers kept, new ones added
    code, shown, _ = sopctl(capsys, "show", str(ws), "--format", "json")
    assert shown["invocations"] == 3 and shown["journaled_calls"] == 7
    assert [(a["action"], a["calls"]) for a in shown["actions"]] == [("Decide", 7)]
    assert main(["show", str(ws)]) == 0
    shown_text = capsys.readouterr().out                         # one line per try
    assert "Chooser.Decide  [NOT COMPLETED in invocation 1, resumed]  calls 3  reused 0" in shown_text
    assert "Chooser.Decide  [NOT COMPLETED in invocation 2, resumed]  calls 3  reused 3" in shown_text
    assert "Chooser.Decide  [done]  calls 1  reused 6" in shown_text


def test_resume_after_an_unfinished_chain_does_not_pay_its_first_answer_again(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Attempt 0 journaled invalid, then the run stopped before attempt 1 (here the model
    failed; a kill -9 leaves the same journal): the resume reuses attempt 0 and sends the
    re-ask the run was about to send."""
    model = ScriptedModel(["no json, sorry", LLMError("the server went away"), VALID])
    ws = tmp_path / "run"
    with use_model(model, name="scripted"):
        code, first, _ = decide(tmp_path, capsys, ws)
        assert code == 1 and "server went away" in first["error"] and model.calls == 2
        code, resumed, err = sopctl(capsys, "resume", str(ws), "--format", "json")
    assert code == 0 and resumed["status"] == "idle", err
    assert (resumed["llm_calls"], resumed["reused_calls"], model.calls) == (1, 1, 3)
    assert model.requests[2].messages == model.requests[1].messages
