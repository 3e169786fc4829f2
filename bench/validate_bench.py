"""Validation speed: a cold `sopctl validate`, and how checking time grows with SOP size.

1. Cold start. `sopctl validate sops/software_company.sop.yaml` in a fresh interpreter,
   against a bare `python -c "import pydantic, jinja2, networkx"` measured in the same run,
   interleaved, median of several. The ratio is the figure (target: at most 2x): it says
   what the checker costs on top of the libraries it cannot avoid.
2. Scale. Generated SOPs of up to 500 roles and 2,000 actions (each role runs four actions
   and watches the previous role's last one; prompts and artifacts are templates that read
   inputs and msgs) are checked in-process from block-style YAML text (load + models +
   checks + graph + templates), timed in CPU seconds. A least-squares fit of log(time) on log(actions) gives the growth exponent
   (1 = linear).

    python -m bench.validate_bench
    python -c "from bench.validate_bench import main; main(size_factor=0.01)"   # smoke
"""
from __future__ import annotations

import math
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["cold_start", "fit_exponent", "generate", "main", "scale"]

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "sops" / "software_company.sop.yaml"
FALLBACK = ROOT / "tests" / "cases" / "valid" / "company.sop.yaml"
BASELINE = "import pydantic, jinja2, networkx"
ACTIONS_PER_ROLE = 4


def generate(roles: int) -> str:
    """SOP text with `roles` roles and 4 actions each, a chain of watches, no warning."""
    actions: dict[str, Any] = {}
    role_specs: dict[str, Any] = {}
    for r in range(roles):
        names = [f"A{r}_{k}" for k in range(ACTIONS_PER_ROLE)]
        watch = "UserRequirement" if r == 0 else f"A{r - 1}_{ACTIONS_PER_ROLE - 1}"
        for k, name in enumerate(names):
            reads = "{{ inputs.idea }}" if r == 0 else f"{{{{ msgs.{watch}[-1].out['Summary'] }}}}"
            actions[name] = {
                "prompt": f"Step {k} of role {r}: work on {reads} for {{{{ role.name }}}}.",
                "output": {"Summary": {"type": "str", "instruction": "one line"},
                           "Items": {"type": "list[str]", "instruction": "the items"}},
                "artifacts": [{"path": f"r{r}/{name}.md", "content": "{{ out['Summary'] }}"}],
            }
        role_specs[f"R{r}"] = {"name": f"Role{r}", "actions": names, "watch": [watch],
                               "react_mode": "by_order"}
    doc = {"apiVersion": "sop/v1", "name": "validate-bench",
           "inputs": {"idea": {"type": "str", "required": True}},
           "actions": actions, "roles": role_specs}
    return _block_yaml(doc)


def _block_yaml(doc: dict[str, Any]) -> str:
    """Block-style YAML, as people write SOP files."""
    import io

    from ruamel.yaml import YAML

    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    yaml.sort_base_mapping_type_on_output = False  # keep the roles' order
    yaml.width = 4096
    buffer = io.StringIO()
    yaml.dump(doc, buffer)
    return buffer.getvalue()


def _time_command(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one child process. CPU time is the steadier figure on a
    shared machine: other processes stretch the wall clock, not the child's own CPU time."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, timeout=300)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def cold_start(reps: int) -> dict[str, Any]:
    """Median wall and CPU time of a cold validate and of the bare imports, interleaved."""
    target = TARGET if TARGET.exists() else FALLBACK
    validate = [sys.executable, "-m", "engine.cli", "validate", str(target)]
    bare = [sys.executable, "-c", BASELINE]
    _time_command(bare)  # warm the file-system cache for both
    _time_command(validate)
    pairs = [(_time_command(bare), _time_command(validate)) for _ in range(reps)]
    res: dict[str, Any] = {"file": str(target.relative_to(ROOT)), "reps": reps}
    for index, clock in enumerate(("wall", "cpu")):
        bare_s = statistics.median(p[0][index] for p in pairs)
        validate_s = statistics.median(p[1][index] for p in pairs)
        res[clock] = {"bare_imports_s": bare_s, "validate_s": validate_s, "ratio": validate_s / bare_s}
    return res


def scale(max_roles: int, reps: int) -> list[dict[str, Any]]:
    """Check generated SOPs of 10%..100% of `max_roles` roles; the curve of median times."""
    from engine.compile.compiler import check_text

    check_text(generate(2), "warm-up.sop.yaml")  # lazy imports and the jinja environment, once
    curve = []
    for roles in sorted({max(2, round(max_roles * f)) for f in (0.1, 0.25, 0.5, 1.0)}):
        text = generate(roles)
        times = []
        for _ in range(reps):
            start = time.process_time()
            result = check_text(text, "generated.sop.yaml")
            times.append(time.process_time() - start)
        assert result.ok and not result.diagnostics, result.diagnostics[:3]
        actions = roles * ACTIONS_PER_ROLE
        median = statistics.median(times)
        curve.append({"roles": roles, "actions": actions, "bytes": len(text), "median_s": median,
                      "ms_per_action": 1000 * median / actions})
    return curve


def fit_exponent(points: list[tuple[float, float]]) -> float:
    """Slope of log(y) on log(x): 1 means linear growth, 2 quadratic."""
    xs = [math.log(x) for x, _ in points]
    ys = [math.log(y) for _, y in points]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=False)) / sum((x - mx) ** 2 for x in xs)


def main(size_factor: float = 1.0) -> dict[str, Any]:
    """Run both measurements; print a markdown table and return the figures."""
    reps = 5 if size_factor >= 1 else 1
    cold = cold_start(reps)
    curve = scale(max(4, round(500 * size_factor)), 3 if size_factor >= 1 else 1)
    points = [(p["actions"], p["median_s"]) for p in curve]
    exponent = fit_exponent(points) if len(points) > 1 else 1.0
    res = {"cold": cold, "curve": curve, "exponent": exponent}
    res["markdown"] = markdown(res)
    print(res["markdown"])
    return res


def markdown(res: dict[str, Any]) -> str:
    cold = res["cold"]
    lines = [(f"Cold `sopctl validate {cold['file']}` against `python -c \"{BASELINE}\"`, "
              f"median of {cold['reps']} interleaved runs (target: at most 2x):"), "",
             "| clock | bare imports | validate | ratio |", "|---|---|---|---|"]
    for clock in ("cpu", "wall"):
        c = cold[clock]
        lines.append(f"| {clock} | {c['bare_imports_s'] * 1000:.0f} ms | {c['validate_s'] * 1000:.0f} ms | "
                     f"**{c['ratio']:.2f}x** |")
    lines += ["", "Checking generated SOPs in-process (CPU time, median):", "",
              "| roles | actions | file size | check time (s) | ms / action |", "|---|---|---|---|---|"]
    for p in res["curve"]:
        lines.append(f"| {p['roles']:,} | {p['actions']:,} | {p['bytes'] / 1024:.0f} KiB | "
                     f"{p['median_s']:.3f} | {p['ms_per_action']:.3f} |")
    lines += ["", f"Growth exponent (log-log fit of time on actions): **{res['exponent']:.2f}** (1 = linear)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # pragma: no cover
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 1.0)
