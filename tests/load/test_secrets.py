"""The one secret rule (engine/load/secrets.py): which variable names hold a secret, which
text is token-shaped, and `scrub`, the redaction the journal, the pool and the report share."""

from __future__ import annotations

import pytest

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
}


@pytest.mark.parametrize("kind", sorted(TOKENS))
def test_token_shapes_are_redacted_wherever_they_come_from(kind: str) -> None:
    token = TOKENS[kind]
    text = scrub(f"the model wrote: key = '{token}' in config.py", ())
    assert token not in text and REDACTED in text
    assert text.startswith("the model wrote: key = '") and text.endswith("' in config.py")


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


@pytest.mark.parametrize("ordinary", [
    "skateboard_championship_words", "task-management-system-for-teams", "pk_column_name_in_a_table",
    "sk_learn_style_identifier_name", "a risk-free skeleton with xoxo", "ghost_writer_name_here",
    "AKIA is short", "hf_small", "use https://example.com/path?q=1 and mailto:a@b.c",
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
