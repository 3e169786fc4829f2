"""A journal whose text is not UTF-8 (damaged, or planted in a shared run folder): every
command that reads it says which journal and what is wrong, exit 2, never an internal
UnicodeDecodeError; `sopctl runs` lists it as unreadable and the other runs as usual."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from engine.cli.commands import main
from engine.journal.run_folder import journal_path
from run_helpers import SOPS

DAMAGE = {
    "an event": "UPDATE events SET json = CAST(X'7b22ff22' AS TEXT) WHERE seq = 3",
    "an event type": "UPDATE events SET type = CAST(X'ff' AS TEXT) WHERE seq = 2",
    "the meta table": "UPDATE meta SET value = CAST(X'ff' AS TEXT)",
    "an answer": "UPDATE answers SET text = CAST(X'ff00fe' AS TEXT)",
}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("corrupt") / "run"
    assert main(["run", str(SOPS / "pipeline.sop.yaml"), "--idea", "x", "--model", "fake",
                 "--out", str(run)]) == 0
    return run


def _damaged(recorded: Path, folder: Path, sql: str) -> Path:
    shutil.copytree(recorded, folder)
    db = sqlite3.connect(journal_path(folder))
    for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        db.execute(f"DROP TRIGGER {name}")         # what sopctl keeps append-only, a hand can edit
    db.execute(sql)
    db.commit()
    db.close()
    return folder


@pytest.mark.parametrize("where", ["an event", "an event type", "the meta table"])
@pytest.mark.parametrize("command", [["show"], ["resume"], ["report"], ["replay", "--out", "{tmp}/re"]])
def test_every_reader_names_the_journal_and_the_damage(recorded: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str],
                                                       where: str, command: list[str]) -> None:
    run = _damaged(recorded, tmp_path / "run", DAMAGE[where])
    args = [command[0], str(run), *(a.format(tmp=tmp_path) for a in command[1:])]
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"cannot read journal {journal_path(run)}" in err and "Could not decode to UTF-8" in err
    assert "Traceback" not in err and "UnicodeDecodeError" not in err


def test_a_damaged_answer_is_named_by_show(recorded: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    run = _damaged(recorded, tmp_path / "run", DAMAGE["an answer"])
    capsys.readouterr()
    assert main(["show", str(run)]) == 2
    assert f"cannot read journal {journal_path(run)}" in capsys.readouterr().err


def test_runs_lists_a_damaged_journal_as_unreadable_and_the_others_as_usual(
        recorded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copytree(recorded, tmp_path / "good")
    for index, sql in enumerate(DAMAGE.values()):
        _damaged(recorded, tmp_path / f"bad{index}", sql)
    capsys.readouterr()
    assert main(["runs", str(tmp_path), "--format", "json"]) == 0
    rows = {Path(row["dir"]).name: row for row in json.loads(capsys.readouterr().out)}
    assert rows["good"]["status"] == "idle"
    assert {rows[f"bad{i}"]["status"] for i in range(len(DAMAGE))} == {"unreadable"}


PLANTED_META = {
    "nested past the decoder": "[" * 100_000 + "]" * 100_000,
    "not JSON": "[/etc",
    "an object": '{"a": 1}',
    "a string": '"/etc"',
}


@pytest.mark.parametrize("value", sorted(PLANTED_META))
@pytest.mark.parametrize("command", [["show"], ["resume"], ["replay", "--out", "{tmp}/re"], ["runs"]])
def test_a_planted_include_dirs_is_a_clear_error_or_ignored(recorded: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str],
                                                            value: str, command: list[str]) -> None:
    """The meta row resume takes include folders from, planted in a shared run folder: the
    commands that need it refuse it naming the journal; the others read on; never an
    internal error."""
    sql = f"UPDATE meta SET value = '{PLANTED_META[value]}' WHERE key = 'include_dirs'"
    run = _damaged(recorded, tmp_path / "run", sql)
    db = sqlite3.connect(journal_path(run))
    if not db.execute("SELECT count(*) FROM meta WHERE key = 'include_dirs'").fetchone()[0]:
        db.execute("INSERT INTO meta (key, value) VALUES ('include_dirs', ?)", (PLANTED_META[value],))
        db.commit()
    db.close()
    target = str(tmp_path) if command == ["runs"] else str(run)
    capsys.readouterr()
    code = main([command[0], target, *(a.format(tmp=tmp_path) for a in command[1:])])
    err = capsys.readouterr().err
    assert "internal error" not in err and "Traceback" not in err
    if command[0] in ("resume", "replay"):
        assert code == 2 and "include_dirs" in err and str(journal_path(run)) in err
    else:
        assert code == 0, err
