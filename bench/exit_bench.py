"""A prompt exit: seconds from the last line a run prints to the end of its process.

`sopctl run --format json` of a one-action SOP, in a fresh process, for `fake`, `local`
(the bundled GGUF model, when installed) and an `openai/` model sent through litellm
(`SOPCTL_OPENAI_VIA_LITELLM=1`) to the stub server of bench.hosted_bench. The bench reads
the process's output as it comes and times the gap between the last line and the exit;
min / median / max of `REPEATS`. Beside it, the same run through `main()` and a plain
`sys.exit` (the interpreter's whole shutdown: how sopctl exited before issue 28), in the
same bench; the ratio is this one's median over that one's.

    python -m bench.exit_bench
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

__all__ = ["main"]

ROOT = Path(__file__).resolve().parent.parent
REPEATS = 3
SOP = """apiVersion: sop/v1
name: exit_bench
inputs:
  idea: {required: true}
actions:
  Say:
    prompt: "Say one word about {{ inputs.idea }}."
roles:
  Speaker:
    actions: [Say]
    watch: [UserRequirement]
"""
_ENTRY = {"now": "from engine.cli.commands import entry; entry()",
          "before": "import sys; from engine.cli.commands import main; sys.exit(main())"}


def _gap(code: str, args: list[str], env: dict[str, str]) -> float:
    """One run: seconds from its last line of output to its exit."""
    proc = subprocess.Popen([sys.executable, "-c", code, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    last, lines = time.perf_counter(), []
    assert proc.stdout is not None
    for line in proc.stdout:
        last = time.perf_counter()
        lines.append(line.decode(errors="replace"))
    proc.wait()
    ended = time.perf_counter()
    if proc.returncode != 0:
        raise RuntimeError(f"the run failed ({proc.returncode}): {''.join(lines[-5:])}")
    return ended - last


def _side(model: str, folder: Path, env: dict[str, str], api_base: str, repeats: int) -> dict[str, Any]:
    sop = folder / "exit.sop.yaml"
    sop.write_text(SOP)
    args = ["run", str(sop), "--model", model, "--idea", "a game", "--format", "json"]
    if api_base:
        args += ["--api-base", api_base]
    out: dict[str, Any] = {}
    for name, code in _ENTRY.items():
        gaps = [_gap(code, [*args, "--out", str(folder / f"ws-{model.replace('/', '-')}-{name}-{i}")], env) for i in range(repeats)]
        out[name] = {"min": min(gaps), "median": statistics.median(gaps), "max": max(gaps)}
    out["ratio"] = out["now"]["median"] / max(out["before"]["median"], 1e-6)
    return out


def main(size_factor: float = 1.0) -> dict[str, Any]:
    from bench.hosted_bench import _env, _Stub

    repeats = REPEATS if size_factor >= 1 else 1
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/v1"
    sides: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="sopctl-exit-") as tmp:
            env = {**_env(False), "SOPCTL_FAKE_LATENCY_MS": "0"}
            sides["fake"] = _side("fake", Path(tmp), env, "", repeats)
            try:
                from engine.models.local import model_path

                if not model_path().exists():
                    raise FileNotFoundError(model_path())
                sides["local"] = _side("local", Path(tmp), env, "", repeats)
            except (ImportError, OSError, RuntimeError) as exc:
                sides["local"] = {"skipped": f"{type(exc).__name__}: {exc}"[:200]}
            sides["litellm"] = _side("openai/stub", Path(tmp), _env(True), base, repeats)
    finally:
        server.shutdown()
    rows = [f"Seconds from the last line printed to the process's end ({repeats} runs each; "
            "`before`: the same run ended by the interpreter's whole shutdown):", "",
            "| model | now: min | median | max | before: median | now / before |", "|---|---|---|---|---|---|"]
    for name, side in sides.items():
        if "skipped" in side:
            rows.append(f"| {name} | skipped: {side['skipped']} | | | | |")
            continue
        rows.append(f"| {name} | {side['now']['min']:.3f} | {side['now']['median']:.3f} | "
                    f"{side['now']['max']:.3f} | {side['before']['median']:.3f} | {side['ratio']:.2f} |")
    result: dict[str, Any] = {"sides": sides, "markdown": "\n".join(rows)}
    if "ratio" in sides.get("litellm", {}):
        result.update(ratio=round(sides["litellm"]["ratio"], 3), target="< 1", ratio_label=(
            "last line to exit through litellm, sopctl's prompt exit / the interpreter's shutdown"))
    print(result["markdown"])
    return result


if __name__ == "__main__":
    main()
