"""What every built-in toolset shares: the error a model reads, a command's outcome, and a
command as the loop offers it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["ToolError", "Outcome", "Tool", "MAX_OUTPUT_CHARS"]


MAX_OUTPUT_CHARS = 8000
"""A command's output as the model sees it (and the journal keeps it); the loop cuts what
passes it, and a toolset that can say how to see the rest (the editor) shortens its own first."""


class ToolError(Exception):
    """A command that cannot do what was asked; the message is the model's to read."""


@dataclass
class Outcome:
    """What one command gave back: its output (for the model), whether it is an error, and
    the files it wrote (path -> content), which a resume reconciles like artifacts."""

    output: str
    error: bool = False
    files: dict[str, str] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    """What the command left in its toolset's own state (the editor's window on a file), so
    that a resumed loop taking this outcome from the journal sets that state again."""

    def to_json(self) -> dict[str, Any]:
        data = {"output": self.output, "error": self.error, "files": self.files}
        return {**data, "state": self.state} if self.state else data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Outcome:
        return cls(str(data.get("output", "")), bool(data.get("error")), dict(data.get("files") or {}),
                   dict(data.get("state") or {}))


@dataclass(frozen=True)
class Tool:
    """A command the model may give: its JSON Schema of args, and how the loop treats it."""

    name: str
    description: str
    args: dict[str, Any]
    exclusive: bool = False
    readonly: bool = False
    journaled: bool = True
    """Its result is journaled and reused (it acts outside the loop); else it runs again."""
    server: str | None = None
    """An MCP server's tool (its name on the server is `name` after `<server>.`)."""
    moves: bool = False
    """It moves a view an earlier command left (a window, a page): repeating it is progress."""
