"""Golden diagnostics: every file under tests/cases/ is checked and compared with its expectation.

`tests/cases/valid/*.sop.yaml` must give no diagnostic at all. Each
`tests/cases/invalid/<name>.sop.yaml` has `<name>.expected.json`: the exact diagnostics
(code, severity, line, col, pointer, message, hint, related). After an intended change to a
message, regenerate them with

    SOPCTL_REGEN=1 .venv/bin/pytest tests/check/test_cases.py

and review the diff. The test list is the directory listing: adding a case is adding a file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from engine.compile.compiler import check_path
from engine.check.diagnostics import CODES

from run_helpers import ROOT, TESTS

CASES = TESTS / "cases"
REGEN = os.environ.get("SOPCTL_REGEN") == "1"
VALID = sorted((CASES / "valid").glob("*.sop.yaml"))
INVALID = sorted((CASES / "invalid").glob("*.sop.yaml"))
CODES_TESTED_ELSEWHERE = {
    "SOP002": "tests/load/test_source.py builds a file over the size limit",
    "SOP108": "tests/load/test_schema.py feeds the models a value the schema never lets through",
    **{code: "tests/load/test_include.py: a main file and its libraries, in a temporary folder"
       for code in ("SOP012", "SOP013", "SOP014")},
    **{code: "tests/models/test_runtime_location.py: a run-time failure, located in its SOP"
       for code in ("SOP501", "SOP502", "SOP503", "SOP504", "SOP505")},
}


def _diagnostics(case: Path) -> list[dict]:
    result = check_path(case)
    found = []
    for diag in result.diagnostics:
        data = diag.to_json()
        data["file"] = case.name
        found.append(data)
    return found


def _expected_file(case: Path) -> Path:
    return case.with_name(case.name[: -len(".sop.yaml")] + ".expected.json")


@pytest.mark.parametrize("case", VALID, ids=lambda p: p.name)
def test_valid_case_has_no_diagnostics(case: Path) -> None:
    assert _diagnostics(case) == []


@pytest.mark.parametrize("case", INVALID, ids=lambda p: p.name)
def test_invalid_case_matches_golden(case: Path) -> None:
    actual = _diagnostics(case)
    expected_file = _expected_file(case)
    if REGEN:
        expected_file.write_text(json.dumps(actual, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    assert expected_file.exists(), f"no golden file; run SOPCTL_REGEN=1 pytest {__file__}"
    assert actual == json.loads(expected_file.read_text(encoding="utf-8"))
    assert actual, "an invalid case must produce at least one diagnostic"


def test_every_code_has_a_case() -> None:
    covered = set(CODES_TESTED_ELSEWHERE)
    for case in INVALID:
        covered |= {d["code"] for d in json.loads(_expected_file(case).read_text(encoding="utf-8"))}
    assert sorted(set(CODES) - covered) == []
    assert sorted(covered - set(CODES)) == []


def test_every_golden_file_has_its_case() -> None:
    for golden in (CASES / "invalid").glob("*.expected.json"):
        assert golden.with_name(golden.name.replace(".expected.json", ".sop.yaml")).exists(), golden


def test_codes_are_documented_in_the_code_table() -> None:
    """Every code has its row in docs/writing.md's table (the how-to page on checking)."""
    page = (ROOT / "docs" / "writing.md").read_text(encoding="utf-8")
    table = page.split("## Diagnostic codes", 1)[1].split("\n## ", 1)[0]
    missing = [code for code in CODES if f"| `{code}` |" not in table]
    assert missing == []


def test_readme_example_sop_is_clean() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## A short example", 1)[1]
    example = section.split("A complete small SOP", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    from engine.compile.compiler import check_text

    assert check_text(example, "README.md").diagnostics == ()
