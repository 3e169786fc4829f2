"""Artifact paths are confined to the workspace; writes are atomic and skip unchanged files."""

from __future__ import annotations

import itertools
import os
import pathlib
import re
import signal
import stat
import sys
from pathlib import Path

import pytest

from engine.run import workspace as workspace_module
from engine.run.workspace import Workspace, WorkspaceError, sha256_text

posix_only = pytest.mark.skipif(sys.platform == "win32", reason="symlinks, FIFOs and modes")


@pytest.fixture(params=["dir_fd", "by_path"])
def ws(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Workspace:
    """Both write paths: folder descriptors (POSIX) and plain paths (where there are none)."""
    if request.param == "by_path":
        monkeypatch.setattr(workspace_module, "_DIR_FDS", False)
    elif not workspace_module._DIR_FDS:
        pytest.skip("no dir_fd calls on this system")
    workspace = Workspace(tmp_path / "ws")
    workspace.create()
    return workspace


@pytest.mark.parametrize("path", ["/etc/passwd", "~/x", "C:/x", "a/../../x", "..", "../x",
                                  "a\\b", "", "  ", "dir/", "a\x00b"])
def test_bad_paths_are_refused_with_the_path_named(ws: Workspace, path: str) -> None:
    with pytest.raises(WorkspaceError, match="artifact path"):
        ws.write(path, "x")
    assert list(ws.root.iterdir()) == []


def test_dotdot_inside_the_name_is_fine(ws: Workspace) -> None:
    written = ws.write("docs/notes..md", "hello")
    assert written.path == "docs/notes..md"
    assert (ws.root / "docs" / "notes..md").read_text() == "hello"


def test_symlinked_folder_leaving_the_workspace_is_refused(ws: Workspace, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, ws.root / "link")
    with pytest.raises(WorkspaceError, match="symlink"):
        ws.write("link/evil.txt", "x")
    assert not (outside / "evil.txt").exists()


def test_writing_through_a_symlinked_file_is_refused(ws: Workspace, tmp_path: Path) -> None:
    target = tmp_path / "victim.txt"
    target.write_text("keep me")
    os.symlink(target, ws.root / "file.txt")
    with pytest.raises(WorkspaceError, match="symlink"):
        ws.write("file.txt", "overwritten")
    assert target.read_text() == "keep me"


def test_symlink_inside_the_workspace_is_still_refused(ws: Workspace) -> None:
    (ws.root / "real").mkdir()
    os.symlink(ws.root / "real", ws.root / "alias")
    with pytest.raises(WorkspaceError):
        ws.write("alias/x.txt", "x")


def test_write_creates_folders_and_reports_the_hash(ws: Workspace) -> None:
    written = ws.write("a/b/c.txt", "héllo")
    assert written.path == "a/b/c.txt"
    assert written.sha256 == sha256_text("héllo")
    assert written.changed
    assert (ws.root / "a/b/c.txt").read_text(encoding="utf-8") == "héllo"


def test_unchanged_content_is_not_rewritten(ws: Workspace) -> None:
    ws.write("f.txt", "same")
    path = ws.root / "f.txt"
    os.utime(path, (1_000_000, 1_000_000))
    again = ws.write("f.txt", "same")
    assert not again.changed
    assert path.stat().st_mtime == 1_000_000
    changed = ws.write("f.txt", "different")
    assert changed.changed and path.read_text() == "different"


def test_no_temp_files_are_left_behind(ws: Workspace) -> None:
    ws.write("x.txt", "1")
    ws.write("x.txt", "2")
    assert sorted(p.name for p in ws.root.iterdir()) == ["x.txt"]


def test_a_folder_in_the_way_is_a_clear_error(ws: Workspace) -> None:
    (ws.root / "docs").mkdir()
    with pytest.raises(WorkspaceError, match="folder"):
        ws.write("docs", "x")
    for root in (".", "./."):
        with pytest.raises(WorkspaceError, match=f"artifact path '{re.escape(root)}' is a folder"):
            ws.write(root, "x")


def test_dot_names_resolve_as_before(ws: Workspace) -> None:
    assert ws.write("a/.", "x").path == "a"
    assert not ws.write("./a", "x").changed


def test_workspace_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(WorkspaceError):
        Workspace(tmp_path / "file").create()


def _swap_for_symlink(folder: Path, to: Path) -> None:
    folder.rename(folder.with_name(folder.name + ".moved"))
    os.symlink(to, folder)


@posix_only
def test_a_folder_swapped_for_a_symlink_after_a_write_is_refused(ws: Workspace, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    ws.write("a/b/x.txt", "1")
    _swap_for_symlink(ws.root / "a" / "b", outside)
    with pytest.raises(WorkspaceError, match="goes through a symlink and leads outside"):
        ws.write("a/b/x.txt", "2")
    assert list(outside.iterdir()) == []


@posix_only
def test_a_symlink_swapped_in_right_after_a_folder_is_made_is_refused(
        ws: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race a check-then-write leaves open: the folder is made, then replaced by a link."""
    outside = tmp_path / "outside"
    outside.mkdir()
    real_mkdir = os.mkdir

    def mkdir_then_swap(path: str, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        real_mkdir(path, mode, dir_fd=dir_fd)
        if os.path.basename(path) == "sub":
            _swap_for_symlink(ws.root / "sub", outside)

    monkeypatch.setattr(os, "mkdir", mkdir_then_swap)
    accessor = getattr(pathlib, "_normal_accessor", None)   # Python 3.10's pathlib calls the os.mkdir it bound
    if accessor is not None:
        monkeypatch.setattr(accessor, "mkdir", mkdir_then_swap, raising=False)
    with pytest.raises(WorkspaceError, match="symlink"):
        ws.write("sub/evil.txt", "x")
    assert list(outside.iterdir()) == []


@posix_only
def test_the_root_swapped_for_a_symlink_is_refused(ws: Workspace, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ws.write("x.txt", "1")
    _swap_for_symlink(ws.root, elsewhere)
    with pytest.raises(WorkspaceError, match="symlink"):
        ws.write("x.txt", "2")
    assert list(elsewhere.iterdir()) == []


@posix_only
def test_a_parent_of_the_root_swapped_for_a_symlink_is_refused(tmp_path: Path) -> None:
    """The root is opened by path: a link above it would lead elsewhere, and the root is not
    the folder it was; that is refused (as `confine`'s realpath check does)."""
    ws = Workspace(tmp_path / "parent" / "ws")
    ws.create()
    ws.write("x.txt", "1")
    (tmp_path / "elsewhere" / "ws").mkdir(parents=True)
    _swap_for_symlink(tmp_path / "parent", tmp_path / "elsewhere")
    with pytest.raises(WorkspaceError, match="symlink"):
        ws.write("x.txt", "2")
    assert list((tmp_path / "elsewhere" / "ws").iterdir()) == []


@posix_only
@pytest.mark.parametrize("points_to", ["inside.txt", "missing.txt"])
def test_a_symlink_as_the_file_name_is_refused(ws: Workspace, points_to: str) -> None:
    (ws.root / "inside.txt").write_text("keep me")
    os.symlink(ws.root / points_to, ws.root / "link.txt")
    with pytest.raises(WorkspaceError, match="goes through a symlink; refused"):
        ws.write("link.txt", "x")
    assert (ws.root / "inside.txt").read_text() == "keep me"
    assert not (ws.root / "missing.txt").exists()
    assert (ws.root / "link.txt").is_symlink()


@posix_only
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs")
def test_a_fifo_in_the_way_is_replaced_without_blocking(ws: Workspace) -> None:
    """Empty content has the FIFO's size (0): the unchanged-content check must not open it."""
    os.mkfifo(ws.root / "pipe")

    def blocked(signum: int, frame: object) -> None:
        raise AssertionError("the write blocked on the FIFO")   # not an OSError: not caught

    previous = signal.signal(signal.SIGALRM, blocked)
    signal.alarm(10)   # a blocked open would hang the suite; this turns it into a failure
    try:
        written = ws.write("pipe", "")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert written.changed
    assert stat.S_ISREG((ws.root / "pipe").lstat().st_mode)


def test_a_file_in_the_way_of_a_folder_is_a_clear_error(ws: Workspace) -> None:
    (ws.root / "a").write_text("a file")
    with pytest.raises(WorkspaceError, match="cannot write artifact 'a/b.txt'"):
        ws.write("a/b.txt", "x")
    assert (ws.root / "a").read_text() == "a file"


@posix_only
@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600)])
def test_new_files_get_the_ordinary_mode(ws: Workspace, umask: int, mode: int) -> None:
    old = os.umask(umask)
    try:
        ws.write("a/x.py", "1")
    finally:
        os.umask(old)
    assert stat.S_IMODE((ws.root / "a/x.py").stat().st_mode) == mode


@posix_only
@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores modes")
def test_a_folder_that_cannot_be_written_is_a_clear_error(ws: Workspace) -> None:
    (ws.root / "ro").mkdir(mode=0o555)
    try:
        with pytest.raises(WorkspaceError, match="cannot write artifact 'ro/x.txt'"):
            ws.write("ro/x.txt", "x")
    finally:
        (ws.root / "ro").chmod(0o755)
    assert list((ws.root / "ro").iterdir()) == []


def test_a_failed_rename_leaves_no_temp_file(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(WorkspaceError, match="cannot write artifact 'x.txt': Input/output error"):
        ws.write("x.txt", "x")
    assert list(ws.root.iterdir()) == []


def test_a_temp_name_left_behind_is_skipped_not_overwritten(
        ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    stale = ws.root / f".sopctl-{os.getpid()}-0.tmp"
    stale.write_text("another writer's")
    monkeypatch.setattr(workspace_module, "_TEMP_NUMBERS", itertools.count())
    ws.write("x.txt", "mine")
    assert stale.read_text() == "another writer's"
    assert (ws.root / "x.txt").read_text() == "mine"
