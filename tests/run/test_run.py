"""Whole runs: golden histories on `fake`, determinism, how runs end, and `sopctl run`.

Golden histories live in tests/golden/<sop>.json. After an intended change of behaviour,
regenerate them with `SOPCTL_REGEN=1 pytest tests/run/test_run.py` and review the diff.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from run_helpers import ROOT, SOPS, TESTS, default_answer, gateway_for, run_sop, sop

from engine import api
from engine.cli.commands import main
from engine.models.gateway import Gateway
from engine.models.types import ModelAnswer, ModelRequest
from engine.run.events import ModelAnswered, RunEnded
from engine.testing import ScriptedModel

GOLDEN = TESTS / "golden"
REGEN = os.environ.get("SOPCTL_REGEN") == "1"
GOLDEN_SOPS = {
    "pipeline": SOPS / "pipeline.sop.yaml",
    "by_order": SOPS / "by_order.sop.yaml",
    "react_multi": SOPS / "react_multi.sop.yaml",
    "plan": SOPS / "plan.sop.yaml",
    "fanout": SOPS / "fanout.sop.yaml",
    "loop": SOPS / "loop.sop.yaml",
    "software_company": ROOT / "sops" / "software_company.sop.yaml",
}


def _fake_run(path: Path, workspace: Path, **options: Any) -> api.RunResult:
    return api.run(api.load(path), {"idea": "a command-line 2048 game"}, api.RunOptions(model="fake",
                   workspace=workspace, **options))


def _golden(result: api.RunResult) -> dict[str, Any]:
    return {"status": result.status, "rounds": result.rounds, "llm_calls": result.llm_calls,
            "artifacts": result.artifacts, "history": result.history}


@pytest.mark.parametrize("name", sorted(GOLDEN_SOPS))
def test_golden_history_on_fake(name: str, tmp_path: Path) -> None:
    path = GOLDEN_SOPS[name]
    if not path.exists():
        pytest.skip(f"{path} is not there")
    got = _golden(_fake_run(path, tmp_path))
    golden = GOLDEN / f"{name}.json"
    if REGEN or not golden.exists():
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(json.dumps(got, indent=2) + "\n")
        if not REGEN:
            pytest.fail(f"wrote a new golden file {golden}; review and commit it")
    assert got == json.loads(golden.read_text())


class _Answers:
    """An observer that keeps the request hash of every answer the run read (its journal key
    without the place and occurrence: a place holds the run's id, the request never does)."""

    def __init__(self, hashes: list[str]) -> None:
        self.hashes = hashes

    def on_event(self, event: Any) -> None:
        if isinstance(event, ModelAnswered):
            self.hashes.append(event.request_hash.split(":")[0])


def test_same_answers_give_the_same_history_and_request_hashes(tmp_path: Path) -> None:
    """Ids are deterministic and no id reaches a prompt: what resume and replay rely on."""
    runs = []
    for name in ("a", "b"):
        hashes: list[str] = []
        answered = _Answers(hashes)
        result = _fake_run(SOPS / "fanout.sop.yaml", tmp_path / name, observers=[answered])
        runs.append((result, sorted(hashes)))
    (first, h1), (second, h2) = runs
    assert first.run_id != second.run_id
    assert [m.to_json() for m in first.messages] == [m.to_json() for m in second.messages]
    assert h1 == h2 and len(h1) == first.llm_calls


def test_max_rounds_ends_the_run(tmp_path: Path) -> None:
    result = _fake_run(SOPS / "pipeline.sop.yaml", tmp_path, max_rounds=2)
    assert (result.status, result.rounds) == ("max_rounds", 2)
    assert [h["round"] for h in result.history] == [0, 1, 2]


def test_idle_when_no_role_keeps_the_first_message(tmp_path: Path) -> None:
    text = (SOPS / "pipeline.sop.yaml").read_text().replace("watch: [UserRequirement]", "watch: [WriteTasks]")
    from run_helpers import sop_text
    result = run_sop(sop_text(text), ScriptedModel(default_answer), tmp_path)
    assert (result.status, result.rounds, len(result.messages)) == ("idle", 0, 1)


class _Priced:
    """A provider that costs $0.40 per answer (fake's answers otherwise)."""

    def supports_schema(self, model: str) -> bool:
        return False

    async def complete(self, request: ModelRequest) -> ModelAnswer:
        from engine.models.fake import answer_text
        return ModelAnswer(text=answer_text(request.spec, schema_mode=False), cost_usd=0.4)


def test_budget_through_the_real_gateway(tmp_path: Path) -> None:
    gateway = Gateway(providers={"priced": _Priced()}, budget_usd=0.5)
    result = api.run(api.load(SOPS / "pipeline.sop.yaml"), {"idea": "x"}, api.RunOptions(model="priced",
                     workspace=tmp_path, gateway=gateway, budget_usd=0.5))
    assert result.status == "budget"
    assert result.llm_calls == 2 and result.cost_usd == pytest.approx(0.8)


def test_the_runs_budget_stops_it_before_the_call_that_would_overspend(tmp_path: Path) -> None:
    """The run's budget (file, --budget) governs the gateway; the third call is refused."""
    gateway = Gateway(providers={"priced": _Priced()})
    result = api.run(api.load(SOPS / "pipeline.sop.yaml"), {"idea": "x"}, api.RunOptions(model="priced",
                     workspace=tmp_path, gateway=gateway, budget_usd=0.7))
    assert result.status == "budget"
    assert result.llm_calls == 2                      # 0.4 + 0.4 spent: 0.8 >= 0.7
    assert "budget" in result.error and "WriteTasks" in result.error
    assert [h["cause_by"] for h in result.history] == ["UserRequirement", "WritePRD", "WriteDesign"]


def test_failed_action_ends_the_run_and_keeps_earlier_work(tmp_path: Path) -> None:
    from engine.errors import ActionFailed

    def answer(spec: Any, attempt: int) -> Any:
        if spec.action == "WriteDesign":
            return ActionFailed("WriteDesign", "no valid answer after 3 attempts")
        return default_answer(spec)
    result = run_sop(sop("pipeline"), ScriptedModel(answer), tmp_path)
    assert result.status == "failed" and "action WriteDesign failed" in result.error
    assert result.artifacts == ["docs/prd.json"] and (tmp_path / "docs/prd.json").is_file()
    assert isinstance(result.events[-1], RunEnded) and result.events[-1].status == "failed"


def test_cancelling_a_run_ends_it_interrupted_with_run_ended(tmp_path: Path) -> None:
    async def scenario() -> tuple[api.RunResult, list[Any]]:
        gate = asyncio.Event()  # never set: the first call hangs
        events: list[Any] = []

        class Sink:
            def on_event(self, event: Any) -> None:
                events.append(event)
        model = ScriptedModel(default_answer, gate=gate)
        task = asyncio.ensure_future(api.run_async(api.load(SOPS / "pipeline.sop.yaml"), {"idea": "x"},
                                                   api.RunOptions(gateway=gateway_for(model), workspace=tmp_path,
                                                   observers=[Sink()])))
        while not model.requests:
            await asyncio.sleep(0)
        task.cancel()
        return await task, events
    result, events = asyncio.run(scenario())
    assert result.status == "interrupted"
    assert isinstance(events[-1], RunEnded) and events[-1].status == "interrupted"


# --- the command line ----------------------------------------------------------------------

def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_json_result_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _cli(capsys, "run", str(SOPS / "pipeline.sop.yaml"), "--idea", "2048",
                          "--model", "fake", "--out", str(tmp_path / "ws"), "--format", "json")
    assert code == 0, err
    data = json.loads(out)  # exactly one JSON object on stdout
    assert set(data) >= {"status", "rounds", "llm_calls", "reused_calls", "prompt_tokens",
                         "completion_tokens", "cost_usd", "workspace", "artifacts", "history"}
    assert data["status"] == "idle" and data["rounds"] == 3 and data["llm_calls"] == 3
    assert data["artifacts"] == ["docs/prd.json"]
    assert data["workspace"] == str((tmp_path / "ws").resolve())
    assert data["history"][1] == {"id": "1-ProductManager-0", "round": 1, "cause_by": "WritePRD",
                                  "sent_from": "ProductManager", "send_to": ["<all>"],
                                  "chars": data["history"][1]["chars"]}
    assert "round 1" in err  # plain progress on stderr when not a terminal
    assert (tmp_path / "ws" / ".sopctl" / "journal.sqlite").is_file()


def test_cli_text_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(capsys, "run", str(SOPS / "pipeline.sop.yaml"), "--idea", "2048",
                        "--model", "fake", "--out", str(tmp_path / "ws"), "--rounds", "1")
    assert code == 0
    assert "status:    max_rounds" in out and "docs/prd.json" in out


def test_cli_default_workspace_is_runs_run_id(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, _ = _cli(capsys, "run", str(SOPS / "pipeline.sop.yaml"), "--idea", "x",
                        "--model", "fake", "--format", "json")
    data = json.loads(out)
    assert code == 0
    assert Path(data["workspace"]).parent == (tmp_path / "runs").resolve()
    assert Path(data["workspace"]).name == data["run_id"]
    import re
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{6}", data["run_id"])


def test_cli_missing_required_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _cli(capsys, "run", str(SOPS / "pipeline.sop.yaml"), "--model", "fake",
                          "--out", str(tmp_path / "ws"))
    assert code == 2 and out == ""
    assert "missing required input 'idea'" in err and "--idea" in err
    assert not (tmp_path / "ws").exists()


def test_cli_unknown_input_suggests_a_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _cli(capsys, "run", str(SOPS / "pipeline.sop.yaml"), "--idea", "x",
                        "--input", "langauge=Go", "--model", "fake", "--out", str(tmp_path / "ws"))
    assert code == 2 and "unknown input 'langauge'" in err and "did you mean 'language'" in err


def test_cli_bad_input_flag_and_type(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _cli(capsys, "run", str(SOPS / "pipeline.sop.yaml"), "--idea", "x",
                        "--input", "language", "--model", "fake")
    assert code == 2 and "KEY=VALUE" in err


def test_cli_exec_refused_without_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _cli(capsys, "run", str(SOPS / "exec.sop.yaml"), "--idea", "x",
                          "--model", "fake", "--out", str(tmp_path / "ws"), "--format", "json")
    assert code == 2 and out == ""
    assert "--allow-exec" in err and "RunCode" in err
    assert not (tmp_path / "ws").exists()


def test_cli_exec_runs_with_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(capsys, "run", str(SOPS / "exec.sop.yaml"), "--idea", "x", "--model", "fake",
                        "--out", str(tmp_path / "ws"), "--format", "json", "--allow-exec")
    assert code == 0
    assert [h["cause_by"] for h in json.loads(out)["history"]][-1] == "RunCode"


def test_cli_invalid_file_exits_2_with_diagnostics(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.sop.yaml"
    bad.write_text("apiVersion: sop/v1\nname: bad\nactions: {}\nroles: {R: {actions: [Nope]}}\n")
    code, out, err = _cli(capsys, "run", str(bad), "--idea", "x", "--model", "fake")
    assert code == 2 and out == ""
    assert "bad.sop.yaml:4" in err and "Nope" in err
    code, _, err = _cli(capsys, "run", str(tmp_path / "missing.sop.yaml"), "--idea", "x")
    assert code == 2 and "Traceback" not in err


def test_cli_failed_run_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (SOPS / "pipeline.sop.yaml").read_text()
    text = text.replace("path: docs/prd.json", "path: \"{{ out['Project Name'] }}/\"")
    path = tmp_path / "p.sop.yaml"
    path.write_text(text)
    code, out, _ = _cli(capsys, "run", str(path), "--idea", "x", "--model", "fake",
                        "--out", str(tmp_path / "ws"), "--format", "json")
    data = json.loads(out)
    assert code == 1 and data["status"] == "failed" and "WritePRD" in data["error"]


def test_cli_ctrl_c_stops_cleanly_with_status_interrupted(tmp_path: Path) -> None:
    env = {**os.environ, "SOPCTL_FAKE_LATENCY_MS": "20000", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine.cli", "run", str(SOPS / "pipeline.sop.yaml"), "--idea", "x",
         "--model", "fake", "--out", str(tmp_path / "ws"), "--format", "json"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        if "WritePRD ..." in line:
            break
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert json.loads(out)["status"] == "interrupted"
    assert "Traceback" not in err


# --- the real local model ------------------------------------------------------------------

@pytest.mark.slow
def test_small_sop_end_to_end_on_the_local_model(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp")
    from engine.errors import SopError
    from engine.testing import allow_real_models
    try:
        with allow_real_models():  # the suite may block real models; this test means one
            result = api.run(api.load(SOPS / "pipeline.sop.yaml"), {"idea": "a todo list app"},
                             api.RunOptions(model="local", workspace=tmp_path, max_rounds=3))
    except SopError as exc:  # the extra's model package missing: preflight says how to install
        pytest.skip(f"local model unavailable: {exc}")
    assert result.status in ("idle", "max_rounds"), result.error
    assert result.llm_calls >= 3
    prd = json.loads((tmp_path / "docs/prd.json").read_text())
    assert isinstance(prd["Project Name"], str) and isinstance(prd["Product Goals"], list)


def test_a_model_that_cannot_work_stops_the_run_before_it_starts(tmp_path: Path) -> None:
    """E.g. `local` without its extra: the provider's preflight error, before any file or call."""
    from engine.errors import RunError

    class Missing(_Priced):
        def preflight(self, model: str) -> None:
            raise RunError("the embedded `local` model is not installed: pip install -e '.[local]'")

    gateway = Gateway(providers={"local": Missing()})
    with pytest.raises(RunError, match="pip install"):
        api.run(api.load(SOPS / "pipeline.sop.yaml"), {"idea": "x"}, api.RunOptions(model="local",
                workspace=tmp_path / "ws", gateway=gateway))
    assert gateway.usage.llm_calls == 0 and not (tmp_path / "ws").exists()
