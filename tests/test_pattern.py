"""`pattern` on an output node: every string of the node must match it, whatever the model."""

from __future__ import annotations

import asyncio
import json

import pytest

from engine.errors import ActionFailed
from engine.load.outputs import node_schema
from engine.load.spec import OutputNode
from engine.models.fake import instance
from engine.models.gateway import Gateway
from engine.models.types import CallSpec
from engine.testing import ScriptedModel, use_model

FILE = r"^[A-Za-z0-9_][A-Za-z0-9_./-]*\.[a-z]+$"


def test_the_pattern_reaches_every_string_of_the_node():
    schema = node_schema(OutputNode(type="optional[list[str]]", pattern=FILE))
    assert schema["anyOf"][0]["items"]["pattern"] == FILE
    assert "pattern" not in node_schema(OutputNode(type="enum[a|b]", pattern=FILE))


def test_fake_answers_strings_that_match():
    schema = node_schema(OutputNode(type="list[str]", pattern=FILE))
    assert instance(schema, "Task list")[0].endswith(".py")


def _spec() -> CallSpec:
    schema = {"type": "object", "required": ["Files"], "additionalProperties": False,
              "properties": {"Files": node_schema(OutputNode(type="list[str]", pattern=FILE))}}
    return CallSpec(action="Plan", role="R", system="s", prompt="p", kind="json", model="fake",
                    schema=schema, retries=1)


def test_an_answer_that_misses_the_pattern_is_asked_again_then_accepted():
    model = ScriptedModel([json.dumps({"Files": ["a game file"]}), json.dumps({"Files": ["game.py"]})])
    with use_model(model):
        result = asyncio.run(Gateway().call(_spec()))
    assert result.value == {"Files": ["game.py"]}
    assert "a game file" in model.prompts()[-1]


def test_an_answer_that_never_matches_fails_the_action():
    model = ScriptedModel([json.dumps({"Files": ["no good"]})] * 2)
    with use_model(model), pytest.raises(ActionFailed, match="Plan"):
        asyncio.run(Gateway().call(_spec()))
