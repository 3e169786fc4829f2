"""A hosted model's stack loaded: time from `sopctl run` to the first request, import time
and memory with litellm, against a local OpenAI-compatible server.

The server is a minimal OpenAI-compatible stub in this process (`POST /v1/chat/completions`
answers one fixed chat completion): `llama_cpp.server` needs a GGUF model file, and none is
shipped or fetched. The run is the real CLI, `sopctl run sops/software_company.sop.yaml
--model openai/stub --api-base http://127.0.0.1:PORT/v1`, in a fresh process, through
litellm, exactly as with a hosted provider. It is measured up to its first request, then
stopped:

- time to the first request: from starting the process to the request reaching the server;
- peak RSS of the run's process at that moment (`VmHWM`): litellm and its stack are loaded,
  so this is what a hosted run costs at least;
- import of what a hosted run needs (engine CLI, run machinery and litellm), in a fresh
  process, as `bench.compare` measures the fake run's.

    python -m bench.hosted_bench
"""
from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SOP = ROOT / "sops" / "software_company.sop.yaml"
TARGET_FIRST_REQUEST_S = 2.0
_ANSWER = {"id": "stub-1", "object": "chat.completion", "created": 0, "model": "stub",
           "choices": [{"index": 0, "finish_reason": "stop",
                        "message": {"role": "assistant", "content": "{}"}}],
           "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


class _Stub(BaseHTTPRequestHandler):
    """Answers every POST with one chat completion; remembers when the first one came."""

    arrived: list[float] = []
    seen = threading.Event()

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        type(self).arrived.append(time.perf_counter())
        type(self).seen.set()
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        body = json.dumps(_ANSWER).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def first_request(timeout_s: float = 180.0) -> dict[str, float]:
    """One cold `sopctl run` against the stub: seconds to its first request, and its peak RSS."""
    _Stub.arrived, _Stub.seen = [], threading.Event()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sopctl = str(Path(sys.executable).parent / "sopctl")
    env = {**os.environ, "OPENAI_API_KEY": "sk-local-stub-not-a-key"}
    env.pop("SOPCTL_MODEL", None)
    with tempfile.TemporaryDirectory(prefix="sopctl-hosted-") as tmp:
        cmd = [sopctl, "run", str(SOP), "--model", "openai/stub", "--api-base",
               f"http://127.0.0.1:{server.server_address[1]}/v1", "--idea", "a 2048 game",
               "--out", str(Path(tmp) / "ws"), "--format", "json"]
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, start_new_session=True)
        try:
            if not _Stub.seen.wait(timeout_s):
                raise RuntimeError(f"no request within {timeout_s:g} s: "
                                   f"{proc.stderr.read().decode()[-2000:] if proc.poll() is not None else ''}")
            seconds = _Stub.arrived[0] - t0
            rss = _peak_rss_mb(proc.pid)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            server.shutdown()
    return {"first_request_s": seconds, "peak_rss_mb": rss}


_IMPORT = ("import time; t = time.perf_counter(); import engine.cli.commands, engine.cli.live, "
           "engine.cli.report, engine.api; from engine.models.hosted import litellm_module; "
           "litellm_module(); print(time.perf_counter() - t)")


def hosted_import_s() -> float:
    proc = subprocess.run([sys.executable, "-c", _IMPORT], cwd=ROOT, capture_output=True,
                          text=True, check=True)
    return float(proc.stdout.strip().splitlines()[-1])


def main(size_factor: float = 1.0, reps: int | None = None) -> dict[str, Any]:
    reps = reps or (3 if size_factor >= 1 else 1)
    runs = [first_request() for _ in range(reps)]
    imports = [hosted_import_s() for _ in range(reps)]
    first = statistics.median(r["first_request_s"] for r in runs)
    res = {"first_request_s": first, "first_request_range": [min(r["first_request_s"] for r in runs),
                                                             max(r["first_request_s"] for r in runs)],
           "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in runs),
           "import_s": statistics.median(imports), "reps": reps,
           "ratio": first, "target": TARGET_FIRST_REQUEST_S,
           "ratio_label": "seconds from `sopctl run` to the first request, hosted model (litellm)"}
    lo, hi = res["first_request_range"]
    res["markdown"] = "\n".join([
        "| figure (median of %d) | value |" % reps, "|---|---|",
        f"| time from `sopctl run` to the first request | {first:.2f} s ({lo:.2f}-{hi:.2f}); target <= {TARGET_FIRST_REQUEST_S:g} s, "
        f"{'met' if first <= TARGET_FIRST_REQUEST_S else '**not met**'} |",
        f"| peak RSS of the run's process at its first request | {res['peak_rss_mb']:.0f} MB |",
        f"| import of what a hosted run needs (engine + litellm) | {res['import_s']:.2f} s |",
        "", "Against a minimal OpenAI-compatible stub server in the bench process (no GGUF model "
        "for `llama_cpp.server` here); the run goes through litellm as with a hosted provider."])
    print(res["markdown"])
    return res


if __name__ == "__main__":
    main(0.05 if "--quick" in sys.argv else 1.0)
