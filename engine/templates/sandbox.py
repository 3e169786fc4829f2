"""The sandboxed jinja2 environment shared by the checker (parsing) and the run (rendering).

Templates come from shared, untrusted SOP files: they render in an
`ImmutableSandboxedEnvironment` with `StrictUndefined`, and every render is bounded three
ways, so that a hostile template fails its action cleanly, located at its line, instead of
hanging the run or eating memory:

- **Size, before building (here):** every operation that can build a big value in one step
  of C code (`*`, `**`, `+`, `%`, `~`, `center(n)`, format widths, `indent`, `replace`...) is
  refused when its result would pass the output limit. Nothing can interrupt one C call,
  so these checks come first.
- **CPU time and memory, while running** (`engine.templates.render`: the watchdog).
- **Ctrl-C** (`engine.templates.render.stop_renders_on_cancel`).

Templates and expressions are compiled to Python in `engine.templates.code` and rendered in
`engine.templates.render`.
"""

from __future__ import annotations

import itertools
import json
import re
from string import Formatter
from collections.abc import Callable, Iterator
from functools import lru_cache, update_wrapper
from typing import Any

from jinja2 import StrictUndefined, TemplateError, nodes
from jinja2.compiler import CodeGenerator
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError
from jinja2.utils import _PassArg, generate_lorem_ipsum

from engine.templates.filters import FILTERS, GLOBALS

__all__ = ["MAX_RENDERED_CHARS", "TemplateFailure", "environment", "parse"]


MAX_RENDERED_CHARS = 1_000_000
"""Upper bound on one rendered template (prompt, path, artifact content)."""

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
        """`str.format`/`format_map`, as jinja sandboxes them, with the format and its arguments
        checked before it runs: `'{:>1000000000}'.format(x)` allocates the width in one C call,
        and `('{a}' * 999).format(a=big)` repeats a keyword argument (jinja's wrapper is what
        `call` sees, so only here are its arguments known)."""
        sandboxed = super().wrap_str_format(value)
        if sandboxed is None:
            return None
        owner = value.__self__

        def checked(*args: Any, **kwargs: Any) -> Any:
            _check_format(owner, (*args, *kwargs.values()))    # format_map's one dict: its values
            return _check_size(sandboxed(*args, **kwargs))

        return update_wrapper(checked, sandboxed)

    def call(__self, __context, __obj, *args, **kwargs):  # type: ignore[override]  # noqa: N805
        """Method calls (`'x'.center(n)`): sizes checked before the call, the result after."""
        name = getattr(__obj, "__name__", "call")
        _check_arguments(name, args, kwargs)
        owner = getattr(__obj, "__self__", None)
        if isinstance(owner, (str, bytes)):
            _check_method(owner, name, (*args, *kwargs.values()))
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


def _check_format(template: str | bytes, args: tuple[Any, ...]) -> None:
    """`'%999999s' * 9`, `'%(a)999999s'`, `'%.999999f'`, `'{:>999999}'`, `'{:{w}}'`,
    `'%*s' % (10**6, x)`, `'{0}{0}{0}'.format(big)`: the widths and precisions of every
    field, and every field filled with all the arguments, bound what a format builds. Both
    syntaxes are scanned as Python parses them, so no spelling of a width is missed."""
    text = template.decode("latin-1") if isinstance(template, bytes) else template
    if "%" not in text and "{" not in text:
        return
    ints = _int_arguments(args)
    widths = _printf_widths(text, iter(ints)) + _brace_widths(text, max(map(abs, ints), default=0))
    fields = max(text.count("{"), text.count("%"), 1)
    _check_growth(len(text) + widths + fields * sum(_weight(a) for a in args))


def _int_arguments(args: tuple[Any, ...]) -> list[int]:
    """The integers a format may take a `*` or a nested `{w}` width from, in order (a
    mapping's values too: `'%(a)*s'` is an error, but `format_map({'w': n})` is not)."""
    found: list[int] = []
    for arg in args:
        values = arg.values() if isinstance(arg, dict) else (arg,)
        found.extend(v for v in values if _is_int(v))
    return found


_TOO_WIDE = MAX_RENDERED_CHARS + 1
"""What a width of more digits than the limit has counts as (no int() of a huge digit run)."""


def _spec_number(text: str, start: int, star: Iterator[int]) -> tuple[int, int]:
    """The width or precision at `start` (digits, or `*` taken from the arguments), and where
    it ends."""
    if text.startswith("*", start):
        return start + 1, abs(next(star, 0))
    end = start
    while end < len(text) and text[end].isdigit():
        end += 1
    digits = text[start:end]
    if not digits:
        return end, 0
    return end, _TOO_WIDE if len(digits) > 7 else int(digits)


def _printf_widths(text: str, star: Iterator[int]) -> int:
    """The widths and precisions of `%` fields, parsed as CPython parses them: a `(key)` with
    nested parentheses, flags, width, `.precision`."""
    total, at = 0, text.find("%")
    while 0 <= at < len(text) - 1:
        end = at + 1
        if text[end] == "(":
            depth, end = 1, end + 1
            while end < len(text) and depth:
                depth += {"(": 1, ")": -1}.get(text[end], 0)
                end += 1
        while end < len(text) and text[end] in "-+ #0":
            end += 1
        end, width = _spec_number(text, end, star)
        if text.startswith(".", end):
            end, precision = _spec_number(text, end + 1, star)
            width += precision
        total += width
        at = text.find("%", end + 1)     # `end` is the conversion (or the second `%` of `%%`)
    return total


_DIGITS = re.compile(r"\d+")


def _brace_widths(text: str, widest_argument: int) -> int:
    """The widths and precisions of `{}` fields (`{:>10.5}`: every digit run of a format spec
    counts), a nested `{w}` counting as the widest integer argument."""
    if "{" not in text:
        return 0
    total = 0
    try:
        for _, field, spec, _ in Formatter().parse(text):
            if field is None or not spec:
                continue
            total += spec.count("{") * widest_argument
            total += sum(_TOO_WIDE if len(d) > 7 else int(d) for d in _DIGITS.findall(spec))
    except ValueError:        # not a valid format: `format` itself says why, building nothing
        return 0
    return total


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


_SELECTING = frozenset({"first", "last", "default", "d", "where"})
"""Filters whose result is one of their arguments, or a list of the rows of one (`where`):
they build nothing that could outgrow the limit, so their result is not weighed (walking a
selected row, or the rows, was most of what the check cost in a fan-out's prompt)."""


def _bounded_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """A filter whose size arguments are checked before it runs and whose result after
    (unless it only selects: `_SELECTING`)."""
    grows = _FILTER_GROWTH.get(name)
    skip = 0 if _PassArg.from_obj(func) is None else 1   # jinja's context/environment comes first
    result_check = _check_size if name not in _SELECTING else _as_it_is

    def bounded(*args: Any, **kwargs: Any) -> Any:
        _check_arguments(name, args, kwargs)
        if grows is not None:
            grows(list(args[skip:]), kwargs)
        return result_check(func(*args, **kwargs))

    # jinja's pass_context/pass_eval_ctx marks are attributes: copied, they tell jinja what
    # to pass first (cheaper than `functools.wraps`, for 54 filters in every new process)
    bounded.__dict__.update(getattr(func, "__dict__", {}))
    bounded.__name__ = bounded.__qualname__ = getattr(func, "__name__", name)
    bounded.__wrapped__ = func  # type: ignore[attr-defined]
    return bounded


def _as_it_is(value: Any) -> Any:
    return value


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
    index = _where_index(rows, key) if len(rows) >= _INDEX_FROM else None
    if index is None or not all(isinstance(v, _HASHABLE) for v in wanted):
        return [row for row in rows if _has_cell(row, key) and row[key] in wanted]
    found = sorted({i for v in wanted for i in index.get(v, ())})
    return [rows[i] for i in found]


_INDEX_FROM = 32
"""From this many rows, `where` looks values up in an index of the list instead of scanning
it: a for_each over N files that picks each file's row from an N-row list would otherwise
cost N x N (a 1,000-file design: a million comparisons per action)."""

_HASHABLE = (str, int, float, bool, type(None))
_WHERE_INDEXES: dict[tuple[int, Any], tuple[Any, int, dict[Any, list[int]] | None]] = {}


def _where_index(rows: Any, key: Any) -> dict[Any, list[int]] | None:
    """The rows' positions by their `key` cell, built once per list (the same list object, a
    message's answer, for every item of a fan-out; it is kept referenced, so its id is not
    another's); None where a cell is not a plain value (then `where` scans)."""
    if not isinstance(key, _HASHABLE):
        return None
    entry = _WHERE_INDEXES.get((id(rows), key))
    if entry is not None and entry[0] is rows and entry[1] == len(rows):
        return entry[2]
    index: dict[Any, list[int]] = {}
    plain = True
    for position, row in enumerate(rows):
        if not _has_cell(row, key):
            continue
        cell = row[key]
        if not isinstance(cell, _HASHABLE):
            plain = False
            break
        index.setdefault(cell, []).append(position)
    if len(_WHERE_INDEXES) >= 256:
        _WHERE_INDEXES.clear()
    _WHERE_INDEXES[(id(rows), key)] = (rows, len(rows), index if plain else None)
    return index if plain else None


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _about(diagram: Any, files: Any, whole_below: int = 3000) -> str:
    """`{{ diagram | about([filename] + imports) }}`: the lines of a mermaid diagram (a class
    diagram, a call flow) that name one of `files`' modules or classes (`game_logic.py`:
    game_logic, GameLogic, in any case), a class block whole, the header line first; the whole
    diagram when shorter than `whole_below` characters. What a file's prompt quotes when the
    design leaves out its optional per-file rows: its own part, not the whole diagram, so the
    prompts of a run stay linear in files."""
    text = "" if diagram is None else str(diagram)
    if len(text) < whole_below:
        return text
    wanted = {_module_key(f) for f in (files if isinstance(files, (list, tuple)) else [files])}
    lines, kept, block = text.splitlines(), [], False
    for index, line in enumerate(lines):
        named = any(_module_key(word) in wanted for word in _IDENTIFIER.findall(line))
        if index == 0 or block or named:
            kept.append(line)
        if named and line.rstrip().endswith("{"):
            block = True
        elif block and line.strip() == "}":
            block = False
    if len(kept) <= 1 < len(lines):
        kept.append(f"    %% the design names nothing of {', '.join(map(str, files))} here "
                    f"({len(lines) - 1} lines not shown)")
    return "\n".join(kept)


def _module_key(name: Any) -> str:
    """A module or class name compared loosely: `pkg/game_logic.py`, GameLogic -> gamelogic."""
    stem = str(name).rsplit("/", 1)[-1]
    stem = stem[:-3] if stem.endswith(".py") else stem
    return stem.replace("_", "").lower()


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
    env.filters.update(FILTERS)   # JSON, RE2, zip, enumerate, seeded shuffle and choice
    env.filters["random"] = FILTERS["choice"]   # jinja's own is unseeded: a resume would pick again
    env.filters["about"] = _about
    env.filters = {name: _bounded_filter(name, f) for name, f in env.filters.items()}
    env.globals["range"] = _bounded_range
    env.globals["lipsum"] = _bounded_lipsum
    env.globals.update(GLOBALS)
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
