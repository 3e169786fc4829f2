"""Hosted faults not covered by the fault proxy's first run: a server that always stalls,
`choices: []`, `content: null`, a missing `usage`, a 401 or 400 that echoes the key, a long
`Retry-After`. Each ends in a retry or a clear diagnostic, never a traceback, and the key is
never in a message or the journal."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from engine.errors import LLMError, SopError
from engine.journal.run_folder import journal_path
from engine.models.gateway import Gateway
from engine.models.openai_http import HostedModels
from test_hosted import answer
import test_openai_http as _http
from test_openai_http import KEY, gateway, run_args, sopctl, text_spec

server, sop_file = _http.server, _http.sop_file          # the same fixtures: a local server, a file


def _nothing(body: dict) -> dict:
    body["choices"][0]["message"]["content"] = None
    return body


@pytest.mark.parametrize("reply, words", [
    ({"id": "x", "object": "chat.completion", "choices": [], "usage": {}}, "gave up after 6 attempts"),
    (_nothing(answer("unused")), "after 3 attempt(s); last error: the answer is empty"),  # re-asked
])
def test_an_answer_with_nothing_in_it_is_retried_then_a_clear_error(server, reply, words):
    server.replies = [(200, {}, reply)] * 8
    with pytest.raises(SopError) as info:
        asyncio.run(gateway(server, []).call(text_spec()))
    assert words in info.value.message


def test_an_answer_without_usage_is_taken_with_its_tokens_counted(server):
    body = answer("hello")
    body.pop("usage", None)
    server.replies = [(200, {}, body)]
    result = asyncio.run(gateway(server, []).call(text_spec()))
    assert result.value == "hello" and result.usage.completion_tokens > 0


def test_a_long_retry_after_is_capped_at_the_longest_backoff(server):
    server.replies = [(429, {"Retry-After": "86400"}, {"error": {"message": "come back tomorrow"}}),
                      (200, {}, answer("now"))]
    waits: list[float] = []
    gate = gateway(server, waits)
    result = asyncio.run(gate.call(text_spec()))
    assert result.value == "now" and waits == [gate.backoff_max_s]


def test_a_server_that_always_stalls_gives_up_after_its_attempts(server):
    server.replies = [(200, {}, None)] * 3                    # None: the server never answers
    waits: list[float] = []

    async def record(seconds: float) -> None:
        waits.append(seconds)

    gate = Gateway(providers={text_spec().model: HostedModels(api_base=server.base)}, sleep=record,
                   transient_retries=2)
    spec = text_spec()
    with pytest.raises(LLMError, match="gave up after 3 attempts"):
        asyncio.run(gate.call(replace(spec, timeout_s=0.5)))
    assert len(server.requests) == 3 and len(waits) == 2


@pytest.mark.parametrize("status", [400, 401])
def test_an_error_that_echoes_the_key_keeps_it_out_of_the_output_and_the_journal(
        server, sop_file, tmp_path: Path, capsys, status: int):
    server.replies = [(status, {}, {"error": {"message": f"bad request for key {KEY}; "
                                                         f"Authorization: Bearer {KEY}"}})]
    code, out, err = sopctl(capsys, *run_args(server, sop_file, tmp_path))
    assert code != 0 and "Traceback" not in err + out
    assert KEY not in err + out
    journal = journal_path(tmp_path / "ws")
    blobs = b"".join(p.read_bytes() for p in journal.parent.iterdir() if p.is_file())
    assert KEY.encode() not in blobs


# --- more of each kind (issue 26: "more of each are tried after you land") ------------------

def _with(body: dict, **message: object) -> dict:
    body["choices"][0]["message"] = message if message else None
    return body


@pytest.mark.parametrize("reply", [
    _with(answer("unused")),                                            # message: null
    {**answer("unused"), "choices": [None]},                            # a null choice
    {**answer("unused"), "choices": "not a list"},
    [],                                                                 # JSON, not an object
    b"null",                                                            # the JSON `null`
    b"<html><body>502 Bad Gateway</body></html>",                       # a proxy's error page
    b'{"choices": [{"message": {"content": "cut',                        # a truncated body
])
def test_a_malformed_answer_is_retried_or_re_asked_never_an_internal_error(server, reply):
    server.replies = [(200, {}, reply)] * 8
    with pytest.raises(SopError) as info:
        asyncio.run(gateway(server, []).call(text_spec()))
    assert "internal error" not in info.value.message.lower()
    assert "Traceback" not in str(info.value)


@pytest.mark.parametrize("usage", [{"prompt_tokens": "many", "completion_tokens": None},
                                   {"prompt_tokens": -5, "completion_tokens": -7},
                                   {"prompt_tokens": 1e400}, "not an object"])
def test_a_garbled_usage_is_counted_locally_never_negative(server, usage):
    body = answer("hello")
    body["usage"] = usage
    server.replies = [(200, {}, body)] * 3
    result = asyncio.run(gateway(server, []).call(text_spec()))
    assert result.value == "hello"
    assert result.usage.prompt_tokens >= 0 and result.usage.completion_tokens >= 0


@pytest.mark.parametrize("header", [{"Retry-After": "-30"}, {"Retry-After": "soon"},
                                    {"retry-after-ms": "1e12"}])
def test_a_strange_retry_after_waits_at_most_the_longest_backoff(server, header):
    server.replies = [(429, header, {"error": {"message": "slow down"}}), (200, {}, answer("now"))]
    waits: list[float] = []
    gate = gateway(server, waits)
    assert asyncio.run(gate.call(text_spec())).value == "now"
    assert len(waits) == 1 and 0 <= waits[0] <= gate.backoff_max_s


def test_a_redirect_to_another_host_does_not_carry_the_key(server, monkeypatch):
    """A server (or a proxy) answering 307 to a host of its choosing: the key stays behind."""
    import http.server
    import threading

    seen: list[str] = []

    class Elsewhere(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            return None

        def do_POST(self) -> None:
            seen.append(self.headers.get("Authorization") or "")
            self.rfile.read(int(self.headers.get("content-length", 0)))
            data = b'{"choices": [{"message": {"content": "from elsewhere"}}]}'
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    other = http.server.ThreadingHTTPServer(("localhost", 0), Elsewhere)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        target = f"http://localhost:{other.server_address[1]}/v1/chat/completions"
        server.replies = [(307, {"Location": target}, {})]
        try:
            asyncio.run(gateway(server, []).call(text_spec()))
        except SopError:
            pass                        # refusing the redirect is as good
        assert all(KEY not in header for header in seen)
    finally:
        other.shutdown()
        other.server_close()
