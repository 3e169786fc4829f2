"""Rendering under bounds: every render and evaluation runs under a watchdog, so that a
hostile template fails its action cleanly, located at its line.

- **CPU time and memory, while running:** a watchdog thread looks at each render in
  progress every few milliseconds and stops it (an exception raised in the rendering
  thread, between two bytecodes) once it used more than MAX_RENDER_CPU_S seconds of its
  thread's CPU time or grew the process by more than MAX_RENDER_MEMORY bytes: nested loops
  and slow accumulations, which no static rule catches, end there.
- **Ctrl-C:** inside `stop_renders_on_cancel()` (a run) a Ctrl-C or SIGTERM, which cancel
  the run's task, stop the render in progress within a tick; the run then ends
  `interrupted` as it does between renders.
- **Size:** the output is cut at its limit (MAX_RENDERED_CHARS by default); what one step
  could build too big is refused before it is built (`engine.templates.sandbox`).
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, TypeVar

from jinja2 import Template, TemplateError
from jinja2.sandbox import SecurityError

from engine.templates.code import expression, template
from engine.templates.sandbox import MAX_RENDERED_CHARS, TemplateFailure

if TYPE_CHECKING:   # not imported at run time: `sopctl validate` never needs asyncio
    import asyncio

__all__ = ["MAX_RENDER_CPU_S", "MAX_RENDER_MEMORY", "compile_expression", "render_template",
           "stop_renders_on_cancel"]

MAX_RENDER_CPU_S = 2.0
"""CPU seconds one render may use (its thread's CPU clock: a busy machine does not count)."""

MAX_RENDER_MEMORY = 512 * 2**20
"""Bytes one render may grow the process's resident memory by."""


@lru_cache(maxsize=256)
def compile_expression(source: str) -> Callable[..., Any]:
    """A sandboxed jinja expression (`for_each`, `when`), compiled once per process; calling
    it evaluates under the same limits as a render (TemplateFailure past them)."""
    compiled = expression(source)

    def evaluate(**variables: Any) -> Any:
        return _within_limits(lambda: compiled(**variables))

    return evaluate


def render_template(source: str, variables: dict[str, Any], limit: int = MAX_RENDERED_CHARS) -> str:
    """Render with the sandbox and its limits; every failure is a TemplateFailure."""
    if "{" not in source and "\r" not in source:
        # Plain text (a fixed path, a prompt without variables) renders as itself: without
        # `{` there is no tag, variable or comment, and without `\r` no newline that jinja
        # would rewrite to `\n`. Only the output limit applies, and a cancelled run's stop.
        if _cancelling(_RUN_TASK.get()):
            raise _cancelled()
        if len(source) > limit:
            raise TemplateFailure(f"rendered text exceeds the limit of {limit:,} characters")
        return source
    compiled = template(source)
    return _within_limits(lambda: _generate(compiled, variables, limit))


def _generate(compiled: Template, variables: dict[str, Any], limit: int) -> str:
    pieces: list[str] = []
    size = 0
    for piece in compiled.generate(**variables):
        size += len(piece)
        if size > limit:
            raise TemplateFailure(f"rendered text exceeds the limit of {limit:,} characters")
        pieces.append(piece)
    return "".join(pieces)


_T = TypeVar("_T")


def _cancelled() -> BaseException:
    """The error that ends a cancelled run's render (only a run, which has loaded asyncio, gets one)."""
    import asyncio  # a run has loaded it; `sopctl validate` never does

    return asyncio.CancelledError()


def _within_limits(work: Callable[[], _T]) -> _T:
    """Run one render or evaluation under the watchdog; its failures as TemplateFailure."""
    try:
        render = _WATCHDOG.watch()
    except _Interrupted:
        raise _cancelled() from None
    try:
        try:
            return work()
        finally:
            _WATCHDOG.forget(render)
    except _Stopped as exc:
        _WATCHDOG.forget(render)  # the stop may have landed inside the `finally` above
        if isinstance(exc, _Interrupted):
            raise _cancelled() from None
        raise TemplateFailure(exc.message(), _failing_line(exc)) from None
    except TemplateFailure:
        raise
    except SecurityError as exc:
        raise TemplateFailure(f"template refused by the sandbox: {exc}", _failing_line(exc)) from None
    except (TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError,
            ZeroDivisionError, OverflowError, RecursionError, MemoryError) as exc:
        raise TemplateFailure(f"template failed: {type(exc).__name__}: {exc}", _failing_line(exc)) from None


# --------------------------------------------------------------------------- the watchdog

class _Stopped(BaseException):
    """Raised *into* a rendering thread (a BaseException: no `except Exception` on the way
    may swallow it). Asynchronous exceptions are raised by class, so each reason is one."""

    def message(self) -> str:
        return "template stopped"


class _OverCpu(_Stopped):
    def message(self) -> str:
        return f"template used more than {MAX_RENDER_CPU_S:g} s of CPU time (a loop too long?)"


class _OverMemory(_Stopped):
    def message(self) -> str:
        return f"template grew memory by more than {MAX_RENDER_MEMORY // 2**20} MiB"


class _Interrupted(_Stopped):
    """Ctrl-C or SIGTERM during a render: the run is being interrupted."""


@dataclass(eq=False)
class _Render:
    thread: int
    run: asyncio.Task[Any] | None       # the run it belongs to: stopped once that is cancelled
    # Measured from the watchdog's first look, not from the render's start: reading a thread's
    # CPU clock is a system call, and most renders end before a tick (a bound of seconds does
    # not miss the few milliseconds before the first look).
    cpu_clock: int | None = None
    cpu_start: float | None = None
    memory_start: int | None = None
    stopped: bool = False

    def cpu_used(self) -> float:
        """CPU seconds of the render's thread since the watchdog's first look (0 before it)."""
        return 0.0 if self.cpu_start is None else _cpu_seconds(self.cpu_clock) - self.cpu_start


@dataclass
class _Watchdog:
    """One daemon thread for the whole process that looks at the renders in progress every
    TICK seconds and stops one past its CPU time or memory. Watching a render costs a dict
    insert; the thread ticks while renders come, and sleeps after a quiet tenth of a second
    (a tick costs some CPU whether or not a render is in progress: ticking for a whole second
    after each burst of renders cost a run more CPU per model call than its renders did)."""

    TICK = 0.01
    QUIET_TICKS = 10    # 0.1 s without a render in progress: the thread sleeps until the next one
    _renders: dict[int, _Render] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _wake: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _idle: bool = True      # the thread waits for `_wake` (a render must set it)

    def watch(self) -> _Render:
        run = _RUN_TASK.get()
        if _cancelling(run):
            raise _Interrupted()
        render = _Render(threading.get_ident(), run)
        with self._lock:
            self._renders[id(render)] = render
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="sopctl-render-watchdog",
                                                daemon=True)
                self._thread.start()
            wake, self._idle = self._idle, False
        if wake:    # only when the thread sleeps: waking it on every render would cost more
            self._wake.set()
        return render

    def forget(self, render: _Render) -> None:
        with self._lock:    # once it is held, no stop is being raised into this render
            self._renders.pop(id(render), None)
        if render.stopped:  # a stop raised but not yet delivered must not land elsewhere
            _take_delivery()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            quiet = 0
            while quiet < self.QUIET_TICKS:
                time.sleep(self.TICK)
                self._look()
                with self._lock:
                    quiet = 0 if self._renders else quiet + 1
                    self._idle = quiet >= self.QUIET_TICKS

    def _look(self) -> None:
        if not self._renders:
            return
        memory = _resident_bytes()
        with self._lock:
            for render in list(self._renders.values()):
                if render.cpu_start is None:
                    render.cpu_clock = _thread_cpu_clock(render.thread)
                    render.cpu_start, render.memory_start = _cpu_seconds(render.cpu_clock), memory
                    continue
                reason = _Interrupted if _cancelling(render.run) else _over_limit(render, memory)
                if reason is not None and not render.stopped:
                    render.stopped = True
                    _raise_in_thread(render.thread, reason)


def _over_limit(render: _Render, memory: int) -> type[_Stopped] | None:
    if render.cpu_used() > MAX_RENDER_CPU_S:
        return _OverCpu
    if memory and render.memory_start and memory - render.memory_start > MAX_RENDER_MEMORY:
        return _OverMemory
    return None


def _thread_cpu_clock(thread: int) -> int | None:
    try:
        return time.pthread_getcpuclockid(thread)
    except (AttributeError, OSError):   # no per-thread CPU clock here: wall time stands in
        return None


def _cpu_seconds(clock: int | None) -> float:
    try:
        return time.clock_gettime(clock) if clock is not None else time.monotonic()
    except OSError:     # the thread is gone: its render is over
        return 0.0


def _resident_bytes() -> int:
    """This process's resident memory (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return 0


_PAGE_SIZE = 4096
try:
    _PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
except (ValueError, OSError, AttributeError):
    pass


def _raise_in_thread(thread: int, reason: type[_Stopped]) -> None:
    """Raise `reason` in `thread` at its next backward jump or call."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), ctypes.py_object(reason))


def _take_delivery() -> None:
    """Let a stop raised into this thread land here, now, where `_within_limits` catches it.

    It is never taken back with PyThreadState_SetAsyncExc(thread, NULL): on CPython 3.11 that
    leaves the thread's eval breaker set with nothing to handle, and from then on any profiler
    or tracer in the process (cProfile, coverage, a debugger) hangs."""
    for _ in range(2):  # a backward jump: where a pending asynchronous exception is raised
        pass


_WATCHDOG = _Watchdog()


def _new_watchdog_after_fork() -> None:
    """A forked child has no watchdog thread (and maybe a lock held by the parent's): it
    starts its own on its first render."""
    global _WATCHDOG
    _WATCHDOG = _Watchdog()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_watchdog_after_fork)


_RUN_TASK: contextvars.ContextVar[asyncio.Task[Any] | None] = \
    contextvars.ContextVar("sopctl_run_task", default=None)


@contextlib.contextmanager
def stop_renders_on_cancel() -> Iterator[None]:
    """Within (a run's task): once that task is cancelled (Ctrl-C and SIGTERM cancel it,
    through asyncio's handler) the render in progress in any of its tasks stops within a
    tick, and no new one starts. A render is synchronous, so without this the cancellation
    would wait for it to end."""
    import asyncio  # a run has loaded it already

    token = _RUN_TASK.set(asyncio.current_task())
    try:
        yield
    finally:
        _RUN_TASK.reset(token)


def _cancelling(task: asyncio.Task[Any] | None) -> bool:
    """Whether `task` is being cancelled (read from any thread; Python 3.11+, else never)."""
    cancelling = getattr(task, "cancelling", None)
    return bool(cancelling()) if cancelling is not None else False


def _failing_line(exc: BaseException) -> int:
    """The template line an error comes from: jinja rewrites a render's traceback so that
    template code appears as frames of the file `<template>` at template lines (as Python
    shows source lines); the innermost one is where it failed."""
    line, trace = getattr(exc, "lineno", None) or 0, exc.__traceback__
    while trace is not None:
        if trace.tb_frame.f_code.co_filename == "<template>":
            line = _template_line(trace)
        trace = trace.tb_next
    return line


def _template_line(trace: Any) -> int:
    """A frame of template code: jinja's rewritten frames stand at the template line; a frame
    of the compiled template itself (a watchdog stop is never rewritten) maps through the
    template's debug info."""
    template = trace.tb_frame.f_globals.get("__jinja_template__")
    if template is None:
        return int(trace.tb_lineno)
    return int(template.get_corresponding_lineno(trace.tb_lineno))
