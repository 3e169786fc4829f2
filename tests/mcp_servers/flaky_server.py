"""An MCP stdio server for the tests: a tool that works (and says it only reads), one that
sleeps (no annotations), one that kills the server (as a crash mid-run would; it says it is
destructive)."""

from __future__ import annotations

import os
import time

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("flaky")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def echo(text: str) -> str:
    """Say the text back."""
    return f"echo: {text}"


@server.tool()
def slow(seconds: float) -> str:
    """Sleep, then answer."""
    time.sleep(seconds)
    return "woke up"


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True))
def die() -> str:
    """End the server's process at once."""
    os._exit(3)


if __name__ == "__main__":
    import sys

    if len(sys.argv) > 1:   # `flaky_server.py PORT`: streamable HTTP on 127.0.0.1:PORT/mcp
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
    else:
        server.run()
