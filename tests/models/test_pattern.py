"""`pattern` on an output node: every string of the node must match it, whatever the model.

Patterns run on RE2, in time linear in the answer: a shared file's pattern cannot make a
crafted answer hang the run (each backtracking case below would hang Python's `re`), and a
pattern RE2 cannot run (backreferences, lookaround) is refused when the file is checked."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from engine.cli.commands import main as sopctl
from engine.errors import ActionFailed
from engine.load.outputs import node_schema
from engine.load.patterns import problem, search
from engine.load.spec import OutputNode
from engine.models.answers import schema_errors
from engine.models.fake import instance
from engine.models.gateway import Gateway
from engine.models.types import CallSpec
from engine.testing import ScriptedModel, use_model

FILE = r"^[A-Za-z0-9_][A-Za-z0-9_./-]*\.[a-z]+$"


def test_the_pattern_reaches_every_string_of_the_node():
    schema = node_schema(OutputNode(type="optional[list[str]]", pattern=FILE))
    assert schema["anyOf"][0]["items"]["pattern"] == FILE
    assert "pattern" not in node_schema(OutputNode(type="enum[a|b]", pattern=FILE))


@pytest.mark.parametrize("pattern", [FILE, r"^[a-z_]+\.py$", r"^\w+$", r"\.py$", r"^[a-z]+$"])
def test_fake_answers_strings_that_match(pattern):
    schema = node_schema(OutputNode(type="list[str]", pattern=pattern))
    answer = instance(schema, "Task list")
    assert answer and all(search(pattern, item) for item in answer)
    assert schema_errors({"Files": answer}, _object(schema)) == []


def _object(node: dict) -> dict:
    return {"type": "object", "required": ["Files"], "additionalProperties": False,
            "properties": {"Files": node}}


def _spec(pattern: str = FILE, retries: int = 1) -> CallSpec:
    schema = _object(node_schema(OutputNode(type="list[str]", pattern=pattern)))
    return CallSpec(action="Plan", role="R", system="s", prompt="p", kind="json", model="fake",
                    schema=schema, retries=retries)


def test_an_answer_that_misses_the_pattern_is_asked_again_then_accepted():
    model = ScriptedModel([json.dumps({"Files": ["a game file"]}), json.dumps({"Files": ["game.py"]})])
    with use_model(model):
        result = asyncio.run(Gateway().call(_spec()))
    assert result.value == {"Files": ["game.py"]}
    assert f"at /Files/0: 'a game file' does not match {FILE!r}" in model.prompts()[-1]


def test_an_answer_that_never_matches_fails_the_action():
    model = ScriptedModel([json.dumps({"Files": ["no good"]})] * 2)
    with use_model(model), pytest.raises(ActionFailed, match="Plan"):
        asyncio.run(Gateway().call(_spec()))


@pytest.mark.parametrize("pattern, missing, matching", [
    ("(a|a)+$", "a" * 5000 + "!", "a" * 5000),
    ("(x+x+)+y", "x" * 5000, "x" * 5000 + "y"),
    ("(.*a){20}", "a" * 19 + "b" * 5000, "a" * 20 + "b" * 5000),
])
def test_a_backtracking_pattern_judges_a_long_answer_at_once(pattern, missing, matching):
    """Python's `re` would take exponential (or n**20) time on the missing answer."""
    model = ScriptedModel([json.dumps({"Files": [missing]}), json.dumps({"Files": [matching]})])
    with use_model(model):
        result = asyncio.run(Gateway().call(_spec(pattern)))
    assert result.value == {"Files": [matching]} and result.attempts == 2   # the first was refused
    assert "at /Files/0: " + repr(missing)[:40] in model.prompts()[-1]


@pytest.mark.parametrize("pattern, text, matches", [
    (r"^[a-z_]+\.py$", "game_board.py", True),
    (r"^[a-z_]+\.py$", "game.py\n", False),       # `$` is the end of the text, as in JSON Schema
    (r"\d{3}", "room 101", True),                   # unanchored: a search, as in JSON Schema
    (r"^\d{3}$", "١٠١", False),                     # \d, \w are ASCII, as in JSON Schema
    (r"^\w+$", "café", False),
    ("^[a-z]+$", "ab\ud800", False),                # an unpaired surrogate is no crash
])
def test_patterns_mean_what_json_schema_says(pattern, text, matches):
    assert search(pattern, text) is matches
    errors = schema_errors({"Files": [text]}, _object({"type": "array", "items": {"type": "string", "pattern": pattern}}))
    assert (errors == []) is matches


SOP = """\
apiVersion: sop/v1
name: files
inputs:
  idea: {{type: str, required: true}}
actions:
  Plan:
    prompt: "Name the files of {{{{ inputs.idea }}}}."
    output:
      Files: {{type: "list[str]", pattern: '{pattern}'}}
    artifacts: [{{path: files.json, content: "{{{{ out['Files'] | tojson }}}}"}}]
roles:
  Planner:
    actions: [Plan]
    watch: [UserRequirement]
"""


@pytest.mark.parametrize("pattern, construct", [
    (r"^(\w+)\.\1$", r"a backreference `\1`"),
    (r"^(?!test_)\w+\.py$", "negative lookahead `(?!...)`"),
    (r"^\w+(?=\.py)", "lookahead `(?=...)`"),
    (r"(?<=src/)\w+$", "lookbehind `(?<=...)`"),
])
def test_a_pattern_that_needs_backtracking_is_refused_before_any_run(tmp_path: Path, capsys, pattern, construct):
    sop = tmp_path / "files.sop.yaml"
    sop.write_text(SOP.format(pattern=pattern), encoding="utf-8")
    assert sopctl(["validate", str(sop)]) == 1
    out = capsys.readouterr().out
    assert f"{sop}:9:43: error[SOP109]: `pattern` needs a linear-time regular expression: {construct} is not supported" in out
    assert "at /actions/Plan/output/Files/pattern" in out
    workspace = tmp_path / "ws"
    assert sopctl(["run", str(sop), "--idea", "a game", "--model", "fake", "--out", str(workspace)]) == 2
    assert "SOP109" in capsys.readouterr().err and not workspace.exists()


@pytest.mark.parametrize("pattern, message, hint", [
    (r"^a*+$", "a possessive quantifier `*+` is not supported", "linear time"),
    (r"^(?>ab)c$", "an atomic group `(?>...)` is not supported", "linear time"),
    (r"^(?P<x>a)(?P=x)$", "a named backreference `(?P=name)` is not supported", "no backreferences"),
    (r"^a\Z", r"`\Z` is not supported", "write `$`"),
    (r"^\u00e9$", r"`\u` is not supported", r"`\x{00e9}`"),
    (r"^a{1001}$", "invalid repetition size: {1001}", "escape special characters"),
    (r"^[a-z$", "missing ]: [a-z$", "escape special characters"),
])
def test_a_pattern_re2_cannot_run_says_why_and_what_to_write(pattern, message, hint):
    refused = problem(pattern)
    assert refused is not None and message in str(refused) and hint in refused.hint
    assert problem(r"^(?i)[a-z_]+\.py$") is None


def test_the_fake_model_runs_a_file_with_patterns_to_its_end(tmp_path: Path, capsys):
    sop = tmp_path / "files.sop.yaml"
    sop.write_text(SOP.format(pattern=r"^[a-z_]+\.py$"), encoding="utf-8")
    workspace = tmp_path / "ws"
    assert sopctl(["run", str(sop), "--idea", "a game", "--model", "fake", "--out", str(workspace)]) == 0
    files = json.loads((workspace / "files.json").read_text(encoding="utf-8"))
    assert files and all(search(r"^[a-z_]+\.py$", name) for name in files)
