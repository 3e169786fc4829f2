"""Resume and replay: a run folder opened again from what its journal says.

A `RunFolder` is a run's workspace with its journal opened once, the run's origin (its
first and latest `RunStarted`) read from it, and its SOP file compiled once. `engine.api`
resumes or replays from it: resume continues the run in its own workspace (same run id;
completed actions and journaled answers are reused, so nothing is paid twice); replay runs
the SOP again in a new folder with every answer from the journal.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

from engine.compile.compiler import CompiledSop, compile_path
from engine.errors import CompileError, JournalError, LoadError, UsageError
from engine.journal.codec import decode_event
from engine.journal.history import rebuild
from engine.journal.run_folder import JOURNAL_DIR, JOURNAL_FILE
from engine.journal.sqlite_errors import naming
from engine.journal.store import Journal
from engine.models.registry import default_model
from engine.run.events import RunStarted, RunStatus
from engine.run.options import ReplayOptions, ResumeOptions, RunOptions, fields_of

__all__ = ["Origin", "RunFolder", "read_origin", "open_for_resume", "open_for_replay",
           "resume_options", "replay_options", "remove_orphan_temp_files"]


# --- resume and replay --------------------------------------------------------------------


@dataclass(frozen=True)
class Origin:
    """How a run was started, as its journal has it (resume and replay start from here)."""

    first: RunStarted              # the run's own start: id, inputs
    last: RunStarted               # the latest invocation: SOP hash, model, rounds, budget
    sop_path: Path
    ended_status: RunStatus | None  # None when the last invocation has no RunEnded
    artifacts: frozenset[str]      # every file an action wrote, over all invocations


def read_origin(journal: Journal, run_dir: str | Path) -> Origin:
    """The first and latest RunStarted of a run and where its SOP file is now."""
    rows = journal.events()
    starts = [decode_event(r) for r in rows if r.type == "RunStarted"]
    if not starts:
        raise JournalError(f"the journal of {run_dir} has no RunStarted event",
                           "the run died before it started; run it again with `sopctl run`")
    state = rebuild(rows, run_dir=str(run_dir))
    first, last = starts[0], starts[-1]
    assert isinstance(first, RunStarted) and isinstance(last, RunStarted)
    return Origin(first, last, _sop_path(journal.meta(), last), state.status if state.ended else None,
                  frozenset(state.artifacts))


@dataclass
class RunFolder:
    """A run's workspace opened again: its journal (opened once), origin and compiled SOP."""

    path: Path
    journal: Journal
    origin: Origin
    compiled: CompiledSop

    def close(self) -> None:
        self.journal.close()

    def __enter__(self) -> RunFolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_for_resume(run_dir: str | Path, *, force: bool = False) -> RunFolder:
    """A run folder to continue, the SOP unchanged since the run (last) started unless
    `force`. Its journal is read-only until the resume begins (`Journal.begin`)."""
    return _open(run_dir, force=force)


def open_for_replay(run_dir: str | Path) -> RunFolder:
    """A run folder to replay from (its journal stays read-only)."""
    return _open(run_dir, force=True)


def _open(run_dir: str | Path, *, force: bool) -> RunFolder:
    journal = Journal.open(run_dir)
    try:
        journal.check_intact()
        with naming(journal.path):
            origin = read_origin(journal, run_dir)
        include_dirs = _include_dirs(journal.path, journal.meta())
        compiled = _compile(origin.sop_path, include_dirs, origin if not force else None)
        return RunFolder(Path(run_dir), journal, origin, compiled)
    except BaseException:
        journal.close()
        raise


def _include_dirs(path: Path, meta: dict[str, str]) -> tuple[str, ...]:
    """The folders the run's includes may come from, as recorded; a damaged (or planted)
    value is a JournalError naming the journal, never an internal error."""
    try:
        dirs = json.loads(meta.get("include_dirs", "[]"))
    except (ValueError, RecursionError):
        dirs = None
    if not (isinstance(dirs, list) and all(isinstance(d, str) for d in dirs)):
        raise JournalError(f"{path}: the journal is damaged: its include_dirs is not a list of folders",
                           hint="the journal was changed by something other than sopctl")
    return tuple(dirs)


def _sop_path(meta: dict[str, str], last: RunStarted) -> Path:
    """The SOP file: the absolute path the journal remembers, else the recorded one."""
    for candidate in (meta.get("sop_path", ""), last.sop_file):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    raise JournalError(f"the run's SOP file {meta.get('sop_path') or last.sop_file} is gone",
                       "put the file back where it was (or run from the folder the run started in)")


def _compile(path: Path, include_dirs: tuple[str, ...], unchanged_since: Origin | None) -> CompiledSop:
    """The run's SOP compiled again (with the run's --include-path folders); an unreadable or
    now-invalid file is a usage error (2). With `unchanged_since`, an SOP (file or included
    library) that changed since that run started is refused first."""
    try:
        compiled = compile_path(path, include_dirs)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except LoadError as exc:
        if unchanged_since is not None:
            _check_unchanged(unchanged_since, None)
        first = next((d for d in exc.diagnostics if d.is_error), None)
        where = f"{first.file or path}:{first.line}:{first.col}: {first.message}" if first else exc.message
        raise UsageError(f"the run's SOP file is no longer valid: {where}",
                         f"see every problem with `sopctl validate {path}`") from None
    except CompileError:
        if unchanged_since is not None:
            _check_unchanged(unchanged_since, None)
        raise
    if unchanged_since is not None:
        _check_unchanged(unchanged_since, compiled)
    return compiled


def _check_unchanged(origin: Origin, compiled: CompiledSop | None) -> None:
    """Refuse to resume with an SOP other than the one the run (last) started with: the file
    and every library it includes (`compiled.source_hash` covers them all)."""
    try:
        digest = compiled.source_hash if compiled else hashlib.sha256(origin.sop_path.read_bytes()).hexdigest()
    except OSError as exc:
        raise UsageError(f"cannot read {origin.sop_path}: {exc.strerror or exc}") from None
    if digest != origin.last.sop_hash:
        libraries = " (or a file it includes)" if compiled and compiled.source and compiled.source.included else ""
        raise JournalError(f"the SOP file {origin.sop_path}{libraries} changed since the run started "
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


def resume_options(folder: RunFolder, given: ResumeOptions) -> RunOptions:
    """The run options of a resume: what this invocation gives (`given`), with the run's own
    id, workspace and idea addresses, and its model and limits unless `given` overrides them
    (`--model`, `--rounds`, `--budget`)."""
    last = folder.origin.last
    return replace(RunOptions(**fields_of(given, ResumeOptions, "a resume")),
                   model=_model_override(folder.compiled, last.model, given.model),
                   max_rounds=given.max_rounds or last.max_rounds,
                   budget_usd=last.budget_usd if given.budget_usd is None else given.budget_usd,
                   workspace=str(folder.path.resolve()), run_id=folder.origin.first.run_id,
                   send_to=folder.origin.first.send_to,
                   reuse_identical=folder.origin.first.reuse_identical)


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


def replay_options(folder: RunFolder, out: str | Path, given: ReplayOptions) -> RunOptions:
    """The run options of a replay into `out` (a new folder): what this invocation gives
    (`given`), with the recorded run's own model, limits, id and idea addresses."""
    target = Path(out)
    if target.resolve() == folder.path.resolve():
        raise UsageError("--out must be another folder than the run being replayed")
    if (target / JOURNAL_DIR / JOURNAL_FILE).exists():
        raise UsageError(f"{out} already holds a run", "replay into a new or empty folder")
    last = folder.origin.last
    return replace(RunOptions(**fields_of(given, ReplayOptions, "a replay")),
                   model=_model_override(folder.compiled, last.model, None),
                   max_rounds=last.max_rounds, budget_usd=last.budget_usd, workspace=str(target),
                   run_id=folder.origin.first.run_id, send_to=folder.origin.first.send_to,
                   reuse_identical=folder.origin.first.reuse_identical, replay=True)
