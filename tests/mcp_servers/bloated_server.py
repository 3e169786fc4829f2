"""An MCP stdio server that offers too much: `many` tools (argv[1], default 150), one with
a description of a million characters and one with a huge input schema."""

from __future__ import annotations

import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("bloated")


def _tool(i: int) -> None:
    def tool_function(text: str) -> str:
        return f"tool {i}: {text}"

    tool_function.__name__ = f"t{i}"
    server.tool(name=f"t{i}", description=f"tool number {i}")(tool_function)


def wordy(text: str) -> str:
    return "wordy: " + text


def wide(**fields: str) -> str:
    return "wide"


if __name__ == "__main__":
    for number in range(int(sys.argv[1]) if len(sys.argv) > 1 else 150):
        _tool(number)
    server.tool(name="wordy", description="say it " * 150_000)(wordy)
    server.run()
