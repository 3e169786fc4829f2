"""Shared state, computed messages, message shape and direct tool calls at run time
(docs/state.md): `state:` and `set:`, `kind: compute`, `content:`, the sender's name and
profile in templates, `kind: tool`, for_each over a mapping, `team.max_rounds` as a loop's
bound, and a run that starts by asking a person. Resume and replay restore the state."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine import api
from engine.compile.compiler import check_text
from engine.errors import RunError
from engine.journal.store import Journal
from engine.models.types import CallSpec
from engine.run.people import PersonAnswer
from engine.run.events import RunLog
from engine.testing import ScriptedModel, ScriptedPerson, use_model

from run_helpers import ROOT

DAYS = """\
apiVersion: sop/v1
name: days
state:
  day: {type: int, default: 1}
  said: {type: list}
team: {max_rounds: 12}
actions:
  Dawn:
    kind: compute
    when: "state.day <= 3"
    content: "Day {{ state.day }} begins"
    set: {day: "state.day + 1"}
  Speak:
    prompt: "It is day {{ state.day }}; {{ news[0].sent_from_name }} ({{ news[0].sent_from_profile }}) said: {{ news[0].content }}"
    output:
      Line: {type: str, instruction: what you say}
      Mood: {type: str, instruction: how you feel}
    content: "{{ out.Line }}"
    set: {said: "state.said + [out.Line]"}
roles:
  Moderator:
    name: Mo
    profile: Moderator
    watch: [UserRequirement, Speak]
    actions: [Dawn]
  Player:
    watch: [Dawn]
    actions: [Speak]
"""


def _sop(tmp_path: Path, text: str, name: str = "s.sop.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _run(path: Path, workspace: Path, model: Any = None, person: Any = None, inputs: Any = None,
         **options: Any) -> Any:
    with use_model(model or ScriptedModel(lambda spec, attempt: '{"Line": "hello", "Mood": "calm"}')):
        return api.run(api.load(path), inputs or {}, api.RunOptions(workspace=workspace, person=person, **options))


def test_state_goes_round_the_cycles_and_ends_the_run(tmp_path: Path) -> None:
    prompts: list[str] = []

    def model(spec: CallSpec, attempt: int) -> str:
        prompts.append(spec.prompt)
        return f"{{\"Line\": \"line {len(prompts)}\", \"Mood\": \"calm\"}}"
    result = _run(_sop(tmp_path, DAYS), tmp_path / "ws", ScriptedModel(model))
    assert result.status == "idle", result.error
    dawns = [m.content for m in result.messages if m.cause_by == "Dawn"]
    assert dawns == ["Day 1 begins", "Day 2 begins", "Day 3 begins"]
    assert result.state == {"day": 4, "said": ["line 1", "line 2", "line 3"]}
    # the player sees the moderator's change from the next round, and the sender by name and profile
    assert prompts[0].startswith("It is day 2; Mo (Moderator) said: Day 1 begins")
    assert result.llm_calls == 3   # a compute action calls no model


def test_content_publishes_one_field_and_out_stays_whole(tmp_path: Path) -> None:
    result = _run(_sop(tmp_path, DAYS), tmp_path / "ws")
    spoken = [m for m in result.messages if m.cause_by == "Speak"]
    assert spoken[0].content == "hello" and spoken[0].out == {"Line": "hello", "Mood": "calm"}


def test_a_role_sees_its_own_change_at_once_and_others_next_round(tmp_path: Path) -> None:
    text = """\
apiVersion: sop/v1
name: own
state:
  n: {type: int}
actions:
  Bump: {kind: compute, content: "bumped", set: {n: "state.n + 1"}}
  Look: {kind: compute, content: "n={{ state.n }}"}
  Peek: {kind: compute, content: "peer n={{ state.n }}"}
roles:
  A: {watch: [UserRequirement], actions: [Bump, Look], react_mode: by_order}
  B: {watch: [UserRequirement, Look], actions: [Peek], memory: false}
"""
    result = _run(_sop(tmp_path, text), tmp_path / "ws")
    assert result.status == "idle", result.error
    contents = [(m.cause_by, m.content) for m in result.messages]
    assert ("Look", "n=1") in contents
    assert [c for a, c in contents if a == "Peek"] == ["peer n=0", "peer n=1"]


def test_a_value_of_the_wrong_type_fails_the_action_where_it_is_set(tmp_path: Path) -> None:
    text = DAYS.replace('set: {day: "state.day + 1"}', 'set: {day: "state.day ~ \'!\'"}')
    assert check_text(text).ok   # not a constant: only the run can tell
    result = _run(_sop(tmp_path, text), tmp_path / "ws")
    assert result.status == "failed"
    assert "state.day is of type int, the expression gave str" in result.error
    assert result.diagnostic is not None and result.diagnostic.pointer == "/actions/Dawn/set/day"


ASKED = DAYS.replace("""  Speak:
    prompt:""", """  Speak:
    kind: ask
    max_runs: 2
    prompt:""")


def test_resume_restores_the_state_the_reused_actions_set(tmp_path: Path) -> None:
    path = _sop(tmp_path, ASKED)
    ws = tmp_path / "ws"
    first = _run(path, ws)
    assert first.status == "waiting" and "It is day 2" in first.waiting_for.prompt
    api.answer(ws, PersonAnswer("answer", {"Line": "one", "Mood": "calm"}), question_id=first.waiting_for.id)
    second = api.resume(ws)
    # day 3 in the question: the resumed run took Dawn's change from the journal
    assert second.status == "waiting" and "It is day 3" in second.waiting_for.prompt
    api.answer(ws, PersonAnswer("answer", {"Line": "two", "Mood": "calm"}), question_id=second.waiting_for.id)
    done = api.resume(ws)
    assert done.status == "idle", done.error
    assert done.state == {"day": 4, "said": ["one", "two"]}
    with Journal.open(ws) as journal:
        shared = [e.data.get("shared") for e in journal.events() if e.type == "ActionCompleted"]
    assert {"day": 2} in shared and {"said": ["one"]} in shared
    replayed = api.replay(ws, tmp_path / "again")
    assert not replayed.diverged and replayed.result.state == done.state


def test_for_each_over_a_mapping_gives_key_value_items(tmp_path: Path) -> None:
    text = """\
apiVersion: sop/v1
name: pairs
state:
  roles: {type: dict, default: {Ann: wolf, Bob: seer}}
actions:
  Tell:
    kind: compute
    for_each: "state.roles"
    content: "{{ item.key }} is the {{ item.value }}"
roles:
  Moderator: {watch: [UserRequirement], actions: [Tell]}
"""
    result = _run(_sop(tmp_path, text), tmp_path / "ws")
    assert result.messages[-1].content == "Ann is the wolf\n\nBob is the seer"
    pairs = text.replace('for_each: "state.roles"', 'for_each: "state.roles.items()"').replace(
        "{{ item.key }} is the {{ item.value }}", "{{ item[0] }}: {{ item[1] }}")
    result = _run(_sop(tmp_path, pairs, "p.sop.yaml"), tmp_path / "ws2")   # pairs (tuples) become lists
    assert result.status == "idle", result.error
    assert result.messages[-1].content == "Ann: wolf\n\nBob: seer"


TOOLS = """\
apiVersion: sop/v1
name: direct
inputs:
  idea: {type: str, default: tea}
actions:
  Save:
    kind: tool
    tool: editor.write
    args: {path: "notes/{{ inputs.idea }}.md", content: "# {{ inputs.idea }}"}
  Read:
    kind: tool
    tool: editor.read
    args: {path: "notes/{{ inputs.idea }}.md", start: "{{ 1 }}"}
    content: "read: {{ out }}"
    publish: each
  Confirm:
    kind: ask
    prompt: "Saved {{ msgs.Read[-1].content }}; fine?"
roles:
  Clerk:
    watch: [UserRequirement]
    actions: [Save, Read, Confirm]
    react_mode: by_order
"""


def test_a_tool_action_calls_the_tool_with_rendered_args_and_no_model(tmp_path: Path) -> None:
    result = _run(_sop(tmp_path, TOOLS), tmp_path / "ws", ScriptedModel([]), ScriptedPerson(["yes"]))
    assert result.status == "idle", result.error
    assert (tmp_path / "ws" / "notes" / "tea.md").read_text() == "# tea"
    assert "notes/tea.md" in result.artifacts
    read = next(m for m in result.messages if m.cause_by == "Read")
    assert read.content.startswith("read: ") and "# tea" in read.content
    assert result.llm_calls == 0


def test_a_tool_actions_result_is_journaled_and_reused_on_resume(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    first = _run(_sop(tmp_path, TOOLS), ws, ScriptedModel([]))
    assert first.status == "waiting"
    (ws / "notes" / "tea.md").write_text("changed")   # a reused write puts the file back
    api.answer(ws, PersonAnswer("answer", "yes"), question_id=first.waiting_for.id)
    done = api.resume(ws)
    assert done.status == "idle"
    assert (ws / "notes" / "tea.md").read_text() == "# tea"
    with Journal.open(ws) as journal:
        calls = [e.data for e in journal.events() if e.type == "ToolCalled"]
    # the changed file made Save run again: its write came from the journal (and was put back); Read was reused
    assert [(c["tool"], c["reused"]) for c in calls] == [("editor.write", False), ("editor.read", False),
                                                         ("editor.write", True)]
    replayed = api.replay(ws, tmp_path / "again")
    assert not replayed.diverged and replayed.result.status == "idle"


def test_a_tool_action_is_gated_like_the_tool_in_a_loop(tmp_path: Path) -> None:
    text = TOOLS.replace("tool: editor.write\n    args: {path: \"notes/{{ inputs.idea }}.md\", content: \"# {{ inputs.idea }}\"}",
                         "tool: terminal.run\n    args: {command: \"echo hi\"}")
    path = _sop(tmp_path, text)
    with pytest.raises(RunError, match="--allow-exec"):
        api.prepare(api.load(path), {}, api.RunOptions(workspace=tmp_path / "ws"))


def test_a_tool_actions_args_are_checked_against_the_command_before_it_runs(tmp_path: Path) -> None:
    text = TOOLS.replace('start: "{{ 1 }}"', 'start: "{{ \'first\' }}"')
    result = _run(_sop(tmp_path, text), tmp_path / "ws", ScriptedModel([]), ScriptedPerson(["yes"]))
    assert result.status == "failed" and "do not match its schema" in result.error
    assert result.diagnostic is not None and result.diagnostic.pointer == "/actions/Read/args"


def test_a_failed_tool_call_fails_the_action_unless_it_continues(tmp_path: Path) -> None:
    text = TOOLS.replace('args: {path: "notes/{{ inputs.idea }}.md", start: "{{ 1 }}"}',
                         'args: {path: "missing.md"}')
    failed = _run(_sop(tmp_path, text), tmp_path / "ws", ScriptedModel([]), ScriptedPerson(["yes"]))
    assert failed.status == "failed" and "editor.read failed" in failed.error
    going = _run(_sop(tmp_path, text.replace("tool: editor.read", "tool: editor.read\n    on_error: continue"),
                      "t.sop.yaml"), tmp_path / "ws2", ScriptedModel([]), ScriptedPerson(["yes"]))
    assert going.status == "idle"
    read = next(m for m in going.messages if m.cause_by == "Read")
    assert isinstance(read.out, dict) and "error" in read.out


def test_team_max_rounds_written_in_the_file_bounds_a_loop(tmp_path: Path) -> None:
    text = """\
apiVersion: sop/v1
name: pingpong
team: {max_rounds: 4}
actions:
  Ping: {kind: compute, content: ping}
  Pong: {kind: compute, content: pong}
roles:
  A: {watch: [UserRequirement, Pong], actions: [Ping]}
  B: {watch: [Ping], actions: [Pong]}
"""
    assert check_text(text).ok
    unbounded = check_text(text.replace("team: {max_rounds: 4}\n", ""))
    assert [d.code for d in unbounded.diagnostics] == ["SOP301"]
    assert "team.max_rounds" in unbounded.diagnostics[0].hint
    result = _run(_sop(tmp_path, text), tmp_path / "ws")
    assert result.status == "max_rounds" and result.rounds == 4


def test_a_run_can_start_by_asking_a_person_without_an_idea(tmp_path: Path) -> None:
    text = """\
apiVersion: sop/v1
name: intake
state:
  topic: {type: str}
actions:
  AskTopic:
    kind: ask
    prompt: What should the poem be about?
    output: {Topic: {type: str, instruction: the topic}}
    set: {topic: "out.Topic"}
  Poem:
    prompt: "Write a poem about {{ state.topic }}."
    context: none
roles:
  Host: {watch: [UserRequirement], actions: [AskTopic]}
  Poet: {watch: [AskTopic], actions: [Poem]}
"""
    asked: list[str] = []

    def model(spec: CallSpec, attempt: int) -> str:
        asked.append(spec.prompt)
        return "a poem"
    questions: list[str] = []

    def person(question: Any) -> Any:
        questions.append(question.prompt)
        return {"Topic": "rain"}
    result = _run(_sop(tmp_path, text), tmp_path / "ws", ScriptedModel(model), ScriptedPerson(person))
    assert result.status == "idle", result.error
    assert questions == ["What should the poem be about?"]   # no empty idea shown as its context
    assert asked == ["Write a poem about rain."]


def _werewolf_players(wolves_seen: list[str]) -> Any:
    """Scripted players who play well whatever the hand: the wolves kill the first living
    villager named, the seer checks the first player named, everyone votes for a wolf (known
    from the wolves' prompt, which comes first: the seer checks while the wolves pick)."""
    def model(spec: CallSpec, attempt: int) -> str:
        alive = spec.prompt.split("Still in the game: ")[-1].split(".")[0].split(", ")
        if spec.action == "WolfKill":
            pack = spec.prompt.split("Your pack: ")[1].split(".")[0].split(", ")
            wolves_seen[:] = pack
            return json.dumps({"Target": next(p for p in alive if p not in pack), "Reason": "r"})
        if spec.action == "SeerCheck":
            return json.dumps({"Target": alive[0]})
        if spec.action == "Vote":
            living = spec.prompt.split("exile (")[1].split(")")[0].split(", ")
            return json.dumps({"Target": next(w for w in wolves_seen if w in living), "Reason": "r"})
        return '{"Speech": "I suspect someone."}'
    return model


def test_the_werewolf_example_deals_a_shuffled_hand_and_plays_its_rules_to_a_winner(tmp_path: Path) -> None:
    """The hand is the run's (a seeded shuffle): the same run id deals the same hand, other
    ids other hands; scripted players then kill two villagers and exile both wolves."""
    hands = []
    for n, run_id in enumerate(["hand-a", "hand-b", "hand-c", "hand-a"]):
        wolves_seen: list[str] = []
        result = _run(ROOT / "examples" / "werewolf.sop.yaml", tmp_path / f"ws{n}",
                      ScriptedModel(_werewolf_players(wolves_seen)), run_id=run_id)
        assert result.status == "idle", result.error
        roles, wolves = result.state["roles"], result.state["wolves"]
        assert sorted(roles.values()) == ["seer", "villager", "villager", "villager", "werewolf", "werewolf"]
        assert wolves == [p for p, identity in roles.items() if identity == "werewolf"] == wolves_seen
        assert result.state["winner"] == "villagers"
        fallen = result.state["fallen"]
        assert len(fallen) == 4 and [p for p in fallen if p in wolves] == wolves
        assert len(result.state["checked"]) == 2
        assert all(roles[p] == identity for p, identity in result.state["checked"].items())
        last = result.messages[-1]
        assert last.cause_by == "GameOver" and "the villagers found every werewolf" in last.content
        assert any(m.cause_by == "Night" and f"The village exiled {wolves[0]}, who was a werewolf" in m.content
                   for m in result.messages)
        hands.append(roles)
    assert hands[0] == hands[3] and len({str(h) for h in hands}) > 1


class _Logs:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def on_event(self, event: Any) -> None:
        if isinstance(event, RunLog):
            self.lines.append(event.message)


def test_a_fake_plan_and_act_run_warns_of_no_unknown_dependency(tmp_path: Path) -> None:
    """Issue 25's bug: every fake plan_and_act run warned of an unknown dependent task (the
    fake model invented the ids; it leaves a list of ids empty now)."""
    logs = _Logs()
    result = api.run(api.load(ROOT / "examples" / "data_analysis.sop.yaml"), {"idea": "which weekday?"},
                     api.RunOptions(workspace=tmp_path / "ws", model="fake", observers=[logs]))
    assert result.status == "idle", result.error
    assert not [line for line in logs.lines if "depends on unknown task" in line]


def test_content_can_publish_an_execs_stdout(tmp_path: Path) -> None:
    text = """\
apiVersion: sop/v1
name: stdout
actions:
  Run:
    kind: exec
    command: [python, -c, "print('hello from exec')"]
    content: "{{ out.stdout }}"
roles:
  Runner: {watch: [UserRequirement], actions: [Run]}
"""
    result = _run(_sop(tmp_path, text), tmp_path / "ws", allow_exec=True)
    assert result.status == "idle", result.error
    assert result.messages[-1].content == "hello from exec" and result.messages[-1].out["exit_code"] == 0


def test_validate_names_what_a_tool_action_needs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from engine.cli.commands import main as sopctl   # the CLI, only for this test

    assert sopctl(["validate", str(ROOT / "examples" / "searcher.sop.yaml")]) == 0
    assert "needs --allow-exec: mcp server notes" in capsys.readouterr().out
    text = TOOLS.replace("tool: editor.write\n    args: {path: \"notes/{{ inputs.idea }}.md\", content: \"# {{ inputs.idea }}\"}",
                         "tool: terminal.run\n    args: {command: \"echo hi\"}")
    assert sopctl(["validate", str(_sop(tmp_path, text))]) == 0
    assert "needs --allow-exec: terminal (Save)" in capsys.readouterr().out


def test_a_plan_and_act_roles_templates_read_its_plan_and_each_tasks_status(tmp_path: Path) -> None:
    text = """\
apiVersion: sop/v1
name: planned
actions:
  Plan:
    prompt: Plan it.
    output:
      tasks:
        type: list
        children:
          task_id: {type: str}
          dependent_task_ids: {type: "list[str]"}
          instruction: {type: str}
  Do:
    context: none
    prompt: "Task {{ plan.current.task_id }}; finished: {{ plan.tasks | selectattr('is_finished') | map(attribute='task_id') | join(',') }}"
roles:
  Worker:
    watch: [UserRequirement]
    react_mode: plan_and_act
    planner: {action: Plan, task_action: Do}
    actions: [Plan, Do]
"""
    prompts: list[str] = []

    def model(spec: CallSpec, attempt: int) -> str:
        if spec.action == "Plan":
            return ('{"tasks": [{"task_id": "1", "dependent_task_ids": [], "instruction": "a"}, '
                    '{"task_id": "2", "dependent_task_ids": ["1"], "instruction": "b"}]}')
        prompts.append(spec.prompt)
        return "done"
    result = _run(_sop(tmp_path, text), tmp_path / "ws", ScriptedModel(model))
    assert result.status == "idle", result.error
    assert prompts == ["Task 1; finished:", "Task 2; finished: 1"]


ROUTED = """\
apiVersion: sop/v1
name: routed
state:
  turn: {type: str, default: Ann}
team: {max_rounds: 8}
actions:
  Call:
    kind: compute
    when: "news[0].cause_by in ['UserRequirement', 'Answer'] and (msgs.Answer | length) < 3"
    content: "your turn, {{ state.turn }}"
    send_to: ["{{ state.turn }}"]
    set: {turn: "'Ben' if state.turn == 'Ann' else 'Ann'"}
  Answer:
    kind: compute
    content: "{{ role.id }} answers"
    send_to: [Moderator]
roles:
  Moderator: {watch: [UserRequirement, Answer], actions: [Call]}
  Ann: {watch: [Call], actions: [Answer]}
  Ben: {watch: [Call], actions: [Answer]}
"""


def test_a_send_to_template_reads_the_state_when_the_action_publishes(tmp_path: Path) -> None:
    path = _sop(tmp_path, ROUTED)
    assert check_text(ROUTED, str(path)).diagnostics == ()   # `state` is a send_to template's variable
    result = _run(path, tmp_path / "ws")
    assert result.status == "idle", result.error
    calls = [(sorted(m.send_to), m.content) for m in result.messages if m.cause_by == "Call"]
    assert calls == [(["Ann"], "your turn, Ann"), (["Ben"], "your turn, Ben"), (["Ann"], "your turn, Ann")]
    assert [m.sent_from for m in result.messages if m.cause_by == "Answer"] == ["Ann", "Ben", "Ann"]


def test_a_send_to_template_reading_an_undeclared_state_variable_is_refused(tmp_path: Path) -> None:
    text = ROUTED.replace('send_to: ["{{ state.turn }}"]', 'send_to: ["{{ state.trun }}"]')
    assert [d.code for d in check_text(text, "s.sop.yaml").diagnostics] == ["SOP411"]


def test_a_send_to_template_giving_an_unknown_address_from_the_state_fails_located(tmp_path: Path) -> None:
    result = _run(_sop(tmp_path, ROUTED.replace("default: Ann}", "default: Zed}")), tmp_path / "ws")
    assert result.status == "failed"
    assert "s.sop.yaml:11:15: error[SOP203]" in str(result.error)   # located at the send_to item
    assert "unknown address 'Zed'" in str(result.error)
