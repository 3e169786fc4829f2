"""`sopctl report`: a run as one self-contained HTML file, read from its journal alone.

What `show` prints (engine.journal.history.RunState) plus two drawings (engine.cli.report_svg):
the watch graph with its loops and their bounds, and the timeline of rounds × roles with the
calls in flight. Every message, prompt and artifact is model or user text, so the template is
rendered with autoescape on; and the page's Content-Security-Policy lets nothing load from
anywhere and no script run but the report's own (by its hash), so a message that slipped
past escaping still could not fetch or run anything. The file works offline.

A report is made to be shared, so every text it quotes (artifacts, which the journal does not
redact, messages, prompts, inputs, errors) goes through the journal's redaction
(`engine.load.secrets.scrub`) once more, with the secrets of the environment it is made in:
the template's `finalize` redacts every value it prints, and a text that is cut is redacted
before it is cut (a cut could split a secret and leave its head in clear).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
import networkx as nx
from markupsafe import Markup

from engine.cli.report import format_time, status_line
from engine.cli.report_svg import duration_text, layout_graph, layout_timeline
from engine.compile.compiler import check_path
from engine.errors import SopError, UsageError
from engine.journal.history import ActionRecord, Invocation, RunState, ToolCallRecord, read_exchanges
from engine.journal.run_folder import OPEN_OWN
from engine.load.secrets import scrub, secret_values
from engine.load.spec import ENGINE_DIR, in_engine_dir
from engine.models.types import Usage
from engine.run.events import RunStatus
from engine.run.people import PERSON
from engine.run.toolloop import TOOL
from engine.run.workspace import Workspace


__all__ = ["render_report", "write_report", "default_output"]

ARTIFACT_SHOWN_CHARS = 64 * 1024
PROMPT_SHOWN_CHARS = 8 * 1024
ARTIFACT_READ_BYTES = 16 * 1024 * 1024
"""A larger artifact is not read at all (nor checked against its hash)."""
"""Artifacts are shown up to this size (the rest is cut, and says so): the report stays small."""


def default_output(run_dir: str | Path) -> Path:
    """`runs/g2048` -> `runs/g2048.html`: beside the run, never inside its workspace."""
    folder = Path(run_dir).resolve()
    return folder.with_name(folder.name + ".html")


def write_report(state: RunState, out: str | Path) -> Path:
    """Render the report and write it atomically to `out` (UsageError if it cannot be).

    Never into a run folder's `.sopctl/` (`-o RUN/.sopctl/journal.sqlite` would replace the
    journal), and the temporary file is made afresh, never opened through a link."""
    target = Path(out)
    if any(in_engine_dir(part) for part in target.resolve().parts):
        raise UsageError(f"-o {out} is inside a run folder's {ENGINE_DIR}/ (its journal and lock); refused",
                         "write the report beside the run, e.g. the default RUN_DIR.html")
    if target.is_dir():
        raise UsageError(f"-o {out} is a folder", "give a file name, e.g. -o report.html")
    if not target.parent.is_dir():
        raise UsageError(f"-o {out}: folder {target.parent} does not exist")
    html = render_report(state)
    temp = target.with_name(f".{target.name}.tmp")
    try:
        temp.unlink(missing_ok=True)          # a leftover or a planted link: removed, not followed
        handle = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | OPEN_OWN, 0o644)
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(html)
        temp.replace(target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            temp.unlink(missing_ok=True)
        raise UsageError(f"cannot write {out}: {exc.strerror or exc}") from None
    return target


def render_report(state: RunState) -> str:
    """The whole HTML page of a run."""
    secrets = secret_values()

    def redacted(value: Any) -> Any:
        # the page's own script and style are Markup (a str): left as they are
        return scrub(value, secrets) if isinstance(value, str) and not isinstance(value, Markup) else value

    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, finalize=redacted)
    env.filters["duration"] = duration_text
    template = env.from_string(_asset("report.html.j2"))
    script = _asset("report.js")
    style = _asset("report.css")
    script_hash = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode()
    return template.render(script=Markup(script), style=Markup(style),
                           script_hash=script_hash, **_view(state))


def _asset(name: str) -> str:
    # one name per joinpath: Python 3.10's Traversable takes no more
    return resources.files("engine.cli").joinpath("report_assets").joinpath(name).read_text(encoding="utf-8")


# --- the view: what the template shows --------------------------------------------------


def _view(state: RunState) -> dict[str, Any]:
    graph, graph_note, role_order = _watch_graph(state)
    exchanges = _exchanges(state)
    prompts = _prompts_per_try(state, exchanges)
    runs: dict[str, int] = {}
    for record in state.timeline:
        runs[record.action] = runs.get(record.action, 0) + 1
    drawing = layout_graph(graph, runs, {r.role for r in state.timeline}) if graph is not None else None
    return {
        "state": state,
        "title": f"{state.sop_name or 'run'} · {state.run_id}",
        "status": str(state.status),
        "status_text": status_line(state),
        "stopped": _stopped(state),
        "started": format_time(state.started_at),
        "elapsed": duration_text(_elapsed(state)),
        "usage": state.usage,
        "graph": drawing,
        "graph_note": graph_note,
        "timeline": layout_timeline(state, role_order),
        "actions": [_usage_row(s.action, s.roles, s.runs, s.usage) for s in state.actions.values()],
        "roles": _role_rows(state),
        "runs": [_run_view(i, r, state, prompts) for i, r in enumerate(state.timeline)],
        "models": _models(state),
        "invocations": [_invocation_view(i) for i in state.invocation_list] if state.invocations > 1 else [],
        "rounds": _rounds(state),
        "artifacts": [_artifact(state, path, digest) for path, digest in sorted(state.artifacts.items())],
        "inputs": json.dumps(state.inputs, ensure_ascii=False, indent=2),
    }


def _watch_graph(state: RunState) -> tuple[nx.DiGraph | None, str, list[str]]:
    """The run's watch graph from its SOP file, or None and why not (the report goes on)."""

    path = state.sop_path or state.sop_file
    if not path or not Path(path).is_file():
        return None, f"the run's SOP file {path or '(unknown)'} is gone: no graph", []
    try:
        checked = check_path(path, tuple(state.include_dirs))
    except (SopError, OSError) as exc:
        return None, f"the run's SOP file {path} cannot be read now: {exc}", []
    if checked.graph is None:
        return None, f"the run's SOP file {path} is no longer valid: no graph", []
    note = ""
    if checked.compiled is not None and state.sop_hash and checked.compiled.source_hash != state.sop_hash:
        note = f"{path} changed since the run: this is the graph of the file as it is now"
    roles = [n.split(":", 1)[1] for n, d in checked.graph.nodes(data=True) if d["kind"] == "role"]
    return checked.graph, note, roles


def _stopped(state: RunState) -> dict[str, Any] | None:
    """Where a run that did not end normally stopped: its last round and unfinished actions."""
    if state.status in (RunStatus.IDLE, RunStatus.MAX_ROUNDS):
        return None
    unfinished = [f"{r.role}.{r.action} (round {r.round})" for r in state.timeline
                  if not r.completed and r.invocation == state.invocations]
    return {"round": state.rounds, "error": state.error, "unfinished": unfinished,
            "at": format_time(state.ended_at or state.last_event_at)}


def _elapsed(state: RunState) -> float:
    end = state.ended_at or state.last_event_at
    return max(end - state.started_at, 0.0) if state.started_at else 0.0


def _usage_row(name: str, roles: list[str], runs: int, usage: Usage) -> dict[str, Any]:
    return {"name": name, "detail": ", ".join(roles), "runs": runs, "usage": usage}


def _role_rows(state: RunState) -> list[dict[str, Any]]:
    """Usage per role: the sum of its action runs' (what their gateway events report)."""
    by_role: dict[str, tuple[list[str], int, Usage]] = {}
    for record in state.timeline:
        actions, count, usage = by_role.get(record.role, ([], 0, Usage()))
        if record.action not in actions:
            actions = [*actions, record.action]
        by_role[record.role] = (actions, count + 1, usage + record.usage)
    return [_usage_row(role, actions, count, usage) for role, (actions, count, usage) in by_role.items()]


def _run_view(index: int, record: ActionRecord, state: RunState,
              prompts: list[list[dict[str, Any]]] | None) -> dict[str, Any]:
    end = record.ended_at if record.ended_at is not None else (
        record.stopped_at or state.ended_at or state.last_event_at)
    return {"index": index, "record": record, "duration": duration_text(max(end - record.started_at, 0.0)),
            "prompts": None if prompts is None else [_shown_exchange(e) for e in prompts[index]],
            "earlier": not record.completed and record.invocation < state.invocations,
            "tools": [_tool_view(t) for t in record.tools]}


def _prompts_per_try(state: RunState, exchanges: list[dict[str, Any]] | None) -> list[list[dict[str, Any]]] | None:
    """Each action try's exchanges: the answers it read (by their journal keys), each shown
    once, under the first try that read it (a resume's reused answers are the failed try's).
    A tool's results are the try's tool rows, not prompts. A person's answers, and every
    exchange of a journal whose events name no answer (older sopctl), go by round, role and
    action, to the last such try."""
    if exchanges is None:
        return None
    by_place = not any(r.requests for r in state.timeline)
    last_try: dict[tuple[Any, Any, Any], int] = {(r.round, r.role, r.action): i
                                                 for i, r in enumerate(state.timeline)}
    shown: set[str] = set()
    out: list[list[dict[str, Any]]] = [[] for _ in state.timeline]
    for index, record in enumerate(state.timeline):
        wanted = set(record.requests)
        for exchange in exchanges:
            key, origin = str(exchange.get("request_hash", "")), exchange.get("origin")
            if origin == TOOL or key in shown:
                continue
            place = (exchange.get("round"), exchange.get("role"), exchange.get("action"))
            if key in wanted or ((by_place or origin == PERSON) and last_try.get(place) == index):
                shown.add(key)
                out[index].append(exchange)
    return out


def _tool_view(call: ToolCallRecord) -> dict[str, Any]:
    """A tool command as its row shows it: the arguments as JSON, the output cut like a prompt."""
    hint = f"sopctl show RUN_DIR --prompts {call.tool}"
    return {"step": call.step, "tool": call.tool, "error": call.error, "reused": call.reused,
            "duration": duration_text(call.seconds),
            "args": _cut(json.dumps(call.args, ensure_ascii=False, indent=1), hint),
            "output": _cut(call.output, hint)}


def _models(state: RunState) -> list[dict[str, Any]]:
    """The models that answered, with how many answers each gave; the run's default model
    when none answered (a run of tools and people only, or an old journal)."""
    if not state.models:
        return [{"name": state.model, "answers": None}] if state.model else []
    return [{"name": name, "answers": count} for name, count in state.models.items()]


def _invocation_view(invocation: Invocation) -> dict[str, Any]:
    ended = invocation.ended_at is not None
    until = invocation.ended_at if ended else invocation.last_at
    return {"number": invocation.number, "started": format_time(invocation.started_at),
            "duration": duration_text(max((until or 0.0) - invocation.started_at, 0.0)),
            "status": str(invocation.status) if ended else "killed (no end recorded)",
            "error": invocation.error, "rounds": invocation.rounds, "model": invocation.model}


def _shown_exchange(exchange: dict[str, Any]) -> dict[str, Any]:
    """An exchange with each text cut to PROMPT_SHOWN_CHARS: with `context: all` a prompt holds
    every earlier message, so prompts grow with the square of a run's length; the full text
    is in the journal."""
    hint = f"sopctl show RUN_DIR --prompts {exchange.get('action', '')}"
    messages = [{**m, "content": _cut(str(m.get("content", "")), hint)}
                for m in exchange.get("messages") or [] if isinstance(m, dict)]
    return {**exchange, "messages": messages, "answer": _cut(str(exchange.get("answer", "")), hint)}


def _cut(text: str, hint: str) -> str:
    """Redacted, then cut (cutting first could split a secret and leave its head in clear)."""
    text = scrub(text)
    if len(text) <= PROMPT_SHOWN_CHARS:
        return text
    return f"{text[:PROMPT_SHOWN_CHARS]}\n… ({len(text) - PROMPT_SHOWN_CHARS} more characters: `{hint}`)"


def _exchanges(state: RunState) -> list[dict[str, Any]] | None:
    """Every request the run sent with its answer (`Exchange.to_json()`); None for a state
    not read from a run folder."""
    if not state.run_dir:
        return None
    return [e.to_json() for e in read_exchanges(state.run_dir)]


def _rounds(state: RunState) -> list[dict[str, Any]]:
    """Every round with its roles, messages, person events and warnings."""
    numbers = set(state.round_roles) | {r.round for r in state.timeline}
    numbers |= {int(m.get("round", 0)) for m in state.history}
    return [{
        "round": rnd,
        "roles": state.round_roles.get(rnd, []),
        "messages": [_message(m) for m in state.history if int(m.get("round", 0)) == rnd],
        "warnings": [g for g in state.logs if g.get("round") == rnd],   # and notices
        "answers": [g for g in state.answered.values() if g.get("round") == rnd],
        "replies": [g for g in state.replies if g.get("round") == rnd],
    } for rnd in sorted(numbers)]


def _message(message: dict[str, Any]) -> dict[str, Any]:
    out = message.get("out")
    content = str(message.get("content") or "")
    structured = out if isinstance(out, (dict, list)) else None
    return {"id": message.get("id"), "cause_by": message.get("cause_by"),
            "sent_from": message.get("sent_from"), "send_to": sorted(message.get("send_to") or []),
            "content": content,
            "out": json.dumps(structured, ensure_ascii=False, indent=2) if structured is not None else ""}


def _artifact(state: RunState, rel: str, digest: str) -> dict[str, Any]:
    """An artifact as it is in the workspace now: its text, or why it is not shown."""

    view: dict[str, Any] = {"path": rel, "sha256": digest, "text": None, "note": ""}
    try:
        path = Workspace(state.run_dir).confine(rel)
        size = path.stat().st_size if path.is_file() else None
        if size is not None and size > ARTIFACT_READ_BYTES:
            view["note"] = f"not shown: {size} bytes"
            return view
        data = path.read_bytes() if size is not None else None
    except (SopError, OSError) as exc:
        view["note"] = f"not shown: {exc}"
        return view
    if data is None:
        view["note"] = "missing from the workspace"
        return view
    if hashlib.sha256(data).hexdigest() != digest:
        view["note"] = "changed since the run wrote it"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        view["note"] = (view["note"] + "; " if view["note"] else "") + f"binary, {len(data)} bytes"
        return view
    text = scrub(text)        # a file the run wrote is not redacted in the workspace; here it is
    if len(text) > ARTIFACT_SHOWN_CHARS:
        text = text[:ARTIFACT_SHOWN_CHARS] + f"\n… (cut: {len(data)} bytes in all)"
    view["text"] = text
    return view
