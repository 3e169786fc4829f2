"""`sopctl migrate FILE...`: old spellings rewritten in place, only their tokens; `--check`,
`--diff`; atomic writes that keep the mode; refused files located, exit 2, never a traceback."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from run_helpers import SOPS, sopctl_in_process

OLD = """# yaml-language-server: $schema=../schemas/sop.schema.json
apiVersion: sop/v1
name: "old"          # quoted, kept
inputs:
  idea: {type: str, required: true}

actions:
  Write:
    prompt: >-
      Write about {{ inputs.idea }}.
    output: {Title: {type: str, instruction: a title}}
    'retries': 4           # small models forget the fence
    revise: {review: human, revise: human_review}
  Test:
    kind: exec
    command: [python, -m, pytest]
    timeout_s: 120   # seconds
    send_to: ["<none>"]
mcp:
  notes: {url: "http://localhost:1/mcp", timeout_s: 30}
roles:
  Writer:
    actions: [Write, Test]
    react_mode: plan_and_act
    planner:
      action: Write
      task_action: Test
      task_retries: 1   # once more
    watch: [UserRequirement]
"""

NEW = (OLD.replace("'retries'", "'max_retries'").replace("revise: human_review", "revise: auto")
       .replace("    timeout_s: 120", "    command_timeout_s: 120").replace("timeout_s: 30}", "call_timeout_s: 30}")
       .replace("task_retries: 1", "max_task_retries: 1"))


def _file(tmp_path: Path, text: str = OLD, name: str = "s.sop.yaml") -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8"))
    return path


def test_migrate_rewrites_only_the_old_tokens(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _file(tmp_path)
    code, out, err = sopctl_in_process(capsys, "migrate", str(path))
    assert path.read_text(encoding="utf-8") == NEW      # comments, order, quotes, flow style, blank lines
    assert f"{path}:12:5: retries -> max_retries (at /actions/Write)" in out
    assert f"{path}:13:37: revise: human_review -> revise: auto (at /actions/Write/revise)" in out
    assert f"{path}:28:7: task_retries -> max_task_retries (at /roles/Writer/planner)" in out
    assert f"{path}: 5 changes written" in out
    assert code == 1 and "has other problems" in err    # the plan action is no planner: validate says why


def test_a_second_migrate_changes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _file(tmp_path, (SOPS / "deprecated" / "action_retries.sop.yaml").read_text(encoding="utf-8"))
    assert sopctl_in_process(capsys, "migrate", str(path))[0] == 0
    once = path.read_bytes()
    code, out, _ = sopctl_in_process(capsys, "migrate", str(path))
    assert (code, out) == (0, f"{path}: nothing to migrate\n") and path.read_bytes() == once
    assert sopctl_in_process(capsys, "validate", str(path))[1].endswith(": ok\n")


def test_check_writes_nothing_and_exits_1_when_something_would_change(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _file(tmp_path, (SOPS / "deprecated" / "exec_timeout_s.sop.yaml").read_text(encoding="utf-8"))
    before = path.read_bytes()
    code, out, _ = sopctl_in_process(capsys, "migrate", "--check", str(path))
    assert code == 1 and path.read_bytes() == before
    assert f"{path}: 1 change to make" in out
    sopctl_in_process(capsys, "migrate", str(path))
    assert sopctl_in_process(capsys, "migrate", "--check", str(path))[0] == 0


def test_check_passes_on_every_shipped_file(capsys: pytest.CaptureFixture[str]) -> None:
    root = SOPS.parent.parent
    files = [str(p) for folder in ("sops", "examples", "tests/sops", "tests/cases/valid")
             for p in sorted((root / folder).glob("*.sop.yaml"))]
    code, out, err = sopctl_in_process(capsys, "migrate", "--check", *files)
    assert (code, err) == (0, "") and out.count("nothing to migrate") == len(files)


def test_diff_prints_a_patch_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _file(tmp_path, "apiVersion: sop/v1\nactions:\n  A: {prompt: p, retries: 1}\n")
    code, out, err = sopctl_in_process(capsys, "migrate", "--diff", str(path))
    assert "-  A: {prompt: p, retries: 1}\n+  A: {prompt: p, max_retries: 1}\n" in out
    assert out.startswith(f"--- a/{str(path).lstrip('/')}\n+++ b/{str(path).lstrip('/')}\n") and "1 change to make" in err
    assert "retries: 1}" in path.read_text(encoding="utf-8") and "max_retries" not in path.read_text(encoding="utf-8")


def test_the_write_keeps_mode_bom_and_line_ends_and_leaves_no_temporary_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.sop.yaml"
    path.write_bytes(b"\xef\xbb\xbfapiVersion: sop/v1\r\nactions:\r\n  A:\r\n    retries: 1\r\n")
    path.chmod(0o640)
    sopctl_in_process(capsys, "migrate", str(path))
    assert path.read_bytes() == b"\xef\xbb\xbfapiVersion: sop/v1\r\nactions:\r\n  A:\r\n    max_retries: 1\r\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.sop.yaml"]


def test_a_symlink_stays_a_link_to_the_rewritten_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = _file(tmp_path, "apiVersion: sop/v1\nactions:\n  A: {retries: 1}\n", "real.sop.yaml")
    link = tmp_path / "link.sop.yaml"
    link.symlink_to(target.name)
    assert sopctl_in_process(capsys, "migrate", str(link))[0] == 0
    assert link.is_symlink() and "max_retries" in target.read_text(encoding="utf-8")


def test_both_spellings_are_left_for_the_user(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = "apiVersion: sop/v1\nactions:\n  A: {retries: 1, max_retries: 2}\n  B: {prompt: p, retries: 3}\n"
    path = _file(tmp_path, text)
    code, out, err = sopctl_in_process(capsys, "migrate", str(path))
    assert path.read_text(encoding="utf-8") == text.replace("retries: 3", "max_retries: 3")
    assert f"{path}:3:7: not rewritten: `max_retries` is there too (line 3): keep one of them (SOP016)" in err
    assert code == 1


def test_human_review_without_a_persons_review_is_not_guessed(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    text = "apiVersion: sop/v1\nactions:\n  A: {revise: {revise: human_review}}\n"
    path = _file(tmp_path, text)
    code, out, err = sopctl_in_process(capsys, "migrate", str(path))
    assert path.read_text(encoding="utf-8") == text and code == 1
    assert "not rewritten: `revise: human_review` means a person writes the review" in err
    assert f"{path}: nothing rewritten" in out


def test_a_library_is_migrated_without_a_complaint_about_its_shape(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = _file(tmp_path, "apiVersion: sop/v1\nactions:\n  A: {prompt: p, retries: 1}\n", "lib.sop.yaml")
    code, out, err = sopctl_in_process(capsys, "migrate", str(path))
    assert (code, err) == (0, "") and "max_retries" in path.read_text(encoding="utf-8")


@pytest.mark.parametrize("content, expected", [
    (None, "is a directory"),
    (b"apiVersion: sop/v1\nactions: !!python/object:os.system {}\n", "SOP006"),
    (b"a: &a [x, x, x, x, x, x, x, x, x, x]\n" + b"".join(b"b%d: &b%d [*%s, *%s, *%s, *%s, *%s, *%s, *%s, *%s, *%s, *%s]\n"
                                                        % ((i, i) + (b"a" if i == 0 else b"b%d" % (i - 1),) * 10)
                                                        for i in range(12)), "SOP008"),
    (b"\x00\x01binary", "SOP003"),
    (b"actions: [unclosed\n", "SOP005"),
])
def test_files_the_loader_refuses_are_refused_located(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       content: bytes | None, expected: str) -> None:
    path = tmp_path / "bad.sop.yaml"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    code, out, err = sopctl_in_process(capsys, "migrate", str(path))
    assert code == 2 and out == "" and expected in err and "Traceback" not in err
    assert f"{path}:" in err and "not migrated" in err
    if content is not None:
        assert path.read_bytes() == content


def test_a_missing_file_is_exit_2_and_the_others_are_still_migrated(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    good = _file(tmp_path, "apiVersion: sop/v1\nactions:\n  A: {prompt: p, retries: 1}\n", "good.sop.yaml")
    code, _, err = sopctl_in_process(capsys, "migrate", str(tmp_path / "missing.sop.yaml"), str(good))
    assert code == 2 and "no such file" in err and "max_retries" in good.read_text(encoding="utf-8")


def test_a_failed_write_is_exit_2_and_leaves_the_file_and_no_temporary(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    path = _file(tmp_path, "apiVersion: sop/v1\nactions:\n  A: {prompt: p, retries: 1}\n")
    before = path.read_bytes()

    def full_disk(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    code, _, err = sopctl_in_process(capsys, "migrate", str(path))
    assert code == 2 and f"{path}: error: not written: No space left on device" in err and "Traceback" not in err
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["s.sop.yaml"]


def test_help_names_the_command_and_its_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        sopctl_in_process(capsys, "--help")
    assert "migrate" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        sopctl_in_process(capsys, "migrate", "--help")
    text = capsys.readouterr().out
    assert "--check" in text and "--diff" in text and "comments" in text
