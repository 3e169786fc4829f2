"""No process outlives its exec action (Linux).

Killing the command's process group misses what left the group: a `setsid` child, a
double-forked daemon. So while exec actions run, sopctl is a *child subreaper*
(`prctl(PR_SET_CHILD_SUBREAPER)`): an orphan of the command is reparented to sopctl instead
of init, and stays among our descendants. Each command runs with a mark of its own in its
environment (`SOPCTL_EXEC_MARK`), which every descendant inherits; when the action ends (or
times out, or is cancelled), every descendant of ours that carries the mark, or is in the
command's session, is killed with everything below it, and those reparented to us are reaped.

Only marked processes are touched, so concurrent actions never kill each other's work and a
program that embeds sopctl keeps its own children. A command that deliberately clears its
environment *and* leaves the session escapes the mark: `--isolate` (a PID namespace that ends
with the command) is the complete answer. On other systems only the process group is killed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["MARK_ENV", "subreaper", "reap", "session_leaders_below"]


MARK_ENV = "SOPCTL_EXEC_MARK"
"""Set in each exec child's environment to a value of its own; inherited by its descendants."""


_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37
_LINUX = sys.platform.startswith("linux")
_MAX_PASSES = 200
"""Kill-and-look-again rounds: a process may fork while we kill its parent."""

_active = 0
_was_subreaper = False
_lock = threading.Lock()


def _prctl(option: int, value: int) -> int | None:
    """prctl through libc; None where it is unavailable (the reaping then misses orphans)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if option == _PR_GET_CHILD_SUBREAPER:
            flag = ctypes.c_int(0)
            ok = libc.prctl(option, ctypes.byref(flag), 0, 0, 0) == 0
            return flag.value if ok else None
        return 0 if libc.prctl(option, value, 0, 0, 0) == 0 else None
    except (OSError, AttributeError):
        return None


@contextlib.contextmanager
def subreaper() -> Iterator[None]:
    """sopctl is a child subreaper while at least one exec action runs (then as it was before)."""
    global _active, _was_subreaper
    with _lock:
        _active += 1
        if _LINUX and _active == 1:
            _was_subreaper = bool(_prctl(_PR_GET_CHILD_SUBREAPER, 0))
            if not _was_subreaper:
                _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            if _LINUX and _active == 0 and not _was_subreaper:
                _prctl(_PR_SET_CHILD_SUBREAPER, 0)


@dataclass(frozen=True)
class _Proc:
    ppid: int
    session: int
    zombie: bool


def reap(mark: str, leader: int) -> None:
    """Kill every descendant of ours that carries `mark` or is in `leader`'s session (and all
    below them), and reap those that are our children. `leader` itself, the command, is left
    to asyncio to reap (its exit status is the action's)."""
    if not _LINUX:
        return
    me = os.getpid()
    doomed: set[int] = set()
    for _ in range(_MAX_PASSES):
        procs = _processes()
        found = _marked_below(me, procs, mark, leader)
        alive = {pid for pid in found if not procs[pid].zombie}
        for pid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        doomed |= found
        doomed -= _reap_ours(doomed - {leader})
        if not alive:
            return
        time.sleep(0.005)


def session_leaders_below(root: int) -> list[int]:
    """The descendants of `root` that lead a session of their own (nearest first): a command
    bubblewrap runs with `--new-session` is one; its group is the one a Ctrl-C reaches."""
    if not _LINUX:
        return []
    procs = _processes()
    children: dict[int, list[int]] = {}
    for pid, proc in procs.items():
        children.setdefault(proc.ppid, []).append(pid)
    found, level = [], children.get(root, [])
    while level:
        found += [pid for pid in level if procs[pid].session == pid]
        level = [child for pid in level for child in children.get(pid, [])]
    return found


def _processes() -> dict[int, _Proc]:
    """Every process's parent, session and state, from /proc."""
    procs: dict[int, _Proc] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue  # gone meanwhile
        fields = stat[stat.rfind(b")") + 2:].split()  # the name may hold spaces and parentheses
        procs[int(entry)] = _Proc(ppid=int(fields[1]), session=int(fields[3]), zombie=fields[0] == b"Z")
    return procs


def _marked_below(root: int, procs: dict[int, _Proc], mark: str, leader: int) -> set[int]:
    """Descendants of `root` that carry the mark or are in the leader's session, with theirs."""
    children: dict[int, list[int]] = {}
    for pid, proc in procs.items():
        children.setdefault(proc.ppid, []).append(pid)
    needle = f"\0{MARK_ENV}={mark}\0".encode()
    found: set[int] = set()
    stack = [(pid, False) for pid in children.get(root, [])]
    while stack:
        pid, inherited = stack.pop()
        marked = inherited or pid == leader or procs[pid].session == leader or _carries(pid, needle)
        if marked:
            found.add(pid)
        stack.extend((child, marked) for child in children.get(pid, []))
    return found


def _carries(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return needle in b"\0" + handle.read()
    except OSError:
        return False


def _reap_ours(pids: set[int]) -> set[int]:
    """Collect the exit status of those that are our children (orphans reparented to us);
    the ones reaped, whose pids may now be reused and must not be waited for again."""
    reaped = set()
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                reaped.add(pid)
    return reaped
