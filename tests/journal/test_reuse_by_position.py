"""Reuse by position in real runs: identical requests are each asked; a kill -9 and a resume
take the Nth journaled answer for the Nth request and ask the rest; a replay gives the same
without a model; `--reuse-identical` answers identical requests once per run.

The model answers `<prefix><n>` for its n-th call, so which answer a request got shows which
call (and which invocation) paid for it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from run_helpers import ROOT, here, sopctl_env

from engine.journal.store import CRASH_AFTER_ANSWER_ENV
from engine.testing import ScriptedModel, use_model

SOP = """
apiVersion: sop/v1
name: repeats
inputs:
  idea: {type: str, required: true}
actions:
  Line:
    for_each: "{{ ['a', 'b', 'c'] }}"
    max_concurrency: 1
    prompt: "Write one line about {{ inputs.idea }}."
    context: none
    send_to: ["<none>"]
    artifacts:
      - path: "line{{ index }}.txt"
        content: "{{ out }}"
roles:
  Writer:
    actions: [Line]
    watch: [UserRequirement]
"""

_CRASHING_RUN = """
import sys
from engine.cli.commands import main
from engine.testing import ScriptedModel, use_model
calls = iter(range(1, 100))
with use_model(ScriptedModel(lambda spec, attempt: f"v{next(calls)}"), name="numbered"):
    sys.exit(main(sys.argv[1:]))
"""


def numbered(prefix: str) -> ScriptedModel:
    calls = iter(range(1, 100))
    return ScriptedModel(lambda spec, attempt: f"{prefix}{next(calls)}")


@pytest.fixture
def sop_file(tmp_path: Path) -> Path:
    path = tmp_path / "repeats.sop.yaml"
    path.write_text(SOP, encoding="utf-8")
    return path


def run_args(sop_file: Path, ws: Path, *extra: str) -> list[str]:
    return ["run", str(sop_file), "--idea", "tea", "--model", "numbered", "--out", str(ws),
            "--format", "json", *extra]


def lines(ws: Path) -> list[str]:
    return [(ws / f"line{i}.txt").read_text(encoding="utf-8") for i in range(3)]


def test_identical_requests_in_one_run_are_each_asked(sop_file: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    with use_model(numbered("v"), name="numbered") as model:
        done = here(capsys, *run_args(sop_file, tmp_path / "ws"))
    assert done.returncode == 0, done.stderr
    assert lines(tmp_path / "ws") == ["v1", "v2", "v3"] and model.calls == 3
    assert json.loads(done.stdout)["llm_calls"] == 3


def test_reuse_identical_answers_them_once(sop_file: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    with use_model(numbered("v"), name="numbered") as model:
        done = here(capsys, *run_args(sop_file, tmp_path / "ws", "--reuse-identical"))
    assert done.returncode == 0, done.stderr
    assert lines(tmp_path / "ws") == ["v1", "v1", "v1"] and model.calls == 1
    result = json.loads(done.stdout)
    assert (result["llm_calls"], result["reused_calls"]) == (1, 2)


def test_kill_then_resume_takes_the_nth_answer_for_the_nth_request_then_replay(
        sop_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ws = tmp_path / "ws"
    crashed = subprocess.run([sys.executable, "-c", _CRASHING_RUN, *run_args(sop_file, ws)],
                             env=sopctl_env({CRASH_AFTER_ANSWER_ENV: "2", "PYTHONPATH": str(ROOT)}),
                             capture_output=True, text=True, timeout=120)
    assert crashed.returncode == 137, crashed.stderr     # killed right after the 2nd answer
    with use_model(numbered("r"), name="numbered") as model:
        resumed = here(capsys, "resume", str(ws), "--format", "json")
    assert resumed.returncode == 0, resumed.stderr
    assert lines(ws) == ["v1", "v2", "r1"]      # the journaled two by position, the third asked
    assert model.calls == 1
    with use_model(numbered("x"), name="numbered") as never:
        replayed = here(capsys, "replay", str(ws), "--out", str(tmp_path / "again"), "--format", "json")
    assert replayed.returncode == 0, replayed.stderr
    assert lines(tmp_path / "again") == ["v1", "v2", "r1"] and never.calls == 0


def test_a_resume_keeps_the_runs_reuse_identical(sop_file: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    ws = tmp_path / "ws"
    crashed = subprocess.run([sys.executable, "-c", _CRASHING_RUN,
                              *run_args(sop_file, ws, "--reuse-identical")],
                             env=sopctl_env({CRASH_AFTER_ANSWER_ENV: "1", "PYTHONPATH": str(ROOT)}),
                             capture_output=True, text=True, timeout=120)
    assert crashed.returncode == 137, crashed.stderr
    with use_model(numbered("r"), name="numbered") as model:
        resumed = here(capsys, "resume", str(ws), "--format", "json")
    assert resumed.returncode == 0, resumed.stderr
    assert lines(ws) == ["v1", "v1", "v1"] and model.calls == 0
