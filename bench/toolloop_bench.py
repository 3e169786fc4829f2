"""Engine time per tool-loop step, excluding the model's and the tools' own time.

One tool-using action runs `STEPS` steps on a scripted model that answers at once; each
step gives one `plan.append_task` (an in-memory command: its own time is negligible, but it
goes through everything a command goes through: schema check, events, the prompt of the
next step with the plan's status and the steps so far) and the last step `end`. The
figure is (wall time of the run - model seconds - tool seconds, as the run's events report
them) / steps, median of `REPEATS` runs, with and without the journal (a SQLite file in a
temporary folder, every answer and event committed).

    python -m bench.toolloop_bench
    python -c "from bench.toolloop_bench import main; main(steps=5, repeats=1)"   # smoke

The target is at most 2 ms per step without the journal.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

__all__ = ["main"]

SOP = """
apiVersion: sop/v1
name: toolloop_bench
inputs:
  idea: {required: true}
actions:
  Work:
    prompt: "Plan {{ inputs.idea }}"
    tools: [plan, editor]
    max_steps: 100
roles:
  Worker:
    actions: [Work]
    watch: [UserRequirement]
"""


def _answers(steps: int) -> list[dict[str, Any]]:
    plan = [{"thought": "plan", "commands": [{"command_name": "plan.append_task",
                                              "args": {"task_id": str(i), "instruction": f"task {i}"}}]}
            for i in range(steps - 1)]
    return [*plan, {"thought": "done", "commands": [{"command_name": "end", "args": {"answer": "planned"}}]}]


def _one(steps: int, journal: bool) -> float:
    from engine import api
    from engine.compile.compiler import compile_text
    from engine.models.gateway import Gateway
    from engine.run.events import ModelAnswered, ToolCalled
    from engine.testing import ScriptedModel

    class Sink:
        def __init__(self) -> None:
            self.outside = 0.0

        def on_event(self, event: Any) -> None:
            if isinstance(event, (ModelAnswered, ToolCalled)):
                self.outside += event.seconds

    model = ScriptedModel(_answers(steps))
    sink = Sink()
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        result = api.run(compile_text(SOP), {"idea": "a game"}, journal=journal, observers=[sink],
                         gateway=Gateway(providers={"local": model}), workspace=Path(folder) / "ws",
                         model="local")
        wall = time.perf_counter() - started
    assert result.status == "idle", result.error
    return (wall - sink.outside) / steps


TARGET_MS = 2.0


def main(size_factor: float = 1.0, steps: int | None = None, repeats: int | None = None) -> dict[str, Any]:
    steps = steps or max(4, int(40 * size_factor))
    repeats = repeats or max(1, int(5 * min(size_factor, 1.0)))
    figures: dict[str, Any] = {}
    for journal in (False, True):
        runs = [_one(steps, journal) for _ in range(repeats)]
        figures["with journal" if journal else "no journal"] = {
            "engine_ms_per_step": round(statistics.median(runs) * 1000, 3),
            "min_ms": round(min(runs) * 1000, 3), "steps": steps, "repeats": repeats}
    bare = figures["no journal"]["engine_ms_per_step"]
    figures["target_met"] = bare <= TARGET_MS
    figures["markdown"] = "\n".join([
        f"A tool loop of {steps} steps on a model that answers at once (median of {repeats}):", "",
        "| figure | value | target |", "|---|---|---|",
        f"| engine time per step, no journal | {bare:.2f} ms | <= {TARGET_MS:g} ms "
        f"({'met' if figures['target_met'] else 'not met'}) |",
        f"| engine time per step, journaled | {figures['with journal']['engine_ms_per_step']:.2f} ms | |"])
    print(figures["markdown"])
    return figures


if __name__ == "__main__":
    main()
