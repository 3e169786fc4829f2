"""The person at a real terminal (a pseudo-terminal driven by pexpect): questions asked inline,
each field checked and asked again when wrong, review gates, $EDITOR, and kill -9 while a
person is typing (the resumed run asks the same question again). No timing is asserted:
pexpect only waits for what the terminal shows."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from engine.journal.history import read_run

from run_helpers import ROOT, TESTS

pexpect = pytest.importorskip("pexpect")

EXAMPLE = ROOT / "examples" / "human_review.sop.yaml"
PROMPT = r"\[a/e/r\]: "

HUMAN_TEXT = (TESTS / "sops" / "human_text.sop.yaml").read_text(encoding="utf-8")


def _spawn(cwd: Path, *args: str, editor: str = "", **extra_env: str) -> pexpect.spawn:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "EDITOR": editor, "VISUAL": "",
           "COLUMNS": "120", "TERM": "dumb", **extra_env}
    child = pexpect.spawn(sys.executable, ["-m", "engine.cli", *args], cwd=str(cwd), env=env,
                          encoding="utf-8", timeout=60, dimensions=(50, 120))
    return child


def _run_example(cwd: Path, *extra: str, editor: str = "", **extra_env: str) -> pexpect.spawn:
    return _spawn(cwd, "run", str(EXAMPLE), "--idea", "sort dates", "--model", "fake",
                  "--out", "ws", *extra, editor=editor, **extra_env)


def _finish(child: pexpect.spawn) -> int:
    child.expect(pexpect.EOF)
    child.close()
    return child.exitstatus


def _answer_review(child: pexpect.spawn, verdict: str = "approve") -> None:
    child.expect(r"Verdict \(one of: approve \| revise.*\): ")
    child.sendline(verdict)
    child.expect(r"Comments \(.*\): ")
    child.sendline("good tests")


def test_a_text_answer_typed_inline(tmp_path: Path) -> None:
    (tmp_path / "s.sop.yaml").write_text(HUMAN_TEXT, encoding="utf-8")
    child = _spawn(tmp_path, "run", "s.sop.yaml", "--idea", "tea", "--model", "fake", "--out", "ws")
    child.expect("Decide about tea.")
    child.expect(r"end with a line holding only '\.'")
    child.sendline("first line")
    child.sendline("second line")
    child.sendline(".")
    assert _finish(child) == 0
    assert (tmp_path / "ws" / "decision.md").read_text() == "first line\nsecond line"


def test_fields_one_by_one_a_wrong_value_is_asked_again(tmp_path: Path) -> None:
    child = _run_example(tmp_path)
    child.expect(PROMPT)
    child.sendline("a")                                  # approve Alice's code
    child.expect(r"Verdict \(one of: approve \| revise.*\): ")
    child.sendline("maybe")
    child.expect("not valid: 'maybe' is not one of")
    _answer_review(child)
    assert _finish(child) == 0
    assert (tmp_path / "ws" / "review.md").read_text().startswith("# Review: approve")


def test_review_reject_with_a_comment_then_edit(tmp_path: Path) -> None:
    child = _run_example(tmp_path)
    child.expect(PROMPT)
    child.sendline("x")
    child.expect("please type a")                        # not a choice: asked again
    child.expect(PROMPT)
    child.sendline("r")
    child.expect("comment for the model")
    child.sendline("use datetime")
    child.expect(PROMPT)                                 # the model's second answer, reviewed
    child.sendline("e")
    child.expect(r"your code \(end with a line")
    child.sendline("def sort_dates(dates):")
    child.sendline("    return sorted(dates)")
    child.sendline(".")
    _answer_review(child)
    assert _finish(child) == 0
    assert (tmp_path / "ws" / "code.py").read_text() == "def sort_dates(dates):\n    return sorted(dates)\n"


def test_a_long_value_opens_the_editor(tmp_path: Path) -> None:
    editor = tmp_path / "editor.py"
    editor.write_text("import sys\nopen(sys.argv[1], 'w').write('def edited():\\n    return 1\\n')\n")
    child = _run_example(tmp_path, editor=f"{sys.executable} {editor}")
    child.expect(PROMPT)
    child.sendline("e")
    child.expect("opening")
    _answer_review(child)
    assert _finish(child) == 0
    assert (tmp_path / "ws" / "code.py").read_text() == "def edited():\n    return 1\n"


def test_no_input_on_a_terminal_waits_without_asking(tmp_path: Path) -> None:
    child = _run_example(tmp_path, "--no-input")
    index = child.expect([PROMPT, "waiting for a person"])
    assert index == 1
    assert _finish(child) == 75


def test_kill_9_while_a_person_is_typing_asks_the_same_question_on_resume(tmp_path: Path) -> None:
    child = _run_example(tmp_path)
    child.expect(PROMPT)
    child.sendline("a")
    child.expect(r"question ([0-9a-f]{12})\) ──")
    asked = child.match.group(1)
    child.expect(r"Verdict \(one of")
    child.send("appr")                                   # half typed, never sent
    child.kill(signal.SIGKILL)
    child.close(force=True)
    state = read_run(tmp_path / "ws")
    assert state.status == "interrupted" and state.waiting_for["key"].startswith(asked)
    shown = subprocess.run([sys.executable, "-m", "engine.cli", "show", "ws"], cwd=tmp_path,
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert f"stopped while asking a person: SimpleReviewer.SimpleWriteReview (question {asked})" \
        in shown.stdout

    resumed = _spawn(tmp_path, "resume", "ws")
    resumed.expect(r"question ([0-9a-f]{12})\) ──")
    assert resumed.match.group(1) == asked               # the same question, not a new one
    _answer_review(resumed)
    assert _finish(resumed) == 0
    shown = json.loads(subprocess.run([sys.executable, "-m", "engine.cli", "show", "ws", "--format",
                                       "json"], cwd=tmp_path, capture_output=True, text=True,
                                      env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout)
    assert shown["status"] == "idle" and shown["person_answers"] == 2


ASK_AND_REPLY = """\
apiVersion: sop/v1
name: ask_and_reply
inputs:
  idea: {type: str, required: true}
actions:
  AskScope:
    kind: ask
    prompt: "How long should the report on {{ inputs.idea }} be?"
    output:
      Pages: {type: int, instruction: the number of pages}
      Code: {type: str, pattern: "^[A-Z]{3}$", instruction: a project code}
  Notify:
    kind: reply
    prompt: "Noted: {{ msgs.AskScope[-1].out['Pages'] }} pages for {{ msgs.AskScope[-1].out['Code'] }}."
roles:
  Lead:
    actions: [AskScope]
    watch: [UserRequirement]
  Herald:
    actions: [Notify]
    watch: [AskScope]
"""


def test_ask_checks_type_and_pattern_and_the_reply_is_shown(tmp_path: Path) -> None:
    (tmp_path / "s.sop.yaml").write_text(ASK_AND_REPLY, encoding="utf-8")
    child = _spawn(tmp_path, "run", "s.sop.yaml", "--idea", "tea", "--model", "fake", "--out", "ws")
    child.expect("How long should the report on tea be?")
    child.expect(r"Pages \(integer.*\): ")
    child.sendline("three")
    child.expect("not valid: 'three' is not a number")
    child.expect(r"Pages \(integer.*\): ")
    child.sendline("3")
    child.expect(r"Code \(string, matching .*\): ")
    child.sendline("tea")
    child.expect("not valid: 'tea' does not match")
    child.expect(r"Code \(.*\): ")
    child.sendline("TEA")
    child.expect("Herald -> you: Noted: 3 pages for TEA.")
    assert _finish(child) == 0
    assert read_run(tmp_path / "ws").replies[0]["text"] == "Noted: 3 pages for TEA."


def test_an_answer_typed_on_the_terminal_is_journaled_before_it_is_used(tmp_path: Path) -> None:
    """The process dies right after journaling the person's approval (answer 2; answer 1 is
    the model's code): the resume does not ask for it again but goes on to the next question."""
    child = _run_example(tmp_path, SOPCTL_CRASH_AFTER_ANSWER="2")
    child.expect(PROMPT)
    child.sendline("a")
    assert _finish(child) == 137
    resumed = subprocess.run([sys.executable, "-m", "engine.cli", "resume", "ws", "--no-input",
                              "--format", "json"], cwd=tmp_path, capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert resumed.returncode == 75, resumed.stderr
    assert json.loads(resumed.stdout)["waiting_for"]["action"] == "SimpleWriteReview"


def test_end_of_input_at_a_prompt_makes_the_run_wait(tmp_path: Path) -> None:
    child = _run_example(tmp_path)
    child.expect(PROMPT)
    child.sendeof()
    child.expect("the run waits for an answer")
    assert _finish(child) == 75
    assert read_run(tmp_path / "ws").status == "waiting"


def test_ctrl_c_at_a_prompt_stops_the_run_with_its_question_kept(tmp_path: Path) -> None:
    child = _run_example(tmp_path)
    child.expect(PROMPT)
    child.sendintr()
    assert _finish(child) == 130
    state = read_run(tmp_path / "ws")
    assert state.status == "interrupted" and state.ended
    assert state.waiting_for is not None and state.waiting_for["action"] == "SimpleWriteCode"


def test_a_ctrl_c_just_before_a_prompt_stops_it_instead_of_waiting_for_enter() -> None:
    """A Ctrl-C that lands before the prompt took Ctrl-C over (asyncio's handler then only
    cancels the run) must not leave the run blocked in a read until Enter is pressed."""
    import asyncio
    import io

    from engine.cli.person import TerminalPerson

    person = TerminalPerson(stdin=io.StringIO("a\n"), out=io.StringIO())

    async def asked_while_cancelled() -> str:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()                       # what asyncio's Ctrl-C handler does
        return person._line("approve, edit or reject? [a/e/r]: ")

    if not hasattr(asyncio.Task, "cancelling"):
        pytest.skip("Python 3.11+ tells a cancelled task apart")
    with pytest.raises(KeyboardInterrupt):
        asyncio.run(asked_while_cancelled())
