"""Self-hosted servers through litellm's own providers, against a fake server on 127.0.0.1
speaking each one's dialect: `lm_studio/` (OpenAI's /v1/chat/completions), `ollama_chat/`
(Ollama's /api/chat), and `openai_like/`, which litellm sends no chat completion for (it is
an embeddings provider there): a clear diagnostic before any request, naming what to write."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from test_hosted import FakeServer, answer
from run_helpers import sopctl_in_process

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


def ollama_answer(content: str) -> dict[str, Any]:
    return {"model": "llama3.1:8b", "created_at": "2026-01-01T00:00:00Z", "done": True, "done_reason": "stop",
            "message": {"role": "assistant", "content": content}, "prompt_eval_count": 12, "eval_count": 4}


@pytest.fixture
def env(monkeypatch, tmp_path) -> Path:
    for name in ("SOPCTL_MODEL", "OPENAI_API_KEY", "LM_STUDIO_API_BASE", "LM_STUDIO_API_KEY",
                 "OLLAMA_API_BASE", "OPENAI_LIKE_API_BASE", "HTTP_PROXY", "http_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    sop = tmp_path / "hello.sop.yaml"
    sop.write_text(JSON_SOP, encoding="utf-8")
    return sop


@pytest.fixture
def server():
    from engine.testing import allow_real_models

    fake = FakeServer()
    try:
        with allow_real_models():
            yield fake
    finally:
        fake.close()


def run(capsys: Any, sop: Path, model: str, *extra: str) -> tuple[int, str]:
    code, out, err = sopctl_in_process(capsys, "run", str(sop), "--idea", "greet", "--model", model,
                                       "--out", str(sop.parent / f"ws{len(extra)}"), *extra)
    assert "Traceback" not in err + out
    return code, err


@pytest.mark.parametrize("where", ["flag", "env"])
def test_lm_studio_answers_a_json_action_with_its_schema(server, env, capsys, monkeypatch, where):
    server.replies = [(200, {}, answer('{"Greeting": "hi"}'))]
    extra = ("--api-base", server.base) if where == "flag" else ()
    if where == "env":
        monkeypatch.setenv("LM_STUDIO_API_BASE", server.base)
    code, err = run(capsys, env, "lm_studio/qwen/qwen3-8b", *extra)      # a name with a `/`, as LM Studio's
    assert code == 0, err
    path, _ = server.seen[0]
    sent = server.requests[0]
    assert path == "/v1/chat/completions" and sent["model"] == "qwen/qwen3-8b"
    assert sent["response_format"]["type"] == "json_schema"     # litellm: LM Studio takes it


@pytest.mark.parametrize("where", ["flag", "env"])
def test_ollama_chat_answers_a_json_action(server, env, capsys, monkeypatch, where):
    """With OLLAMA_API_BASE set, litellm also asks that server's /api/show about the model (a
    few times a run, and after each answer): the fake server answers those with the same body."""
    base = server.base.rsplit("/v1", 1)[0]       # Ollama's own API: no /v1
    server.replies = [(200, {}, ollama_answer('{"Greeting": "hi"}'))] * 12
    extra = ("--api-base", base) if where == "flag" else ()
    if where == "env":
        monkeypatch.setenv("OLLAMA_API_BASE", base)
    code, err = run(capsys, env, "ollama_chat/llama3.1:8b", *extra)
    assert code == 0, err
    chats = [body for (path, _), body in zip(server.seen, server.requests, strict=True) if path == "/api/chat"]
    assert len(chats) == 1 and chats[0]["model"] == "llama3.1:8b" and chats[0]["stream"] is False
    assert "format" not in chats[0] and "Greeting" in chats[0]["messages"][-1]["content"]   # schema in the prompt
    assert {path for path, _ in server.seen} <= {"/api/chat", "/api/show"}


def test_ollama_chat_takes_the_schema_as_its_format_when_the_file_says_so(server, env, capsys):
    """litellm does not know that Ollama (0.5 and later) takes a schema; `response_format:
    json_schema` says so, and litellm sends it as Ollama's `format`."""
    base = server.base.rsplit("/v1", 1)[0]
    server.replies = [(200, {}, ollama_answer('{"Greeting": "hi"}'))]
    code, err = run(capsys, env, "ollama_chat/llama3.1:8b", "--api-base", base, "--response-format", "json_schema")
    assert code == 0, err
    assert server.requests[0]["format"]["required"] == ["Greeting"]


def test_openai_like_is_refused_before_any_request_naming_what_works(server, env, capsys):
    code, err = run(capsys, env, "openai_like/mymodel", "--api-base", server.base)
    assert code != 0 and "embeddings only" in err and "openai/mymodel with --api-base" in err
    assert server.requests == []
