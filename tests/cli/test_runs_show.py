"""`sopctl show` and `sopctl runs`: everything read from the journal alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from run_helpers import ROOT, TESTS, ForkedSopctl

from engine.cli.commands import main
from engine.journal.history import RunState, read_run
from engine.journal.run_folder import journal_path
from engine.journal.store import Journal
from engine.models.types import TransientModelError, Usage
from engine.testing import ScriptedModel, use_model

SOP = TESTS / "sops" / "journal_small.sop.yaml"
CONTRACT_KEYS = {"status", "rounds", "llm_calls", "reused_calls", "prompt_tokens",
                 "completion_tokens", "cost_usd", "workspace", "artifacts", "history",
                 "journaled_calls"}


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def fake_run(ws: Path, crash_after_event: int = 0) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOPCTL_")}
    if crash_after_event:
        env["SOPCTL_CRASH_AFTER_EVENT"] = str(crash_after_event)
    return subprocess.run([sys.executable, "-m", "engine.cli", "run", str(SOP), "--idea",
                           "a snake game", "--model", "fake", "--out", str(ws), "--format",
                           "json"], cwd=ROOT, env=env, capture_output=True, text=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One finished run and one killed mid-way, side by side under one folder."""
    root = tmp_path_factory.mktemp("runs")
    done = fake_run(root / "a-done")
    assert done.returncode == 0, done.stderr
    killed = fake_run(root / "b-killed", crash_after_event=14)
    assert killed.returncode == 137
    return {"root": root, "result": json.loads(done.stdout)}


def test_show_json_is_the_run_result(runs: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "show", str(runs["root"] / "a-done"), "--format", "json")
    assert code == 0
    shown = json.loads(out)
    assert CONTRACT_KEYS <= set(shown)
    for key in ("status", "rounds", "llm_calls", "reused_calls", "prompt_tokens",
                "completion_tokens", "cost_usd", "workspace", "artifacts", "history"):
        assert shown[key] == runs["result"][key], key
    assert shown["journaled_calls"] == shown["llm_calls"] == 8


def test_show_works_on_a_killed_run(runs: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "show", str(runs["root"] / "b-killed"), "--format", "json")
    assert code == 0
    shown = json.loads(out)
    assert shown["status"] == "interrupted"
    assert shown["history"] == runs["result"]["history"][: len(shown["history"])]
    assert 0 < shown["journaled_calls"] < 8 and shown["rounds"] >= 1
    code, text, _ = cli(capsys, "show", str(runs["root"] / "b-killed"))
    assert "interrupted" in text and "sopctl resume" in text


def test_show_text_timeline(runs: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    code, text, _ = cli(capsys, "show", str(runs["root"] / "a-done"))
    assert code == 0
    for expected in ("round 1  roles: ProductManager", "round 2  roles: Architect, Reviewer",
                     "ProductManager.WritePRD  [done]", "-> 2-Architect-0  WriteDesign",
                     "per action:", "total: 8 model calls", "artifacts: NOTES.md"):
        assert expected in text, expected
    assert text.index("round 1") < text.index("round 2") < text.index("round 3")


def test_runs_lists_every_run(runs: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "runs", str(runs["root"]), "--format", "json")
    assert code == 0
    listed = {Path(r["dir"]).name: r for r in json.loads(out)}
    assert set(listed) == {"a-done", "b-killed"}
    assert listed["a-done"]["status"] == "idle" and listed["a-done"]["calls"] == 8
    assert listed["a-done"]["sop"] == "journal_small" and listed["a-done"]["rounds"] == 3
    assert listed["b-killed"]["status"] == "interrupted"
    code, text, _ = cli(capsys, "runs", str(runs["root"]))
    assert code == 0 and "a-done" in text and "interrupted" in text and "journal_small" in text


def test_runs_on_an_empty_or_missing_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "runs", str(tmp_path))
    assert code == 0 and "no runs under" in out
    code, out, _ = cli(capsys, "runs", str(tmp_path), "--format", "json")
    assert code == 0 and json.loads(out) == []
    code, _, err = cli(capsys, "runs", str(tmp_path / "nope"))
    assert code == 2 and "does not exist" in err


def test_runs_shows_an_unreadable_journal_as_a_row(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = journal_path(tmp_path / "broken")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a database at all" * 50)
    code, out, _ = cli(capsys, "runs", str(tmp_path), "--format", "json")
    assert code == 0
    (row,) = json.loads(out)
    assert row["status"] == "unreadable" and "torn or corrupted" in row["error"]


@pytest.mark.parametrize("setup", ["missing", "no-journal"])
def test_show_without_a_journal_is_exit_2(tmp_path: Path, setup: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "nope"
    if setup == "no-journal":
        target.mkdir()
    code, _, err = cli(capsys, "show", str(target))
    assert code == 2 and "sopctl: error:" in err and "Traceback" not in err


def test_show_marks_a_run_whose_writer_is_alive(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from engine.run.events import RunStarted

    with Journal.create(tmp_path, sop_name="x", sop_hash="a" * 64) as journal:
        journal.on_event(RunStarted(run_id="r", sop_file="x", sop_name="x", sop_hash="a" * 64,
                                    inputs={}, model="fake", engine_version="0", workspace="w",
                                    max_rounds=1, budget_usd=0.0))
        _, out, _ = cli(capsys, "show", str(tmp_path), "--format", "json")
        assert json.loads(out)["status"] == "running"
    _, out, _ = cli(capsys, "show", str(tmp_path), "--format", "json")
    assert json.loads(out)["status"] == "interrupted"


# --- one count: the timeline's action lines add up to the per-action table and the total ------


def _counted(usage: Usage) -> tuple[int, ...]:
    return (usage.llm_calls, usage.reused_calls, usage.retries, usage.reasks,
            usage.prompt_tokens, usage.completion_tokens)


def assert_one_count(ws: Path) -> RunState:
    """Every action's table row is the sum of its timeline lines, and the total their sum."""
    state = read_run(ws)
    for action, stats in state.actions.items():
        lines = sum((r.usage for r in state.timeline if r.action == action), Usage())
        assert _counted(lines) == _counted(stats.usage), action
    assert _counted(sum((s.usage for s in state.actions.values()), Usage())) == _counted(state.usage)
    return state


def test_a_resumed_run_that_lost_an_answer_event_counts_it_on_its_action_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], forked_sopctl: ForkedSopctl) -> None:
    """Killed right after its 3rd answer was journaled (before the answer's event): the resume
    reuses it. The line of the action try that paid it says so (not `calls 0`), and the react
    role's state choices are on its action lines as they are in its table rows."""
    crashed = forked_sopctl("run", str(SOP), "--idea", "x", "--model", "fake", "--out",
                            str(tmp_path / "run"), env={"SOPCTL_CRASH_AFTER_ANSWER": "3"})
    assert crashed.returncode == 137
    assert forked_sopctl("resume", str(tmp_path / "run")).returncode == 0
    state = assert_one_count(tmp_path / "run")
    with Journal.open(tmp_path / "run") as journal:
        answers = journal.answers()
        assert state.usage.llm_calls == len(answers) == 8     # none paid twice
    # the 3rd answer is WriteDesign's or ReviewBrief's: both roles run in the same round, concurrently
    third = {"WriteDesign": "Architect.WriteDesign", "ReviewBrief": "Reviewer.ReviewBrief"}[answers[2].action]
    code, out, _ = cli(capsys, "show", str(tmp_path / "run"))
    # the killed invocation's try paid the answer; the resume's try reused it
    assert code == 0 and f"{third}  [NOT COMPLETED in invocation 1, resumed]  calls 1  reused 0" in out
    assert f"{third}  [done]  calls 0  reused 1" in out
    assert "Engineer.WriteCode  [done]  calls 3" in out


FAN_OUT = """
apiVersion: sop/v1
name: fan_out
actions:
  Name:
    prompt: "Name {{ item }}."
    context: none
    for_each: "{{ ['a', 'b', 'c'] }}"
    max_concurrency: 1
    output:
      Name: {type: str, instruction: a name}
roles:
  Namer: {actions: [Name], watch: [UserRequirement]}
"""


def test_a_fan_out_with_reasks_and_retries_counts_alike_everywhere(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sop = tmp_path / "fan.sop.yaml"
    sop.write_text(FAN_OUT)
    model = ScriptedModel(['{"Name": "A"}', "no json", '{"Name": "B"}',
                           TransientModelError("rate limited (429)", retry_after_s=0), '{"Name": "C"}'])
    with use_model(model, name="scripted"):
        code, out, err = cli(capsys, "run", str(sop), "--idea", "x", "--model", "scripted",
                             "--out", str(tmp_path / "run"), "--format", "json")
    assert code == 0, err
    state = assert_one_count(tmp_path / "run")
    assert _counted(state.actions["Name"].usage)[:4] == (4, 0, 1, 1)
    code, out, _ = cli(capsys, "show", str(tmp_path / "run"))
    assert "Namer.Name  [done]  calls 4  reused 0" in out and "1 retries  1 re-asks" in out


def test_runs_json_gives_each_runs_totals(runs: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    """Calls, tokens, cost, status and the question waited for: a folder's cost at a glance."""
    code, out, _ = cli(capsys, "runs", str(runs["root"]), "--format", "json")
    assert code == 0
    done = {Path(r["dir"]).name: r for r in json.loads(out)}["a-done"]
    result = runs["result"]
    assert done["calls"] == result["llm_calls"]
    assert (done["prompt_tokens"], done["completion_tokens"]) == (result["prompt_tokens"],
                                                                  result["completion_tokens"])
    assert done["tokens"] == result["prompt_tokens"] + result["completion_tokens"] > 0
    assert done["cost_usd"] == result["cost_usd"] and done["model"] == "fake"
    assert done["question"] is None and done["ended_at"] and done["journaled_calls"] == 8
    code, text, _ = cli(capsys, "runs", str(runs["root"]))
    assert code == 0 and "total: 2 runs" in text


def test_show_prints_the_runs_final_shared_state(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file with `state:`: show prints the state as the run ended (from the journal's
    RunEnded), and `show --format json` has it as `run --format json` does."""
    sop = tmp_path / "count.sop.yaml"
    sop.write_text("""\
apiVersion: sop/v1
name: count
state:
  count: {type: int}
  seen: {type: list}
actions:
  Count:
    kind: compute
    content: "counted"
    set: {count: "state.count + 2", seen: "state.seen + ['idea']"}
roles:
  Counter: {watch: [UserRequirement], actions: [Count]}
""", encoding="utf-8")
    code, out, _ = cli(capsys, "run", str(sop), "--idea", "x", "--model", "fake", "--out", str(tmp_path / "ws"),
                       "--format", "json")
    assert code == 0 and json.loads(out)["state"] == {"count": 2, "seen": ["idea"]}
    code, out, _ = cli(capsys, "show", str(tmp_path / "ws"))
    assert code == 0
    assert "state:\n  count = 2\n  seen = [\"idea\"]" in out
    code, out, _ = cli(capsys, "show", str(tmp_path / "ws"), "--format", "json")
    assert code == 0 and json.loads(out)["state"] == {"count": 2, "seen": ["idea"]}


def test_show_of_a_run_without_state_prints_none(runs: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "show", str(runs["root"] / "a-done"))
    assert code == 0 and "state:" not in out
    code, out, _ = cli(capsys, "show", str(runs["root"] / "a-done"), "--format", "json")
    assert "state" not in json.loads(out)
