"""The JSON Schema of SOP files, generated from the models: `python -m engine.load.schema_gen`.

The pydantic models (engine/load/spec.py) are the language; this writes what is derived
from them: `engine/load/sop.schema.json` (package data: what `sopctl schema` prints and
what `validate` explains refusals with), its copy `schemas/sop.schema.json` (editors,
through `# yaml-language-server: $schema=`), the key reference `docs/language.md` and the
"keys at a glance" table of `docs/writing.md`.
`--check` writes nothing and exits 1 when a committed copy differs (a test runs it).

pydantic's output is shaped where editors and our diagnostics need it: no titles on
properties (a hover names the model: Role, Action (kind llm), Output node), `null` only
where a file may write it, `propertyNames` for keyed maps, defaults of default factories,
and descriptions on one line.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import PydanticUndefined, core_schema

from engine.load.spec import Sop

__all__ = ["ROOT", "TARGETS", "generate", "main", "schema_document", "schema_text"]

DIALECT = "https://json-schema.org/draft/2020-12/schema"

ROOT = Path(__file__).resolve().parents[2]
"""The checkout: the schema's copies are written relative to it."""

SCHEMA_FILES = ("engine/load/sop.schema.json", "schemas/sop.schema.json")
REFERENCE_FILE = "docs/language.md"
GLANCE_FILE = "docs/writing.md"
"""The how-to page whose "keys at a glance" table (between its markers) is generated."""
TARGETS = (*SCHEMA_FILES, REFERENCE_FILE, GLANCE_FILE)


class SopJsonSchema(GenerateJsonSchema):
    """pydantic's generator, shaped for editors (YAML language server) and engine/load/schema.py."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False     # "Max Rounds" on every key: noise over the description

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        """Defaults from factories too (`send_to: [<all>]`), when they are plain values."""
        if "default_factory" in schema and not schema.get("default_factory_takes_data"):
            value = schema["default_factory"]()  # type: ignore[call-arg]
            if isinstance(value, (list, dict, str, int, float, bool)):
                schema = {**schema, "default": value}
                schema.pop("default_factory")   # type: ignore[misc]
        json_schema = super().default_schema(schema)
        if json_schema.get("default", PydanticUndefined) is None:
            json_schema.pop("default")          # `null` is no value worth offering
        return json_schema

    def dict_schema(self, schema: core_schema.DictSchema) -> JsonSchemaValue:
        """A map whose keys have a pattern: `propertyNames`, so that a bad key is an error
        located at the key (SOP106), not a key that no pattern matches and so goes unchecked."""
        json_schema = super().dict_schema(schema)
        patterns = json_schema.pop("patternProperties", None)
        if patterns:
            [(pattern, values)] = patterns.items()
            json_schema["propertyNames"] = {**json_schema.get("propertyNames", {}), "pattern": pattern}
            json_schema["additionalProperties"] = values
        values = json_schema.get("additionalProperties")
        title = self.generate_inner(schema["values_schema"]).get("title") if "values_schema" in schema else None
        if isinstance(values, dict) and title and "$ref" not in values:
            values["title"] = title    # pydantic drops it; the action union's ("Action") is what a hover shows
        return json_schema

    def union_schema(self, schema: core_schema.UnionSchema) -> JsonSchemaValue:
        """A union of bare types (`str | int | float | bool`) as one `type` list."""
        json_schema = super().union_schema(schema)
        branches = json_schema.get("anyOf", [])
        if branches and all(set(b) == {"type"} and isinstance(b["type"], str) for b in branches):
            rest = {k: v for k, v in json_schema.items() if k != "anyOf"}
            return {"type": [b["type"] for b in branches], **rest}
        return json_schema

    def nullable_schema(self, schema: core_schema.NullableSchema) -> JsonSchemaValue:
        """`X | None` as `type: [X, "null"]` (enums get a null member): one branch, so an error
        says "expected a string" rather than "expected one of the allowed forms"."""
        json_schema = super().nullable_schema(schema)
        return _type_or_null(json_schema)


def _type_or_null(json_schema: JsonSchemaValue) -> JsonSchemaValue:
    branches = json_schema.get("anyOf")
    if not branches or len(branches) != 2 or {"type": "null"} not in branches:
        return json_schema
    inner = dict(next(b for b in branches if b != {"type": "null"}))
    if not isinstance(inner.get("type"), str) or "$ref" in inner or "anyOf" in inner:
        return json_schema
    inner["type"] = [inner["type"], "null"]
    if "const" in inner:
        inner["enum"] = [inner.pop("const")]
    if "enum" in inner:
        inner["enum"] = [*inner["enum"], None]
    rest = {k: v for k, v in json_schema.items() if k != "anyOf"}
    return {**inner, **rest}


def schema_document() -> dict[str, Any]:
    """The schema of an SOP file, as written to sop.schema.json."""
    document = Sop.model_json_schema(by_alias=True, schema_generator=SopJsonSchema)
    document = _polish(document)
    first = {key: document[key] for key in _TOP_ORDER if key in document}
    return {"$schema": DIALECT, **first, **document}   # what the file is first, its definitions last


_TOP_ORDER = ("title", "description", "type", "additionalProperties", "required", "properties")


def _polish(node: Any) -> Any:
    """Descriptions on one line, enum descriptions checked against their enum, `kind` first."""
    if isinstance(node, list):
        return [_polish(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: _polish(value) for key, value in node.items()}
    if isinstance(node.get("description"), str):
        node["description"] = _one_line(node["description"])
    values = node.pop("x-enum-values", None)
    if values is not None and values != [v for v in node.get("enum", []) if v is not None]:
        raise ValueError(f"enum descriptions name {values}, the enum is {node.get('enum')}")
    properties = node.get("properties")
    if isinstance(properties, dict) and "kind" in properties:
        node["properties"] = {"kind": properties["kind"], **properties}
    return node


def _one_line(text: str) -> str:
    """A docstring's lines joined (editors would make every line break a paragraph)."""
    return re.sub(r"\s*\n\s*", " ", text.strip())


def schema_text() -> str:
    return json.dumps(schema_document(), indent=2, ensure_ascii=False) + "\n"


def generate(root: Path = ROOT) -> dict[str, str]:
    """Every generated file's path (relative to the checkout) and its text; the how-to page's
    is its own text with the "keys at a glance" table made anew."""
    from engine.load.reference import key_examples, reference_text, with_glance  # only the generator writes the docs

    text, document = schema_text(), schema_document()
    page = with_glance((root / GLANCE_FILE).read_text(encoding="utf-8"), document)
    shipped = [ROOT / "sops/software_company.sop.yaml", *sorted((ROOT / "sops").glob("*.sop.yaml")),
               *sorted((ROOT / "examples").glob("*.sop.yaml"))]   # the classic SOP's uses first
    reference = reference_text(document, key_examples(shipped))   # examples from this checkout's files
    return {**{path: text for path in SCHEMA_FILES}, REFERENCE_FILE: reference, GLANCE_FILE: page}


def stale(root: Path = ROOT) -> list[str]:
    """The generated files whose committed text differs from what the models give."""
    found = []
    for path, text in generate(root).items():
        target = root / path
        if not target.is_file() or target.read_text(encoding="utf-8") != text:
            found.append(path)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.load.schema_gen", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a file is stale")
    args = parser.parse_args(argv)
    if args.check:
        outdated = stale()
        for path in outdated:
            print(f"{path} is stale: run python -m engine.load.schema_gen", file=sys.stderr)
        return 1 if outdated else 0
    for path, text in generate().items():
        (ROOT / path).parent.mkdir(parents=True, exist_ok=True)
        (ROOT / path).write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
