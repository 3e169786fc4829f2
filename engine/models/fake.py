"""`fake`: a deterministic offline model for tests, dry runs and benchmarks.

It answers with TEXT, the way a real model does, and the gateway parses and validates that
text like any other answer, so a run on `fake` exercises the whole pipeline. It is never
chosen implicitly (only `--model fake`, `SOPCTL_MODEL=fake` or a file's `llm.model`).

- `json`: a small instance of the action's schema: each list with one element (or its
  `minItems`; a list of ids, `*_ids`, none), each enum its first value, bools false, numbers 0 (or their minimum), and
  short strings derived from the key ("Product Goals item", "main.py" for files,
  "project_name" for names); a table (a list of lists of strings) whose instruction shows
  a row as `[file, contents, ...]` gets rows of one cell per named column, each derived from
  the column's name (so `[file, interface]` rows start with "main.py", the fake's file, and
  a template selecting rows by file finds them). Written as JSON, as `## Key` sections for `format: markdown`,
  wrapped in `[CONTENT]`/`[/CONTENT]` lines for `format: content`, or as `<Key>value</Key>`
  tags for `format: xml`.
- `text`: a short sentence naming the action. `code`: a fenced block holding a minimal
  valid program in the language (Python: a small module that compiles).
- `choice`: `previous_choice + 1` while it is a valid state, then -1 (react runs the
  actions in order, then stops).
- a tool loop's step: its first step calls the first command the action offers (args: a
  small instance of its schema), every later step calls `end` with an instance of the
  output, so a tool-using action on `fake` runs one tool, then finishes. An argument with
  several allowed values, such as whom `team.publish` addresses, takes them in turn, one per
  turn of a leader whose turns alternate with the addressee's (rounds 1, 3, 5, ...); past the
  last one the first step is `end`, so a TeamLeader on `fake` has each member work once and
  the run ends idle.

The same request always gets the same answer. `SOPCTL_FAKE_LATENCY_MS` adds a fixed delay
to every answer (for benchmarks of concurrency). Tokens are estimated as characters / 4;
the cost is always 0.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from typing import Any

from engine.errors import LLMError
from engine.load import patterns
from engine.models.pattern_text import text_matching
from engine.models.types import FREE, CallSpec, ModelAnswer, ModelRequest, Price

__all__ = ["FakeModel", "instance", "answer_text", "latency_s", "LATENCY_ENV"]


LATENCY_ENV = "SOPCTL_FAKE_LATENCY_MS"


_MAX_DEPTH = 12


class FakeModel:
    """The `fake` provider: no network, no key, no cost, same answer for the same request."""

    def supports_schema(self, model: str) -> bool:
        """False: the schema goes into the prompt, so the fake exercises the prompt parsers."""
        return False

    def price(self, model: str) -> Price:
        return FREE

    async def complete(self, request: ModelRequest) -> ModelAnswer:
        delay = latency_s()
        if delay > 0:
            await asyncio.sleep(delay)
        text = answer_text(request.spec, schema_mode=request.response_format is not None)
        prompt_chars = sum(len(m.get("content", "")) for m in request.messages)
        return ModelAnswer(text=text, prompt_tokens=prompt_chars // 4,
                           completion_tokens=len(text) // 4, cost_usd=0.0,
                           finish_reason="stop")


def latency_s() -> float:
    """`SOPCTL_FAKE_LATENCY_MS` in seconds (0 when unset); a bad value is a clear error."""
    raw = os.environ.get(LATENCY_ENV, "").strip()
    if not raw:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise LLMError(f"{LATENCY_ENV} must be a number of milliseconds >= 0, got '{raw}'")
    return value / 1000.0


def answer_text(spec: CallSpec, schema_mode: bool = False) -> str:
    """The fake's answer to `spec`, as the text a model would write."""
    if spec.kind == "choice":
        nxt = spec.previous_choice + 1
        return str(nxt if 0 <= nxt < spec.n_choices else -1)
    if spec.kind == "text":
        return f"This is the fake model's answer for {spec.action}: done as asked."
    if spec.kind == "code":
        lang = (spec.code_lang or "text").lower()
        return f"```{lang}\n{_program(lang, spec.action)}```\n"
    if spec.tool_step >= 0 and spec.commands:
        return json.dumps(_tool_step(spec), ensure_ascii=False)
    value = instance(spec.schema or {"type": "object"})
    if schema_mode or not isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    if spec.format == "markdown":
        return "\n".join(f"## {key}\n{_field_text(item)}\n" for key, item in value.items())
    if spec.format == "xml":
        return "\n".join(f"<{key}>{_field_text(item)}</{key}>" for key, item in value.items())
    if spec.format == "content":
        return f"[CONTENT]\n{json.dumps(value, ensure_ascii=False)}\n[/CONTENT]"
    return json.dumps(value, ensure_ascii=False)


def _field_text(item: Any) -> str:
    """A field's value as a section or a tag holds it: text as it is, anything else as JSON."""
    return item if isinstance(item, str) else json.dumps(item, ensure_ascii=False)


def _tool_step(spec: CallSpec) -> dict[str, Any]:
    """One command: the first tool on the first step, then `end` (see the module docstring)."""
    tools = [(name, args) for name, args in spec.commands if name != "end"]
    ends = [(name, args) for name, args in spec.commands if name == "end"]
    if spec.tool_step == 0 and tools:
        name, schema = tools[0]
        args = _by_turn(schema, instance(schema) or {}, spec.round)
        if args is not None:
            return _step(spec, name, args)
    name, schema = (ends or tools)[0]
    return _step(spec, name, instance(schema) or {})


def _step(spec: CallSpec, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"thought": f"The fake model's step {spec.tool_step + 1} of {spec.action}.",
            "commands": [{"command_name": name, "args": args}]}


def _by_turn(schema: Any, value: dict[str, Any], round_: int) -> dict[str, Any] | None:
    """A choice among several (an enum argument: whom `team.publish` addresses) takes the
    options in turn, one per leader's turn (rounds 1, 3, 5, ...: each followed by the
    addressee's); None past the last option (see the module docstring)."""
    turn = max(round_ - 1, 0) // 2
    properties = schema.get("properties", {}) if isinstance(schema, dict) else {}
    for key, sub in properties.items():
        options = sub.get("enum") if isinstance(sub, dict) else None
        if key in value and options and len(options) > 1:
            if turn >= len(options):
                return None
            value[key] = options[turn]
    return value


# --------------------------------------------------------------------------- schema instances


def instance(schema: Any, key: str = "", depth: int = 0) -> Any:
    """A small, plausible, deterministic value that validates against `schema`."""
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return None
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for combinator in ("anyOf", "oneOf"):
        if schema.get(combinator):
            return instance(_described(_preferred(schema[combinator]), schema), key, depth + 1)
    if schema.get("allOf"):
        merged: dict[str, Any] = {}
        for part in schema["allOf"]:
            merged.update(part)
        return instance(merged, key, depth + 1)
    return _BUILDERS.get(_type_of(schema), _null)(schema, key, depth)


def _preferred(options: list[Any]) -> Any:
    """The first option that is not `null` (an optional field gets a value)."""
    for option in options:
        if isinstance(option, dict) and option.get("type") != "null":
            return option
    return options[0]


def _described(option: Any, schema: dict[str, Any]) -> Any:
    """An `optional[...]` node's instruction sits beside its `anyOf`: the option keeps it."""
    if isinstance(option, dict) and "description" in schema and "description" not in option:
        return {**option, "description": schema["description"]}
    return option


def _type_of(schema: dict[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), kind[0] if kind else None)
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    return kind


def _null(schema: dict[str, Any], key: str, depth: int) -> Any:
    return None


def _boolean(schema: dict[str, Any], key: str, depth: int) -> bool:
    return False


def _number(schema: dict[str, Any], key: str, depth: int) -> int | float:
    integer = _type_of(schema) == "integer"
    value: float = 0
    if "minimum" in schema and schema["minimum"] > value:
        value = schema["minimum"]
    if "exclusiveMinimum" in schema and schema["exclusiveMinimum"] >= value:
        value = schema["exclusiveMinimum"] + 1
    if "maximum" in schema and schema["maximum"] < value:
        value = schema["maximum"]
    if "exclusiveMaximum" in schema and schema["exclusiveMaximum"] <= value:
        value = schema["exclusiveMaximum"] - 1
    return int(value) if integer else float(value)


def _string(schema: dict[str, Any], key: str, depth: int, index: int | None = None) -> str:
    text = _plausible(key, index)
    if "pattern" in schema:
        text = _matching(schema["pattern"], text, index)
    low, high = schema.get("minLength", 0), schema.get("maxLength")
    if len(text) < low:
        text = text.ljust(low, "x")
    if high is not None:
        text = text[:high]
    return text


_PATTERN_CANDIDATES = ("main.py", "main", "item", "x", "1", "a.txt", "example")


def _matching(pattern: str, text: str, index: int | None) -> str:
    """The plausible text if it matches `pattern`, else the first stock string that does
    (a file name for a file pattern...), else one made from the pattern itself; the text
    itself when none does: the gateway then reports the answer as invalid, naming the pattern."""
    suffix = f"_{index + 1}" if index else ""
    for candidate in (text, *(c.replace(".", suffix + ".", 1) if "." in c else c + suffix
                              for c in _PATTERN_CANDIDATES), text_matching(pattern, index or 0) or text):
        try:
            if patterns.search(pattern, candidate):
                return candidate
        except patterns.PatternError:
            return text
    return text


def _plausible(key: str, index: int | None) -> str:
    """A string that reads like the key's content: files, names, languages, else `Key item`."""
    low = key.lower()
    nth = "" if not index else f" {index + 1}"
    if "file" in low or (index is not None and "list" in low):
        return "main.py" if not index else f"module_{index + 1}.py"
    if low == "id" or low.endswith(("_id", " id")):
        return str((index or 0) + 1)
    if "name" in low:
        return _snake(key) + (f"_{index + 1}" if index else "")
    if "language" in low:
        return "Python" if "program" in low else "en_us"
    if low == "code" and index is None:   # a notebook cell: code that runs
        return "print('Example code')"
    if index is not None:
        return f"{key or 'List'} item{nth}"
    return f"Example {low}" if key else "Example text"


def _snake(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_") or "name"


def _array(schema: dict[str, Any], key: str, depth: int) -> list[Any]:
    items = schema.get("items", {})
    # a list of references (a task's dependent_task_ids) is left as empty as it may be: an
    # invented id would name nothing (every fake plan warned of an unknown dependency)
    count = max(schema.get("minItems", 0 if key.lower().endswith("_ids") else 1), 0)
    if "maxItems" in schema:
        count = min(count, schema["maxItems"])
    if _plain_string(items):
        return [_string(items, key, depth + 1, index=i) for i in range(count)]
    columns = _columns(schema, items)
    if columns:
        return [[_string(items["items"], name, depth + 2) for name in columns] for _ in range(count)]
    return [instance(items, key, depth + 1) for _ in range(count)]


def _plain_string(schema: Any) -> bool:
    """A free string: no enum, const or combinator choosing it."""
    return isinstance(schema, dict) and _type_of(schema) == "string" and not schema.get("enum") \
        and "const" not in schema and not any(k in schema for k in ("anyOf", "oneOf", "allOf"))


_ROW = re.compile(r"\[([^\[\]]+)\]")


def _columns(schema: dict[str, Any], items: Any) -> list[str]:
    """A table's column names, when its instruction shows a row (`[file, contents, ...]`)
    and its rows are lists of free strings that may have that many cells; else none."""
    match = _ROW.search(str(schema.get("description", "")))
    if not match or not isinstance(items, dict) or _type_of(items) != "array" \
            or not _plain_string(items.get("items")):
        return []
    names = [name.strip() for name in match.group(1).split(",")]
    names = [name for name in names if name.strip(".… ")]       # `...`: more of the same
    fits = items.get("minItems", 0) <= len(names) <= items.get("maxItems", len(names))
    return names if len(names) >= 2 and fits and all(len(name) <= 40 for name in names) else []


def _object(schema: dict[str, Any], key: str, depth: int) -> dict[str, Any]:
    props = schema.get("properties") or {}
    value = {name: instance(sub, name, depth + 1) for name, sub in props.items()}
    extra = schema.get("additionalProperties")
    if not props and isinstance(extra, dict):
        value[_snake(key or "entry") + "_key"] = instance(extra, key, depth + 1)
    return value


_BUILDERS = {"object": _object, "array": _array, "string": _string, "integer": _number,
             "number": _number, "boolean": _boolean, "null": _null}


# --------------------------------------------------------------------------- minimal programs

_C_LIKE = "int main(void) {\n    return 0;\n}\n"


_PROGRAMS = {
    "c": _C_LIKE,
    "cpp": "int main() {\n    return 0;\n}\n",
    "c++": "int main() {\n    return 0;\n}\n",
    "go": "package main\n\nfunc main() {\n}\n",
    "rust": "fn main() {\n}\n",
    "java": "public class Main {\n    public static void main(String[] args) {\n    }\n}\n",
    "javascript": "console.log(\"ok\");\n",
    "js": "console.log(\"ok\");\n",
    "typescript": "console.log(\"ok\");\n",
    "ts": "console.log(\"ok\");\n",
    "bash": "#!/usr/bin/env bash\necho ok\n",
    "sh": "#!/bin/sh\necho ok\n",
    "json": "{}\n",
    "html": "<!DOCTYPE html>\n<html><head><title>ok</title></head><body></body></html>\n",
}


_COMMENT = {"sql": "--", "lua": "--", "haskell": "--", "css": "/*", "xml": "<!--"}


def _program(lang: str, action: str) -> str:
    action = re.sub(r"\W", "_", action)
    if lang in ("python", "py", "python3"):
        return _python(action)
    if lang in _PROGRAMS:
        return _PROGRAMS[lang]
    mark = _COMMENT.get(lang, "#")
    closing = {"/*": " */", "<!--": " -->"}.get(mark, "")
    return f"{mark} Placeholder written by the fake model for {action}.{closing}\n"


def _python(action: str) -> str:
    return (
        f'"""Placeholder module written by the fake model for {action}."""\n\n\n'
        "def main() -> None:\n"
        f'    """Print a greeting so the module does something observable."""\n'
        f'    print("hello from {action}")\n\n\n'
        'if __name__ == "__main__":\n'
        "    main()\n"
    )
