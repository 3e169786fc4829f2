"""Suite-wide setup: no test reaches a real model unless it says so with allow_real_models();
property tests run a profile sized for the fast suite; a SOP's own `pytest` runs start
without this environment's plugins; crash tests share one fork server."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

pytest_plugins = ["engine.testing"]

# 50 examples a property keeps the fast suite fast and still finds what shallow inputs break;
# SOPCTL_FUZZ_EXAMPLES=2000 makes a long fuzzing session of the same tests.
settings.register_profile("sopctl", max_examples=int(os.environ.get("SOPCTL_FUZZ_EXAMPLES", "50")),
                          deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("sopctl")


@pytest.fixture(scope="session", autouse=True)
def _plain_pytest_in_workspaces() -> Iterator[None]:
    """The test loop's RunTests runs `python -m pytest` on the tests a SOP wrote; without
    autoloading this environment's plugins (hypothesis, ...) it starts in 0.3 s, not 1.3 s,
    and those tests need none of them."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
        yield


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The on-disk compile cache in a folder of this session, not the user's ~/.cache: the
    suite exercises the cache (most files compile twice or more) without reading entries an
    older checkout wrote, or leaving its own behind."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SOPCTL_CACHE_DIR", str(tmp_path_factory.mktemp("sopctl-cache")))
        yield


@pytest.fixture(scope="session")
def forked_sopctl() -> Iterator[object]:
    """`sopctl` as real processes forked from one that imported it (see run_helpers.ForkedSopctl)."""
    from run_helpers import ForkedSopctl

    server = ForkedSopctl()
    try:
        yield server
    finally:
        server.close()
