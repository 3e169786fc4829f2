"""What counts as a secret: the one rule shared by the checker, exec and the journal.

A variable whose *name* looks like a key (`OPENAI_API_KEY`, `OPENAI_KEY`, `GITHUB_PAT`,
`ANTHROPIC_AUTH`, `*_TOKEN`, `*_SECRET`, `*_PASSWORD`, `*_CREDENTIALS`, ...) holds a secret,
and so does the password of any URL written `scheme://user:password@host` (a `DATABASE_URL`
carries one whatever its variable is called). Exec children never get such variables unless
an action names them (and the checker warns when it does); the journal never stores them in
clear. Lives in the lowest layer that needs it (the checker), so every layer above can share it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping

__all__ = ["REDACTED", "is_secret_name", "secret_values", "scrub"]


REDACTED = "[REDACTED]"


_SECRET_NAME = re.compile(
    r"API_?KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|ACCESS_KEY"
    # short words only as the last part of a name: OPENAI_KEY, GITHUB_PAT, ANTHROPIC_AUTH,
    # DB_PASS, but not MONKEY, COMPAT or AUTHOR
    r"|(?:^|[_.-])(?:KEY|PAT|AUTH|PASS)S?$", re.I)


_URL_PASSWORD = re.compile(
    # bounded parts, a user without ':' and a lookahead for '@': linear time on any text
    # (a model's answer or a command's output is an attacker's choice)
    r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]{0,31}://[^\s/:@'\"\\<>]{0,256}:)"
    r"(?P<password>[^\s/@'\"\\<>]{1,256})(?=@)")


_MIN_SECRET_LEN = 8
"""Shorter values are not replaced wherever they occur: that would mangle ordinary text."""


def is_secret_name(name: str) -> bool:
    """An environment variable that holds a key: never journaled, never given to commands."""
    return bool(_SECRET_NAME.search(name))


def secret_values(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Secret values of the environment (secret-named variables, URL passwords), longest first,
    each also as it appears inside JSON text (quotes, backslashes, control characters escaped)."""
    env = os.environ if environ is None else environ
    found = {v for k, v in env.items() if is_secret_name(k)}
    found |= {m.group("password") for v in env.values() for m in _URL_PASSWORD.finditer(v)}
    found = {v for v in found if len(v) >= _MIN_SECRET_LEN}
    found |= {json.dumps(v, ensure_ascii=False)[1:-1] for v in found}
    return tuple(sorted(found, key=len, reverse=True))


def scrub(text: str, secrets: tuple[str, ...], mark: str = REDACTED) -> str:
    """`text` with every value of `secrets` and every URL password replaced by `mark`."""
    for value in secrets:
        if value in text:
            text = text.replace(value, mark)
    if "://" not in text:  # the common case costs one scan
        return text
    return _URL_PASSWORD.sub(lambda m: m.group("head") + mark, text)
