"""source -> schema -> spec -> checks -> graph: an immutable CompiledSop.

STUB — the checker work (issue 2) replaces the body of `compile_path` / `compile_text` with
the full pipeline; the signatures and `CompiledSop` fields stay as declared here because the
interpreter depends on them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from .errors import Diagnostic
from .outputs import output_schema
from .spec import Sop

__all__ = ["CompiledSop", "compile_path", "compile_text"]


@dataclass(frozen=True)
class CompiledSop:
    spec: Sop
    file: str                                   # path as given ("<string>" for text)
    source_hash: str                            # sha256 of the file's bytes
    output_schemas: Mapping[str, dict | None]   # action id -> JSON Schema (None: text/code)
    graph: Any = None                           # networkx.DiGraph (the watch graph)
    warnings: tuple[Diagnostic, ...] = field(default_factory=tuple)


def compile_text(text: str, file: str = "<string>") -> CompiledSop:
    from ruamel.yaml import YAML

    data = YAML(typ="safe", pure=True).load(text)
    spec = Sop.model_validate(data)
    schemas = {aid: output_schema(a.output) for aid, a in spec.actions.items()}
    return CompiledSop(
        spec=spec,
        file=file,
        source_hash=hashlib.sha256(text.encode()).hexdigest(),
        output_schemas=MappingProxyType(schemas),
    )


def compile_path(path: str | Path) -> CompiledSop:
    return compile_text(Path(path).read_text(encoding="utf-8"), str(path))
