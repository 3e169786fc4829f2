"""Kill -9 in a tool loop across two activations, then resume: the same plan and working
memory, and no model answer paid twice.

`tests/sops/tool_state.sop.yaml` on `fake`: a Leader and a Member that each run their tool
loop twice, so each second activation's prompts rest on the state the first left. A real
`sopctl run` process (forked, see run_helpers.ForkedSopctl) dies right after a journal write.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from run_helpers import SOPS, ForkedSopctl, here

from engine.journal.run_folder import journal_path

SOP = SOPS / "tool_state.sop.yaml"


@pytest.fixture(autouse=True)
def _no_sopctl_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("SOPCTL_")]:
        monkeypatch.delenv(name)


def run_args(ws: Path) -> list[str]:
    return ["run", str(SOP), "--idea", "a game", "--model", "fake", "--out", str(ws), "--format", "json"]


def rows(ws: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(journal_path(ws))
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def final_states(ws: Path) -> dict[str, Any]:
    """Each role's state as its last finished action left it (plan, memory, turn, stop)."""
    found: dict[str, Any] = {}
    for (data,) in rows(ws, "SELECT json FROM events WHERE type = 'ActionCompleted' ORDER BY seq"):
        event = json.loads(data)
        found[event["role"]] = event["state"]
    return found


def paid(ws: Path) -> int:
    return len(rows(ws, "SELECT 1 FROM answers WHERE origin = 'model'"))


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory, forked_sopctl: ForkedSopctl) -> dict[str, Any]:
    ws = tmp_path_factory.mktemp("state") / "run"
    proc = forked_sopctl(*run_args(ws))
    assert proc.returncode == 0, proc.stderr
    types = [t for (t,) in rows(ws, "SELECT type FROM events ORDER BY seq")]
    return {"result": json.loads(proc.stdout), "states": final_states(ws), "types": types,
            "answers": len(rows(ws, "SELECT 1 FROM answers"))}


def test_the_baseline_carries_state_into_second_activations(baseline: dict[str, Any]) -> None:
    assert baseline["result"]["status"] == "idle"
    member = baseline["states"]["Member"]
    assert member["turn"] == 2
    assert [e["kind"] for e in member["memory"]].count("step") == 4    # both loops' steps


def test_kill_in_a_tool_loop_then_resume_keeps_plan_and_memory(
        baseline: dict[str, Any], tmp_path: Path, forked_sopctl: ForkedSopctl,
        capsys: pytest.CaptureFixture[str]) -> None:
    completions = [n for n, t in enumerate(baseline["types"], 1) if t == "ActionCompleted"]
    points = [("SOPCTL_CRASH_AFTER_EVENT", n) for n in completions[:3]]
    points += [("SOPCTL_CRASH_AFTER_ANSWER", n) for n in (1, baseline["answers"] // 2, baseline["answers"] - 1)]
    for hook, n in points:
        where = f"{hook}={n}"
        ws = tmp_path / f"{hook[-6:]}{n}"
        assert forked_sopctl(*run_args(ws), env={hook: str(n)}).returncode == 137, where
        before = paid(ws)
        resumed = here(capsys, "resume", str(ws), "--format", "json")
        assert resumed.returncode == 0, f"{where}: {resumed.stderr}"
        result = json.loads(resumed.stdout)
        assert result["history"] == baseline["result"]["history"], where
        assert final_states(ws) == baseline["states"], where
        # every answer on disk was reused: the resume paid only for the rest
        assert before + result["llm_calls"] == baseline["result"]["llm_calls"], where
