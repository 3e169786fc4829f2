"""Regression by replay: every journaled run of a folder run again with its recorded answers.

After an SOP change (or a sopctl upgrade), `sopctl batch --replay RUNS_DIR` replays each run
(`api.replay_async`: no model is called) into `OUT/rows/<run folder>/` and reports, per run,
whether its history diverges and where: a request the journal has no answer for (the SOP
asks something else), else the first message that differs from the recorded history (the
SOP routes or publishes differently), else a different end status.

RUNS_DIR is a batch folder (its `rows/`), or any folder of run folders (`sopctl runs`'s), or
one run folder.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from engine import api
from engine.batch.folder import ROWS_DIR, check_row_folder, rows_folder
from engine.batch.results import RESULTS_FILE, ResultsFile
from engine.batch.rows import Row
from engine.batch.runner import Batch, BatchBudget, BatchProgress, BatchTotals, Launcher, summarize
from engine.errors import SopError, UsageError
from engine.journal.history import RunState, find_runs, read_run

__all__ = ["replay_runs", "run_folders", "divergence"]


def run_folders(runs_dir: str | Path) -> list[Path]:
    """The run folders to replay, sorted by name."""
    root = Path(runs_dir)
    if (root / ROWS_DIR).is_dir() and (root / RESULTS_FILE).is_file():
        root = root / ROWS_DIR
    folders = find_runs(root)
    if not folders:
        raise UsageError(f"no journaled runs under {runs_dir}",
                         "give a batch folder, a folder of run folders, or one run folder")
    return folders


def divergence(recorded: RunState, replayed: RunState) -> str:
    """Where the replayed history first differs from the recorded one ('' when it does not)."""
    for index, (want, got) in enumerate(zip(recorded.history, replayed.history, strict=False), start=1):
        if _message_key(want) != _message_key(got):
            return (f"message {index}: recorded {want.get('sent_from')}.{want.get('cause_by')}, "
                    f"replayed {got.get('sent_from')}.{got.get('cause_by')}"
                    + (" (content differs)" if _message_key(want)[:2] == _message_key(got)[:2] else ""))
    if len(recorded.history) != len(replayed.history):
        return (f"message {min(len(recorded.history), len(replayed.history)) + 1}: recorded "
                f"{len(recorded.history)} messages, replayed {len(replayed.history)}")
    if recorded.status != replayed.status:
        return f"status: recorded {recorded.status}, replayed {replayed.status}"
    return ""


def _message_key(message: dict[str, Any]) -> tuple[Any, ...]:
    return (message.get("sent_from"), message.get("cause_by"), message.get("content"),
            sorted(message.get("send_to") or []))


async def replay_one(number: int, source: Path, out: Path) -> dict[str, Any] | None:
    """Replay one run into `out/rows/<name>`; its line (None: interrupted)."""
    line: dict[str, Any] = {"row": number, "source": str(source),
                            "dir": f"{ROWS_DIR}/{source.name}", "run_id": None}
    try:
        recorded = read_run(source)
        target = check_row_folder(out, source.name)     # neither it nor rows/ a planted link
        if target.exists():            # an earlier, interrupted replay: start it again
            shutil.rmtree(target)
        replayed = await api.replay_async(source, target)
    except SopError as exc:
        return {**line, "status": "failed", "diverged": True, "where": "", "error": exc.message}
    result = replayed.result
    if str(result.status) == "interrupted" and recorded.status != "interrupted":
        return None
    state = read_run(target)
    where = result.error if replayed.diverged else divergence(recorded, state)
    return {**line, "run_id": state.run_id, "status": str(state.status),
            "recorded_status": str(recorded.status), "calls": result.llm_calls,
            "diverged": bool(where), "where": where, "error": state.error}


async def replay_runs(runs_dir: str | Path, out: str | Path, *, concurrency: int = 4,
                      progress: BatchProgress | None = None) -> tuple[BatchTotals, bool]:
    """Replay every run of `runs_dir` into `out`; the totals (`diverged` counts the runs whose
    history differs), and whether
    the replay was interrupted. A rerun skips the runs already replayed."""
    folders = run_folders(runs_dir)
    target = Path(out)
    if target.resolve() == Path(runs_dir).resolve():
        raise UsageError("--out must be another folder than the runs being replayed")
    target.mkdir(parents=True, exist_ok=True)
    rows_folder(target)           # a planted `rows` link stops the replay before any run
    results = ResultsFile(target)

    async def launch(row: Row, share: float | None) -> dict[str, Any] | None:
        return await replay_one(row.number, folders[row.number - 1], target)

    launcher: Launcher = launch
    batch = Batch(results, BatchBudget(0.0, 0.0, concurrency), launcher, concurrency, progress)
    await batch.run(Row(number) for number in range(1, len(folders) + 1))
    results.compact()
    return summarize(results), batch.interrupted
