"""Routing, filter by filter: the environment's delivery (1) and the role's observe (2)."""

from __future__ import annotations

from pathlib import Path

import pytest
from run_helpers import sop_text

from engine.run.message import ALL, NONE, Message
from engine.run.team import RunOptions, Team

SOP = """
apiVersion: sop/v1
name: routing
inputs: {idea: {type: str}}
actions:
  A: {prompt: a, output: text}
  B: {prompt: b, output: text}
  C: {prompt: c, output: text, max_runs: 2}
roles:
  Alpha: {name: Alice, actions: [A], watch: [UserRequirement]}
  Beta: {name: Bob, actions: [B], watch: [A]}
  Gamma: {actions: [C], watch: [C], memory: false}
  Delta: {actions: [C], watch: [UserRequirement]}
"""


@pytest.fixture()
def team(tmp_path: Path) -> Team:
    return Team(sop_text(SOP), {"idea": "x"},
                RunOptions(workspace=tmp_path / "ws"))


def _msg(i: int, cause_by: str, send_to: set[str], sent_from: str = "Alpha") -> Message:
    return Message(id=f"m{i}", content=f"c{i}", cause_by=cause_by, sent_from=sent_from,
                   send_to=frozenset(send_to), round=1)


def _roles(team: Team) -> dict[str, object]:
    return {r.id: r for r in team.roles}


def test_all_reaches_every_inbox(team: Team) -> None:
    reached = team.env.publish(_msg(1, "A", {ALL}))
    assert reached == ["Alpha", "Beta", "Gamma", "Delta"]
    assert all(len(r.inbox) == 1 for r in team.roles)


def test_none_reaches_nobody_but_is_recorded(team: Team) -> None:
    assert team.env.publish(_msg(1, "A", {NONE})) == []
    assert [m.id for m in team.env.history] == ["m1"]


def test_address_by_id_or_by_name(team: Team) -> None:
    assert team.env.publish(_msg(1, "Z", {"Bob"})) == ["Beta"]
    assert team.env.publish(_msg(2, "Z", {"Beta"})) == ["Beta"]
    assert team.env.publish(_msg(3, "Z", {"Alice", "Gamma"})) == ["Alpha", "Gamma"]


def test_recipients_come_in_file_order_once_each_and_unknown_addresses_reach_nobody(team: Team) -> None:
    assert team.env.publish(_msg(1, "Z", {"Gamma", "Alice", "Alpha", "Nobody"})) == ["Alpha", "Gamma"]
    assert team.env.publish(_msg(2, "Z", {"Nobody"})) == []
    assert [len(r.inbox) for r in team.roles] == [1, 0, 1, 0]


def test_observe_keeps_watched_messages(team: Team) -> None:
    beta = _roles(team)["Beta"]
    team.env.publish(_msg(1, "A", {ALL}))
    team.env.publish(_msg(2, "C", {ALL}))
    assert [m.id for m in beta.observe()] == ["m1"]


def test_observe_keeps_messages_addressed_to_the_role_even_unwatched(team: Team) -> None:
    beta = _roles(team)["Beta"]
    team.env.publish(_msg(1, "C", {"Bob"}))
    team.env.publish(_msg(2, "C", {"Beta"}))
    assert [m.id for m in beta.observe()] == ["m1", "m2"]


def test_all_alone_does_not_make_a_message_news(team: Team) -> None:
    """`<all>` is filter 1 only: filter 2 needs a watch or a name in send_to."""
    alpha = _roles(team)["Alpha"]
    team.env.publish(_msg(1, "B", {ALL}))
    assert alpha.is_idle()
    assert alpha.observe() == []


def test_unwatched_deliveries_are_remembered_but_are_not_news(team: Team) -> None:
    beta = _roles(team)["Beta"]
    team.env.publish(_msg(1, "C", {ALL}))
    team.env.publish(_msg(2, "A", {ALL}))
    assert [m.id for m in beta.observe()] == ["m2"]
    assert [m.id for m in beta.memory.get()] == ["m1", "m2"]


def test_memory_on_drops_a_message_already_remembered(team: Team) -> None:
    beta = _roles(team)["Beta"]
    team.env.publish(_msg(1, "A", {ALL}))
    assert len(beta.observe()) == 1
    team.env.publish(_msg(1, "A", {ALL}))  # the same message again
    assert beta.is_idle()
    assert beta.observe() == []


def test_memory_off_reprocesses_a_resent_message(team: Team) -> None:
    gamma = _roles(team)["Gamma"]
    team.env.publish(_msg(1, "C", {ALL}))
    assert len(gamma.observe()) == 1
    team.env.publish(_msg(1, "C", {ALL}))
    assert not gamma.is_idle()
    assert len(gamma.observe()) == 1
    assert len(gamma.memory) == 1  # still one copy in memory


def test_a_message_twice_in_one_inbox_is_news_once(team: Team) -> None:
    gamma = _roles(team)["Gamma"]
    team.env.publish(_msg(1, "C", {ALL}))
    team.env.publish(_msg(1, "C", {ALL}))
    assert len(gamma.observe()) == 1


def test_a_role_without_watch_keeps_only_what_is_addressed_to_it(tmp_path: Path) -> None:
    text = SOP.replace("Delta: {actions: [C], watch: [UserRequirement]}", "Delta: {actions: [C]}")
    team = Team(sop_text(text), {"idea": "x"},
                RunOptions(workspace=tmp_path / "ws"))
    delta = _roles(team)["Delta"]
    assert delta.watch == set()
    team.env.publish(_msg(1, "UserRequirement", {ALL}))
    assert delta.is_idle()
    team.env.publish(_msg(2, "A", {"Delta"}))
    assert [m.id for m in delta.observe()] == ["m2"]


def test_idle_is_decided_by_what_the_role_would_keep(team: Team) -> None:
    """No extra non-idle round (MetaGPT quirk fixed): an inbox of unwanted mail is idle."""
    beta = _roles(team)["Beta"]
    assert beta.is_idle()
    team.env.publish(_msg(1, "C", {ALL}))
    assert beta.is_idle()
    team.env.publish(_msg(2, "A", {ALL}))
    assert not beta.is_idle()
    beta.observe()
    assert beta.is_idle()


def test_self_addressed_message_is_routed_back_to_the_sender(tmp_path: Path) -> None:
    text = SOP.replace("output: text, max_runs: 2}", 'output: text, max_runs: 2, send_to: ["<self>"]}')
    team = Team(sop_text(text), {"idea": "x"},
                RunOptions(workspace=tmp_path / "ws"))
    gamma = _roles(team)["Gamma"]
    message = gamma._make_message("C", "hi", "hi")
    assert message.send_to == {"Gamma"}
    assert team.env.publish(message) == ["Gamma"]
