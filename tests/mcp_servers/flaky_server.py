"""An MCP stdio server for the tests: a tool that works, one that sleeps, one that kills the
server (as a crash mid-run would)."""

from __future__ import annotations

import os
import time

from mcp.server.mcpserver import MCPServer

server = MCPServer("flaky")


@server.tool()
def echo(text: str) -> str:
    """Say the text back."""
    return f"echo: {text}"


@server.tool()
def slow(seconds: float) -> str:
    """Sleep, then answer."""
    time.sleep(seconds)
    return "woke up"


@server.tool()
def die() -> str:
    """End the server's process at once."""
    os._exit(3)


if __name__ == "__main__":
    import sys

    if len(sys.argv) > 1:   # `flaky_server.py PORT`: streamable HTTP on 127.0.0.1:PORT/mcp
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
    else:
        server.run()
