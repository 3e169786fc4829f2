"""LLM gateway overhead per call, on `fake` at zero latency, as a ratio to bare validation.

The floor of any gateway is reading the answer: `json.loads` plus a JSON Schema validation
with a pre-built validator. This bench measures that floor on the fake's answer to a
WritePRD-sized output tree (12 keys, lists and nested lists), then whole `Gateway.call`s of
the same request in the same process:

- `call`: fresh gateway, no journal (prompt building, request hash, fake answer, parse,
  validate, accounting);
- `call + journal`: recording every answer into an in-memory answer store;
- `reused`: every answer taken from that store (what `resume` and `replay` do);
- `fan-out`: 100 concurrent calls under one `asyncio.gather` (for_each).

Each figure is the best of three repetitions, in µs per call, and its ratio to the floor.

    python -m bench.gateway_bench
    python -c "from bench.gateway_bench import main; main(size_factor=0.05)"   # smoke
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

__all__ = ["main", "WRITE_PRD"]

WRITE_PRD: dict[str, str] = {
    "Language": "str", "Programming Language": "str", "Original Requirements": "str",
    "Project Name": "str", "Product Goals": "list[str]", "User Stories": "list[str]",
    "Competitive Analysis": "list[str]", "Competitive Quadrant Chart": "str",
    "Requirement Analysis": "str", "Requirement Pool": "list[list[str]]",
    "UI Design draft": "str", "Anything UNCLEAR": "str",
}
REPEATS = 3


def _spec(i: int = 0) -> Any:
    from engine.load.outputs import output_schema
    from engine.load.spec import OutputNode
    from engine.models.types import CallSpec

    tree = {key: OutputNode(type=kind, instruction=f"the {key.lower()}") for key, kind in WRITE_PRD.items()}
    return CallSpec(action="WritePRD", role="ProductManager", system="You are Alice, a product manager.",
                    prompt=f"## Original Requirements\na command-line 2048 game (variant {i})",
                    kind="json", model="fake", schema=output_schema(tree))


def _best(run: Callable[[], float]) -> float:
    return min(run() for _ in range(REPEATS))


def _floor_us(n: int) -> float:
    """json.loads + validation with a pre-built validator, per answer."""
    from jsonschema import Draft202012Validator
    from referencing import Registry

    from engine.models.fake import answer_text

    spec = _spec()
    text = answer_text(spec)
    validator = Draft202012Validator(spec.schema, registry=Registry())

    def once() -> float:
        start = time.perf_counter()
        for _ in range(n):
            validator.validate(json.loads(text))
        return (time.perf_counter() - start) / n * 1e6

    return _best(once)


def _calls_us(n: int, make_gateway: Callable[[], Any], concurrent: bool = False) -> float:
    specs = [_spec(i) for i in range(n)]

    async def go(gateway: Any) -> None:
        if concurrent:
            for first in range(0, n, 100):
                await asyncio.gather(*(gateway.call(s) for s in specs[first:first + 100]))
        else:
            for s in specs:
                await gateway.call(s)

    def once() -> float:
        gateway = make_gateway()
        start = time.perf_counter()
        asyncio.run(go(gateway))
        return (time.perf_counter() - start) / n * 1e6

    return _best(once)


def _reused_us(n: int) -> float:
    from engine.models.gateway import Gateway
    from engine.testing import MemoryAnswerStore

    store = MemoryAnswerStore()
    asyncio.run(_fill(Gateway(store=store), n))
    return _calls_us(n, lambda: Gateway(store=store, replay=True))


async def _fill(gateway: Any, n: int) -> None:
    for i in range(n):
        await gateway.call(_spec(i))


def measure(n: int) -> dict[str, float]:
    """µs per call for the floor and each gateway path."""
    from engine.models.gateway import Gateway
    from engine.testing import MemoryAnswerStore

    _calls_us(min(n, 20), Gateway)  # warm-up: imports, validator cache
    return {
        "floor": _floor_us(n),
        "call": _calls_us(n, Gateway),
        "call + journal": _calls_us(n, lambda: Gateway(store=MemoryAnswerStore())),
        "reused": _reused_us(n),
        "fan-out": _calls_us(n, Gateway, concurrent=True),
    }


def _table(figures: dict[str, float], n: int) -> str:
    floor = figures["floor"]
    lines = [f"Gateway overhead, fake model at zero latency, WritePRD-sized output, {n} calls "
             "(best of 3)", "", "| path | µs/call | × floor |", "|---|---:|---:|"]
    labels = {"floor": "floor: json.loads + jsonschema validate"}
    for key, value in figures.items():
        lines.append(f"| {labels.get(key, key)} | {value:,.0f} | {value / floor:.1f} |")
    return "\n".join(lines)


def main(size_factor: float = 1.0) -> dict[str, Any]:
    """Run the bench; prints a table and returns the figures (µs/call and ratios)."""
    saved = os.environ.pop("SOPCTL_FAKE_LATENCY_MS", None)
    try:
        n = max(20, int(2000 * size_factor))
        figures = measure(n)
    finally:
        if saved is not None:
            os.environ["SOPCTL_FAKE_LATENCY_MS"] = saved
    table = _table(figures, n)
    print(table)
    ratios = {f"{k}_ratio": v / figures["floor"] for k, v in figures.items() if k != "floor"}
    return {"calls": n, "us_per_call": figures, **ratios, "markdown": table}


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 1.0)
