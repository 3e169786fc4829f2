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


# --- what a run prints while it runs (issue 26: more of the class) ---------------------------

def _hostile_events() -> list:
    from engine.models.types import AnswerRejected
    from engine.run.events import PersonTold, RunLog

    return [AnswerRejected(1, "Writer", "Write", 0, f"'{HOSTILE}' is not one of ['a']", True),
            RunLog(round=1, level="warning", role="Writer", message=f"odd: {HOSTILE} [link=http://evil.example]x[/link]"),
            PersonTold(1, "Writer", "Tell", f"hello {HOSTILE} [bold]loud[/bold]")]


def test_the_plain_progress_prints_a_models_words_escaped() -> None:
    import io

    from engine.cli.live import PlainProgress

    stream = io.StringIO()
    display = PlainProgress(stream, ["Writer"])
    for event in _hostile_events():
        display.on_event(event)
    out = stream.getvalue()
    assert "\x1b" not in out and "\x9b" not in out and "\x07" not in out and "\r" not in out
    assert "\\x1b]0;pwned" in out


def test_the_live_table_prints_a_models_words_escaped_and_never_as_markup() -> None:
    import io

    from engine.cli.live import LiveDisplay
    from engine.run.events import RunStarted

    stream = io.StringIO()
    display = LiveDisplay(["Writer"], stream)
    display.console.width = 400              # one line per log line, unwrapped
    started = RunStarted(run_id="r1", sop_name="s", sop_file="s.sop.yaml", sop_hash="h", model="fake",
                         max_rounds=1, budget_usd=0.0, workspace="ws", inputs={}, engine_version="0")
    display.on_event(started)
    for event in _hostile_events():
        display.on_event(event)
    display.close()
    out = stream.getvalue()
    assert "\x9b" not in out and "\x07" not in out and "]0;pwned" not in out.replace("\\x1b]0;pwned", "")
    assert "[link=http://evil.example]" in out and "[bold]loud[/bold]" in out   # shown as typed


def test_a_question_shows_a_models_draft_escaped() -> None:
    import io

    from engine.cli.person import TerminalPerson
    from engine.run.people import Question

    question = Question(key="k" * 16, kind="review", role="Writer", action="Write", round=1,
                        prompt=f"Check this {HOSTILE}", output="text", draft=f"draft {HOSTILE}")
    out = io.StringIO()
    person = TerminalPerson(stdin=io.StringIO("a\n"), out=out, editor="")
    assert person.ask(question).decision == "approve"
    shown = out.getvalue()
    assert "\x1b" not in shown and "\x9b" not in shown and "\x07" not in shown
    assert shown.count("\\x1b]0;pwned") == 2
