"""Every command that runs something builds its run options with one function from its flags:
each flag reaches its option, and a flag a command lacks leaves the option at its default."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from run_helpers import SOPS

from engine.batch.runner import RowContext
from engine.cli import batch as cli_batch
from engine.cli.commands import main
from engine.cli.live import PlainProgress
from engine.cli.options import run_options
from engine.cli.parser import parse_args
from engine.journal.pool import Pool
from engine.models.types import Price
from engine.run.options import RunOptions

HOSTED = ["--api-base", "http://localhost:8000/v1", "--price", "0.2,0.6"]
ALLOWED = ["--allow-exec", "--allow-host", "a.example", "--allow-host", "b.example", "--isolate",
           "--allow-network"]


def test_run_flags_reach_their_options(tmp_path: Path) -> None:
    argv = ["run", "x.sop.yaml", "--model", "fake", "--rounds", "3", "--budget", "0.5", "--out",
            str(tmp_path / "ws"), "--send-to", "PM", *ALLOWED, *HOSTED, "--no-input",
            "--pool", str(tmp_path / "pool.db"), "--pool-threshold", "0.5"]
    display = PlainProgress()
    options = run_options(parse_args(argv), observers=[display])
    try:
        assert isinstance(options.pool, Pool) and options.pool.threshold == 0.5
        assert dataclasses_without(options, "pool") == dataclasses_without(RunOptions(
            model="fake", max_rounds=3, budget_usd=0.5, workspace=str(tmp_path / "ws"), send_to=["PM"],
            allow_exec=True, allow_hosts=["a.example", "b.example"], isolate=True, allow_network=True,
            api_base="http://localhost:8000/v1", price=Price(0.2 / 1e6, 0.6 / 1e6),
            observers=[display]), "pool")
    finally:
        options.pool.close()  # type: ignore[union-attr]


def dataclasses_without(options: RunOptions, name: str) -> dict[str, object]:
    return {k: v for k, v in vars(options).items() if k != name}


def test_resume_flags_are_its_overrides() -> None:
    options = run_options(parse_args(["resume", "runs/r", "--budget", "2", "--rounds", "9", "--model",
                                      "fake", *ALLOWED, "--force", "--no-input"]))
    assert (options.budget_usd, options.max_rounds, options.model, options.allow_exec) == (2.0, 9, "fake", True)
    assert (options.workspace, options.send_to, options.person) == (None, (), None)


def test_replay_has_no_model_nor_limits_and_its_out_is_not_a_workspace() -> None:
    options = run_options(parse_args(["replay", "runs/r", "--out", "again", *ALLOWED]))
    assert options.allow_hosts == ("a.example", "b.example") and options.isolate
    assert (options.model, options.max_rounds, options.budget_usd, options.workspace) == (None, None, None, None)


def test_batch_rows_get_the_flags_but_not_the_batch_budget_or_folder(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"idea": "x"}) + "\n", encoding="utf-8")
    monkeypatch.setenv("SOPCTL_POOL", str(tmp_path / "pool.db"))   # a batch has no pool
    seen: list[RowContext] = []
    monkeypatch.setattr(cli_batch, "_launcher", lambda args, ctx: seen.append(ctx))
    monkeypatch.setattr(cli_batch, "run_batch", _no_batch)
    main(["batch", str(SOPS / "pipeline.sop.yaml"), "--inputs", str(rows), "--out", str(tmp_path / "b"),
          "--budget", "3", "--model", "fake", "--rounds", "4", "--allow-exec", *HOSTED])
    [ctx] = seen
    assert ctx.options == RunOptions(model="fake", max_rounds=4, allow_exec=True,
                                     api_base="http://localhost:8000/v1", price=Price(0.2 / 1e6, 0.6 / 1e6))


async def _no_batch(*args: object, **kwargs: object) -> tuple[object, bool]:
    raise KeyboardInterrupt
