"""A real Ray cluster started with `ray start` (a head node in its own environment, as an
operator starts one): a batch joined to it by address runs every row there with the driver's
settings (`SOPCTL_MODEL` reaches the workers through the runtime environment, though the
head's shell never had it), and its results equal a local batch's."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ROOT / "tests" / "sops" / "pipeline.sop.yaml"

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# Ray 2.5x+ asks for a token on `ray start` clusters unless told not to; the test's cluster is
# on loopback, for this test alone.
_NO_AUTH = {"RAY_AUTH_MODE": "disabled"}


@pytest.fixture()
def ray_head(tmp_path: Path) -> Iterator[str]:
    pytest.importorskip("ray")
    ray = Path(sys.executable).with_name("ray")
    if not ray.exists():
        pytest.skip("no `ray` command beside this Python")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOPCTL_")} | _NO_AUTH
    temp = Path("/tmp") / f"ray-test-{port}"   # Ray's socket paths must stay short
    # --block keeps the head's processes in one group of ours: stopping it stops this cluster
    # alone (`ray stop` would stop every Ray process on the machine)
    head = subprocess.Popen([str(ray), "start", "--head", "--block", f"--port={port}",
                             "--node-ip-address=127.0.0.1", "--num-cpus=2", "--include-dashboard=false",
                             "--disable-usage-stats", f"--temp-dir={temp}"], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        problem = ""
        for _ in range(90):
            if head.poll() is not None:
                pytest.skip(f"`ray start` failed here: {(head.stderr.read() if head.stderr else '')[-300:]}")
            try:
                ready = subprocess.run([str(ray), "status", f"--address=127.0.0.1:{port}"], env=env,
                                       capture_output=True, text=True, timeout=60)
            except subprocess.TimeoutExpired:
                problem = "`ray status` did not answer"
                continue
            if ready.returncode == 0:
                break
            problem = ready.stderr[-300:]
            time.sleep(2)
        else:
            pytest.skip(f"the Ray head did not come up: {problem}")
        yield f"127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(timeout=30)
        shutil.rmtree(temp, ignore_errors=True)


def _batch(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine.cli", "batch", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env})


def _results(out: Path) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text(encoding="utf-8").splitlines()]
    return [{k: v for k, v in line.items() if k != "run_id"} for line in lines]


def test_a_batch_on_a_started_cluster_gets_the_drivers_model_and_the_local_results(
        tmp_path: Path, ray_head: str) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"idea": i}) + "\n" for i in ("a", "b", "c")), encoding="utf-8")
    common = (str(PIPELINE), "--inputs", str(rows))
    driver = {"SOPCTL_MODEL": "fake", **_NO_AUTH}     # the model comes from the environment only
    on_cluster = _batch(*common, "--out", str(tmp_path / "cluster"), "--ray", ray_head, env=driver)
    assert on_cluster.returncode == 0, on_cluster.stderr[-2000:]
    local = _batch(*common, "--out", str(tmp_path / "local"), env=driver)
    assert local.returncode == 0, local.stderr[-2000:]
    assert _results(tmp_path / "cluster") == _results(tmp_path / "local")
    shown = subprocess.run([sys.executable, "-m", "engine.cli", "show", str(tmp_path / "cluster/rows/000001")],
                           cwd=ROOT, text=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "model fake" in shown.stdout.splitlines()[0]
