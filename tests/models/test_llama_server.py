"""The real llama.cpp OpenAI-compatible server (`python -m llama_cpp.server`, the `local`
extra) serving the embedded SmolLM2 model, asked by the direct client: its JSON actions get
the output schema in the form this server takes (it answers `json_schema` with HTTP 500, so
`json_object` with the schema), and a run of a JSON action passes as with `--model local`.
Slow: the server loads the model (seconds) and generates on the CPU."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import pytest

from engine.models import openai_http
from engine.models.gateway import Gateway
from engine.models.openai_http import HostedModels
from engine.models.types import CallSpec
from engine.testing import allow_real_models
from run_helpers import sopctl_in_process

pytestmark = pytest.mark.slow

MODEL = "openai/smollm2-135m"      # any name: the server serves its one model


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def llama_server() -> Iterator[str]:
    pytest.importorskip("llama_cpp.server.app", reason="the local extra's server: pip install -e '.[local]'",
                        exc_type=ImportError)
    from engine.models.local import model_path

    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", str(model_path()),
                             "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "4096",
                             "--verbose", "False"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(base + "/models", timeout=2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"llama_cpp.server did not start: {proc.stderr.read().decode()[-2000:]}"
                                       if proc.stderr else "llama_cpp.server did not start") from None
                time.sleep(0.5)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def key(monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-no-key-needed-here-0000")
    monkeypatch.delenv(openai_http.VIA_LITELLM_ENV, raising=False)


def test_a_json_action_gets_its_schema_in_the_form_llama_cpp_takes(llama_server, key):
    schema = {"type": "object", "properties": {"title": {"type": "string"}, "year": {"type": "integer"}},
              "required": ["title", "year"]}
    spec = CallSpec(action="Name", role="Writer", system="You name films.", prompt="Name a film about a cat.",
                    kind="json", model=MODEL, schema=schema, max_tokens=60, temperature=0.0, timeout_s=120)
    gate = Gateway(providers={MODEL: HostedModels(api_base=llama_server)})
    with allow_real_models():
        result = asyncio.run(gate.call(spec))
    assert isinstance(result.value["title"], str) and isinstance(result.value["year"], int)
    assert result.attempts == 1 and result.usage.prompt_tokens > 0
    assert openai_http._SERVER_FORMS[llama_server] == "json_object"   # remembered for the run


JSON_SOP = """
apiVersion: sop/v1
name: films
inputs:
  idea: {type: str, required: true}
actions:
  Name:
    prompt: "Name a film about {{ inputs.idea }}."
    context: none
    llm: {max_tokens: 80, temperature: 0}
    output: {Title: {type: str}, Year: {type: int}}
roles:
  Writer: {actions: [Name], watch: [UserRequirement]}
"""


def test_a_run_of_a_json_action_passes_against_the_server(llama_server, key, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("SOPCTL_MODEL", raising=False)
    sop = tmp_path / "films.sop.yaml"
    sop.write_text(JSON_SOP, encoding="utf-8")
    with allow_real_models():
        code, out, err = sopctl_in_process(capsys, "run", str(sop), "--idea", "a cat", "--model", MODEL,
                                           "--api-base", llama_server, "--out", str(tmp_path / "ws"),
                                           "--format", "json")
    assert code == 0, err
    assert '"status": "' in out and "Traceback" not in err


def test_a_declared_json_schema_is_refused_clearly(llama_server, key, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("SOPCTL_MODEL", raising=False)
    sop = tmp_path / "films.sop.yaml"
    sop.write_text(JSON_SOP, encoding="utf-8")
    with allow_real_models():
        code, out, err = sopctl_in_process(capsys, "run", str(sop), "--idea", "a cat", "--model", MODEL,
                                           "--api-base", llama_server, "--out", str(tmp_path / "ws"),
                                           "--response-format", "json_schema")
    assert code != 0 and "refused its response_format" in err and "Traceback" not in err
    assert os.path.isdir(tmp_path / "ws")
