"""A hosted model's first request: time from `sopctl run` to the first request, import time
and memory, against a local OpenAI-compatible server, by the direct client and by litellm.

The server is a minimal OpenAI-compatible stub in this process (`POST /v1/chat/completions`
answers one fixed chat completion): `llama_cpp.server` needs a GGUF model file, and none is
shipped or fetched. The run is the real CLI, `sopctl run sops/software_company.sop.yaml
--model openai/stub --api-base http://127.0.0.1:PORT/v1`, in a fresh process, exactly as
with a hosted OpenAI-compatible server. It is measured up to its first request, then stopped,
twice in the same bench: sent by sopctl's own client (the default for `openai/` models,
engine/models/openai_http.py, on the openai SDK), and through litellm (`SOPCTL_OPENAI_VIA_LITELLM=1`, the path
of every other provider):

- time to the first request: from starting the process to the request reaching the server;
- peak RSS of the run's process at that moment (`VmHWM`);
- import of what the run needs before its first request (engine CLI, run machinery, and the openai SDK
  or litellm), in a fresh process, as `bench.compare` measures the fake run's.

Every run is a warm start, as every run after the first one is: Python's bytecode cache is
written (one untimed run first; PYTHONDONTWRITEBYTECODE is left out of the runs' environment),
as it is for an installed sopctl.

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


VIA_LITELLM = "SOPCTL_OPENAI_VIA_LITELLM"


def _env(via_litellm: bool) -> dict[str, str]:
    env = {**os.environ, "OPENAI_API_KEY": "sk-local-stub-not-a-key"}
    for name in ("SOPCTL_MODEL", "PYTHONDONTWRITEBYTECODE", VIA_LITELLM):
        env.pop(name, None)
    if via_litellm:
        env[VIA_LITELLM] = "1"
    return env


def first_request(via_litellm: bool = False, timeout_s: float = 180.0) -> dict[str, float]:
    """One fresh `sopctl run` against the stub: seconds to its first request, and its peak RSS."""
    _Stub.arrived, _Stub.seen = [], threading.Event()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sopctl = str(Path(sys.executable).parent / "sopctl")
    env = _env(via_litellm)
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
           "engine.api; {client}; print(time.perf_counter() - t)")
_CLIENTS = {False: "from engine.models.openai_http import _sdk; _sdk()",
            True: "from engine.models.hosted import litellm_module; litellm_module()"}


def hosted_import_s(via_litellm: bool = False) -> float:
    code = _IMPORT.format(client=_CLIENTS[via_litellm])
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, check=True, env=_env(via_litellm))
    return float(proc.stdout.strip().splitlines()[-1])


def _median(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main(size_factor: float = 1.0, reps: int | None = None) -> dict[str, Any]:
    reps = reps or (3 if size_factor >= 1 else 1)
    first_request()                       # untimed: writes the bytecode cache, warms the disk
    direct, litellm = [], []
    for _ in range(reps):                 # interleaved: both see the same load of the machine
        direct.append(first_request())
        litellm.append(first_request(via_litellm=True))
    first, via = _median(direct, "first_request_s"), _median(litellm, "first_request_s")
    lo, hi = min(r["first_request_s"] for r in direct), max(r["first_request_s"] for r in direct)
    res = {"first_request_s": first, "first_request_range": [lo, hi],
           "first_request_via_litellm_s": via,
           "peak_rss_mb": _median(direct, "peak_rss_mb"),
           "peak_rss_via_litellm_mb": _median(litellm, "peak_rss_mb"),
           "import_s": statistics.median(hosted_import_s() for _ in range(reps)),
           "import_via_litellm_s": statistics.median(hosted_import_s(True) for _ in range(reps)),
           "reps": reps, "ratio": first, "target": TARGET_FIRST_REQUEST_S,
           "ratio_label": "seconds from `sopctl run` to the first request, openai/ model "
                          "(direct client)"}
    met = "met" if first <= TARGET_FIRST_REQUEST_S else "**not met**"
    res["markdown"] = "\n".join([
        f"| figure (median of {reps}) | direct client | through litellm |", "|---|---|---|",
        f"| time from `sopctl run` to the first request | {first:.2f} s ({lo:.2f}-{hi:.2f}); "
        f"target <= {TARGET_FIRST_REQUEST_S:g} s, {met} | {via:.2f} s ({via / first:.1f}x) |",
        f"| peak RSS of the run's process at its first request | {res['peak_rss_mb']:.0f} MB "
        f"| {res['peak_rss_via_litellm_mb']:.0f} MB |",
        f"| import of what the run needs before its first request | {res['import_s']:.2f} s "
        f"| {res['import_via_litellm_s']:.2f} s |",
        "", "Against a minimal OpenAI-compatible stub server in the bench process (no GGUF model "
        "for `llama_cpp.server` here); `--model openai/stub`, sent by sopctl's own client, and "
        f"with {VIA_LITELLM}=1 through litellm as every other provider."])
    print(res["markdown"])
    return res


if __name__ == "__main__":
    main(0.05 if "--quick" in sys.argv else 1.0)
