"""Commands in a bubblewrap sandbox: by default wherever bubblewrap works, `--isolate` to
require it, `--no-isolate` to run commands as the user (engine/run/team.py chooses).

Why the default (issue 26): a command from a shared file that runs as the user reads
sopctl's keys through `/proc/$PPID/environ` and writes anywhere the user can; the sandbox
stops both and costs one `bwrap` start per command. Where bwrap is missing or cannot make
namespaces (some containers), the run goes on unisolated and says so when it starts, as the
run did before; `--isolate` refuses instead.

Unsandboxed, a command runs as the user: it reads what the user can read, including sopctl's
own environment through `/proc/$PPID/environ` (the allowlisted environment only narrows what
it is *given*). With it, each command runs under `bwrap`:

- `/` read-only, the workspace read-write (the one place a run writes) except its `.sopctl`
  (the journal and its lock), a private `/tmp` (where the program or this Python's
  environment lives under /tmp, that stays visible, read-only);
- a new PID namespace with its own `/proc`: sopctl and every other process are invisible,
  and when the command ends the kernel kills whatever it left in there;
- no network (a private loopback only) unless `--allow-network`;
- no capabilities, a new session (no terminal injection), and the sandbox dies with sopctl.

With `--isolate`, bwrap missing, or unable to create namespaces here (some containers forbid
it), refuses the run before it starts: isolation the user asked for is never silently dropped.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from engine.errors import RunError
from engine.load.spec import ENGINE_DIR

__all__ = ["Sandbox", "find_sandbox"]


_PROBE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Sandbox:
    """How to run one command isolated: bwrap's path and whether the network stays."""

    bwrap: str
    allow_network: bool = False

    def wrap(self, argv: list[str], workspace: Path, binds: tuple[Path, ...] = (),
             cwd: Path | None = None) -> list[str]:
        """`argv` as run inside the sandbox, in the workspace (its journal folder read-only);
        `binds`: folders of sopctl's own shared read-write with it (a kernel's sockets);
        `cwd`: another folder to run in (the SOP's, `workdir: sop`), bound read-only last."""
        engine_dir = str(workspace / ENGINE_DIR)
        shared = [arg for folder in binds for arg in ("--bind", str(folder), str(folder))]
        where = ["--ro-bind", str(cwd), str(cwd), "--chdir", str(cwd)] if cwd else ["--chdir", str(workspace)]
        return [self.bwrap, *self._options(), *_programs_under_tmp(argv), *shared,
                "--bind", str(workspace), str(workspace),
                "--ro-bind-try", engine_dir, engine_dir, *where, "--", *argv]

    def _options(self) -> list[str]:
        return ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
                "--unshare-pid", "--unshare-ipc", *([] if self.allow_network else ["--unshare-net"]),
                "--cap-drop", "ALL", "--new-session", "--die-with-parent"]


def _programs_under_tmp(argv: list[str]) -> list[str]:
    """Read-only binds for what the command runs from `/tmp`, which the sandbox replaces with
    its own: the program's folder, and this Python's environment (a venv under /tmp, as in a
    clone there: `python` in a command is this interpreter)."""
    places = {Path(sys.prefix)}
    if argv and Path(argv[0]).is_absolute():
        places.add(Path(argv[0]).parent)
    binds: list[str] = []
    for place in sorted(places):
        if place == Path("/tmp") or Path("/tmp") in place.parents:
            binds += ["--ro-bind-try", str(place), str(place)]
    return binds


def find_sandbox(allow_network: bool) -> Sandbox:
    """The sandbox `--isolate` asks for, checked to work here; RunError (exit 2) if it cannot."""
    found = shutil.which("bwrap")
    if found is None:
        raise RunError("--isolate needs bubblewrap (`bwrap`), which is not installed",
                       hint="install it (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install "
                            "bubblewrap), or pass --no-isolate inside a container or a throwaway VM")
    sandbox = Sandbox(found, allow_network)
    try:
        probe = subprocess.run([found, *sandbox._options(), "--", "true"], capture_output=True,
                               text=True, timeout=_PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL)
        problem = (probe.stderr.strip() or f"exit code {probe.returncode}") if probe.returncode else ""
    except (OSError, subprocess.TimeoutExpired) as exc:
        problem = str(exc)
    if problem:
        raise RunError(f"--isolate: bubblewrap cannot create a sandbox here: {problem}",
                       hint="this machine or container forbids the namespaces bwrap needs (user "
                            "namespaces); pass --no-isolate inside a container or a throwaway VM")
    return sandbox
