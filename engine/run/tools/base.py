"""What every built-in toolset shares: the error a model reads, a command's outcome, and a
command as the loop offers it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["ToolError", "Outcome", "Tool"]


class ToolError(Exception):
    """A command that cannot do what was asked; the message is the model's to read."""


@dataclass
class Outcome:
    """What one command gave back: its output (for the model), whether it is an error, and
    the files it wrote (path -> content), which a resume reconciles like artifacts."""

    output: str
    error: bool = False
    files: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"output": self.output, "error": self.error, "files": self.files}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Outcome:
        return cls(str(data.get("output", "")), bool(data.get("error")), dict(data.get("files") or {}))


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
