"""MetaGPT's own answer forms in a tool step (RoleZero's prose + fenced JSON array, a bare
array, a bare command) are taken as they are, with no re-ask; never outside a tool step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from run_helpers import EDITOR_WRITER, run_sop, sop_text

from engine.models import answers
from engine.models.types import CallSpec
from engine.run.toolloop import step_schema
from engine.testing import ScriptedModel

SCHEMA = step_schema(["editor.write", "editor.read", "end"])
WRITE = {"command_name": "editor.write", "args": {"path": "a.md", "content": "hi"}}
END = {"command_name": "end", "args": {"Summary": "done"}}

ROLEZERO = ("I should write the file first, then finish.\n\n```json\n"
            + json.dumps([WRITE, END], indent=2) + "\n```\n")


def tool_spec(**kw: Any) -> CallSpec:
    base = dict(action="Write", role="Writer", system="", prompt="p", kind="json", model="m",
                schema=SCHEMA, format="json", tool_step=0, commands=(("editor.write", {}),))
    base.update(kw)
    return CallSpec(**base)


@pytest.mark.parametrize("text, thought, commands", [
    (ROLEZERO, "I should write the file first, then finish.", [WRITE, END]),
    (json.dumps([WRITE, END]), "", [WRITE, END]),
    (json.dumps(WRITE), "", [WRITE]),
    ("Writing it now.\n" + json.dumps(WRITE), "Writing it now.", [WRITE]),
    ("```json\n" + json.dumps(WRITE) + "\n```", "", [WRITE]),
    ("Thoughts.\n```json\n" + json.dumps(WRITE) + ",\n" + json.dumps(END) + "]\n```", "Thoughts.",
     [WRITE, END]),    # RoleZero mends an array that lost its "["
])
def test_metagpt_forms_are_read_as_thought_and_commands(text: str, thought: str, commands: list) -> None:
    assert answers.read(tool_spec(), text) == {"thought": thought, "commands": commands}


def test_our_own_form_is_read_as_it_was() -> None:
    ours = {"thought": "t", "commands": [WRITE]}
    assert answers.read(tool_spec(), "```json\n" + json.dumps(ours) + "\n```") == ours


def test_a_metagpt_form_with_an_unknown_command_is_still_refused_by_the_schema() -> None:
    with pytest.raises(answers.InvalidAnswer, match="schema"):
        answers.read(tool_spec(), json.dumps([{"command_name": "rm_rf", "args": {}}]))


def test_a_list_that_is_not_commands_is_not_taken_for_one() -> None:
    with pytest.raises(answers.InvalidAnswer):
        answers.read(tool_spec(), "Steps [1] and [2] done.")


def test_outside_a_tool_step_an_array_or_a_bare_command_is_not_rewritten() -> None:
    plain = tool_spec(tool_step=-1, commands=())
    with pytest.raises(answers.InvalidAnswer, match="array"):
        answers.read(plain, json.dumps([WRITE]))
    with pytest.raises(answers.InvalidAnswer, match="schema"):   # read as the object it is
        answers.read(plain, json.dumps(WRITE))


WRITER = EDITOR_WRITER


def test_a_scripted_loop_answering_in_metagpt_forms_runs_with_no_reask(tmp_path: Path) -> None:
    write = {"command_name": "editor.write", "args": {"path": "notes/a.md", "content": "one"}}
    model = ScriptedModel([
        "Let me write the notes.\n```json\n" + json.dumps([write]) + "\n```",   # RoleZero's form
        json.dumps({"command_name": "editor.read", "args": {"path": "notes/a.md"}}),   # one bare command
        json.dumps([{"command_name": "end", "args": {"Summary": "wrote a.md"}}]),      # a bare array
    ])
    result = run_sop(sop_text(WRITER), model, tmp_path / "ws")
    assert result.status == "idle", result.error
    assert model.calls == 3              # each answer taken as it is: no re-ask
    assert (tmp_path / "ws" / "notes" / "a.md").read_text() == "one"
    assert result.messages[-1].out == {"Summary": "wrote a.md"}
    assert "1|one" in model.prompts()[2]
