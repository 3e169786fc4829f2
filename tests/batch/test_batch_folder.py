"""A batch folder with planted links: nothing a batch writes goes through one.

A batch folder may be someone else's (shared, unpacked) and rerunning it is invited, so
`rows/`, each `rows/NNNNNN/` (workspace, journal, lock, artifacts), `results.jsonl` and its
temporary twin are never followed through a link: each is refused with a message naming it,
and the link's target is left exactly as it was."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from engine.cli.commands import main
from run_helpers import SOPS

PIPELINE = SOPS / "pipeline.sop.yaml"


def _rows(tmp_path: Path, count: int = 2) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"idea": f"idea {i}"}) + "\n" for i in range(count)), encoding="utf-8")
    return path


def _batch(tmp_path: Path, out: Path, count: int = 2) -> int:
    return main(["batch", str(PIPELINE), "--inputs", str(_rows(tmp_path, count)), "--model", "fake",
                 "--out", str(out)])


def _lines(out: Path) -> dict[int, dict[str, object]]:
    lines = (json.loads(raw) for raw in (out / "results.jsonl").read_text(encoding="utf-8").splitlines())
    return {int(line["row"]): line for line in lines}


def _tree(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` with its bytes: what the link's target held."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """A folder outside the batch, holding one file of the user's."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    (folder / "mine.txt").write_text("the user's own file\n", encoding="utf-8")
    return folder


def test_a_planted_rows_link_stops_the_batch_before_any_row(
        tmp_path: Path, elsewhere: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "b"
    out.mkdir()
    (out / "rows").symlink_to(elsewhere, target_is_directory=True)
    before = _tree(elsewhere)
    assert _batch(tmp_path, out) == 2
    err = capsys.readouterr().err
    assert f"batch folder entry {out / 'rows'} is a symlink; refused" in err
    assert "Traceback" not in err
    assert _tree(elsewhere) == before


def test_a_planted_row_folder_link_fails_that_row_alone(tmp_path: Path, elsewhere: Path) -> None:
    out = tmp_path / "b"
    (out / "rows").mkdir(parents=True)
    (out / "rows" / "000001").symlink_to(elsewhere, target_is_directory=True)
    before = _tree(elsewhere)
    assert _batch(tmp_path, out) == 1
    lines = _lines(out)
    assert lines[1]["status"] == "failed"
    assert "rows/000001 is a symlink; refused" in str(lines[1]["error"])
    assert lines[2]["status"] == "idle"                       # the other rows run
    assert _tree(elsewhere) == before and not (elsewhere / ".sopctl").exists()


def test_a_row_folder_that_is_a_file_fails_that_row(tmp_path: Path) -> None:
    out = tmp_path / "b"
    (out / "rows").mkdir(parents=True)
    (out / "rows" / "000001").write_text("not a folder", encoding="utf-8")
    assert _batch(tmp_path, out, count=1) == 1
    assert "rows/000001 is not a folder; refused" in str(_lines(out)[1]["error"])


@pytest.mark.parametrize("planted", [".sopctl", ".sopctl/journal.sqlite", ".sopctl/writer.lock",
                                     ".sopctl/journal.sqlite-wal"])
def test_a_planted_link_in_a_rows_run_folder_fails_that_row(tmp_path: Path, elsewhere: Path,
                                                            planted: str) -> None:
    out = tmp_path / "b"
    row = out / "rows" / "000001"
    (row / ".sopctl").mkdir(parents=True)
    if planted == ".sopctl":
        (row / ".sopctl").rmdir()
        (row / ".sopctl").symlink_to(elsewhere, target_is_directory=True)
    else:
        (row / planted).symlink_to(elsewhere / "mine.txt")
    before = _tree(elsewhere)
    assert _batch(tmp_path, out, count=1) == 1
    line = _lines(out)[1]
    assert line["status"] == "failed" and "is a symlink; refused" in str(line["error"])
    assert _tree(elsewhere) == before


def test_a_planted_artifact_folder_link_is_not_written_through(tmp_path: Path, elsewhere: Path) -> None:
    out = tmp_path / "b"
    row = out / "rows" / "000001"
    row.mkdir(parents=True)
    (row / "docs").symlink_to(elsewhere, target_is_directory=True)     # the SOP writes docs/prd.json
    before = _tree(elsewhere)
    assert _batch(tmp_path, out, count=1) == 1
    line = _lines(out)[1]
    assert line["status"] == "failed" and "goes through a symlink" in str(line["error"])
    assert _tree(elsewhere) == before


def test_a_planted_results_link_is_refused_and_its_target_kept(
        tmp_path: Path, elsewhere: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "b"
    out.mkdir()
    (out / "results.jsonl").symlink_to(elsewhere / "mine.txt")
    assert _batch(tmp_path, out) == 2
    err = capsys.readouterr().err
    assert f"batch folder entry {out / 'results.jsonl'} is a symlink; refused" in err
    assert (elsewhere / "mine.txt").read_text(encoding="utf-8") == "the user's own file\n"
    assert not (out / "rows" / "000001").exists()                  # refused before any row ran


def test_a_hard_linked_results_file_is_not_appended_to(
        tmp_path: Path, elsewhere: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "b"
    out.mkdir()
    os.link(elsewhere / "mine.txt", out / "results.jsonl")
    assert _batch(tmp_path, out) == 2
    assert "has 2 hard links; refused" in capsys.readouterr().err
    assert (elsewhere / "mine.txt").read_text(encoding="utf-8") == "the user's own file\n"


def test_a_fifo_as_results_file_is_refused_without_hanging(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "b"
    out.mkdir()
    os.mkfifo(out / "results.jsonl")
    assert _batch(tmp_path, out) == 2
    assert "results.jsonl is not a plain file; refused" in capsys.readouterr().err


def test_a_planted_temporary_results_link_is_removed_not_written(tmp_path: Path, elsewhere: Path) -> None:
    out = tmp_path / "b"
    out.mkdir()
    (out / ".results.jsonl.tmp").symlink_to(elsewhere / "mine.txt")
    assert _batch(tmp_path, out) == 0
    assert (elsewhere / "mine.txt").read_text(encoding="utf-8") == "the user's own file\n"
    assert sorted(_lines(out)) == [1, 2] and not (out / ".results.jsonl.tmp").exists()


def test_replay_into_a_folder_with_planted_links(tmp_path: Path, elsewhere: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    runs = tmp_path / "b"
    assert _batch(tmp_path, runs) == 0
    out = tmp_path / "r"
    (out / "rows").mkdir(parents=True)
    (out / "rows" / "000001").symlink_to(elsewhere, target_is_directory=True)
    assert main(["batch", "--replay", str(runs), "--out", str(out)]) == 1
    lines = _lines(out)
    assert "rows/000001 is a symlink; refused" in str(lines[1]["error"])
    assert lines[2]["status"] == "idle"
    assert _tree(elsewhere) == {"mine.txt": b"the user's own file\n"}   # not deleted, not written
    other = tmp_path / "r2"
    other.mkdir()
    (other / "rows").symlink_to(elsewhere, target_is_directory=True)
    capsys.readouterr()
    assert main(["batch", "--replay", str(runs), "--out", str(other)]) == 2
    assert "is a symlink; refused" in capsys.readouterr().err
    assert _tree(elsewhere) == {"mine.txt": b"the user's own file\n"}


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_inputs_that_are_not_a_plain_file_are_refused_without_hanging(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str) -> None:
    inputs = tmp_path / "rows.jsonl"
    os.mkfifo(inputs) if kind == "fifo" else inputs.mkdir()
    assert main(["batch", str(PIPELINE), "--inputs", str(inputs), "--model", "fake",
                 "--out", str(tmp_path / "b")]) == 2
    assert f"cannot read --inputs {inputs}: not a regular file" in capsys.readouterr().err


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names an fd through /proc")
def test_only_the_lines_of_rows_that_ran_are_fsynced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad row's line costs nothing to lose (a rerun looks at it again), so it is written
    without an fsync: an fsync per line made 200,000 bad rows take minutes."""
    from engine.batch import results

    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"nope": i}) + "\n" for i in range(50)) + json.dumps({"idea": "ok"}) + "\n",
                    encoding="utf-8")
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:              # os.fsync everywhere: keep the results file's
        name = os.readlink(f"/proc/self/fd/{fd}")
        if "results.jsonl" in name:
            synced.append(name)
        real(fd)

    monkeypatch.setattr(results.os, "fsync", fsync)
    assert main(["batch", str(PIPELINE), "--inputs", str(rows), "--model", "fake", "--out", str(tmp_path / "b")]) == 1
    lines = _lines(tmp_path / "b")
    assert len(lines) == 51 and lines[51]["status"] == "idle"
    assert len(synced) == 2              # the row that ran, and the compacted file


@pytest.mark.parametrize("planted", ["[" * 100_000 + "]" * 100_000, '{"row": "one"}', "\x00\xff garbage",
                                     '{"row": 1, "status": "idle", "dir": "../../elsewhere"}'])
def test_a_planted_results_line_is_not_trusted(tmp_path: Path, elsewhere: Path, planted: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A shared batch folder's results.jsonl with a hostile line (nested past the decoder, a
    wrong type, garbage, a row pointing outside): the rerun skips it or runs the row again,
    never an internal error, never a write through it."""
    out = tmp_path / "b"
    out.mkdir()
    (out / "results.jsonl").write_bytes(planted.encode("utf-8", "surrogateescape") + b"\n")
    code = _batch(tmp_path, out)
    err = capsys.readouterr().err
    assert code in (0, 2) and "internal error" not in err and "Traceback" not in err
    assert (elsewhere / "mine.txt").read_text(encoding="utf-8") == "the user's own file\n"
    assert sorted(os.listdir(elsewhere)) == ["mine.txt"]
