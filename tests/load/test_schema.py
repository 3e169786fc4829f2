"""The JSON Schema: generated from the models, well formed, documented, local-only, and in
agreement with the models on every case."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from pydantic import ValidationError

from engine.compile.compiler import _spec
from engine.errors import LoadError, did_you_mean
from engine.load import schema as sop_schema
from engine.load.source import load_path
from engine.load.spec import Sop

from run_helpers import ROOT

CASES = sorted((ROOT / "tests" / "cases").glob("*/*.sop.yaml"))


def _loadable(path: Path) -> Any:
    try:
        return load_path(path).data
    except LoadError:
        return None


def _models_accept(data: Any) -> bool:
    try:
        Sop.model_validate(data)
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize("case", [c for c in CASES if _loadable(c) is not None],
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_schema_and_models_agree(case: Path) -> None:
    """Every case that loads as YAML (the others never reach either layer)."""
    data = _loadable(case)
    schema_ok = not sop_schema.validate(data)
    assert schema_ok == _models_accept(data)
    if case.parent.name == "valid":
        assert schema_ok


def test_schema_is_valid_2020_12_and_matches_the_shipped_file() -> None:
    document = json.loads((ROOT / "schemas" / "sop.schema.json").read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(document)
    assert document == sop_schema.schema()
    assert document["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def _properties(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for name, sub in node.get("properties", {}).items():
            yield f"{path}/{name}", sub
        for key, value in node.items():
            if key not in ("if", "then"):  # conditions restate keys documented above them
                yield from _properties(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _properties(value, f"{path}/{i}")


def test_committed_copies_are_what_the_models_generate() -> None:
    """The schema (package data, schemas/) and docs/language.md are the models' output."""
    from engine.load import schema_gen

    assert schema_gen.stale() == [], "stale: run python -m engine.load.schema_gen"


def test_check_mode_names_the_command_and_fails_on_a_stale_copy(tmp_path: Path) -> None:
    from engine.load import schema_gen

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "writing.md").write_text((ROOT / "docs" / "writing.md").read_text(encoding="utf-8"),
                                                  encoding="utf-8")
    for path, text in schema_gen.generate().items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text, encoding="utf-8")
    assert schema_gen.stale(tmp_path) == []
    (tmp_path / "schemas" / "sop.schema.json").write_text("{}", encoding="utf-8")
    assert schema_gen.stale(tmp_path) == ["schemas/sop.schema.json"]


def test_the_reference_shows_a_real_use_of_a_key_from_the_shipped_files(tmp_path: Path) -> None:
    """docs/language.md's example column: each key's first use in a shipped file, named, cut
    to one short line; a file the models refuse gives none."""
    from engine.load.reference import key_examples

    good = tmp_path / "tiny.sop.yaml"
    good.write_text("apiVersion: sop/v1\nname: tiny\nteam: {max_rounds: 3}\nactions:\n  Say: {prompt: '"
                    + "x" * 200 + "'}\nroles:\n  R: {actions: [Say], watch: [UserRequirement]}\n", encoding="utf-8")
    bad = tmp_path / "bad.sop.yaml"
    bad.write_text("apiVersion: sop/v1\nname: bad\nteam: {max_rounds: -1}\n", encoding="utf-8")
    found = key_examples([bad, good])
    assert found["TeamSpec"]["max_rounds"] == "`3` (tiny)"
    prompt = found["LlmAction"]["prompt"]
    assert prompt.startswith('`"xxx') and prompt.endswith("…` (tiny)") and len(prompt) < 80
    text = (ROOT / "docs" / "language.md").read_text(encoding="utf-8")
    assert "| `max_rounds` |" in text and "(software_company) |" in text


def test_definitions_are_titled_after_the_thing() -> None:
    """An editor's hover names the role, the action's kind or the output node."""
    defs = sop_schema.schema()["$defs"]
    titles = {name: d.get("title") for name, d in defs.items()}
    assert all(titles.values()), titles
    assert titles["RoleSpec"] == "Role" and titles["OutputNode"] == "Output node"
    assert titles["LlmAction"] == "Action (kind llm)" and titles["McpServerSpec"] == "MCP server"
    action = sop_schema.schema()["properties"]["actions"]["additionalProperties"]
    assert action["title"] == "Action"


def test_each_kind_offers_only_its_keys() -> None:
    defs = sop_schema.schema()["$defs"]
    keys = {kind: set(defs[name]["properties"]) for kind, name in
            (("llm", "LlmAction"), ("exec", "ExecAction"), ("ask", "AskAction"), ("reply", "ReplyAction"))}
    assert {"command", "command_timeout_s", "env"} <= keys["exec"] and not {"command", "env"} & keys["llm"]
    assert {"tools", "review", "max_retries", "system"} <= keys["llm"] - keys["ask"] - keys["exec"]
    assert {"prompt", "context", "output"} <= keys["ask"] and "context" not in keys["reply"]
    assert all(defs[name].get("additionalProperties") is False for name in defs)


def test_enum_values_have_their_own_descriptions() -> None:
    defs = sop_schema.schema()["$defs"]
    action = sop_schema.schema()["properties"]["actions"]["additionalProperties"]
    enums = [action["properties"]["kind"], defs["RoleSpec"]["properties"]["react_mode"],
             defs["LlmAction"]["properties"]["format"], defs["LlmAction"]["properties"]["fill"],
             defs["LlmAction"]["properties"]["publish"]]
    for enum in enums:
        assert len(enum["markdownEnumDescriptions"]) == len(enum["enum"]) == len(enum["enumDescriptions"])


def test_null_is_offered_only_where_a_file_may_write_it() -> None:
    defs = sop_schema.schema()["$defs"]
    assert defs["OutputNode"]["properties"]["type"]["type"] == "string"
    assert "null" not in json.dumps(defs["OutputNode"]["properties"]["children"])
    assert "null" in defs["LlmAction"]["properties"]["system"]["type"]
    assert not _models_accept({"apiVersion": "sop/v1", "name": "x", "roles": {"R": {"actions": ["A"]}},
                               "actions": {"A": {"output": {"Key": {"type": None}}}}})


def test_no_extra_named_that_pyproject_lacks() -> None:
    """The schema once named a `bm25` extra; every extra it names must exist."""
    import re

    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    section = pyproject.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    extras = set(re.findall(r"^([a-z0-9_-]+) = \[", section, flags=re.M))
    assert {"mcp", "local"} <= extras
    named = set(re.findall(r"the `(\w+)` extra", sop_schema.schema_text()))
    assert named <= extras


def test_every_key_has_a_description() -> None:
    document = sop_schema.schema()
    defs = document["$defs"]
    for where, prop in _properties(document):
        if prop is False:       # a key forbidden there (an MCP server's other transport): nothing to describe
            continue
        target = defs[prop["$ref"].rsplit("/", 1)[1]] if "$ref" in prop else prop
        assert target.get("description"), where


def test_no_remote_references() -> None:
    refs: list[str] = []
    json.loads(sop_schema.schema_text(), object_hook=lambda d: refs.extend([d["$ref"]] if "$ref" in d else []) or d)
    assert refs and all(ref.startswith("#/$defs/") for ref in refs)


def test_remote_reference_is_never_fetched() -> None:
    from referencing import Registry
    from referencing.exceptions import Unresolvable

    validator = Draft202012Validator({"$ref": "https://example.invalid/x.json"}, registry=Registry())
    with pytest.raises(Unresolvable):
        validator.validate({})


def test_model_fields_are_schema_keys() -> None:
    defs = sop_schema.schema()["$defs"]
    from engine.load.spec import (
        ArtifactSpec,
        AskAction,
        ExecAction,
        InputSpec,
        LlmAction,
        LLMSpec,
        PlannerSpec,
        ReplyAction,
        RoleSpec,
    )

    pairs = {"LlmAction": LlmAction, "ExecAction": ExecAction, "AskAction": AskAction,
             "ReplyAction": ReplyAction, "RoleSpec": RoleSpec, "PlannerSpec": PlannerSpec, "InputSpec": InputSpec,
             "LLMSpec": LLMSpec, "ArtifactSpec": ArtifactSpec}
    for name, model in pairs.items():
        fields = {f.alias or key for key, f in model.model_fields.items()}
        assert fields == set(defs[name]["properties"]), name


def test_integral_float_is_not_an_integer_for_either() -> None:
    data = {"apiVersion": "sop/v1", "name": "x", "actions": {"A": {"max_retries": 2.0}},
            "roles": {"R": {"actions": ["A"]}}}
    assert [d.code for d in sop_schema.validate(data)] == ["SOP103"]
    assert not _models_accept(data)


def test_model_only_refusal_becomes_a_diagnostic() -> None:
    spec, found = _spec({"apiVersion": "sop/v1", "name": "x", "actions": {}, "roles": {"R": {"actions": []}},
                         "bogus": 1})
    assert spec is None
    assert {d.code for d in found} == {"SOP108"}
    assert {d.pointer for d in found} == {"/roles/R/actions", "/bogus"}


def test_model_only_refusal_in_an_action_names_the_key_not_the_kind() -> None:
    """pydantic puts the union's tag (`exec`) in an error's location; the pointer skips it."""
    _, found = _spec({"apiVersion": "sop/v1", "name": "x", "roles": {"R": {"actions": ["A"]}},
                      "actions": {"A": {"kind": "exec", "command": ["x"], "timeout_s": 0}}})
    assert [(d.code, d.pointer) for d in found] == [("SOP108", "/actions/A/timeout_s")]


def test_did_you_mean() -> None:
    assert did_you_mean("by_orderr", ["react", "by_order"]) == "did you mean 'by_order'?"
    assert did_you_mean("zzz", ["react", "by_order"]) == ""
    assert did_you_mean(3, ["react"]) == ""


def test_all_errors_of_the_phase_are_reported() -> None:
    data = {"apiVersion": "sop/v2", "name": "Bad", "actions": {"a": {}}, "roles": {}, "extra": 1}
    codes = sorted(d.code for d in sop_schema.validate(data))
    assert codes == ["SOP101", "SOP102", "SOP105", "SOP105", "SOP106"]


def test_schema_defaults_are_the_model_defaults() -> None:
    from engine.load.spec import (
        ExecAction,
        InputSpec,
        LlmAction,
        OutputNode,
        PlannerSpec,
        RoleSpec,
    )

    defs = sop_schema.schema()["$defs"]
    pairs = {"LlmAction": LlmAction, "ExecAction": ExecAction, "RoleSpec": RoleSpec, "PlannerSpec": PlannerSpec,
             "InputSpec": InputSpec, "OutputNode": OutputNode}
    for name, model in pairs.items():
        by_alias = {(f.alias or key): f for key, f in model.model_fields.items()}
        for key, prop in defs[name]["properties"].items():
            if "default" in prop:
                assert prop["default"] == by_alias[key].get_default(call_default_factory=True), (name, key)
