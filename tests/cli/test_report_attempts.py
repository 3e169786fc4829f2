"""`sopctl report` of runs a person reads after the fact: a run that failed and was resumed
(its failed try, its error, the gap before the resume, its rejected answers counted once), a
run whose roles use tools (each command its own row), and what the page says and draws
(the models that answered, labelled timeline bars, a long graph wrapped to the page's width)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from engine.cli import html_report, report_svg
from engine.cli.commands import main
from engine.compile.compiler import check_path
from engine.journal.history import ActionRecord, Invocation, RunState, read_run
from engine.journal.store import Journal
from engine.models.types import Usage
from engine.run.events import RunStatus
from engine.testing import ScriptedModel, use_model

from run_helpers import ROOT

DECIDE = """
apiVersion: sop/v1
name: one_decision
actions:
  Decide:
    prompt: "Decide."
    context: none
    max_retries: 2
    output:
      Choice: {type: str, instruction: the decision}
roles:
  Chooser: {actions: [Decide], watch: [UserRequirement]}
"""

INVALID = "no json, sorry"


@pytest.fixture(scope="module")
def resumed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run whose one action got three invalid answers (failed), then resumed: the resume
    reuses the three, sends one more re-ask and gets a valid answer."""
    root = tmp_path_factory.mktemp("resumed")
    sop = root / "decide.sop.yaml"
    sop.write_text(DECIDE, encoding="utf-8")
    ws = root / "run"
    with use_model(ScriptedModel([INVALID] * 3 + ['{"Choice": "yes"}']), name="scripted"):
        assert main(["run", str(sop), "--idea", "x", "--model", "scripted", "--out", str(ws)]) == 1
        assert main(["resume", str(ws)]) == 0
    return ws


def test_the_failed_try_of_a_resumed_run_keeps_its_line_and_its_error(resumed: Path) -> None:
    state = read_run(resumed)
    assert state.status == "idle" and state.invocations == 2
    failed, done = state.timeline
    assert (failed.invocation, failed.completed, done.invocation, done.completed) == (1, False, 2, True)
    assert "no valid answer from model 'scripted' after 3 attempt(s)" in failed.error
    assert failed.stopped_at is not None and failed.started_at <= failed.stopped_at <= done.started_at
    first, second = state.invocation_list
    assert (first.status, second.status) == (RunStatus.FAILED, RunStatus.IDLE)
    html = html_report.render_report(state)
    block = html.split('id="run-0"')[1].split('id="run-1"')[0]
    assert "open>" in block.split("\n")[0]                     # shown unfolded
    assert "invocation 1 stopped here" in block and "after 3 attempt(s)" in block
    invocations = html.split('<ol id="invocations">')[1].split("</ol>")[0]
    assert "<strong>failed</strong>" in invocations and "after 3 attempt(s)" in invocations
    assert "<strong>idle</strong>" in invocations
    assert html.count('<rect class="bar unfinished') == 1      # the failed try is drawn too


def test_rejected_answers_a_resume_reuses_are_counted_once(resumed: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Three answers were rejected in all: two re-asked by the first run, the third by the
    resume (which re-reads, and rejects again, the three it reuses)."""
    state = read_run(resumed)
    assert state.usage.reasks == 3 and state.actions["Decide"].usage.reasks == 3
    assert sum(len(r.problems) for r in state.timeline) == 3
    assert (state.usage.llm_calls, state.usage.reused_calls) == (4, 3)
    html = html_report.render_report(state)
    assert "4 (3 reused, 0 retries, 3 re-asks; 4 journaled)" in html
    assert main(["show", str(resumed), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["reasks"] == 3


def test_each_answer_is_shown_once_under_the_try_that_read_it_first(resumed: Path) -> None:
    html = html_report.render_report(read_run(resumed))
    failed = html.split('id="run-0"')[1].split('id="run-1"')[0]
    later = html.split('id="run-1"')[1].split("</section>")[0]
    assert failed.count('<details class="prompt">') == 3 and later.count('<details class="prompt">') == 1
    assert "(re-ask 3)" in later


def _hand_made(gap_s: float) -> RunState:
    """Two invocations of ten seconds each, `gap_s` apart, one action try in each."""
    t0 = 1_800_000_000.0
    second = t0 + 10 + gap_s
    state = RunState(run_dir="", run_id="r", sop_name="s", model="fake", started_at=t0,
                     ended_at=second + 10, status=RunStatus.IDLE, invocations=2, rounds=1,
                     invocation_starts=[t0, second], last_event_at=second + 10)
    state.invocation_list = [Invocation(1, t0, "fake", last_at=t0 + 10, ended_at=t0 + 10,
                                        status=RunStatus.FAILED, error="boom", rounds=1),
                             Invocation(2, second, "fake", last_at=second + 10, ended_at=second + 10,
                                        status=RunStatus.IDLE, rounds=1)]
    state.timeline = [
        ActionRecord(1, "A", "Work", "k", usage=Usage(), started_at=t0 + 1, stopped_at=t0 + 10,
                     invocation=1, error="boom"),
        ActionRecord(1, "A", "Work", "k", completed=True, started_at=second + 1, ended_at=second + 9,
                     invocation=2)]
    state.round_roles, state.round_started = {1: ["A"]}, {1: t0}
    return state


def test_the_idle_gap_between_invocations_is_cut_out_and_marked() -> None:
    drawing = report_svg.layout_timeline(_hand_made(gap_s=3 * 3600), ["A"])
    (gap,) = drawing.gaps
    assert gap.w == report_svg.GAP_W and gap.label == "3 h 00 min"
    first, second = drawing.bars
    share = report_svg.PLOT_W - report_svg.GAP_W
    assert first.w == pytest.approx(9 / 20 * share) and second.w == pytest.approx(8 / 20 * share)
    assert first.x + first.w <= gap.x < gap.x + gap.w <= second.x
    assert drawing.span_s == pytest.approx(20)                 # running time: the gap left out
    html = html_report.render_report(_hand_made(gap_s=3 * 3600))
    assert '<g class="gap">' in html and "+3 h 00 min" in html


def test_a_run_without_a_resume_has_no_gap(tmp_path: Path) -> None:
    drawing = report_svg.layout_timeline(read_run(_debate(tmp_path)), [])
    assert drawing.gaps == [] and drawing.bars


def _debate(tmp_path: Path) -> Path:
    ws = tmp_path / "debate"
    assert main(["run", str(ROOT / "examples" / "debate.sop.yaml"), "--idea", "cats", "--model", "fake",
                 "--out", str(ws)]) == 0
    return ws


def test_timeline_bars_are_labelled_with_their_action(tmp_path: Path) -> None:
    state = read_run(_debate(tmp_path))
    html = html_report.render_report(state)
    labels = re.findall(r'<text class="bar-label" x="[^"]+" y="[^"]+">([^<]+)</text>', html)
    drawing = report_svg.layout_timeline(state, [])
    roomy = [b for b in drawing.bars if b.w - 6 >= report_svg.label_width(b.action)]
    assert roomy and [b.label for b in roomy] == [b.action for b in roomy]
    assert len(labels) == sum(1 for b in drawing.bars if b.label)
    assert all(b.label == b.action or b.label.endswith("…") or not b.label for b in drawing.bars)
    assert report_svg._fit("WriteCodeReview", 50) == "Write…" and report_svg._fit("Argue", 10) == ""
    assert report_svg.label_width("Summar…") > report_svg.label_width("Sabcde…")   # wide letters count wide


def test_the_page_names_the_models_that_answered(tmp_path: Path) -> None:
    state = read_run(_debate(tmp_path))
    html = html_report.render_report(state)
    models = html.split('<dd id="models">')[1].split("</dd>")[0]
    assert f"<strong>fake</strong> ({state.usage.llm_calls} answers)" in models
    assert all(r.models == ["fake"] for r in state.timeline if r.usage.llm_calls)


def test_each_tool_command_is_a_row_of_its_action(tmp_path: Path) -> None:
    ws = tmp_path / "mgx"
    assert main(["run", str(ROOT / "sops" / "mgx_team.sop.yaml"), "--idea", "a snake game", "--model",
                 "fake", "--allow-exec", "--out", str(ws)]) == 0
    with Journal.open(ws) as journal:
        commands = [e.data for e in journal.events() if e.type == "ToolCalled"]
    state = read_run(ws)
    assert [t.tool for r in state.timeline for t in r.tools] == [c["tool"] for c in commands]
    html = html_report.render_report(state)
    rows = re.findall(r'<tr class="tool-call[^"]*"><td class="num">(\d+)</td><td><code>([^<]+)</code>', html)
    assert [name for _, name in rows] == [c["tool"] for c in commands] and "editor.write" in html
    assert "tool request" not in html                         # no longer a prompt of its own
    assert html.count('<rect class="tool') == len(commands)   # and marked on its bar


def test_a_tall_graph_is_wrapped_into_columns_to_use_the_page() -> None:
    graph = check_path(ROOT / "sops" / "software_company.sop.yaml").graph
    assert graph is not None
    drawing = report_svg.layout_graph(graph, {}, set())
    columns = sorted({round(n.x + n.w / 2) for n in drawing.nodes if n.node.startswith("role:")})
    assert len(columns) >= 2                                   # roles side by side, not one strip
    assert drawing.width <= report_svg.PAGE_W + 2 * report_svg.MARGIN
    assert drawing.height < drawing.width
    by_node = {n.node: n for n in drawing.nodes}
    assert all(by_node[e.target].y > by_node[e.source].y or e.path.count("L") == 5 for e in drawing.edges)
    short = check_path(ROOT / "examples" / "debate.sop.yaml").graph
    assert short is not None
    assert report_svg._columns([200.0] * 5) == [(0, 5)]        # a short graph stays one column
