"""Output node `pattern`s, compiled and matched by RE2: in time linear in the answer's length.

An answer is the model's text, and a shared SOP file's pattern is the file author's: with a
backtracking engine (Python's `re`) a pattern such as `(a|a)+$` takes exponential time on a
crafted answer and hangs the run. RE2 never backtracks, so it has no backreferences and no
lookaround; a pattern that uses them is refused when the file is checked (SOP109).

Matching is JSON Schema's `pattern`: a search, unanchored unless the pattern says `^...$`.
Every use of a pattern (the checker, answer validation, the `fake` model, the `local`
grammar) goes through here, so they all agree on what a pattern means.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

__all__ = ["PatternError", "compiled", "problem", "search", "MAX_MEMORY"]


MAX_MEMORY = 8 << 20
"""RE2's memory for one compiled pattern (program and matching cache): a bigger pattern is refused."""


_HINT = "anchor it with ^...$ and escape special characters, e.g. '^[a-z_]+\\.py$'"


_LINEAR_HINT = ("patterns run in linear time (RE2 syntax), so they have no backreferences, "
                "lookaround, atomic groups or possessive quantifiers; rewrite it without them")


_UNSUPPORTED = (
    ("invalid perl operator: (?=", "lookahead `(?=...)`"),
    ("invalid perl operator: (?!", "negative lookahead `(?!...)`"),
    ("invalid perl operator: (?<=", "lookbehind `(?<=...)`"),
    ("invalid perl operator: (?<!", "negative lookbehind `(?<!...)`"),
    ("invalid perl operator: (?>", "an atomic group `(?>...)`"),
    ("invalid perl operator: (?P", "a named backreference `(?P=name)`"),
    ("invalid escape sequence: \\k", "a named backreference `\\k<name>`"),
    ("bad repetition operator: *+", "a possessive quantifier `*+`"),
    ("bad repetition operator: ++", "a possessive quantifier `++`"),
    ("bad repetition operator: ?+", "a possessive quantifier `?+`"),
)
"""RE2's error for a construct that needs backtracking, and the construct in the user's words."""


_OTHER_SPELLING = {
    "\\Z": "write `$` (or `\\z`) for the end of the text",
    "\\u": "write a character by its code point as `\\x{00e9}`",
}
"""Escapes Python's `re` (or JavaScript) takes and RE2 spells otherwise."""


_BACKREFERENCE = re.compile(r"invalid escape sequence: (\\[1-9])")


class PatternError(ValueError):
    """A pattern RE2 cannot run: the message says what is wrong, `hint` how to write it."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.hint = hint


@lru_cache(maxsize=64)
def compiled(pattern: str) -> Any:
    """`pattern` compiled by RE2 (cached: a file's few patterns are matched against every
    answer), or PatternError. At most 64 are kept, each bounded by MAX_MEMORY."""
    import re2  # type: ignore[import-untyped]  # here, not at the top: most commands match no pattern

    options = re2.Options()
    options.max_mem = MAX_MEMORY
    options.log_errors = False  # RE2 would print every refused pattern on stderr
    try:
        return re2.compile(pattern.encode("utf-8"), options)
    except UnicodeEncodeError:
        raise PatternError("`pattern` holds an unpaired surrogate (\\ud800-\\udfff), which is not text",
                           "write the character itself, or a range of whole characters") from None
    except re2.error as exc:
        raise _explained(exc.args[0] if exc.args else exc) from None


def _explained(reason: Any) -> PatternError:
    """RE2's terse error as a message that names the construct and why it is refused."""
    text = reason.decode("utf-8", "replace") if isinstance(reason, bytes) else str(reason)
    construct = next((name for prefix, name in _UNSUPPORTED if text.startswith(prefix)), None)
    backreference = _BACKREFERENCE.match(text)
    if backreference:
        construct = f"a backreference `{backreference.group(1)}`"
    if construct:
        return PatternError(f"`pattern` needs a linear-time regular expression: {construct} is not supported",
                            _LINEAR_HINT)
    escape = next((e for e in _OTHER_SPELLING if text == f"invalid escape sequence: {e}"), None)
    if escape:
        return PatternError(f"`pattern` is not a valid regular expression (RE2 syntax): `{escape}` is not supported",
                            _OTHER_SPELLING[escape])
    if text.startswith("pattern too large"):
        return PatternError("`pattern` is too large for a linear-time regular expression "
                            f"(RE2 needs more than {MAX_MEMORY >> 20} MiB to compile it)",
                            "use smaller repetition counts or fewer alternatives")
    return PatternError(f"`pattern` is not a valid regular expression (RE2 syntax): {text}", _HINT)


def problem(pattern: str) -> PatternError | None:
    """Why RE2 cannot run `pattern`, or None when it can."""
    try:
        compiled(pattern)
    except PatternError as exc:
        return exc
    return None


def search(pattern: str, text: str) -> bool:
    """Whether `text` holds a match of `pattern` (JSON Schema's `pattern`), in linear time.

    Text is matched as UTF-8; an unpaired surrogate (JSON allows `\\ud800`) is passed as its
    bytes, which RE2 reads as an invalid character (only `.` and negated classes match it),
    rather than failing to encode."""
    return compiled(pattern).search(text.encode("utf-8", "surrogatepass")) is not None
