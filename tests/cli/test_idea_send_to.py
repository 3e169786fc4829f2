"""The idea addressed to named roles (`team.send_to`, `sopctl run --send-to`), as MetaGPT's
`run_project(idea, send_to="Biden")`: checked by the validator, seen by the watch graph,
honoured by routing, kept by resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine import api
from engine.compile.compiler import check_text, compile_text
from engine.cli.commands import main
from engine.errors import UsageError

DEBATE = """\
apiVersion: sop/v1
name: debate
team: {send_to: [Biden]}
actions:
  Speak:
    prompt: "Answer: {{ news[-1].content }}"
    max_runs: 2
    artifacts: [{path: "s{{ run.round }}.md", content: "{{ out }}"}]
roles:
  Biden: {name: Joe, actions: [Speak], watch: [Speak]}
  Trump: {actions: [Speak], watch: [Speak]}
"""


def _found(text: str) -> list[tuple[str, str, str]]:
    return [(d.code, d.pointer, d.hint) for d in check_text(text).diagnostics]


def test_the_idea_addressed_to_a_role_reaches_it_without_a_watch() -> None:
    assert _found(DEBATE) == []
    assert [c for c, _, _ in _found(DEBATE.replace("team: {send_to: [Biden]}\n", ""))] == ["SOP302", "SOP302"]


def test_an_unknown_idea_address_is_located_with_did_you_mean() -> None:
    (diag,) = check_text(DEBATE.replace("[Biden]", "[Bidn]")).diagnostics
    assert (diag.code, diag.pointer, diag.line, diag.hint) == ("SOP203", "/team/send_to/0", 3, "did you mean 'Biden'?")
    assert _found(DEBATE.replace("[Biden]", "['<self>']"))[0][:2] == ("SOP203", "/team/send_to/0")


def test_a_role_watching_the_idea_it_is_never_sent_is_warned() -> None:
    text = DEBATE.replace("Trump: {actions: [Speak], watch: [Speak]}",
                          "Trump: {actions: [Speak], watch: [Speak, UserRequirement]}")
    assert ("SOP304", "/roles/Trump/watch/1", "add 'Trump' or <all> to team.send_to") in _found(text)


def test_reading_an_idea_a_role_is_never_sent_is_warned() -> None:
    text = DEBATE.replace("Answer: {{ news[-1].content }}", "Answer: {{ msgs.UserRequirement[0].content }}")
    found = _found(text)
    hint = ("add 'Trump' or <all> to team.send_to, or test it first: "   # Speak is shared: Biden receives it
            "{{ msgs.UserRequirement[-1].content if msgs.UserRequirement else '' }}")
    assert ("SOP408", "/actions/Speak/prompt", hint) in found
    assert [c for c, _, _ in found] == ["SOP408"]


def test_the_idea_goes_only_to_the_addressed_role(tmp_path: Path) -> None:
    compiled = compile_text(DEBATE)
    result = api.run(compiled, {"idea": "cars"}, api.RunOptions(model="fake", workspace=tmp_path / "a"))
    assert [(m.sent_from, sorted(m.send_to)) for m in result.messages[:2]] == [("Human", ["Biden"]),
                                                                              ("Biden", ["<all>"])]
    other = api.run(compiled, {"idea": "cars"}, api.RunOptions(model="fake", workspace=tmp_path / "b", send_to=["Trump"]))
    assert [m.sent_from for m in other.messages[:3]] == ["Human", "Trump", "Biden"]
    by_name = api.run(compiled, {"idea": "cars"}, api.RunOptions(model="fake", workspace=tmp_path / "d", send_to=["Joe"]))
    assert [m.sent_from for m in by_name.messages[:2]] == ["Human", "Biden"]
    with pytest.raises(UsageError, match="did you mean 'Trump'"):
        api.run(compiled, {"idea": "cars"}, api.RunOptions(model="fake", workspace=tmp_path / "c", send_to=["Trmp"]))


def test_cli_send_to_is_kept_by_resume_and_replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "debate.sop.yaml"
    path.write_text(DEBATE, encoding="utf-8")
    run_dir = tmp_path / "run"
    assert main(["run", str(path), "--idea", "cars", "--model", "fake", "--send-to", "Trump",
                 "--out", str(run_dir), "--format", "json"]) == 0
    first = json.loads(capsys.readouterr().out)["history"]
    assert first[1]["sent_from"] == "Trump"
    assert main(["replay", str(run_dir), "--out", str(tmp_path / "again"), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["history"] == first  # no divergence: the idea went to Trump
    assert main(["resume", str(run_dir), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["history"] == first
    assert main(["run", str(path), "--idea", "cars", "--model", "fake", "--send-to", "Nobody",
                 "--out", str(tmp_path / "bad")]) == 2
    assert "--send-to: unknown address 'Nobody'" in capsys.readouterr().err
