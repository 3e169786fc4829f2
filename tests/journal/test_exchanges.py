"""The whole exchange in the journal: every request's messages as sent, with its answer, for
model calls, re-asks and questions to a person; secrets redacted, long texts compressed;
`sopctl show --prompts [ACTION]` and `read_exchanges` read it back."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from engine import api
from engine.compile.compiler import compile_path, compile_text
from engine.cli.commands import main
from engine.errors import UsageError
from engine.journal.history import read_exchanges, read_run
from engine.journal.codec import EXCHANGE_COMPRESS_AT, unpack_exchange
from engine.journal.run_folder import journal_path
from engine.load.secrets import REDACTED
from engine.testing import ScriptedModel, ScriptedPerson, use_model

TITLE = """\
apiVersion: sop/v1
name: titled
inputs:
  idea: {type: str, required: true}
actions:
  Draft:
    prompt: "Draft a title for {{ inputs.idea }}."
    output:
      Title: {type: str, instruction: a title}
    max_retries: 1
roles:
  Writer:
    profile: Writer
    goal: name things well
    actions: [Draft]
    watch: [UserRequirement]
"""

ASK = """\
apiVersion: sop/v1
name: asked
inputs:
  idea: {type: str, required: true}
actions:
  AskScope:
    kind: ask
    prompt: "How many pages on {{ inputs.idea }}?"
    output: text
roles:
  Lead:
    actions: [AskScope]
    watch: [UserRequirement]
"""


def run_titled(tmp_path: Path, idea: str = "green tea", answers: list[str] | None = None) -> Path:
    """A run whose model first answers with no JSON (re-asked), then with a title."""
    model = ScriptedModel(answers or ["no idea", '{"Title": "Leaf"}'])
    with use_model(model):
        sop = tmp_path / "titled.sop.yaml"      # a file: a replay compiles it again
        sop.write_text(TITLE, encoding="utf-8")
        result = api.run(compile_path(sop), {"idea": idea}, api.RunOptions(workspace=tmp_path / "run"))
    assert result.status == "idle", result.error
    return tmp_path / "run"


def test_every_request_is_kept_as_sent_with_its_answer(tmp_path: Path) -> None:
    run = run_titled(tmp_path)
    first, reask = read_exchanges(run)
    assert (first.role, first.action, first.attempt, first.origin) == ("Writer", "Draft", 0, "model")
    assert [m["role"] for m in first.messages] == ["system", "user"]
    assert "Draft a title for green tea." in first.messages[1]["content"]
    assert first.answer == "no idea"
    assert reask.attempt == 1 and reask.answer == '{"Title": "Leaf"}'
    # the re-ask is the whole conversation: the rejected answer and the request to fix it
    assert [m["role"] for m in reask.messages] == ["system", "user", "assistant", "user"]
    assert reask.messages[2]["content"] == "no idea"
    assert "could not be accepted" in reask.messages[3]["content"]


def test_show_prompts_prints_them_and_json_includes_them(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    run = run_titled(tmp_path)
    assert main(["show", str(run), "--prompts"]) == 0
    text = capsys.readouterr().out
    assert "Writer.Draft" in text and "re-ask 1" in text
    assert "--- system" in text and "Draft a title for green tea." in text and "--- answer" in text
    assert main(["show", str(run), "--prompts", "Writer.Draft", "--format", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["status"] == "idle"
    assert [p["attempt"] for p in shown["prompts"]] == [0, 1]
    assert shown["prompts"][1]["messages"][2] == {"role": "assistant", "content": "no idea"}


def test_an_action_without_prompts_is_a_clear_error(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    run = run_titled(tmp_path)
    assert main(["show", str(run), "--prompts", "Nowhere"]) == 2
    err = capsys.readouterr().err
    assert "no exchange for action 'Nowhere'" in err and "Draft" in err
    with pytest.raises(UsageError):
        read_exchanges(run, "Nowhere")


def test_secrets_never_reach_the_journal_not_even_compressed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "sk-very-secret-0123456789"
    monkeypatch.setenv("TEA_API_KEY", secret)
    run = run_titled(tmp_path, idea=f"tea with key {secret} " + "and more " * 300)
    exchanges = read_exchanges(run)
    assert all(secret not in m["content"] for e in exchanges for m in e.messages)
    assert REDACTED in exchanges[0].messages[1]["content"]
    for path in journal_path(run).parent.iterdir():
        assert secret.encode() not in path.read_bytes(), path


def test_a_token_on_a_line_of_its_own_never_reaches_the_journal(tmp_path: Path) -> None:
    """A key-shaped token that no variable names, at the start of a line of the prompt: the
    journal keeps the request as JSON, where that line starts after `\\n`."""
    token = "ghp_AbCdEf0123456789AbCdEf0123456789AbCd"
    run = run_titled(tmp_path, idea=f"a tea shop\n{token}\nthat sells tea")
    assert all(token not in m["content"] for e in read_exchanges(run) for m in e.messages)
    for path in journal_path(run).parent.iterdir():
        assert token.encode() not in path.read_bytes(), path


def test_long_requests_are_compressed_and_read_back_whole(tmp_path: Path) -> None:
    idea = "a tea house " * (EXCHANGE_COMPRESS_AT // 4)   # far over EXCHANGE_COMPRESS_AT
    run = run_titled(tmp_path, idea=idea)
    with sqlite3.connect(journal_path(run)) as conn:
        kinds = [r[0] for r in conn.execute("SELECT typeof(data) FROM exchanges")]
        stored = sum(r[0] for r in conn.execute("SELECT length(data) FROM exchanges"))
    assert kinds[0] == "blob"       # the re-ask begins with the first request: stored as what it adds
    sent = sum(len(json.dumps({"messages": e.messages})) for e in read_exchanges(run))
    assert sent > 2 * EXCHANGE_COMPRESS_AT and stored < sent / 4
    assert idea.strip() in read_exchanges(run)[0].messages[1]["content"]


def test_a_schema_sent_again_is_stored_once_and_read_back_with_each_request(tmp_path: Path) -> None:
    """A model that takes the schema as `response_format` gets it with every request (each
    step of a loop, each re-ask): the journal keeps it with the first request only, and every
    request reads back with it."""
    with use_model(ScriptedModel(["no idea", '{"Title": "Leaf"}'], schema_support=True)):
        sop = tmp_path / "titled.sop.yaml"
        sop.write_text(TITLE, encoding="utf-8")
        result = api.run(compile_path(sop), {"idea": "green tea"}, api.RunOptions(workspace=tmp_path / "run"))
    assert result.status == "idle", result.error
    first, reask = read_exchanges(tmp_path / "run")
    assert first.response_format is not None and "Title" in json.dumps(first.response_format)
    assert reask.response_format == first.response_format
    with sqlite3.connect(journal_path(tmp_path / "run")) as conn:
        rows = [unpack_exchange(key, data) for key, data in conn.execute("SELECT request_hash, data FROM exchanges")]
    assert sum("response_format" in row for row in rows) == 1, rows
    assert any(row.get("same_format") for row in rows)


def test_a_journal_from_before_prompts_reads_without_them(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    run = run_titled(tmp_path)
    with sqlite3.connect(journal_path(run)) as conn:
        conn.execute("DROP TABLE exchanges")      # what a journal of an older sopctl lacks
    exchanges = read_exchanges(run)
    assert [e.answer for e in exchanges] == ["no idea", '{"Title": "Leaf"}']
    assert all(e.messages == [] for e in exchanges)
    assert main(["show", str(run), "--prompts"]) == 0
    assert "did not keep this request's messages" in capsys.readouterr().out
    assert read_run(run).usage.llm_calls == 2


def test_a_question_to_a_person_is_an_exchange(tmp_path: Path) -> None:
    result = api.run(compile_text(ASK), {"idea": "tea"}, api.RunOptions(workspace=tmp_path / "run",
                     person=ScriptedPerson(["three"])))
    assert result.status == "idle", result.error
    (asked,) = read_exchanges(tmp_path / "run")
    assert (asked.origin, asked.role, asked.action) == ("person", "Lead", "AskScope")
    assert "How many pages on tea?" in asked.messages[0]["content"]
    assert "three" in asked.answer


def test_a_replay_keeps_the_prompts_it_reused(tmp_path: Path) -> None:
    run = run_titled(tmp_path)
    folder = api.open_for_replay(run)
    with use_model(ScriptedModel([])):              # asked nothing: every answer is reused
        replayed = api.replay(folder, tmp_path / "again")
    assert not replayed.diverged
    copied = read_exchanges(tmp_path / "again")
    assert [e.origin for e in copied] == ["replay", "replay"]
    assert [e.messages for e in copied] == [e.messages for e in read_exchanges(run)]


TOOLED = """\
apiVersion: sop/v1
name: tooled
inputs:
  idea: {type: str, required: true}
actions:
  Write: {prompt: "Write {{ inputs.idea }}", tools: [editor]}
roles:
  Writer: {actions: [Write], watch: [UserRequirement]}
"""


def test_a_tool_result_is_shown_as_a_command_and_its_result(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Not as a model call of round 0 from an older sopctl: a tool's journaled result."""
    model = ScriptedModel([{"commands": [{"command_name": "editor.write", "args": {"path": "a.md", "content": "hi"}}]},
                           {"commands": [{"command_name": "end", "args": {"answer": "done"}}]}])
    with use_model(model):
        api.run(compile_text(TOOLED), {"idea": "x"}, api.RunOptions(workspace=tmp_path / "ws"))
    (tool,) = [e for e in read_exchanges(tmp_path / "ws") if e.origin == "tool"]
    assert (tool.round, tool.role, tool.action) == (1, "Writer", "Write")
    assert json.loads(tool.messages[0]["content"]) == {"command_name": "editor.write",
                                                       "args": {"path": "a.md", "content": "hi"}}
    assert main(["show", str(tmp_path / "ws"), "--prompts", "Write"]) == 0
    out = capsys.readouterr().out
    assert "round 1  Writer.Write  a tool's result (no model call)" in out and "--- answer (the tool)" in out
    assert "older than" not in out
