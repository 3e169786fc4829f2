"""The compiler decides once (engine/compile/plan.py): what a run needs is on the CompiledSop,
worked out when the file compiled, and the run reads it there: the flags its tools need,
MCP servers and hosts, expanded tools, routes, experience, and its compiled templates."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from engine import api
from engine.compile import compiler
from engine.compile.compiler import check_text, compile_path, compile_text
from engine.errors import RunError
from engine.templates import code
from engine.templates.render import compile_expression
from engine.testing import ScriptedModel

from run_helpers import run_sop

TOOLS = """\
apiVersion: sop/v1
name: tools
inputs:
  idea: {type: str, required: true}
mcp:
  notes: {command: [python, notes.py]}
  web: {url: "https://tools.example.com/mcp"}
actions:
  Build:
    prompt: "Build {{ inputs.idea }}"
    tools: [editor, terminal, mcp.notes.search, mcp.web]
    output: text
  Tell:
    prompt: "Tell the team"
    tools: [team]
    output: text
  Check:
    prompt: "Check it"
    output: text
  Unused:
    prompt: "never run"
    tools: [mcp.notes]
    output: text
roles:
  Builder:
    profile: builder
    vars: {reviewer: Checker}
    actions: [Build, Tell]
    watch: [UserRequirement]
  Checker:
    profile: checker
    actions: [Check]
    watch: [Build]
"""

ROUTED = """\
apiVersion: sop/v1
name: routed
inputs:
  idea: {type: str, required: true}
actions:
  Write:
    prompt: "Write {{ inputs.idea }}"
    output: text
    send_to: ["{{ role.vars.next }}"]
  Read:
    prompt: "Read {{ msgs | length }}"
    output: text
roles:
  First:
    profile: first
    vars: {next: Second}
    actions: [Write]
    watch: [UserRequirement]
  Second:
    profile: second
    actions: [Read]
    watch: [Write]
"""


def test_the_flags_tools_need_are_worked_out_when_the_file_compiles() -> None:
    plan = compile_text(TOOLS).plan
    assert plan.flags == {"--allow-exec": ("terminal (Build)", "mcp server notes"),
                          "--allow-host": ("tools.example.com (mcp server web)",)}
    assert plan.replay_flags == {}    # a replay runs no tool and starts no MCP server (their lists are journaled)
    assert plan.mcp_hosts == {"web": "tools.example.com"}
    assert plan.servers == {"notes": frozenset({"search"}), "web": None}   # Unused runs nowhere


def test_each_tool_using_action_has_its_tools_expanded_and_its_team_targets() -> None:
    plan = compile_text(TOOLS).plan
    build = plan.tools["Build"]
    assert [c.name for c in build.commands][:2] == ["editor.write", "editor.read"]
    assert "terminal.run" in [c.name for c in build.commands]
    assert dict(build.servers) == {"notes": ("search",), "web": None}
    assert plan.team_targets == {"Builder": ("Checker",)}   # only roles that run a team tool


def test_the_run_refuses_on_the_compiled_flags_before_anything_starts(tmp_path: Path) -> None:
    compiled = compile_text(TOOLS)
    with pytest.raises(RunError, match=r"need --allow-exec: terminal \(Build\), mcp server notes"):
        api.prepare(compiled, {"idea": "x"}, api.RunOptions(model="fake", workspace=tmp_path / "ws"))
    assert not (tmp_path / "ws").exists()


def test_each_role_s_routes_are_rendered_when_the_file_compiles(tmp_path: Path) -> None:
    compiled = compile_text(ROUTED)
    assert compiled.plan.routes[("Write", "First")].send_to == ("Second",)
    assert compiled.plan.idea_addresses == ("First", "Second", "<all>")
    result = run_sop(compiled, ScriptedModel(["written", "read"]), tmp_path / "ws")
    assert result.status == "idle", result.error
    assert [sorted(m["send_to"]) for m in result.history][1] == ["Second"]


def test_experience_is_read_when_the_file_compiles_and_a_change_compiles_it_again(tmp_path: Path) -> None:
    (tmp_path / "exp.md").write_text("Do it in one go.\n")
    sop = tmp_path / "e.sop.yaml"
    sop.write_text(ROUTED.replace('    output: text\n    send_to', '    tools: [editor]\n'
                                  '    experience: [exp.md, missing.md]\n    output: text\n    send_to', 1))
    first = compile_path(sop)
    [found, missing] = first.plan.tools["Write"].experience
    assert found.text == "Do it in one go." and not found.error
    assert missing.error.startswith("cannot read experience file 'missing.md'")
    assert compile_path(sop) is first                      # unchanged: not compiled again
    (tmp_path / "exp.md").write_text("Now in two steps.\n")
    assert compile_path(sop).plan.tools["Write"].experience[0].text == "Now in two steps."


def test_validate_checks_without_compiling_templates_and_a_run_compiles_them_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOPCTL_CACHE_DIR", str(tmp_path / "cache"))
    compiler._CHECKED.clear()
    sop = tmp_path / "r.sop.yaml"
    sop.write_text(ROUTED)
    checked = compiler.check_path(sop).compiled
    assert checked is not None and checked.templates is None
    compiled = compile_path(sop)
    assert set(compiled.templates or {}) == {("template", "Write {{ inputs.idea }}"),
                                             ("template", "Read {{ msgs | length }}")}
    pickle.dumps(compiled.plan)


def test_the_run_renders_the_code_its_sop_was_compiled_to(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    compiled = compile_text(ROUTED.replace("Write {{", "Write now {{"))
    code.template.cache_clear()           # as a new process that loaded it from disk
    compile_expression.cache_clear()
    code.expression.cache_clear()
    code._COMPILED.clear()

    def refuse(source: str) -> object:
        raise AssertionError(f"compiled {source!r} at run time")

    monkeypatch.setitem(code._COMPILERS, "template", refuse)
    monkeypatch.setattr(code, "_compile_template", refuse)
    monkeypatch.setenv("SOPCTL_NO_CACHE", "1")
    result = run_sop(compiled, ScriptedModel(["written", "read"]), tmp_path / "ws")
    assert result.status == "idle", result.error


def test_a_sop_only_checked_still_runs_its_templates_compiled_on_the_way(tmp_path: Path) -> None:
    checked = check_text(ROUTED).compiled
    assert checked is not None and checked.templates is None
    assert checked.plan.templates == ("Write {{ inputs.idea }}", "Read {{ msgs | length }}")
    assert run_sop(checked, ScriptedModel(["written", "read"]), tmp_path / "ws").status == "idle"


LAYERED = """\
apiVersion: sop/v1
name: layered
llm: {model: fake, temperature: 0.1, max_tokens: 100}
actions:
  Draft: {prompt: d, llm: {temperature: 0.9}}
  Check: {prompt: c}
roles:
  Writer: {actions: [Draft, Check], react_mode: by_order, watch: [UserRequirement], llm: {max_tokens: 50}}
  Reader: {actions: [Check], watch: [Draft]}
"""


def test_each_role_s_actions_carry_their_declared_llm_settings_nearest_layer_first() -> None:
    plan = compile_text(LAYERED).plan
    draft, writer_check, reader_check = (plan.llm[("Writer", "Draft")], plan.llm[("Writer", "Check")],
                                         plan.llm[("Reader", "Check")])
    assert (draft.model, draft.temperature, draft.max_tokens) == ("fake", 0.9, 50)   # action > role > file
    assert (writer_check.temperature, writer_check.max_tokens) == (0.1, 50)
    assert (reader_check.temperature, reader_check.max_tokens) == (0.1, 100)
    assert ("Reader", "Draft") not in plan.llm                                         # a role runs only its own


def test_the_command_line_model_still_wins_over_what_the_file_declares() -> None:
    from engine.models.registry import resolve_llm

    compiled = compile_text(LAYERED)
    assert resolve_llm(compiled, "Writer", "Draft", None)["model"] == "fake"
    assert resolve_llm(compiled, "Writer", "Draft", "openai/gpt-4o-mini")["model"] == "openai/gpt-4o-mini"
