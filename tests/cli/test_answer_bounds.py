"""`sopctl answer`: what a person hands over is bounded like `--input KEY=@FILE`: a regular
file of at most 1 MB (never a FIFO, which would hang, nor `/dev/zero`, which never ends), and
`--json` nested no deeper than a model's answer may be. Each is exit 2 with what is wrong,
before the run folder is even opened."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from engine.cli.commands import ANSWER_FILE_LIMIT, main
from engine.models.answers import MAX_ANSWER_DEPTH


def _answer(tmp_path: Path, *flags: str) -> int:
    return main(["answer", str(tmp_path / "run"), *flags])


@pytest.mark.parametrize("make, expected", [
    (lambda p: "/dev/zero", "not a regular file"),
    (lambda p: (os.mkfifo(p / "fifo"), str(p / "fifo"))[1], "not a regular file"),
    (lambda p: str(p), "not a regular file"),
    (lambda p: str(p / "missing.txt"), "cannot open the file: No such file or directory"),
])
def test_an_answer_file_that_is_not_a_plain_file_is_refused_without_reading(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], make, expected) -> None:
    assert _answer(tmp_path, "--file", make(tmp_path)) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err


def test_an_answer_file_past_the_limit_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    big = tmp_path / "big.txt"
    with big.open("wb") as handle:
        handle.truncate(50 * 1024 * 1024)                 # 50 MB, sparse
    assert _answer(tmp_path, "--file", str(big)) == 2
    assert f"the file is larger than {ANSWER_FILE_LIMIT:,} bytes" in capsys.readouterr().err


def test_an_answer_file_that_is_not_utf8_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "latin.txt").write_bytes(b"caf\xe9")
    assert _answer(tmp_path, "--file", str(tmp_path / "latin.txt")) == 2
    assert "not UTF-8 text (offset 3)" in capsys.readouterr().err


@pytest.mark.parametrize("depth", [MAX_ANSWER_DEPTH + 1, 100_000])
def test_deeply_nested_json_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], depth: int) -> None:
    assert _answer(tmp_path, "--json", "[" * depth + "]" * depth) == 2
    err = capsys.readouterr().err
    assert f"--json nests deeper than {MAX_ANSWER_DEPTH} levels" in err and "RecursionError" not in err


def test_nested_json_within_the_limit_reaches_the_run_folder(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Within the limit the answer is taken, and what fails next is the missing run folder."""
    nested = json.dumps({"a": [[[1]]]})
    assert _answer(tmp_path, "--json", nested) == 2
    err = capsys.readouterr().err
    assert "nests deeper" not in err and str(tmp_path / "run") in err
