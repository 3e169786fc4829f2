"""What a run's text summary tells a person: why it stopped (once), and what to run next."""

from __future__ import annotations

import pytest

from engine.cli.report import summary
from engine.models.types import Usage
from engine.run.events import RunStatus
from engine.run.team import RunResult


def result(status: RunStatus, error: str = "") -> RunResult:
    return RunResult(run_id="r1", status=status, rounds=3, usage=Usage(), workspace="runs/my run",
                     artifacts=[], error=error)


def test_an_interrupted_run_says_so_once_and_how_to_go_on() -> None:
    text = summary(result(RunStatus.INTERRUPTED, "interrupted"))
    assert "status:    interrupted\n" in text      # not "interrupted (interrupted)"
    assert "sopctl resume 'runs/my run'" in text   # quoted: it can be pasted


def test_every_run_ends_with_show_and_report() -> None:
    text = summary(result(RunStatus.IDLE))
    assert "next:      sopctl show 'runs/my run'" in text and "sopctl report 'runs/my run'" in text
    assert "resume" not in text                    # an idle run is done


@pytest.mark.parametrize(("status", "hint"), [(RunStatus.FAILED, "sopctl resume 'runs/my run'    #"),
                                              (RunStatus.BUDGET, "--budget USD"),
                                              (RunStatus.MAX_ROUNDS, "--rounds N")])
def test_a_run_that_stopped_short_says_how_to_pick_it_up(status: RunStatus, hint: str) -> None:
    text = summary(result(status, "it stopped"))
    assert f"status:    {status} (it stopped)" in text and hint in text
