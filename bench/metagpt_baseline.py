"""MetaGPT 0.8.2 as a measured baseline: install it into its own venv, run its team offline.

MetaGPT is never a dependency of sopctl. This module creates ``bench/.cache/metagpt-venv``
on first use (the recipe in the shared metagpt-baseline notes: its pinned ``lancedb`` is
gone from PyPI and an unpinned ``agentops`` makes pip backtrack for minutes), then runs
``bench/metagpt_fake_llm.py`` inside that venv, which prints one JSON result per run.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from bench.scratch import scratch as scratch_folder

__all__ = [
    "METAGPT_VERSION",
    "cold_start",
    "ensure_installed",
    "installed_version",
    "run_team",
    "venv_python",
]

METAGPT_VERSION = "0.8.2"
BENCH_DIR = Path(__file__).resolve().parent
CACHE = BENCH_DIR / ".cache"
VENV = CACHE / "metagpt-venv"
RUNNER = BENCH_DIR / "metagpt_fake_llm.py"
_MARKER = VENV / ".installed-ok"
RUN_TIMEOUT_S = 600
# typer 0.9.0 (pinned by MetaGPT) breaks with click >= 8.2 ("Secondary flag is not valid"),
# so `metagpt --help` needs the click of its day. Changing the recipe re-runs the install.
_EXTRA_PINS = ["click<8.2"]
_RECIPE = f"metagpt=={METAGPT_VERSION} {' '.join(_EXTRA_PINS)}"


def venv_python() -> Path:
    """The interpreter of MetaGPT's private venv."""
    return VENV / "bin" / "python"


def _pip(*args: str) -> None:
    """pip in the private venv; its (noisy) output is shown only when it fails."""
    proc = subprocess.run([str(venv_python()), "-m", "pip", "--disable-pip-version-check", "-q",
                           *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"pip {' '.join(args[:2])} failed:\n{proc.stderr[-3000:]}")


def _requirements(wheel: Path) -> list[str]:
    """Requires-Dist lines without extras, minus lancedb, with agentops pinned, plus our pins."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode()
    reqs = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:") or "extra ==" in line:
            continue
        req = line.split(":", 1)[1].strip()
        name = re.split(r"[ <>=!~;\[(]", req, maxsplit=1)[0].lower()
        if name == "lancedb":
            continue
        reqs.append("agentops==0.3.10" if name == "agentops" else req)
    return reqs + _EXTRA_PINS


def ensure_installed(log=print) -> Path:
    """Create the venv and install MetaGPT once (about 3 minutes); idempotent."""
    if _MARKER.exists() and _MARKER.read_text().strip() == _RECIPE:
        return venv_python()
    log(f"installing metagpt=={METAGPT_VERSION} into {VENV} (one time, minutes) ...")
    CACHE.mkdir(parents=True, exist_ok=True)
    if not venv_python().exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    with tempfile.TemporaryDirectory() as tmp:
        _pip("download", "--no-deps", "-d", tmp, f"metagpt=={METAGPT_VERSION}")
        wheel = next(Path(tmp).glob("metagpt-*.whl"))
        req_file = Path(tmp) / "requirements.txt"
        req_file.write_text("\n".join(_requirements(wheel)) + "\n")
        _pip("install", "-r", str(req_file))
        _pip("install", "--no-deps", str(wheel))
    _MARKER.write_text(_RECIPE + "\n")
    return venv_python()


_CONFIG = """llm:
  api_type: "openai"
  model: "gpt-4-turbo"
  base_url: "http://127.0.0.1:9/v1"
  api_key: "sk-offline-benchmark"
mermaid:
  engine: "none"
"""


def offline_env(scratch: Path) -> dict[str, str]:
    """HOME with a dummy config2.yaml (MetaGPT refuses to import without one), scratch root."""
    home = scratch / "home"
    (home / ".metagpt").mkdir(parents=True, exist_ok=True)
    (home / ".metagpt" / "config2.yaml").write_text(_CONFIG)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI", "METAGPT"))}
    env.update(HOME=str(home), METAGPT_PROJECT_ROOT=str(scratch / "root"), PYTHONWARNINGS="ignore")
    (scratch / "root").mkdir(exist_ok=True)
    return env


def run_team(files: int, latency_ms: float, idea: str = "a command-line 2048 game",
             warm: bool = False, realistic: bool = False) -> dict:
    """One fresh process running MetaGPT's team (twice with `warm`; with `realistic`, on answers
    of a hosted model's size, bench/realistic_answers.py); its JSON result."""
    with scratch_folder("metagpt-bench-") as tmp:
        scratch = Path(tmp)
        env = offline_env(scratch)
        cmd = [str(venv_python()), str(RUNNER), "--files", str(files), "--latency-ms",
               str(latency_ms), "--idea", idea, "--root", env["METAGPT_PROJECT_ROOT"]]
        cmd += (["--warm"] if warm else []) + (["--realistic"] if realistic else [])
        # A malformed answer would make MetaGPT retry with random waits; never hang the bench.
        proc = subprocess.run(cmd, env=env, cwd=scratch / "root", capture_output=True, text=True,
                              timeout=RUN_TIMEOUT_S)
        if proc.returncode != 0:
            raise RuntimeError(f"MetaGPT run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    missing = set(result["files_expected"]) - set(result["files_written"])
    if missing or result["unknown_calls"]:
        raise RuntimeError(f"MetaGPT run incomplete: missing files {sorted(missing)}, "
                           f"{result['unknown_calls']} unrecognised prompts")
    return result


def cold_start() -> dict[str, float]:
    """Seconds for `metagpt --help` and for importing its team, each a fresh process."""
    with tempfile.TemporaryDirectory(prefix="metagpt-cold-") as tmp:
        env = offline_env(Path(tmp))
        cwd = env["METAGPT_PROJECT_ROOT"]
        help_s = _timed([str(VENV / "bin" / "metagpt"), "--help"], env, cwd)
        import_s = _timed([str(venv_python()), "-c", "import metagpt.software_company, "
                           "metagpt.provider.openai_api, metagpt.roles, metagpt.team"], env, cwd)
    return {"help_s": help_s, "import_s": import_s}


def _timed(cmd: list[str], env: dict[str, str], cwd: str) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, cwd=cwd, check=True, capture_output=True)
    return time.perf_counter() - t0


def installed_version() -> str | None:
    """MetaGPT's version if its venv is ready, without starting MetaGPT."""
    return METAGPT_VERSION if _MARKER.exists() else None


if __name__ == "__main__":
    ensure_installed()
    out = run_team(files=int(sys.argv[1]) if len(sys.argv) > 1 else 3, latency_ms=0)
    out.pop("prompts")
    print(json.dumps(out, indent=2))
