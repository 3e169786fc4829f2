"""A Ray worker gets what a row needs of the driver's environment (a cluster started with
`ray start` has its own shell's): sopctl's settings, provider keys and endpoints, proxies."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from engine.batch import ray_backend


def test_the_workers_get_sopctls_settings_and_the_providers_keys() -> None:
    env = {"SOPCTL_MODEL": "openai/gpt-4o-mini", "OPENAI_API_KEY": "sk-x", "OPENAI_API_BASE": "http://h/v1",
           "MY_SERVICE_TOKEN": "t", "HTTPS_PROXY": "http://proxy:3128", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://o",
           "HOME": "/root", "PATH": "/bin", "TERM": "xterm", "EDITOR": "vi"}
    passed = ray_backend.worker_environment(env)
    assert passed == {k: v for k, v in env.items() if k not in ("HOME", "PATH", "TERM", "EDITOR")}


def test_the_cluster_is_joined_with_that_runtime_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    fake = types.SimpleNamespace(init=lambda **kwargs: seen.update(kwargs), remote=lambda fn: fn)
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setenv("SOPCTL_MODEL", "fake")
    ray_backend.ray_launcher(ctx=None, address=ray_backend.LOCAL)  # type: ignore[arg-type]
    assert seen["runtime_env"]["env_vars"]["SOPCTL_MODEL"] == "fake"

