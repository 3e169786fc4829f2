"""The direct OpenAI-compatible client (engine/models/openai_http.py), against a local server
on 127.0.0.1 (never the network): it sends what litellm sends for the same call, maps
failures into the same error family, and a run's first request never waits for litellm."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from collections.abc import Iterator

import pytest
from run_helpers import ROOT, sopctl_in_process

from engine.errors import LLMError
from engine.models import openai_http
from engine.models.gateway import Gateway
from engine.models.hosted import LiteLLMProvider
from engine.models.openai_http import HostedModels, OpenAIHTTP
from engine.models.types import CallSpec, ModelAnswer, ModelRequest
from engine.testing import allow_real_models
from test_hosted import TEXT_SOP, FakeServer, answer

SELF_HOSTED = "openai/self-hosted-test-model"     # unknown to litellm's cost map
KEY = "sk-local-test-key-0000000000"


@pytest.fixture
def server(monkeypatch) -> Iterator[FakeServer]:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.delenv(openai_http.VIA_LITELLM_ENV, raising=False)
    for name in ("OPENAI_BASE_URL", "OPENAI_API_BASE", "OPENAI_ORGANIZATION", "OPENAI_PROJECT_ID"):
        monkeypatch.delenv(name, raising=False)
    fake = FakeServer()
    try:
        with allow_real_models():                 # real requests, to 127.0.0.1 only
            yield fake
    finally:
        fake.close()


def json_spec(model: str, **kw: Any) -> CallSpec:
    schema = {"type": "object", "properties": {"title": {"type": "string"},
                                               "points": {"type": "array", "items": {"type": "string"}}},
              "required": ["title", "points"]}
    base: dict[str, Any] = dict(action="WritePRD", role="ProductManager", system="You write PRDs.",
                                prompt="Write a PRD for a 2048 game.", kind="json", model=model,
                                schema=schema, temperature=0.3, max_tokens=512, timeout_s=30.0)
    base.update(kw)
    return CallSpec(**base)


def tool_spec(model: str) -> CallSpec:
    from engine.run.toolloop import step_schema

    commands = (("editor.write", {"type": "object", "properties": {"path": {"type": "string"},
                                                                  "content": {"type": "string"}}}),
                ("end", {"type": "object", "properties": {"answer": {"type": "string"}}}))
    return json_spec(model, schema=step_schema(["editor.write", "end"]), commands=commands,
                     tool_step=0, max_tokens=None)


def tool_answer() -> dict[str, Any]:
    body = answer("writing it")
    body["choices"][0]["finish_reason"] = "tool_calls"
    body["choices"][0]["message"]["tool_calls"] = [
        {"id": "t1", "type": "function",
         "function": {"name": "editor__write", "arguments": json.dumps({"path": "a.md", "content": "x"})}}]
    return body


def first_request(provider: HostedModels, call_spec: CallSpec) -> ModelRequest:
    return Gateway(providers={call_spec.model: provider}).first_request(call_spec)


def ask(server: FakeServer, call_spec: CallSpec, reply: dict[str, Any], *,
        via_litellm: bool) -> tuple[dict[str, Any], ModelAnswer]:
    """One request for `call_spec` by one path; what the server received, and the answer."""
    os.environ[openai_http.VIA_LITELLM_ENV] = "1" if via_litellm else ""
    try:
        provider = HostedModels(api_base=server.base)
        expected = LiteLLMProvider if via_litellm else OpenAIHTTP      # the path under test
        assert type(provider.provider(call_spec.model)) is expected
        request = first_request(provider, call_spec)
        server.replies.append((200, {}, reply))
        got = asyncio.run(provider.complete(request))
    finally:
        os.environ.pop(openai_http.VIA_LITELLM_ENV, None)
    return server.requests[-1], got


# ----------------------------------------------------------------------------- same request as litellm

PARITY_MODELS = [SELF_HOSTED, "openai/gpt-4o-mini", "openai/gpt-4.1-nano"]


@pytest.mark.parametrize("model", PARITY_MODELS)
def test_a_structured_call_sends_what_litellm_sends(server, model):
    direct_body, direct = ask(server, json_spec(model), answer('{"title": "t", "points": []}'),
                              via_litellm=False)
    litellm_body, through = ask(server, json_spec(model), answer('{"title": "t", "points": []}'),
                                via_litellm=True)
    assert sorted(direct_body) == sorted(litellm_body)
    for name in litellm_body:
        assert direct_body[name] == litellm_body[name], name
    assert direct_body["response_format"]["type"] == "json_schema"   # a self-hosted server's too
    assert direct == through          # text, tokens, cost (litellm's own price), finish reason


@pytest.mark.parametrize("model", PARITY_MODELS)
def test_a_tool_loop_step_sends_what_litellm_sends(server, model):
    direct_body, direct = ask(server, tool_spec(model), tool_answer(), via_litellm=False)
    litellm_body, through = ask(server, tool_spec(model), tool_answer(), via_litellm=True)
    assert direct_body == litellm_body
    assert ("tools" in direct_body) == (model != SELF_HOSTED)   # the provider's tool calling
    assert direct == through
    if model != SELF_HOSTED:
        assert json.loads(direct.text)["commands"] == [
            {"command_name": "editor.write", "args": {"path": "a.md", "content": "x"}}]


def test_what_a_model_supports_and_costs_is_what_litellm_says_for_every_direct_model(monkeypatch):
    """Every OpenAI chat model of litellm's cost map that the direct client answers: the same
    structured output, tool calling and price as litellm's own answers."""
    from engine.models.hosted import litellm_module

    monkeypatch.delenv(openai_http.VIA_LITELLM_ENV, raising=False)
    litellm = litellm_module()
    models = sorted(f"openai/{name}" for name, entry in litellm.model_cost.items()
                    if entry.get("litellm_provider") == "openai" and entry.get("mode") == "chat"
                    and "/" not in name and openai_http.routes_directly(f"openai/{name}"))
    assert "openai/gpt-4o-mini" in models and len(models) > 20
    direct, through = OpenAIHTTP(), LiteLLMProvider(completion_kwargs={"mock_response": "x"})
    for model in models + [SELF_HOSTED]:
        assert direct.supports_schema(model) == through.supports_schema(model), model
        assert direct.calls_functions(model) == bool(litellm.supports_function_calling(model=model)), model
        assert direct.price(model) == through.price(model), model


@pytest.mark.parametrize("model, direct", [
    ("openai/gpt-4o-mini", True), (SELF_HOSTED, True), ("openai/llama3.1:8b", True),
    ("openai/o3-mini", False), ("openai/o1", False), ("openai/gpt-5-mini", False),   # reasoning
    ("openai/gpt-4", False),                     # litellm drops its response_format
    ("openai/responses/gpt-4o", False), ("anthropic/claude-3-5-haiku", False), ("gpt-4o-mini", False),
])
def test_which_models_the_direct_client_answers(monkeypatch, model, direct):
    monkeypatch.delenv(openai_http.VIA_LITELLM_ENV, raising=False)
    assert openai_http.routes_directly(model) is direct
    monkeypatch.setenv(openai_http.VIA_LITELLM_ENV, "1")
    assert openai_http.routes_directly(model) is False


def test_the_server_comes_from_the_environment_without_api_base(server, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", server.base)
    server.replies.append((200, {}, answer("from the environment")))
    provider = HostedModels()
    got = asyncio.run(provider.complete(first_request(provider, json_spec(SELF_HOSTED, kind="text",
                                                                           schema=None))))
    assert got.text == "from the environment" and server.requests[-1]["model"] == "self-hosted-test-model"


@pytest.mark.parametrize("via_litellm", [False, True])
def test_the_proxy_of_the_environment_is_used_as_through_litellm(server, monkeypatch, via_litellm):
    """HTTP_PROXY (and NO_PROXY) are honoured: the request for a server on another host goes
    to the proxy (here the local server), by either path."""
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", server.base.rsplit("/v1", 1)[0])
    server.replies.append((200, {}, answer("through the proxy")))
    monkeypatch.setenv(openai_http.VIA_LITELLM_ENV, "1" if via_litellm else "")
    provider = HostedModels(api_base="http://models.invalid/v1")
    request = first_request(provider, json_spec(SELF_HOSTED, kind="text", schema=None))
    assert asyncio.run(provider.complete(request)).text == "through the proxy"
    assert server.requests[-1]["model"] == "self-hosted-test-model"


# ----------------------------------------------------------------------------- errors


def gateway(server: FakeServer, waits: list[float]) -> Gateway:
    async def record(seconds: float) -> None:
        waits.append(seconds)

    provider = HostedModels(api_base=server.base)
    return Gateway(providers={SELF_HOSTED: provider}, sleep=record)


def text_spec() -> CallSpec:
    return json_spec(SELF_HOSTED, kind="text", schema=None)


def test_a_429_is_retried_after_its_retry_after_then_succeeds(server):
    server.replies = [(429, {"Retry-After": "3"}, {"error": {"message": "slow down"}}),
                      (200, {}, answer("second time"))]
    waits: list[float] = []
    result = asyncio.run(gateway(server, waits).call(text_spec()))
    assert result.value == "second time" and waits == [3.0] and result.usage.retries == 1
    assert "RateLimitError" in next(e.cause for e in result.events if hasattr(e, "cause"))


@pytest.mark.parametrize("reply, cause", [
    ((500, {}, {"error": {"message": "boom"}}), "InternalServerError: HTTP 500: boom"),
    ((200, {}, b"{not json"), "not JSON"),
])
def test_a_server_error_or_a_garbled_answer_is_retried_then_the_usual_diagnostic(server, reply, cause):
    server.replies = [reply] * 6
    waits: list[float] = []
    with pytest.raises(LLMError) as info:
        asyncio.run(gateway(server, waits).call(text_spec()))
    assert cause in info.value.message and "gave up after 6 attempts" in info.value.message
    assert len(waits) == 5 and len(server.requests) == 6


def test_a_connection_refused_is_transient(server):
    import socket

    with socket.socket() as sock:          # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    provider = HostedModels(api_base=f"http://127.0.0.1:{port}/v1")
    waits: list[float] = []

    async def record(seconds: float) -> None:
        waits.append(seconds)

    with pytest.raises(LLMError, match="APIConnectionError.*gave up after 2 attempts"):
        asyncio.run(Gateway(providers={SELF_HOSTED: provider}, sleep=record,
                            transient_retries=1).call(text_spec()))


@pytest.mark.parametrize("status, words", [(400, "HTTP 400: max_tokens is too large"),
                                           (403, "HTTP 403 (permission denied): max_tokens is too large"),
                                           (404, "HTTP 404: max_tokens is too large")])
def test_a_refused_request_is_not_retried_and_says_what_the_server_said(server, status, words):
    server.replies = [(status, {}, {"error": {"message": f"max_tokens is too large ({KEY})"}})]
    waits: list[float] = []
    with pytest.raises(LLMError) as info:
        asyncio.run(gateway(server, waits).call(text_spec()))
    assert words in info.value.message and "WritePRD" in info.value.message
    assert KEY not in info.value.message and waits == [] and len(server.requests) == 1


# ----------------------------------------------------------------------------- the command line


sopctl = sopctl_in_process


@pytest.fixture
def sop_file(tmp_path, monkeypatch):
    monkeypatch.delenv("SOPCTL_MODEL", raising=False)
    path = tmp_path / "hello.sop.yaml"
    path.write_text(TEXT_SOP, encoding="utf-8")
    return path


def run_args(server: FakeServer, sop_file: Path, tmp_path: Path) -> list[str]:
    return ["run", str(sop_file), "--idea", "greet", "--model", SELF_HOSTED, "--api-base",
            server.base, "--out", str(tmp_path / "ws"), "--format", "json"]


def test_a_run_retries_a_rate_limit_and_succeeds(server, sop_file, tmp_path, capsys):
    server.replies = [(429, {"Retry-After": "0"}, {"error": {"message": "slow down"}}),
                      (200, {}, answer("hello from the server"))]
    code, out, err = sopctl(capsys, *run_args(server, sop_file, tmp_path))
    assert code == 0, err
    assert len(server.requests) == 2        # the rate-limited request, then the answered one


def test_a_refused_key_is_a_clear_diagnostic(server, sop_file, tmp_path, capsys):
    server.replies = [(401, {}, {"error": {"message": f"Incorrect API key provided: {KEY}"}})]
    code, out, err = sopctl(capsys, *run_args(server, sop_file, tmp_path))
    assert code != 0 and "has no valid API key" in err and "OPENAI_API_KEY" in err
    assert KEY not in err + out and "Traceback" not in err + out and len(server.requests) == 1


def test_a_missing_key_is_named_before_any_request(server, sop_file, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY")
    code, out, err = sopctl(capsys, *run_args(server, sop_file, tmp_path))
    assert code != 0 and "needs OPENAI_API_KEY" in err and server.requests == []
    assert "Traceback" not in err


@pytest.mark.parametrize("reply, words", [((503, {"Retry-After": "0"}, {"error": {"message": "down"}}),
                                           "ServiceUnavailableError: HTTP 503: down"),
                                          ((200, {}, b"{garbled"), "not JSON")])
def test_a_run_whose_server_keeps_failing_stops_with_the_usual_diagnostic(
        server, sop_file, tmp_path, capsys, monkeypatch, reply, words):
    monkeypatch.setattr("engine.models.gateway.random.uniform", lambda a, b: 0.0)  # no backoff wait
    server.replies = [reply] * 6
    code, out, err = sopctl(capsys, *run_args(server, sop_file, tmp_path))
    assert code != 0 and words in err and "gave up after 6 attempts" in err, err
    assert "Traceback" not in err + out


# ----------------------------------------------------------------------------- litellm is not waited for

JSON_SOP = """
apiVersion: sop/v1
name: hello-json
inputs:
  idea: {type: str, required: true}
actions:
  Write: {prompt: "{{ inputs.idea }}", context: none, output: {Greeting: {type: str}}}
roles:
  Writer: {actions: [Write], watch: [UserRequirement]}
"""

_DRIVER = """
import os, sys
class Watch:
    def find_spec(self, name, path=None, target=None):
        for package in ("litellm", "jsonschema"):
            if name.startswith(package + "."):   # the package runs (finding it imports nothing)
                open(os.path.join(os.environ["MARKS"], package), "w").close()
        return None
sys.meta_path.insert(0, Watch())
from engine.cli.commands import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("via_litellm", [False, True])
def test_a_run_sends_its_first_request_before_importing_litellm(server, sop_file, tmp_path, via_litellm):
    """A real `sopctl run` in a fresh process: when the first request reaches the server,
    litellm has not been imported (not even started) unless the switch asks for litellm; nor
    has the run's warm-up begun (it imports jsonschema), which waits for that request."""
    marks = tmp_path / "marks"
    marks.mkdir()
    sop_file.write_text(JSON_SOP, encoding="utf-8")     # an output schema: jsonschema is needed
    seen: list[dict[str, bool]] = []
    server.replies = [(200, {}, answer('{"Greeting": "hello from the server"}'))]
    original = server.httpd.RequestHandlerClass.do_POST

    def do_post(handler: Any) -> None:
        seen.append({name: (marks / name).exists() for name in ("litellm", "jsonschema")})
        original(handler)

    server.httpd.RequestHandlerClass.do_POST = do_post   # type: ignore[method-assign]
    env = {**os.environ, "MARKS": str(marks), "PYTHONPATH": str(ROOT),
           openai_http.VIA_LITELLM_ENV: "1" if via_litellm else ""}
    proc = subprocess.run([sys.executable, "-c", _DRIVER, *run_args(server, sop_file, tmp_path)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert len(seen) == 1 and seen[0]["litellm"] is via_litellm
    if not via_litellm:
        assert seen[0]["jsonschema"] is False
        assert (marks / "jsonschema").exists()    # the warm-up ran once the request was sent


def test_the_sdk_is_imported_without_litellm_or_a_command_line():
    """The client's one import, the openai SDK, brings neither litellm nor click, rich or
    pygments (a command line's), and `import engine` does not import the SDK at all."""
    code = ("import sys; import engine.models.gateway; print('openai' in sys.modules); "
            "from engine.models.openai_http import _sdk; _sdk(); "
            "print(sorted({'litellm', 'click', 'rich', 'pygments'} & set(sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["False", "[]"]
