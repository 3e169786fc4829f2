"""A short string that matches a regular expression: how `fake` answers an output node's `pattern`.

The pattern is parsed by Python's own regular-expression parser (`re._parser`, which reads
the RE2 syntax an SOP may use) and its parse tree is walked: the first branch of each
alternative, each repetition at its minimum (at least once where it may be), the first
character of each class (shifted by `variant`, so that list items differ). The caller checks
the result against the pattern, so an unusual construct (a lookaround, `\\b`) costs only a
fallback, never a wrong answer.
"""

from __future__ import annotations

import re
from typing import Any

try:  # Python's own regular-expression parser: `re._parser` from 3.11 on, `sre_parse` before
    from re import _constants as c  # type: ignore[attr-defined]
    from re import _parser  # type: ignore[attr-defined]
except ImportError:  # Python 3.10
    import sre_constants as c  # type: ignore[no-redef]
    import sre_parse as _parser  # type: ignore[no-redef]

__all__ = ["text_matching"]


_MAX_REPEAT = 64
"""Repetitions are generated at their minimum, but never more than this many times."""


_OUTSIDE_CLASS = "axzAXZ09_- "
"""Characters tried for a negated class (`[^...]`) or `.`: the first one the class allows."""


def text_matching(pattern: str, variant: int = 0) -> str | None:
    """A string `pattern` matches, or None when the generator cannot make one."""
    try:
        tree = _parser.parse(pattern)
        text = _walk(tree, variant, {})
        return text if re.search(pattern, text) else None
    except (re.error, RecursionError, ValueError, TypeError, KeyError, OverflowError):
        return None


def _walk(items: Any, variant: int, groups: dict[int, str]) -> str:
    return "".join(_node(op, av, variant, groups) for op, av in items)


def _node(op: Any, av: Any, variant: int, groups: dict[int, str]) -> str:
    if op is c.LITERAL:
        return chr(av)
    if op is c.NOT_LITERAL:
        return next(ch for ch in _OUTSIDE_CLASS if ord(ch) != av)
    if op is c.ANY:
        return _OUTSIDE_CLASS[variant % 3]
    if op is c.IN:
        return _in_class(av, variant)
    if op in (c.MAX_REPEAT, c.MIN_REPEAT, getattr(c, "POSSESSIVE_REPEAT", None)):
        low, high, sub = av
        count = min(max(low, 1 if high else 0), _MAX_REPEAT)
        return "".join(_walk(sub, variant, groups) for _ in range(count))
    if op is c.SUBPATTERN:
        group, _, _, sub = av
        text = _walk(sub, variant, groups)
        if group is not None:
            groups[group] = text
        return text
    if op is c.BRANCH:
        return _walk(av[1][0], variant, groups)
    if op is c.GROUPREF:
        return groups.get(av, "")
    if op is c.CATEGORY:
        return _category(av, variant)
    return ""  # anchors (^, $, \A, \z), boundaries and lookarounds take no characters


def _in_class(items: list[tuple[Any, Any]], variant: int) -> str:
    if items and items[0][0] is c.NEGATE:
        refused = items[1:]
        return next(ch for ch in _OUTSIDE_CLASS if not any(_in(ch, op, av) for op, av in refused))
    op, av = items[0]
    if op is c.RANGE:
        low, high = av
        return chr(low + variant % (high - low + 1))
    if op is c.CATEGORY:
        return _category(av, variant)
    return chr(av)


def _in(ch: str, op: Any, av: Any) -> bool:
    if op is c.LITERAL:
        return ord(ch) == av
    if op is c.RANGE:
        return av[0] <= ord(ch) <= av[1]
    if op is c.CATEGORY:
        return re.fullmatch(_CATEGORY_RE.get(str(av), "(?!)"), ch) is not None
    return False


_CATEGORY_RE = {"CATEGORY_DIGIT": r"\d", "CATEGORY_NOT_DIGIT": r"\D", "CATEGORY_SPACE": r"\s",
                "CATEGORY_NOT_SPACE": r"\S", "CATEGORY_WORD": r"\w", "CATEGORY_NOT_WORD": r"\W"}


_CATEGORY_TEXT = {"CATEGORY_DIGIT": "0123456789", "CATEGORY_NOT_DIGIT": "abc", "CATEGORY_SPACE": " ",
                  "CATEGORY_NOT_SPACE": "abc", "CATEGORY_WORD": "abc", "CATEGORY_NOT_WORD": "-"}


def _category(ch_class: Any, variant: int = 0) -> str:
    chars = _CATEGORY_TEXT.get(str(ch_class), "")
    return chars[variant % len(chars)] if chars else ""
