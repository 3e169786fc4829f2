"""`--ray [ADDRESS]`: the rows of a batch as Ray tasks (the optional extra `ray`).

The driver (this process) keeps everything that is the batch's: reading the rows, the
budget, `results.jsonl`, progress. Each row runs as one Ray task, `execute_row` in a worker
process, which writes the row's workspace and journal under `--out` and returns its line.
So every worker must see `--out` at the same path (one machine, or a shared file system on
every node of a multi-machine cluster) and have sopctl and the SOP file at the same paths.

Without an address a local cluster is started for the batch (`ray.init()`); with one, the
existing cluster is joined (`host:port` of its head, or `ray://host:port` for Ray Client).
An address that cannot be reached is refused before any row starts.

The workers of a cluster started with `ray start` have that shell's environment, not the
driver's, so the driver hands them, through Ray's runtime environment, what a row needs of
its own: sopctl's settings (`SOPCTL_*`), the providers' keys and endpoints, proxies and the
OpenTelemetry settings (`worker_environment`). Ray keeps a runtime environment in its
cluster state: whoever can read a shared cluster's jobs can read those keys.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Mapping
from typing import Any

from engine.batch.rows import Row
from engine.batch.runner import Launcher, RowContext, execute_row
from engine.errors import UsageError, install_hint
from engine.load.secrets import is_secret_name

__all__ = ["LOCAL", "ray_launcher", "shutdown", "check_reachable", "worker_environment"]

LOCAL = "local"
"""`--ray` without an address: a local cluster for this batch."""

_CONNECT_TIMEOUT_S = 5.0


def _ray() -> Any:
    try:
        import ray  # an optional extra: imported only when --ray asks for it
    except ImportError:
        raise UsageError("--ray needs the optional extra 'ray', which is not installed",
                         f"install it with: {install_hint('ray')}") from None
    return ray


def check_reachable(address: str) -> None:
    """Refuse an address whose head does not accept a connection (Ray itself retries for
    minutes before it gives up)."""
    host_port = address.split("://", 1)[-1].rstrip("/")
    host, _, port_text = host_port.rpartition(":")
    if not host or not port_text.isdigit():
        raise UsageError(f"--ray {address}: expected HOST:PORT or ray://HOST:PORT")
    try:
        with socket.create_connection((host, int(port_text)), timeout=_CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise UsageError(f"cannot reach the Ray cluster at {address}: {exc.strerror or exc}",
                         "start it (`ray start --head`) or leave ADDRESS out for a local cluster") from None


_PASSED_PREFIXES = ("SOPCTL_", "LITELLM_", "OPENAI_", "AZURE_", "ANTHROPIC_", "GEMINI_", "GOOGLE_",
                    "VERTEX", "AWS_", "MISTRAL_", "GROQ_", "DEEPSEEK_", "TOGETHER", "FIREWORKS_", "COHERE_",
                    "OPENROUTER_", "OLLAMA_", "HF_", "HUGGINGFACE", "OTEL_")
_PASSED_NAMES = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
                 "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")


def worker_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The driver's variables a row needs on any worker (see the module docstring)."""
    env = os.environ if environ is None else environ
    return {name: value for name, value in env.items()
            if name.startswith(_PASSED_PREFIXES) or name in _PASSED_NAMES or is_secret_name(name)}


def ray_launcher(ctx: RowContext, address: str) -> Launcher:
    """A launcher that runs each row as a Ray task on the cluster at `address` (or a local one)."""
    ray = _ray()
    if address != LOCAL:
        check_reachable(address)
    try:
        runtime_env = {"env_vars": worker_environment()}
        if address == LOCAL:
            ray.init(include_dashboard=False, log_to_driver=False, ignore_reinit_error=True,
                     runtime_env=runtime_env)
        else:
            ray.init(address=address, log_to_driver=False, ignore_reinit_error=True, runtime_env=runtime_env)
    except Exception as exc:  # noqa: BLE001 - Ray raises many kinds; all mean "no cluster"
        raise UsageError(f"cannot start or join the Ray cluster ({address}): {exc}") from None
    task = ray.remote(_row_task)

    async def launch(row: Row, share: float | None) -> dict[str, Any] | None:
        return await task.remote(ctx, row, share)

    return launch


def _row_task(ctx: RowContext, row: Row, share: float | None) -> dict[str, Any] | None:
    """One row in a Ray worker: its own event loop, the SOP compiled once per worker."""
    return asyncio.run(execute_row(ctx, row, share))


def shutdown() -> None:
    ray = _ray()
    if ray.is_initialized():
        ray.shutdown()
