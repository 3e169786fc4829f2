"""How the gateway asks a model for an answer, and how it reads the answer back.

Kept apart from the gateway so that the wording of our prompts and the tolerant parsers can be
read, tested and changed without touching transport, retries or the journal. Nothing here
calls a model or imports litellm.

Four kinds of answer (`CallSpec.kind`):

- `json`: an object that must validate against the action's JSON Schema. With a model that
  supports structured output the schema travels as `response_format` and the prompt only
  lists the fields; otherwise the prompt asks for JSON (`format: json`) or for `## Key`
  sections (`format: markdown`), for MetaGPT's `[CONTENT]{json}[/CONTENT]` raw fill
  (`format: content`) or for `<key>value</key>` tags (`format: xml`, values coerced to their
  types), and `read` parses each, tolerating code fences, leading prose, and a JSON object
  where sections or tags were asked (what a structured-output model writes). Validation is strict: an invalid answer raises
  `InvalidAnswer`, whose message is shown to the model when it is asked again.
- `text`: the answer, stripped; an empty answer is invalid.
- `code`: the first fenced code block (one left open at the end of a cut-off answer counts);
  an answer without one is invalid.
- `choice`: the first integer in the answer if it is a valid state, else -1. Never invalid.

A tool loop's step (a `json` call with `tool_step` or `commands` set, engine/run/toolloop.py)
also takes MetaGPT's own answer forms as they are, without a re-ask: RoleZero's (prose
thoughts, then a fenced ```json block holding an array of `{"command_name", "args"}`), a bare
array of commands, and one bare command object. Each is read as `{"thought": <the prose>,
"commands": [...]}` before the schema check (`command_step`).
"""

from __future__ import annotations

import json
import re
import threading
from functools import lru_cache
from typing import TYPE_CHECKING, Any
from collections.abc import Callable

from engine import diskcache
from engine.load import patterns
from engine.models.quick_check import compile_check

if TYPE_CHECKING:
    from engine.models.types import CallSpec

__all__ = ["InvalidAnswer", "MAX_ANSWER_CHARS", "cut_answer", "over_limit", "first_messages", "reask_messages", "response_format", "read", "command_step",
           "parse_json_object", "parse_markdown", "parse_xml", "field_list", "args_text", "extract_code", "parse_choice", "schema_errors"]


MAX_ECHO_CHARS = 6000
"""A previous answer shown back to the model in a re-ask is cut to this many characters."""


MAX_ANSWER_CHARS = 2_000_000
"""The longest answer accepted by default (`--max-answer-chars`). A longer one is cut to this
length before it is journaled (a hostile server's 50 MB answer would otherwise grow the
journal, the pool and every template that quotes it) and re-asked: the model is told the
limit. Room for the editor's largest write (1,000,000 bytes) in one tool step; a whole
program file is far less."""


_CUT_MARK = "\n[sopctl: the answer was cut here: it had {n:,} characters]"


def cut_answer(text: str, limit: int) -> str:
    """`text` as journaled and handed on: itself, or past `limit` characters its first
    `limit` and a mark. A cut answer is longer than `limit`, so `over_limit` still sees it
    when a resume reads it back from the journal."""
    return text if len(text) <= limit else text[:limit] + _CUT_MARK.format(n=len(text))


def over_limit(text: str, limit: int) -> str | None:
    """The re-ask's error for an answer longer than `limit` characters (None: within it)."""
    if len(text) <= limit:
        return None
    return (f"the answer is longer than the {limit:,} characters an answer may have (it was cut "
            "there); answer again, much shorter: only what the instructions ask for")


_MAX_ERRORS = 5


_SCHEMA_CACHE: dict[tuple[int, str], tuple[Any, Any]] = {}


_CODE_BLOCK = re.compile(r"```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)```", re.S)


_JSON_START = re.compile(r"[\[{]")


_OPEN_BLOCK = re.compile(r"```[ \t]*([\w+#.-]*)[^\n]*\n(.*)\Z", re.S)


_INTEGER = re.compile(r"-?\d+")


_CONTENT = re.compile(r"\[CONTENT\](.*?)(\[/CONTENT\]|$)", re.S)
"""MetaGPT's `[CONTENT]...[/CONTENT]` wrapper (the closing line may be missing)."""


_HEADING = re.compile(r"^[ \t]{0,3}#{1,4}[ \t]+(.+?)[ \t]*:?[ \t]*#*[ \t]*$", re.M)


_BULLET = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+(.*)$")


class InvalidAnswer(ValueError):
    """The model's answer cannot be accepted; the message says why, for the model to fix."""


MAX_ANSWER_DEPTH = 64
"""How deeply an answer's JSON may nest (an SOP file's own limit). Deeper is re-asked: a
value nested thousands deep would overflow the stack of whatever walks it next (the schema
check, the journal's encoder, a template), and no output schema needs it."""


def nesting_depth(value: Any, limit: int = MAX_ANSWER_DEPTH) -> int:
    """How deeply lists and objects nest in `value` (a scalar is 0), walked without recursion
    and given up at `limit + 1` (the caller only asks whether it is past the limit)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, (list, dict)):
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


# --------------------------------------------------------------------------- asking


def response_format(spec: CallSpec) -> dict[str, Any]:
    """The OpenAI-style `response_format` carrying the action's schema (structured output),
    without the nodes' `examples` (an annotation structured-output modes need not accept)."""
    schema = _per_schema(spec.schema or {}, "without examples", lambda: _without(spec.schema or {}, "examples"))
    return {
        "type": "json_schema",
        "json_schema": {"name": _schema_name(spec.action), "schema": schema, "strict": _strict_ok(schema)},
    }


FORMS = ("json_schema", "json_object", "none")
"""How a server may take the output schema, from the most to the least it does for us."""


def wire_format(rformat: dict[str, Any] | None, form: str | None) -> dict[str, Any] | None:
    """`response_format(spec)` as sent to a server that takes `form`: as is (`json_schema`,
    or None: as the provider says), JSON mode with the schema beside it (`json_object`: what
    llama.cpp's Python server and older vLLM read), or nothing (`none`: the prompt lists the
    fields). The request hash covers `rformat`, never this."""
    if rformat is None or form in (None, "json_schema") or rformat.get("type") != "json_schema":
        return rformat
    if form == "json_object":
        return {"type": "json_object", "schema": rformat["json_schema"]["schema"]}
    return None


def first_messages(spec: CallSpec, schema_mode: bool) -> list[dict[str, str]]:
    """System prompt (the role's prefix), the action's prompt with our answer instructions,
    then the call's earlier turns (a tool loop's steps), so that every request of a loop
    begins with the one before it, word for word (what providers cache)."""
    messages = [{"role": "system", "content": spec.system}] if spec.system else []
    tail = _instructions(spec, schema_mode, spec.prompt_schema)
    content = f"{spec.prompt.rstrip()}\n\n{tail}" if tail else spec.prompt
    turns = list(spec.turns)
    if turns and turns[0].get("role") == "user":   # no two user messages in a row
        content = f"{content.rstrip()}\n\n{turns.pop(0)['content']}"
    return [*messages, {"role": "user", "content": content}, *turns]


def reask_messages(
    messages: list[dict[str, str]], answer: str, error: str, spec: CallSpec, schema_mode: bool
) -> list[dict[str, str]]:
    """The conversation so far, the rejected answer, and a request to fix the named error."""
    shown = answer if len(answer) <= MAX_ECHO_CHARS else answer[:MAX_ECHO_CHARS] + "\n[... cut ...]"
    fix = (
        f"Your previous answer could not be accepted: {error}\n"
        "Answer again, completely, and fix this problem.\n\n" + _instructions(spec, schema_mode)
    )
    return [*messages, {"role": "assistant", "content": shown}, {"role": "user", "content": fix.rstrip()}]


def _instructions(spec: CallSpec, schema_mode: bool, schema: dict[str, Any] | None = None) -> str:
    if spec.kind == "json":
        return _json_instructions(spec, schema_mode, schema)
    if spec.kind == "code":
        lang = spec.code_lang or ""
        return f"## Answer format\nThe complete {lang or 'source'} code in one ```{lang} fenced block."
    if spec.kind == "choice":
        top = max(spec.n_choices - 1, 0)
        return (f"Answer with a single number: the stage to do next, from 0 to {top}, or -1 if "
                "the goal is reached and nothing is left to do. Write nothing else.")
    return ""


def _json_instructions(spec: CallSpec, schema_mode: bool, described: dict[str, Any] | None = None) -> str:
    schema = described or spec.schema or {}
    mode = "schema" if schema_mode else spec.format
    examples = shows_examples(spec.model)
    text: str = _per_schema(schema, f"instructions:{mode}:{examples}",
                            lambda: _build_json_instructions(schema, mode, examples))
    return text


def _command_names(schema: dict[str, Any]) -> list[str] | None:
    """The command names of a tool loop step's schema (engine.run.toolloop.step_schema: a
    thought and a list of commands, each a name and its args), else None."""
    props = schema.get("properties")
    if not isinstance(props, dict) or set(props) != {"thought", "commands"}:
        return None
    items = props["commands"].get("items") if isinstance(props["commands"], dict) else None
    command = items.get("properties") if isinstance(items, dict) else None
    if not isinstance(command, dict) or set(command) != {"command_name", "args"} \
            or not isinstance(command["command_name"], dict):
        return None
    names = command["command_name"].get("enum")
    return [str(name) for name in names] if isinstance(names, list) else None


def _step_instructions(names: list[str]) -> str:
    """A step's answer format: what its JSON Schema says (at least one command, each a name
    of the list with an object of args), in a quarter of the tokens, on every step's request."""
    return ("## Answer format\nAnswer with one JSON object and nothing else (no prose before or after):\n"
            '{"thought": "your reasoning (optional)", "commands": [{"command_name": "...", "args": {...}}]}\n'
            '"commands" holds at least one command; each "command_name" is one of ' + "|".join(names) +
            ', its "args" an object of the args the command takes.')


def shows_examples(model: str) -> bool:
    """Whether the field list shows each node's `example`: not to the embedded `local` model,
    whose 135M model copies an example instead of answering (the software company's
    SummarizeCode then failed its schema); to every other model."""
    return model.split("/", 1)[0] != "local"


def _per_schema(schema: dict[str, Any], purpose: str, build: Callable[[], Any]) -> Any:
    """Memoize work derived from an output schema (the same dict object for every call of
    an action). The entry keeps the schema alive, so an `id` is never confused with another's."""
    key = (id(schema), purpose)
    hit = _SCHEMA_CACHE.get(key)
    if hit is not None and hit[0] is schema:
        return hit[1]
    value = build()
    if len(_SCHEMA_CACHE) >= 1024:
        _SCHEMA_CACHE.clear()
    _SCHEMA_CACHE[key] = (schema, value)
    return value


def _build_json_instructions(schema: dict[str, Any], mode: str, examples: bool = False) -> str:
    names = _command_names(schema) if mode == "json" else None
    if names is not None:   # a tool loop's step: its shape in one line, not its JSON Schema
        return _step_instructions(names)
    fields = field_list(schema, examples)
    if mode == "schema":
        return f"## Answer format\nAnswer with one JSON object that fills these fields:\n{fields}"
    if mode == "markdown":
        return (
            "## Answer format\nWrite one section per field, in this order. Start each section "
            "with a line `## <field name>`, the name written exactly as below, then the value. "
            "Write text as plain text; write lists, numbers, booleans and objects as JSON, "
            'e.g. ["first", "second"]. Write nothing before the first section.\n'
            f"Fields:\n{fields}"
        )
    if mode == "xml":
        return (
            "## Answer format\nWrite each field between an opening and a closing tag named exactly "
            "as below, e.g. <Title>the value</Title>, in this order. Write text as plain text; "
            'write lists, numbers, booleans and objects as JSON, e.g. ["first", "second"]. '
            f"Write nothing outside the tags.\nFields:\n{fields}"
        )
    if _said_by_fields(schema):   # the field list says all the schema does: not twice
        rule = "It has exactly the fields below (no others), each of its type:\n"
    else:
        compact = json.dumps(_without_descriptions(schema), separators=(",", ":"), ensure_ascii=False)
        rule = f"It must validate against this JSON Schema:\n{compact}\nFields:\n"
    if mode == "content":
        return ("## Answer format\nAnswer with a line [CONTENT], then one JSON object, then a line "
                f"[/CONTENT], and nothing else. {rule}{fields}")
    return f"## Answer format\nAnswer with one JSON object and nothing else (no prose before or after). {rule}{fields}"


_FIELD_LIST_KEYWORDS = frozenset({"type", "properties", "required", "additionalProperties", "items", "anyOf",
                                  "enum", "description", "examples", "title"})
"""What an output schema may use for its field list to say all of it (`_field_lines`: each
field's type, list items, nesting, optional or not, allowed values)."""


def _said_by_fields(schema: Any) -> bool:
    """Whether `field_list(schema)` says everything `schema` asks: every object with fields
    closed (the prompt says "no others"; a map, `object of string`, is said as that), no
    keyword the list cannot say (a pattern, bounds, a format, a `$ref`). Else the prompt
    shows the JSON Schema too, so that nothing is left unsaid."""
    if not isinstance(schema, dict) or set(schema) - _FIELD_LIST_KEYWORDS:
        return False
    more = schema.get("additionalProperties")
    if schema.get("type") == "object" and (more is not False if schema.get("properties") else
                                           isinstance(more, dict) and not _said_by_fields(more)):
        return False      # fields and others besides; or a map whose values need the schema
    children = [*(schema.get("properties") or {}).values(), *schema.get("anyOf", [])]
    if "items" in schema:
        children.append(schema["items"])
    return all(_said_by_fields(child) for child in children)


def field_list(schema: dict[str, Any], examples: bool = False) -> str:
    """An output schema's fields as our prompts list them (`- "Key" (type): instruction`,
    with `examples`: then ` Example: value` from the node's `examples`)."""
    return "\n".join(_field_lines(schema, "", examples)) or "- (no fields)"


def _field_lines(schema: dict[str, Any], path: str, examples: bool = False) -> list[str]:
    """`- "Key" (type): instruction` for every property, nested ones as `Parent[].child`."""
    lines: list[str] = []
    required = set(schema.get("required", []))
    for key, sub in (schema.get("properties") or {}).items():
        name = f"{path}.{key}" if path else key
        note = "" if key in required else ", optional"
        desc = f": {sub['description']}" if sub.get("description") else ""
        if examples and sub.get("examples") and sub["examples"][0] != "":   # not `Example: ` (nothing)
            stop = ":" if not desc else "" if desc[-1] in ".!?:" else "."
            desc += f"{stop} Example: {_example_text(sub['examples'][0])}"
        lines.append(f'- "{name}" ({_type_name(sub)}{note}){desc}')
        obj, suffix = _object_of(sub)
        if obj is not None:
            lines.extend(_field_lines(obj, name + suffix, examples))
    return lines


_PLAIN_KEYWORDS = frozenset({"type", "description", "enum", "default", "minimum", "maximum", "minLength",
                             "maxLength", "pattern", "title", "items"})
"""What `args_text` says in words; an argument whose schema has any other keyword (nested
objects, anyOf, formats...) is shown as its JSON Schema, so that nothing is left unsaid."""

_PLAIN_OBJECT_KEYWORDS = frozenset({"type", "properties", "required", "additionalProperties", "description",
                                    "title", "$schema", "$id"})
"""The keywords of a command's whole args schema that its phrases say (or that say nothing to
a model: an MCP server's `$schema`); any other (anyOf across args, dependencies) shows it whole."""


def args_text(schema: dict[str, Any]) -> str:
    """A command's arguments, one short phrase each, as a tool list shows them:
    `path (string matching ^[^\\s]+$): a path relative to the workspace; line (integer, optional,
    at least 1)`. A tenth of the tokens of the JSON Schema on every request of a tool loop, with
    the same facts: type, optional or not, bounds, pattern, default, allowed values; an argument
    it cannot say in words is shown as its JSON Schema."""
    properties = schema.get("properties") or {}
    if not isinstance(properties, dict) or set(schema) - _PLAIN_OBJECT_KEYWORDS:
        return "(JSON Schema) " + json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
    required = set(schema.get("required") or ())
    return "; ".join(_arg_phrase(name, sub, name in required) for name, sub in properties.items()) or "none"


def _arg_phrase(name: str, sub: Any, required: bool) -> str:
    items = sub.get("items") if isinstance(sub, dict) else None
    if not isinstance(sub, dict) or set(sub) - _PLAIN_KEYWORDS or (
            items is not None and (not isinstance(items, dict) or set(items) - {"type", "enum"})):
        shown = json.dumps(sub, ensure_ascii=False, separators=(",", ":"))
        return f"{name} ({'' if required else 'optional, '}JSON Schema {shown})"
    notes = [_type_name(sub) + (f" matching {sub['pattern']}" if "pattern" in sub else "")]
    if not required:
        notes.append("optional")
    shortest = sub.get("minLength")
    if isinstance(shortest, int) and shortest > 0:
        notes.append("not empty" if shortest == 1 else f"at least {shortest} characters")
    for key, words in (("minimum", "at least {}"), ("maximum", "at most {}"), ("maxLength", "at most {} characters")):
        if key in sub:
            notes.append(words.format(sub[key]))
    if "default" in sub:
        notes.append("default " + json.dumps(sub["default"], ensure_ascii=False))
    desc = sub.get("description")
    return f"{name} ({', '.join(notes)})" + (f": {desc}" if desc else "")


def _example_text(example: Any) -> str:
    return example if isinstance(example, str) else json.dumps(example, ensure_ascii=False)


def _object_of(schema: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    if schema.get("properties"):
        return schema, ""
    items = schema.get("items")
    if isinstance(items, dict) and items.get("properties"):
        return items, "[]"
    return None, ""


def _type_name(schema: dict[str, Any]) -> str:
    """A short human reading of a schema: `list of string`, `one of a|b`, `string or null`."""
    if "enum" in schema:
        return "one of " + "|".join(str(v) for v in schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " or ".join(_type_name(s) for s in schema[key])
    kind = schema.get("type", "any")
    if kind == "array":
        return "list of " + _type_name(schema.get("items") or {})
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return "object of " + _type_name(schema["additionalProperties"])
    return kind if isinstance(kind, str) else " or ".join(kind)


def _without_descriptions(schema: Any) -> Any:
    """The schema as the prompt shows it: no descriptions and examples (the field list has them)."""
    return _without(_without(schema, "description"), "examples")


def _without(schema: Any, keyword: str, names: bool = False) -> Any:
    """The schema without `keyword` anywhere (`names`: a `properties` mapping, whose keys are
    the output's own, so that a key named `examples` stays)."""
    if isinstance(schema, dict):
        if names:
            return {k: _without(v, keyword) for k, v in schema.items()}
        return {k: _without(v, keyword, k == "properties") for k, v in schema.items() if k != keyword}
    if isinstance(schema, list):
        return [_without(v, keyword) for v in schema]
    return schema


def _schema_name(action: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", action)[:64] or "output"


def _strict_ok(schema: Any) -> bool:
    """OpenAI strict mode needs every object closed with all its properties required."""
    if isinstance(schema, list):
        return all(_strict_ok(s) for s in schema)
    if not isinstance(schema, dict):
        return True
    if schema.get("type") == "object":
        props = schema.get("properties") or {}
        if schema.get("additionalProperties") is not False or set(schema.get("required", [])) != set(props):
            return False
    children = [*(schema.get("properties") or {}).values(), *schema.get("anyOf", [])]
    if isinstance(schema.get("items"), dict):
        children.append(schema["items"])
    return all(_strict_ok(child) for child in children)


# --------------------------------------------------------------------------- reading


def read(spec: CallSpec, text: str) -> Any:
    """The accepted value of an answer, or InvalidAnswer saying what is wrong with it."""
    if spec.kind == "choice":
        return parse_choice(text, spec.n_choices)
    if spec.kind == "code":
        return extract_code(text)
    if spec.kind == "text":
        if not text.strip():
            raise InvalidAnswer("the answer is empty")
        return text.strip()
    schema = spec.schema or {}
    try:            # the C decoder raises RecursionError, not a decode error, past its depth
        value = command_step(text) if spec.tool_step >= 0 or spec.commands else None
        if value is None:
            value = _SECTION_PARSERS[spec.format](text, schema) if spec.format in _SECTION_PARSERS \
                else parse_json_object(text)
    except RecursionError:
        value = None
    if value is None or nesting_depth(value) > MAX_ANSWER_DEPTH:
        raise InvalidAnswer(f"the answer's JSON nests deeper than {MAX_ANSWER_DEPTH} levels; "
                            "answer with a flat object as the schema asks")
    errors = schema_errors(value, schema)
    if errors:
        raise InvalidAnswer("the object does not match the schema: " + "; ".join(errors))
    return value


def command_step(text: str) -> dict[str, Any] | None:
    """A tool step's answer in one of MetaGPT's forms, as `{"thought", "commands"}`: a JSON
    array of commands or one object with a `command_name`, fenced (RoleZero takes the first
    ```json block) or bare, after any prose, which becomes the thought. None for anything
    else (our own `{"thought", "commands"}` object included), read as any JSON answer."""
    prose, value = _first_json(text)
    if isinstance(value, dict) and "command_name" in value:
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, dict) for v in value):
        return None        # not a list of commands (`[1]` in prose): read as any JSON answer
    return {"thought": prose, "commands": value}


def _first_json(text: str) -> tuple[str, Any]:
    """The prose before the answer's JSON, and that JSON (its first fenced block holding an
    array or an object, else the first that parses in the text; None if there is none)."""
    for match in _CODE_BLOCK.finditer(text):
        body = match.group(2).strip()
        if body.endswith("]") and not body.startswith("["):
            body = "[" + body                # RoleZero mends an array that lost its "["
        if body.startswith(("[", "{")):
            return text[:match.start()].strip(), _loads_or_none(body)
    decoder = json.JSONDecoder()
    for start in [m.start() for m in _JSON_START.finditer(text)][:20]:
        try:
            value, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            continue
        return text[:start].strip(), value
    return "", None


def _or_json(parse: Callable[[str, dict[str, Any]], Any]) -> Callable[[str, dict[str, Any]], Any]:
    """Sections or tags as asked; a model that answers JSON anyway (a structured-output model
    always does) is read too, and the first parser's error is the one the model sees."""
    def parse_either(text: str, schema: dict[str, Any]) -> Any:
        try:
            return parse(text, schema)
        except InvalidAnswer as asked_error:
            try:
                return parse_json_object(text)
            except InvalidAnswer:
                raise asked_error from None
    return parse_either


def parse_xml(text: str, schema: dict[str, Any]) -> dict[str, Any]:
    """`<Key>value</Key>` tags → {key: value}, each value read as the key's schema says
    (MetaGPT's xml_fill: text stays text, numbers, booleans, lists and objects from JSON)."""
    props: dict[str, Any] = schema.get("properties") or {}
    out: dict[str, Any] = {}
    for key, sub in props.items():
        match = re.search(rf"<{re.escape(key)}>(.*?)</{re.escape(key)}>", text, re.S)
        if match:
            out[key] = _section_value(key, match.group(1), sub)
    if not out:
        names = ", ".join(f"<{k}>...</{k}>" for k in props) or "none"
        raise InvalidAnswer(f"no field tags found; expected: {names}")
    return out


def parse_json_object(text: str) -> dict[str, Any]:
    """The first JSON object in `text`, after a fence or [CONTENT] wrapper and any prose."""
    body = _unwrap(text)
    whole = _loads_or_none(body)
    if whole is not None and not isinstance(whole, dict):
        raise InvalidAnswer(f"expected one JSON object, got a JSON {_json_type(whole)}")
    if isinstance(whole, dict):
        return whole
    starts = [m.start() for m in re.finditer(r"\{", body)][:20]
    if not starts:
        raise InvalidAnswer("the answer holds no JSON object: expected one object starting with '{'")
    first_error: json.JSONDecodeError | None = None
    for start in starts:
        try:
            value, _ = _DECODER.raw_decode(body, start)
            if isinstance(value, dict):
                return value
        except json.JSONDecodeError as exc:
            first_error = first_error or exc
    assert first_error is not None
    raise InvalidAnswer(f"the JSON object does not parse: {first_error.msg} "
                        f"(line {first_error.lineno}, column {first_error.colno})")


_DECODER = json.JSONDecoder(strict=False)
"""Reads a raw newline or tab inside a JSON string as itself (see `_loads_or_none`)."""


def _loads_or_none(body: str) -> Any:
    """`body` as JSON, or None. A raw newline or tab inside a string (which JSON wants escaped,
    and small models write as is) is read as that character: its meaning is not in doubt."""
    try:
        return _DECODER.decode(body)
    except json.JSONDecodeError:
        return None


def _json_type(value: Any) -> str:
    return {list: "array", str: "string", bool: "boolean", int: "number", float: "number"}.get(type(value), "value")


def _unwrap(text: str) -> str:
    content = _CONTENT.search(text)
    if content:
        text = content.group(1)
    for match in _CODE_BLOCK.finditer(text):
        if match.group(2).lstrip().startswith("{"):
            return match.group(2)
    return text


def parse_markdown(text: str, schema: dict[str, Any]) -> dict[str, Any]:
    """`## Key` sections → {key: value}, each value read as the key's schema says."""
    props: dict[str, Any] = schema.get("properties") or {}
    by_norm = {_norm(k): k for k in props}
    found = [(m, by_norm[_norm(m.group(1))]) for m in _HEADING.finditer(text) if _norm(m.group(1)) in by_norm]
    if not found:
        names = ", ".join(f"## {k}" for k in props) or "none"
        raise InvalidAnswer(f"no `## <field>` sections found; expected sections: {names}")
    out: dict[str, Any] = {}
    for i, (match, key) in enumerate(found):
        end = found[i + 1][0].start() if i + 1 < len(found) else len(text)
        if key not in out:
            out[key] = _section_value(key, text[match.end():end], props[key])
    return out


_SECTION_PARSERS: dict[str, Callable[[str, dict[str, Any]], Any]] = {
    "markdown": _or_json(parse_markdown), "xml": _or_json(parse_xml)}
"""Formats whose answers are not one JSON object (`content` is one, wrapped: `_unwrap`)."""


def _norm(name: str) -> str:
    return re.sub(r"[\s_*`'\"]+", " ", name).strip().lower()


def _section_value(key: str, raw: str, schema: dict[str, Any]) -> Any:
    body = raw.strip()
    fenced = _CODE_BLOCK.fullmatch(body)
    if fenced:
        body = fenced.group(2).strip()
    if body.lower() in ("null", "none", "") and _allows(schema, "null"):
        return None
    if _allows(schema, "string") and not _allows_structured(schema):
        return _plain_string(body)
    try:
        return json.loads(body)
    except json.JSONDecodeError as exc:
        bullets = _bullets(body)
        if bullets is not None and _allows(schema, "array"):
            return bullets
        if _allows(schema, "string"):
            return _plain_string(body)
        if _allows(schema, "boolean") and body.lower() in ("true", "yes", "false", "no"):
            return body.lower() in ("true", "yes")
        raise InvalidAnswer(f"section '## {key}': expected {_type_name(schema)} written as JSON "
                            f"({exc.msg})") from None


def _allows(schema: dict[str, Any], kind: str) -> bool:
    if "enum" in schema and kind == "string":
        return True
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return any(_allows(s, kind) for s in schema[key])
    declared = schema.get("type")
    return declared == kind or (isinstance(declared, list) and kind in declared)


def _allows_structured(schema: dict[str, Any]) -> bool:
    return any(_allows(schema, k) for k in ("array", "object", "integer", "number", "boolean"))


def _plain_string(body: str) -> str:
    if len(body) >= 2 and body[0] == body[-1] == '"':
        try:
            decoded = json.loads(body)
            if isinstance(decoded, str):
                return decoded
        except json.JSONDecodeError:
            pass
    return body


def _bullets(body: str) -> list[str] | None:
    lines = [line for line in body.splitlines() if line.strip()]
    items = [_BULLET.match(line) for line in lines]
    if not lines or not all(items):
        return None
    return [_plain_string(m.group(1).strip()) for m in items if m]


def prepare_validator(schema_json: str) -> None:
    """Build (and cache) the validator of an output schema ahead of its first answer; a schema
    the validator refuses is left for that answer's check to report."""
    try:
        _validator(schema_json)
    except Exception:  # noqa: BLE001 - a warm-up never fails a run; the real check reports it
        pass


_BUILDING = threading.Lock()
"""One thread at a time imports jsonschema and builds validators: the run's warm-up thread
and the run itself may both get there first, and jsonschema's package, imported from two
threads at once, can be seen half-initialised by one of them."""


@lru_cache(maxsize=256)
def _validator(schema_json: str) -> Any:
    with _BUILDING:
        from referencing import Registry  # jsonschema's: imported with the first answer, after the first request went out

        schema = json.loads(schema_json)
        validator_class, formats = _linear_time_validator(with_pattern='"pattern' in schema_json)
        key = _checked_key(schema_json)
        if not key or diskcache.read("schema", key) != b"valid":
            validator_class.check_schema(schema, format_checker=formats)
            if key:
                diskcache.write("schema", key, b"valid")
        return validator_class(schema, registry=Registry())


def _checked_key(schema_json: str) -> str:
    """The on-disk cache's key for "this schema passed the meta-schema check": checking an
    output schema against Draft 2020-12 is most of building its validator (loading the
    meta-schemas), and the answer given to the same schema text by the same jsonschema never
    changes. Answers are validated in full every time; only the schema's own check is kept."""
    if diskcache.cache_dir() is None:
        return ""
    import jsonschema.validators  # as above: not before a run's first answer
    import jsonschema_specifications  # type: ignore[import-untyped]

    stamp = diskcache.module_stamp(jsonschema.validators, jsonschema_specifications)
    return diskcache.entry_key("schema", stamp, schema_json)


@lru_cache(maxsize=2)
def _linear_time_validator(with_pattern: bool = True) -> tuple[Any, Any]:
    """Draft 2020-12 with `pattern` matched by RE2 (`engine.load.patterns`), not Python's
    backtracking `re`: a pattern from a shared file, an answer of the model's choosing, and
    `(a|a)+$` would otherwise hang the run. The schema check's `regex` format is RE2's too.

    Not `with_pattern` (a schema whose JSON has no `"pattern` key, so no `pattern` nor
    `patternProperties`): jsonschema's own Draft 2020-12 class, which then validates exactly
    alike; extending it builds a class (attrs generates and compiles its code), about a
    millisecond of every new process's first answer."""
    from jsonschema import Draft202012Validator, FormatChecker, ValidationError, validators  # type: ignore[import-untyped]

    def pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Any:
        if validator.is_type(instance, "string") and not patterns.search(pattern, instance):
            yield ValidationError(f"{instance!r} does not match {pattern!r}")  # jsonschema's own wording

    def regex(instance: Any) -> bool:
        return not isinstance(instance, str) or patterns.compiled(instance) is not None

    formats = FormatChecker()
    formats.checks("regex", raises=patterns.PatternError)(regex)
    if not with_pattern:
        return Draft202012Validator, formats
    return validators.extend(Draft202012Validator, {"pattern": pattern}), formats


def schema_errors(value: Any, schema: dict[str, Any]) -> list[str]:
    """Up to five readable validation errors (`at /Key/0: ...`); empty when `value` is valid."""
    validator = _per_schema(schema, "validator", lambda: _validator(json.dumps(schema, sort_keys=True)))
    quick = _per_schema(schema, "quick check", lambda: compile_check(schema))   # after: the schema is checked
    if (quick is not None and quick(value)) or validator.is_valid(value):
        return []
    from jsonschema.exceptions import relevance  # type: ignore[import-untyped]  # imported whole by now

    errors = sorted(validator.iter_errors(value), key=relevance)
    return [_error_line(e) for e in errors[:_MAX_ERRORS]]


def _error_line(error: Any) -> str:
    where = "/" + "/".join(str(p) for p in error.absolute_path) if error.absolute_path else "the top level"
    message = error.message if len(error.message) <= 240 else error.message[:240] + "..."
    return f"at {where}: {message}"


def extract_code(text: str) -> str:
    """The first fenced code block's body (any language tag).

    A block left open at the very end of the answer (cut off by `max_tokens`) is taken as it
    is: asking again with the same limit would be cut at the same place.
    """
    match = _CODE_BLOCK.search(text) or _OPEN_BLOCK.search(text)
    if not match:
        raise InvalidAnswer("the answer holds no fenced code block: expected ```lang ... ```")
    code = match.group(2)
    if not code.strip():
        raise InvalidAnswer("the fenced code block is empty")
    return code if code.endswith("\n") else code + "\n"


def parse_choice(text: str, n_choices: int) -> int:
    """The first integer of the answer if it names a state (0..n-1), else -1 (stop)."""
    match = _INTEGER.search(text)
    if not match:
        return -1
    number = int(match.group(0))
    return number if 0 <= number < n_choices else -1
