"""Provider manners of hosted models, against litellm and a local OpenAI-compatible server on
127.0.0.1 (never the network): a default timeout, Retry-After on 429 and 503, an answer
without choices or without usage, an unknown price."""

from __future__ import annotations

import asyncio
import email.utils
import http.server
import json
import threading
import time
from typing import Any
from collections.abc import Iterator

import pytest
from run_helpers import TESTS, sopctl_in_process

from engine.errors import LLMError
from engine.models.gateway import Gateway
from engine.models.hosted import DEFAULT_TIMEOUT_S, LiteLLMProvider, _parse_retry_after
from engine.models.types import CallSpec, ModelRequest, Price
from engine.testing import allow_real_models

MODEL = "openai/self-hosted-test-model"        # unknown to litellm's price map


class FakeServer:
    """An OpenAI-compatible chat server whose answers the test queues: (status, headers, body);
    a body of None stalls until the server stops."""

    def __init__(self) -> None:
        self.replies: list[tuple[int, dict[str, str], Any]] = []
        self.requests: list[dict[str, Any]] = []
        self.seen: list[tuple[str, dict[str, str]]] = []     # each request's path and headers
        self.stop = threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return None

            def do_POST(self) -> None:
                size = int(self.headers.get("content-length", 0))
                server.requests.append(json.loads(self.rfile.read(size) or b"{}"))
                server.seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
                status, headers, body = server.replies.pop(0) if server.replies else (500, {}, {})
                if body is None:
                    server.stop.wait()
                    return
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                try:
                    self.send_response(status)
                    for name, value in {**headers, "content-type": "application/json",
                                        "content-length": str(len(data))}.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.block_on_close = False
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self) -> None:
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def answer(content: str = "hello there", *, usage: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {"id": "c1", "object": "chat.completion", "created": 1, "model": "m",
                            "choices": [{"index": 0, "finish_reason": "stop",
                                         "message": {"role": "assistant", "content": content}}]}
    if usage:
        body["usage"] = {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}
    return body


def no_choices() -> dict[str, Any]:
    return {**answer(), "choices": []}


RATE_LIMITED = {"error": {"message": "slow down", "type": "rate_limit_error"}}


@pytest.fixture
def server() -> Iterator[FakeServer]:
    fake = FakeServer()
    try:
        with allow_real_models():                 # a real litellm call, to 127.0.0.1 only
            yield fake
    finally:
        fake.close()


def spec(**kw: Any) -> CallSpec:
    base: dict[str, Any] = dict(action="Write", role="Writer", system="You write.",
                                prompt="Say hello.", kind="text", model=MODEL)
    base.update(kw)
    return CallSpec(**base)


def gateway_for(server: FakeServer, waits: list[float] | None = None, **kw: Any) -> Gateway:
    provider = LiteLLMProvider(completion_kwargs={"api_base": server.base, "api_key": "sk-local-test"})

    async def record(seconds: float) -> None:
        if waits is not None:
            waits.append(seconds)

    return Gateway(providers={MODEL: provider}, sleep=record, **kw)


def call(gateway: Gateway, call_spec: CallSpec) -> Any:
    return asyncio.run(gateway.call(call_spec))


# ----------------------------------------------------------------------------- timeout


def test_a_hosted_call_has_a_default_timeout_unless_the_file_sets_one():
    provider = LiteLLMProvider()
    request = ModelRequest(spec(), ({"role": "user", "content": "x"},), None)
    assert provider._kwargs(MODEL, request)["timeout"] == DEFAULT_TIMEOUT_S < 6000
    shorter = ModelRequest(spec(timeout_s=5.0), request.messages, None)
    assert provider._kwargs(MODEL, shorter)["timeout"] == 5.0


def test_a_stalled_server_is_cut_at_the_timeout_and_retried(server):
    server.replies = [(200, {}, None), (200, {}, answer("after the stall"))]
    result = call(gateway_for(server), spec(timeout_s=0.5))
    assert result.value == "after the stall" and result.usage.retries == 1
    assert "Timeout" in next(e.cause for e in result.events if hasattr(e, "cause"))


def test_llm_timeout_s_is_resolved_from_action_role_and_file():
    from engine.compile.compiler import compile_text
    from engine.models.registry import resolve_llm

    text = """
apiVersion: sop/v1
name: t
llm: {timeout_s: 30}
actions:
  X: {prompt: "x", context: none, output: text, llm: {timeout_s: 10}}
  Y: {prompt: "y", context: none, output: text}
roles:
  A: {actions: [X, Y], watch: [UserRequirement], llm: {timeout_s: 20}}
"""
    compiled = compile_text(text)
    assert resolve_llm(compiled, "A", "X", None)["timeout_s"] == 10
    assert resolve_llm(compiled, "A", "Y", None)["timeout_s"] == 20


# ----------------------------------------------------------------------------- Retry-After


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_seconds_are_honoured(server, status):
    server.replies = [(status, {"Retry-After": "7"}, RATE_LIMITED), (200, {}, answer())]
    waits: list[float] = []
    result = call(gateway_for(server, waits), spec())
    assert result.value == "hello there" and waits == [7.0]


def test_retry_after_ms_is_preferred_when_given(server):
    server.replies = [(429, {"Retry-After": "7", "retry-after-ms": "1500"}, RATE_LIMITED),
                      (200, {}, answer())]
    waits: list[float] = []
    call(gateway_for(server, waits), spec())
    assert waits == [1.5]


def test_retry_after_as_an_http_date_and_capped_at_the_longest_backoff(server):
    later = email.utils.formatdate(time.time() + 3600, usegmt=True)
    server.replies = [(429, {"Retry-After": later}, RATE_LIMITED), (200, {}, answer())]
    waits: list[float] = []
    call(gateway_for(server, waits, backoff_max_s=30.0), spec())
    assert waits == [30.0]


def test_retry_after_values():
    assert _parse_retry_after("2.5") == 2.5 and _parse_retry_after("-3") == 0.0
    assert _parse_retry_after(email.utils.formatdate(time.time() - 60, usegmt=True)) == 0.0
    assert 50 < (_parse_retry_after(email.utils.formatdate(time.time() + 60, usegmt=True)) or 0) <= 60
    assert _parse_retry_after("soon") is None and _parse_retry_after("") is None


def test_a_429_without_retry_after_backs_off_as_usual(server):
    server.replies = [(429, {}, RATE_LIMITED), (200, {}, answer())]
    waits: list[float] = []
    call(gateway_for(server, waits, backoff_s=1.0), spec())
    assert len(waits) == 1 and 0.5 <= waits[0] <= 1.0


# ----------------------------------------------------------------------------- odd bodies


def test_an_answer_without_choices_is_retried_then_a_clear_error(server):
    server.replies = [(200, {}, no_choices()), (200, {}, answer("second time"))]
    assert call(gateway_for(server), spec()).value == "second time"
    server.replies = [(200, {}, no_choices())] * 3
    with pytest.raises(LLMError, match="no choices") as info:
        call(gateway_for(server, transient_retries=2), spec())
    assert "IndexError" not in str(info.value)


def test_an_answer_without_usage_has_its_tokens_counted_locally(server):
    server.replies = [(200, {}, answer("a few words of answer", usage=False))]
    result = call(gateway_for(server), spec())
    assert result.usage.prompt_tokens > 0 and result.usage.completion_tokens > 0


def test_usage_given_by_the_server_is_taken_as_is(server):
    server.replies = [(200, {}, answer())]
    result = call(gateway_for(server), spec())
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (11, 3)


# ----------------------------------------------------------------------------- price


def test_an_unknown_price_is_zero_and_marked_unpriced(server):
    server.replies = [(200, {}, answer())]
    result = call(gateway_for(server), spec())
    answered = result.events[-1]
    assert answered.cost_usd == 0.0 and answered.unpriced


def test_a_price_given_by_the_user_prices_a_self_hosted_model(server):
    server.replies = [(200, {}, answer())]
    price = Price(1e-6, 2e-6)                     # $1 and $2 per million tokens
    result = call(gateway_for(server), spec(fallback_price=price))
    answered = result.events[-1]
    assert answered.cost_usd == pytest.approx(11e-6 + 6e-6) and not answered.unpriced


def test_a_users_price_never_replaces_a_known_one():
    provider = LiteLLMProvider(completion_kwargs={"mock_response": "hi"})
    gateway = Gateway(providers={"openai/gpt-4o-mini": provider})
    known = call(gateway, spec(model="openai/gpt-4o-mini"))
    cheap = call(gateway, spec(model="openai/gpt-4o-mini", prompt="Say hi.",
                               fallback_price=Price(0.0, 0.0)))
    assert known.usage.cost_usd > 0 and cheap.usage.cost_usd > 0


# ----------------------------------------------------------------------------- the command line

TEXT_SOP = """
apiVersion: sop/v1
name: hello
inputs:
  idea: {type: str, required: true}
actions:
  Write: {prompt: "{{ inputs.idea }}", context: none, output: text}
roles:
  Writer: {actions: [Write], watch: [UserRequirement]}
"""


sopctl = sopctl_in_process


@pytest.fixture
def sop_file(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local-test-key-0000")
    monkeypatch.delenv("SOPCTL_MODEL", raising=False)
    path = tmp_path / "hello.sop.yaml"
    path.write_text(TEXT_SOP, encoding="utf-8")
    return path


def test_api_base_flag_reaches_the_server_and_show_says_the_cost_is_unknown(server, sop_file, tmp_path, capsys):
    server.replies = [(200, {}, answer("hello from the server"))]
    ws = tmp_path / "ws"
    code, out, err = sopctl(capsys, "run", str(sop_file), "--idea", "greet", "--model", MODEL,
                            "--api-base", server.base, "--out", str(ws), "--format", "json")
    assert code == 0, err
    assert server.requests and server.requests[0]["model"] == "self-hosted-test-model"
    code, out, _ = sopctl(capsys, "show", str(ws))
    assert "cost unknown: 1 model call(s) priced $0" in out
    code, out, _ = sopctl(capsys, "show", str(ws), "--format", "json")
    assert json.loads(out)["unpriced_calls"] == 1


def test_price_flag_prices_a_self_hosted_model(server, sop_file, tmp_path, capsys):
    server.replies = [(200, {}, answer())]
    ws = tmp_path / "ws"
    code, out, err = sopctl(capsys, "run", str(sop_file), "--idea", "greet", "--model", MODEL,
                            "--api-base", server.base, "--price", "1,2", "--out", str(ws),
                            "--format", "json")
    assert code == 0, err
    assert json.loads(out)["cost_usd"] == pytest.approx(11e-6 + 6e-6)
    code, out, _ = sopctl(capsys, "show", str(ws))
    assert "cost unknown" not in out


def test_the_files_price_prices_a_self_hosted_model(server, sop_file, tmp_path, capsys):
    sop_file.write_text(TEXT_SOP.replace(
        "name: hello", "name: hello\nllm: {price: {input_per_million: 1, output_per_million: 2}}"))
    server.replies = [(200, {}, answer())]
    code, out, err = sopctl(capsys, "run", str(sop_file), "--idea", "greet", "--model", MODEL,
                            "--api-base", server.base, "--out", str(tmp_path / "ws"),
                            "--format", "json")
    assert code == 0, err
    assert json.loads(out)["cost_usd"] == pytest.approx(11e-6 + 6e-6)


def test_the_price_flag_beats_the_files_price(server, sop_file, tmp_path, capsys):
    sop_file.write_text(TEXT_SOP.replace(
        "name: hello", "name: hello\nllm: {price: {input_per_million: 1, output_per_million: 2}}"))
    server.replies = [(200, {}, answer())]
    code, out, err = sopctl(capsys, "run", str(sop_file), "--idea", "greet", "--model", MODEL,
                            "--api-base", server.base, "--price", "10,20", "--out",
                            str(tmp_path / "ws"), "--format", "json")
    assert code == 0, err
    assert json.loads(out)["cost_usd"] == pytest.approx(10 * (11e-6 + 6e-6))


@pytest.mark.parametrize("key", ["api_base", "base_url", "api_key"])
def test_a_shared_file_cannot_say_where_the_key_goes(sop_file, capsys, key):
    sop_file.write_text(TEXT_SOP.replace("name: hello", f"name: hello\nllm: {{{key}: http://evil.example}}"))
    code, out, err = sopctl(capsys, "validate", str(sop_file))
    assert code == 1 and f"unknown key '{key}' in /llm" in out + err


@pytest.mark.parametrize("flags", [["--price", "1"], ["--price", "-1,2"], ["--price", "nan,1"],
                                   ["--api-base", "file:///etc/passwd"]])
def test_bad_price_or_api_base_flags_are_refused(sop_file, capsys, flags):
    with pytest.raises(SystemExit) as info:
        sopctl(capsys, "run", str(sop_file), "--idea", "x", *flags)
    assert info.value.code == 2


def test_resume_takes_api_base_and_price_from_its_own_command_line(server, sop_file, tmp_path, capsys):
    ws = tmp_path / "ws"
    server.replies = [(400, {}, {"error": {"message": "bad request", "type": "invalid_request"}})]
    code, _, err = sopctl(capsys, "run", str(sop_file), "--idea", "greet", "--model", MODEL,
                          "--api-base", server.base, "--out", str(ws))
    assert code == 1, err
    server.replies = [(200, {}, answer("second try"))]
    code, out, err = sopctl(capsys, "resume", str(ws), "--api-base", server.base,
                            "--price", "1,2", "--format", "json")
    assert code == 0, err
    assert len(server.requests) == 2 and json.loads(out)["cost_usd"] == pytest.approx(17e-6)


def test_a_run_killed_between_two_attempts_resumes_without_asking_the_first_again(
        server, sop_file, tmp_path, capsys, forked_sopctl):
    """A real process journals an invalid (empty) answer and is killed before its re-ask:
    the resume reuses that answer and sends the re-ask it was about to send."""
    server.replies = [(200, {}, answer(""))]
    ws = tmp_path / "ws"
    crashed = forked_sopctl("run", str(sop_file), "--idea", "greet", "--model", MODEL,
                            "--api-base", server.base, "--out", str(ws),
                            env={"SOPCTL_CRASH_AFTER_ANSWER": "1",
                                 "OPENAI_API_KEY": "sk-local-test-key-0000"})
    assert crashed.returncode == 137 and len(server.requests) == 1, crashed.stderr
    server.replies = [(200, {}, answer("hello there"))]
    code, out, err = sopctl(capsys, "resume", str(ws), "--api-base", server.base, "--format", "json")
    assert code == 0, err
    assert len(server.requests) == 2
    assert "could not be accepted: the answer is empty" in server.requests[1]["messages"][-1]["content"]
    assert (json.loads(out)["llm_calls"], json.loads(out)["reused_calls"]) == (1, 1)


def test_a_failing_fan_out_item_leaves_no_never_awaited_warning(server, tmp_path, monkeypatch):
    """Its siblings are cancelled, some inside litellm's executor step: no warning may say
    a coroutine was never awaited (the process's stderr is the user's screen)."""
    import gc
    import warnings

    from engine.cli.commands import main

    monkeypatch.setenv("OPENAI_API_KEY", "sk-local-test-key-0000")
    code = answer("```python\nprint(1)\n```")
    files = [f"f{i}.py" for i in range(8)]
    server.replies = [(200, {}, answer(json.dumps({"Task list": files}))), (200, {}, code),
                      (400, {}, {"error": {"message": "bad request", "type": "invalid_request_error"}}),
                      *[(200, {}, code)] * 8]
    fanout = TESTS / "sops" / "fanout.sop.yaml"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        status = main(["run", str(fanout), "--idea", "x", "--model", MODEL, "--api-base", server.base,
                       "--out", str(tmp_path / "ws")])
        gc.collect()
    assert status == 1
    assert [str(w.message) for w in caught if "never awaited" in str(w.message)] == []


# ----------------------------------------------------------------------------- tool loops

def test_a_tool_step_uses_the_providers_tool_calling(server):
    """A model litellm knows to call functions gets our commands as `tools`; its tool calls
    come back as our command list."""
    from engine.run.toolloop import step_schema

    body = answer("writing it")
    body["choices"][0]["finish_reason"] = "tool_calls"
    body["choices"][0]["message"]["tool_calls"] = [
        {"id": "t1", "type": "function",
         "function": {"name": "editor__write", "arguments": json.dumps({"path": "a.md", "content": "x"})}}]
    server.replies.append((200, {}, body))
    model = "openai/gpt-4o-mini"
    provider = LiteLLMProvider(completion_kwargs={"api_base": server.base, "api_key": "sk-local-test"})
    gateway = Gateway(providers={model: provider})
    commands = (("editor.write", {"type": "object", "properties": {"path": {"type": "string"},
                                                                  "content": {"type": "string"}}}),
                ("end", {"type": "object", "properties": {"answer": {"type": "string"}}}))
    result = call(gateway, spec(kind="json", model=model, schema=step_schema(["editor.write", "end"]),
                                commands=commands, tool_step=0))
    sent = server.requests[0]
    assert [t["function"]["name"] for t in sent["tools"]] == ["editor__write", "end"]
    assert sent["tool_choice"] == "required" and "response_format" not in sent
    assert result.value == {"thought": "writing it", "commands": [
        {"command_name": "editor.write", "args": {"path": "a.md", "content": "x"}}]}


def test_a_model_without_known_tool_calling_gets_the_command_list_in_the_prompt():
    from engine.models.hosted import native_tools

    step = spec(kind="json", commands=(("editor.write", {"type": "object"}),), tool_step=0)
    assert native_tools(MODEL, step) is None                       # unknown to litellm
    assert native_tools("openai/gpt-4o-mini", spec(kind="json")) is None   # not a tool step
