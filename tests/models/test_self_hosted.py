"""Self-hosted OpenAI-compatible servers through the direct client (engine/models/openai_http.py),
against a fake server on 127.0.0.1 that answers as llama.cpp's Python server does: the output
schema is sent, a server that refuses the `json_schema` form gets `json_object` with the schema
(then nothing), what it takes is remembered, and a file or flag can say it. Also an Azure-style
`--api-base` (query string, `api-key`), and the errors the SDK reads differently from the old
client (409, an error inside a 200). The real llama.cpp server: tests/models/test_llama_server.py."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from engine.errors import LLMError
from engine.models.gateway import Gateway
from engine.models.openai_http import HostedModels
from test_hosted import FakeServer, answer
import test_openai_http as _http
from test_openai_http import KEY, SELF_HOSTED, json_spec, run_args, sop_file, sopctl

server = _http.server           # the same fixture: a local server, a key in the environment
_ = sop_file

# what llama-cpp-python's server answers to `"type": "json_schema"` (its request model's check)
LLAMA_REFUSAL = (500, {}, {"error": {"message": "1 validation error: {'type': 'literal_error', 'loc': "
                                                "('body', 'response_format', 'type'), 'msg': \"Input should "
                                                "be 'text' or 'json_object'\", 'input': 'json_schema'}",
                                     "type": "internal_server_error"}})
OK = (200, {}, answer('{"title": "t", "points": ["a"]}'))


def gateway(server: FakeServer, base: str | None = None, **kw: Any) -> Gateway:
    async def no_wait(seconds: float) -> None:
        return None

    provider = HostedModels(api_base=base or server.base)
    return Gateway(providers={SELF_HOSTED: provider}, sleep=no_wait, **kw)


def forms(server: FakeServer) -> list[str | None]:
    return [(r.get("response_format") or {}).get("type") for r in server.requests]


def test_a_self_hosted_model_is_sent_its_output_schema(server):
    server.replies = [OK]
    result = asyncio.run(gateway(server).call(json_spec(SELF_HOSTED)))
    assert result.value == {"title": "t", "points": ["a"]}
    sent = server.requests[0]["response_format"]
    assert sent["type"] == "json_schema" and sent["json_schema"]["schema"]["required"] == ["title", "points"]


def test_a_refused_json_schema_falls_back_to_json_object_with_the_schema_and_is_remembered(server):
    server.replies = [LLAMA_REFUSAL, OK, OK]
    gate = gateway(server)
    first = asyncio.run(gate.call(json_spec(SELF_HOSTED)))
    second = asyncio.run(gate.call(json_spec(SELF_HOSTED, prompt="Another one.")))
    assert first.value == second.value == {"title": "t", "points": ["a"]}
    assert forms(server) == ["json_schema", "json_object", "json_object"]   # one refused try, no more
    assert server.requests[1]["response_format"]["schema"]["required"] == ["title", "points"]
    assert first.usage.retries == 0           # not a transient error: nothing was retried


def test_a_server_that_takes_neither_form_is_asked_without_one(server):
    refusal = (400, {}, {"error": {"message": "response_format is not supported"}})
    server.replies = [refusal, refusal, OK, OK]
    gate = gateway(server)
    asyncio.run(gate.call(json_spec(SELF_HOSTED)))
    asyncio.run(gate.call(json_spec(SELF_HOSTED, prompt="Again.")))
    assert forms(server) == ["json_schema", "json_object", None, None]
    assert "title" in server.requests[2]["messages"][-1]["content"]    # the prompt lists the fields


def test_a_server_error_that_is_not_about_the_form_is_retried_as_before(server):
    server.replies = [(500, {}, {"error": {"message": "out of memory"}}), OK]
    result = asyncio.run(gateway(server).call(json_spec(SELF_HOSTED)))
    assert forms(server) == ["json_schema", "json_schema"] and result.usage.retries == 1


@pytest.mark.parametrize("form, sent", [("json_object", "json_object"), ("none", None)])
def test_the_file_says_which_form_the_server_takes(server, form, sent):
    server.replies = [OK]
    asyncio.run(gateway(server).call(json_spec(SELF_HOSTED, response_format=form)))
    assert forms(server) == [sent]


def test_a_declared_form_the_server_refuses_is_a_clear_error_not_retried(server):
    server.replies = [LLAMA_REFUSAL] * 3
    with pytest.raises(LLMError) as info:
        asyncio.run(gateway(server).call(json_spec(SELF_HOSTED, response_format="json_schema")))
    assert "refused its response_format" in info.value.message and len(server.requests) == 1
    assert "llm.response_format" in (info.value.hint or "")


def test_the_flag_overrides_the_file(server):
    server.replies = [OK]
    gate = gateway(server, response_format="json_object")
    asyncio.run(gate.call(json_spec(SELF_HOSTED, response_format="json_schema")))
    assert forms(server) == ["json_object"]


def test_the_request_hash_does_not_depend_on_the_form_the_server_took(server):
    """A resume or replay finds the answer whatever form was learnt (nothing to journal)."""
    gate = gateway(server)
    spec = json_spec(SELF_HOSTED)
    assert gate.first_request(spec).hash() == gate.first_request(replace(spec, response_format="json_object")).hash()


SCHEMA_SOP = """
apiVersion: sop/v1
name: hello-json
llm: {response_format: json_object}
inputs:
  idea: {type: str, required: true}
actions:
  Write: {prompt: "{{ inputs.idea }}", context: none, output: {Greeting: {type: str}}}
roles:
  Writer: {actions: [Write], watch: [UserRequirement]}
"""


def test_a_run_takes_the_form_from_the_file_and_the_flag(server, sop_file, tmp_path, capsys):
    sop_file.write_text(SCHEMA_SOP, encoding="utf-8")
    server.replies = [(200, {}, answer('{"Greeting": "hi"}'))] * 2
    code, out, err = sopctl(capsys, *run_args(server, sop_file, tmp_path))
    assert code == 0, err
    code, out, err = sopctl(capsys, *run_args(server, sop_file, tmp_path / "again"), "--response-format", "none")
    assert code == 0, err
    assert forms(server) == ["json_object", None]


def test_an_unknown_form_in_the_file_is_a_diagnostic(sop_file, tmp_path, capsys):
    sop_file.write_text(SCHEMA_SOP.replace("json_object", "xml_please"), encoding="utf-8")
    code, out, err = sopctl(capsys, "validate", str(sop_file))
    assert code != 0 and "response_format" in err + out and "Traceback" not in err + out


# ----------------------------------------------------------------------------- Azure

def test_an_azure_deployment_url_keeps_its_query_and_sends_the_key_as_api_key(server):
    base = server.base.rsplit("/v1", 1)[0] + "/openai/deployments/gpt4o?api-version=2024-06-01"
    server.replies = [OK]
    asyncio.run(gateway(server, base).call(json_spec(SELF_HOSTED)))
    path, headers = server.seen[0]
    assert path == "/openai/deployments/gpt4o/chat/completions?api-version=2024-06-01"
    assert headers["api-key"] == KEY and "authorization" not in headers


def test_a_query_string_on_another_server_stays_out_of_the_path(server):
    server.replies = [OK]
    asyncio.run(gateway(server, server.base + "?tenant=a").call(json_spec(SELF_HOSTED)))
    path, headers = server.seen[0]
    assert path == "/v1/chat/completions?tenant=a" and headers["authorization"] == f"Bearer {KEY}"


# ----------------------------------------------------------------------------- as the SDK reads errors

def text_spec() -> Any:
    return json_spec(SELF_HOSTED, kind="text", schema=None)


def test_a_409_is_retried_as_the_sdk_would(server):
    server.replies = [(409, {}, {"error": {"message": "lock timeout"}}), (200, {}, answer("done"))]
    result = asyncio.run(gateway(server).call(text_spec()))
    assert result.value == "done" and result.usage.retries == 1


def test_x_should_retry_false_is_obeyed(server):
    server.replies = [(503, {"x-should-retry": "false"}, {"error": {"message": "gone for good"}})]
    with pytest.raises(LLMError, match="HTTP 503: gone for good"):
        asyncio.run(gateway(server).call(text_spec()))
    assert len(server.requests) == 1


def test_an_error_inside_a_200_is_read_by_its_code(server):
    body = {"error": {"message": "upstream rate limit", "code": 429}}
    server.replies = [(200, {}, body), (200, {}, answer("after it"))]
    result = asyncio.run(gateway(server).call(text_spec()))
    assert result.value == "after it" and result.usage.retries == 1


def test_an_empty_error_beside_the_choices_is_no_error(server):
    body = {**answer("fine"), "error": {}}
    server.replies = [(200, {}, body)]
    assert asyncio.run(gateway(server).call(text_spec())).value == "fine"


def test_an_error_inside_a_200_without_a_code_is_not_retried(server):
    server.replies = [(200, {}, {"error": {"message": "model not loaded"}})]
    with pytest.raises(LLMError, match="model not loaded"):
        asyncio.run(gateway(server).call(text_spec()))
    assert len(server.requests) == 1

