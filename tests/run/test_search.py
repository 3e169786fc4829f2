"""The `search` toolset: `search.query` against the file's `search:` endpoint. The shipped
offline example (examples/search_qa.sop.yaml and its search server, started here on a free
port), the flag its host needs, what validate says, errors back to the model, the answer
shapes of real engines, and a replay that needs neither the endpoint nor the flag."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from run_helpers import ROOT, run_sop, sop_text

from engine import api
from engine.compile.compiler import check_text
from engine.errors import RunError
from engine.run.events import ToolCalled
from engine.run.tools.search import _results, format_results
from engine.testing import ScriptedModel, use_model

EXAMPLE = ROOT / "examples" / "search_qa.sop.yaml"
SERVER = ROOT / "examples" / "search" / "search_server.py"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    """The example's search server, on a free port: its /search url."""
    proc = subprocess.Popen([sys.executable, str(SERVER), "--port", "0"], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("serving on "), line
        yield line.split()[-1]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def example_at(url: str, tmp_path: Path) -> Path:
    """The shipped example, its endpoint moved to the test's server."""
    text = EXAMPLE.read_text(encoding="utf-8").replace("http://127.0.0.1:8765/search", url)
    path = tmp_path / "search_qa.sop.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def step(*commands: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"thought": "next", "commands": [{"command_name": n, "args": a} for n, a in commands]}


ANSWER = step(("end", {"Answer": "It asks a search engine.", "Sources": ["x"]}))


def outputs(result: Any) -> list[str]:
    return [e.output for e in result.events if isinstance(e, ToolCalled)]


def test_the_example_searches_its_documents(endpoint: str, tmp_path: Path) -> None:
    model = ScriptedModel([step(("search.query", {"query": "SearchEnhancedQA search engine"}),
                                ("search.query", {"query": "notebook kernel", "limit": 1}),
                                ("search.query", {"query": "quantum chromodynamics"})), ANSWER])
    result = run_sop(api.load(example_at(endpoint, tmp_path)), model, tmp_path / "ws", allow_hosts=["127.0.0.1"])
    assert result.status == "idle", result.error
    found, one, none = outputs(result)
    base = endpoint.removesuffix("/search")
    assert found.startswith("1 results for 'SearchEnhancedQA search engine':\n"
                            "1. SearchEnhancedQA, answering with a search engine\n"
                            f"   {base}/docs/search_enhanced_qa.md\n   SearchEnhancedQA is MetaGPT's action")
    assert one.startswith("1 results for 'notebook kernel':\n1. Data Interpreter, code in a notebook")
    assert none == "no results for 'quantum chromodynamics'"
    assert result.messages[-1].out["Answer"] == "It asks a search engine."


def test_the_example_runs_on_fake_from_the_command_line(endpoint: str, tmp_path: Path) -> None:
    path = example_at(endpoint, tmp_path)
    argv = [sys.executable, "-m", "engine.cli", "run", str(path), "--model", "fake", "--idea", "search engines",
            "--out", str(tmp_path / "ws")]
    refused = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2
    assert "this SOP's search endpoint is at 127.0.0.1; it needs --allow-host 127.0.0.1" in refused.stderr
    done = subprocess.run([*argv, "--allow-host", "127.0.0.1"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "status:    idle" in done.stdout


def test_a_replay_needs_neither_the_endpoint_nor_the_flag(endpoint: str, tmp_path: Path) -> None:
    model = ScriptedModel([step(("search.query", {"query": "TeamLeader"})), ANSWER])
    with use_model(model):
        first = api.run(api.load(example_at(endpoint, tmp_path)), {"idea": "who leads?"},
                        api.RunOptions(workspace=tmp_path / "ws", allow_hosts=["127.0.0.1"]))
    assert first.status == "idle", first.error
    with use_model(ScriptedModel([])):              # never called: every answer is journaled
        replayed = api.replay(tmp_path / "ws", tmp_path / "again").result
    assert replayed.status == "idle", replayed.error
    assert replayed.messages[-1].out == first.messages[-1].out


def test_validate_says_which_host_the_endpoint_needs() -> None:
    compiled = api.load(EXAMPLE)
    assert dict(compiled.plan.flags) == {"--allow-host": ("127.0.0.1 (search)",)}
    assert dict(compiled.plan.replay_flags) == {}


def test_the_search_tool_without_an_endpoint_is_a_located_error() -> None:
    text = EXAMPLE.read_text(encoding="utf-8").replace("search:\n  url: http://127.0.0.1:8765/search\n"
                                                       "  max_results: 3\n", "")
    found = [d for d in check_text(text, "nosearch.sop.yaml").diagnostics if d.severity == "error"]
    assert len(found) == 1, found
    assert "the search tool needs a search endpoint" in found[0].message
    assert found[0].line == text.splitlines().index("    tools: [search]") + 1
    assert "search: {url: http://HOST/search}" in (found[0].hint or "")


def test_an_endpoint_that_fails_is_the_models_to_read(tmp_path: Path) -> None:
    down = """
apiVersion: sop/v1
name: down
search: {url: "http://127.0.0.1:9/search", headers: {X-Key: SOPCTL_TEST_NO_SUCH_VAR}}
actions:
  Ask: {prompt: "x", tools: [search.query], max_steps: 3, output: {A: {type: str}}}
roles:
  R: {actions: [Ask], watch: [UserRequirement]}
"""
    model = ScriptedModel([step(("search.query", {"query": "x"})), step(("end", {"A": "a"}))])
    result = run_sop(sop_text(down), model, tmp_path / "ws", allow_hosts=["127.0.0.1"])
    assert result.status == "idle", result.error
    assert outputs(result) == ["the search endpoint's header X-Key needs the environment variable "
                               "SOPCTL_TEST_NO_SUCH_VAR, which is not set"]
    with pytest.raises(RunError, match="needs --allow-host 127.0.0.1"):
        run_sop(sop_text(down), ScriptedModel([]), tmp_path / "ws2", allow_hosts=["example.org"])


def test_answers_of_real_engines_are_read() -> None:
    searx = {"results": [{"title": "A", "url": "https://a.example/", "content": "about  a\n thing"}]}
    serper = {"organic": [{"title": "B", "link": "https://b.example/", "snippet": "bee"}]}
    plain = [{"title": "C", "href": "https://c.example/", "body": "see"}, "not a result"]
    assert _results(searx) == [{"title": "A", "url": "https://a.example/", "snippet": "about a thing"}]
    assert _results(serper)[0]["url"] == "https://b.example/"
    assert _results(plain) == [{"title": "C", "url": "https://c.example/", "snippet": "see"}]
    with pytest.raises(Exception, match="holds no list of results"):
        _results({"answer": 42})


def test_results_are_bounded() -> None:
    many = [{"title": "t" * 500, "url": f"https://e.example/{i}", "snippet": "s" * 2000} for i in range(9)]
    text = format_results("q", many, 3)
    assert text.startswith("3 results for 'q' (of 9 given):")
    assert "https://e.example/2" in text and "https://e.example/3" not in text
    assert max(len(line) for line in text.splitlines()) <= 410
    assert json.dumps(text)   # plain text, one string
