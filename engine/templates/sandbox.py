"""The sandboxed jinja2 environment shared by the compiler (static checks) and the runner.

Templates come from shared, untrusted SOP files: they render in an
`ImmutableSandboxedEnvironment` with `StrictUndefined`, and every render is bounded three
ways, so that a hostile template fails its action cleanly, located at its line, instead of
hanging the run or eating memory:

- **Size, before building:** every operation that can build a big value in one step of C
  code (`*`, `**`, `+`, `%`, `~`, `center(n)`, format widths, `indent`, `replace`...) is
  refused when its result would pass the output limit. Nothing can interrupt one C call,
  so these checks come first.
- **CPU time and memory, while running:** a watchdog thread looks at each render in
  progress every few milliseconds and stops it (an exception raised in the rendering
  thread, between two bytecodes) once it used more than MAX_RENDER_CPU_S seconds of its
  thread's CPU time or grew the process by more than MAX_RENDER_MEMORY bytes: nested loops
  and slow accumulations, which no static rule catches, end there.
- **Ctrl-C:** inside `stop_renders_on_cancel()` (a run) a Ctrl-C or SIGTERM, which cancel
  the run's task, stop the render in progress within a tick; the run then ends
  `interrupted` as it does between renders.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import json
import marshal
import os
import re
import threading
import time
import types
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, TypeVar
from collections.abc import Callable, Iterable, Iterator

from jinja2 import StrictUndefined, Template, TemplateError, nodes
from jinja2.compiler import CodeGenerator
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError
from jinja2.utils import _PassArg, generate_lorem_ipsum

if TYPE_CHECKING:   # not imported at run time: `sopctl validate` never needs asyncio
    import asyncio

__all__ = ["MAX_RENDERED_CHARS", "MAX_RENDER_CPU_S", "MAX_RENDER_MEMORY", "TemplateFailure",
           "environment", "parse", "render_template", "compile_expression", "precompile", "precompile_all",
           "stop_renders_on_cancel"]


MAX_RENDERED_CHARS = 1_000_000
"""Upper bound on one rendered template (prompt, path, artifact content)."""

MAX_RENDER_CPU_S = 2.0
"""CPU seconds one render may use (its thread's CPU clock: a busy machine does not count)."""

MAX_RENDER_MEMORY = 512 * 2**20
"""Bytes one render may grow the process's resident memory by."""

_MAX_REPEAT = 100_000
_MAX_INT_BITS = 100_000     # `2 ** 10**10` is one C call of minutes: refused before it starts
_SIZED = (str, bytes, list, tuple)


class TemplateFailure(Exception):
    """A template could not be parsed or rendered; the message is user-facing, `line` the
    template line it failed on (0 when no line is to blame, e.g. the output limit)."""

    def __init__(self, message: str, line: int = 0) -> None:
        super().__init__(message)
        self.line = line


def _too_large() -> SecurityError:
    return SecurityError("template builds a value larger than the output limit")


def _check_size(value: Any) -> Any:
    """Refuse a value past the output limit the moment a template builds one."""
    kind = type(value)
    if kind is str:     # most results (a filter's text): their weight is their length
        if len(value) > MAX_RENDERED_CHARS:
            raise _too_large()
    elif kind not in _ATOMS and _weight(value) > MAX_RENDERED_CHARS:
        raise _too_large()
    return value


_ATOMS = frozenset({int, float, bool, type(None)})
"""Types whose weight is 1 whatever their value (no need to walk them)."""


def _weight(value: Any, limit: int = MAX_RENDERED_CHARS) -> int:
    """What printing, comparing or serializing `value` costs: characters of its strings plus
    one per item, counting a shared item each time it is reached (`[y] * 9` with `y` big is
    nine `y`s to print). The walk stops as soon as it passes `limit`."""
    total, stack = 0, [value]
    while stack and total <= limit:
        item = stack.pop()
        if isinstance(item, (str, bytes)):
            total += len(item)
        elif isinstance(item, (list, tuple, set, frozenset)):
            total += 1 + len(item)
            stack.extend(item)
        elif isinstance(item, dict):
            total += 1 + len(item)
            stack.extend(item.keys())
            stack.extend(item.values())
        else:
            total += 1
    return total


def _bounded_join(parts: Any) -> str:
    """`a ~ b`: jinja's own join, but a doubling `{% set a = a ~ a %}` stops at the limit."""
    if sum(_weight(part) for part in parts) > MAX_RENDERED_CHARS:
        raise _too_large()
    return "".join(str(part) for part in parts)


class _BoundedCodeGenerator(CodeGenerator):
    """Jinja's code generator, with `~` and the list, tuple and dict displays checked: with
    `*` and `+` they are every way a template builds a value, so no value (not even
    `[b, b, b]` where `b` is `[a, a, a]`...) can outgrow the limit unseen."""

    def visit_Concat(self, node: nodes.Concat, frame: Any) -> None:
        self.write("environment.bounded_join((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")

    def visit_List(self, node: nodes.List, frame: Any) -> None:
        self._bounded(super().visit_List, node, frame)

    def visit_Dict(self, node: nodes.Dict, frame: Any) -> None:
        self._bounded(super().visit_Dict, node, frame)

    def visit_Tuple(self, node: nodes.Tuple, frame: Any) -> None:
        if node.ctx != "load":      # `{% for a, b in ... %}`: a target, not a value
            return super().visit_Tuple(node, frame)
        self._bounded(super().visit_Tuple, node, frame)

    def _bounded(self, visit: Callable[..., None], node: nodes.Node, frame: Any) -> None:
        self.write("environment.bounded_value(")
        visit(node, frame)
        self.write(")")


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, plus size limits on what a template can build *before* any output check:
    `*`, `**`, `+` and `%` on strings, numbers and lists, `~`, filter arguments such as
    `center(10**9)`, and format widths. Without them a few lines of a shared file could
    exhaust memory in one C call that nothing can interrupt."""

    code_generator_class = _BoundedCodeGenerator
    intercepted_binops = frozenset({"*", "**", "+", "%"})
    bounded_join = staticmethod(_bounded_join)
    bounded_value = staticmethod(_check_size)

    def call_binop(self, context, operator, left, right):  # type: ignore[override]
        _check_binop(operator, left, right)
        return _check_size(super().call_binop(context, operator, left, right))

    def wrap_str_format(self, value: Any) -> Any:
        # `'{:>1000000000}'.format(x)` would allocate the width before anything could check it
        owner = getattr(value, "__self__", None)
        if isinstance(owner, str) and getattr(value, "__name__", "") in ("format", "format_map"):
            _check_format(owner, ())
        return super().wrap_str_format(value)

    def call(__self, __context, __obj, *args, **kwargs):  # type: ignore[override]  # noqa: N805
        """Method calls (`'x'.center(n)`): sizes checked before the call, the result after."""
        name = getattr(__obj, "__name__", "call")
        _check_arguments(name, args, kwargs)
        owner = getattr(__obj, "__self__", None)
        if isinstance(owner, (str, bytes)):
            _check_method(owner, name, args)
        return _check_size(super().call(__context, __obj, *args, **kwargs))


def _check_binop(operator: str, left: Any, right: Any) -> None:
    """Refuse `'x' * 10**9`, `2 ** 10**10`, `big * big` and `'%999999999s' % x` unbuilt."""
    if operator == "*":
        seq, count = (left, right) if isinstance(left, _SIZED) else (right, left)
        if isinstance(seq, _SIZED) and _is_int(count) and count > 0 \
                and _weight(seq) * count > MAX_RENDERED_CHARS:
            raise _too_large()
        if _is_int(left) and _is_int(right) and left.bit_length() + right.bit_length() > _MAX_INT_BITS:
            raise SecurityError("template builds a number beyond the limit")
    elif operator == "**" and _is_int(left) and _is_int(right) and right > 0 \
            and abs(left) > 1 and right * left.bit_length() > _MAX_INT_BITS:
        raise SecurityError("template builds a number beyond the limit")
    elif operator == "%" and isinstance(left, (str, bytes)):
        _check_format(left, right if isinstance(right, tuple) else (right,))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_WIDTH = re.compile(r"%[-#0 +]*(\d+|\*)|\{[^{}]*:[^{}]*?(\d+)")


def _check_format(template: str | bytes, args: tuple[Any, ...]) -> None:
    """`'%999999s' * 9`, `'{:>999999}'`, `'%*s' % (10**6, x)`, `'{0}{0}{0}'.format(big)`:
    the widths, and every field filled with all the arguments, bound what a format builds."""
    text = template.decode("latin-1") if isinstance(template, bytes) else template
    widths = 0
    star_args = iter(a for a in args if _is_int(a))
    for percent, brace in _WIDTH.findall(text):
        width = percent or brace
        widths += abs(next(star_args, 0)) if width == "*" else int(width)
    fields = max(text.count("{"), text.count("%"), 1)
    _check_growth(len(text) + widths + fields * sum(_weight(a) for a in args))


def _check_arguments(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse an integer argument past the output limit (`center(10**9)`). A bool is an int
    within the limit, so `isinstance` alone is enough; no list is built (this runs for every
    filter and method call)."""
    for value in itertools.chain(args, kwargs.values()):
        if isinstance(value, int) and not -MAX_RENDERED_CHARS <= value <= MAX_RENDERED_CHARS:
            raise SecurityError(f"'{name}' called with a size beyond the output limit")


def _check_method(owner: str | bytes, name: str, args: tuple[Any, ...]) -> None:
    """Methods that grow their string by a factor: `expandtabs`, `replace`, `join`."""
    if name == "expandtabs" and args and _is_int(args[0]):
        tabs = owner.count("\t") if isinstance(owner, str) else owner.count(b"\t")
        _check_growth(len(owner) + tabs * args[0])
    elif name == "replace" and len(args) >= 2:
        _check_replace([owner, *args[:2]], {})
    elif name == "join" and args:
        _check_joined(owner, args[0])
    elif name in ("format", "format_map"):
        _check_format(owner, args)


def _check_joined(separator: Any, items: Any) -> None:
    if isinstance(items, _SIZED):
        _check_growth(len(str(separator)) * len(items) + _weight(items))


def _check_growth(size: int) -> None:
    if size > MAX_RENDERED_CHARS:
        raise _too_large()


def _bounded_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """A filter whose size arguments are checked before it runs and whose result after."""
    grows = _FILTER_GROWTH.get(name)
    skip = 0 if _PassArg.from_obj(func) is None else 1   # jinja's context/environment comes first

    def bounded(*args: Any, **kwargs: Any) -> Any:
        _check_arguments(name, args, kwargs)
        if grows is not None:
            grows(list(args[skip:]), kwargs)
        return _check_size(func(*args, **kwargs))

    # jinja's pass_context/pass_eval_ctx marks are attributes: copied, they tell jinja what
    # to pass first (cheaper than `functools.wraps`, for 54 filters in every new process)
    bounded.__dict__.update(getattr(func, "__dict__", {}))
    bounded.__name__ = bounded.__qualname__ = getattr(func, "__name__", name)
    bounded.__wrapped__ = func  # type: ignore[attr-defined]
    return bounded


def _check_replace(args: list[Any], kwargs: dict[str, Any]) -> None:
    """`s|replace(old, new)` grows by count(old) * len(new): refuse before building it."""
    if len(args) >= 3 and isinstance(args[0], (str, bytes)):
        value, old, new = args[0], args[1], args[2]
        count = value.count(old) if old else len(value) + 1
        _check_growth(len(value) + count * len(new))


def _check_indent(args: list[Any], kwargs: dict[str, Any]) -> None:
    """`s|indent(width)` adds the width to every line: one `join` in C."""
    if args and isinstance(args[0], str):
        width = args[1] if len(args) > 1 else kwargs.get("width", 4)
        size = width if _is_int(width) else len(str(width))
        _check_growth(len(args[0]) + (args[0].count("\n") + 1) * size)


def _check_wordwrap(args: list[Any], kwargs: dict[str, Any]) -> None:
    """`s|wordwrap(1, wrapstring=long)` puts the wrap string after every character."""
    if args and isinstance(args[0], str):
        wrap = kwargs.get("wrapstring", args[3] if len(args) > 3 else "\n")
        _check_growth(len(args[0]) * (1 + len(str(wrap or ""))))


def _check_format_filter(args: list[Any], kwargs: dict[str, Any]) -> None:
    if args and isinstance(args[0], str):
        _check_format(args[0], (*args[1:], *kwargs.values()))


def _check_join_filter(args: list[Any], kwargs: dict[str, Any]) -> None:
    if args:
        _check_joined(args[1] if len(args) > 1 else kwargs.get("d", ""), args[0])


_FILTER_GROWTH: dict[str, Callable[[list[Any], dict[str, Any]], None]] = {
    "replace": _check_replace, "indent": _check_indent, "wordwrap": _check_wordwrap,
    "format": _check_format_filter, "join": _check_join_filter,
}


_NOT_SLUG = re.compile(r"[^a-z0-9]+")
# A run of characters that has one not allowed in a file name, with the dots next to it.
_NOT_FILE_NAME = re.compile(r"[^\w-]*[^\w.-][^\w-]*", re.ASCII)
_EXTENSION = re.compile(r"\.[A-Za-z0-9]{1,10}$")


def _slug(value: Any, length: int = 60) -> str:
    """`{{ name | slug }}`: a lowercase identifier (a package or folder name from model text)."""
    text = _NOT_SLUG.sub("_", str(value).lower()).strip("_")[:length].strip("_")
    return text or "x"


def _file_name(value: Any, extension: str = "", length: int = 120) -> str:
    """`{{ item | file_name('.py') }}`: model text made a safe relative path inside the
    workspace (no spaces, no `..`, no leading `/`), with `extension` added when it has none."""
    # dots next to a space go with it ("vs. x" -> "vs_x"): only a last ".alnum" is an extension
    parts = [_NOT_FILE_NAME.sub("_", part).strip("_.") for part in str(value).strip().split("/")]
    path = "/".join(p for p in parts if p)[:length] or "file"
    if extension and not _EXTENSION.search(path.rsplit("/", 1)[-1]):
        path += extension
    return path


def _where(rows: Any, key: Any, value: Any) -> list[Any]:
    """`{{ rows | where(0, filename) }}`: the rows (lists, or mappings) whose column or field
    `key` equals `value`, or is one of its items when `value` is a list. A row too short or
    without the key is skipped rather than an error, since rows come from model answers, and
    `None` (an optional field left out) has no rows."""
    if rows is None:
        return []
    if not isinstance(rows, (list, tuple)):
        raise TypeError(f"where: expected a list of rows, got {type(rows).__name__}")
    wanted = list(value) if isinstance(value, (list, tuple)) else [value]
    return [row for row in rows if _has_cell(row, key) and row[key] in wanted]


def _has_cell(row: Any, key: Any) -> bool:
    if isinstance(row, dict):
        return key in row
    return isinstance(row, (list, tuple)) and _is_int(key) and -len(row) <= key < len(row)


def _tojson(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=False)


@lru_cache(maxsize=1)
def environment() -> ImmutableSandboxedEnvironment:
    env = _BoundedEnvironment(undefined=StrictUndefined, autoescape=False, keep_trailing_newline=True)
    env.filters["tojson"] = _tojson
    env.filters["slug"] = _slug
    env.filters["file_name"] = _file_name
    env.filters["where"] = _where
    env.filters = {name: _bounded_filter(name, f) for name, f in env.filters.items()}
    env.globals["range"] = _bounded_range
    env.globals["lipsum"] = _bounded_lipsum
    return env


def _bounded_lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:  # noqa: A002
    """jinja's `lipsum`, at most 100 paragraphs of at most 1,000 words."""
    if n > 100 or max > 1000:
        raise SecurityError("lipsum() beyond 100 paragraphs of 1,000 words")
    return str(generate_lorem_ipsum(n, html, min, max))


def _bounded_range(*args: int) -> range:
    r = range(*args)
    if len(r) > _MAX_REPEAT:
        raise SecurityError(f"range() of {len(r)} items exceeds the limit of {_MAX_REPEAT}")
    return r


def parse(source: str) -> nodes.Template:
    """Parse a template; raises TemplateFailure with jinja's line and message."""
    try:
        return environment().parse(source)
    except TemplateError as exc:
        line = getattr(exc, "lineno", None)
        where = f" (template line {line})" if line else ""
        raise TemplateFailure(f"template syntax error{where}: {exc}") from None


@lru_cache(maxsize=1024)
def _template(source: str) -> Template:
    # Compiling is most of a render's cost (a 20-item fan-out renders 60 templates).
    return _from_code(_code(source))


def _from_code(code: types.CodeType) -> Template:
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
    import jinja2

    from engine import diskcache

    bundled = _BUNDLED.get((kind, source))
    if bundled is not None:
        return bundled
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
    from jinja2 import TemplateSyntaxError
    from jinja2.parser import Parser

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
        _template(source)


_COMPILERS: dict[str, Callable[[str], types.CodeType]] = {
    "template": _compile_template, "expression": _expression_code,
}

_BUNDLED: dict[tuple[str, str], types.CodeType] = {}
"""Code read from a bundle by `precompile_all`, for `_cached`, while that call builds its
templates and expressions (then dropped: the lru caches above hold what was built)."""


def precompile_all(templates: Iterable[str], expressions: Iterable[str] = ()) -> None:
    """Compile all the templates and expressions of a SOP ahead of their first use (a run's
    warm-up). Their code comes from one cache entry for the whole set (`bundle/`): a new
    process reads one file instead of one per template. On a miss each is compiled (or read
    from its own entry) and the set that compiled is stored as one bundle for the next
    process; one that does not compile is left for its use to report, located."""
    from engine import diskcache

    items = sorted({("template", s) for s in templates} | {("expression", e) for e in expressions})
    key = _bundle_key(items) if items and diskcache.cache_dir() else ""
    codes = _read_bundle(key, items) if key else None
    missed = codes is None
    if codes is None:
        codes = _compile_each(items)
    _BUNDLED.update(codes)
    try:
        for kind, source in items:
            if kind == "template":
                precompile(source)
            else:
                with contextlib.suppress(*_COMPILE_ERRORS):
                    compile_expression(source)
    finally:
        for item in codes:
            _BUNDLED.pop(item, None)
    if missed and key and codes:
        records = tuple((kind, source, code) for (kind, source), code in codes.items())
        diskcache.write(_BUNDLE, key, marshal.dumps(records))


_BUNDLE = "bundle"


def _bundle_key(items: list[tuple[str, str]]) -> str:
    """The key of a bundle: every (kind, text) of it, in order, and jinja's version (each
    part is length-prefixed by `entry_key`, so no two sets share a key)."""
    import jinja2

    from engine import diskcache

    return diskcache.entry_key(_BUNDLE, jinja2.__version__, *(part for item in items for part in item))


def _read_bundle(key: str, items: list[tuple[str, str]]) -> dict[tuple[str, str], types.CodeType] | None:
    """The code of each item from the bundle under `key`; None (a miss) when there is none,
    or it does not read back as a tuple of (kind, text, code) records of these items."""
    from engine import diskcache

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


@lru_cache(maxsize=256)
def compile_expression(source: str) -> Callable[..., Any]:
    """A sandboxed jinja expression (`for_each`, `when`), compiled once per process; calling
    it evaluates under the same limits as a render (TemplateFailure past them)."""
    from jinja2.environment import TemplateExpression

    template = _from_code(_cached("expression", source, _expression_code))
    expression = TemplateExpression(template, undefined_to_none=False)

    def evaluate(**variables: Any) -> Any:
        return _within_limits(lambda: expression(**variables))

    return evaluate


def render_template(source: str, variables: dict[str, Any], limit: int = MAX_RENDERED_CHARS) -> str:
    """Render with the sandbox and its limits; every failure is a TemplateFailure."""
    if "{" not in source and "\r" not in source:
        # Plain text (a fixed path, a prompt without variables) renders as itself: without
        # `{` there is no tag, variable or comment, and without `\r` no newline that jinja
        # would rewrite to `\n`. Only the output limit applies, and a cancelled run's stop.
        if _cancelling(_RUN_TASK.get()):
            raise _cancelled()
        if len(source) > limit:
            raise TemplateFailure(f"rendered text exceeds the limit of {limit:,} characters")
        return source
    template = _template(source)
    return _within_limits(lambda: _generate(template, variables, limit))


def _generate(template: Template, variables: dict[str, Any], limit: int) -> str:
    pieces: list[str] = []
    size = 0
    for piece in template.generate(**variables):
        size += len(piece)
        if size > limit:
            raise TemplateFailure(f"rendered text exceeds the limit of {limit:,} characters")
        pieces.append(piece)
    return "".join(pieces)


_T = TypeVar("_T")


def _cancelled() -> BaseException:
    """The error that ends a cancelled run's render (only a run, which has loaded asyncio, gets one)."""
    import asyncio

    return asyncio.CancelledError()


def _within_limits(work: Callable[[], _T]) -> _T:
    """Run one render or evaluation under the watchdog; its failures as TemplateFailure."""
    try:
        render = _WATCHDOG.watch()
    except _Interrupted:
        raise _cancelled() from None
    try:
        try:
            return work()
        finally:
            _WATCHDOG.forget(render)
    except _Stopped as exc:
        _WATCHDOG.forget(render)  # the stop may have landed inside the `finally` above
        if isinstance(exc, _Interrupted):
            raise _cancelled() from None
        raise TemplateFailure(exc.message(), _failing_line(exc)) from None
    except TemplateFailure:
        raise
    except SecurityError as exc:
        raise TemplateFailure(f"template refused by the sandbox: {exc}", _failing_line(exc)) from None
    except (TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError,
            ZeroDivisionError, OverflowError, RecursionError, MemoryError) as exc:
        raise TemplateFailure(f"template failed: {type(exc).__name__}: {exc}", _failing_line(exc)) from None


# --------------------------------------------------------------------------- the watchdog

class _Stopped(BaseException):
    """Raised *into* a rendering thread (a BaseException: no `except Exception` on the way
    may swallow it). Asynchronous exceptions are raised by class, so each reason is one."""

    def message(self) -> str:
        return "template stopped"


class _OverCpu(_Stopped):
    def message(self) -> str:
        return f"template used more than {MAX_RENDER_CPU_S:g} s of CPU time (a loop too long?)"


class _OverMemory(_Stopped):
    def message(self) -> str:
        return f"template grew memory by more than {MAX_RENDER_MEMORY // 2**20} MiB"


class _Interrupted(_Stopped):
    """Ctrl-C or SIGTERM during a render: the run is being interrupted."""


@dataclass(eq=False)
class _Render:
    thread: int
    cpu_clock: int | None
    cpu_start: float
    run: asyncio.Task[Any] | None       # the run it belongs to: stopped once that is cancelled
    memory_start: int | None = None     # the watchdog's first look (renders under a tick: none)
    stopped: bool = False


@dataclass
class _Watchdog:
    """One daemon thread for the whole process that looks at the renders in progress every
    TICK seconds and stops one past its CPU time or memory. Watching a render costs a dict
    insert; the thread ticks while renders come, and sleeps after a quiet tenth of a second
    (a tick costs some CPU whether or not a render is in progress: ticking for a whole second
    after each burst of renders cost a run more CPU per model call than its renders did)."""

    TICK = 0.01
    QUIET_TICKS = 10    # 0.1 s without a render in progress: the thread sleeps until the next one
    _renders: dict[int, _Render] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _wake: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _idle: bool = True      # the thread waits for `_wake` (a render must set it)

    def watch(self) -> _Render:
        run = _RUN_TASK.get()
        if _cancelling(run):
            raise _Interrupted()
        thread = threading.get_ident()
        clock = _thread_cpu_clock(thread)
        render = _Render(thread, clock, _cpu_seconds(clock), run)
        with self._lock:
            self._renders[id(render)] = render
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="sopctl-render-watchdog",
                                                daemon=True)
                self._thread.start()
            wake, self._idle = self._idle, False
        if wake:    # only when the thread sleeps: waking it on every render would cost more
            self._wake.set()
        return render

    def forget(self, render: _Render) -> None:
        with self._lock:
            self._renders.pop(id(render), None)
            if render.stopped:  # a stop raised but not yet delivered must not land elsewhere
                _raise_in_thread(render.thread, None)

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            quiet = 0
            while quiet < self.QUIET_TICKS:
                time.sleep(self.TICK)
                self._look()
                with self._lock:
                    quiet = 0 if self._renders else quiet + 1
                    self._idle = quiet >= self.QUIET_TICKS

    def _look(self) -> None:
        if not self._renders:
            return
        memory = _resident_bytes()
        with self._lock:
            for render in list(self._renders.values()):
                if render.memory_start is None:
                    render.memory_start = memory
                    continue
                reason = _Interrupted if _cancelling(render.run) else _over_limit(render, memory)
                if reason is not None and not render.stopped:
                    render.stopped = True
                    _raise_in_thread(render.thread, reason)


def _over_limit(render: _Render, memory: int) -> type[_Stopped] | None:
    if _cpu_seconds(render.cpu_clock) - render.cpu_start > MAX_RENDER_CPU_S:
        return _OverCpu
    if memory and render.memory_start and memory - render.memory_start > MAX_RENDER_MEMORY:
        return _OverMemory
    return None


def _thread_cpu_clock(thread: int) -> int | None:
    try:
        return time.pthread_getcpuclockid(thread)
    except (AttributeError, OSError):   # no per-thread CPU clock here: wall time stands in
        return None


def _cpu_seconds(clock: int | None) -> float:
    try:
        return time.clock_gettime(clock) if clock is not None else time.monotonic()
    except OSError:     # the thread is gone: its render is over
        return 0.0


def _resident_bytes() -> int:
    """This process's resident memory (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return 0


_PAGE_SIZE = 4096
try:
    _PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
except (ValueError, OSError, AttributeError):
    pass


def _raise_in_thread(thread: int, reason: type[_Stopped] | None) -> None:
    """Raise `reason` in `thread` at its next bytecode (None: take back one not raised yet)."""
    import ctypes

    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread),
                                               ctypes.py_object(reason) if reason else None)


_WATCHDOG = _Watchdog()


def _new_watchdog_after_fork() -> None:
    """A forked child has no watchdog thread (and maybe a lock held by the parent's): it
    starts its own on its first render."""
    global _WATCHDOG
    _WATCHDOG = _Watchdog()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_watchdog_after_fork)


_RUN_TASK: contextvars.ContextVar[asyncio.Task[Any] | None] = \
    contextvars.ContextVar("sopctl_run_task", default=None)


@contextlib.contextmanager
def stop_renders_on_cancel() -> Iterator[None]:
    """Within (a run's task): once that task is cancelled (Ctrl-C and SIGTERM cancel it,
    through asyncio's handler) the render in progress in any of its tasks stops within a
    tick, and no new one starts. A render is synchronous, so without this the cancellation
    would wait for it to end."""
    import asyncio   # a run has loaded it already

    token = _RUN_TASK.set(asyncio.current_task())
    try:
        yield
    finally:
        _RUN_TASK.reset(token)


def _cancelling(task: asyncio.Task[Any] | None) -> bool:
    """Whether `task` is being cancelled (read from any thread; Python 3.11+, else never)."""
    cancelling = getattr(task, "cancelling", None)
    return bool(cancelling()) if cancelling is not None else False


def _failing_line(exc: BaseException) -> int:
    """The template line an error comes from: jinja rewrites a render's traceback so that
    template code appears as frames of the file `<template>` at template lines (as Python
    shows source lines); the innermost one is where it failed."""
    line, trace = getattr(exc, "lineno", None) or 0, exc.__traceback__
    while trace is not None:
        if trace.tb_frame.f_code.co_filename == "<template>":
            line = _template_line(trace)
        trace = trace.tb_next
    return line


def _template_line(trace: Any) -> int:
    """A frame of template code: jinja's rewritten frames stand at the template line; a frame
    of the compiled template itself (a watchdog stop is never rewritten) maps through the
    template's debug info."""
    template = trace.tb_frame.f_globals.get("__jinja_template__")
    if template is None:
        return int(trace.tb_lineno)
    return int(template.get_corresponding_lineno(trace.tb_lineno))
