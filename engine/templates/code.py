"""Templates and expressions compiled to Python once: the code a CompiledSop carries, and
the on-disk cache that lets a new process skip jinja's lexer, parser and code generator.

The code is the sandbox's own (`engine.templates.sandbox`'s bounded code generator): the size
checks it calls stay in it. A text that does not compile raises as it would have, and is
never stored.
"""

from __future__ import annotations

import contextlib
import marshal
import types
from collections.abc import Callable, Iterable, Mapping
from functools import lru_cache
from typing import Any

import jinja2
from jinja2 import Template, TemplateError, TemplateSyntaxError, nodes
from jinja2.environment import TemplateExpression
from jinja2.parser import Parser
from jinja2.sandbox import SecurityError

from engine import diskcache
from engine.templates.sandbox import environment

__all__ = ["template", "expression", "precompile", "precompile_all", "compile_all", "use_compiled",
           "expression_text"]


@lru_cache(maxsize=1024)
def template(source: str) -> Template:
    # Compiling is most of a render's cost (a 20-item fan-out renders 60 templates).
    return template_of_code(_code(source))


def template_of_code(code: types.CodeType) -> Template:
    """A template of this environment running `code`. Its globals are a plain dict, not
    jinja's ChainMap over the environment's: every render copies them into its context, and
    copying a ChainMap costs a fourth of a short render (the environment's globals are set
    once, in `environment()`, so a copy sees the same names)."""
    env = environment()
    return env.template_class.from_code(env, code, dict(env.globals), None)


def _code(source: str) -> types.CodeType:
    return _cached("template", source, _compile_template)


def _compile_template(source: str) -> types.CodeType:
    return environment().compile(source)   # as `from_string`


def _cached(kind: str, source: str, compile_source: Callable[[str], types.CodeType]) -> types.CodeType:
    """A template or expression compiled to Python by the bounded code generator: from the
    on-disk cache when this sandbox (the engine's code is in the key) compiled the same text
    before, so a new process does not pay jinja's lexer, parse, code generation and
    `compile` again. The cache holds this module's own generated code: the size checks it
    calls stay in it, and the environment's checks (`call_binop`, `call`, filters) are this
    process's. A text that does not compile raises as it did, and is never stored."""
    carried = _COMPILED.get((kind, source)) or _BUNDLED.get((kind, source))
    if carried is not None:
        return carried
    key = diskcache.entry_key(kind, jinja2.__version__, source) if diskcache.cache_dir() else ""
    stored = diskcache.read(kind, key) if key else None
    if stored is not None:
        with contextlib.suppress(ValueError, EOFError, TypeError):
            code = marshal.loads(stored)
            if _is_template_code(code):
                return code
    code = compile_source(source)
    if key:
        diskcache.write(kind, key, marshal.dumps(code))
    return code


def _expression_code(source: str) -> types.CodeType:
    """What jinja's `compile_expression` compiles: `result = <expression>` as a template."""
    env = environment()
    parser = Parser(env, source, state="variable")
    try:
        expr = parser.parse_expression()
        if not parser.stream.eos:
            raise TemplateSyntaxError("chunk after expression", parser.stream.current.lineno, None, None)
        expr.set_environment(env)
    except TemplateSyntaxError:
        env.handle_exception(source=source)
    body = [nodes.Assign(nodes.Name("result", "store"), expr, lineno=1)]
    return env.compile(nodes.Template(body, lineno=1))


def _is_template_code(code: Any) -> bool:
    """Code this module's compiler generated (what a cache entry must hold)."""
    return isinstance(code, types.CodeType) and code.co_filename == "<template>"


_COMPILE_ERRORS = (TemplateError, SecurityError, RecursionError, MemoryError)


def precompile(source: str) -> None:
    """Compile a template ahead of its first render (a run's warm-up, off its path); a
    template that does not compile is left for its render to report, located."""
    with contextlib.suppress(*_COMPILE_ERRORS):
        template(source)


_COMPILERS: dict[str, Callable[[str], types.CodeType]] = {
    "template": _compile_template, "expression": _expression_code,
}

_BUNDLED: dict[tuple[str, str], types.CodeType] = {}
"""Code read from a bundle by `precompile_all`, for `_cached`, while that call builds its
templates and expressions (then dropped: the lru caches above hold what was built)."""


def precompile_all(templates: Iterable[str], expressions: Iterable[str] = ()) -> None:
    """Make the templates and expressions of a SOP ahead of their first use (a run's
    warm-up). Their code is the compiled SOP's (`use_compiled`); any it does not carry (a SOP
    only checked, as `sopctl validate` leaves it) comes from one bundle, as `compile_all`'s."""
    items = _items(templates, expressions)
    codes = _bundled_codes([item for item in items if item not in _COMPILED])
    _BUNDLED.update(codes)
    try:
        _build(items)
    finally:
        for item in codes:
            _BUNDLED.pop(item, None)


def compile_all(templates: Iterable[str], expressions: Iterable[str] = ()) -> dict[tuple[str, str], bytes]:
    """Every template and expression of a SOP compiled, as marshalled code by (kind, text):
    what a CompiledSop carries, so that its run renders them without compiling (`use_compiled`).
    The code comes from one cache entry for the whole set (`bundle/`): a new process reads one
    file instead of one per template. On a miss each is compiled (or read from its own entry)
    and the set that compiled is stored as one bundle for the next process; one that does
    not compile is left out, for its use to report, located."""
    return {item: marshal.dumps(code) for item, code in _bundled_codes(_items(templates, expressions)).items()}


def _items(templates: Iterable[str], expressions: Iterable[str]) -> list[tuple[str, str]]:
    return sorted({("template", s) for s in templates} | {("expression", e) for e in expressions})


def _bundled_codes(items: list[tuple[str, str]]) -> dict[tuple[str, str], types.CodeType]:
    """The code of each item that compiles: from its bundle, or compiled and bundled."""
    key = _bundle_key(items) if items and diskcache.cache_dir() else ""
    codes = _read_bundle(key, items) if key else None
    if codes is not None:
        return codes
    codes = _compile_each(items)
    if key and codes:
        records = tuple((kind, source, code) for (kind, source), code in codes.items())
        diskcache.write(_BUNDLE, key, marshal.dumps(records))
    return codes


def _build(items: Iterable[tuple[str, str]]) -> None:
    """The template objects of `items`, made now (their code found as `_cached` finds it)."""
    for kind, source in items:
        if kind == "template":
            precompile(source)
        else:
            with contextlib.suppress(*_COMPILE_ERRORS):
                expression(source)


_COMPILED: dict[tuple[str, str], types.CodeType] = {}
"""The code compiled SOPs of this process carry (`use_compiled`), by (kind, text): what their
runs render with."""

_MAX_COMPILED = 4096


def use_compiled(codes: Mapping[tuple[str, str], bytes]) -> None:
    """Render a compiled SOP's templates and expressions with the code it carries
    (`compile_all`'s). Code that does not read back as this sandbox's is skipped: its text
    compiles on first use."""
    if len(_COMPILED) + len(codes) > _MAX_COMPILED:
        _COMPILED.clear()
    for item, blob in codes.items():
        with contextlib.suppress(ValueError, EOFError, TypeError):
            code = marshal.loads(blob)
            if _is_template_code(code):
                _COMPILED[item] = code


_BUNDLE = "bundle"


def _bundle_key(items: list[tuple[str, str]]) -> str:
    """The key of a bundle: every (kind, text) of it, in order, and jinja's version (each
    part is length-prefixed by `entry_key`, so no two sets share a key)."""
    return diskcache.entry_key(_BUNDLE, jinja2.__version__, *(part for item in items for part in item))


def _read_bundle(key: str, items: list[tuple[str, str]]) -> dict[tuple[str, str], types.CodeType] | None:
    """The code of each item from the bundle under `key`; None (a miss) when there is none,
    or it does not read back as a tuple of (kind, text, code) records of these items."""
    payload = diskcache.read(_BUNDLE, key)
    if payload is None:
        return None
    try:
        records = marshal.loads(payload)
    except (ValueError, EOFError, TypeError):
        return None
    if not isinstance(records, tuple):
        return None
    wanted, codes = set(items), {}
    for record in records:
        if not _is_record(record, wanted):
            return None
        codes[(record[0], record[1])] = record[2]
    return codes


def _is_record(record: Any, wanted: set[tuple[str, str]]) -> bool:
    """A (kind, text, code) record of one of the `wanted` (kind, text), with our code."""
    return (isinstance(record, tuple) and len(record) == 3 and isinstance(record[0], str)
            and isinstance(record[1], str) and (record[0], record[1]) in wanted
            and _is_template_code(record[2]))


def _compile_each(items: list[tuple[str, str]]) -> dict[tuple[str, str], types.CodeType]:
    """The code of each item that compiles (from its own cache entry, or compiled)."""
    codes = {}
    for kind, source in items:
        with contextlib.suppress(*_COMPILE_ERRORS):
            codes[(kind, source)] = _cached(kind, source, _COMPILERS[kind])
    return codes


def expression_text(source: str) -> str:
    """The expression of a `for_each` or `when`: inside its `{{ }}`, if it has them."""
    text = source.strip()
    return text[2:-2] if len(text) >= 4 and text.startswith("{{") and text.endswith("}}") else source



@lru_cache(maxsize=256)
def expression(source: str) -> TemplateExpression:
    """A sandboxed jinja expression (`for_each`, `when`), compiled once per process (evaluate
    it through `engine.templates.render.compile_expression`, under the render limits)."""
    return TemplateExpression(template_of_code(_cached("expression", source, _expression_code)),
                              undefined_to_none=False)
