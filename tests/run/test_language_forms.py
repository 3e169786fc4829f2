"""Language forms that let one file say what MetaGPT's examples need (issue 13): role
variables (`vars`, `role.vars.X`, template `send_to`), an action's own `system` prompt,
exec `command` items as templates, and `join` after `for_each`. Each is checked by
`validate` where it can be, and runs (and resumes) for real."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from run_helpers import default_answer, run_sop, sop_text

from engine.compile.compiler import check_text
from engine.cli.commands import main
from engine.models.fake import answer_text
from engine.models.types import CallSpec
from engine.run.actions import role_prefix
from engine.testing import ScriptedModel, use_model

DEBATE = """
apiVersion: sop/v1
name: debate
inputs:
  idea: {type: str, required: true}
roles:
  Proposer:
    name: Biden
    vars: {opponent: Trump, side: for}
    watch: [UserRequirement, Speak]
    actions: [Speak]
  Opponent:
    name: Trump
    vars: {opponent: Biden, side: against}
    watch: [Speak]
    actions: [Speak]
actions:
  Speak:
    prompt: "Argue {{ role.vars.side }} {{ inputs.idea }}; answer {{ role.vars.opponent }}."
    max_runs: 2
    send_to: ["{{ role.vars.opponent }}"]
    artifacts:
      - {path: "speeches/{{ role.vars.side }}-{{ run.round }}.md", content: "{{ out }}"}
"""


def _diagnostics(text: str) -> list[tuple[str, str, str, str]]:
    return [(d.code, d.pointer, d.message, d.hint) for d in check_text(text).diagnostics]


def _codes(text: str) -> list[str]:
    return [d.code for d in check_text(text).diagnostics]


# --- role variables --------------------------------------------------------------------------

def test_shared_action_sends_each_role_to_its_own_opponent(tmp_path: Path) -> None:
    assert check_text(DEBATE).diagnostics == ()
    model = ScriptedModel(default_answer)
    result = run_sop(sop_text(DEBATE), model, tmp_path, idea="the motion")
    speeches = [m for m in result.messages if m.cause_by == "Speak"]
    assert [(m.sent_from, sorted(m.send_to)) for m in speeches] == [
        ("Proposer", ["Trump"]), ("Opponent", ["Biden"]), ("Proposer", ["Trump"]), ("Opponent", ["Biden"])]
    prompts = [r.spec.prompt for r in model.requests]
    assert prompts[0].startswith("Argue for the motion; answer Trump.")
    assert prompts[1].startswith("Argue against the motion; answer Biden.")
    assert "speeches/against-2.md" in result.artifacts


def test_a_variable_one_runner_lacks_is_named_with_role_and_action() -> None:
    text = DEBATE.replace("vars: {opponent: Biden, side: against}", "vars: {oponent: Biden, side: against}")
    found = _diagnostics(text)
    assert [(c, p) for c, p, _, _ in found] == [("SOP409", "/actions/Speak/prompt"),
                                                  ("SOP409", "/actions/Speak/send_to/0")]
    code, pointer, message, hint = found[0]
    assert "role 'Opponent'" in message and "'Speak'" in message and "'opponent'" in message
    assert hint == "did you mean 'oponent'?"


def test_the_checker_locates_an_undeclared_variable_at_its_word() -> None:
    text = DEBATE.replace("    vars: {opponent: Trump, side: for}\n", "")
    diag = next(d for d in check_text(text).diagnostics if d.pointer == "/actions/Speak/prompt")
    line = text.splitlines()[diag.line - 1]
    assert diag.code == "SOP409" and line[diag.col - 1:].startswith("side")
    assert "add `vars: {side: ...}` to role 'Proposer'" in diag.hint


def test_send_to_resolved_per_role_must_name_a_role() -> None:
    text = DEBATE.replace("vars: {opponent: Biden, side: against}", "vars: {opponent: Bidenn, side: against}")
    assert _diagnostics(text) == [
        ("SOP203", "/actions/Speak/send_to/0", "send_to of 'Speak' for role 'Opponent' gives unknown "
         "address 'Bidenn'", "did you mean 'Biden'?")]


def test_send_to_templates_read_only_the_role() -> None:
    text = DEBATE.replace('send_to: ["{{ role.vars.opponent }}"]', 'send_to: ["{{ inputs.idea }}"]')
    errors = [(c, p, m) for c, p, m, _ in _diagnostics(text) if c.startswith("SOP4")]
    assert errors == [("SOP402", "/actions/Speak/send_to/0", "undeclared template variable 'inputs'")]


def test_role_vars_are_scalars_with_identifier_names() -> None:
    assert _codes(DEBATE.replace("side: for}", "side: [a, b]}")) == ["SOP103"]
    assert _codes(DEBATE.replace("vars: {opponent: Trump,", "vars: {my-opponent: Trump,")) == ["SOP106"]


# --- an action's own system prompt ----------------------------------------------------------

SYSTEM = DEBATE.replace('    prompt: "Argue', '''    system: |
      You are a debater. Never concede to {{ role.vars.opponent }}.
    prompt: "Argue''')


def test_action_system_follows_the_role_prefix(tmp_path: Path) -> None:
    compiled = sop_text(SYSTEM)
    model = ScriptedModel(default_answer)
    run_sop(compiled, model, tmp_path, idea="the motion")
    first = model.requests[0]
    prefix = role_prefix(compiled, "Proposer")
    assert first.spec.system == prefix + "\n\nYou are a debater. Never concede to Trump."
    assert first.messages[0] == {"role": "system", "content": first.spec.system}  # in the request hash
    assert model.requests[1].spec.system.endswith("Never concede to Biden.")


def test_without_system_the_request_is_unchanged(tmp_path: Path) -> None:
    compiled = sop_text(DEBATE)
    model = ScriptedModel(default_answer)
    run_sop(compiled, model, tmp_path, idea="the motion")
    assert model.requests[0].spec.system == role_prefix(compiled, "Proposer")


def test_system_is_checked_like_a_prompt() -> None:
    text = SYSTEM.replace("Never concede to {{ role.vars.opponent }}", "Never concede to {{ opponent }}")
    assert [(c, p) for c, p, _, _ in _diagnostics(text)] == [("SOP402", "/actions/Speak/system")]


# --- exec command items are templates ---------------------------------------------------------

SCRIPT = """
apiVersion: sop/v1
name: script
inputs:
  idea: {type: str, required: true}
  name: {type: str, default: show_args}
roles:
  Coder:
    watch: [UserRequirement]
    actions: [WriteScript, RunScript]
    react_mode: by_order
actions:
  WriteScript:
    prompt: Write a script for {{ inputs.idea }}.
    output: {code: python}
    send_to: ["<none>"]
    artifacts:
      - {path: "{{ inputs.name }}.py", content: "{{ out }}"}
  RunScript:
    kind: exec
    command: [python, "{{ inputs.name }}.py", "{{ inputs.idea }}"]
    send_to: ["<none>"]
    artifacts:
      - {path: run.txt, content: "{{ out.stdout }}"}
"""


def test_command_items_render_each_into_one_argument_without_a_shell(tmp_path: Path) -> None:
    script = "```python\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n```"
    model = ScriptedModel([script])
    idea = "two words; echo injected $HOME"
    result = run_sop(sop_text(SCRIPT), model, tmp_path, idea=idea, allow_exec=True)
    assert result.status == "idle", result.error
    assert json.loads((tmp_path / "run.txt").read_text()) == [idea]


@pytest.mark.parametrize(("item", "code"), [
    ("{{ inputs.nmae }}.py", "SOP404"), ("{{ nope }}", "SOP402"), ("{{ inputs.name | shout }}", "SOP406"),
    ("{{ inputs.name", "SOP401")])
def test_command_items_are_checked_like_prompts(item: str, code: str) -> None:
    text = SCRIPT.replace('"{{ inputs.name }}.py", "{{ inputs.idea }}"', f'"{item}"')
    found = _diagnostics(text)
    assert [(c, p) for c, p, _, _ in found] == [(code, "/actions/RunScript/command/1")]


def test_command_of_an_llm_action_is_an_error_not_a_template() -> None:
    """A `command` on a kind llm action is a key of another kind (SOP110): its items are not
    checked as templates (the file stops at its structure)."""
    text = SCRIPT.replace("    kind: exec\n", "").replace("{{ inputs.idea }}\"]", "{{ nope }}\"]")
    text = text.replace("{{ out.stdout }}", "{{ out }}")
    assert _codes(text) == ["SOP110"]


# --- join after for_each ----------------------------------------------------------------------

SECTIONS = """
apiVersion: sop/v1
name: sections
inputs:
  idea: {type: str, required: true}
roles:
  Writer:
    watch: [UserRequirement]
    actions: [WriteSection]
actions:
  WriteSection:
    for_each: "{{ ['Intro', 'Body', 'End'] }}"
    as: title
    max_concurrency: 3
    prompt: "Write the section {{ title }} of {{ inputs.idea }}."
    send_to: ["<none>"]
    join:
      content: "{% for o in outs %}## {{ loop.index }}\\n{{ o }}\\n{% endfor %}"
      path: "{{ inputs.idea | slug }}.md"
"""


def _section_answer(spec: CallSpec, attempt: int = 0) -> str:
    return "text of " + spec.prompt.split("section ", 1)[1].split(" ", 1)[0]


def test_join_makes_one_message_and_one_file_in_item_order(tmp_path: Path) -> None:
    assert check_text(SECTIONS).diagnostics == ()
    result = run_sop(sop_text(SECTIONS), ScriptedModel(_section_answer), tmp_path, idea="A Guide")
    joined = "## 1\ntext of Intro\n## 2\ntext of Body\n## 3\ntext of End\n"
    message = result.messages[-1]
    assert message.content == joined
    assert message.out == ["text of Intro", "text of Body", "text of End"]
    assert result.artifacts == ["a_guide.md"]
    assert (tmp_path / "a_guide.md").read_text() == joined


def test_join_by_separator(tmp_path: Path) -> None:
    text = SECTIONS.replace('content: "{% for o in outs %}## {{ loop.index }}\\n{{ o }}\\n{% endfor %}"',
                            'separator: "\\n---\\n"')
    result = run_sop(sop_text(text), ScriptedModel(_section_answer), tmp_path, idea="A Guide")
    assert result.messages[-1].content == "text of Intro\n---\ntext of Body\n---\ntext of End"


@pytest.mark.parametrize(("old", "new", "expected"), [
    ('    for_each: "{{ [\'Intro\', \'Body\', \'End\'] }}"\n', "", ("SOP104", "/actions/WriteSection")),
    ('path: "{{ inputs.idea | slug }}.md"', 'path: "../{{ inputs.idea | slug }}.md"',
     ("SOP405", "/actions/WriteSection/join/path")),
    ("{{ o }}", "{{ out }}", ("SOP402", "/actions/WriteSection/join/content")),
    ("{{ o }}", "{{ title }}", ("SOP402", "/actions/WriteSection/join/content")),
    ("separator", "separator", ("", "")),
])
def test_join_is_validated(old: str, new: str, expected: tuple[str, str]) -> None:
    text = SECTIONS.replace(old, new)
    text = text.replace("    as: title\n", "") if expected[0] == "SOP104" else text
    text = text.replace("{{ title }} of", "it of") if expected[0] == "SOP104" else text
    found = [(c, p) for c, p, _, _ in _diagnostics(text)]
    assert found == ([expected] if expected[0] else [])


def _fake(spec: CallSpec, attempt: int) -> str:
    return answer_text(spec)


def test_a_joined_message_is_journaled_and_reused_on_resume(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    sop_file = tmp_path / "sections.sop.yaml"
    sop_file.write_text(SECTIONS, encoding="utf-8")
    ws = tmp_path / "run"
    counting = ScriptedModel(_fake)
    with use_model(counting, name="counting"):
        assert main(["run", str(sop_file), "--idea", "A Guide", "--model", "counting", "--out", str(ws),
                     "--format", "json"]) == 0
        first = json.loads(capsys.readouterr().out)
        paid = counting.calls
        joined = (ws / "a_guide.md").read_text()
        (ws / "a_guide.md").unlink()
        assert main(["resume", str(ws), "--format", "json"]) == 0
        resumed = json.loads(capsys.readouterr().out)
    assert counting.calls == paid == 3 and resumed["llm_calls"] == 0
    assert resumed["history"] == first["history"]
    assert (ws / "a_guide.md").read_text() == joined



def test_a_join_path_the_workspace_refuses_fails_at_its_place(tmp_path: Path) -> None:
    text = SECTIONS.replace('path: "{{ inputs.idea | slug }}.md"', 'path: "{{ inputs.idea }}"')
    result = run_sop(sop_text(text), ScriptedModel(_section_answer), tmp_path, idea="../outside.md")
    assert result.status == "failed" and not (tmp_path.parent / "outside.md").exists()
    assert result.diagnostic is not None
    assert (result.diagnostic.code, result.diagnostic.pointer) == ("SOP502", "/actions/WriteSection/join/path")


def test_the_schema_and_the_models_know_the_same_new_keys() -> None:
    from engine.load import schema as sop_schema
    from engine.load.spec import JoinSpec

    defs = sop_schema.schema()["$defs"]
    assert set(defs["JoinSpec"]["properties"]) == set(JoinSpec.model_fields)
    assert {"system", "join"} <= set(defs["LlmAction"]["properties"])
    assert "vars" in defs["RoleSpec"]["properties"]
