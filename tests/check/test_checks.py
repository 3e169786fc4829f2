"""Semantic checks: what each one accepts as well as what it refuses."""

from __future__ import annotations

import pytest

from engine.compile.compiler import check_text
from engine.check.diagnostics import CODES
from engine.check.phases import registered_codes


def _sop(actions: str, roles: str = "  R: {actions: [A], watch: [UserRequirement]}\n", inputs: str = "") -> str:
    return f"apiVersion: sop/v1\nname: t\n{inputs}actions:\n{actions}roles:\n{roles}"


def _codes(text: str) -> list[str]:
    return [d.code for d in check_text(text).diagnostics]


ART = "artifacts: [{path: a.md, content: x}]"


def test_registered_codes_are_catalogued() -> None:
    assert registered_codes() <= set(CODES)


@pytest.mark.parametrize("prompt", [
    "{{ inputs }} {{ role.name }} {{ news[-1].content }} {{ run.round }} {{ msgs.A }}",
    "{% for m in news %}{{ m.content }} {{ loop.index }}{% endfor %}",
    "{% set x = 3 %}{{ x }} {{ range(3) | list }}",
])
def test_allowed_variables(prompt: str) -> None:
    assert _codes(_sop(f'  A: {{prompt: "{prompt}", {ART}}}\n')) == []


def test_out_only_in_artifacts() -> None:
    assert _codes(_sop(f'  A: {{prompt: "{{{{ out }}}}", {ART}}}\n')) == ["SOP402"]


def test_for_each_names_and_as() -> None:
    action = ('  A:\n    for_each: "{{ inputs.files }}"\n    as: filename\n'
              '    prompt: "{{ filename }} {{ index }}"\n'
              '    artifacts: [{path: "src/{{ filename }}", content: "{{ out }}"}]\n')
    assert _codes(_sop(action, inputs="inputs: {files: {type: str}}\n")) == []
    assert _codes(_sop(action.replace("{{ filename }} {{ index }}", "{{ item }}"),
                       inputs="inputs: {files: {type: str}}\n")) == ["SOP402"]


def test_task_only_in_the_task_action() -> None:
    plan = ('  P:\n    prompt: "{{ task }}"\n    output:\n      tasks:\n        type: list\n        children:\n'
            '          task_id: {type: str}\n          dependent_task_ids: {type: "list[str]"}\n'
            '          instruction: {type: str}\n'
            f'  T: {{prompt: "{{{{ task.instruction }}}}", {ART}}}\n')
    roles = "  R: {actions: [P, T], watch: [UserRequirement], react_mode: plan_and_act, planner: {action: P, task_action: T}}\n"
    assert _codes(_sop(plan, roles)) == ["SOP402"]
    assert _codes(_sop(plan.replace('prompt: "{{ task }}"', "prompt: plan"), roles)) == []


def test_nested_keys_and_list_items() -> None:
    output = ("    output:\n      Files:\n        type: list\n        children:\n"
              "          path: {type: str}\n          body: {type: str}\n      Meta:\n        children:\n"
              "          author: {type: str}\n")
    good = "{{ out['Files'][0]['path'] }} {{ out.Meta.author }} {{ out['Files'] | length }} {{ out.items() }}"
    assert _codes(_sop(f"  A:\n    prompt: x\n{output}    artifacts: [{{path: a, content: \"{good}\"}}]\n")) == []
    bad = "{{ out['Files'][0]['paht'] }} {{ out.Meta.writer }}"
    assert _codes(_sop(f"  A:\n    prompt: x\n{output}    artifacts: [{{path: a, content: \"{bad}\"}}]\n")) == [
        "SOP403", "SOP403"]


def test_msgs_reference_to_a_for_each_producer_needs_an_index() -> None:
    actions = ('  A:\n    for_each: "{{ inputs.xs }}"\n    prompt: "{{ item }}"\n'
               "    output: {Name: {type: str}}\n"
               '  B: {prompt: "{{ msgs.A[-1].out[0][\'Name\'] }} {{ msgs.A[-1].out[0][\'Nme\'] }}", ' + ART + "}\n")
    roles = "  R: {actions: [A], watch: [UserRequirement]}\n  S: {actions: [B], watch: [A]}\n"
    found = check_text(_sop(actions, roles, inputs="inputs: {xs: {type: str}}\n")).diagnostics
    assert [(d.code, d.message) for d in found] == [("SOP403", "the output of 'A' has no key 'Nme'")]


def test_exec_output_keys() -> None:
    action = ('  A: {kind: exec, command: [pytest], artifacts: [{path: log.txt, '
              'content: "{{ out.stdout }}{{ out[\'exit_code\'] }}{{ out.stdot }}"}]}\n')
    assert _codes(_sop(action)) == ["SOP403"]


def test_template_line_in_a_block_scalar_is_the_file_line() -> None:
    text = _sop(f"  A:\n    prompt: |\n      line one\n      line two {{{{ nope }}}}\n    {ART}\n")
    (diag,) = check_text(text).diagnostics
    assert (diag.code, diag.line, diag.col) == ("SOP402", 7, 19)  # under `nope`


def test_earlier_action_of_a_by_order_role_is_consumed_through_memory() -> None:
    actions = f"  A: {{prompt: a, send_to: ['<none>']}}\n  B: {{prompt: b, {ART}}}\n"
    roles = "  R: {actions: [A, B], watch: [UserRequirement], react_mode: by_order}\n"
    assert _codes(_sop(actions, roles)) == []
    assert _codes(_sop(actions.replace("b, ", "b, context: none, "), roles)) == ["SOP303"]


BY_ORDER = "  R: {actions: [A, B], watch: [UserRequirement], react_mode: by_order}\n"


@pytest.mark.parametrize("reader", [
    "prompt: \"{{ msgs.A[-1].content }}\"",
    "prompt: x, when: \"{{ msgs['A'] | length > 0 }}\"",
    "prompt: \"{{ item }}\", for_each: \"{{ msgs.A[-1].out.Items }}\"",
    "prompt: x, artifacts: [{path: \"{{ msgs.A[0].out.Items[0] }}.md\", content: x}]",
    "kind: exec, command: [echo, \"{{ msgs.A[-1].content }}\"]",
    "prompt: \"{% for k, v in msgs.items() %}{{ k }}{% endfor %}\"",  # msgs as a whole
])
def test_an_output_read_by_a_later_template_is_used(reader: str) -> None:
    no_context = "" if reader.startswith("kind: exec") else "context: none, "   # exec has no context
    actions = ("  A: {prompt: a, send_to: ['<none>'], output: {Items: {type: 'list[str]'}}}\n"
               f"  B: {{{no_context}{reader}}}\n")
    assert "SOP303" not in _codes(_sop(actions, BY_ORDER))
    unread = actions.replace("msgs.A", "msgs.B").replace("msgs['A']", "msgs['B']").replace("msgs.items()", "[]")
    assert "SOP303" in _codes(_sop(unread, BY_ORDER))


def test_the_last_output_of_a_run_is_its_result() -> None:
    actions = f"  A: {{prompt: a, {ART}}}\n  B: {{prompt: b, send_to: ['<none>']}}\n"
    roles = "  R: {actions: [A], watch: [UserRequirement]}\n  S: {actions: [B], watch: [A]}\n"
    assert _codes(_sop(actions, roles)) == []


@pytest.mark.parametrize("expression, message, hint", [
    ("role.opponent_name", "role has no field 'opponent_name'", "role's fields: constraints, goal, id, name, profile, vars"),
    ("role.nmae", "role has no field 'nmae'", "did you mean 'name'?"),
    ("run.rnd", "run has no field 'rnd'", "did you mean 'round'?"),
    ("news[-1].contnet", "a message (news[...]) has no field 'contnet'", "did you mean 'content'?"),
    ("msgs.A[0].author", "a message (msgs.A[...]) has no field 'author'",
     "a message's fields: cause_by, content, out, round, send_to, sent_from, sent_from_name, sent_from_profile"),
])
def test_fields_of_role_run_and_messages_are_checked(expression: str, message: str, hint: str) -> None:
    (diag,) = check_text(_sop(f'  A: {{prompt: "{{{{ {expression} }}}}", {ART}}}\n')).diagnostics
    assert (diag.code, diag.message, diag.hint, diag.pointer) == ("SOP402", message, hint, "/actions/A/prompt")


def test_known_fields_and_rebound_names_pass() -> None:
    prompt = ("{{ role.id }}{{ role.name }}{{ role.profile }}{{ run.id }}{{ run.round }}"
              "{{ news[0].sent_from }}{{ msgs.A[-1].cause_by }}{{ role.items() }}"
              "{% for run in news %}{{ run.content }}{% endfor %}")
    assert _codes(_sop(f'  A: {{prompt: "{prompt}", {ART}}}\n')) == []


def test_phases_stop_at_the_first_with_errors() -> None:
    # an unknown watch (references) would also make the role unreachable (graph): only the first shows
    assert _codes(_sop(f"  A: {{prompt: '{{{{ bad }}}}', {ART}}}\n",
                       "  R: {actions: [A], watch: [Nope]}\n")) == ["SOP202"]


def test_warnings_do_not_stop_later_phases() -> None:
    text = _sop(f"  A: {{prompt: '{{{{ bad }}}}', {ART}}}\n  Spare: {{prompt: x}}\n")
    assert sorted(_codes(text)) == ["SOP211", "SOP402"]


def test_self_watch_loop_needs_max_runs() -> None:
    actions = f"  A: {{prompt: a, send_to: ['<self>'], {ART}}}\n"
    roles = "  R: {actions: [A], watch: [UserRequirement, A]}\n"
    assert _codes(_sop(actions, roles)) == ["SOP301"]
    assert _codes(_sop(actions.replace("a, ", "a, max_runs: 3, "), roles)) == []


def test_address_by_name_and_id() -> None:
    actions = (f"  A: {{prompt: a, send_to: [Bob, Second], {ART}}}\n"
               f"  B: {{prompt: b, {ART}}}\n")
    roles = "  First: {actions: [A], watch: [UserRequirement]}\n  Second: {name: Bob, actions: [B]}\n"
    assert _codes(_sop(actions, roles)) == []


def test_planner_actions_are_consumed_by_the_plan() -> None:
    plan = ('  P:\n    prompt: plan\n    context: none\n    output:\n      tasks:\n        type: list\n'
            '        children:\n          task_id: {type: str}\n          dependent_task_ids: {type: "list[str]"}\n'
            '          instruction: {type: str}\n'
            "  T: {prompt: '{{ task.instruction }}', context: none, send_to: ['<none>']}\n")
    roles = "  R: {actions: [P, T], watch: [UserRequirement], react_mode: plan_and_act, planner: {action: P, task_action: T}}\n"
    assert _codes(_sop(plan, roles)) == []


def test_compile_raises_with_all_diagnostics_and_returns_warnings() -> None:
    from engine.compile.compiler import compile_text
    from engine.errors import CompileError, LoadError

    with pytest.raises(LoadError) as loaded:
        compile_text("a: [", "x.sop.yaml")
    assert not isinstance(loaded.value, CompileError) and loaded.value.diagnostics[0].code == "SOP005"
    with pytest.raises(CompileError) as compiled:
        compile_text(_sop(f"  A: {{prompt: '{{{{ x }}}} {{{{ y }}}}', {ART}}}\n"))
    assert [d.code for d in compiled.value.diagnostics] == ["SOP402", "SOP402"]
    sop = compile_text(_sop(f"  A: {{prompt: a, {ART}}}\n  B: {{prompt: b}}\n"), "w.sop.yaml")
    assert [(d.code, d.file, d.line) for d in sop.warnings] == [("SOP211", "w.sop.yaml", 5)]


def test_compiled_sop_is_immutable() -> None:
    import dataclasses

    from engine.compile.compiler import compile_text

    sop = compile_text(_sop(f"  A: {{prompt: a, output: {{K: {{type: int}}}}, {ART}}}\n"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        sop.file = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        sop.output_schemas["A"] = None  # type: ignore[index]
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        sop.spec.actions["A"].max_retries = 5  # type: ignore[misc]
    assert sop.output_schemas["A"]["properties"]["K"] == {"type": "integer"}


def test_templates_cannot_load_files() -> None:
    assert _codes(_sop(f"  A: {{prompt: \"{{% include '/etc/passwd' %}}\", {ART}}}\n")) == ["SOP401"]
    assert _codes(_sop(f"  A: {{prompt: \"{{% extends 'x' %}}\", {ART}}}\n")) == ["SOP401"]


@pytest.mark.parametrize("template", [
    "{% macro m(a, b=1) %}{{ a }}{{ b }}{% endmacro %}{{ m(1) }}",
    "{% set ns = namespace(a=1) %}{% set ns.a = 2 %}{{ ns.a }}",
    "{% with x = 1 %}{{ x }}{% endwith %}{% set y %}hi{% endset %}{{ y }}",
    "{% for k, v in inputs.items() %}{{ k }}={{ v }} {{ loop.index }}{% endfor %}",
])
def test_names_a_template_binds_itself(template: str) -> None:
    assert _codes(_sop(f'  A: {{prompt: "{template}", {ART}}}\n')) == []


def test_the_checker_knows_the_fields_a_run_gives_its_templates() -> None:
    from types import SimpleNamespace

    from engine.compile.compiler import compile_text
    from engine.check.template_rules import MESSAGE_FIELDS, VARIABLE_FIELDS
    from engine.run.actions import template_variables
    from engine.run.memory import Memory
    from engine.run.message import user_requirement

    run = SimpleNamespace(compiled=compile_text(_sop(f"  A: {{prompt: x, {ART}}}\n")), inputs={}, run_id="r",
                          role_states={}, shared=None)
    variables = template_variables(run, "R", Memory(), [user_requirement("idea")], 1)  # type: ignore[arg-type]
    for name, fields in VARIABLE_FIELDS.items():
        assert set(variables[name]) - {"vars"} == fields - {"vars"}  # role.vars: from role variables
    assert set(variables["news"][0]) == MESSAGE_FIELDS


def test_a_for_each_or_when_written_as_a_block_is_refused_before_the_run() -> None:
    """The run reads them as one expression; a {% %} block used to pass validate, then fail."""
    text = _sop(f"  A: {{prompt: x, when: \"{{% if true %}}yes{{% endif %}}\", {ART}}}\n")
    (diag,) = check_text(text).diagnostics
    assert (diag.code, diag.pointer) == ("SOP401", "/actions/A/when")
    assert "one expression" in diag.hint and "no {% %} blocks" in diag.hint
    assert _codes(_sop(f"  A: {{prompt: x, when: \"{{{{ 1 > 0 }}}}\", {ART}}}\n")) == []
    assert _codes(_sop(f"  A: {{prompt: x, when: \"1 > 0\", {ART}}}\n")) == []


def test_a_join_path_outside_the_workspace_is_named_as_the_join_path() -> None:
    """SOP405 names what it checks: a `join.path` is not called an artifact path; a backslash
    inside a tag is the template's (checked when rendered), outside one the path's."""
    actions = ("  A:\n    prompt: hi\n    for_each: \"{{ ['x', 'y'] }}\"\n    join: {path: \"%s\"}\n")
    (found,) = [d for d in check_text(_sop(actions % "../out.md")).diagnostics if d.code == "SOP405"]
    assert found.message.startswith("join path '../out.md' leaves the workspace")
    assert "artifact" not in found.message
    assert "SOP405" not in _codes(_sop(actions % "{{ 'a\\\\nb' | replace('\\\\n', '') }}.md"))
    assert "SOP405" in _codes(_sop(actions % "docs\\\\\\\\out.md"))
