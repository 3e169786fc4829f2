"""The sandboxed jinja2 environment shared by the compiler (static checks) and the runner.

Templates come from shared, untrusted SOP files: they render in an
`ImmutableSandboxedEnvironment` with `StrictUndefined`, and the rendered text is bounded so
that a hostile template (`{{ 'x' * 10**9 }}`, nested loops) fails its action cleanly
instead of eating memory.
"""

from __future__ import annotations

import functools
import json
import re
from functools import lru_cache
from typing import Any, Callable

from jinja2 import StrictUndefined, Template, TemplateError, nodes
from jinja2.compiler import CodeGenerator
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

__all__ = ["MAX_RENDERED_CHARS", "TemplateFailure", "environment", "parse", "render_template",
           "compile_expression"]


MAX_RENDERED_CHARS = 1_000_000
"""Upper bound on one rendered template (prompt, path, artifact content)."""


_MAX_REPEAT = 100_000


class TemplateFailure(Exception):
    """A template could not be parsed or rendered; the message is user-facing, `line` the
    template line it failed on (0 when no line is to blame, e.g. the output limit)."""

    def __init__(self, message: str, line: int = 0) -> None:
        super().__init__(message)
        self.line = line


def _check_size(value: Any) -> Any:
    """Refuse a string or list past the output limit the moment a template builds one."""
    if isinstance(value, (str, list, tuple)) and len(value) > MAX_RENDERED_CHARS:
        raise SecurityError("template builds a value larger than the output limit")
    return value


def _bounded_join(parts: Any) -> str:
    """`a ~ b`: jinja's own join, but a doubling `{% set a = a ~ a %}` stops at the limit."""
    pieces = [str(part) for part in parts]
    if sum(len(piece) for piece in pieces) > MAX_RENDERED_CHARS:
        raise SecurityError("template builds a value larger than the output limit")
    return "".join(pieces)


class _BoundedCodeGenerator(CodeGenerator):
    def visit_Concat(self, node: nodes.Concat, frame: Any) -> None:
        self.write("environment.bounded_join((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, plus size limits on what a template can build *before* any output check:
    `*` and `+` on strings and lists, `~`, filter arguments such as `center(10**9)`, and
    format widths. Without them a few lines of a shared file could exhaust memory."""

    code_generator_class = _BoundedCodeGenerator
    intercepted_binops = frozenset({"*", "+"})
    bounded_join = staticmethod(_bounded_join)

    def call_binop(self, context, operator, left, right):  # type: ignore[override]
        if operator == "*":
            seq, count = (left, right) if isinstance(left, (str, list, tuple)) else (right, left)
            if isinstance(seq, (str, list, tuple)) and isinstance(count, int) \
                    and len(seq) * count > MAX_RENDERED_CHARS:
                raise SecurityError("template builds a value larger than the output limit")
        return _check_size(super().call_binop(context, operator, left, right))

    def wrap_str_format(self, value: Any) -> Any:
        # `'{:>1000000000}'.format(x)` would allocate the width before anything could check it
        owner = getattr(value, "__self__", None)
        if isinstance(owner, str) and getattr(value, "__name__", "") in ("format", "format_map") \
                and re.search(r"\d{7,}", owner):
            raise SecurityError("format width beyond the output limit")
        return super().wrap_str_format(value)

    def call(__self, __context, __obj, *args, **kwargs):  # type: ignore[override]  # noqa: N805
        """Method calls (`'x'.center(n)`): sizes checked before the call, the result after."""
        _check_arguments(getattr(__obj, "__name__", "call"), args, kwargs)
        return _check_size(super().call(__context, __obj, *args, **kwargs))


def _check_arguments(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    numbers = [a for a in (*args, *kwargs.values()) if isinstance(a, int) and not isinstance(a, bool)]
    if any(abs(n) > MAX_RENDERED_CHARS for n in numbers):
        raise SecurityError(f"'{name}' called with a size beyond the output limit")
    strings = [a for a in args if isinstance(a, str)]
    if name == "format" and any(re.search(r"%\d{7,}", a) for a in strings):
        raise SecurityError("format width beyond the output limit")


def _bounded_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """A filter whose size arguments are checked before it runs and whose result after."""

    @functools.wraps(func)  # keeps jinja's pass_context/pass_eval_ctx marks
    def bounded(*args: Any, **kwargs: Any) -> Any:
        _check_arguments(name, args, kwargs)
        if name == "replace":
            _check_replace([a for a in args if not hasattr(a, "environment")], kwargs)
        return _check_size(func(*args, **kwargs))

    return bounded


def _check_replace(args: list[Any], kwargs: dict[str, Any]) -> None:
    """`s|replace(old, new)` grows by count(old) * len(new): refuse before building it."""
    if len(args) >= 3 and isinstance(args[0], str):
        value, old, new = str(args[0]), str(args[1]), str(args[2])
        if len(value) + (value.count(old) if old else len(value) + 1) * len(new) > MAX_RENDERED_CHARS:
            raise SecurityError("template builds a value larger than the output limit")


def _slug(value: Any, length: int = 60) -> str:
    """`{{ name | slug }}`: a lowercase identifier (a package or folder name from model text)."""
    text = re.sub(r"[^a-z0-9]+", "_", str(value).lower()).strip("_")[:length].strip("_")
    return text or "x"


def _file_name(value: Any, extension: str = "", length: int = 120) -> str:
    """`{{ item | file_name('.py') }}`: model text made a safe relative path inside the
    workspace (no spaces, no `..`, no leading `/`), with `extension` added when it has none."""
    # dots next to a space go with it ("vs. x" -> "vs_x"): only a last ".alnum" is an extension
    parts = [re.sub(r"[^\w-]*[^\w.-][^\w-]*", "_", part, flags=re.ASCII).strip("_.") for part in str(value).strip().split("/")]
    path = "/".join(p for p in parts if p)[:length] or "file"
    if extension and not re.search(r"\.[A-Za-z0-9]{1,10}$", path.rsplit("/", 1)[-1]):
        path += extension
    return path


def _tojson(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=False)


@lru_cache(maxsize=1)
def environment() -> ImmutableSandboxedEnvironment:
    env = _BoundedEnvironment(undefined=StrictUndefined, autoescape=False, keep_trailing_newline=True)
    env.filters["tojson"] = _tojson
    env.filters["slug"] = _slug
    env.filters["file_name"] = _file_name
    env.filters = {name: _bounded_filter(name, f) for name, f in env.filters.items()}
    env.globals["range"] = _bounded_range
    return env


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
    return environment().from_string(source)


@lru_cache(maxsize=256)
def compile_expression(source: str) -> Callable[..., Any]:
    """A sandboxed jinja expression (`for_each`, `when`), compiled once per process."""
    return environment().compile_expression(source, undefined_to_none=False)


def render_template(source: str, variables: dict[str, Any], limit: int = MAX_RENDERED_CHARS) -> str:
    """Render with the sandbox and the size limit; every failure is a TemplateFailure."""
    try:
        pieces: list[str] = []
        size = 0
        for piece in _template(source).generate(**variables):
            size += len(piece)
            if size > limit:
                raise TemplateFailure(f"rendered text exceeds the limit of {limit:,} characters")
            pieces.append(piece)
        return "".join(pieces)
    except TemplateFailure:
        raise
    except SecurityError as exc:
        raise TemplateFailure(f"template refused by the sandbox: {exc}", _failing_line(exc)) from None
    except (TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError,
            ZeroDivisionError, OverflowError, RecursionError, MemoryError) as exc:
        raise TemplateFailure(f"template failed: {type(exc).__name__}: {exc}", _failing_line(exc)) from None


def _failing_line(exc: BaseException) -> int:
    """The template line an error comes from: jinja rewrites a render's traceback so that
    template code appears as frames of the file `<template>` at template lines (as Python
    shows source lines); the innermost one is where it failed."""
    line, trace = getattr(exc, "lineno", None) or 0, exc.__traceback__
    while trace is not None:
        if trace.tb_frame.f_code.co_filename == "<template>":
            line = trace.tb_lineno
        trace = trace.tb_next
    return line
