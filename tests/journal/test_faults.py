"""Fault injection: kill a real `sopctl run` at journal writes, resume, compare.

The process dies with `os._exit(137)` right after the N-th journal event (or answer) is
committed (`SOPCTL_CRASH_AFTER_EVENT` / `SOPCTL_CRASH_AFTER_ANSWER`, see engine.journal.store),
which is what a kill -9 at that instant leaves behind. After `sopctl resume` the run must
be indistinguishable from an uninterrupted one: same history, same artifact bytes, every
action completed exactly once, and at most one extra model call per crash.

The runs are real processes forked from one that imported sopctl (the `forked_sopctl`
fixture: no Python start-up per run); one run gets a real SIGKILL; the resumes run in this
process. The fast suite crashes at a sample of the points that covers every kind of journal
write; `-m slow` crashes at every one of them.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable

import pytest
from run_helpers import ROOT, TESTS, ForkedSopctl, here, sopctl_env

from engine.cli.commands import main
from engine.journal.history import read_run
from engine.journal.store import journal_path

SOP = TESTS / "sops" / "journal_small.sop.yaml"


@pytest.fixture(autouse=True)
def _no_sopctl_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The commands run here see no SOPCTL_ setting of the shell (crash hooks, models)."""
    for name in [n for n in os.environ if n.startswith("SOPCTL_")]:
        monkeypatch.delenv(name)


def run_args(ws: Path) -> list[str]:
    return ["run", str(SOP), "--idea", "a snake game", "--model", "fake", "--out", str(ws),
            "--format", "json"]


def files(ws: Path) -> dict[str, bytes]:
    """Every file the run made (the journal aside)."""
    return {p.relative_to(ws).as_posix(): p.read_bytes() for p in ws.rglob("*")
            if p.is_file() and ".sopctl" not in p.parts}


def completed_actions(ws: Path) -> dict[str, int]:
    """Idempotency keys without the run id -> how often the journal says they completed."""
    return {key.split("/", 1)[1]: n for key, n in read_run(ws).completions.items()}


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory, forked_sopctl: ForkedSopctl) -> dict[str, Any]:
    """An uninterrupted `sopctl run` (fake model, no latency), and what its journal holds."""
    ws = tmp_path_factory.mktemp("baseline") / "run"
    proc = forked_sopctl(*run_args(ws))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    conn = sqlite3.connect(journal_path(ws))
    event_types = [t for (t,) in conn.execute("SELECT type FROM events ORDER BY seq")]
    rounds = [(seq, json.loads(data)["active_roles"]) for seq, data in conn.execute(
        "SELECT seq, json FROM events WHERE type = 'RoundStarted' ORDER BY seq")]
    answer_actions = [a for (a,) in conn.execute("SELECT action FROM answers ORDER BY rowid")]
    conn.close()
    return {"ws": ws, "result": result, "files": files(ws), "events": len(event_types),
            "answers": len(answer_actions), "event_types": event_types, "rounds": rounds,
            "answer_actions": answer_actions, "completed": completed_actions(ws)}


def event_points(baseline: dict[str, Any]) -> list[int]:
    """Crash points that cover every kind of event write: the first and the last event of each
    type (so the first event, the first answer, the first completion, ... and the last round's,
    RunEnded the last point), the event right before RunEnded, and, in a round of several
    roles, the point where one role's action is complete and the next one's is not."""
    types = baseline["event_types"]
    points = {len(types) - 1}
    for kind in set(types):
        seqs = [n for n, t in enumerate(types, 1) if t == kind]
        points |= {seqs[0], seqs[-1]}
    for seq, roles in baseline["rounds"]:
        if len(roles) > 1:
            points.add(types.index("ActionCompleted", seq) + 1)   # types[seq] is event seq + 1
    return sorted(points)


def answer_points(baseline: dict[str, Any]) -> list[int]:
    """The first answer, the last, and the first and the last answer of each action asked
    more than once (a react role: its state choice, its work, its next choice)."""
    actions = baseline["answer_actions"]
    points = {1, len(actions)}
    for action in set(actions):
        seqs = [n for n, a in enumerate(actions, 1) if a == action]
        if len(seqs) > 1:
            points |= {seqs[0], seqs[-1]}
    return sorted(points)


def crash_then_resume(forked_sopctl: ForkedSopctl, capsys: pytest.CaptureFixture[str], ws: Path,
                      hook: str, n: int) -> tuple[subprocess.CompletedProcess[str], ...]:
    crashed = forked_sopctl(*run_args(ws), env={hook: str(n)})
    resumed = here(capsys, "resume", str(ws), "--format", "json")
    return crashed, resumed


def assert_same_as_baseline(ws: Path, resumed: subprocess.CompletedProcess[str],
                            baseline: dict[str, Any], where: str) -> None:
    assert resumed.returncode == 0, f"{where}: {resumed.stderr}"
    result = json.loads(resumed.stdout)
    assert result["status"] == "idle", where
    assert result["history"] == baseline["result"]["history"], where
    assert result["artifacts"] == baseline["result"]["artifacts"], where
    assert files(ws) == baseline["files"], where
    state = read_run(ws)
    assert state.status == "idle", where
    assert [dict(m, id=m["id"]) for m in state.history] == state.history
    assert len(state.history) == len(baseline["result"]["history"]), where
    done = completed_actions(ws)
    assert done == baseline["completed"], where          # every action exactly once
    assert set(done.values()) == {1}, where
    assert state.usage.llm_calls <= baseline["answers"] + 1, where


def test_baseline_is_a_complete_run(baseline: dict[str, Any]) -> None:
    assert baseline["result"]["status"] == "idle"
    assert baseline["events"] >= 20 and baseline["answers"] >= 6
    assert len(baseline["files"]) == 5


SAMPLES: dict[str, Callable[[dict[str, Any]], list[int]]] = {
    "SOPCTL_CRASH_AFTER_EVENT": event_points, "SOPCTL_CRASH_AFTER_ANSWER": answer_points}


@pytest.mark.parametrize("points", ["sample", pytest.param("every", marks=pytest.mark.slow)])
@pytest.mark.parametrize("hook, count", [("SOPCTL_CRASH_AFTER_EVENT", "events"),
                                         ("SOPCTL_CRASH_AFTER_ANSWER", "answers")])
def test_crash_at_journal_writes_then_resume(baseline: dict[str, Any], tmp_path: Path,
                                             forked_sopctl: ForkedSopctl,
                                             capsys: pytest.CaptureFixture[str],
                                             hook: str, count: str, points: str) -> None:
    every = list(range(1, baseline[count] + 1))
    chosen = SAMPLES[hook](baseline) if points == "sample" else every
    assert chosen and set(chosen) <= set(every)          # points this run really writes
    for n in chosen:
        where = f"{hook}={n}"
        crashed, resumed = crash_then_resume(forked_sopctl, capsys, tmp_path / f"crash{n}", hook, n)
        assert crashed.returncode == 137, f"{where}: {crashed.stderr}"
        assert_same_as_baseline(tmp_path / f"crash{n}", resumed, baseline, where)


def test_two_crashes_in_a_row(baseline: dict[str, Any], tmp_path: Path,
                              forked_sopctl: ForkedSopctl, capsys: pytest.CaptureFixture[str]) -> None:
    """A resume that itself dies is resumed again; still one completion per action."""
    ws = tmp_path / "run"
    assert forked_sopctl(*run_args(ws), env={"SOPCTL_CRASH_AFTER_EVENT": "9"}).returncode == 137
    again = forked_sopctl("resume", str(ws), env={"SOPCTL_CRASH_AFTER_EVENT": "12"})
    assert again.returncode == 137
    show = here(capsys, "show", str(ws), "--format", "json")
    assert show.returncode == 0 and json.loads(show.stdout)["status"] == "interrupted"
    resumed = here(capsys, "resume", str(ws), "--format", "json")
    assert_same_as_baseline(ws, resumed, baseline, "two crashes")
    assert read_run(ws).usage.llm_calls <= baseline["answers"] + 2


def test_sigkill_mid_run_then_resume(baseline: dict[str, Any], tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A real SIGKILL while a model call is in flight (fake with latency)."""
    ws = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", *run_args(ws)], cwd=ROOT,
                            env=sopctl_env({"SOPCTL_FAKE_LATENCY_MS": "150"}),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for_answers(ws, 2, proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert read_run(ws).status == "interrupted"
    resumed = here(capsys, "resume", str(ws), "--format", "json")
    assert_same_as_baseline(ws, resumed, baseline, "SIGKILL")
    assert json.loads(resumed.stdout)["llm_calls"] < baseline["answers"]


def _wait_for_answers(ws: Path, n: int, proc: subprocess.Popen[bytes]) -> None:
    """Poll the journal (not the clock) until n answers are durable, or the run ended."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            conn = sqlite3.connect(journal_path(ws))
            have = conn.execute("SELECT count(*) FROM answers").fetchone()[0]
            conn.close()
            if have >= n:
                return
        except sqlite3.Error:
            pass
        time.sleep(0.02)
    pytest.fail("the run never journaled enough answers to be killed mid-way")


# --- damaged or unusable journals: a clear error, never a corrupted run --------------------


def test_torn_journal_is_refused_clearly(baseline: dict[str, Any], tmp_path: Path,
                                         forked_sopctl: ForkedSopctl,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    ws = tmp_path / "run"
    assert forked_sopctl(*run_args(ws), env={"SOPCTL_CRASH_AFTER_EVENT": "10"}).returncode == 137
    path = journal_path(ws)
    for extra in path.parent.glob("journal.sqlite-*"):     # fold the WAL away, then tear
        extra.unlink()
    path.write_bytes(path.read_bytes()[:1500])
    for command in (["show", str(ws)], ["resume", str(ws)], ["replay", str(ws), "--out",
                                                             str(tmp_path / "re")]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert "journal" in err and "Traceback" not in err and "internal error" not in err
    assert main(["runs", str(tmp_path)]) == 0
    assert "unreadable" in capsys.readouterr().out


def test_resume_refuses_a_changed_sop_unless_forced(baseline: dict[str, Any], tmp_path: Path,
                                                    forked_sopctl: ForkedSopctl,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    sop = tmp_path / "copy.sop.yaml"
    sop.write_text(SOP.read_text())
    ws = tmp_path / "run"
    crashed = forked_sopctl("run", str(sop), "--idea", "a snake game", "--model", "fake", "--out",
                            str(ws), env={"SOPCTL_CRASH_AFTER_EVENT": "12"})
    assert crashed.returncode == 137
    sop.write_text(SOP.read_text().replace("tiny software company", "small software company"))
    before = journal_path(ws).read_bytes()
    assert main(["resume", str(ws)]) == 2
    err = capsys.readouterr().err
    assert "changed since the run started" in err and "--force" in err
    assert journal_path(ws).read_bytes() == before           # refused before writing anything
    assert main(["resume", str(ws), "--force", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "idle"


def test_run_into_a_workspace_of_another_sop_is_refused(baseline: dict[str, Any], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "other.sop.yaml"
    other.write_text(SOP.read_text().replace("name: journal_small", "name: journal_other"))
    proc = here(capsys, "run", str(other), "--idea", "x", "--model", "fake", "--out",
                str(baseline["ws"]))
    assert proc.returncode == 2, proc.stderr
    assert "another SOP" in proc.stderr and "Traceback" not in proc.stderr
    assert read_run(baseline["ws"]).invocations == 1


def _crippled_connect(kind: str) -> Any:
    """A journal connection that cannot write: read-only, or a disk with no page left."""
    import engine.journal.store as journal_module

    real = journal_module._connect

    def connect(path: Path, *, readonly: bool) -> sqlite3.Connection:
        conn = real(path, readonly=readonly)
        if not readonly and kind == "readonly":
            conn.execute("PRAGMA query_only = ON")
        elif not readonly:
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            conn.execute(f"PRAGMA max_page_count = {pages}")
        return conn

    return connect


@pytest.mark.parametrize("kind, words", [("readonly", "read-only"), ("full", "disk is full")])
def test_unwritable_journal_then_resume(baseline: dict[str, Any], tmp_path: Path, kind: str,
                                        words: str, monkeypatch: pytest.MonkeyPatch,
                                        forked_sopctl: ForkedSopctl,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The resume cannot write: a clear error; once fixed, a resume completes the run."""
    ws = tmp_path / "run"
    assert forked_sopctl(*run_args(ws), env={"SOPCTL_CRASH_AFTER_EVENT": "14"}).returncode == 137
    monkeypatch.setattr("engine.journal.store._connect", _crippled_connect(kind))
    code = main(["resume", str(ws), "--format", "json"])
    captured = capsys.readouterr()
    assert code in (1, 2) and words in captured.err + captured.out
    assert "Traceback" not in captured.err and "internal error" not in captured.err
    monkeypatch.undo()
    assert read_run(ws).status == "interrupted"
    resumed = here(capsys, "resume", str(ws), "--format", "json")
    assert_same_as_baseline(ws, resumed, baseline, kind)


def test_torn_tail_of_the_wal_loses_only_the_last_commit(baseline: dict[str, Any], tmp_path: Path,
                                                        forked_sopctl: ForkedSopctl,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A write cut mid-way (power cut) leaves a torn WAL frame: SQLite's checksums drop it,
    the journal reads as of the commit before, and resume still completes the run."""
    ws = tmp_path / "run"
    assert forked_sopctl(*run_args(ws), env={"SOPCTL_CRASH_AFTER_EVENT": "20"}).returncode == 137
    wal = journal_path(ws).with_name("journal.sqlite-wal")
    assert wal.is_file() and wal.stat().st_size > 4096
    before = len(read_run(ws).history)
    with wal.open("r+b") as handle:
        handle.truncate(wal.stat().st_size - 100)
    torn = read_run(ws)
    assert torn.status == "interrupted" and len(torn.history) <= before
    resumed = here(capsys, "resume", str(ws), "--format", "json")
    assert_same_as_baseline(ws, resumed, baseline, "torn WAL")
