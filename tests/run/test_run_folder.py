"""The run folder's own files are not attack surface: a workspace from elsewhere may carry a
planted `.sopctl/`, and an SOP file may name `.sopctl/...` as an artifact path.

Each attack goes in through the CLI; what must come out is a clear refusal (exit 2 naming
the planted path) and the file the link points to left byte for byte as it was.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.compile.compiler import check_text
from engine.cli.commands import main
from engine.errors import JournalError
from engine.journal.store import Journal, journal_path, writer_active
from engine.run.workspace import Workspace, WorkspaceError

from run_helpers import TESTS

SOP = TESTS / "sops" / "journal_small.sop.yaml"
HASH = "0" * 64


@pytest.fixture(autouse=True)
def _no_sopctl_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("SOPCTL_")]:
        monkeypatch.delenv(name)


def sopctl(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(list(args))
    return code, capsys.readouterr().err


def run(capsys: pytest.CaptureFixture[str], ws: Path) -> tuple[int, str]:
    return sopctl(capsys, "run", str(SOP), "--idea", "a snake game", "--model", "fake",
                  "--out", str(ws))


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file outside the workspace that a planted link points to."""
    path = tmp_path / "victim.txt"
    path.write_text("precious\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("name", ["writer.lock", "journal.sqlite", "journal.sqlite-wal",
                                  "journal.sqlite-shm"])
def test_a_planted_symlink_among_the_own_files_is_refused(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, victim: Path, name: str) -> None:
    ws = tmp_path / "ws"
    (ws / ".sopctl").mkdir(parents=True)
    (ws / ".sopctl" / name).symlink_to(victim)
    code, err = run(capsys, ws)
    assert code == 2
    assert f".sopctl/{name} is a symlink; refused" in err
    assert victim.read_text(encoding="utf-8") == "precious\n"


def test_a_planted_lock_symlink_does_not_let_resume_write_through_it(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, victim: Path) -> None:
    ws = tmp_path / "ws"
    assert run(capsys, ws)[0] == 0
    lock = ws / ".sopctl" / "writer.lock"
    lock.unlink()
    lock.symlink_to(victim)
    for command in (["resume", str(ws)], ["show", str(ws)]):
        code, err = sopctl(capsys, *command)
        assert code == 2 and "writer.lock is a symlink; refused" in err, command
    assert victim.read_text(encoding="utf-8") == "precious\n"


def test_a_planted_sopctl_symlink_is_refused(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / ".sopctl").symlink_to(elsewhere, target_is_directory=True)
    code, err = run(capsys, ws)
    assert code == 2
    assert ".sopctl is a symlink; refused" in err
    assert list(elsewhere.iterdir()) == []           # no journal, no lock put outside


def test_a_sopctl_that_is_a_file_or_a_dangling_link_is_refused(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    file_ws, link_ws = tmp_path / "a", tmp_path / "b"
    file_ws.mkdir()
    link_ws.mkdir()
    (file_ws / ".sopctl").write_text("x", encoding="utf-8")
    (link_ws / ".sopctl").symlink_to(tmp_path / "missing")
    assert run(capsys, file_ws)[1].count(".sopctl is not a folder; refused") == 1
    assert ".sopctl is a symlink; refused" in run(capsys, link_ws)[1]
    assert not (tmp_path / "missing").exists()


def test_a_planted_fifo_lock_is_refused_without_blocking(tmp_path: Path) -> None:
    (tmp_path / ".sopctl").mkdir()
    os.mkfifo(tmp_path / ".sopctl" / "writer.lock")
    with pytest.raises(JournalError, match="writer.lock is not a plain file"):
        Journal.create(tmp_path, sop_name="s", sop_hash=HASH)


def test_a_hard_linked_lock_is_refused_for_writing(tmp_path: Path, victim: Path) -> None:
    (tmp_path / "ws" / ".sopctl").mkdir(parents=True)
    os.link(victim, tmp_path / "ws" / ".sopctl" / "writer.lock")
    with pytest.raises(JournalError, match="hard links"):
        Journal.create(tmp_path / "ws", sop_name="s", sop_hash=HASH)
    assert victim.read_text(encoding="utf-8") == "precious\n"


def test_the_lock_holds_when_the_lock_file_is_replaced(tmp_path: Path) -> None:
    """The lock is on the `.sopctl` folder: a new `writer.lock` does not let a second writer in."""
    with Journal.create(tmp_path, sop_name="s", sop_hash=HASH):
        lock = tmp_path / ".sopctl" / "writer.lock"
        assert lock.read_text(encoding="utf-8") == str(os.getpid())
        lock.unlink()
        lock.write_text("", encoding="utf-8")        # a fresh file nobody holds
        assert writer_active(tmp_path)
        with pytest.raises(JournalError, match="being written by another process"):
            Journal.create(tmp_path, sop_name="s", sop_hash=HASH)
    assert not writer_active(tmp_path)
    Journal.create(tmp_path, sop_name="s", sop_hash=HASH).close()   # free again once closed


ENGINE_PATHS = [".sopctl/journal.sqlite", ".sopctl/journal.sqlite-wal", ".sopctl/writer.lock",
                "./.sopctl/x", ".SOPCTL/journal.sqlite", ".sopctl", ".sopctl./x"]


@pytest.mark.parametrize("path", ENGINE_PATHS)
def test_validate_refuses_artifacts_into_the_engine_folder(path: str) -> None:
    text = SOP.read_text(encoding="utf-8").replace("path: NOTES.md", f"path: '{path}'")
    found = [d for d in check_text(text, "x.sop.yaml").diagnostics if d.is_error]
    assert [(d.code, d.pointer) for d in found] == [("SOP405", "/actions/WriteNotes/artifacts/0/path")]
    assert "writes into .sopctl/" in found[0].message


@pytest.mark.parametrize("path", ENGINE_PATHS)
def test_the_workspace_refuses_rendered_paths_into_the_engine_folder(tmp_path: Path, path: str) -> None:
    with pytest.raises(WorkspaceError, match="writes into .sopctl/"):
        Workspace(tmp_path).write(path, "x")


def test_a_templated_path_into_the_engine_folder_fails_the_run_located(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """What the checker cannot see (a rendered path) the run refuses, and the journal is intact."""
    text = SOP.read_text(encoding="utf-8").replace(
        "path: NOTES.md", "path: \"{{ '.sop' ~ 'ctl' }}/journal.sqlite\"")
    sop = tmp_path / "attack.sop.yaml"
    sop.write_text(text, encoding="utf-8")
    ws = tmp_path / "ws"
    code, _ = sopctl(capsys, "run", str(sop), "--idea", "x", "--model", "fake", "--out", str(ws))
    assert code == 1
    assert sopctl(capsys, "show", str(ws))[0] == 0
    with Journal.open(ws) as journal:
        ended = [e for e in journal.events() if e.type == "RunEnded"][-1].data
    assert ended["status"] == "failed"
    assert "SOP502" in ended["error"] and "writes into .sopctl/" in ended["error"]
    assert journal_path(ws).is_file()


def test_where_folders_cannot_be_locked_the_pid_file_is(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """NFS emulates flock with write locks, which a folder cannot take: the lock falls back
    to `writer.lock` and still keeps a second writer out."""
    import errno
    import fcntl
    import stat

    real_flock = fcntl.flock

    def no_folder_locks(handle: int, operation: int) -> None:
        if stat.S_ISDIR(os.fstat(handle).st_mode):
            raise OSError(errno.EBADF, "Bad file descriptor")
        real_flock(handle, operation)

    monkeypatch.setattr(fcntl, "flock", no_folder_locks)
    with Journal.create(tmp_path, sop_name="s", sop_hash=HASH):
        assert writer_active(tmp_path)
        with pytest.raises(JournalError, match=rf"another process \(pid {os.getpid()}\)"):
            Journal.create(tmp_path, sop_name="s", sop_hash=HASH)
    assert not writer_active(tmp_path)
