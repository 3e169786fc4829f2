"""The one secret rule (engine/load/secrets.py): which variable names hold a secret, which
text is token-shaped, and `scrub`, the redaction the journal, the pool and the report share."""

from __future__ import annotations

import json
import random

import pytest

from engine.load import secrets
from engine.load.secrets import REDACTED, is_secret_name, scrub, secret_values

SECRET_NAMES_TESTED = (
    "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_KEY", "GEMINI_APIKEY", "GITHUB_PAT", "GITHUB_TOKEN",
    "GH_TOKEN", "GITLAB_TOKEN", "HF_TOKEN", "HUGGINGFACE_HUB_TOKEN", "ANTHROPIC_AUTH", "DB_PASS",
    "DB_PASSWORD", "MYSQL_PWD", "PGPASSWORD", "REDIS_PASSWD", "GPG_PASSPHRASE", "AWS_SECRET_ACCESS_KEY",
    "AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN", "AZURE_CLIENT_SECRET", "GOOGLE_APPLICATION_CREDENTIALS",
    "STRIPE_SK", "STRIPE_SECRET_KEY", "STRIPE_WEBHOOK_SECRET", "SLACK_WEBHOOK_URL", "SLACK_BOT_TOKEN",
    "DISCORD_WEBHOOK", "SENTRY_DSN", "JWT_SIGNING_KEY", "SESSION_JWT", "SSH_PRIVATE_KEY",
    "TLS_PRIVATEKEY", "HTTP_AUTHORIZATION", "SESSION_COOKIE", "AZURE_STORAGE_CONNECTION_STRING",
    "NPM_AUTH", "TWILIO_AUTH_TOKEN", "SENDGRID_API_KEY", "datadog.api.key", "my-service-secret",
    "TAILSCALE_AUTHKEY", "NGROK_AUTHTOKEN", "DD_APP_KEY", "CLOUDFLARE_API_TOKEN", "VAULT_TOKEN",
    "POSTGRES_PASSWORD", "MINIO_SECRET_KEY", "RABBITMQ_DEFAULT_PASS", "DJANGO_SECRET_KEY",
    "RAILS_MASTER_KEY", "NEW_RELIC_LICENSE_KEY", "TEAMS_WEBHOOK_URL", "TWINE_PASSWORD",
    "AIRTABLE_PAT", "ZOOM_JWT", "ARM_CLIENT_SECRET", "OP_SERVICE_ACCOUNT_TOKEN",
)
"""Names `is_secret_name` must catch: exec children never get them, the journal never keeps
their values."""

ORDINARY_NAMES = ("PATH", "HOME", "LANG", "TERM", "MONKEY", "COMPAT", "AUTHOR", "TASK", "DESK",
                  "PASSAGE", "KEYBOARD", "PYTHONPATH", "VIRTUAL_ENV", "DISPLAY", "EDITOR",
                  "LC_ALL", "SOPCTL_POOL", "CI", "SHELL", "COOKIECUTTER_CONFIG", "TASKS_DIR",
                  "RISK_LEVEL", "MY_DISK", "PWD", "OLDPWD", "SK", "USER", "LOGNAME", "HOSTNAME",
                  "XDG_RUNTIME_DIR", "SSH_TTY")


@pytest.mark.parametrize("name", SECRET_NAMES_TESTED)
def test_common_secret_names_are_secret(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ORDINARY_NAMES)
def test_ordinary_names_are_not(name: str) -> None:
    assert not is_secret_name(name)


TOKENS = {
    "openai": "sk-proj-AbCdEf0123456789AbCdEf0123456789",
    "openai legacy": "sk-AbCdEf0123456789AbCdEf0123",
    "anthropic": "sk-ant-api03-AbCdEf0123456789_AbCdEf-0123456789",
    "stripe secret": "sk_live_51AbCdEf0123456789AbCd",
    "stripe restricted": "rk_test_51AbCdEf0123456789AbCd",
    "stripe webhook": "whsec_AbCdEf0123456789AbCdEf0123",
    "slack bot": "xoxb-123456789012-123456789012-AbCdEf0123456789",
    "slack app": "xapp-1-A0123456789-0123456789012-abcdef",
    "github classic": "ghp_AbCdEf0123456789AbCdEf0123456789AbCd",
    "github fine-grained": "github_pat_11AbCdEf0123456789_AbCdEf0123456789AbCdEf0123",
    "gitlab": "glpat-AbCdEf0123456789AbCd",
    "aws key id": "AKIAIOSFODNN7EXAMPLE",
    "google": "AIzaSyAbCdEf0123456789AbCdEf0123456789",
    "hugging face": "hf_AbCdEf0123456789AbCdEf0123456789",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "bearer header": "Bearer AbCdEf0123456789AbCdEf0123456789",
    "google oauth": "ya29.a0AfH6SMBAbCdEf0123456789AbCdEf",
    "sendgrid": "SG.AbCdEf0123456789AbCdEf.AbCdEf0123456789AbCdEf0123456789AbCdEf01",
    "digitalocean": "dop_v1_0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    "square": "sq0atp-AbCdEf0123456789AbCdEf",
    "shopify": "shpat_0123456789abcdef0123456789abcdef",
    "pypi": "pypi-AgEIcHlwaS5vcmcCJGFiY2RlZmdoLWlqa2wtbW5vcC1xcnN0dXZ3eHl6",
}


def test_the_prefilter_never_misses_a_token_the_pattern_finds() -> None:
    """The substring prefilter skips the pattern's scan for most texts; it must say yes to every
    text the pattern would change: tokens glued to words, at the start, after punctuation or a
    non-ASCII letter, shuffled with the words (`task_id`) that hold a prefix inside them."""
    rng = random.Random(28)
    pieces = [*TOKENS.values(), "task_id", "risk_", "desk-", "ask_", "a", "é", "_", "-", " ", "\n", "\t", "\x1b",
              "(", "'", "=", "/", "https://hooks.slack.com/", "discord.com/api/webhooks/"]
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 6)))
        for form in (text, json.dumps(text, ensure_ascii=False), json.dumps(text)):   # as journaled too
            if secrets._TOKEN_SHAPES.search(form):
                assert secrets._may_hold_token(form), form
    assert not secrets._may_hold_token('{"task_id": "3", "instruction": "risk_free desk-top"}')


@pytest.mark.parametrize("kind", sorted(TOKENS))
def test_token_shapes_are_redacted_wherever_they_come_from(kind: str) -> None:
    token = TOKENS[kind]
    text = scrub(f"the model wrote: key = '{token}' in config.py", ())
    assert token not in text and REDACTED in text
    assert text.startswith("the model wrote: key = '") and text.endswith("' in config.py")


@pytest.mark.parametrize("kind", sorted(TOKENS))
@pytest.mark.parametrize("before", ["\n", "\t", "\r", "\x1b", "line one\n"])
def test_a_token_after_a_json_escape_is_redacted_in_the_json(kind: str, before: str) -> None:
    """The journal scrubs JSON (exchanges, events): a key on a line of its own follows `\\n`,
    a backslash and a letter, where the text itself has a word's start."""
    token = TOKENS[kind]
    text = scrub(json.dumps({"content": f"{before}{token}\nnext line"}, ensure_ascii=False), ())
    assert token not in text and REDACTED in text and text.endswith('\\nnext line"}')
    assert secrets._may_hold_token(json.dumps(f"{before}{token}"))


def test_a_slack_webhook_keeps_its_host_and_loses_its_path() -> None:
    url = "https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX"
    text = scrub(f"post to {url} now", ())
    assert "T00000000" not in text and "XXXXXXXX" not in text
    assert text == f"post to https://hooks.slack.com/{REDACTED} now"


def test_a_pem_private_key_is_redacted() -> None:
    pem = ("-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAxyz0123456789abcdef+/=\n"
           "AbCdEf0123456789AbCdEf0123456789==\n-----END RSA PRIVATE KEY-----")
    text = scrub(f"key:\n{pem}\n", ())
    assert "MIIEow" not in text and "AbCdEf0123" not in text and REDACTED in text


def test_a_discord_webhook_keeps_its_host_and_loses_its_id_and_token() -> None:
    url = "https://discord.com/api/webhooks/123456789012345678/AbCdEf0123456789-AbCdEf0123456789"
    text = scrub(f"post to {url} now", ())
    assert "123456789012345678" not in text and "AbCdEf" not in text
    assert text == f"post to https://discord.com/api/webhooks/{REDACTED} now"


@pytest.mark.parametrize("hostile", ["eyJa-" * 20_000, "eyJ" + "a." * 40_000 + "!",
                                     "Bearer " * 20_000, "SG." * 30_000])
def test_the_new_token_shapes_stay_linear_on_hostile_text(hostile: str) -> None:
    """Prefixes repeated without end: each failed try costs its prefix, a match consumes its
    run (a quadratic shape would take minutes on these; the suite would time out)."""
    assert len(scrub(hostile, ())) <= len(hostile)


@pytest.mark.parametrize("ordinary", [
    "skateboard_championship_words", "task-management-system-for-teams", "pk_column_name_in_a_table",
    "sk_learn_style_identifier_name", "a risk-free skeleton with xoxo", "ghost_writer_name_here",
    "AKIA is short", "hf_small", "use https://example.com/path?q=1 and mailto:a@b.c",
    "the Bearer of bad news", "eyJ is how base64 of {\" starts", "SG.1 is a section number",
    "sq0 and shpat are prefixes", "dop_v1_ is a prefix",
])
def test_ordinary_text_is_left_alone(ordinary: str) -> None:
    assert scrub(ordinary, ()) == ordinary


def test_values_of_secret_named_variables_and_url_passwords(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRIPE_SK", "plain-stripe-value-01")
    monkeypatch.setenv("SLACK_WEBHOOK_URL", "https://hooks.example.com/T1/B2/secretpath9")
    monkeypatch.setenv("DATABASE_URL", "postgres://app:hunter2-long@db:5432/app")
    found = secret_values()
    assert "plain-stripe-value-01" in found and "https://hooks.example.com/T1/B2/secretpath9" in found
    text = scrub("a plain-stripe-value-01 b https://hooks.example.com/T1/B2/secretpath9 "
                 "c postgres://app:hunter2-long@db:5432/app")           # the environment's, by default
    assert "plain-stripe-value-01" not in text and "secretpath9" not in text
    assert "hunter2-long" not in text and "postgres://app:[REDACTED]@db" in text


def test_a_huge_hostile_text_is_scrubbed_in_one_pass() -> None:
    """Prefixes over and over, none completing a token: every pattern is a prefix and a run
    with nothing required after it, so this is one linear pass (a backtracking pattern would
    take minutes here)."""
    hostile = ("sk-" * 100_000 + "eyJ" * 100_000 + "xoxb-" * 50_000 + "-----BEGIN PRIVATE KEY-----" * 5_000
               + "hooks.slack.com/" * 20_000 + "a://b:" * 50_000)
    assert len(scrub(hostile, ())) > 0
