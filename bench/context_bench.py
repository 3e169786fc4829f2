"""Prompt tokens of one software-company run: declared `context` against `context: all`.

MetaGPT shows every action the role's whole memory; `sops/software_company.sop.yaml`
declares on each action which earlier messages it needs (the PRD for the design, the design
for the tasks, ...). This bench runs the file on the `fake` model twice, in one process:

- as shipped, with each action's declared `context`;
- a variant built from the same YAML with `context: all` on every action (written to a
  temporary SOP file, so the only difference is that key);

records every prompt actually sent to the model (system prompt and user prompt, re-asks
included) through a recording provider wrapped around `fake`, and counts its tokens with
tiktoken (`cl100k_base`). It prints both totals, the per-action breakdown and the ratio
declared / all; the target is <= 0.5.

`size_factor` scales the project: the fake's answers are tiny, so the run is fanned out over
`max(1, round(4 * size_factor))` source files (the fake's one-file task list is widened
by a recording wrapper that answers WriteTasks/WriteDesign with that many files), which
makes the comparison closer to a real project where the engineer writes several files.

    python -m bench.context_bench            # full size
    python -c "from bench.context_bench import main; main(size_factor=0.25)"   # smoke
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["main", "measure", "Measurement"]

ROOT = Path(__file__).resolve().parent.parent
SOP = ROOT / "sops" / "software_company.sop.yaml"
IDEA = "a command-line 2048 game with a best-score file"
TARGET = 0.5


@dataclass
class Measurement:
    """Tokens sent by one run, in total and per action."""

    label: str
    status: str
    calls: int = 0
    tokens: int = 0
    per_action: Counter[str] = field(default_factory=Counter)


class _Recorder:
    """A provider that counts the tokens of every request and lets `fake` answer it.

    It also widens the file lists of WriteDesign/WriteTasks to `files` entries, so that the
    engineer's and QA's fan-outs have the size of a small real project.
    """

    def __init__(self, files: int, measurement: Measurement) -> None:
        from engine.models.fake import FakeModel

        self.fake = FakeModel()
        self.files = files
        self.m = measurement
        self.encoding = _encoding()

    def supports_schema(self, model: str) -> bool:
        return self.fake.supports_schema(model)

    async def complete(self, request: Any) -> Any:
        from engine.models.types import ModelAnswer

        sent = "\n".join(m.get("content", "") for m in request.messages)
        tokens = len(self.encoding.encode(sent))
        self.m.calls += 1
        self.m.tokens += tokens
        self.m.per_action[request.spec.action] += tokens
        answer = await self.fake.complete(request)
        text = self._widen(request.spec.action, answer.text)
        return ModelAnswer(text=text, prompt_tokens=tokens,
                           completion_tokens=answer.completion_tokens, cost_usd=0.0)

    def _widen(self, action: str, text: str) -> str:
        key = {"WriteDesign": "File list", "WriteTasks": "Task list"}.get(action)
        if key is None:
            return text
        start, end = text.find("{"), text.rfind("}")
        try:
            value = json.loads(text[start:end + 1])
        except ValueError:
            return text
        value[key] = [f"module_{i}.py" for i in range(self.files)]
        return json.dumps(value, indent=2)


def _encoding() -> Any:
    """cl100k_base, offline: tiktoken's cache, or the copy litellm ships, else a download."""
    _use_litellm_tokenizer_cache()
    try:
        import tiktoken

        return tiktoken.get_encoding("cl100k_base")
    except Exception as exc:  # noqa: BLE001 - a bench without its tokenizer says so and stops
        raise SystemExit(f"context_bench needs tiktoken (pip install 'sopctl[dev]'): {exc}") from None


def _use_litellm_tokenizer_cache() -> None:
    """Point tiktoken at litellm's bundled cl100k_base file when no cache is configured."""
    import importlib.util
    import os

    if os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR"):
        return
    spec = importlib.util.find_spec("litellm")
    for location in (spec.submodule_search_locations or []) if spec else []:
        folder = Path(location) / "litellm_core_utils" / "tokenizers"
        if (folder / "9b5ad71b2ce5302211f9c61530b329a4922fc6a4").is_file():
            os.environ["TIKTOKEN_CACHE_DIR"] = str(folder)
            return


def all_context_variant(source: Path, target: Path) -> Path:
    """Write `source` with `context: all` on every LLM action (MetaGPT's whole memory).

    The variant is written as JSON (which is YAML), so nothing but `context` changes.
    """
    from ruamel.yaml import YAML

    data = YAML(typ="safe", pure=True).load(source.read_text(encoding="utf-8"))
    for action in data["actions"].values():
        if action.get("kind", "llm") == "llm":
            action["context"] = "all"
    target.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")
    return target


def measure(path: Path, label: str, files: int, workspace: Path) -> Measurement:
    """Run `path` on the recording fake and return what its prompts cost in tokens."""
    from engine import api
    from engine.models.registry import override_model

    measurement = Measurement(label=label, status="?")
    compiled = api.load(path)
    with override_model(_Recorder(files, measurement)):
        result = api.run(compiled, {"idea": IDEA}, api.RunOptions(model="fake", workspace=workspace), journal=False)
    measurement.status = result.status
    return measurement


def main(size_factor: float = 1.0) -> dict[str, Any]:
    """Measure both variants, print a table, return the figures (ratio included)."""
    files = max(1, round(4 * size_factor))
    with tempfile.TemporaryDirectory(prefix="sopctl-context-bench-") as tmp:
        tmp_path = Path(tmp)
        variant = all_context_variant(SOP, tmp_path / "software_company_all.sop.yaml")
        declared = measure(SOP, "declared context", files, tmp_path / "declared")
        whole = measure(variant, "context: all", files, tmp_path / "all")
    ratio = declared.tokens / whole.tokens if whole.tokens else float("nan")
    _report(declared, whole, ratio, files)
    return {
        "files": files,
        "declared_tokens": declared.tokens,
        "all_tokens": whole.tokens,
        "declared_calls": declared.calls,
        "all_calls": whole.calls,
        "ratio": ratio,
        "target": TARGET,
        "statuses": [declared.status, whole.status],
    }


def _report(declared: Measurement, whole: Measurement, ratio: float, files: int) -> None:
    print(f"software company on fake, {files} source file(s); prompt tokens (tiktoken cl100k_base)")
    print(f"{'action':<18}{'declared':>10}{'all':>10}")
    for action in sorted(set(declared.per_action) | set(whole.per_action)):
        print(f"{action:<18}{declared.per_action[action]:>10}{whole.per_action[action]:>10}")
    print(f"{'total':<18}{declared.tokens:>10}{whole.tokens:>10}")
    print(f"calls: {declared.calls} / {whole.calls}; status: {declared.status} / {whole.status}")
    verdict = "meets" if ratio <= TARGET else "misses"
    print(f"ratio declared / all = {ratio:.3f} ({verdict} the target of <= {TARGET})")


if __name__ == "__main__":  # pragma: no cover
    factor = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
    main(size_factor=factor)
