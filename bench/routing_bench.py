"""Routing scale: many roles and many messages through `engine.run.environment.Environment`.

A generated SOP with `roles` roles (each doing one of ten actions, watching the one before) is compiled and a Team
built from it, as a run would; then `messages` messages go through the environment the way
rounds do: every round publishes a batch (filter 1: send_to -> inboxes), then every active
role observes its inbox (filter 2: watch / address / memory). 99% of the messages go to one
role, 1% to `<all>`. No model is called and no journal is attached: this is the routing
alone. The time is measured at several message counts (10% .. 100% of `messages`) to see how
it grows; a least-squares fit of log(time) on log(messages) gives the exponent (1 = linear).

    python -m bench.routing_bench                  # 1,000 roles, 10,000 .. 100,000 messages
    python -c "from bench.routing_bench import main; main(size_factor=0.01)"   # smoke
"""
from __future__ import annotations

import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["build_team", "fit_exponent", "main", "route"]

ACTIONS = 10
BATCH = 1_000          # messages published per round
BROADCAST_EVERY = 100  # one message in a hundred goes to <all>


def _sop(roles: int) -> dict[str, Any]:
    """An SOP with `roles` roles; role i does A(i % 10) and watches the action before it
    (A0's roles watch the idea), so the watch graph is a chain, without cycles."""
    actions = {f"A{k}": {"prompt": "work", "output": "text"} for k in range(ACTIONS)}
    role_specs = {f"R{i}": {"actions": [f"A{i % ACTIONS}"],
                            "watch": [f"A{i % ACTIONS - 1}" if i % ACTIONS else "UserRequirement"]}
                  for i in range(roles)}
    return {"apiVersion": "sop/v1", "name": "routing-bench", "actions": actions,
            "roles": role_specs, "team": {"max_rounds": 1_000}}


def build_team(roles: int, folder: Path) -> tuple[Any, float]:
    """Compile the generated SOP and build its Team; returns (team, compile seconds)."""
    from engine import api

    path = folder / "routing.sop.yaml"
    path.write_text(json.dumps(_sop(roles)))  # JSON is YAML
    t0 = time.perf_counter()
    compiled = api.load(path)
    compile_s = time.perf_counter() - t0
    return api.prepare(compiled, {"idea": "route"}, model="fake", workspace=folder / "ws"), compile_s


def route(team: Any, messages: int) -> dict[str, float]:
    """Publish `messages` in rounds of BATCH through a fresh Environment; seconds and counts."""
    from engine.run.environment import Environment
    from engine.run.message import Message

    for role in team.roles:  # start every repetition from empty inboxes and memories
        role.inbox.clear()
        role.memory = type(role.memory)()
    env = Environment(team.roles, lambda event: None)
    n_roles = len(team.roles)
    delivered = observed = 0
    t0 = time.perf_counter()
    for start in range(0, messages, BATCH):
        for i in range(start, min(start + BATCH, messages)):
            to = "<all>" if i % BROADCAST_EVERY == 0 else f"R{(i * 7919) % n_roles}"
            msg = Message(id=f"m{i}", content="x", cause_by=f"A{i % ACTIONS}", sent_from="R0",
                          send_to=frozenset({to}), round=start // BATCH + 1)
            delivered += len(env.publish(msg))
        for role in env.active_roles():
            observed += len(role.observe())
        for role in team.roles:  # inboxes of roles that kept nothing are dropped, as a round does
            role.inbox.clear()
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "delivered": delivered, "observed": observed}


def hot_spots(team: Any, messages: int, top: int = 3) -> list[tuple[str, float]]:
    """The functions with the largest own time in one profiled routing pass, as shares."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.runcall(route, team, messages)
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]  # documented, not in the stubs
    total = sum(v[2] for v in stats.values()) or 1.0
    ranked = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    return [(fn if f == "~" else f"{Path(f).parent.name}/{Path(f).name}:{fn}", own / total)
            for (f, _line, fn), (_cc, _nc, own, _cum, _callers) in ranked]


def fit_exponent(points: list[tuple[float, float]]) -> float:
    """Slope of log(seconds) against log(messages): 1.0 is linear growth."""
    xs = [math.log(n) for n, _ in points]
    ys = [math.log(s) for _, s in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=False)) / sum((x - mx) ** 2 for x in xs)


def main(size_factor: float = 1.0, roles: int | None = None, reps: int | None = None) -> dict[str, Any]:
    """Route 10%..100% of the messages through `roles` roles; print and return the curve."""
    roles = roles or max(10, round(1_000 * min(size_factor, 1.0)))
    total = max(1_000, round(100_000 * size_factor))
    reps = reps or (3 if size_factor >= 1 else 1)
    counts = sorted({max(BATCH, round(total * f / BATCH) * BATCH) for f in (0.1, 0.2, 0.5, 1.0)})
    with tempfile.TemporaryDirectory(prefix="sopctl-routing-") as tmp:
        team, compile_s = build_team(roles, Path(tmp))
        curve = []
        for n in counts:
            runs = [route(team, n) for _ in range(reps)]
            secs = [r["seconds"] for r in runs]
            curve.append({"messages": n, "median_s": statistics.median(secs), "min_s": min(secs),
                          "max_s": max(secs), "us_per_message": 1e6 * statistics.median(secs) / n,
                          "delivered": runs[0]["delivered"], "observed": runs[0]["observed"]})
        spot_messages = min(counts[0], 2 * BATCH)
        spots = hot_spots(team, spot_messages)
    exponent = fit_exponent([(p["messages"], p["median_s"]) for p in curve]) if len(curve) > 1 else 1.0
    res = {"roles": roles, "messages": total, "reps": reps, "compile_s": compile_s,
           "curve": curve, "exponent": exponent, "hot_spots": spots,
           "hot_spot_messages": spot_messages,
           "growth_10x": curve[-1]["median_s"] / curve[0]["median_s"] if len(curve) > 1 else 1.0,
           "us_per_message": curve[-1]["us_per_message"]}
    res["markdown"] = markdown(res)
    print(res["markdown"])
    return res


def markdown(res: dict[str, Any]) -> str:
    lines = [f"{res['roles']:,} roles (compiled in {res['compile_s']:.2f} s); rounds of {BATCH:,} "
             f"messages, 1% broadcast; median of {res['reps']} (min-max).", "",
             "| messages | time (s) | µs / message | deliveries | kept by filter 2 |",
             "|---|---|---|---|---|"]
    for p in res["curve"]:
        lines.append(f"| {p['messages']:,} | {p['median_s']:.3f} ({p['min_s']:.3f}-{p['max_s']:.3f}) "
                     f"| {p['us_per_message']:.1f} | {p['delivered']:,} | {p['observed']:,} |")
    lines += ["", f"Fitted exponent of time against messages: **{res['exponent']:.2f}** "
              f"(1.00 = linear; target linear). Time grows {res['growth_10x']:.1f}× for "
              f"{res['curve'][-1]['messages'] / res['curve'][0]['messages']:.0f}× the messages.", "",
              f"Where the time goes (own time under cProfile, {res['hot_spot_messages']:,} messages): "
              + "; ".join(f"`{name}` {share:.0%}" for name, share in res["hot_spots"]) + "."]
    return "\n".join(lines)


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 1.0)
