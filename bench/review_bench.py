"""The software company's code review: the shipped merged review (one call per file that
answers the corrected file) against MetaGPT's own loop (examples/software_company_review_loop
.sop.yaml: WriteCodeReview LGTM/LBTM, RewriteCode on LBTM, at most 2 rewrites).

Both run on the `fake` model through context_bench's token-counting recorder (tiktoken
`cl100k_base`), widened to `max(1, round(4 * size_factor))` source files. The loop is run
twice: its best case (every review LGTM at once: one review per file) and its worst case
(every review LBTM: two reviews and two rewrites per file, code_validate_k_times = 2). The
fake's reviews name the file they were asked about, as a model does. Figures are calls and
prompt tokens, of the review actions and of the whole run; nothing here is asserted.

    python -m bench.review_bench
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.context_bench import IDEA, Measurement, _Recorder

__all__ = ["main"]

ROOT = Path(__file__).resolve().parent.parent
MERGED = ROOT / "sops" / "software_company.sop.yaml"
LOOP = ROOT / "examples" / "software_company_review_loop.sop.yaml"
REVIEW_ACTIONS = ("WriteCodeReview", "RewriteCode")
_REVIEWED_FILE = re.compile(r"Review the code of `([^`]+)`")


class _Reviewer(_Recorder):
    """The recorder, with the loop's reviews naming their file and giving `verdict`."""

    def __init__(self, files: int, measurement: Measurement, verdict: str) -> None:
        super().__init__(files, measurement)
        self.verdict = verdict
        self.calls: dict[str, int] = {}

    async def complete(self, request: Any) -> Any:
        action = request.spec.action
        self.calls[action] = self.calls.get(action, 0) + 1
        answer = await super().complete(request)
        if action != "WriteCodeReview" or request.spec.kind != "json":
            return answer
        found = _REVIEWED_FILE.search(request.spec.prompt)
        value = {"File": found.group(1) if found else "main.py", "Code Review": "checked",
                 "Code Review Result": self.verdict}
        return type(answer)(text=json.dumps(value), prompt_tokens=answer.prompt_tokens,
                            completion_tokens=answer.completion_tokens, cost_usd=0.0)


def _measure(path: Path, label: str, files: int, workspace: Path, verdict: str) -> dict[str, Any]:
    from engine import api
    from engine.models.registry import override_model

    measurement = Measurement(label=label, status="?")
    recorder = _Reviewer(files, measurement, verdict)
    with override_model(recorder):
        result = api.run(api.load(path), {"idea": IDEA}, api.RunOptions(model="fake", workspace=workspace), journal=False)
    return {"label": label, "status": str(result.status), "calls": measurement.calls,
            "tokens": measurement.tokens,
            "review_calls": sum(recorder.calls.get(a, 0) for a in REVIEW_ACTIONS),
            "review_tokens": sum(measurement.per_action[a] for a in REVIEW_ACTIONS)}


def main(size_factor: float = 1.0) -> dict[str, Any]:
    """Measure the three runs, print a table, return the figures."""
    files = max(1, round(4 * size_factor))
    with tempfile.TemporaryDirectory(prefix="sopctl-review-bench-") as tmp:
        rows = [_measure(MERGED, "merged review (shipped)", files, Path(tmp) / "merged", "LGTM"),
                _measure(LOOP, "loop, all LGTM", files, Path(tmp) / "best", "LGTM"),
                _measure(LOOP, "loop, all LBTM (bound)", files, Path(tmp) / "worst", "LBTM")]
    merged = rows[0]
    ratios = {row["label"]: row["review_tokens"] / merged["review_tokens"] for row in rows}
    lines = [f"software company on fake, {files} source file(s); prompt tokens (tiktoken cl100k_base)",
             "",
             "| variant | review calls | review prompt tokens | run calls | run prompt tokens | review tokens / merged |",
             "|---|---:|---:|---:|---:|---:|"]
    for row in rows:
        lines.append(f"| {row['label']} | {row['review_calls']} | {row['review_tokens']} | "
                     f"{row['calls']} | {row['tokens']} | {ratios[row['label']]:.2f} |")
    text = "\n".join(lines)
    print(text)
    return {"files": files, "rows": rows, "markdown": text,
            "statuses": [row["status"] for row in rows]}


if __name__ == "__main__":  # pragma: no cover
    main(size_factor=float(sys.argv[1]) if len(sys.argv) > 1 else 1.0)
