"""A model's answer is bounded (issue 26): past `--max-answer-chars` (2,000,000 by default)
it is cut there before it is journaled and re-asked with the limit named; an HTTP body
past MAX_BODY_BYTES is not read further (a located error, never a MemoryError)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import pytest
import test_openai_http as _http
from test_hosted import answer
from test_openai_http import SELF_HOSTED, gateway, run_args, sopctl, text_spec

from engine.errors import LLMError, UsageError
from engine.journal.run_folder import journal_path
from engine.models import answers, openai_http
from engine.models.gateway import Gateway
from engine.models.types import CallSpec
from engine.run.options import RunOptions
from engine.testing import MemoryAnswerStore, ScriptedModel

server, sop_file = _http.server, _http.sop_file          # the same fixtures: a local server, a file


def spec(kind: str = "text", **kw: object) -> CallSpec:
    base: dict[str, object] = dict(action="Write", role="Writer", system="", prompt="Say it.",
                                   kind=kind, model="scripted", retries=2)
    base.update(kw)
    return CallSpec(**base)  # type: ignore[arg-type]


def scripted_gateway(script: list[str], limit: int, store: MemoryAnswerStore | None = None
                     ) -> tuple[Gateway, ScriptedModel]:
    model = ScriptedModel(script)
    return Gateway(providers={"scripted": model}, store=store, max_answer_chars=limit), model


@pytest.mark.parametrize("kind, long, short", [
    ("text", "x" * 5000, "a short answer"),
    ("code", "```python\n" + "print(1)\n" * 1000 + "```", "```python\nprint(2)\n```"),
    ("json", json.dumps({"title": "t" * 5000}), json.dumps({"title": "ok"})),
])
def test_an_answer_over_the_limit_is_cut_journaled_cut_and_re_asked(kind: str, long: str, short: str) -> None:
    store = MemoryAnswerStore()
    schema = {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}
    gate, model = scripted_gateway([long, short], 1000, store)
    result = asyncio.run(gate.call(spec(kind, schema=schema if kind == "json" else None)))
    assert result.attempts == 2 and result.text == short
    journaled = [a.text for a in store.answers.values()]
    assert all(len(text) < 1100 for text in journaled)             # never the 5,000 characters
    assert any("the answer was cut here" in text for text in journaled)
    reask = model.requests[1].messages[-1]["content"]
    assert "longer than the 1,000 characters an answer may have" in reask


def test_an_answer_always_over_the_limit_fails_its_action_naming_the_limit() -> None:
    gate, _ = scripted_gateway(["y" * 3000] * 3, 1000)
    with pytest.raises(Exception) as info:
        asyncio.run(gate.call(spec()))
    message = getattr(info.value, "message", str(info.value))
    assert "after 3 attempt(s)" in message and "1,000 characters" in message


def test_a_resume_reads_a_cut_answer_back_as_over_the_limit() -> None:
    """The journal holds the cut answer; read back (a resume), it is re-asked again, not
    taken: the cut text is still longer than the limit."""
    store = MemoryAnswerStore()
    gate, _ = scripted_gateway(["z" * 2000, "fine"], 1000, store)
    asyncio.run(gate.call(spec()))
    again, model = scripted_gateway(["fine"], 1000, store)
    result = asyncio.run(again.call(spec()))
    assert result.value == "fine" and model.requests == []          # both answers reused
    assert (result.usage.llm_calls, result.usage.reused_calls) == (0, 2)


def test_a_choice_over_the_limit_is_read_from_its_cut_text() -> None:
    gate, _ = scripted_gateway(["1" + " " * 5000], 1000)
    result = asyncio.run(gate.call(spec("choice", n_choices=3)))
    assert result.value == 1


def test_the_default_limit_is_a_million_characters() -> None:
    assert Gateway().max_answer_chars == answers.MAX_ANSWER_CHARS == 2_000_000
    text = "a" * 2_000_000
    assert answers.cut_answer(text, answers.MAX_ANSWER_CHARS) is text
    assert answers.over_limit(text + "a", answers.MAX_ANSWER_CHARS) is not None


def test_a_run_cuts_a_50_mb_answer_and_re_asks_within_the_flag(server, sop_file, tmp_path: Path,
                                                                capsys) -> None:
    """Through the real CLI and a real HTTP server: a 50 MB answer never reaches the journal."""
    server.replies = [(200, {}, answer("w" * 50_000_000)), (200, {}, answer("hello, shorter"))]
    code, out, err = sopctl(capsys, *run_args(server, sop_file, tmp_path), "--max-answer-chars", "20000")
    assert code == 0, err
    assert len(server.requests) == 2
    assert "20,000 characters an answer may have" in server.requests[1]["messages"][-1]["content"]
    conn = sqlite3.connect(journal_path(tmp_path / "ws"))
    longest = conn.execute("SELECT max(length(text)) FROM answers").fetchone()[0]
    conn.close()
    assert longest < 21_000
    assert json.loads(out)["status"] == "idle"


@pytest.mark.parametrize("value", ["0", "-5", "many"])
def test_a_bad_max_answer_chars_is_refused(sop_file, capsys, value: str) -> None:
    with pytest.raises(SystemExit) as info:
        sopctl(capsys, "run", str(sop_file), "--idea", "x", "--model", "fake",
               "--max-answer-chars", value)
    err = capsys.readouterr().err
    assert info.value.code == 2 and "--max-answer-chars" in err and "Traceback" not in err


def test_an_endless_http_body_is_not_read_past_its_bound(server, monkeypatch) -> None:
    """A body past MAX_BODY_BYTES: a located error (not retried: asking again pays again),
    and memory never holds more than the bound."""
    monkeypatch.setattr(openai_http, "MAX_BODY_BYTES", 100_000)
    server.replies = [(200, {}, answer("v" * 200_000))]
    with pytest.raises(LLMError) as info:
        asyncio.run(gateway(server, []).call(text_spec()))
    assert "over 100,000 bytes" in info.value.message and "action WritePRD" in info.value.message
    assert len(server.requests) == 1


def test_a_body_within_the_bound_is_read_as_before(server) -> None:
    server.replies = [(200, {"content-encoding": "identity"}, answer("just right"))]
    assert asyncio.run(gateway(server, []).call(text_spec())).value == "just right"
    assert server.requests[0]["model"] == SELF_HOSTED.split("/", 1)[1]


def test_the_python_api_takes_the_limit_and_refuses_a_bad_one() -> None:
    assert RunOptions(max_answer_chars=5000).max_answer_chars == 5000
    with pytest.raises(UsageError, match="max_answer_chars"):
        RunOptions(max_answer_chars=0)


def test_tool_call_arguments_nested_past_the_decoder_are_re_asked(server) -> None:
    """A model's function call whose `arguments` nest past the JSON decoder's depth: the
    step is read with those arguments as text (the tool loop's argument check tells the
    model), never a failed call (it was an internal RecursionError, the action failed)."""
    from test_openai_http import tool_answer, tool_spec

    deep = tool_answer()
    deep["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = "[" * 100_000 + "]" * 100_000
    server.replies = [(200, {}, deep)]
    gate = Gateway(providers={SELF_HOSTED: openai_http.HostedModels(api_base=server.base)})
    result = asyncio.run(gate.call(tool_spec(SELF_HOSTED)))
    command = result.value["commands"][0]
    assert command["command_name"] == "editor.write" and set(command["args"]) == {"arguments"}
