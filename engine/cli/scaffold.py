"""`sopctl init`: a commented starter SOP from a template (engine/cli/init_templates/), with
the schema modeline pointing at this install's schema, checked before it is written."""

from __future__ import annotations

import os
import re
from pathlib import Path

from engine.errors import UsageError

__all__ = ["TEMPLATES", "init_sop"]

TEMPLATE_DIR = Path(__file__).resolve().parent / "init_templates"

TEMPLATES = {
    "chain": "a writer and a reviewer, one after the other",
    "company": "a product manager, an architect and an engineer (MetaGPT's SOP, cut down)",
    "team": "a leader who assigns work to tool-using members (MGX, cut down)",
    "review": "a model drafts, a person approves, edits or rejects",
}
"""Each template and what it makes (`sopctl init --help` lists them)."""

SCHEMA = Path(__file__).resolve().parent.parent / "load" / "sop.schema.json"


def init_sop(name: str, template: str, *, force: bool = False) -> Path:
    """Write `NAME.sop.yaml` (or NAME, when it ends so) from the template; its path."""
    path = Path(name if name.endswith(".sop.yaml") else f"{name}.sop.yaml")
    if template not in TEMPLATES:
        raise UsageError(f"--template: unknown template '{template}'", hint=f"one of {', '.join(TEMPLATES)}")
    if (path.exists() or path.is_symlink()) and not force:
        raise UsageError(f"{path} exists; not overwritten", hint="choose another name, or pass --force")
    if not path.parent.is_dir():
        raise UsageError(f"{path.parent} is not a folder", hint="create it first, or choose another name")
    text = (TEMPLATE_DIR / f"{template}.sop.yaml").read_text(encoding="utf-8")
    text = (text.replace("__NAME__", sop_name(path)).replace("__FILE__", str(path))
            .replace("__SCHEMA__", _schema_ref(path)))
    path.write_text(text, encoding="utf-8")
    return path


def sop_name(path: Path) -> str:
    """The file's name as an SOP `name:` (lower case, digits, _ and -, a letter first)."""
    stem = path.name.removesuffix(".sop.yaml").lower()
    cleaned = re.sub(r"[^a-z0-9_-]+", "_", stem).strip("_-")
    return cleaned if re.match(r"^[a-z]", cleaned) else f"sop_{cleaned}".rstrip("_")


def _schema_ref(path: Path) -> str:
    """This install's schema, relative to the new file when it is on the same tree."""
    try:
        return os.path.relpath(SCHEMA, path.resolve().parent)
    except ValueError:   # another drive (Windows)
        return SCHEMA.as_uri()
