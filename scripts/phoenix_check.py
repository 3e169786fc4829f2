"""Check sopctl's traces against a real receiver: Arize Phoenix.

Starts `phoenix serve` (from its own virtual environment: Phoenix is heavy, it is no
dependency of sopctl), runs an SOP on the `fake` model with OTLP export to it, once over
HTTP and once over gRPC, with content capture on, then reads the spans back through
Phoenix's REST API and checks the tree and its numbers:

- one `invoke_workflow` root per run; every `invoke_agent` span is its child; every `chat`
  and `execute_tool` span is a child of an `invoke_agent` span;
- as many `chat` spans as the run's model calls, their tokens adding up to the run's;
- the content (`gen_ai.input.messages`, `gen_ai.output.messages`) arrived.

Recipe (docs/tracing.md):

    python3 -m venv /tmp/phoenix-venv && /tmp/phoenix-venv/bin/pip install arize-phoenix
    python scripts/phoenix_check.py --phoenix /tmp/phoenix-venv/bin/phoenix

`--keep` leaves Phoenix running afterwards (its UI at the printed address) until Ctrl-C.
Exit 0 when every check passed, 1 when one failed, 2 when Phoenix could not be started.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SOP = ROOT / "sops" / "mgx_team.sop.yaml"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:   # noqa: S310 - localhost only
        return json.loads(response.read())


def start_phoenix(executable: str, folder: Path) -> tuple[subprocess.Popen[bytes], str, int]:
    """Phoenix on free localhost ports, its data in `folder`; (process, base URL, gRPC port)."""
    http_port, grpc_port = free_port(), free_port()
    env = {**os.environ, "PHOENIX_WORKING_DIR": str(folder), "PHOENIX_PORT": str(http_port),
           "PHOENIX_GRPC_PORT": str(grpc_port), "PHOENIX_HOST": "127.0.0.1"}
    log = (folder / "phoenix.log").open("wb")
    process = subprocess.Popen([executable, "serve"], env=env, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    base = f"http://127.0.0.1:{http_port}"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"phoenix exited ({process.returncode}); see {folder / 'phoenix.log'}")
        try:
            with urllib.request.urlopen(base + "/healthz", timeout=2):   # noqa: S310
                return process, base, grpc_port
        except (urllib.error.URLError, OSError):
            time.sleep(1)
    stop(process)
    raise RuntimeError(f"phoenix did not answer on {base} within 240 s")


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


def run_sop(sop: Path, out: Path, project: str, endpoint: str, protocol: str) -> dict[str, Any]:
    """`sopctl run` on `fake` exporting to Phoenix; the run's totals as `sopctl show` gives them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SOPCTL_"))}
    env.update({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
                "OTEL_EXPORTER_OTLP_INSECURE": "true", "OTEL_SERVICE_NAME": "sopctl",
                "OTEL_RESOURCE_ATTRIBUTES": f"openinference.project.name={project}",
                "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true"})
    cli = [sys.executable, "-m", "engine.cli"]
    done = subprocess.run([*cli, "run", str(sop), "--idea", "a snake game", "--model", "fake",
                           "--allow-exec", "--no-input", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"sopctl run failed ({done.returncode}): {done.stderr[-2000:]}")
    shown = subprocess.run([*cli, "show", str(out), "--format", "json"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120)
    return dict(json.loads(shown.stdout))


def spans_of(base: str, project: str, chats: int) -> list[dict[str, Any]]:
    """Every span of `project`, read page by page. Phoenix stores what it receives in the
    background: polled until the `chats` chat spans are there and the count holds still."""
    deadline = time.monotonic() + 90
    spans: list[dict[str, Any]] = []
    before = -1
    while time.monotonic() < deadline:
        spans, cursor = [], ""
        while True:
            page = get_json(f"{base}/v1/projects/{project}/spans?limit=500" + (f"&cursor={cursor}" if cursor else ""))
            spans += page.get("data", [])
            cursor = page.get("next_cursor") or ""
            if not cursor:
                break
        arrived = sum(1 for s in spans if s["attributes"].get("gen_ai.operation.name") == "chat")
        if arrived >= chats and len(spans) == before:
            return spans
        before = len(spans)
        time.sleep(2)
    return spans


def check(spans: list[dict[str, Any]], shown: dict[str, Any]) -> list[str]:
    """What is wrong with the tree Phoenix holds (empty: nothing)."""
    problems: list[str] = []

    def op(span: dict[str, Any]) -> str:
        return str(span["attributes"].get("gen_ai.operation.name", ""))

    by_id = {s["context"]["span_id"]: s for s in spans}
    roots = [s for s in spans if op(s) == "invoke_workflow"]
    if len(roots) != 1 or roots[0]["parent_id"] is not None:
        problems.append(f"expected one invoke_workflow root, found {len(roots)}")
    for span in spans:
        parent = by_id.get(span["parent_id"] or "")
        want = {"invoke_agent": "invoke_workflow", "chat": "invoke_agent", "execute_tool": "invoke_agent"}.get(op(span))
        if want and (parent is None or op(parent) != want):
            problems.append(f"{span['name']}: parent is not an {want} span")
    chats = [s for s in spans if op(s) == "chat"]
    if len(chats) != shown["llm_calls"]:
        problems.append(f"{len(chats)} chat spans for {shown['llm_calls']} model calls")
    for key, total in (("gen_ai.usage.input_tokens", "prompt_tokens"), ("gen_ai.usage.output_tokens", "completion_tokens")):
        got = sum(int(s["attributes"].get(key, 0)) for s in chats)
        if got != shown[total]:
            problems.append(f"{key} adds up to {got}, the run's {total} is {shown[total]}")
    if not all("gen_ai.input.messages" in s["attributes"] and "gen_ai.output.messages" in s["attributes"]
               for s in chats):
        problems.append("a chat span lacks its captured messages")
    return problems


def tree(spans: list[dict[str, Any]]) -> str:
    """The span tree as Phoenix holds it, one line per span: its name and Phoenix's kind."""
    children: dict[str | None, list[dict[str, Any]]] = {}
    for span in sorted(spans, key=lambda s: s["start_time"]):
        children.setdefault(span["parent_id"], []).append(span)
    lines: list[str] = []

    def walk(parent: str | None, depth: int) -> None:
        for span in children.get(parent, []):
            attrs = span["attributes"]
            tokens = f" tokens {attrs['gen_ai.usage.input_tokens']}+{attrs['gen_ai.usage.output_tokens']}" \
                if "gen_ai.usage.input_tokens" in attrs else ""
            lines.append(f"{'  ' * depth}{span['name']}  [{span['span_kind']}]{tokens}")
            walk(span["context"]["span_id"], depth + 1)

    walk(None, 0)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phoenix", default=os.environ.get("SOPCTL_PHOENIX") or shutil.which("phoenix"),
                        help="the `phoenix` executable (default: $SOPCTL_PHOENIX, else on PATH)")
    parser.add_argument("--sop", type=Path, default=SOP, help="the SOP to run (default: the MGX team)")
    parser.add_argument("--keep", action="store_true", help="leave Phoenix running until Ctrl-C")
    args = parser.parse_args(argv)
    if not args.phoenix:
        print("phoenix_check: no `phoenix` executable (pip install arize-phoenix in its own venv, "
              "then --phoenix PATH)", file=sys.stderr)
        return 2
    folder = Path(tempfile.mkdtemp(prefix="sopctl-phoenix-"))
    try:
        process, base, grpc_port = start_phoenix(args.phoenix, folder)
    except RuntimeError as exc:
        print(f"phoenix_check: {exc}", file=sys.stderr)
        return 2
    failed = False
    try:
        print(f"phoenix at {base} (OTLP/HTTP {base}/v1/traces, OTLP/gRPC 127.0.0.1:{grpc_port})")
        for protocol, endpoint in (("http/protobuf", base), ("grpc", f"http://127.0.0.1:{grpc_port}")):
            project = "sopctl-" + protocol.split("/")[0]
            shown = run_sop(args.sop, folder / project, project, endpoint, protocol)
            spans = spans_of(base, project, chats=shown["llm_calls"])
            problems = check(spans, shown)
            print(f"\n{protocol}: project {project}, {len(spans)} spans, run {shown['run_id']} "
                  f"({shown['llm_calls']} model calls, {shown['prompt_tokens']}+{shown['completion_tokens']} tokens)")
            print(tree(spans))
            for problem in problems:
                print(f"PROBLEM: {problem}")
            failed = failed or bool(problems)
        print("\nall checks passed" if not failed else "\nsome checks failed")
        if args.keep:
            print(f"Phoenix keeps running at {base}; Ctrl-C stops it")
            process.wait()
    except KeyboardInterrupt:
        pass
    finally:
        stop(process)
        shutil.rmtree(folder, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
