"""sopctl's traces in a real receiver, Arize Phoenix: scripts/phoenix_check.py starts it, runs
the MGX team on `fake` exporting over OTLP/HTTP and OTLP/gRPC with content capture, and
checks the span tree and its token counts through Phoenix's REST API.

Phoenix is heavy and no dependency of sopctl: it lives in its own virtual environment
(docs/tracing.md has the recipe). The test runs where `SOPCTL_PHOENIX` names its `phoenix`
executable, or one is on PATH, and is skipped elsewhere."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from run_helpers import ROOT

PHOENIX = os.environ.get("SOPCTL_PHOENIX") or shutil.which("phoenix")

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(PHOENIX is None, reason="no Phoenix here (pip install arize-phoenix into "
                                 "its own venv and set SOPCTL_PHOENIX to its bin/phoenix)")]


def test_phoenix_receives_the_span_tree_with_its_tokens_and_content() -> None:
    assert PHOENIX is not None
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "phoenix_check.py"), "--phoenix", PHOENIX],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "all checks passed" in done.stdout
    for protocol in ("http/protobuf", "grpc"):
        assert f"{protocol}: project sopctl-" in done.stdout
    assert "invoke_agent TeamLeader  [AGENT]" in done.stdout and "execute_tool editor.write  [TOOL]" in done.stdout
