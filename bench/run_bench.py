"""Runs on the `fake` model: the interpreter's own cost, and how well it overlaps latency.

Three figures, each a ratio measured in this run (never an absolute time in a test):

1. **Engine overhead per LLM call** at 0 ms latency: a whole run (compile excluded; rounds,
   routing, templates, context, events, the gateway, and 21 artifacts written atomically)
   divided by its model calls, in µs per call, next to the gateway alone answering the same
   requests (its floor), and the same run without artifacts: most of a run's cost is the
   confined, atomic file writes (realpath + temp file + rename per artifact); the
   interpreter's own share is the run without files minus the gateway.
2. **Wall time / critical path** at `SOPCTL_FAKE_LATENCY_MS=200`: a 5-stage SOP
   (PRD -> design -> task list -> a 20-file fan-out -> review) whose longest chain of calls
   that must happen one after another is 5; the ideal is 5 × 200 ms. Target <= 1.1.
3. **A 20-item fan-out / one call**: the fan-out action's time from start to completion
   divided by one call's 200 ms latency. Sequential would be 20; the target is about 1.

    python -m bench.run_bench
    python -c "from bench.run_bench import main; main(size_factor=0.05)"   # smoke
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

__all__ = ["main", "BENCH_SOP"]

LATENCY_MS = 200
FAN_OUT = 20
CRITICAL_PATH = 5

BENCH_SOP = """
apiVersion: sop/v1
name: run_bench
inputs: {idea: {type: str, required: true}}
team: {max_rounds: 10, env_desc: a benchmark company}
actions:
  WritePRD:
    prompt: "Write the PRD for {{ inputs.idea }}."
    context: [UserRequirement]
    output:
      Project Name: {type: str, instruction: snake_case}
      Product Goals: {type: "list[str]", instruction: goals}
      Requirement Pool: {type: "list[list[str]]", instruction: "[priority, item]"}
    artifacts: [{path: docs/prd.json, content: "{{ out | tojson(indent=2) }}"}]
  WriteDesign:
    prompt: "Design {{ msgs.WritePRD[-1].out['Project Name'] }}."
    context: [WritePRD]
    output:
      Implementation approach: {type: str, instruction: how}
      File list: {type: "list[str]", instruction: files}
  WriteTasks:
    prompt: "List the files to write, in order."
    context: [WriteDesign]
    output:
      Task list: {type: "list[str]", instruction: files in dependency order}
  WriteCode:
    for_each: "{{ files }}"
    as: filename
    max_concurrency: 32
    prompt: "Write {{ filename }} for {{ msgs.WritePRD[-1].out['Project Name'] }}."
    context: [WriteDesign]
    output: {code: python}
    artifacts: [{path: "src/{{ filename }}", content: "{{ out }}"}]
  Review:
    prompt: "Review the code."
    context: none
    output: text
    send_to: ["<none>"]
roles:
  ProductManager: {name: Alice, profile: Product Manager, actions: [WritePRD], watch: [UserRequirement]}
  Architect: {name: Bob, profile: Architect, actions: [WriteDesign], watch: [WritePRD]}
  ProjectManager: {name: Eve, profile: Project Manager, actions: [WriteTasks], watch: [WriteDesign]}
  Engineer: {name: Alex, profile: Engineer, actions: [WriteCode], watch: [WriteTasks]}
  Reviewer: {name: Edward, profile: QA Engineer, actions: [Review], watch: [WriteCode]}
"""


def _compiled(files: int, artifacts: bool = True) -> Any:
    from engine.compile.compiler import compile_text

    names = ", ".join(f"'f{i:02d}.py'" for i in range(files))
    text = BENCH_SOP.replace("{{ files }}", f"{{{{ [{names}] }}}}")
    if not artifacts:
        text = "\n".join(line for line in text.splitlines() if "artifacts:" not in line)
    return compile_text(text, "<bench>")


class _Clock:
    """Observer: when the fan-out action started and completed."""

    def __init__(self) -> None:
        self.started: float | None = None
        self.completed: float | None = None

    def on_event(self, event: Any) -> None:
        if getattr(event, "action", "") == "WriteCode":
            name = type(event).__name__
            if name == "ActionStarted":
                self.started = time.perf_counter()
            elif name == "ActionCompleted":
                self.completed = time.perf_counter()


def _run(compiled: Any, latency_ms: int, gateway: Any = None) -> tuple[float, Any, _Clock]:
    from engine import api

    os.environ["SOPCTL_FAKE_LATENCY_MS"] = str(latency_ms)
    clock = _Clock()
    with tempfile.TemporaryDirectory() as tmp:
        options: dict[str, Any] = {"gateway": gateway} if gateway is not None else {}
        start = time.perf_counter()
        result = api.run(compiled, {"idea": "a command-line 2048 game"}, model="fake",
                         workspace=tmp, observers=[clock], journal=False, **options)
        wall = time.perf_counter() - start
    if result.status != "idle":
        raise RuntimeError(f"bench run ended {result.status}: {result.error}")
    return wall, result, clock


def _gateway_floor_us(compiled: Any, repeats: int) -> float:
    """The same requests answered by a bare gateway: the part of a call the engine cannot skip."""
    from engine.models.gateway import Gateway

    requests: list[Any] = []

    class Recording(Gateway):
        async def call(self, spec: Any) -> Any:
            requests.append(spec)
            return await super().call(spec)

    _run(compiled, 0, Recording())

    async def answer_all() -> None:
        gateway = Gateway()
        for spec in requests:
            await gateway.call(spec)

    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        asyncio.run(answer_all())
        best = min(best, (time.perf_counter() - start) / len(requests) * 1e6)
    return best


def _best_us_per_call(compiled: Any, repeats: int) -> float:
    _run(compiled, 0)  # warm up imports and caches
    per_call = []
    for _ in range(repeats):
        wall, result, _ = _run(compiled, 0)
        per_call.append(wall / result.llm_calls * 1e6)
    return min(per_call)


def overhead(size_factor: float) -> dict[str, float]:
    repeats = max(3, int(15 * size_factor))
    compiled = _compiled(FAN_OUT)
    run_us = _best_us_per_call(compiled, repeats)
    bare_us = _best_us_per_call(_compiled(FAN_OUT, artifacts=False), repeats)
    floor_us = _gateway_floor_us(compiled, repeats)
    return {"run_us_per_call": run_us, "run_without_files_us_per_call": bare_us,
            "gateway_us_per_call": floor_us, "engine_us_per_call": max(bare_us - floor_us, 0.0),
            "ratio_to_gateway": bare_us / floor_us}


def latency(size_factor: float) -> dict[str, float]:
    repeats = max(1, int(3 * size_factor))
    compiled = _compiled(FAN_OUT)
    walls, fans = [], []
    for _ in range(repeats):
        wall, result, clock = _run(compiled, LATENCY_MS)
        walls.append(wall)
        fans.append((clock.completed or 0) - (clock.started or 0))
    one = LATENCY_MS / 1000
    return {"wall_s": statistics.median(walls), "critical_path_s": CRITICAL_PATH * one,
            "wall_over_critical_path": statistics.median(walls) / (CRITICAL_PATH * one),
            "fan_out_s": statistics.median(fans), "fan_out_over_one_call": statistics.median(fans) / one}


def main(size_factor: float = 1.0) -> dict[str, Any]:
    previous = os.environ.get("SOPCTL_FAKE_LATENCY_MS")
    try:
        cost = overhead(size_factor)
        lat = latency(size_factor)
    finally:
        if previous is None:
            os.environ.pop("SOPCTL_FAKE_LATENCY_MS", None)
        else:
            os.environ["SOPCTL_FAKE_LATENCY_MS"] = previous
    rows = [
        "| figure | value | target |", "|---|---|---|",
        f"| whole run, µs per LLM call (fake, 0 ms; 21 files written) | {cost['run_us_per_call']:.0f} | |",
        f"| same run without artifacts, µs per call | {cost['run_without_files_us_per_call']:.0f} | |",
        f"| gateway alone, µs per call (same requests) | {cost['gateway_us_per_call']:.0f} | |",
        f"| interpreter's share (without files), µs per call | {cost['engine_us_per_call']:.0f} | |",
        f"| run without files / gateway alone | {cost['ratio_to_gateway']:.2f} | |",
        f"| wall time / critical path ({CRITICAL_PATH} × {LATENCY_MS} ms) | "
        f"**{lat['wall_over_critical_path']:.3f}** | <= 1.1 |",
        f"| {FAN_OUT}-item fan-out / one call ({LATENCY_MS} ms) | "
        f"**{lat['fan_out_over_one_call']:.3f}** | about 1 (sequential: {FAN_OUT}) |",
    ]
    markdown = "\n".join(rows)
    print(markdown)
    return {**cost, **lat, "ratio": lat["wall_over_critical_path"], "target": 1.1,
            "markdown": markdown}


if __name__ == "__main__":
    main()
