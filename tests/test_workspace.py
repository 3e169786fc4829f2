"""Artifact paths are confined to the workspace; writes are atomic and skip unchanged files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.run.workspace import Workspace, WorkspaceError, sha256_text


@pytest.fixture()
def ws(tmp_path: Path) -> Workspace:
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


def test_workspace_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(WorkspaceError):
        Workspace(tmp_path / "file").create()
