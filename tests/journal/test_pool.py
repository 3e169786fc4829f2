"""The experience pool (`--pool`, `$SOPCTL_POOL`, `sopctl pool`): accepted answers across runs,
an exact hit reused with no model call (journaled and shown), a near hit offered as an
example, entries scored and pruned, and a corrupt pool file reported, never trusted."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from engine import api
from engine.cli.commands import main as sopctl
from engine.errors import PoolError
from engine.journal.pool import Pool
from engine.journal.store import Journal
from engine.testing import ScriptedModel, use_model
from engine.cli.report import format_show
from engine.journal.history import read_run

SOP = """\
apiVersion: sop/v1
name: pooled
inputs:
  idea: {type: str, required: true}
actions:
  Draft:
    prompt: "Write a short title for a page about {{ inputs.idea }}, in the house style."
    context: none
    output:
      Title: {type: str, instruction: a title}
roles:
  Writer:
    actions: [Draft]
    watch: [UserRequirement]
"""


def _run(tmp_path: Path, name: str, idea: str, pool: Pool, answer: str = '{"Title": "Tea time"}') -> tuple[Any, ScriptedModel]:
    path = tmp_path / "s.sop.yaml"
    path.write_text(SOP, encoding="utf-8")
    model = ScriptedModel(lambda spec, attempt: answer)
    with use_model(model):
        result = api.run(api.load(path), {"idea": idea}, api.RunOptions(workspace=tmp_path / name, pool=pool))
    assert result.status == "idle", result.error
    return result, model


def _logs(workspace: Path) -> list[str]:
    with Journal.open(workspace) as journal:
        return [e.data["message"] for e in journal.events() if e.type == "RunLog"]


def test_an_exact_hit_is_reused_with_no_call_journaled_and_shown(tmp_path: Path) -> None:
    pool = Pool.open(tmp_path / "pool.db")
    first, model = _run(tmp_path, "one", "tea", pool)
    assert model.calls == 1 and first.usage.reused_calls == 0
    second, model = _run(tmp_path, "two", "tea", pool, answer='{"Title": "never asked"}')
    assert model.calls == 0 and second.usage.reused_calls == 1
    assert second.messages[-1].out == {"Title": "Tea time"}
    assert any("reused from the experience pool" in m for m in _logs(tmp_path / "two"))
    shown = format_show(read_run(tmp_path / "two"))          # `sopctl show` says so too
    assert "notice: " in shown and "reused from the experience pool" in shown
    assert pool.entries()[0].uses == 1 and pool.entries()[0].score == 2
    with use_model(ScriptedModel([])):             # the reused answer is in the run's journal
        replayed = api.replay(tmp_path / "two", tmp_path / "again")
    assert not replayed.diverged and replayed.result.messages[-1].out == {"Title": "Tea time"}


def test_a_near_hit_is_offered_to_the_model_as_an_example(tmp_path: Path) -> None:
    pool = Pool.open(tmp_path / "pool.db", threshold=0.6)
    _run(tmp_path, "one", "green tea", pool)
    _, model = _run(tmp_path, "two", "black tea", pool, answer='{"Title": "Black tea"}')
    assert model.calls == 1
    assert "## Example" in model.prompts()[0] and "Tea time" in model.prompts()[0]
    assert any("offered to the model as an example" in m for m in _logs(tmp_path / "two"))
    assert len(pool.entries()) == 2               # the new accepted answer joined the pool


def test_an_unrelated_request_gets_no_example(tmp_path: Path) -> None:
    pool = Pool.open(tmp_path / "pool.db")
    _run(tmp_path, "one", "tea", pool)
    _, model = _run(tmp_path, "two", "the history of the steam engine in Britain", pool)
    assert "## Example" not in model.prompts()[0]


def test_a_pooled_answer_that_no_longer_fits_is_never_accepted(tmp_path: Path) -> None:
    pool = Pool.open(tmp_path / "pool.db")
    _run(tmp_path, "one", "tea", pool, answer='{"Title": "ok"}')
    pool.db.execute("UPDATE experience SET answer = 'not json at all'")
    second, model = _run(tmp_path, "two", "tea", pool, answer='{"Title": "fresh"}')
    assert model.calls == 1 and second.messages[-1].out == {"Title": "fresh"}


@pytest.mark.parametrize("content", [b"garbage, not a database", b"SQLite format 3\x00" + b"\x00" * 200])
def test_a_corrupt_pool_file_is_reported_not_trusted(tmp_path: Path, content: bytes) -> None:
    bad = tmp_path / "pool.db"
    bad.write_bytes(content)
    with pytest.raises(PoolError, match="pool.db"):
        Pool.open(bad)


def test_another_programs_database_is_not_a_pool(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE t (x)")
    with pytest.raises(PoolError, match="not an experience pool"):
        Pool.open(other)


def test_cli_refuses_a_corrupt_pool_before_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.db").write_text("garbage")
    (tmp_path / "s.sop.yaml").write_text(SOP, encoding="utf-8")
    code = sopctl(["run", str(tmp_path / "s.sop.yaml"), "--idea", "tea", "--model", "fake",
                   "--out", str(tmp_path / "ws"), "--pool", str(tmp_path / "bad.db")])
    assert code == 2
    assert "experience pool" in capsys.readouterr().err and not (tmp_path / "ws").exists()


def test_pool_list_clear_prune(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    pool = Pool.open(tmp_path / "pool.db")
    for i in range(3):
        pool.add("Draft", f"k{i}", "sig", f"prompt {i}", f"answer {i}")
    pool.reused(pool.exact("Draft", "k2"))        # the one that earned its place
    monkeypatch.setenv("SOPCTL_POOL", str(tmp_path / "pool.db"))
    assert sopctl(["pool", "list"]) == 0 and "3 entries" in capsys.readouterr().out
    assert sopctl(["pool", "prune", "--keep", "1"]) == 0
    assert [e.key for e in pool.entries()] == ["k2"]
    assert sopctl(["pool", "prune"]) == 2          # says what it needs
    assert sopctl(["pool", "clear"]) == 0 and pool.entries() == []
    monkeypatch.delenv("SOPCTL_POOL")
    assert sopctl(["pool", "list"]) == 2           # no pool named


def test_the_pool_keeps_no_secret_in_clear(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool is shared across runs and people: what the journal redacts (a key's value, a URL
    password, a token-shaped text) is redacted in the pool file too, prompts and answers."""
    value, token = "plain-service-secret-42", "sk_live_51AbCdEf0123456789AbCd"
    monkeypatch.setenv("MY_SERVICE_TOKEN", value)
    pool = Pool.open(tmp_path / "pool.db")
    idea = f"tea with {value} and postgres://app:hunter2-long@db/app"
    _run(tmp_path, "one", idea, pool, answer=f'{{"Title": "Tea {value} {token}"}}')
    pool.close()
    blob = (tmp_path / "pool.db").read_bytes()
    for secret in (value, token, "hunter2-long"):
        assert secret.encode() not in blob
    entry = Pool.open(tmp_path / "pool.db").entries()[0]
    assert "[REDACTED]" in entry.prompt and entry.answer == '{"Title": "Tea [REDACTED] [REDACTED]"}'


def test_a_pool_shared_between_sops_never_mixes_their_answers(tmp_path: Path) -> None:
    """A shared file with the same action and prompt as a trusted SOP, run once with a pool the
    two share, cannot plant an answer the trusted SOP then reuses without a model call, nor
    an example it is offered."""
    pool = Pool.open(tmp_path / "pool.db", threshold=0.5)
    hostile = tmp_path / "hostile" / "s.sop.yaml"
    hostile.parent.mkdir()
    hostile.write_text(SOP.replace("name: pooled", "name: pooled  # the same action, another file"),
                       encoding="utf-8")
    with use_model(ScriptedModel(lambda spec, attempt: '{"Title": "PLANTED"}')):
        api.run(api.load(hostile), {"idea": "tea"}, api.RunOptions(workspace=tmp_path / "h", pool=pool))
    assert len(pool.entries()) == 1
    trusted, model = _run(tmp_path, "one", "tea", pool)
    assert model.calls == 1 and trusted.messages[-1].out == {"Title": "Tea time"}
    assert "PLANTED" not in model.prompts()[0]
    _, again = _run(tmp_path, "two", "tea", pool)               # its own entry is reused
    assert again.calls == 0
