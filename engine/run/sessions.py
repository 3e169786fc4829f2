"""The run's long-lived tool processes: one shell (`terminal`) and one Python kernel
(`notebook`) per role, kept for the whole run, not for one action activation, and ended when
the run ends (`Team.run` closes the registry in every way a run can end).

Their state (working folder, variables, a kernel's names) cannot be journaled: after sopctl
stopped (a crash, a run waiting for a person, Ctrl-C) the next invocation starts them afresh,
and the first output of each tells the model so (`restart_notice`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

__all__ = ["Session", "Sessions", "ran_before"]


class Session(Protocol):
    """A process a toolset keeps: `alive` until it ends; `close` kills it (idempotent)."""

    @property
    def alive(self) -> bool: ...

    async def close(self) -> None: ...


class Sessions:
    """Every live session of the run, by (toolset, role id). One lock per key: two commands
    for one role's shell (two `for_each` items at once) take turns."""

    def __init__(self) -> None:
        self._live: dict[tuple[str, str], Any] = {}
        self._started: set[tuple[str, str]] = set()
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._closed = False

    def lock(self, toolset: str, role_id: str) -> asyncio.Lock:
        return self._locks.setdefault((toolset, role_id), asyncio.Lock())

    def live(self, toolset: str, role_id: str) -> Any:
        """The role's session of that toolset, if one is running."""
        session = self._live.get((toolset, role_id))
        return session if session is not None and session.alive else None

    def started_before(self, toolset: str, role_id: str) -> bool:
        """Whether this invocation already had a session for the role (now ended)."""
        return (toolset, role_id) in self._started

    async def start(self, toolset: str, role_id: str, make: Callable[[], Awaitable[Any]]) -> Any:
        """Start the role's session with `make` (an ended one is closed first)."""
        if self._closed:   # a command cancelled late must not start what nobody would end
            raise RuntimeError("the run has ended: no new session")
        old = self._live.pop((toolset, role_id), None)
        if old is not None:
            await old.close()
        session = await make()
        self._live[(toolset, role_id)] = session
        self._started.add((toolset, role_id))
        return session

    async def run(self, toolset: str, role_id: str, make: Callable[[], Awaitable[Any]],
                  work: Callable[[Any], Awaitable[Any]], notice: Callable[[], str]) -> tuple[Any, str]:
        """`work` on the role's session, started with `make` when none is live (then `notice()`
        is what the model must be told first); a session that died doing it is ended."""
        async with self.lock(toolset, role_id):
            session = self.live(toolset, role_id)
            told = ""
            if session is None:
                told = notice()
                session = await self.start(toolset, role_id, make)
            result = await work(session)
            if not session.alive:
                await self.end(toolset, role_id)
        return result, told

    def restart_notice(self, store: Any, toolset: str, role_id: str, *, new: str, what: str,
                       earlier: str, reset: str) -> str:
        """What the model must know when a new session replaces one it used ('' when it never
        had one): it ended in this invocation, or sopctl stopped since."""
        if self.started_before(toolset, role_id):
            return f"[sopctl: a new {new}: the last one ended; {reset}]\n"
        if ran_before(store, role_id, toolset):
            return (f"[sopctl: the {what} was restarted: sopctl stopped since your earlier {earlier} (a "
                    f"crash, a pause or an interruption) and the {what} with it; {reset}]\n")
        return ""

    async def end(self, toolset: str, role_id: str) -> None:
        session = self._live.pop((toolset, role_id), None)
        if session is not None:
            await session.close()

    async def close(self) -> None:
        """End every session (the run is over); a failure to end one never hides the others."""
        self._closed = True
        live, self._live = list(self._live.values()), {}
        results = await asyncio.gather(*(s.close() for s in live), return_exceptions=True)
        del results   # each close has killed what it could; nothing is left to report to


def ran_before(store: Any, role_id: str, toolset: str) -> bool:
    """Whether the journal shows the role using the toolset in an earlier invocation of this
    run (or a result of it reused in this one): its session existed, and is gone now."""
    events = getattr(store, "events", None)
    if events is None:   # no journal (a test's store): nothing ran before
        return False
    with contextlib.suppress(Exception):   # an unreadable journal fails elsewhere, not here
        rows = events()
        starts = [row.seq for row in rows if row.type == "RunStarted"]
        current = starts[-1] if starts else 0
        prefix = toolset + "."
        for row in rows:
            if row.type != "ToolCalled":
                continue
            data = row.data
            if data.get("role") == role_id and str(data.get("tool", "")).startswith(prefix) and \
                    (row.seq < current or data.get("reused")):
                return True
    return False
