"""Bad input and signals at the command line get a clear answer, never "internal error":
a budget that is not a number of dollars, text that is not UTF-8, an artifact name no file
system takes, and SIGTERM (handled as Ctrl-C is: the run ends `interrupted`, journaled)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from collections.abc import Callable

import pytest
from run_helpers import ROOT, TESTS, sopctl_env, sopctl_in_process

from engine.cli.commands import main
from engine.journal.store import Journal, journal_path

SOP = TESTS / "sops" / "journal_small.sop.yaml"


@pytest.fixture(autouse=True)
def _no_sopctl_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("SOPCTL_")]:
        monkeypatch.delenv(name)


sopctl = sopctl_in_process


def run_args(ws: Path, *extra: str, sop: Path = SOP) -> list[str]:
    return ["run", str(sop), "--idea", "a snake game", "--model", "fake", "--out", str(ws), *extra]


@pytest.mark.parametrize("budget", ["nan", "inf", "-1", "-inf", "NaN"])
def test_a_budget_that_is_not_dollars_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                 budget: str) -> None:
    ws = tmp_path / "ws"
    code, _, err = sopctl(capsys, *run_args(ws, f"--budget={budget}"))
    assert code == 2
    assert "--budget (budget_usd) must be a number of dollars" in err and "internal error" not in err
    assert not ws.exists()                        # refused before anything was written


def test_resume_refuses_a_nan_budget(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    assert sopctl(capsys, *run_args(ws))[0] == 0
    code, _, err = sopctl(capsys, "resume", str(ws), "--budget=nan")
    assert code == 2 and "must be a number of dollars" in err


@pytest.mark.parametrize("flag", ["--idea", "--input", "--out"])
def test_text_that_is_not_utf8_is_refused_before_anything_is_written(
        tmp_path: Path, flag: str) -> None:
    """A real command line with a byte that is not UTF-8 (Python sees it as a surrogate)."""
    ws = tmp_path / "ws"
    args = {"--idea": [b"--idea", b"caf\xe9 game"], "--input": [b"--input", b"idea=caf\xe9"],
            "--out": [b"--idea", b"x"]}[flag]
    out = os.fsencode(tmp_path) + b"/w\xff" if flag == "--out" else os.fsencode(ws)
    command = [os.fsencode(sys.executable), b"-m", b"engine.cli", b"run", os.fsencode(SOP),
               b"--model", b"fake", *args, b"--out", out]
    result = subprocess.run(command, capture_output=True, timeout=120, check=False, cwd=tmp_path,
                            env=sopctl_env({"PYTHONPATH": str(ROOT)}))
    err = result.stderr.decode("utf-8")
    assert result.returncode == 2, err
    assert f"error: {flag} is not valid UTF-8 text: the byte 0x" in err
    assert "internal error" not in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == []     # no run folder, no empty journal


def test_the_api_refuses_inputs_that_are_not_utf8(tmp_path: Path) -> None:
    from engine import api
    from engine.errors import UsageError

    with pytest.raises(UsageError, match="input 'idea' is not valid UTF-8 text: a lone surrogate U\\+D800"):
        api.run(api.load(SOP), {"idea": "a \ud800 game"}, model="fake", workspace=tmp_path / "ws")
    assert not (tmp_path / "ws").exists()


def test_an_artifact_name_too_long_for_a_file_system_is_a_located_error(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    name = "n" * 300 + ".md"
    sop = tmp_path / "long.sop.yaml"
    sop.write_text(SOP.read_text(encoding="utf-8").replace("path: NOTES.md", f"path: docs/{name}"),
                   encoding="utf-8")
    code, _, err = sopctl(capsys, *run_args(tmp_path / "ws", sop=sop))
    assert code == 1
    assert f"long.sop.yaml:54:15: error[SOP502]: action WriteNotes failed: artifact path 'docs/{name}' " \
           "has a name of 303 bytes; file systems take at most 255" in err
    assert "internal error" not in err


def _wait_for_run_started(ws: Path, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with sqlite3.connect(f"file:{journal_path(ws)}?mode=ro", uri=True) as db:
                if db.execute("SELECT 1 FROM events WHERE type = 'RunStarted'").fetchone():
                    return
        except sqlite3.Error:
            pass                                  # not created yet
        time.sleep(0.05)
    raise AssertionError("the run never journaled RunStarted")


@pytest.mark.skipif(not hasattr(signal, "SIGTERM") or os.name != "posix", reason="POSIX signals")
def test_sigterm_stops_a_run_as_ctrl_c_does(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    env = sopctl_env({"PYTHONPATH": str(ROOT), "SOPCTL_FAKE_LATENCY_MS": "2000"})
    process = subprocess.Popen([sys.executable, "-m", "engine.cli", *run_args(ws)], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_for_run_started(ws, process)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 143, err.decode()
    assert b"Traceback" not in err
    shown = subprocess.run([sys.executable, "-m", "engine.cli", "show", str(ws), "--format", "json"],
                           env=env, capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(shown.stdout)["status"] == "interrupted"
    with Journal.open(ws) as journal:            # ended by sopctl, not killed: RunEnded is there
        ended = [e.data for e in journal.events() if e.type == "RunEnded"]
    assert [e["status"] for e in ended] == ["interrupted"]


def test_a_lone_surrogate_escape_is_a_located_load_error(capsys: pytest.CaptureFixture[str],
                                                         tmp_path: Path) -> None:
    sop = tmp_path / "surrogate.sop.yaml"
    sop.write_text(SOP.read_text(encoding="utf-8").replace(
        '"Write release notes."', '"Write release notes \\ud800."'), encoding="utf-8")
    where = "surrogate.sop.yaml:49:13: error[SOP003]: text holds a lone surrogate (\\ud800)"
    code, out, _ = sopctl(capsys, "validate", str(sop))
    assert code == 1 and where in out, out
    code, _, err = sopctl(capsys, *run_args(tmp_path / "ws", sop=sop))
    assert code == 2 and where in err and "internal error" not in err
    assert not (tmp_path / "ws").exists()         # refused at load, before the run began


def _tamper(sql: str) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        with sqlite3.connect(path) as conn:   # the append-only triggers guard sopctl's own writes
            conn.executescript("DROP TRIGGER events_no_update; DROP TRIGGER events_no_delete;" + sql)
        conn.close()
    return damage


def _cut_in_half(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _garble_the_middle(path: Path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle - 4000: middle + 4000] = b"\xde\xad" * 4000
    path.write_bytes(bytes(data))


_DAMAGES = {
    "cut in half": (_cut_in_half, "torn or corrupted"),
    "garbage in the middle": (_garble_the_middle, "torn or corrupted"),
    "unknown event type": (_tamper("INSERT INTO events (ts, type, key, json) VALUES (1, 'Bogus', NULL, '{}')"),
                           "unknown type 'Bogus'"),
    "field of the wrong type": (_tamper("""UPDATE events SET json = '{"status": "idle", "rounds": "x"}'
                                        WHERE type = 'RunEnded'"""),
                                'rounds = "x", which is not a whole number'),
    "message not an object": (_tamper("""UPDATE events SET json = '{"message": 5}'
                                       WHERE seq = (SELECT MAX(seq) FROM events WHERE type = 'MessagePublished')"""),
                              "message = 5, which is not an object"),
    "artifact not an object": (_tamper("""UPDATE events SET json = replace(json, '"artifacts": [', '"artifacts": [7, ')
                                        WHERE json LIKE '%"artifacts": [{%'"""), "artifacts = [7"),
    "from a newer sopctl": (_tamper("UPDATE meta SET value = '99' WHERE key = 'schema_version'"),
                            "schema version 99; this sopctl reads up to"),
    "an event of a newer sopctl": (_tamper("INSERT INTO events (ts, type, key, json) VALUES (1, 'ToolCalled', NULL, '{}')"),
                                   "cannot be read by this sopctl: journal event"),
    "an empty file": (lambda path: path.write_bytes(b""), "empty or not a sopctl journal"),
}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ws = tmp_path_factory.mktemp("finished") / "good"
    assert main(run_args(ws)) == 0
    return ws


@pytest.mark.parametrize("damage", list(_DAMAGES))
def test_a_damaged_journal_is_named_and_the_other_runs_still_list(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, finished_run: Path, damage: str) -> None:
    """Damage by hand or by disk: `show`, `replay` and `resume` name the file (exit 2, before
    anything runs); `runs` lists the damaged run among the others."""
    damage_file, words = _DAMAGES[damage]
    shutil.copytree(finished_run, tmp_path / "good")
    bad = tmp_path / "bad"
    shutil.copytree(finished_run, bad)
    for side_file in journal_path(bad).parent.glob("journal.sqlite-*"):
        side_file.unlink()
    damage_file(journal_path(bad))
    for command in (["show", str(bad)], ["show", str(bad), "--prompts"],
                    ["replay", str(bad), "--out", str(tmp_path / "re")], ["resume", str(bad)]):
        code, _, err = sopctl(capsys, *command)
        assert code == 2, (command, err)
        assert str(journal_path(bad)) in err and "internal error" not in err, (command, err)
        if command[0] == "show":
            assert words in err, err
    assert not (tmp_path / "re").exists()
    code, out, _ = sopctl(capsys, "runs", str(tmp_path))
    assert code == 0
    lines = {line.split()[-1] if "unreadable" not in line else "bad": line for line in out.splitlines()[1:]}
    assert "idle" in lines[str(tmp_path / "good")] and words in lines["bad"]


def test_an_unreadable_prompt_is_named_and_spoils_nothing_else(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, finished_run: Path) -> None:
    """A damaged row of the prompts (`exchanges`): `show --prompts` names the journal (exit 2);
    `show` and `replay` go on, since the answers are intact."""
    bad = tmp_path / "bad"
    shutil.copytree(finished_run, bad)
    with sqlite3.connect(journal_path(bad)) as conn:
        conn.execute("UPDATE exchanges SET data = x'00112233'")
    conn.close()
    code, _, err = sopctl(capsys, "show", str(bad), "--prompts")
    assert code == 2 and str(journal_path(bad)) in err and "cannot be read" in err, err
    assert sopctl(capsys, "show", str(bad))[0] == 0
    code, _, err = sopctl(capsys, "replay", str(bad), "--out", str(tmp_path / "re"))
    assert code == 0, err


@pytest.mark.parametrize("what", ["a file", "a folder without a journal"])
def test_a_run_folder_that_is_not_a_run(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                        what: str) -> None:
    target = tmp_path / "not-a-run"
    if what == "a file":
        target.write_text("hello", encoding="utf-8")
    else:
        target.mkdir()
    for command in (["show", str(target)], ["show", str(target), "--prompts"],
                    ["resume", str(target)], ["replay", str(target), "--out", str(tmp_path / "re")],
                    ["answer", str(target), "--text", "x"]):
        code, _, err = sopctl(capsys, *command)
        assert code == 2 and str(target) in err and "Traceback" not in err, (command, err)
        assert "not a folder" in err if what == "a file" else "has no journal" in err
