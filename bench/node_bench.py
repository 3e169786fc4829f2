"""What the ActionNode keys cost: `fill: simple` against `fill: complex`, and `revise`.

The software company's WritePRD (its real output tree, 12 top-level keys, from
examples/lib/software_company_documents.sop.yaml) is run alone on the `fake` model, with
prompt tokens counted by tiktoken (`cl100k_base`): as shipped (one call for the whole tree),
with `fill: complex` (one call per key: smaller answers, the prompt sent once per key), and
with `revise: {max_passes: 1}` (a review that accepts on fake: one more call). Nothing here is
asserted.

    python -m bench.node_bench
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.context_bench import IDEA, Measurement, _Recorder

__all__ = ["main"]

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ROOT / "examples" / "lib" / "software_company_documents.sop.yaml"
VARIANTS = {"fill: simple (shipped)": {}, "fill: complex": {"fill": "complex"},
            "revise: {max_passes: 1}": {"revise": {"max_passes": 1}}}


def _sop(extra: dict[str, Any], target: Path) -> Path:
    """WritePRD alone, with `extra` keys, as a runnable SOP (written as JSON, which is YAML)."""
    from ruamel.yaml import YAML

    library = YAML(typ="safe", pure=True).load(LIBRARY.read_text(encoding="utf-8"))
    action = {**library["actions"]["WritePRD"], **extra}
    action.pop("artifacts", None)
    sop = {"apiVersion": "sop/v1", "name": "prd_only",
           "inputs": {"idea": {"type": "str", "required": True},
                      "language": {"type": "str", "default": "Python"}},
           "actions": {"WritePRD": action},
           "roles": {"ProductManager": {"name": "Alice", "profile": "Product Manager",
                                        "watch": ["UserRequirement"], "actions": ["WritePRD"]}}}
    target.write_text(json.dumps(sop, indent=2), encoding="utf-8")
    return target


def main(size_factor: float = 1.0) -> dict[str, Any]:
    """Run the three variants once each, print a table, return the figures."""
    from engine import api
    from engine.models.registry import override_model

    rows = []
    with tempfile.TemporaryDirectory(prefix="sopctl-node-bench-") as tmp:
        for i, (label, extra) in enumerate(VARIANTS.items()):
            measurement = Measurement(label=label, status="?")
            path = _sop(extra, Path(tmp) / f"v{i}.sop.yaml")
            with override_model(_Recorder(1, measurement)):
                result = api.run(api.load(path), {"idea": IDEA}, api.RunOptions(model="fake",
                                 workspace=Path(tmp) / f"ws{i}"), journal=False)
            rows.append({"label": label, "status": str(result.status), "calls": measurement.calls,
                         "prompt_tokens": measurement.tokens,
                         "completion_tokens": result.usage.completion_tokens})
    lines = ["WritePRD alone on fake; prompt tokens (tiktoken cl100k_base), completion tokens (fake's estimate)",
             "", "| variant | calls | prompt tokens | completion tokens |", "|---|---:|---:|---:|"]
    lines += [f"| {r['label']} | {r['calls']} | {r['prompt_tokens']} | {r['completion_tokens']} |" for r in rows]
    text = "\n".join(lines)
    print(text)
    return {"rows": rows, "markdown": text}


if __name__ == "__main__":  # pragma: no cover
    main(size_factor=float(sys.argv[1]) if len(sys.argv) > 1 else 1.0)
