"""An MCP stdio server with a tool that starts a process in a session of its own (`setsid`),
which outlives the server unless the run reaps it."""

from __future__ import annotations

import subprocess
import sys

from flaky_server import server


@server.tool()
def spawn() -> str:
    """Start `sleep 300` in a new session; its pid."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return str(child.pid)


if __name__ == "__main__":
    server.run()
