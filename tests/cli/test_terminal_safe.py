"""What `show`, `show --prompts` and `runs` print from a journal is text a model or a person
wrote: a terminal escape sequence in it (retitle the window, move the cursor, rewrite what
was printed) is shown as `\\x1b...`, never sent to the terminal as it is."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.cli.commands import main
from engine.cli.report import printable
from engine.testing import ScriptedModel, use_model
from run_helpers import SOPS

HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x9b31m\rfine"


def test_printable_escapes_controls_but_keeps_tabs_and_newlines() -> None:
    assert printable("a\tb\nc") == "a\tb\nc"
    assert printable(HOSTILE) == "\\x1b]0;pwned\\x07\\x1b[2J\\x9b31m\\x0dfine"


@pytest.mark.parametrize("flags", [[], ["--prompts"]])
def test_show_prints_a_runs_escape_sequences_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     flags: list[str]) -> None:
    with use_model(ScriptedModel(lambda spec, attempt: HOSTILE)):
        main(["run", str(SOPS / "pipeline.sop.yaml"), "--idea", f"idea {HOSTILE}", "--model", "scripted",
              "--out", str(tmp_path / "run")])
    capsys.readouterr()
    assert main(["show", str(tmp_path / "run"), *flags]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x9b" not in out and "\x07" not in out
    assert "\\x1b]0;pwned" in out or not flags         # the timeline quotes no answer
    assert main(["runs", str(tmp_path)]) == 0
    assert "\x1b" not in capsys.readouterr().out
