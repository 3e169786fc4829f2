"""A tool loop killed mid-way (kill -9 at journal writes) resumes to the same end, never runs
a journaled tool call twice, and a replay runs no tool and calls no model.

The run is the shipped MGX team on `fake` (a TeamLeader dispatching with `team`, members
writing files with `editor`), as a real `sopctl run` process forked from one that imported
sopctl; it dies right after the N-th journal event or answer (tool results are answers too).
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from run_helpers import ROOT, ForkedSopctl, here

from engine.journal.run_folder import journal_path

SOP = ROOT / "sops" / "mgx_team.sop.yaml"


@pytest.fixture(autouse=True)
def _no_sopctl_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("SOPCTL_")]:
        monkeypatch.delenv(name)


def run_args(ws: Path) -> list[str]:
    return ["run", str(SOP), "--idea", "a 2048 game", "--model", "fake", "--out", str(ws), "--format", "json",
            "--allow-exec"]   # Alex's terminal and David's notebook


def files(ws: Path) -> dict[str, bytes]:
    return {p.relative_to(ws).as_posix(): p.read_bytes() for p in ws.rglob("*")
            if p.is_file() and ".sopctl" not in p.parts}


def rows(ws: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(journal_path(ws))
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def tool_runs(ws: Path) -> Counter[str]:
    """Journaled tool calls (editor) -> how often the tool really ran (not reused)."""
    found: Counter[str] = Counter()
    for (data,) in rows(ws, "SELECT json FROM events WHERE type = 'ToolCalled' ORDER BY seq"):
        event = json.loads(data)
        if event["tool"].startswith("editor.") and not event["reused"]:
            found[event["call"]] += 1
    return found


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory, forked_sopctl: ForkedSopctl) -> dict[str, Any]:
    ws = tmp_path_factory.mktemp("tools") / "run"
    proc = forked_sopctl(*run_args(ws))
    assert proc.returncode == 0, proc.stderr
    types = [t for (t,) in rows(ws, "SELECT type FROM events ORDER BY seq")]
    origins = [o for (o,) in rows(ws, "SELECT origin FROM answers ORDER BY rowid")]
    return {"ws": ws, "result": json.loads(proc.stdout), "files": files(ws), "types": types,
            "origins": origins}


def crash_points(baseline: dict[str, Any]) -> list[tuple[str, int]]:
    """Right after the first and the last tool call, answer and completion, and the first
    and the last journaled tool result."""
    types, origins = baseline["types"], baseline["origins"]
    points = []
    for kind in ("ToolCalled", "ModelAnswered", "ActionCompleted"):
        seqs = [n for n, t in enumerate(types, 1) if t == kind]
        points += [("SOPCTL_CRASH_AFTER_EVENT", seqs[0]), ("SOPCTL_CRASH_AFTER_EVENT", seqs[-1])]
    tools = [n for n, o in enumerate(origins, 1) if o == "tool"]
    points += [("SOPCTL_CRASH_AFTER_ANSWER", tools[0]), ("SOPCTL_CRASH_AFTER_ANSWER", tools[-1])]
    return sorted(set(points))


def test_the_baseline_runs_tools(baseline: dict[str, Any]) -> None:
    assert baseline["result"]["status"] == "idle"
    assert "tool" in baseline["origins"] and "ToolCalled" in baseline["types"]
    assert set(tool_runs(baseline["ws"]).values()) == {1}


def test_kill_mid_tool_loop_then_resume(baseline: dict[str, Any], tmp_path: Path,
                                        forked_sopctl: ForkedSopctl,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    for hook, n in crash_points(baseline):
        where = f"{hook}={n}"
        ws = tmp_path / f"{hook[-6:]}{n}"
        crashed = forked_sopctl(*run_args(ws), env={hook: str(n)})
        assert crashed.returncode == 137, f"{where}: {crashed.stderr}"
        resumed = here(capsys, "resume", str(ws), "--format", "json", "--allow-exec")
        assert resumed.returncode == 0, f"{where}: {resumed.stderr}"
        result = json.loads(resumed.stdout)
        assert result["status"] == "idle", where
        assert result["history"] == baseline["result"]["history"], where
        assert files(ws) == baseline["files"], where
        assert set(tool_runs(ws).values()) <= {1}, f"{where}: a journaled tool call ran twice"


def test_a_deleted_file_is_written_back_on_resume(baseline: dict[str, Any], tmp_path: Path,
                                                  forked_sopctl: ForkedSopctl,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    ws = tmp_path / "run"
    last_tool = [n for n, t in enumerate(baseline["types"], 1) if t == "ToolCalled"][-1]
    assert forked_sopctl(*run_args(ws), env={"SOPCTL_CRASH_AFTER_EVENT": str(last_tool)}).returncode == 137
    written = [p for p in files(ws)]
    assert written
    (ws / written[0]).unlink()
    resumed = here(capsys, "resume", str(ws), "--format", "json", "--allow-exec")
    assert resumed.returncode == 0, resumed.stderr
    assert files(ws) == baseline["files"]
    assert set(tool_runs(ws).values()) <= {1}


def test_replay_runs_no_tool_and_calls_no_model(baseline: dict[str, Any], tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "replay"
    replayed = here(capsys, "replay", str(baseline["ws"]), "--out", str(out), "--format", "json")
    assert replayed.returncode == 0, replayed.stderr
    result = json.loads(replayed.stdout)
    assert result["llm_calls"] == 0 and result["history"] == baseline["result"]["history"]
    assert files(out) == baseline["files"]
    assert tool_runs(out) == Counter()     # every editor result came from the journal
