"""The sandboxed jinja2 environment shared by the compiler (static checks) and the runner.

Templates come from shared, untrusted SOP files: they render in an
`ImmutableSandboxedEnvironment` with `StrictUndefined`, and the rendered text is bounded so
that a hostile template (`{{ 'x' * 10**9 }}`, nested loops) fails its action cleanly
instead of eating memory.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any, Callable

from jinja2 import StrictUndefined, Template, TemplateError, meta, nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

__all__ = [
    "MAX_RENDERED_CHARS",
    "TemplateFailure",
    "environment",
    "parse",
    "free_variables",
    "render",
    "compile_expression",
]

MAX_RENDERED_CHARS = 1_000_000
"""Upper bound on one rendered template (prompt, path, artifact content)."""

_MAX_REPEAT = 100_000


class TemplateFailure(Exception):
    """A template could not be parsed or rendered; the message is user-facing."""


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """Refuses `str * n` and `range(n)` that would build huge values before any output check."""

    def call_binop(self, context, operator, left, right):  # type: ignore[override]
        if operator == "*" and isinstance(left, (str, list, int)) and isinstance(right, (str, list, int)):
            seq, count = (left, right) if isinstance(left, (str, list)) else (right, left)
            if isinstance(seq, (str, list)) and isinstance(count, int) and len(seq) * count > MAX_RENDERED_CHARS:
                raise SecurityError("template builds a value larger than the output limit")
        return super().call_binop(context, operator, left, right)


def _tojson(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=False)


@lru_cache(maxsize=1)
def environment() -> ImmutableSandboxedEnvironment:
    env = _BoundedEnvironment(undefined=StrictUndefined, autoescape=False, keep_trailing_newline=True)
    env.intercepted_binops = frozenset({"*"})
    env.filters["tojson"] = _tojson
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


def free_variables(source: str) -> set[str]:
    """Top-level names a template reads (what must be declared)."""
    return set(meta.find_undeclared_variables(parse(source)))


@lru_cache(maxsize=1024)
def _template(source: str) -> Template:
    # Compiling is most of a render's cost (a 20-item fan-out renders 60 templates).
    return environment().from_string(source)


@lru_cache(maxsize=256)
def compile_expression(source: str) -> Callable[..., Any]:
    """A sandboxed jinja expression (`for_each`, `when`), compiled once per process."""
    return environment().compile_expression(source, undefined_to_none=False)


def render(source: str, variables: dict[str, Any], limit: int = MAX_RENDERED_CHARS) -> str:
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
        raise TemplateFailure(f"template refused by the sandbox: {exc}") from None
    except (TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError,
            ZeroDivisionError, OverflowError, RecursionError, MemoryError) as exc:
        raise TemplateFailure(f"template failed: {type(exc).__name__}: {exc}") from None
