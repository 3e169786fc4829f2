"""examples/software_company_review_loop.sop.yaml: MetaGPT's WriteCodeReview loop (LGTM/LBTM
→ rewrite → review, at most code_validate_k_times = 2), declared with `when` and `max_runs`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine import api
from engine.models.fake import answer_text
from engine.models.types import CallSpec
from engine.testing import ScriptedModel, use_model

from run_helpers import ROOT

LOOP = ROOT / "examples" / "software_company_review_loop.sop.yaml"


def _model(verdicts: list[str]) -> ScriptedModel:
    """fake's answers, but each review's verdict from `verdicts` and each rewrite numbered."""
    reviews = iter(verdicts)
    rewrites = iter(range(1, 10))

    def answer(spec: CallSpec, attempt: int) -> Any:
        if spec.action == "WriteCodeReview":
            return {"File": "main.py", "Code Review": "checked", "Code Review Result": next(reviews)}
        if spec.action == "RewriteCode":
            return f"```python\nREWRITE = {next(rewrites)}\n```\n"
        if spec.action == "WriteCode":
            return "```python\nDRAFT = 0\n```\n"
        return answer_text(spec)
    return ScriptedModel(answer)


def _run(tmp_path: Path, verdicts: list[str]) -> tuple[Any, ScriptedModel]:
    model = _model(verdicts)
    with use_model(model):
        result = api.run(api.load(LOOP), {"idea": "a 2048 game"}, workspace=tmp_path / "ws")
    assert result.status == "idle", result.error
    return result, model


def _asked(model: ScriptedModel, action: str) -> list[str]:
    return [r.spec.prompt for r in model.requests if r.spec.action == action]


def test_lgtm_at_once_ends_the_loop_without_a_rewrite(tmp_path: Path) -> None:
    _, model = _run(tmp_path, ["LGTM"])
    assert model.asked().count("WriteCodeReview") == 1 and "RewriteCode" not in model.asked()
    assert "DRAFT = 0" in _asked(model, "WriteTest")[0]


def test_lbtm_then_lgtm_reviews_the_rewrite_and_tests_it(tmp_path: Path) -> None:
    _, model = _run(tmp_path, ["LBTM", "LGTM"])
    assert model.asked().count("RewriteCode") == 1
    assert "REWRITE = 1" in _asked(model, "WriteCodeReview")[1]
    assert "REWRITE = 1" in _asked(model, "WriteTest")[0]


def test_a_review_that_never_passes_stops_after_two_rewrites(tmp_path: Path) -> None:
    result, model = _run(tmp_path, ["LBTM"] * 5)
    assert model.asked().count("WriteCodeReview") == 2        # code_validate_k_times
    assert model.asked().count("RewriteCode") == 2
    assert "REWRITE = 2" in _asked(model, "WriteTest")[0]     # the last rewrite is kept
    assert [m.cause_by for m in result.messages].count("SummarizeCode") == 1
