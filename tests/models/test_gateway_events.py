"""The gateway's events are run events: journaled, shown live, counted by `sopctl show`.

A scripted model answers the first action invalidly once (a re-ask) and fails the second
action's first request with a transient error (a retry); every front end must see both.
Also: the happy path writes one journal row per answer, old journals (with `LLMCalled`
summaries) still read, run statuses stay bare strings in JSON, and `Usage` adds up.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from engine import api
from engine.cli.commands import main
from engine.cli.live import LiveDisplay, PlainProgress
from engine.cli.report import format_show, result_object
from engine.journal.history import read_run
from engine.journal.run_folder import journal_path
from engine.journal.store import Journal
from engine.models.gateway import Gateway
from engine.models.types import TransientModelError, Usage
from engine.run.events import (
    ActionCompleted,
    ActionStarted,
    AnswerRejected,
    LLMCalled,
    MessagePublished,
    ModelAnswered,
    ModelRetried,
    RoundStarted,
    RunEnded,
    RunStarted,
    RunStatus,
)
from engine.testing import ScriptedModel, use_model

from run_helpers import TESTS

SOP = """\
apiVersion: sop/v1
name: two_steps
inputs:
  idea: {type: str, required: true}
actions:
  Write:
    prompt: "Write a title for {{ inputs.idea }}."
    output:
      Title: {type: str, instruction: a short title}
  Review:
    prompt: "Review {{ msgs.Write[-1].out['Title'] }}."
    output: text
roles:
  Writer: {actions: [Write], watch: [UserRequirement]}
  Reviewer: {actions: [Review], watch: [Write]}
"""

ANSWERS = ["no json at all", '{"Title": "Snake"}',
           TransientModelError("rate limited (429)"), "looks good"]


async def _no_sleep(seconds: float) -> None:
    return None


@pytest.fixture(scope="module")
def troubled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One journaled run through iter_run, watched by both displays."""
    root = tmp_path_factory.mktemp("troubled")
    sop_file = root / "two_steps.sop.yaml"
    sop_file.write_text(SOP)
    plain, rich = io.StringIO(), LiveDisplay(["Writer", "Reviewer"], io.StringIO())
    progress = PlainProgress(plain, ["Writer", "Reviewer"])

    async def collect() -> list[Any]:
        return [e async for e in api.iter_run(
            api.load(sop_file), {"idea": "a snake game"}, api.RunOptions(model="scripted",
            workspace=root / "ws", gateway=Gateway(sleep=_no_sleep), observers=[progress, rich]))]

    with use_model(ScriptedModel(list(ANSWERS)), name="scripted"):
        events = asyncio.run(collect())
    return {"ws": root / "ws", "events": events, "plain": plain.getvalue(), "rich": rich}


def _show_json(capsys: pytest.CaptureFixture[str], ws: Path) -> dict[str, Any]:
    assert main(["show", str(ws), "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_iter_run_yields_the_reask_and_the_retry(troubled: dict[str, Any]) -> None:
    events = troubled["events"]
    assert isinstance(events[-1], RunEnded) and events[-1].status == RunStatus.IDLE
    model_events = [e for e in events if isinstance(e, (ModelAnswered, ModelRetried, AnswerRejected))]
    assert [(type(e).__name__, e.action, e.attempt) for e in model_events] == [
        ("ModelAnswered", "Write", 0), ("AnswerRejected", "Write", 0), ("ModelAnswered", "Write", 1),
        ("ModelRetried", "Review", 0), ("ModelAnswered", "Review", 0)]
    rejected, retried = model_events[1], model_events[3]
    assert rejected.reask and "no JSON object" in rejected.error
    assert retried.cause == "rate limited (429)" and retried.retry == 1
    assert {e.round for e in model_events if e.action == "Review"} == {2}


def test_the_journal_holds_the_reask_and_the_retry_with_its_cause(troubled: dict[str, Any]) -> None:
    with Journal.open(troubled["ws"]) as journal:
        rows = [(r.type, r.data) for r in journal.events()]
    kinds = [kind for kind, _ in rows]
    assert kinds.count("ModelAnswered") == 3 and "LLMCalled" not in kinds
    (rejected,) = [data for kind, data in rows if kind == "AnswerRejected"]
    (retried,) = [data for kind, data in rows if kind == "ModelRetried"]
    assert rejected["action"] == "Write" and rejected["reask"] is True and rejected["error"]
    assert retried["action"] == "Review" and retried["cause"] == "rate limited (429)"


def test_show_counts_retries_and_reasks_per_action_and_in_total(
        troubled: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    shown = _show_json(capsys, troubled["ws"])
    assert (shown["retries"], shown["reasks"], shown["llm_calls"]) == (1, 1, 3)
    actions = {a["action"]: a for a in shown["actions"]}
    assert (actions["Write"]["reasks"], actions["Write"]["retries"], actions["Write"]["calls"]) == (1, 0, 2)
    assert (actions["Review"]["retries"], actions["Review"]["reasks"], actions["Review"]["calls"]) == (1, 0, 1)
    assert main(["show", str(troubled["ws"])]) == 0
    text = capsys.readouterr().out
    assert "total: 3 model calls, 0 reused, 1 retries, 1 re-asks" in text
    assert "Writer.Write  [done]  calls 2" in text and "$0.0000  1 re-asks" in text
    assert "Reviewer.Review  [done]  calls 1" in text and "$0.0000  1 retries" in text


def test_the_displays_show_them_as_they_happen(troubled: dict[str, Any]) -> None:
    plain = troubled["plain"]
    assert "Writer: Write: invalid answer (attempt 1), asking again: " in plain
    assert re.search(r"Reviewer: Review: model error, retry 1 in \d\.\d s: rate limited \(429\)", plain)
    assert plain.index("invalid answer") < plain.index("Writer: Write done")
    assert "1 retries · 1 re-asks" in plain           # the headline of the last action line
    rich = troubled["rich"]
    assert rich.stats.usage.retries == 1 and rich.stats.usage.reasks == 1
    assert any("model error" in line for line in rich.logs)
    assert rich.stats.role_calls == {"Writer": 2, "Reviewer": 1}


def test_an_accepted_first_answer_is_one_journal_row(tmp_path: Path) -> None:
    """The happy path writes no more rows than the old per-call summary did."""
    result = api.run(api.load(TESTS / "sops" / "pipeline.sop.yaml"),
                     {"idea": "x"}, api.RunOptions(model="fake", workspace=tmp_path))
    with Journal.open(tmp_path) as journal:
        kinds = [r.type for r in journal.events()]
    assert kinds.count("ModelAnswered") == result.llm_calls == 3
    assert not {"ModelRetried", "AnswerRejected", "LLMCalled"} & set(kinds)
    assert (result.to_json()["retries"], result.to_json()["reasks"]) == (0, 0)


def test_a_resume_reports_reused_answers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    compiled = api.load(TESTS / "sops" / "pipeline.sop.yaml")
    api.run(compiled, {"idea": "x"}, api.RunOptions(model="fake", workspace=tmp_path, max_rounds=1))
    events: list[Any] = []

    class Keep:
        def on_event(self, event: Any) -> None:
            events.append(event)

    first = read_run(tmp_path)
    # the first action is complete: the resume re-runs nothing of it, so no answer is reused;
    # removing its artifact makes the resume run it again from its journaled answer
    (tmp_path / "docs" / "prd.json").unlink()
    resumed = api.resume(tmp_path, api.ResumeOptions(max_rounds=10, observers=(Keep(),)))
    reused = [e for e in events if isinstance(e, ModelAnswered) and e.reused]
    assert [e.action for e in reused] == ["WritePRD"] and resumed.reused_calls == 1
    assert first.usage.llm_calls == 1
    shown = _show_json(capsys, tmp_path)
    assert shown["reused_calls"] == 1 and shown["llm_calls"] == 3


# --- journals written before the gateway's events ---------------------------------------------


def _old_journal(ws: Path) -> None:
    """What an older sopctl wrote: one LLMCalled summary per call, a resume reusing one answer."""
    hash_ = "b" * 64
    start = RunStarted(run_id="r", sop_file="x", sop_name="x", sop_hash=hash_, inputs={},
                       model="fake", engine_version="0.1", workspace=str(ws), max_rounds=3,
                       budget_usd=0.0)
    message = {"id": "1-W-0", "round": 1, "content": "hi", "out": None, "cause_by": "Write",
               "sent_from": "W", "send_to": ["<all>"]}
    with Journal.create(ws, sop_name="x", sop_hash=hash_) as journal:
        for calls, reused in ((2, 0), (0, 1)):      # the run, then its resume
            for event in (start, RoundStarted(round=1, active_roles=["W"]),
                          ActionStarted(round=1, role="W", action="Write", key=f"k{reused}"),
                          LLMCalled(round=1, role="W", action="Write", calls=calls, reused=reused,
                                    prompt_tokens=10 * calls, completion_tokens=5 * calls,
                                    cost_usd=0.01 * calls),
                          ActionCompleted(round=1, role="W", action="Write", key=f"k{reused}",
                                          messages=[message]),
                          MessagePublished(message=message)):
                journal.on_event(event)
        journal.on_event(RunEnded(status=RunStatus.IDLE, rounds=1))
        journal.record("h1", "Write", _answer())
        journal.record("h2", "Write", _answer())


def _answer() -> Any:
    from engine.models.types import StoredAnswer

    return StoredAnswer("hi", 10, 5, 0.01)


def test_show_reads_a_journal_with_llmcalled_summaries(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    _old_journal(tmp_path)
    state = read_run(tmp_path)
    assert state.status == RunStatus.IDLE and state.invocations == 2
    assert state.usage == Usage(llm_calls=2, reused_calls=1, prompt_tokens=20,
                                completion_tokens=10, cost_usd=pytest.approx(0.02))
    stats = state.actions["Write"].usage
    assert (stats.llm_calls, stats.reused_calls, stats.retries, stats.reasks) == (2, 1, 0, 0)
    assert [(r.usage.llm_calls, r.usage.reused_calls) for r in state.timeline] == [(2, 0), (0, 1)]
    obj = result_object(state)
    assert (obj["llm_calls"], obj["reused_calls"], obj["retries"], obj["reasks"]) == (2, 1, 0, 0)
    assert "W.Write  [done]  calls 2  reused 0  tokens 20+10" in format_show(state)
    assert _show_json(capsys, tmp_path)["status"] == "idle"


# --- the status type and the usage value ------------------------------------------------------


def test_a_status_is_its_bare_string_in_json_and_the_journal(tmp_path: Path) -> None:
    result = api.run(api.load(TESTS / "sops" / "pipeline.sop.yaml"),
                     {"idea": "x"}, api.RunOptions(model="fake", workspace=tmp_path))
    assert result.status is RunStatus.IDLE and result.status == "idle"
    assert json.dumps(result.to_json()).startswith('{"status": "idle", ')
    conn = sqlite3.connect(journal_path(tmp_path))
    (row,) = conn.execute("SELECT json FROM events WHERE type = 'RunEnded'").fetchall()
    conn.close()
    assert row[0] == '{"error": "", "rounds": 3, "shared": {}, "status": "idle"}'
    assert f"{RunStatus.MAX_ROUNDS}" == "max_rounds"
    assert read_run(tmp_path).status is RunStatus.IDLE


def test_usage_is_a_value_that_adds_up() -> None:
    paid = Usage.of_answer(10, 5, 0.25)
    reused = Usage.of_answer(10, 5, 0.5, reused=True)
    total = Usage() + paid + reused + Usage(retries=1) + Usage(reasks=2)
    assert total == Usage(llm_calls=1, reused_calls=1, prompt_tokens=10, completion_tokens=5,
                          cost_usd=0.25, reused_cost_usd=0.5, retries=1, reasks=2)
    assert total.budget_spent_usd == 0.75 and paid + Usage() == paid
    assert sum([paid, paid], Usage()).llm_calls == 2
    with pytest.raises(AttributeError):
        paid.llm_calls = 3  # type: ignore[misc]
