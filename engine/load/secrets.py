"""What counts as a secret: the one rule shared by the checker, exec and the journal.

A variable whose *name* looks like a key (`OPENAI_API_KEY`, `OPENAI_KEY`, `GITHUB_PAT`,
`ANTHROPIC_AUTH`, `STRIPE_SK`, `SLACK_WEBHOOK_URL`, `SENTRY_DSN`, `*_TOKEN`, `*_SECRET`,
`*_PASSWORD`, `*_CREDENTIALS`, ...; `SECRET_NAMES_TESTED` in the tests is the list) holds a
secret, and so does the password of any URL written `scheme://user:password@host` (a
`DATABASE_URL` carries one whatever its variable is called), and so does any text shaped like
a well-known token (an OpenAI, Anthropic, Stripe, Slack, GitHub, GitLab, AWS, Google or
Hugging Face key, a Slack webhook's path, a PEM private key), whatever variable it came from.
Exec children never get such variables unless an action names them (and the checker warns
when it does). `scrub` is the one redaction: the journal, the experience pool, `sopctl
report` and the hosted models' error messages all call it. Lives in the lowest layer that
needs it (the checker), so every layer above can share it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping

__all__ = ["REDACTED", "is_secret_name", "secret_values", "scrub"]


REDACTED = "[REDACTED]"


_SECRET_NAME = re.compile(
    r"API_?KEY|TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|ACCESS_KEY|PRIVATE_?KEY"
    r"|WEBHOOK|AUTHORIZATION|CONNECTION_?STRING|SIGNING_?KEY|AUTH_?KEY"
    # short words only as the last part of a name: OPENAI_KEY, GITHUB_PAT, ANTHROPIC_AUTH,
    # DB_PASS, SENTRY_DSN, but not MONKEY, COMPAT, AUTHOR or TASK; PWD and SK only after a
    # prefix (MYSQL_PWD, STRIPE_SK): PWD alone is the shell's current folder
    r"|(?:^|[_.-])(?:KEY|PAT|AUTH|PASS|DSN|JWT|COOKIE)S?$|[_.-](?:PWD|SK)$", re.I)


_TOKEN_SHAPES = re.compile(
    # Each a fixed prefix then a run of token characters with no condition after it, so a
    # failed try costs the prefix only and a match consumes its run: linear on any text.
    # A word's start, or just after a JSON escape: the journal scrubs JSON, where a key on a
    # line of its own follows `\n` (a backslash and an n, so no word boundary before it).
    r"(?:\b|(?<=\\[nrtbf])|(?<=\\u[0-9a-fA-F]{4}))"
    r"(?:sk-(?:proj-|ant-|svcacct-)?[A-Za-z0-9_-]{20,}"        # OpenAI, Anthropic
    r"|(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}|whsec_[A-Za-z0-9]{20,}"   # Stripe
    r"|xox[abeoprs]-[A-Za-z0-9-]{10,}|xapp-[A-Za-z0-9-]{10,}"     # Slack
    r"|gh[opsuir]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}"  # GitHub
    r"|glpat-[A-Za-z0-9_-]{20,}"                                  # GitLab
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}"                                 # AWS access key id
    r"|AIza[0-9A-Za-z_-]{30,}"                                    # Google
    r"|hf_[A-Za-z0-9]{30,}|gsk_[A-Za-z0-9]{30,}|xai-[A-Za-z0-9]{30,}|npm_[A-Za-z0-9]{30,}"
    r"|eyJ[A-Za-z0-9_.=-]{30,}"                                   # a JWT (its dots in the run)
    r"|Bearer [A-Za-z0-9._~+/=-]{20,}"                            # an Authorization header's
    r"|ya29\.[A-Za-z0-9_-]{20,}"                                  # Google OAuth access token
    r"|SG\.[A-Za-z0-9_.-]{40,}"                                   # SendGrid
    r"|do[opr]_v1_[a-f0-9]{32,}"                                  # DigitalOcean
    r"|sq0(?:atp|csp)-[A-Za-z0-9_-]{20,}|shp(?:at|ss|ca|pa)_[a-fA-F0-9]{20,}"  # Square, Shopify
    r"|pypi-AgE[A-Za-z0-9_-]{30,})"                               # PyPI upload token
    r"|(?<=discord\.com/api/webhooks/)[0-9A-Za-z/_-]{20,}"        # webhook path (id and token)
    r"|(?<=discordapp\.com/api/webhooks/)[0-9A-Za-z/_-]{20,}"
    r"|(?<=hooks\.slack\.com/)(?:services|workflows|triggers)/[A-Za-z0-9/_-]{10,}"  # webhook path
    r"|-----BEGIN [A-Z ]{0,32}PRIVATE KEY-----[A-Za-z0-9+/=\s]{0,16384}")

_WORD_PREFIXES = (
    "sk-", "sk_", "rk_", "whsec_", "xox", "xapp-", "ghp_", "gho_", "ghs_", "ghu_", "ghi_", "ghr_",
    "github_pat_", "glpat-", "AKIA", "ASIA", "AIza", "hf_", "gsk_", "xai-", "npm_", "eyJ", "Bearer ",
    "ya29.", "SG.", "doo_v1_", "dop_v1_", "dor_v1_", "sq0", "shp", "pypi-AgE")
"""The prefixes of `_TOKEN_SHAPES`' alternatives that must begin a word (its `\b`)."""

_ANYWHERE_PREFIXES = ("/api/webhooks/", "hooks.slack.com/", "-----BEGIN ")
"""The prefixes of its other alternatives, wherever they are."""


def _may_hold_token(text: str) -> bool:
    """Whether `text` holds the beginning of one of `_TOKEN_SHAPES`' alternatives where it
    can match: a few substring scans, many times faster than the pattern's own scan (which
    tries every alternative at every position), and almost no text the journal keeps has a
    token. A word prefix inside a word does not count (`task_id` holds `sk_`; the pattern
    wants a word boundary before it): every step of a tool loop journals `task_id`s. Linear:
    each scan resumes after the last find. A new shape needs its prefix here (and an example
    in tests/load/test_secrets.py's TOKENS)."""
    if any(prefix in text for prefix in _ANYWHERE_PREFIXES):
        return True
    for prefix in _WORD_PREFIXES:
        at = text.find(prefix)
        while at >= 0:
            if at == 0 or not (text[at - 1].isalnum() or text[at - 1] == "_") or _after_escape(text, at):
                return True
            at = text.find(prefix, at + 1)
    return False


_ESCAPED = re.compile(r"\\[nrtbf]|\\u[0-9a-fA-F]{4}")


def _after_escape(text: str, at: int) -> bool:
    """Whether `at` follows a JSON escape (`\\n`, `\\u001b`): a word starts there in the text
    the JSON holds, though the escape's last character is a letter or digit."""
    return bool(_ESCAPED.fullmatch(text, max(at - 2, 0), at) or _ESCAPED.fullmatch(text, max(at - 6, 0), at))


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


def scrub(text: str, secrets: tuple[str, ...] | None = None, mark: str = REDACTED) -> str:
    """`text` with every value of `secrets` (default: this environment's, `secret_values()`),
    every URL password and every token-shaped text replaced by `mark`: the one redaction."""
    for value in secret_values() if secrets is None else secrets:
        if value in text:
            text = text.replace(value, mark)
    if _may_hold_token(text):
        text = _TOKEN_SHAPES.sub(mark, text)
    if "://" not in text:  # the common case costs one scan
        return text
    return _URL_PASSWORD.sub(lambda m: m.group("head") + mark, text)
