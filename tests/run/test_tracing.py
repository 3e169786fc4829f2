"""OpenTelemetry traces of a run (GenAI semantic conventions): a span per run
(`invoke_workflow`), per role activation (`invoke_agent`), per model call (`chat`) and per
tool call (`execute_tool`), checked with the SDK's in-memory exporter and with a real
OTLP/HTTP export to a receiver on localhost."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any
from collections.abc import Iterator

import pytest

pytest.importorskip("opentelemetry.sdk.trace")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import StatusCode  # noqa: E402

from engine import api  # noqa: E402
from engine.compile.compiler import compile_path, compile_text  # noqa: E402
from engine.cli.commands import main  # noqa: E402
from engine.journal.history import read_run  # noqa: E402
from engine.journal.store import Journal  # noqa: E402
from engine.run.tracing import TracingObserver  # noqa: E402
from engine.testing import ScriptedModel, use_model  # noqa: E402

from run_helpers import ROOT

SMALL = ROOT / "tests" / "sops" / "journal_small.sop.yaml"

WITH_TOOL = f"""\
apiVersion: sop/v1
name: with_tool
inputs:
  idea: {{type: str, required: true}}
actions:
  Plan:
    prompt: "Plan {{{{ inputs.idea }}}}."
    output: text
    max_retries: 1
  Check:
    kind: exec
    command: [{sys.executable!r}, -c, "print('ok')"]
    send_to: ["<none>"]
roles:
  Planner: {{actions: [Plan], watch: [UserRequirement]}}
  Checker: {{actions: [Check], watch: [Plan]}}
"""


@pytest.fixture(autouse=True)
def _no_otel_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's own OTEL_* settings must not turn tracing on in these tests."""
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)


def traced_run(compiled: Any, workspace: Path, *, capture: bool = False, idea: str = "a snake game",
               **options: Any) -> tuple[Any, list[ReadableSpan]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tools = {a: " ".join(s.command or []) for a, s in compiled.spec.actions.items() if s.kind == "exec"}
    observer = TracingObserver(provider.get_tracer("test"), tools, capture_content=capture)
    result = api.run(compiled, {"idea": idea}, api.RunOptions(workspace=workspace,
                     observers=[observer], **options))
    return result, list(exporter.get_finished_spans())


def named(spans: list[ReadableSpan], operation: str) -> list[ReadableSpan]:
    return [s for s in spans if (s.attributes or {}).get("gen_ai.operation.name") == operation]


def test_spans_nest_run_roles_and_model_calls(tmp_path: Path) -> None:
    result, spans = traced_run(compile_path(SMALL), tmp_path / "run", model="fake")
    assert result.status == "idle"
    (run,) = named(spans, "invoke_workflow")
    assert run.name == "invoke_workflow journal_small" and run.parent is None
    agents = named(spans, "invoke_agent")
    assert {s.attributes["gen_ai.agent.name"] for s in agents} == {
        "ProductManager", "Architect", "Reviewer", "Engineer"}
    assert all(s.parent is not None and s.parent.span_id == run.context.span_id for s in agents)
    chats = named(spans, "chat")
    agent_ids = {s.context.span_id for s in agents}
    assert len(chats) == result.llm_calls == 8
    assert all(s.parent is not None and s.parent.span_id in agent_ids for s in chats)
    assert all(s.start_time <= s.end_time for s in spans)
    assert all(run.start_time <= s.start_time and s.end_time <= run.end_time for s in agents)


def test_a_chat_span_carries_model_tokens_finish_reason_and_cost(tmp_path: Path) -> None:
    result, spans = traced_run(compile_path(SMALL), tmp_path / "run", model="fake")
    chats = named(spans, "chat")
    assert {s.name for s in chats} == {"chat fake"}
    assert {s.attributes["gen_ai.request.model"] for s in chats} == {"fake"}
    assert sum(s.attributes["gen_ai.usage.input_tokens"] for s in chats) == result.prompt_tokens
    assert sum(s.attributes["gen_ai.usage.output_tokens"] for s in chats) == result.completion_tokens
    assert all(tuple(s.attributes["gen_ai.response.finish_reasons"]) == ("stop",) for s in chats)
    assert sum(s.attributes["sopctl.cost_usd"] for s in chats) == pytest.approx(result.cost_usd)


def test_an_exec_action_is_an_execute_tool_span(tmp_path: Path) -> None:
    with use_model(ScriptedModel(["a plan"])):
        result, spans = traced_run(compile_text(WITH_TOOL), tmp_path / "run", allow_exec=True)
    assert result.status == "idle", result.error
    (tool,) = named(spans, "execute_tool")
    assert tool.name == "execute_tool Check" and tool.attributes["gen_ai.tool.name"] == "Check"
    (checker,) = [s for s in named(spans, "invoke_agent") if s.attributes["gen_ai.agent.name"] == "Checker"]
    assert tool.parent is not None and tool.parent.span_id == checker.context.span_id


def test_each_command_of_a_tool_loop_is_an_execute_tool_span(tmp_path: Path) -> None:
    result, spans = traced_run(compile_path(ROOT / "sops" / "mgx_team.sop.yaml"), tmp_path / "run",
                               model="fake", allow_exec=True)
    assert result.status == "idle", result.error
    tools = named(spans, "execute_tool")
    with Journal.open(tmp_path / "run") as journal:
        commands = [e.data["tool"] for e in journal.events() if e.type == "ToolCalled"]
    assert sorted(s.attributes["gen_ai.tool.name"] for s in tools) == sorted(commands)
    assert "team.publish" in commands
    agents = {s.context.span_id for s in named(spans, "invoke_agent")}
    assert all(s.parent is not None and s.parent.span_id in agents for s in tools)


def test_a_failed_run_marks_its_spans_as_errors(tmp_path: Path) -> None:
    with use_model(ScriptedModel(lambda spec, attempt: "")):       # never a valid answer
        result, spans = traced_run(compile_text(WITH_TOOL), tmp_path / "run", allow_exec=True)
    assert result.status == "failed"
    (run,) = named(spans, "invoke_workflow")
    assert run.status.status_code == StatusCode.ERROR and run.attributes["sopctl.status"] == "failed"
    (planner,) = named(spans, "invoke_agent")
    assert [e.name for e in planner.events].count("AnswerRejected") == 2   # first ask, one re-ask


# --- OTLP over HTTP, to a receiver on localhost ------------------------------------------------


class _Receiver(http.server.BaseHTTPRequestHandler):
    posts: list[tuple[str, str, bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.posts.append((self.path, self.headers.get("Content-Type", ""), body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[tuple[str, str, bytes]]]]:
    posts: list[tuple[str, str, bytes]] = []
    handler = type("Handler", (_Receiver,), {"posts": posts})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", posts
    finally:
        server.shutdown()
        server.server_close()


def _decoded(posts: list[tuple[str, str, bytes]]) -> tuple[list[Any], list[dict[str, Any]]]:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    spans, resources = [], []
    for path, content_type, body in posts:
        assert path == "/v1/traces" and content_type == "application/x-protobuf"
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            resources.append({a.key: a.value.string_value for a in resource_spans.resource.attributes})
            spans += [s for scope in resource_spans.scope_spans for s in scope.spans]
    return spans, resources


def _attribute(span: Any, key: str) -> Any:
    for attr in span.attributes:
        if attr.key == key:
            value = attr.value
            return getattr(value, value.WhichOneof("value"))
    return None


def test_sopctl_run_trace_exports_over_otlp_http(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 receiver: tuple[str, list[Any]],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    endpoint, posts = receiver
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "sop-tests")
    code = main(["run", str(SMALL), "--idea", "a snake game", "--model", "fake", "--out",
                 str(tmp_path / "run"), "--no-input", "--trace"])
    assert code == 0, capsys.readouterr().err
    spans, resources = _decoded(posts)             # every span is sent before sopctl exits
    assert resources and all(r["service.name"] == "sop-tests" for r in resources)
    names = sorted(s.name for s in spans)
    assert names.count("invoke_workflow journal_small") == 1
    assert names.count("chat fake") == read_run(tmp_path / "run").usage.llm_calls == 8
    chat = next(s for s in spans if s.name == "chat fake")
    assert _attribute(chat, "gen_ai.operation.name") == "chat"
    assert _attribute(chat, "gen_ai.request.model") == "fake"
    assert _attribute(chat, "gen_ai.usage.input_tokens") > 0
    assert len({s.trace_id for s in spans}) == 1


def test_the_environment_alone_turns_tracing_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                receiver: tuple[str, list[Any]]) -> None:
    endpoint, posts = receiver
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint + "/v1/traces")
    assert main(["run", str(SMALL), "--idea", "x", "--model", "fake", "--out",
                 str(tmp_path / "run"), "--no-input"]) == 0
    spans, _ = _decoded(posts)
    assert any(s.name == "invoke_workflow journal_small" for s in spans)


def test_no_tracing_no_opentelemetry_import(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SOPCTL_"))}
    code = ("import sys; from engine.cli.commands import main; "
            f"rc = main(['run', {str(SMALL)!r}, '--idea', 'x', '--model', 'fake', '--out', "
            f"{str(tmp_path / 'run')!r}, '--no-input']); "
            "print(rc, any(m.startswith('opentelemetry') for m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.stdout.split()[-2:] == ["0", "False"], done.stderr


def test_tracing_without_the_extra_is_a_clear_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)   # as if not installed
    args = ["run", str(SMALL), "--idea", "x", "--model", "fake", "--no-input"]
    assert main([*args, "--out", str(tmp_path / "a"), "--trace"]) == 2
    err = capsys.readouterr().err
    assert "--trace needs OpenTelemetry" in err and ".[otel]'" in err and "Traceback" not in err
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")        # only the environment asks: a note
    assert main([*args, "--out", str(tmp_path / "b")]) == 0
    assert "running without them" in capsys.readouterr().err


@pytest.mark.parametrize(("name", "value", "says"), [
    ("OTEL_TRACES_EXPORTER", "zipkin", "no exporter"),
    ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json", "not supported"),
])
def test_an_exporter_sopctl_lacks_is_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str], name: str,
                                            value: str, says: str) -> None:
    monkeypatch.setenv(name, value)
    assert main(["run", str(SMALL), "--idea", "x", "--model", "fake", "--no-input", "--trace",
                 "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and value in err


@pytest.mark.parametrize(("flag", "env", "wanted"), [
    (False, {}, False),
    (True, {}, True),
    (False, {"OTEL_TRACES_EXPORTER": "otlp"}, True),
    (False, {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}, False),
    (False, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
    (False, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_SDK_DISABLED": "true"}, False),
    (True, {"OTEL_SDK_DISABLED": "true"}, True),              # the flag is the user's own word
])
def test_what_turns_tracing_on(flag: bool, env: dict[str, str], wanted: bool) -> None:
    from engine.run.tracing import tracing_wanted

    assert tracing_wanted(flag, env) is wanted


def test_a_tracing_failure_never_stops_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    class BrokenTracer:
        def start_span(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("exporter exploded")

    observer = TracingObserver(BrokenTracer())  # type: ignore[arg-type]
    result = api.run(compile_path(SMALL), {"idea": "x"}, api.RunOptions(workspace=tmp_path / "run", model="fake",
                     observers=[observer]))
    assert result.status == "idle"
    err = capsys.readouterr().err
    assert err.count("tracing stopped: RuntimeError: exporter exploded") == 1


def test_provider_and_model_follow_the_conventions() -> None:
    from engine.run.tracing import provider_and_model

    assert provider_and_model("openai/gpt-4o-mini") == ("openai", "gpt-4o-mini")
    assert provider_and_model("anthropic/claude-x/y") == ("anthropic", "claude-x/y")
    assert provider_and_model("local") == ("llama.cpp", "SmolLM2-135M-Instruct")
    assert provider_and_model("fake") == ("sopctl", "fake")
    assert provider_and_model("gpt-4o") == ("", "gpt-4o")


def test_a_resumed_runs_reused_answers_spend_no_tokens_in_the_trace(tmp_path: Path) -> None:
    """A reused answer cost nothing in this invocation: its span says so, the recorded
    call's tokens beside (a replay's trace looked as if it spent them again)."""
    first, _ = traced_run(compile_path(SMALL), tmp_path / "run", model="fake")
    assert first.status == "idle"
    replayed = tmp_path / "replay"
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    observer = TracingObserver(provider.get_tracer("test"), {})
    api.replay(tmp_path / "run", replayed, api.ReplayOptions(observers=[observer]))
    chats = named(list(exporter.get_finished_spans()), "chat")
    assert chats and all(s.attributes["sopctl.reused"] for s in chats)
    assert all(s.attributes["gen_ai.usage.input_tokens"] == 0 and s.attributes["sopctl.cost_usd"] == 0
               for s in chats)
    assert sum(s.attributes["sopctl.recorded_input_tokens"] for s in chats) == first.prompt_tokens
    assert {s.attributes["gen_ai.provider.name"] for s in chats} == {"sopctl"}


def test_a_failed_tool_call_is_a_tool_error_not_a_failed_run(tmp_path: Path) -> None:
    text = """
apiVersion: sop/v1
name: t
inputs: {idea: {required: true}}
actions:
  Edit: {prompt: "Fix {{ inputs.idea }}", tools: [editor]}
roles:
  R: {actions: [Edit], watch: [UserRequirement]}
"""
    model = ScriptedModel([{"commands": [{"command_name": "editor.read", "args": {"path": "missing.py"}}]},
                           {"commands": [{"command_name": "end", "args": {"answer": "ok"}}]}])
    with use_model(model):
        result, spans = traced_run(compile_text(text), tmp_path / "run")
    assert result.status == "idle"
    (tool,) = named(spans, "execute_tool")
    assert tool.attributes["error.type"] == "sopctl.tool_error"


def test_a_run_trace_exports_over_otlp_grpc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """OTEL_EXPORTER_OTLP_PROTOCOL=grpc sends the same spans to a real gRPC OTLP receiver."""
    from concurrent import futures

    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    received: list[Any] = []

    class Collector(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 - the service's name
            received.append(request)
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Collector(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
        code = main(["run", str(SMALL), "--idea", "a snake game", "--model", "fake", "--out",
                     str(tmp_path / "run"), "--no-input", "--trace"])
        assert code == 0, capsys.readouterr().err
    finally:
        server.stop(grace=None)
    names = [span.name for request in received for rs in request.resource_spans
             for scope in rs.scope_spans for span in scope.spans]
    assert names.count("invoke_workflow journal_small") == 1 and "chat fake" in names


# --- the conventions' attributes, and opt-in content --------------------------------------------

CONTENT_KEYS = ("gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions",
                "gen_ai.tool.call.arguments", "gen_ai.tool.call.result")


def test_agent_spans_carry_the_conventions_attributes(tmp_path: Path) -> None:
    from opentelemetry.trace import SpanKind

    result, spans = traced_run(compile_path(SMALL), tmp_path / "run", model="fake")
    (run,) = named(spans, "invoke_workflow")
    assert run.kind == SpanKind.INTERNAL and run.attributes["gen_ai.workflow.name"] == "journal_small"
    for agent in named(spans, "invoke_agent"):
        attrs = agent.attributes
        assert agent.kind == SpanKind.INTERNAL and agent.name == f"invoke_agent {attrs['gen_ai.agent.name']}"
        assert attrs["gen_ai.agent.id"] == attrs["gen_ai.agent.name"]
        assert (attrs["gen_ai.provider.name"], attrs["gen_ai.request.model"]) == ("sopctl", "fake")
        assert attrs["gen_ai.conversation.id"] == result.run_id
    for chat in named(spans, "chat"):
        assert chat.kind == SpanKind.CLIENT and chat.attributes["gen_ai.conversation.id"] == result.run_id


def test_no_content_is_recorded_unless_asked(tmp_path: Path) -> None:
    _, spans = traced_run(compile_path(ROOT / "sops" / "mgx_team.sop.yaml"), tmp_path / "run",
                          model="fake", allow_exec=True)
    assert not [k for s in spans for k in (s.attributes or {}) if k in CONTENT_KEYS]
    tools = named(spans, "execute_tool")
    assert tools and all(s.attributes["gen_ai.tool.call.id"] for s in tools)


def test_content_capture_records_messages_answers_and_tool_calls_redacted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    secret = "plain-service-secret-42"
    monkeypatch.setenv("MY_SERVICE_TOKEN", secret)
    _, spans = traced_run(compile_path(ROOT / "sops" / "mgx_team.sop.yaml"), tmp_path / "run",
                          capture=True, idea=f"a snake game, key {secret}", model="fake", allow_exec=True)
    chats = named(spans, "chat")
    with Journal.open(tmp_path / "run") as journal:
        sent = journal.exchanges()
        texts = {row.request_hash: row.answer.text for row in journal.answers()}
    for chat in chats:
        asked = json.loads(chat.attributes["gen_ai.input.messages"])
        answered = json.loads(chat.attributes["gen_ai.output.messages"])
        journaled = sent[chat.attributes["sopctl.request_hash"]]["messages"]
        assert [m["parts"][0]["content"] for m in asked] == [m["content"] for m in journaled
                                                            if m["role"] != "system"]
        assert [m["role"] for m in asked] == [m["role"] for m in journaled if m["role"] != "system"]
        assert answered == [{"role": "assistant", "finish_reason": "stop",
                             "parts": [{"type": "text", "content": texts[chat.attributes["sopctl.request_hash"]]}]}]
        if any(m["role"] == "system" for m in journaled):
            system = json.loads(chat.attributes["gen_ai.system_instructions"])
            assert system[0]["type"] == "text" and system[0]["content"]
    every = json.dumps([dict(s.attributes or {}) for s in spans])
    assert secret not in every and "[REDACTED]" in every
    tools = named(spans, "execute_tool")
    write = next(s for s in tools if s.attributes["gen_ai.tool.name"] == "editor.write")
    assert json.loads(write.attributes["gen_ai.tool.call.arguments"])["path"] == "main.py"
    assert "wrote main.py" in write.attributes["gen_ai.tool.call.result"]


@pytest.mark.parametrize(("value", "wanted"), [
    ("", False), ("true", True), ("TRUE", True), ("false", False), ("SPAN_ONLY", True),
    ("span_and_event", True), ("NO_CONTENT", False), ("EVENT_ONLY", False)])
def test_what_turns_content_capture_on(value: str, wanted: bool) -> None:
    from engine.run.tracing import CAPTURE_ENV, capture_wanted

    assert capture_wanted({CAPTURE_ENV: value}) is wanted
    assert capture_wanted({}) is False


def test_sopctl_run_captures_content_when_the_environment_asks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, receiver: tuple[str, list[Any]]) -> None:
    endpoint, posts = receiver
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    assert main(["run", str(SMALL), "--idea", "a snake game", "--model", "fake", "--out",
                 str(tmp_path / "run"), "--no-input"]) == 0
    spans, _ = _decoded(posts)
    chat = next(s for s in spans if s.name == "chat fake")
    assert "a snake game" in _attribute(chat, "gen_ai.input.messages")
