"""The Python API: load, run, run_async, iter_run, inputs; and the displays fed by events."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import pytest
from run_helpers import SOPS, default_answer, gateway_for

from engine import api
from engine.cli.live import LiveDisplay, PlainProgress, make_display
from engine.cli.report import summary
from engine.errors import CompileError, UsageError
from engine.run.events import (
    ActionCompleted,
    ActionStarted,
    MessagePublished,
    ModelAnswered,
    RoundStarted,
    RunEnded,
    RunStarted,
)
from engine.testing import ScriptedModel


def test_import_engine_does_not_import_litellm() -> None:
    import subprocess
    import sys
    code = ("import sys, engine, engine.api, engine.run.team, engine.cli, engine.cli.live; "
            "sys.exit('litellm' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_load_compiles_and_refuses_a_bad_file(tmp_path: Path) -> None:
    assert api.load(SOPS / "pipeline.sop.yaml").spec.name == "pipeline"
    bad = tmp_path / "bad.sop.yaml"
    bad.write_text("apiVersion: sop/v1\nname: bad\nactions: {}\nroles: {R: {actions: [Nope]}}\n")
    with pytest.raises(CompileError):
        api.load(bad)


def test_run_returns_the_result_with_messages(tmp_path: Path) -> None:
    result = api.run(api.load(SOPS / "pipeline.sop.yaml"), {"idea": "x"}, model="fake",
                     workspace=tmp_path)
    assert result.status == "idle"
    assert [m.cause_by for m in result.messages] == ["UserRequirement", "WritePRD", "WriteDesign", "WriteTasks"]
    assert result.to_json()["history"] == result.history
    assert "status:    idle" in summary(result)


def test_iter_run_yields_every_event_in_order(tmp_path: Path) -> None:
    async def collect() -> list[Any]:
        compiled = api.load(SOPS / "pipeline.sop.yaml")
        gateway = gateway_for(ScriptedModel(default_answer))
        return [e async for e in api.iter_run(compiled, {"idea": "x"}, gateway=gateway,
                                              workspace=tmp_path)]
    events = asyncio.run(collect())
    assert isinstance(events[0], RunStarted) and isinstance(events[-1], RunEnded)
    kinds = [type(e).__name__ for e in events]
    assert kinds[1] == "MessagePublished"  # the idea, before round 1
    assert kinds.count("RoundStarted") == 3 and kinds.count("ModelAnswered") == 3
    # an action's events come in order: started, answered, completed; then the round's publish
    assert kinds[2:7] == ["RoundStarted", "ActionStarted", "ModelAnswered", "ActionCompleted", "MessagePublished"]
    published = [e.message["id"] for e in events if isinstance(e, MessagePublished)]
    assert published == ["0-Human-0", "1-ProductManager-0", "2-Architect-0", "3-ProjectManager-0"]


def test_leaving_iter_run_early_cancels_the_run(tmp_path: Path) -> None:
    model = ScriptedModel(default_answer)

    async def first_round() -> None:
        async for event in api.iter_run(api.load(SOPS / "pipeline.sop.yaml"), {"idea": "x"},
                                        gateway=gateway_for(model), workspace=tmp_path):
            if isinstance(event, RoundStarted):
                break
    asyncio.run(first_round())
    assert len(model.requests) <= 1


def test_resolve_inputs_defaults_and_coercion() -> None:
    text = """
apiVersion: sop/v1
name: typed
inputs:
  idea: {type: str, required: true}
  n: {type: int, default: 3}
  ratio: {type: float}
  fast: {type: bool, default: false}
actions: {A: {prompt: "{{ inputs.n }}", output: text}}
roles: {R: {actions: [A], watch: [UserRequirement]}}
"""
    from engine.compile.compiler import compile_text
    compiled = compile_text(text)
    got = api.resolve_inputs(compiled, {"idea": "x", "ratio": "0.5", "fast": "yes"})
    assert got == {"idea": "x", "n": 3, "ratio": 0.5, "fast": True}
    with pytest.raises(UsageError, match="input 'n' must be int"):
        api.resolve_inputs(compiled, {"idea": "x", "n": "three"})
    with pytest.raises(UsageError, match="input 'fast' must be bool"):
        api.resolve_inputs(compiled, {"idea": "x", "fast": "maybe"})
    with pytest.raises(UsageError, match="missing required input 'idea'"):
        api.resolve_inputs(compiled, {})
    with pytest.raises(UsageError) as info:
        api.resolve_inputs(compiled, {"idea": "x", "ratoi": "1"})
    assert "did you mean 'ratio'" in str(info.value)


def test_parse_input_flags() -> None:
    assert api.parse_input_flags(["a=1", "b=x=y"], "idea") == {"a": "1", "b": "x=y", "idea": "idea"}
    with pytest.raises(UsageError):
        api.parse_input_flags(["=1"])


def test_unknown_run_option_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        api.run(api.load(SOPS / "pipeline.sop.yaml"), {"idea": "x"}, modle="fake")


# --- displays ---------------------------------------------------------------------------------

def _events() -> list[Any]:
    return [
        RunStarted(run_id="r1", sop_file="f", sop_name="demo", sop_hash="h", inputs={}, model="fake",
                   engine_version="0", workspace="/w", max_rounds=5, budget_usd=0.0),
        RoundStarted(round=1, active_roles=["A"]),
        ActionStarted(round=1, role="A", action="Write", key="k"),
        ModelAnswered(round=1, role="A", action="Write", attempt=0, request_hash="h",
                      prompt_tokens=100, completion_tokens=20, cost_usd=0.01, seconds=0.2),
        ActionCompleted(round=1, role="A", action="Write", key="k", messages=[],
                        artifacts=[{"path": "a.txt", "sha256": "0"}]),
        RunEnded(status="idle", rounds=1),
    ]


def test_plain_progress_lines() -> None:
    stream = io.StringIO()
    display = PlainProgress(stream, ["A", "B"])
    for event in _events():
        display.on_event(event)
    text = stream.getvalue()
    assert "round 1: A" in text and "A: Write done, 1 file(s)" in text
    assert "100+20 tokens" in text and "$0.0100" in text and "run ended: idle" in text
    assert "\x1b[" not in text  # no terminal codes in logs


def test_live_display_renders_roles_calls_and_cost() -> None:
    stream = io.StringIO()
    display = LiveDisplay(["A", "B"], stream)
    for event in _events():
        display.on_event(event)
    assert display.live is None  # stopped at RunEnded
    assert display.stats.role_calls == {"A": 1} and display.stats.roles["B"] == "idle"
    assert "round 1/5" in display.stats.headline()


def test_make_display_picks_plain_when_not_a_terminal() -> None:
    assert isinstance(make_display(["A"], io.StringIO()), PlainProgress)


# --- the one way in: every run journaled, resume and replay from the API ------------------


def test_run_is_journaled_by_default_and_show_reads_it(tmp_path: Path) -> None:
    from engine.journal.history import read_run
    from engine.journal.store import journal_path

    compiled = api.load(SOPS / "pipeline.sop.yaml")
    result = api.run(compiled, {"idea": "x"}, model="fake", workspace=tmp_path / "a")
    state = read_run(tmp_path / "a")
    assert (state.run_id, state.status, state.rounds) == (result.run_id, "idle", result.rounds)
    assert [m["cause_by"] for m in state.history] == [m.cause_by for m in result.messages]
    api.run(compiled, {"idea": "x"}, model="fake", workspace=tmp_path / "b", journal=False)
    assert not journal_path(tmp_path / "b").exists()


def test_iter_run_is_journaled_too(tmp_path: Path) -> None:
    from engine.journal.history import read_run

    async def drain() -> None:
        async for _ in api.iter_run(api.load(SOPS / "pipeline.sop.yaml"), {"idea": "x"},
                                    model="fake", workspace=tmp_path):
            pass
    asyncio.run(drain())
    assert read_run(tmp_path).status == "idle"


def test_resume_from_the_api_continues_without_paying_again(tmp_path: Path) -> None:
    compiled = api.load(SOPS / "pipeline.sop.yaml")
    first = api.run(compiled, {"idea": "x"}, model="fake", workspace=tmp_path, max_rounds=2)
    assert first.status == "max_rounds"
    resumed = api.resume(tmp_path, rounds=10)
    assert resumed.status == "idle" and resumed.run_id == first.run_id
    full = api.run(compiled, {"idea": "x"}, model="fake", workspace=tmp_path / "full", journal=False)
    assert resumed.llm_calls == full.llm_calls - first.llm_calls   # finished actions are not redone
    assert [m.content for m in resumed.messages] == [m.content for m in full.messages]


def test_replay_from_the_api_calls_no_model_and_says_whether_it_diverged(tmp_path: Path) -> None:
    compiled = api.load(SOPS / "pipeline.sop.yaml")
    recorded = api.run(compiled, {"idea": "x"}, model="fake", workspace=tmp_path / "run")
    replayed = api.replay(tmp_path / "run", tmp_path / "again")
    assert not replayed.diverged
    assert replayed.result.llm_calls == 0 and replayed.result.reused_calls == recorded.llm_calls
    assert replayed.result.history == recorded.history
    with pytest.raises(UsageError):
        api.replay(tmp_path / "run", tmp_path / "again")           # that folder holds a run now


def test_a_refused_resume_leaves_the_journal_untouched(tmp_path: Path) -> None:
    from engine.errors import JournalError
    from engine.journal.store import journal_path

    sop = tmp_path / "p.sop.yaml"
    sop.write_text((SOPS / "pipeline.sop.yaml").read_text())
    api.run(api.load(sop), {"idea": "x"}, model="fake", workspace=tmp_path / "run", max_rounds=1)
    sop.write_text(sop.read_text() + "\n# changed\n")
    before = journal_path(tmp_path / "run").read_bytes()
    with pytest.raises(JournalError, match="changed since the run started"):
        api.resume(tmp_path / "run")
    assert journal_path(tmp_path / "run").read_bytes() == before
