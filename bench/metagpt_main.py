"""MetaGPT's main branch (RoleZero, MGX) as a measured baseline, in its own venv.

MetaGPT 0.8.2 (bench.metagpt_baseline) has no RoleZero, so tool loops are compared with
MetaGPT main, installed from its source (version 1.0.0 at ba2868974b2e was measured). It is
never installed by a bench on its own (the source is a git checkout, not a package index
entry); the recipe, about 8 minutes:

    git clone https://github.com/geekan/MetaGPT bench/.cache/metagpt-main-src
    python -m bench.metagpt_main install       # the venv bench/.cache/metagpt-main-venv

(A snapshot of the source unpacked without its .git works too: put its commit in
`bench/.cache/metagpt-main-src/COMMIT` so the report can name it.)

`install` makes the venv with python3.11, installs MetaGPT's `requirements.txt` without its
comments and without `lancedb==0.4.0` (gone from the index; only its document store uses
it), then the source itself with `--no-deps -e`. `SOPCTL_METAGPT_MAIN_VENV` points at a venv
made elsewhere. When the venv is missing, the benches that use it say so and measure sopctl
alone (`available()`); they never fail for it.

`rolezero` starts bench/metagpt_rolezero.py inside that venv (`rolezero_requests` records
one loop with it; `mgx_run` / `mgx_requests` record MGX's whole default team with
bench/metagpt_mgx.py), offline: HOME holds a dummy
config (MetaGPT refuses to import without one), and TIKTOKEN_CACHE_DIR a copy of the
`cl100k_base` file litellm ships (MetaGPT's editor counts tokens; tiktoken would otherwise
download the encoding).
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from bench.metagpt_baseline import offline_env

__all__ = ["VENV", "SOURCE", "available", "venv_python", "install", "rolezero", "mgx_team", "rolezero_requests",
           "mgx_run", "mgx_requests"]

BENCH_DIR = Path(__file__).resolve().parent
CACHE = BENCH_DIR / ".cache"
SOURCE = CACHE / "metagpt-main-src"
VENV = Path(os.environ.get("SOPCTL_METAGPT_MAIN_VENV") or CACHE / "metagpt-main-venv")
RUNNER = BENCH_DIR / "metagpt_rolezero.py"
MGX_RUNNER = BENCH_DIR / "metagpt_mgx.py"
RUN_TIMEOUT_S = 900
REPLY = "@@rolezero-bench "   # metagpt_rolezero.REPLY (metagpt_mgx's too): its replies among what MetaGPT prints
_TIKTOKEN_FILE = "9b5ad71b2ce5302211f9c61530b329a4922fc6a4"   # cl100k_base, as tiktoken names it


def venv_python() -> Path:
    return VENV / "bin" / "python"


def available() -> str | None:
    """None when MetaGPT main's venv is ready, else why not (for the bench to say)."""
    if not venv_python().exists():
        return f"no MetaGPT main venv at {VENV} (see bench/metagpt_main.py to install one)"
    # find_spec of the top package only: importing metagpt would need its config
    probe = subprocess.run([str(venv_python()), "-c", "import importlib.util as u, pathlib as p; "
                            "s = u.find_spec('metagpt'); print(s is not None and (p.Path(s.origin).parent"
                            " / 'roles' / 'di' / 'role_zero.py').exists())"],
                           capture_output=True, text=True)
    if probe.stdout.strip() != "True":
        return f"the venv at {VENV} has no MetaGPT with RoleZero"
    return None


def install(source: Path = SOURCE) -> Path:
    """Make the venv and install MetaGPT main from `source` (minutes); see the docstring."""
    if not (source / "requirements.txt").exists():
        raise SystemExit(f"no MetaGPT source at {source}: git clone https://github.com/geekan/MetaGPT there")
    if not venv_python().exists():
        subprocess.run(["python3.11", "-m", "venv", str(VENV)], check=True)
    lines = [line.split("#", 1)[0].strip() for line in (source / "requirements.txt").read_text().splitlines()]
    wanted = [line for line in lines if line and not line.startswith("lancedb")]
    with tempfile.TemporaryDirectory() as tmp:
        reqs = Path(tmp) / "requirements.txt"
        reqs.write_text("\n".join(wanted) + "\n")
        pip = [str(venv_python()), "-m", "pip", "--disable-pip-version-check", "-q", "install"]
        subprocess.run([*pip, "-r", str(reqs)], check=True)
        subprocess.run([*pip, "--no-deps", "-e", str(source)], check=True)
    return venv_python()


def _offline_env(scratch: Path) -> dict[str, str]:
    """The 0.8.2 side's offline environment, and tiktoken's encoding file offline (main's
    Editor counts tokens, and tiktoken would download it)."""
    env = offline_env(scratch)
    tokens = _tiktoken_file()
    if tokens is not None:
        (scratch / "tiktoken").mkdir(exist_ok=True)
        shutil.copy(tokens, scratch / "tiktoken" / _TIKTOKEN_FILE)
        env["TIKTOKEN_CACHE_DIR"] = str(scratch / "tiktoken")
    return env


def _tiktoken_file() -> Path | None:
    """litellm's copy of cl100k_base, found without importing litellm (seconds)."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "litellm_core_utils" / "tokenizers" / _TIKTOKEN_FILE
    return path if path.exists() else None


def rolezero(small: int, large: int, role: str = "rolezero") -> contextlib.AbstractContextManager[
        tuple[dict, Callable[[], float]]]:
    """A RoleZero process (bench/metagpt_rolezero.py; `role`: a bare RoleZero with the Plan tool,
    or `engineer2`, MGX's engineer) ready to measure: see `_measuring`."""
    return _measuring([str(RUNNER), "--steps", f"{small},{large}", "--role", role], "RoleZero")


def mgx_team(small: int, large: int) -> contextlib.AbstractContextManager[tuple[dict, Callable[[], float]]]:
    """MetaGPT main's MGX team (bench/metagpt_mgx.py --cpu) ready to measure the CPU per extra
    step of its engineer's loop inside the team: see `_measuring`."""
    return _measuring([str(MGX_RUNNER), "--cpu", f"{small},{large}"], "MGX team")


@contextlib.contextmanager
def _measuring(command: list[str], what: str) -> Iterator[tuple[dict, Callable[[], float]]]:
    """A process of MetaGPT main's venv running `command` (a script and its arguments) ready to
    measure: yields its ready line (with the version and this checkout's commit) and a function
    that runs one pair of runs and returns its CPU seconds per extra step. Raises RuntimeError
    if the process fails."""
    with tempfile.TemporaryDirectory(prefix="metagpt-main-bench-") as tmp, \
            open(Path(tmp) / "stderr", "w+") as err:
        env = _offline_env(Path(tmp))
        proc = subprocess.Popen([str(venv_python()), *command], env=env,
                                cwd=env["METAGPT_PROJECT_ROOT"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err, text=True)
        watchdog = threading.Timer(RUN_TIMEOUT_S, proc.kill)   # a hung run must not hang the bench
        watchdog.start()
        assert proc.stdin is not None and proc.stdout is not None

        def answer() -> dict:
            for line in proc.stdout:
                if line.startswith(REPLY):
                    return json.loads(line[len(REPLY):])
            err.seek(0)
            raise RuntimeError(f"MetaGPT main's {what} process ended ({proc.wait()}):\n{err.read()[-3000:]}")

        def pair() -> float:
            proc.stdin.write("pair\n")
            proc.stdin.flush()
            result = answer()
            if result["unknown_calls"]:
                raise RuntimeError(f"MetaGPT main asked {result['unknown_calls']} prompt(s) the script does not know")
            return float(result["cpu_s_per_step"])

        try:
            yield {**answer(), "commit": _source_commit()}, pair
        finally:
            watchdog.cancel()
            proc.stdin.close()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _source_commit() -> str | None:
    """The checkout's commit, so the report says which MetaGPT main was measured: a clone's
    HEAD, else the first line of a `COMMIT` file beside the source (a snapshot unpacked
    without its .git; git would otherwise answer for the repository around it)."""
    if not (SOURCE / ".git").exists():
        stamp = SOURCE / "COMMIT"
        if not stamp.exists():
            return None
        return stamp.read_text(encoding="utf-8").split("\n", 1)[0].strip()[:12] or None
    proc = subprocess.run(["git", "-C", str(SOURCE), "rev-parse", "--short=12", "HEAD"],
                          capture_output=True, text=True)
    return proc.stdout.strip() or None


def rolezero_requests(steps: int) -> list[list[dict]]:
    """The requests (each its messages) of one RoleZero loop of `steps` steps on the scripted
    model, its clock moving as a hosted model's answers would move it (bench/metagpt_rolezero.py
    --record). Raises RuntimeError if the process fails."""
    return list(_recorded([str(RUNNER), "--record", str(steps)], "RoleZero")["requests"])


def mgx_run() -> dict:
    """MetaGPT main's MGX team (TeamLeader, ProductManager, Architect, Engineer2, DataAnalyst in
    an MGXEnv) on bench/mgx_scenario.py's scripted scenario (bench/metagpt_mgx.py --record):
    `requests` (each its messages), `calls` (each request's role and kind, e.g. "Alice:
    summary") and the files it wrote. Raises RuntimeError if the process fails or a file is
    missing."""
    found = _recorded([str(MGX_RUNNER), "--record"], "MGX team")
    missing = set(found["files_expected"]) - set(found["files_written"])
    if missing:
        raise RuntimeError(f"MetaGPT main's MGX team did not write {sorted(missing)} ({found['calls']})")
    return found


def mgx_requests() -> list[list[dict]]:
    """The requests (each its messages) of MetaGPT main's MGX team on the scripted scenario
    (`mgx_run`). Raises RuntimeError if the process fails."""
    return list(mgx_run()["requests"])


def _recorded(command: list[str], what: str) -> dict:
    """Runs one of the recording scripts (`command`: the script and its arguments) in MetaGPT
    main's venv, offline, and returns its reply; RuntimeError if it fails, or if MetaGPT asked
    something the script does not know."""
    with tempfile.TemporaryDirectory(prefix="metagpt-main-bench-") as tmp:
        env = _offline_env(Path(tmp))
        proc = subprocess.run([str(venv_python()), *command], env=env, cwd=env["METAGPT_PROJECT_ROOT"],
                              capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    for line in proc.stdout.splitlines():
        if line.startswith(REPLY):
            found: dict = json.loads(line[len(REPLY):])
            if found["unknown_calls"]:
                raise RuntimeError(f"MetaGPT main asked {found['unknown_calls']} prompt(s) the script does not know")
            return found
    raise RuntimeError(f"MetaGPT main's {what} process ended ({proc.returncode}):\n{proc.stderr[-3000:]}")


if __name__ == "__main__":
    if sys.argv[1:] == ["install"]:
        print(install())
    else:
        print(available() or f"ready: {venv_python()}")

