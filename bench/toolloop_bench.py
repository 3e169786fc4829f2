"""Engine time per tool-loop step, and CPU per tool step beside MetaGPT main's RoleZero.

One tool-using action runs `STEPS` steps on a scripted model that answers at once; each
step gives one `plan.append_task` (an in-memory command: its own time is negligible, but it
goes through everything a command goes through: schema check, events, the prompt of the
next step with the plan's status and the steps so far) and the last step `end`. Two figures:

- engine time per step: (wall time of the run - model seconds - tool seconds, as the run's
  events report them) / steps, min / median / max of 5 runs, with and without the
  journal (a SQLite file in a temporary folder, every answer and event committed); target
  2 ms without;
- CPU per extra tool step, sopctl and MetaGPT main in the same run: (CPU of a run of STEPS
  steps - CPU of a run of a few) / the steps between, so each run's fixed costs cancel out;
  min / median / max of `CPU_ROUNDS` rounds (9), each one pair of runs of sopctl, of sopctl
  journaled and of MetaGPT in turn, and the ratios per round (min / median / max), so a
  shared machine's changing load hits both sides of a ratio alike. MetaGPT runs the same
  scenario (its Plan.append_task, in its own answer format, then `end`) on a scripted model in
  MetaGPT main's own venv (bench/metagpt_rolezero.py): its prompt building, command parsing,
  duplicate check and tools all run for real. Three loops (SCENARIOS): the plan tool alone (a
  bare RoleZero), an MGX engineer alone (sops/mgx_team.sop.yaml's WriteCode tools beside MGX's
  Engineer2 with its default tools: its every step reads the terminal's folder and renders its
  tools' schemas and examples), and that engineer inside the whole MGX team (sops/mgx_team.sop.yaml
  beside MetaGPT main's MGX team on bench/mgx_scenario.py's scenario, its engineer planning
  the extra parts one step each: the scenario the issue's baseline was measured in). The
  summary's first row is the team's, the two loops alone beside it. Each round also measures
  a durable commit alone (`_durable_commits`: SQLite's commit of a step's rows and an
  fdatasync of its WAL, no engine code), the least a journaled step costs while every answer
  is on disk before the next request leaves, beside MetaGPT's step in the same round.

MetaGPT main is not on a package index: install it once (about 8 minutes) as
bench/metagpt_main.py says:

    git clone https://github.com/geekan/MetaGPT bench/.cache/metagpt-main-src
    python -m bench.metagpt_main install       # bench/.cache/metagpt-main-venv (python3.11)

Without that venv the MetaGPT side is skipped, and the bench says so (CI has none).

    python -m bench.toolloop_bench
    python -c "from bench.toolloop_bench import main; main(steps=5, repeats=1)"   # smoke
"""

from __future__ import annotations

import contextlib
import functools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.scratch import scratch, work_root

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

__all__ = ["main"]

_SOP = """
apiVersion: sop/v1
name: toolloop_bench
inputs:
  idea: {required: true}
actions:
  Work:
    prompt: "Plan {{ inputs.idea }}"
    tools: TOOLS
    max_steps: 100
roles:
  Worker:
    actions: [Work]
    watch: [UserRequirement]
"""

SCENARIOS: dict[str, dict[str, Any]] = {
    # the loop alone: sopctl's plan and editor, a RoleZero holding the Plan tool alone
    "plan": {"tools": ["plan", "editor"], "role": "rolezero", "label": "MetaGPT main RoleZero, Plan tool alone",
             "summary": "the plan tool alone (sopctl / MetaGPT main's RoleZero, median of rounds)"},
    # an MGX engineer: the tools of sops/mgx_team.sop.yaml's WriteCode beside MGX's Engineer2 with
    # its default tools (the issue's own baseline: the roles of the MGX team)
    "engineer": {"tools": ["editor", "terminal", "plan", "human.ask"], "role": "engineer2",
                 "label": "MetaGPT main Engineer2, its default tools",
                 "summary": "an MGX engineer's tools alone (sopctl / MetaGPT main's Engineer2, median of rounds)"},
    # the engineer's loop inside the whole MGX team (sops/mgx_team.sop.yaml beside MetaGPT
    # main's MGX team on bench/mgx_scenario.py's scenario): its steps are the extra ones
    "team": {"tools": None, "role": "mgx", "label": "MetaGPT main MGX team, its engineer's steps",
             "ours": "sops/mgx_team.sop.yaml, its engineer's steps in the team (Alex: editor, terminal, plan, human.ask)",
             "summary": "the MGX team's engineer in its team (sopctl's mgx_team / MetaGPT main's MGX team, "
                        "median of rounds)"},
}
"""Three loops measured beside MetaGPT main: each the same steps, with a different tool set
or team around it."""


def sop_text(tools: list[str]) -> str:
    """The bench's SOP: one action, a tool loop with `tools`."""
    return _SOP.replace("TOOLS", json.dumps(tools))


def _answers(steps: int) -> list[dict[str, Any]]:
    plan = [{"thought": "plan", "commands": [{"command_name": "plan.append_task",
                                              "args": {"task_id": str(i), "instruction": f"task {i}"}}]}
            for i in range(steps - 1)]
    return [*plan, {"thought": "done", "commands": [{"command_name": "end", "args": {"answer": "planned"}}]}]


def _one(steps: int, journal: bool, scenario: str = "plan") -> tuple[float, float]:
    """One run: engine seconds per step (wall less the model's and the tools' own), and the
    run's CPU seconds."""
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

    sink = Sink()
    if scenario == "team":   # the whole MGX team, its engineer taking `steps` extra steps
        from bench import mgx_scenario
        from bench.prefix_bench import TeamScript

        compiled = _team()
        model = ScriptedModel(TeamScript.for_sop(compiled, steps))
        inputs = {"idea": mgx_scenario.IDEA}
    else:
        model = ScriptedModel(_answers(steps))
        compiled = compile_text(sop_text(SCENARIOS[scenario]["tools"]))
        inputs = {"idea": "a game"}
    with scratch("sopctl-toolloop-") as folder:
        options = api.RunOptions(observers=[sink], gateway=Gateway(providers={"local": model}),
                                 workspace=Path(folder) / "ws", model="local", allow_exec=True)
        started, cpu = time.perf_counter(), time.process_time()
        result = api.run(compiled, inputs, options, journal=journal)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    assert result.status == "idle", result.error
    return (wall - sink.outside) / steps, cpu


@functools.lru_cache(maxsize=1)
def _team() -> Any:
    """sops/mgx_team.sop.yaml, compiled once (each run's compile is not what is measured)."""
    from engine.compile.compiler import compile_path

    return compile_path(Path(__file__).resolve().parent.parent / "sops" / "mgx_team.sop.yaml")


TARGET_MS = 2.0
CPU_ROUNDS = 9
"""Rounds of the CPU per extra step (each a pair of runs of every engine, in turn)."""


def _spread(values: list[float]) -> dict[str, float]:
    """min / median / max, in ms."""
    return {"min_ms": round(min(values) * 1000, 3), "median_ms": round(statistics.median(values) * 1000, 3),
            "max_ms": round(max(values) * 1000, 3)}


def _sopctl_pair(small: int, large: int, journal: bool, scenario: str) -> float:
    """CPU seconds per extra step: a run of `large` steps less one of `small`."""
    low, high = _one(small, journal, scenario)[1], _one(large, journal, scenario)[1]
    return (high - low) / (large - small)


def _durable_commits(count: int = 200) -> float:
    """CPU seconds of one durable commit of a step's size, on the disk the runs use: what a
    journaled step cannot do without while every answer is on disk before the next request
    leaves (issue 28, target 5). SQLite in WAL mode, as the journal: one transaction of two
    events (about 420 bytes of JSON each), an answer (150 bytes) and a compressed exchange
    (1 KB), the rows a plan step journals, then an fdatasync of the WAL. No engine code."""
    import hashlib
    import os
    import sqlite3

    with scratch("sopctl-durable-") as folder:
        path = Path(folder) / "floor.sqlite"
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.executescript("CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, json TEXT);"
                               "CREATE TABLE answers (hash TEXT PRIMARY KEY, text TEXT);"
                               "CREATE TABLE exchanges (hash TEXT PRIMARY KEY, data BLOB)")
            wal = os.open(f"{path}-wal", os.O_RDONLY)
            try:
                started = time.process_time()
                for index in range(count):
                    key = hashlib.sha256(str(index).encode()).hexdigest()
                    conn.execute("BEGIN IMMEDIATE")
                    conn.executemany("INSERT INTO events (json) VALUES (?)", [("e" * 420,), ("f" * 420,)])
                    conn.execute("INSERT INTO answers VALUES (?, ?)", (key, "a" * 150))
                    conn.execute("INSERT INTO exchanges VALUES (?, ?)", (key, os.urandom(1024)))
                    conn.execute("COMMIT")
                    os.fdatasync(wal)
                return (time.process_time() - started) / count
            finally:
                os.close(wal)
        finally:
            conn.close()


def _failed(exc: Exception) -> dict[str, str]:
    """Why the MetaGPT side stopped, on one line (it goes in a table cell)."""
    lines = f"MetaGPT main failed: {exc}".replace("|", "/").splitlines()
    return {"skipped": " / ".join(line.strip() for line in lines if line.strip())[-500:]}


def _cpu(small: int, large: int, repeats: int, with_metagpt: bool, scenario: str = "plan") -> dict[str, Any]:
    """CPU per extra step, sopctl (without and with the journal) and MetaGPT main's side of
    `scenario` (SCENARIOS), interleaved round by round (one pair of each per round), so a
    change of load on a shared machine hits all three alike; the ratios are per round. A
    MetaGPT failure skips its side only."""
    from bench import metagpt_main

    sides: dict[str, list[float]] = {"sopctl": [], "sopctl journaled": [], "durable commit": [], "metagpt": []}
    missing = metagpt_main.available() if with_metagpt else "not asked for"
    metagpt: dict[str, Any] = {"skipped": missing} if missing else {}
    with contextlib.ExitStack() as stack:
        pair = None
        if not missing:
            try:
                role = SCENARIOS[scenario]["role"]
                measuring = metagpt_main.mgx_team(small, large) if role == "mgx" else \
                    metagpt_main.rolezero(small, large, role)
                ready, pair = stack.enter_context(measuring)
                metagpt["version"] = " at ".join(str(v) for v in (ready["version"], ready["commit"]) if v)
            except (RuntimeError, OSError, ValueError) as exc:
                metagpt = _failed(exc)
        for _ in range(repeats):
            sides["sopctl"].append(_sopctl_pair(small, large, journal=False, scenario=scenario))
            sides["sopctl journaled"].append(_sopctl_pair(small, large, journal=True, scenario=scenario))
            sides["durable commit"].append(_durable_commits())
            if pair is not None and "skipped" not in metagpt:
                try:
                    sides["metagpt"].append(pair())
                except (RuntimeError, OSError, ValueError) as exc:
                    metagpt = _failed(exc)
    cpu: dict[str, Any] = {"scenario": scenario, "steps": [small, large], "repeats": repeats, "sopctl": _spread(sides["sopctl"]),
                           "sopctl journaled": _spread(sides["sopctl journaled"]),
                           "durable commit": _spread(sides["durable commit"]),
                           "metagpt": metagpt if "skipped" in metagpt else {**metagpt, **_spread(sides["metagpt"])}}
    if "skipped" not in metagpt:
        for name, key in (("sopctl", "ratio"), ("sopctl journaled", "ratio_journaled"),
                          ("durable commit", "ratio_durable")):
            rounds = [ours / theirs for ours, theirs in zip(sides[name], sides["metagpt"], strict=True)]
            cpu[key] = round(statistics.median(rounds), 3)
            cpu[key + "_range"] = [round(min(rounds), 3), round(max(rounds), 3)]
    return cpu


def main(size_factor: float = 1.0, steps: int | None = None, repeats: int | None = None,
         with_metagpt: bool = True) -> dict[str, Any]:
    with work_root():   # every run's workspace kept until the end (bench/scratch.py says why)
        return _measure(size_factor, steps, repeats, with_metagpt)


def _measure(size_factor: float, steps: int | None, repeats: int | None,
             with_metagpt: bool) -> dict[str, Any]:
    steps = steps or max(4, int(40 * size_factor))
    # CPU per extra step is a difference of two runs' CPU, each with its own noise, on both
    # sides of a ratio: its median takes nine rounds (the engine times above, five runs)
    rounds = repeats or max(1, int(CPU_ROUNDS * min(size_factor, 1.0)))
    repeats = repeats or max(1, int(5 * min(size_factor, 1.0)))
    small = max(2, steps // 8)
    figures: dict[str, Any] = {}
    _one(small, False)                   # untimed: imports, caches, the compiled SOP
    for journal in (False, True):
        runs = [_one(steps, journal)[0] for _ in range(repeats)]
        figures["with journal" if journal else "no journal"] = {
            **_spread(runs), "engine_ms_per_step": round(statistics.median(runs) * 1000, 3),
            "steps": steps, "repeats": repeats}
    # the engineer's loop inside the team: at most 30 extra steps (Engineer2's max_react_loop is 40)
    cpus = {name: _cpu(small, min(steps, 30) if name == "team" else steps, rounds, with_metagpt, name)
            for name in SCENARIOS}
    # the summary's rows (issue 28, target 4): sopctl as it runs by default, with its journal; the
    # team first (the baseline the issue measured), then each loop alone
    rows = [(f"CPU per extra tool step, journaled, {SCENARIOS[name]['summary']}", cpus[name]["ratio_journaled"],
             "<= 0.25") for name in ("team", "engineer", "plan") if "ratio" in cpus[name]]
    if rows:
        (label, ratio, target), *more = rows
        figures.update(ratio=ratio, target=target, ratio_label=label, more_ratios=more)
    figures["cpu per extra step"] = cpus
    bare = figures["no journal"]["engine_ms_per_step"]
    figures["target_met"] = bare <= TARGET_MS
    figures["markdown"] = "\n".join([
        f"A tool loop of {steps} steps on a model that answers at once ({repeats} runs each):", "",
        "| figure | min | median | max | target |", "|---|---|---|---|---|",
        _row("engine time per step, no journal", figures["no journal"],
             f"<= {TARGET_MS:g} ms ({'met' if figures['target_met'] else 'not met'})"),
        _row("engine time per step, journaled", figures["with journal"], ""),
        *(line for name in SCENARIOS for line in ["", *_cpu_table(cpus[name])])])
    print(figures["markdown"])
    return figures


def _row(label: str, side: dict[str, float], last: str) -> str:
    return f"| {label} | {side['min_ms']:.2f} ms | {side['median_ms']:.2f} ms | {side['max_ms']:.2f} ms | {last} |"


_DURABLE_LABEL = ("a durable commit alone, no engine (SQLite commit of a step's rows, fdatasync of the WAL: "
                  "the floor under a journaled step)")


def _cpu_table(cpu: dict[str, Any]) -> list[str]:
    small, large = cpu["steps"]
    scenario = SCENARIOS[cpu["scenario"]]
    theirs = scenario["label"].split(",")[0].removeprefix("MetaGPT main ")
    ours = scenario.get("ours") or f"sopctl's tools {', '.join(scenario['tools'])}"
    rows = [f"CPU per extra tool step, {ours} beside {scenario['label']} "
            f"(runs of {large} against {small} steps; {cpu['repeats']} rounds, "
            "each one pair of runs of every engine, in turn):", "",
            f"| engine | min | median | max | / {theirs}, per round: median (min-max) |", "|---|---|---|---|---|"]
    for name, key in (("sopctl", "ratio"), ("sopctl journaled", "ratio_journaled"),
                      ("durable commit", "ratio_durable"), ("metagpt", "")):
        side = cpu[name]
        if "skipped" in side:
            rows.append(f"| {scenario['label']} | skipped: {side['skipped']} | | | |")
            continue
        label = f"{scenario['label']} ({side['version']})" if name == "metagpt" else \
            _DURABLE_LABEL if name == "durable commit" else name
        ratio = f"{cpu[key]:.2f}x ({cpu[key + '_range'][0]:.2f}-{cpu[key + '_range'][1]:.2f})" if key in cpu else ""
        rows.append(_row(label, side, ratio))
    return rows


if __name__ == "__main__":
    main()
