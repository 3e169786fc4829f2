"""`DIR/results.jsonl`: one JSON line per row, appended (and fsynced) as each row ends.

A killed batch leaves at most a torn last line, which is ignored; a rerun appends the lines
of the rows it runs, and `compact` rewrites the file in row order, keeping each row's last
line, so that a finished batch has exactly one line per row. Only an index (row -> offset
of its last line, status, cost) is held in memory, never the lines themselves.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO
from collections.abc import Iterable, Iterator

from engine.batch.folder import ROWS_DIR, check_batch_file, open_batch_file, remove_batch_file
from engine.journal.history import RunState
from engine.run.events import RunStatus
from engine.run.message import Message

__all__ = ["RESULTS_FILE", "ROWS_DIR", "ResultsFile", "row_dir", "run_line", "problem_line",
           "skipped_line", "msgs_of", "UNFINISHED", "SKIPPED"]

RESULTS_FILE = "results.jsonl"
SKIPPED = "skipped"
"""A row the batch did not start: its budget was spent first."""
UNFINISHED = frozenset({SKIPPED, RunStatus.WAITING.value, RunStatus.INTERRUPTED.value})
"""Statuses a rerun of the batch picks up again (a waiting row: its person may have answered)."""


def row_dir(out: Path, number: int) -> Path:
    """The workspace (and journal) of row `number`: `DIR/rows/000042`."""
    return out / ROWS_DIR / f"{number:06d}"


def run_line(number: int, out: Path, state: RunState) -> dict[str, Any]:
    """A row's line from its run's journal: totals over every invocation of the run."""
    usage = state.usage
    return {
        "row": number,
        "dir": row_dir(out, number).relative_to(out).as_posix(),
        "run_id": state.run_id,
        "status": str(state.status),
        "rounds": state.rounds,
        "calls": usage.llm_calls,
        "reused_calls": usage.reused_calls,
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "tokens": usage.prompt_tokens + usage.completion_tokens,
        "cost_usd": round(usage.cost_usd, 6),
        "artifacts": sorted(state.artifacts),
        "last_messages": _last_messages(state.history),
        "error": state.error,
    }


def problem_line(number: int, reason: str) -> dict[str, Any]:
    """The line of a row that could not start (bad input): failed, with the reason."""
    return {"row": number, "dir": None, "run_id": None, "status": RunStatus.FAILED.value,
            "rounds": 0, "calls": 0, "reused_calls": 0, "prompt_tokens": 0,
            "completion_tokens": 0, "tokens": 0, "cost_usd": 0.0, "artifacts": [],
            "last_messages": {}, "error": reason}


def skipped_line(number: int) -> dict[str, Any]:
    return {**problem_line(number, "not started: the batch budget was spent"), "status": SKIPPED}


def _last_messages(history: list[dict[str, Any]]) -> dict[str, str]:
    """The content of the last message each action published (the idea's is left out)."""
    last: dict[str, str] = {}
    for message in history:
        if message.get("cause_by") != "UserRequirement":
            last[str(message.get("cause_by"))] = str(message.get("content") or "")
    return last


def msgs_of(state: RunState, actions: Iterable[str] = ()) -> dict[str, list[dict[str, Any]]]:
    """`msgs` as an SOP's templates see it (`msgs.WriteCode[-1].content`; every action of the
    SOP is there, [] when it published nothing), for expectations."""
    msgs: dict[str, list[dict[str, Any]]] = {action: [] for action in actions}
    for message in state.history:
        view = Message.from_json(message).template_view()
        msgs.setdefault(view["cause_by"], []).append(view)
    return msgs


@dataclass
class _Entry:
    offset: int
    status: str
    run_id: str | None
    cost_usd: float


class ResultsFile:
    """The results file of a batch folder, with an index of each row's last line.

    It is opened only through `engine.batch.folder` (never through a link, never a FIFO):
    a planted `results.jsonl -> ~/.bashrc` is refused, not appended to."""

    def __init__(self, out: Path) -> None:
        self.path = out / RESULTS_FILE
        self.index: dict[int, _Entry] = {}
        if check_batch_file(self.path, writing=False):
            for offset, line in self._lines():
                self._remember(offset, line)

    def finished(self, number: int) -> bool:
        """True when the row ran to an end a rerun keeps (see UNFINISHED); a row that never
        started (bad input, not reached) is looked at again."""
        entry = self.index.get(number)
        return entry is not None and entry.run_id is not None and entry.status not in UNFINISHED

    def spent_usd(self) -> float:
        """What the rows recorded so far cost."""
        return sum(e.cost_usd for e in self.index.values())

    def recorded(self, number: int) -> dict[str, Any] | None:
        """The row's last recorded line, if any."""
        entry = self.index.get(number)
        if entry is None:
            return None
        with self._open(os.O_RDONLY) as handle:
            handle.seek(entry.offset)
            return json.loads(handle.readline())

    def append(self, line: dict[str, Any]) -> None:
        """Add a row's line; the line of a row that ran is fsynced (a power cut right after
        loses nothing). A row that never started (a bad input, skipped) is only written: a
        rerun looks at it again anyway, so losing its line costs nothing, and an fsync per
        line made 200,000 bad rows take minutes (the next fsynced line, or `compact`, covers it)."""
        data = (json.dumps(line, ensure_ascii=False, sort_keys=True) + "\n").encode("utf-8")
        with self._open(os.O_RDWR | os.O_APPEND | os.O_CREAT) as handle:   # RDWR: pread
            offset = os.fstat(handle.fileno()).st_size
            if offset and os.pread(handle.fileno(), 1, offset - 1) != b"\n":
                handle.write(b"\n")       # a torn last line from a killed batch stays apart
                offset += 1
            handle.write(data)
            handle.flush()
            if line.get("run_id") is not None:
                os.fsync(handle.fileno())
        self._remember(offset, line)

    def compact(self) -> None:
        """Rewrite the file with one line per row (its last), in row order, atomically."""
        if not check_batch_file(self.path, writing=False):
            return
        temp = self.path.with_name(f".{RESULTS_FILE}.tmp")
        remove_batch_file(temp)            # a leftover, or a planted link: never written through
        new_index: dict[int, _Entry] = {}
        with self._open(os.O_RDONLY) as source, \
                self._open(os.O_WRONLY | os.O_CREAT | os.O_EXCL, temp) as target:
            for number in sorted(self.index):
                entry = self.index[number]
                source.seek(entry.offset)
                line = source.readline()
                new_index[number] = _Entry(target.tell(), entry.status, entry.run_id, entry.cost_usd)
                target.write(line if line.endswith(b"\n") else line + b"\n")
            target.flush()
            os.fsync(target.fileno())
        os.replace(temp, self.path)
        self.index = new_index

    def lines(self) -> Iterator[dict[str, Any]]:
        """Every row's last line, in row order (read one at a time)."""
        with self._open(os.O_RDONLY) as handle:
            for number in sorted(self.index):
                handle.seek(self.index[number].offset)
                yield json.loads(handle.readline())

    def _open(self, flags: int, path: Path | None = None) -> BinaryIO:
        """The results file (or its temporary twin) as a binary file object, opened safely."""
        mode = "ab" if flags & os.O_APPEND else ("rb" if flags & (os.O_WRONLY | os.O_RDWR) == 0 else "wb")
        return os.fdopen(open_batch_file(path or self.path, flags), mode)  # type: ignore[return-value]

    def _lines(self) -> Iterator[tuple[int, dict[str, Any]]]:
        with self._open(os.O_RDONLY) as handle:
            offset = 0
            for raw in handle:
                try:
                    line = json.loads(raw)
                except (ValueError, RecursionError):   # a torn line (a kill mid-write), or a planted one
                    line = None
                if isinstance(line, dict) and isinstance(line.get("row"), int) and raw.endswith(b"\n"):
                    yield offset, line
                offset += len(raw)

    def _remember(self, offset: int, line: dict[str, Any]) -> None:
        self.index[int(line["row"])] = _Entry(offset, str(line.get("status")), line.get("run_id"),
                                              float(line.get("cost_usd") or 0.0))
