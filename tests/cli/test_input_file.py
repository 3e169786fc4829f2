"""`--input KEY=@FILE`: a file's text as an input, read at start, capped, regular files only."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine import api
from engine.cli.commands import main
from engine.errors import UsageError
from engine.run.inputs import INPUT_FILE_LIMIT

SOP = """\
apiVersion: sop/v1
name: creator
inputs:
  example: {type: str, required: true}
actions:
  Create:
    prompt: "Write an SOP like this one:\\n{{ inputs.example }}"
    artifacts: [{path: out.md, content: "{{ out }}"}]
roles:
  Creator: {actions: [Create], watch: [UserRequirement]}
"""


def test_a_file_reaches_the_prompt_as_the_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)  # a relative path is read from the current directory
    Path("sop.yaml").write_text(SOP, encoding="utf-8")
    Path("example.txt").write_text("name: 'quoted' $HOME `and` \"more\"\n", encoding="utf-8")
    assert main(["run", "sop.yaml", "--idea", "x", "--input", "example=@example.txt", "--model", "fake",
                 "--out", "ws", "--format", "json"]) == 0
    from engine.journal.history import read_run

    assert read_run("ws").inputs["example"] == "name: 'quoted' $HOME `and` \"more\"\n"


def test_double_at_is_a_literal_at() -> None:
    assert api.parse_input_flags(["handle=@@sopctl"]) == {"handle": "@sopctl"}


@pytest.mark.parametrize("make, message", [
    (lambda p: None, "cannot open the file"),
    (lambda p: p.mkdir(), "not a regular file"),
    (lambda p: os.mkfifo(p), "not a regular file"),
    (lambda p: p.write_bytes(b"x" * (INPUT_FILE_LIMIT + 1)), "larger than 1,000,000 bytes"),
    (lambda p: p.write_bytes(b"caf\xe9"), "not UTF-8 text (byte 0xe9 at offset 3)"),
])
def test_a_file_that_cannot_be_an_input_is_a_usage_error(tmp_path: Path, make, message: str) -> None:
    path = tmp_path / "given"
    make(path)
    with pytest.raises(UsageError) as caught:
        api.parse_input_flags([f"example=@{path}"])
    assert caught.value.message.startswith(f"--input example=@{path}: ")
    assert message in caught.value.message


def test_a_device_is_refused_without_reading_it() -> None:
    with pytest.raises(UsageError, match="not a regular file"):
        api.parse_input_flags(["example=@/dev/zero"])
