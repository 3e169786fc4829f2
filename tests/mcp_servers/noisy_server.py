"""An MCP stdio server that writes lines that are not JSON-RPC to its stdout before it serves
(a print left in, a library's banner): the client ignores them, and says so once."""

from __future__ import annotations

import sys

from flaky_server import server

if __name__ == "__main__":
    for number in range(400):
        print(f"garbage line {number}", flush=True)
    sys.stdout.flush()
    server.run()
