"""Inputs of `type: file`: a file, binary or not, copied into the workspace when the run
starts; the input's value is then its workspace path (`inputs/<key>/<name>`), which an exec
command can be given (MetaGPT's invoice OCR assistant reads a PDF or an image).

The user's file (`--input KEY=PATH` or `KEY=@PATH`) is the user's to name; a default, written
in a shared SOP file, is a path inside the SOP's own folder (no `..`, no symlink out). A value
that already names the copy (a resume, a replay) is kept as it is."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

from engine.compile.compiler import CompiledSop
from engine.errors import UsageError
from engine.load.files import FileRefused, read_bounded
from engine.run.workspace import Workspace, WorkspaceError
from engine.templates.filters import refusal

__all__ = ["MAX_INPUT_FILE_BYTES", "copy_input_files"]


MAX_INPUT_FILE_BYTES = 20 * 2**20
"""The largest file an input of type file copies into the workspace."""


def copy_input_files(compiled: CompiledSop, inputs: dict[str, Any], workspace: Workspace) -> dict[str, Any]:
    """`inputs` with every file input copied into the workspace and set to its path there (a
    value equal to the input's default is looked up beside the SOP, any other from the
    current folder)."""
    values = dict(inputs)
    for key, spec in compiled.spec.inputs.items():
        value = values.get(key)
        if spec.type != "file" or not isinstance(value, str) or not value:
            continue
        value = value.removeprefix("@")
        copy = f"inputs/{key}/"
        if value.startswith(copy) and (workspace.root / value).is_file():
            values[key] = value   # the run's own copy: a resume or a replay
            continue
        source = _beside_sop(compiled, key, value) if value == spec.default else Path(value)
        try:
            data = read_bounded(source, MAX_INPUT_FILE_BYTES)
        except FileRefused as exc:
            raise UsageError(f"input '{key}' ({value}): {exc.message}", exc.hint) from None
        name = PurePosixPath(source.name).name or "file"
        try:
            workspace.write(copy + name, data)
        except WorkspaceError as exc:
            raise UsageError(f"input '{key}': {exc.message}") from None
        values[key] = copy + name
    return values


def _beside_sop(compiled: CompiledSop, key: str, rel: str) -> Path:
    problem = refusal(rel)
    if problem or compiled.file.startswith("<"):
        raise UsageError(f"input '{key}': its default must be a file beside the SOP: "
                         f"{problem or 'this SOP was given as text'}", hint=f"pass --input {key}=PATH")
    folder = Path(compiled.file).resolve().parent
    path = (folder / rel).resolve()
    if not path.is_relative_to(folder):
        raise UsageError(f"input '{key}': its default leaves the SOP's folder through a symlink")
    return path
