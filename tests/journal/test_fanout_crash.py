"""A crash in a fan-out costs only the calls truly in flight (issue 26).

Each answer of a `for_each` item is journaled and committed the moment it arrives, not when
the whole fan-out ends: a process killed mid fan-out leaves every answer that had arrived,
and `sopctl resume` asks again only what was still being asked (at most `max_concurrency`
calls). The model is a real OpenAI-compatible HTTP server on 127.0.0.1 that answers after a
delay and COUNTS the requests it receives, so the test sees the calls made before the crash
and the ones the resume repeats, not only what the journal says.
"""

from __future__ import annotations

import http.server
import json
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from run_helpers import ROOT, ForkedSopctl, here, sopctl_env

from engine.journal.run_folder import journal_path
from engine.testing import allow_real_models

MODEL = "openai/self-hosted-fanout-model"      # unknown to litellm's price map
ITEMS, CONCURRENCY = 9, 3
KEY = {"OPENAI_API_KEY": "sk-local-test-key-0000"}

SOP_TEXT = f"""\
apiVersion: sop/v1
name: fanout_crash
inputs:
  idea: {{type: str, required: true}}
team: {{max_rounds: 2}}
actions:
  WritePart:
    for_each: "{{{{ range({ITEMS}) | list }}}}"
    as: part
    max_concurrency: {CONCURRENCY}
    prompt: "Write part {{{{ part }}}} of {{{{ inputs.idea }}}}."
    context: none
    send_to: ["<none>"]
roles:
  Writer:
    profile: Writer
    actions: [WritePart]
    watch: [UserRequirement]
"""


class SlowServer:
    """An OpenAI-compatible chat server that answers every request after `delay_s` and
    counts the requests it received (and, per prompt, how often it was asked)."""

    def __init__(self, delay_s: float) -> None:
        self.asked: list[str] = []
        self.lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return None

            def do_POST(self) -> None:
                size = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(size) or b"{}")
                prompt = body["messages"][-1]["content"]
                with server.lock:
                    server.asked.append(prompt)
                time.sleep(delay_s)
                data = json.dumps({
                    "id": "c1", "object": "chat.completion", "created": 1, "model": "m",
                    "choices": [{"index": 0, "finish_reason": "stop", "message": {
                        "role": "assistant", "content": f"the part, as asked: {prompt[:40]}"}}],
                    "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14},
                }).encode()
                try:
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:   # the client was killed: nobody reads this answer
                    pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.block_on_close = False
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def count(self) -> int:
        with self.lock:
            return len(self.asked)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def slow_server() -> Iterator[SlowServer]:
    server = SlowServer(delay_s=0.15)
    try:
        with allow_real_models():          # the resume runs in this process, to 127.0.0.1 only
            yield server
    finally:
        server.close()


@pytest.fixture
def sop_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name, value in KEY.items():
        monkeypatch.setenv(name, value)
    path = tmp_path / "fanout_crash.sop.yaml"
    path.write_text(SOP_TEXT)
    return path


def run_args(sop: Path, ws: Path, base: str) -> list[str]:
    return ["run", str(sop), "--idea", "a poem", "--model", MODEL, "--api-base", base,
            "--out", str(ws), "--format", "json"]


def journaled_answers(ws: Path) -> int:
    conn = sqlite3.connect(journal_path(ws))
    try:
        return int(conn.execute("SELECT count(*) FROM answers").fetchone()[0])
    finally:
        conn.close()


def resume(capsys: pytest.CaptureFixture[str], ws: Path, base: str) -> dict[str, Any]:
    resumed = here(capsys, "resume", str(ws), "--api-base", base, "--format", "json")
    assert resumed.returncode == 0, resumed.stderr
    result: dict[str, Any] = json.loads(resumed.stdout)
    assert result["status"] == "idle"
    return result


@pytest.mark.parametrize("answered", [1, 2, 4, 7])
def test_a_crash_mid_fan_out_repeats_only_the_calls_in_flight(
        slow_server: SlowServer, sop_file: Path, tmp_path: Path, forked_sopctl: ForkedSopctl,
        capsys: pytest.CaptureFixture[str], answered: int) -> None:
    """Killed (os._exit, as a kill -9) right after the fan-out's `answered`-th answer was
    journaled: every one of those is in the journal, and the resume asks exactly the others:
    the calls in flight at the crash (at most max_concurrency - 1 besides the one that just
    answered) again, and those never started."""
    ws = tmp_path / "ws"
    crashed = forked_sopctl(*run_args(sop_file, ws, slow_server.base),
                            env={**KEY, "SOPCTL_CRASH_AFTER_ANSWER": str(answered)})
    assert crashed.returncode == 137, crashed.stderr
    assert journaled_answers(ws) == answered         # durable as each arrived
    started = slow_server.count()
    in_flight = started - answered
    assert 0 <= in_flight <= CONCURRENCY - 1
    result = resume(capsys, ws, slow_server.base)
    asked_again = slow_server.count() - started
    assert asked_again == ITEMS - answered           # nothing answered is asked again
    assert (result["llm_calls"], result["reused_calls"]) == (ITEMS - answered, answered)
    repeated = asked_again - (ITEMS - started)       # asked twice: in flight at the crash
    assert repeated == in_flight
    twice = [p for p in set(slow_server.asked) if slow_server.asked.count(p) == 2]
    assert len(twice) == in_flight and len(set(slow_server.asked)) == ITEMS
    assert journaled_answers(ws) == ITEMS


def test_a_real_sigkill_mid_fan_out_repeats_at_most_max_concurrency_calls(
        slow_server: SlowServer, sop_file: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A real SIGKILL of a `sopctl run` process once some answers of the fan-out are in the
    journal: the resume asks only what the journal lacks, and of those at most
    max_concurrency had been asked before (the calls in flight)."""
    ws = tmp_path / "ws"
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli",
                             *run_args(sop_file, ws, slow_server.base)], cwd=ROOT,
                            env=sopctl_env(KEY), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        _wait_for_answers(ws, 4, proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    kept = journaled_answers(ws)
    started = slow_server.count()
    assert 4 <= kept < ITEMS and started - kept <= CONCURRENCY
    result = resume(capsys, ws, slow_server.base)
    asked_again = slow_server.count() - started
    assert asked_again == ITEMS - kept
    assert result["llm_calls"] == ITEMS - kept and result["reused_calls"] == kept
    repeated = asked_again - (ITEMS - started)
    assert 0 <= repeated <= CONCURRENCY


def _wait_for_answers(ws: Path, n: int, proc: subprocess.Popen[bytes]) -> None:
    """Poll the journal (not the clock) until n answers are durable, or the run ended."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if journaled_answers(ws) >= n:
                return
        except sqlite3.Error:
            pass
        time.sleep(0.01)
    pytest.fail("the run never journaled enough answers to be killed mid-way")
