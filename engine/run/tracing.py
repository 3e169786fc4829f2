"""OpenTelemetry traces of a run, following the GenAI semantic conventions.

A `TracingObserver` is a `RunObserver`: it turns the run's events into spans, so the
interpreter's hot path knows nothing about tracing. The span tree (docs/tracing.md):

- `invoke_workflow {sop}` (INTERNAL): the run (one per invocation: a resume is a new one),
  from RunStarted to RunEnded, `gen_ai.workflow.name`; status ERROR when the run failed or
  ran out of budget.
- `invoke_agent {role}` (INTERNAL): a role's activation, its actions in one round, with
  `gen_ai.agent.name`/`gen_ai.agent.id` (the role id), the run's `gen_ai.provider.name` and
  `gen_ai.request.model`, `gen_ai.conversation.id` (the run id) and `sopctl.round`; it ends
  at its last action's end (known when the next round starts, or the run ends).
- `chat {model}` (CLIENT): a model call (each ask and re-ask), with `gen_ai.provider.name` and
  `gen_ai.request.model` (litellm's `openai/gpt-4o-mini` as `openai` and `gpt-4o-mini`,
  `local` as llama.cpp's SmolLM2, `fake` as sopctl's; the string as given in
  `sopctl.model`), `gen_ai.usage.input_tokens`/`output_tokens`,
  `gen_ai.response.finish_reasons` and the call's cost as `sopctl.cost_usd`. An answer
  reused from the journal has `sopctl.reused`, no tokens and no cost (it spent nothing now;
  the recorded call's tokens are `sopctl.recorded_input_tokens`/`_output_tokens`) and the
  duration recorded when it was paid for.
- `execute_tool {action}` (INTERNAL): an exec action (its command is the tool), from
  ActionStarted to ActionCompleted; a tool loop's command (ToolCalled), as long as it took;
  `gen_ai.tool.name`, `gen_ai.tool.call.id`. A command that failed has status ERROR and
  `error.type` `sopctl.tool_error` (the run may well go on).

Retries, re-asks and questions to a person are span events on the role's span.

Content (prompts, answers, tool arguments and results) is recorded only when
`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT` asks (`capture_wanted`), as the
conventions' opt-in attributes (`gen_ai.system_instructions`, `gen_ai.input.messages`,
`gen_ai.output.messages`, `gen_ai.tool.call.arguments`, `gen_ai.tool.call.result`, JSON
strings), every text redacted as the journal redacts it (engine.load.secrets.scrub).

`opentelemetry` is an optional extra (the `otel` extra: `pip install -e '.[otel]'`) and is imported only
when tracing is on: `start_tracing` turns it on for `--trace` or the standard environment
variables (`OTEL_TRACES_EXPORTER`, `OTEL_EXPORTER_OTLP_ENDPOINT`,
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`; `OTEL_SDK_DISABLED=true` turns the environment's off;
`OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` name the service). Exporters: `otlp`
(OTLP over HTTP/protobuf by default, or gRPC with `OTEL_EXPORTER_OTLP_PROTOCOL=grpc`) and
`console` (JSON lines on stderr).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine import __version__
from engine.errors import UsageError, install_hint
from engine.load.secrets import scrub, secret_values
from engine.run.events import (
    ActionCompleted,
    ActionStarted,
    AnswerRejected,
    ModelAnswered,
    ModelRetried,
    QuestionAsked,
    RoundStarted,
    RunEnded,
    RunEvent,
    RunStarted,
    RunStatus,
    ToolCalled,
)

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

__all__ = ["TracingObserver", "Tracing", "start_tracing", "tracing_wanted", "INSTRUMENTATION",
           "provider_and_model", "capture_wanted", "CAPTURE_ENV"]


INSTRUMENTATION = "sopctl"
"""The instrumentation scope of every span."""

CAPTURE_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
"""Opt-in content capture (prompts, answers, tool arguments and results), off by default."""


_FAILED = (RunStatus.FAILED, RunStatus.BUDGET)


_EXPORTERS = ("otlp", "console", "none")


class TracingObserver:
    """Spans from run events (see the module docstring); never raises into the run."""

    def __init__(self, tracer: Tracer, tools: Mapping[str, str] | None = None, *,
                 capture_content: bool = False) -> None:
        from opentelemetry import trace  # the optional `otel` extra: only a traced run imports it

        self._trace = trace
        self._tracer = tracer
        self._tools = dict(tools or {})
        """Actions that are tools (exec actions): id -> what they run."""
        self._capture = capture_content
        self._secrets = secret_values() if capture_content else ()
        self._lock = threading.Lock()
        self._run: Span | None = None
        self._run_id = ""
        self._model = ""
        self._agents: dict[tuple[int, str], _Open] = {}
        self._tool_calls: dict[str, _Open] = {}
        self._broken = False

    def on_event(self, event: RunEvent) -> None:
        if self._broken:
            return
        try:
            with self._lock:
                self._handle(event, time.time_ns())
        except Exception as exc:  # noqa: BLE001 - a tracing bug must never stop a run
            self._broken = True
            print(f"sopctl: warning: tracing stopped: {type(exc).__name__}: {exc}", file=sys.stderr)

    def _handle(self, event: RunEvent, now: int) -> None:
        if isinstance(event, RunStarted):
            self._start_run(event, now)
        elif isinstance(event, RoundStarted):
            self._end_agents(before_round=event.round)
        elif isinstance(event, ActionStarted):
            self._action_started(event, now)
        elif isinstance(event, ModelAnswered):
            self._chat(event, now)
        elif isinstance(event, ActionCompleted):
            self._action_completed(event, now)
        elif isinstance(event, ToolCalled):
            self._tool_called(event, now)
        elif isinstance(event, (ModelRetried, AnswerRejected, QuestionAsked)):
            self._note(event, now)
        elif isinstance(event, RunEnded):
            self._end_run(event, now)

    # the run ---------------------------------------------------------------------------

    def _start_run(self, event: RunStarted, now: int) -> None:
        self._run_id, self._model = event.run_id, event.model
        self._run = self._tracer.start_span(
            f"invoke_workflow {event.sop_name}", start_time=now, attributes={
                "gen_ai.operation.name": "invoke_workflow", "gen_ai.workflow.name": event.sop_name,
                "gen_ai.request.model": event.model, "sopctl.run_id": event.run_id,
                "sopctl.sop_file": event.sop_file, "sopctl.max_rounds": event.max_rounds,
                "sopctl.budget_usd": event.budget_usd})

    def _end_run(self, event: RunEnded, now: int) -> None:
        failed = event.status in _FAILED
        for call in self._tool_calls.values():
            self._finish(call.span, now, error="the run ended before it finished" if failed else "")
        self._tool_calls.clear()
        self._end_agents(before_round=None, error=event.error if failed else "")
        if self._run is None:
            return
        self._run.set_attribute("sopctl.status", str(event.status))
        self._run.set_attribute("sopctl.rounds", event.rounds)
        self._finish(self._run, now, error=(event.error or str(event.status)) if failed else "")
        self._run = None

    # roles -----------------------------------------------------------------------------

    def _agent(self, round_: int, role: str, now: int) -> _Open:
        """The span of `role`'s activation in `round_`, started on its first event."""
        found = self._agents.get((round_, role))
        if found is None:
            provider, model = provider_and_model(self._model or "unknown")
            span = self._tracer.start_span(
                f"invoke_agent {role}", context=self._inside(self._run), start_time=now,
                kind=self._trace.SpanKind.INTERNAL, attributes={
                    "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": role,
                    "gen_ai.agent.id": role, "gen_ai.provider.name": provider or "_OTHER",
                    "gen_ai.request.model": model, "gen_ai.conversation.id": self._run_id,
                    "sopctl.round": round_})
            found = self._agents[(round_, role)] = _Open(span, now)
        return found

    def _end_agents(self, *, before_round: int | None, error: str = "") -> None:
        """End the activations of earlier rounds (all, at the run's end) at their last event."""
        for key in [k for k in self._agents if before_round is None or k[0] < before_round]:
            agent = self._agents.pop(key)
            self._finish(agent.span, agent.last, error=error)

    def _action_started(self, event: ActionStarted, now: int) -> None:
        agent = self._agent(event.round, event.role, now)
        agent.last = now
        if event.action in self._tools:
            self._tool_calls[event.key] = _Open(self._tracer.start_span(
                f"execute_tool {event.action}", context=self._inside(agent.span), start_time=now,
                kind=self._trace.SpanKind.INTERNAL,
                attributes={**_tool_attributes(event.action, self._tools[event.action]),
                            "gen_ai.tool.call.id": event.key}), now)

    def _action_completed(self, event: ActionCompleted, now: int) -> None:
        self._agent(event.round, event.role, now).last = now
        call = self._tool_calls.pop(event.key, None)
        if call is not None:
            self._finish(call.span, now)

    def _note(self, event: ModelRetried | AnswerRejected | QuestionAsked, now: int) -> None:
        agent = self._agent(event.round, event.role, now)
        agent.last = now
        data = {k: v for k, v in event.to_json().items() if isinstance(v, (str, int, float, bool))}
        agent.span.add_event(type(event).__name__, attributes=data, timestamp=now)

    # model and tool calls ----------------------------------------------------------------

    def _chat(self, event: ModelAnswered, now: int) -> None:
        agent = self._agent(event.round, event.role, now)
        agent.last = now
        start = now - int(event.seconds * 1e9)
        model = event.model or "unknown"
        provider, name = provider_and_model(model)
        # a reused answer cost nothing now: its tokens are the recorded call's, kept apart, so a
        # replay's trace does not look as if it spent them again
        spent = 0 if event.reused else 1
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat", "gen_ai.request.model": name,
            "gen_ai.usage.input_tokens": event.prompt_tokens * spent,
            "gen_ai.usage.output_tokens": event.completion_tokens * spent,
            "sopctl.cost_usd": event.cost_usd * spent, "sopctl.action": event.action,
            "sopctl.attempt": event.attempt, "sopctl.reused": event.reused,
            "sopctl.model": model, "sopctl.request_hash": event.request_hash}
        if event.reused:
            attributes.update({"sopctl.recorded_input_tokens": event.prompt_tokens,
                               "sopctl.recorded_output_tokens": event.completion_tokens})
        if event.cached_tokens and not event.reused:   # read from the provider's prompt cache
            attributes["gen_ai.usage.cache_read.input_tokens"] = event.cached_tokens
        if event.finish_reason:
            attributes["gen_ai.response.finish_reasons"] = [event.finish_reason]
        if provider:
            attributes["gen_ai.provider.name"] = provider
        if event.unpriced:
            attributes["sopctl.unpriced"] = True
        attributes["gen_ai.conversation.id"] = self._run_id
        if self._capture and event.content is not None:
            attributes.update(self._messages(event))
        span = self._tracer.start_span(f"chat {name}", context=self._inside(agent.span),
                                       kind=self._trace.SpanKind.CLIENT, start_time=start,
                                       attributes=attributes)
        self._finish(span, now)

    def _messages(self, event: ModelAnswered) -> dict[str, str]:
        """The opt-in content of a chat span, as the conventions shape it (JSON strings: span
        attributes hold no structures yet): the system messages as `gen_ai.system_instructions`,
        the others as `gen_ai.input.messages`, the answer as `gen_ai.output.messages`; every
        text redacted as the journal redacts it."""
        assert event.content is not None
        system = [{"type": "text", "content": self._scrub(m.get("content", ""))}
                  for m in event.content.messages if m.get("role") == "system"]
        chat = [{"role": m.get("role", "user"), "parts": [{"type": "text", "content": self._scrub(m.get("content", ""))}]}
                for m in event.content.messages if m.get("role") != "system"]
        answer = {"role": "assistant", "parts": [{"type": "text", "content": self._scrub(event.content.text)}],
                  "finish_reason": event.finish_reason or "stop"}
        found = {"gen_ai.input.messages": _json(chat), "gen_ai.output.messages": _json([answer])}
        if system:
            found["gen_ai.system_instructions"] = _json(system)
        return found

    def _scrub(self, text: str) -> str:
        return scrub(str(text), self._secrets)

    def _tool_span(self, round_: int, role: str, tool: str, started_ns: int, ended_ns: int,
                   attributes: Mapping[str, Any] | None, error: str) -> None:
        agent = self._agent(round_, role, started_ns)
        agent.last = max(agent.last, ended_ns)
        span = self._tracer.start_span(
            f"execute_tool {tool}", context=self._inside(agent.span), start_time=started_ns,
            kind=self._trace.SpanKind.INTERNAL, attributes={**_tool_attributes(tool, ""), **(attributes or {})})
        self._finish(span, ended_ns, error=error, error_type="sopctl.tool_error")

    def _tool_called(self, event: ToolCalled, now: int) -> None:
        """A tool loop's command: a span ending now, as long as the command took."""
        started = now - int(event.seconds * 1e9)
        attributes: dict[str, Any] = {
            "gen_ai.tool.call.id": event.call or f"{event.action}/{event.step}",
            "sopctl.action": event.action, "sopctl.step": event.step, "sopctl.reused": event.reused}
        if self._capture:
            attributes["gen_ai.tool.call.arguments"] = self._scrub(_json(event.args))
            if not event.error:
                attributes["gen_ai.tool.call.result"] = self._scrub(event.output)
        self._tool_span(event.round, event.role, event.tool, started, now, attributes,
                        f"{event.tool} failed: {self._scrub(event.output[:200])}" if event.error else "")

    # helpers -----------------------------------------------------------------------------

    def _inside(self, parent: Span | None) -> Any:
        return self._trace.set_span_in_context(parent) if parent is not None else None

    def _finish(self, span: Span, end: int, *, error: str = "", error_type: str = "sopctl.run_failed") -> None:
        if error:
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, error))
            span.set_attribute("error.type", error_type)
        span.end(end_time=end)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def capture_wanted(environ: Mapping[str, str] | None = None) -> bool:
    """`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`, as OpenTelemetry's GenAI
    instrumentations read it: `true` (or `span_only`, `span_and_event`: sopctl records content
    on spans) turns capture on; unset, `false`, `no_content` or `event_only` leave it off."""
    env = os.environ if environ is None else environ
    value = env.get(CAPTURE_ENV, "").strip().lower()
    return value in ("true", "1", "yes", "span_only", "span_and_event")


def provider_and_model(model: str) -> tuple[str, str]:
    """`gen_ai.provider.name` and `gen_ai.request.model` of a sopctl model string: litellm's
    `provider/model` split, the embedded model as llama.cpp's, `fake` as sopctl's own."""
    if model == "local":
        return "llama.cpp", "SmolLM2-135M-Instruct"
    if model == "fake":
        return "sopctl", "fake"
    if "/" in model:
        provider, name = model.split("/", 1)
        return provider, name
    return "", model


@dataclass
class _Open:
    span: Span
    last: int                      # when its latest event came (ns): where it ends


def _tool_attributes(tool: str, command: str) -> dict[str, Any]:
    attributes: dict[str, Any] = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool,
                                  "gen_ai.tool.type": "function"}
    if command:
        attributes["gen_ai.tool.description"] = command
    return attributes


# --- turning it on --------------------------------------------------------------------------


def tracing_wanted(flag: bool, environ: Mapping[str, str] | None = None) -> bool:
    """`--trace`, or an OTEL_* variable that asks for traces (and the SDK not disabled)."""
    env = os.environ if environ is None else environ
    if flag:
        return True
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


@dataclass
class Tracing:
    """Tracing turned on for one command: its observer, and `close` to send what is left."""

    observer: TracingObserver
    provider: TracerProvider

    def close(self) -> None:
        """Export every span still buffered, then stop (the command is about to exit)."""
        self.provider.force_flush()
        self.provider.shutdown()


def start_tracing(flag: bool, tools: Mapping[str, str] | None = None,
                  environ: Mapping[str, str] | None = None) -> Tracing | None:
    """The run's tracing when `--trace` or the environment asks for it, else None.

    Without the `otel` extra: a UsageError for `--trace`; a warning when only the
    environment asks (its OTEL_* variables may be meant for other programs)."""
    env = os.environ if environ is None else environ
    if not tracing_wanted(flag, env):
        return None
    try:
        # the optional `otel` extra: only a traced run imports it (a missing one is said below)
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
    except ImportError:
        if flag:
            raise UsageError("--trace needs OpenTelemetry, which is not installed",
                             f"install the extra: {install_hint('otel')}") from None
        print("sopctl: warning: OTEL_* variables ask for traces, but OpenTelemetry is not "
              f"installed ({install_hint('otel')}); running without them", file=sys.stderr)
        return None

    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or "sopctl",
                                "service.version": __version__})
    provider = TracerProvider(resource=resource)
    for processor in _processors(env):
        provider.add_span_processor(processor)
    tracer = provider.get_tracer(INSTRUMENTATION, __version__)
    return Tracing(TracingObserver(tracer, tools, capture_content=capture_wanted(env)), provider)


def _processors(env: Mapping[str, str]) -> list[Any]:
    """A span processor per exporter named in OTEL_TRACES_EXPORTER (default `otlp`)."""
    # the optional `otel` extra, as above
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor

    names = [n.strip().lower() for n in (env.get("OTEL_TRACES_EXPORTER") or "otlp").split(",") if n.strip()]
    unknown = [n for n in names if n not in _EXPORTERS]
    if unknown:
        raise UsageError(f"OTEL_TRACES_EXPORTER names an exporter sopctl has no exporter for: {unknown[0]}",
                         f"use one of {', '.join(_EXPORTERS)}")
    processors: list[Any] = []
    if "console" in names:
        processors.append(SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
    if "otlp" in names:
        processors.append(BatchSpanProcessor(_otlp_exporter(env)))
    return processors


def _otlp_exporter(env: Mapping[str, str]) -> Any:
    """OTLP over HTTP/protobuf (default) or gRPC (`OTEL_EXPORTER_OTLP_PROTOCOL=grpc`); the
    exporter reads its endpoint, headers and timeout from OTEL_* itself."""
    protocol = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "http/protobuf").strip().lower()
    if protocol not in ("http/protobuf", "grpc"):
        raise UsageError(f"OTLP protocol {protocol!r} is not supported by sopctl",
                         "set OTEL_EXPORTER_OTLP_PROTOCOL to http/protobuf (port 4318 on a collector) "
                         "or grpc (port 4317)")
    try:
        # the optional `otel` extra's exporters, as above
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter  # grpc: only when asked
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # type: ignore[assignment]
    except ImportError:
        raise UsageError(f"the OTLP exporter for {protocol} is not installed",
                         f"install the extra: {install_hint('otel')}") from None
    return OTLPSpanExporter()
