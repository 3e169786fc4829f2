"""A run's options: typed, frozen, refused with a UsageError when wrong; resume and replay take
their subsets and keep the run's own facts."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import pytest
from run_helpers import SOPS

from engine import api
from engine.api import ReplayOptions, ResumeOptions, RunOptions
from engine.errors import UsageError
from engine.journal.history import read_run
from engine.journal.store import Journal, decode_event
from engine.models.types import Price
from engine.run.events import RunStarted


@pytest.mark.parametrize(("given", "message"), [
    ({"modle": "fake"}, "RunOptions has no option 'modle'; did you mean 'model'?"),
    ({"max_rounds": "3"}, "run option max_rounds: expected int or None, got str '3'"),
    ({"max_rounds": True}, "run option max_rounds: expected int or None, got bool True"),
    ({"budget_usd": "1"}, "run option budget_usd: expected float or None, got str '1'"),
    ({"allow_hosts": "example.com"}, "run option allow_hosts: expected a list of str, got str"),
    ({"observers": [object()]}, "run option observers: expected a list of RunObserver"),
    ({"person": 3}, "run option person: expected Person or None, got int 3"),
    ({"workspace": 7}, "run option workspace: expected str or Path or None, got int 7"),
    ({"max_rounds": 0}, "--rounds (max_rounds) must be at least 1"),
    ({"budget_usd": -1.0}, "--budget (budget_usd) must be a number of dollars"),
])
def test_a_wrong_option_is_a_usage_error_when_made(given: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError) as info:
        RunOptions(**given)  # type: ignore[arg-type]
    assert str(info.value).startswith(message)


def test_options_are_given_by_name() -> None:
    with pytest.raises(UsageError, match="by name"):
        RunOptions("fake")  # type: ignore[misc]


def test_options_are_frozen_and_lists_kept_as_tuples() -> None:
    options = RunOptions(send_to=["Alice"], allow_hosts=["a.example"], budget_usd=1)
    assert options.send_to == ("Alice",) and options.allow_hosts == ("a.example",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.model = "fake"  # type: ignore[misc]
    changed = dataclasses.replace(options, max_rounds=3)
    assert (changed.max_rounds, changed.send_to, options.max_rounds) == (3, ("Alice",), None)
    with pytest.raises(UsageError, match="no option 'rounds'"):
        dataclasses.replace(options, rounds=3)


def test_options_without_observers_travel_to_other_processes() -> None:
    """A batch's rows get theirs in a Ray worker: the options are pickled there."""
    options = RunOptions(model="fake", price=Price(1e-7, 2e-7), allow_exec=True)
    assert pickle.loads(pickle.dumps(options)) == options


def test_a_subset_refuses_what_it_does_not_take() -> None:
    with pytest.raises(UsageError, match="ReplayOptions has no option 'model'"):
        ReplayOptions(model="fake")  # type: ignore[call-arg]
    assert isinstance(RunOptions(), ResumeOptions) and isinstance(ResumeOptions(), ReplayOptions)


def test_keyword_options_of_earlier_versions_say_how_to_pass_them() -> None:
    sop = api.load(SOPS / "pipeline.sop.yaml")
    with pytest.raises(UsageError) as info:
        api.run(sop, {"idea": "x"}, model="fake")  # type: ignore[call-arg]
    assert "api.run() has no keyword 'model': its options are one RunOptions" in str(info.value)
    assert "RunOptions(model=...)" in str(info.value.hint)
    with pytest.raises(UsageError, match="ResumeOptions"):
        api.resume("nowhere", budget=2.0)  # type: ignore[call-arg]
    with pytest.raises(UsageError, match="must be a RunOptions, not dict"):
        api.run(sop, {"idea": "x"}, {"model": "fake"})  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="must be a RunOptions, not ResumeOptions"):
        api.run(sop, {"idea": "x"}, ResumeOptions(model="fake"))  # type: ignore[arg-type]


def _starts(workspace: Path) -> list[RunStarted]:
    with Journal.open(workspace) as journal:
        events = [decode_event(r) for r in journal.events() if r.type == "RunStarted"]
    return [e for e in events if isinstance(e, RunStarted)]


def test_a_resume_keeps_the_runs_options_except_its_overrides(tmp_path: Path) -> None:
    sop = api.load(SOPS / "pipeline.sop.yaml")
    first = api.run(sop, {"idea": "x"}, RunOptions(model="fake", workspace=tmp_path / "ws",
                                                   max_rounds=1, budget_usd=0.5))
    assert first.status == "max_rounds"
    with pytest.raises(UsageError, match="a resume takes no workspace, send_to"):
        api.resume(tmp_path / "ws", RunOptions(workspace=tmp_path / "elsewhere", send_to=["PM"]))
    resumed = api.resume(tmp_path / "ws", ResumeOptions(max_rounds=10))
    assert (resumed.status, resumed.run_id, resumed.workspace) == ("idle", first.run_id, str((tmp_path / "ws").resolve()))
    _, again = _starts(tmp_path / "ws")
    assert (again.max_rounds, again.budget_usd, again.model, again.run_id) == (10, 0.5, "fake", first.run_id)


def test_a_replay_runs_with_the_recorded_options(tmp_path: Path) -> None:
    sop = api.load(SOPS / "pipeline.sop.yaml")
    api.run(sop, {"idea": "x"}, RunOptions(model="fake", workspace=tmp_path / "ws", max_rounds=2))
    with pytest.raises(UsageError, match="a replay takes no model"):
        api.replay(tmp_path / "ws", tmp_path / "again", RunOptions(model="other"))
    replayed = api.replay(tmp_path / "ws", tmp_path / "again", ReplayOptions(allow_exec=True))
    assert not replayed.diverged and replayed.result.llm_calls == 0
    [start] = _starts(tmp_path / "again")
    assert (start.max_rounds, start.model) == (2, "fake")
    assert read_run(tmp_path / "again").status == read_run(tmp_path / "ws").status
