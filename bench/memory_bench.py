"""Prompt size as a run grows: the whole memory against a memory window with recall.

Two roles answer each other for N turns each (N = 10, 20, 40, scaled by `size_factor`), on
the `fake` model, with `context: all` (MetaGPT's whole memory). The same SOP is run as it is
and with `memory_window: 4` plus `recall: {top_k: 2}` (BM25 relevance to the prompt) on both
roles. The figure is the prompt tokens (tiktoken `cl100k_base`) of the last turn: it grows
with N without a window and stays bounded with one. Nothing here is asserted.

    python -m bench.memory_bench
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.context_bench import _encoding

__all__ = ["main"]

SOP = """\
apiVersion: sop/v1
name: long_talk
actions:
  Ping: {{prompt: "Answer the latest message of the talk.", max_runs: {turns}}}
  Pong: {{prompt: "Answer the latest message of the talk.", max_runs: {turns}}}
team: {{max_rounds: {rounds}}}
roles:
  A: {{actions: [Ping], watch: [UserRequirement, Pong]{memory}}}
  B: {{actions: [Pong], watch: [Ping]{memory}}}
"""

WINDOWED = ", memory_window: 4, recall: {top_k: 2}"


class _LastPrompt:
    """`fake`, remembering the token count of every prompt it was sent."""

    def __init__(self) -> None:
        from engine.models.fake import FakeModel

        self.fake = FakeModel()
        self.encoding = _encoding()
        self.tokens: list[int] = []

    def supports_schema(self, model: str) -> bool:
        return False

    async def complete(self, request: Any) -> Any:
        sent = "\n".join(m.get("content", "") for m in request.messages)
        self.tokens.append(len(self.encoding.encode(sent)))
        return await self.fake.complete(request)


def _last_prompt_tokens(turns: int, memory: str, folder: Path) -> tuple[int, int]:
    from engine import api
    from engine.models.registry import override_model

    path = folder / f"talk_{turns}_{bool(memory)}.sop.yaml"
    path.write_text(SOP.format(turns=turns, rounds=2 * turns + 2, memory=memory), encoding="utf-8")
    recorder = _LastPrompt()
    with override_model(recorder):
        result = api.run(api.load(path), {"idea": "plan a picnic"}, api.RunOptions(model="fake",
                         workspace=folder / path.stem), journal=False)
    if result.status != "idle":
        raise SystemExit(f"memory_bench: run ended {result.status}: {result.error}")
    return recorder.tokens[-1], len(recorder.tokens)


def main(size_factor: float = 1.0) -> dict[str, Any]:
    """Measure both variants at three lengths, print a table, return the figures."""
    lengths = sorted({max(2, round(n * size_factor)) for n in (10, 20, 40)})
    rows = []
    with tempfile.TemporaryDirectory(prefix="sopctl-memory-bench-") as tmp:
        for turns in lengths:
            whole, calls = _last_prompt_tokens(turns, "", Path(tmp))
            windowed, _ = _last_prompt_tokens(turns, WINDOWED, Path(tmp))
            rows.append({"turns": turns, "calls": calls, "whole_memory": whole, "windowed": windowed})
    lines = ["last prompt's tokens (tiktoken cl100k_base), two roles talking on fake",
             "", "| turns each | calls | whole memory | memory_window 4 + recall 2 |", "|---:|---:|---:|---:|"]
    lines += [f"| {r['turns']} | {r['calls']} | {r['whole_memory']} | {r['windowed']} |" for r in rows]
    text = "\n".join(lines)
    print(text)
    last = rows[-1]
    return {"rows": rows, "markdown": text, "ratio": last["windowed"] / last["whole_memory"],
            "ratio_label": f"last prompt tokens, windowed / whole memory at {last['turns']} turns"}


if __name__ == "__main__":  # pragma: no cover
    main(size_factor=float(sys.argv[1]) if len(sys.argv) > 1 else 1.0)
