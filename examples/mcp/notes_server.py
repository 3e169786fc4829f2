"""A small MCP server (stdio) over a folder of text notes: `search` and `read`.

Written with the official `mcp` SDK's MCPServer (FastMCP's name since mcp 2), for
examples/researcher.sop.yaml; the folder is the first argument (default: ./notes).

    python notes_server.py path/to/notes
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

NOTES = Path(sys.argv[1] if len(sys.argv) > 1 else "notes").resolve()
MAX_HITS = 5

server = MCPServer("notes")


def _notes() -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(NOTES.glob("*.md"))}


@server.tool()
def search(query: str) -> str:
    """Find the notes that mention the query's words, best first: one line per note, with
    its name and first line."""
    words = {w for w in re.findall(r"\w+", query.lower()) if len(w) > 2}
    scored = []
    for name, text in _notes().items():
        score = sum(text.lower().count(w) for w in words)
        if score:
            scored.append((-score, name, text.splitlines()[0] if text else ""))
    hits = sorted(scored)[:MAX_HITS]
    return "\n".join(f"{name}: {first}" for _, name, first in hits) or "no note matches"


@server.tool()
def read(name: str) -> str:
    """The whole text of one note, by the name `search` gave."""
    notes = _notes()
    if name not in notes:
        raise ToolError(f"no note {name!r}; the notes are: {', '.join(notes)}")
    return notes[name]


if __name__ == "__main__":
    server.run()
