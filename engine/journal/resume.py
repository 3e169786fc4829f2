"""Resume and replay: a run started again from what its journal says.

Resume continues a run in its own workspace (same run id; completed actions and journaled
answers are reused, so nothing is paid twice). Replay runs the SOP again in a new folder
with every answer from the journal, and reports a divergence when the run asks for a
request the journal does not hold."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from engine.errors import JournalError, UsageError
from engine.journal.history import read_run, rebuild
from engine.journal.store import (
    JOURNAL_DIR,
    JOURNAL_FILE,
    Journal,
    ReplayStore,
    decode_event,
)
from engine.models.registry import default_model
from engine.run.events import RunStarted
from engine.run.inputs import check_limits

if TYPE_CHECKING:
    from engine.check.compiler import CompiledSop
    from engine.run.team import RunResult

__all__ = ['Origin', 'read_origin', 'resume_run', 'replay_run', 'remove_orphan_temp_files']


# --- resume and replay --------------------------------------------------------------------


@dataclass(frozen=True)
class Origin:
    """How a run was started, as its journal has it (resume and replay start from here)."""

    first: RunStarted              # the run's own start: id, inputs
    last: RunStarted               # the latest invocation: SOP hash, model, rounds, budget
    sop_path: Path
    ended_status: str              # "" when the last invocation has no RunEnded


def read_origin(run_dir: str | Path) -> Origin:
    """The first and latest RunStarted of a run and where its SOP file is now."""
    with Journal.open(run_dir) as journal:
        rows = journal.events()
        meta = journal.meta()
    starts = [decode_event(r) for r in rows if r.type == "RunStarted"]
    if not starts:
        raise JournalError(f"the journal of {run_dir} has no RunStarted event",
                           "the run died before it started; run it again with `sopctl run`")
    state = rebuild(rows, run_dir=str(run_dir))
    first, last = starts[0], starts[-1]
    assert isinstance(first, RunStarted) and isinstance(last, RunStarted)
    return Origin(first, last, _sop_path(meta, last), state.status if state.ended else "")


def _sop_path(meta: dict[str, str], last: RunStarted) -> Path:
    """The SOP file: the absolute path the journal remembers, else the recorded one."""
    for candidate in (meta.get("sop_path", ""), last.sop_file):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    raise JournalError(f"the run's SOP file {meta.get('sop_path') or last.sop_file} is gone",
                       "put the file back where it was (or run from the folder the run started in)")


def _compile(path: Path) -> CompiledSop:
    """The run's SOP compiled again; an unreadable or now-invalid file is a usage error (2)."""
    from engine.check.compiler import compile_path
    from engine.errors import LoadError

    try:
        return compile_path(path)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except LoadError as exc:
        first = next((d for d in exc.diagnostics if d.is_error), None)
        where = f"{first.file or path}:{first.line}:{first.col}: {first.message}" if first else exc.message
        raise UsageError(f"the run's SOP file is no longer valid: {where}",
                         f"see every problem with `sopctl validate {path}`") from None


def _check_unchanged(origin: Origin, force: bool) -> None:
    """Refuse to resume with an SOP file other than the one the run (last) started with."""
    try:
        digest = hashlib.sha256(origin.sop_path.read_bytes()).hexdigest()
    except OSError as exc:
        raise UsageError(f"cannot read {origin.sop_path}: {exc.strerror or exc}") from None
    if digest != origin.last.sop_hash and not force:
        raise JournalError(f"the SOP file {origin.sop_path} changed since the run started "
                           f"(sha256 {origin.last.sop_hash[:12]} -> {digest[:12]})",
                           "resuming with a different SOP may mix two pipelines; pass --force "
                           "to do it anyway, or `sopctl run` it afresh")


def _model_override(compiled: CompiledSop, recorded: str, explicit: str | None) -> str | None:
    """`--model` if given; else the recorded model only if today's default would differ.

    Passing the recorded model as an override when it *is* the default would also override
    per-role and per-action models, which the original run did not do.
    """
    if explicit:
        return explicit
    return None if recorded == default_model(compiled) else recorded


def resume_run(run_dir: str | Path, *, budget: float | None = None, rounds: int | None = None,
               model: str | None = None, allow_exec: bool = False, force: bool = False,
               observers: tuple[Any, ...] = ()) -> RunResult:
    """Continue a run in its own workspace: same run id, completed actions and answers reused.

    Refuses (JournalError) when the SOP file changed since the run (last) started, unless
    `force`. Returns the interpreter's RunResult of this invocation.
    """
    check_limits(rounds, budget)
    origin = read_origin(run_dir)
    _check_unchanged(origin, force)
    compiled = _compile(origin.sop_path)
    options: dict[str, Any] = {
        "model": _model_override(compiled, origin.last.model, model),
        "max_rounds": rounds or origin.last.max_rounds,
        "budget_usd": origin.last.budget_usd if budget is None else budget,
        "workspace": str(Path(run_dir).resolve()), "allow_exec": allow_exec,
        "run_id": origin.first.run_id,
    }
    def journal_for(ws: Path) -> Journal:
        journal = Journal.for_run(ws, compiled, force=force)
        remove_orphan_temp_files(ws)      # safe now: we hold the writer lock
        return journal

    result = _run(compiled, origin.first.inputs, options, journal_for, observers)
    _add_earlier_artifacts(result, run_dir)
    return result


def remove_orphan_temp_files(workspace: Path) -> list[str]:
    """Delete the temp files of artifact writes a killed process left (`.sopctl-*.tmp`).

    The workspace writes every artifact to a temp file and renames it; a kill -9 between
    the two leaves the temp file behind. Only call this while holding the journal's writer
    lock, so that no live process is in the middle of such a write. Symlinks are left alone.
    """
    removed: list[str] = []
    for folder, dirs, names in os.walk(workspace, followlinks=False):
        dirs[:] = [d for d in dirs if d != JOURNAL_DIR]
        for name in names:
            path = Path(folder) / name
            if name.startswith(".sopctl-") and name.endswith(".tmp") and not path.is_symlink():
                path.unlink(missing_ok=True)
                removed.append(path.relative_to(workspace).as_posix())
    return removed


def _add_earlier_artifacts(result: RunResult, run_dir: str | Path) -> None:
    """Actions reused from the journal wrote their files earlier: list those too."""
    root = Path(run_dir)
    earlier = {p for p in read_run(root).artifacts if (root / p).is_file()}
    result.artifacts = sorted(set(result.artifacts) | earlier)


def replay_run(run_dir: str | Path, out: str | Path, *, allow_exec: bool = False,
               observers: tuple[Any, ...] = ()) -> tuple[RunResult, bool]:
    """Run the SOP again in `out` with every answer from `run_dir`'s journal; no model called.

    Returns (RunResult, diverged): diverged is True when the run asked for a request the
    journal lacks (the run then ends `failed` with the divergence as its error).
    """
    origin = read_origin(run_dir)
    target = Path(out)
    if target.resolve() == Path(run_dir).resolve():
        raise UsageError("--out must be another folder than the run being replayed")
    if (target / JOURNAL_DIR / JOURNAL_FILE).exists():
        raise UsageError(f"{out} already holds a run", "replay into a new or empty folder")
    compiled = _compile(origin.sop_path)
    options: dict[str, Any] = {
        "model": _model_override(compiled, origin.last.model, None),
        "max_rounds": origin.last.max_rounds, "budget_usd": origin.last.budget_usd,
        "workspace": str(target), "allow_exec": allow_exec, "run_id": origin.first.run_id,
        "replay": True,
    }
    with Journal.open(run_dir) as source:
        stores: list[ReplayStore] = []

        def journal_for(ws: Path) -> Journal:
            journal = Journal.for_run(ws, compiled)
            stores.append(ReplayStore(source, journal))
            return journal

        result = _run(compiled, origin.first.inputs, options, journal_for, observers, stores)
    return result, bool(stores and stores[0].misses)


def _run(compiled: CompiledSop, inputs: dict[str, Any], options: dict[str, Any],
         journal_for: Callable[[Path], Journal], observers: tuple[Any, ...],
         stores: list[ReplayStore] | None = None) -> RunResult:
    """Prepare the team, open its journal, attach it (and a replay store), run to the end."""
    import asyncio

    from engine.api import prepare

    team = prepare(compiled, inputs, **options)
    team.check()
    journal = journal_for(team.workspace.root)
    try:
        if stores:
            team.ctx.gateway.store = stores[0]
        team.options.observers = [*observers]
        team.attach(journal)
        return asyncio.run(team.run())
    finally:
        journal.close()
