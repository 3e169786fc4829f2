"""`sopctl batch`: one journaled run per row, bad rows failing alone, the batch budget,
resuming after kill -9, expectations, conformance, JUnit, replay regression and Ray."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from engine.api import RunOptions
from engine.batch.evaluate import Golden, conformance
from engine.batch.rows import read_rows
from engine.batch.runner import RowContext, run_batch
from engine.cli.commands import main
from engine.journal.history import read_run
from engine.journal.store import Journal
from engine.testing import ScriptedModel, use_model
from run_helpers import ROOT, SOPS, default_answer

PIPELINE = SOPS / "pipeline.sop.yaml"          # WritePRD -> WriteDesign -> WriteTasks: 3 calls

TYPED_SOP = """\
apiVersion: sop/v1
name: typed
inputs:
  idea: {type: str, required: true}
  count: {type: int, default: 1}
team: {max_rounds: 3}
actions:
  Write:
    prompt: "Write {{ inputs.count }} things about {{ inputs.idea }}."
    output: text
roles:
  Writer:
    profile: Writer
    actions: [Write]
    watch: [UserRequirement]
"""


def _jsonl(path: Path, *rows: Any) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows),
                    encoding="utf-8")
    return path


def _lines(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text(encoding="utf-8").splitlines()]


def _batch(*args: str) -> int:
    return main(["batch", *args])


# --- rows in, lines out -------------------------------------------------------------------


def test_each_row_is_a_journaled_run_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = _jsonl(tmp_path / "rows.jsonl", {"idea": "a todo cli"}, {"idea": "a calculator", "language": "Go"})
    out = tmp_path / "b"
    assert _batch(str(PIPELINE), "--inputs", str(rows), "--model", "fake", "--out", str(out)) == 0
    lines = _lines(out)
    assert [line["row"] for line in lines] == [1, 2]
    for line in lines:
        state = read_run(out / line["dir"])              # its own workspace and journal
        assert line["run_id"] == state.run_id and line["status"] == "idle"
        assert line["calls"] == 3 and line["tokens"] == line["prompt_tokens"] + line["completion_tokens"] > 0
        assert line["artifacts"] == ["docs/prd.json"] and (out / line["dir"] / "docs/prd.json").is_file()
        assert set(line["last_messages"]) == {"WritePRD", "WriteDesign", "WriteTasks"}
    assert read_run(out / "rows/000002").inputs["language"] == "Go"
    captured = capsys.readouterr()
    assert "batch: 2/2 rows · 0 failed" in captured.err           # the plain progress line
    assert "idle" in captured.out and "results.jsonl" in captured.out   # the summary table


def test_bad_rows_fail_with_their_reason_and_the_others_run(tmp_path: Path) -> None:
    sop = tmp_path / "typed.sop.yaml"
    sop.write_text(TYPED_SOP, encoding="utf-8")
    rows = _jsonl(tmp_path / "rows.jsonl", {"idea": "ok"}, {"count": 2}, {"idea": "x", "count": "many"},
                  '{"idea": broken', {"idea": "y", "count": [1]}, {"idea": "z", "colour": "red"},
                  {"idea": "fine", "count": "3"})
    out = tmp_path / "b"
    assert _batch(str(sop), "--inputs", str(rows), "--model", "fake", "--out", str(out)) == 1
    by_row = {line["row"]: line for line in _lines(out)}
    assert [by_row[n]["status"] for n in range(1, 8)] == ["idle", "failed", "failed", "failed", "failed",
                                                          "failed", "idle"]
    assert "missing required input 'idea'" in by_row[2]["error"]
    assert "input 'count' must be int" in by_row[3]["error"]
    assert "line 4: not valid JSON" in by_row[4]["error"]
    assert "input 'count' must be a single value" in by_row[5]["error"]
    assert "unknown input 'colour'" in by_row[6]["error"]
    assert by_row[2]["run_id"] is None and not (out / "rows" / "000002").exists()   # never started
    assert read_run(out / "rows/000007").inputs["count"] == 3


def test_the_summary_shows_each_failed_rows_own_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every row that went wrong is named under its error (first line: what and where), rows
    failing alike share one line; the progress names each as it ends."""
    sop = tmp_path / "typed.sop.yaml"
    sop.write_text(TYPED_SOP.replace("things about {{ inputs.idea }}", "things about {{ 10 // inputs.count }}"),
                   encoding="utf-8")
    rows = _jsonl(tmp_path / "rows.jsonl", {"idea": "ok"}, {"idea": "zero", "count": 0},
                  *({"count": 2} for _ in range(7)))
    assert _batch(str(sop), "--inputs", str(rows), "--model", "fake", "--out", str(tmp_path / "b")) == 1
    out, err = capsys.readouterr()
    assert f"row 2: failed: {sop}:" in out and "error[SOP501]: action Write failed" in out
    assert "ZeroDivisionError" in out and "hint:" not in out
    assert "rows 3, 4, 5, 6, 7 and 2 more: failed: missing required input 'idea'" in out
    assert "  row 9: failed: missing required input 'idea'" in err


class _RayLikeTaskError(Exception):
    """What Ray raises for a task that failed: its text opens with the task, pid and address,
    and the task's own exception is its `cause`."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__("\x1b[36mray::_row_task()\x1b[39m (pid=4242, ip=10.0.0.2)\n  File \"x.py\", line 1\n"
                         f"{type(cause).__name__}: {cause}")
        self.cause = cause


def test_a_row_whose_worker_failed_names_the_workers_error(tmp_path: Path) -> None:
    """A launcher that raises (a Ray worker that cannot import sopctl) fails its row with the
    worker's own exception, not the first line of Ray's wrapper."""
    async def launch(row: Any, share: float | None) -> dict[str, Any] | None:
        raise _RayLikeTaskError(ModuleNotFoundError("No module named 'engine'"))

    rows = _jsonl(tmp_path / "rows.jsonl", {"idea": "a"})
    ctx = RowContext(sop_file=str(PIPELINE), out=str(tmp_path / "b"), options=RunOptions(model="fake"))
    totals, _ = asyncio.run(run_batch(ctx, rows, launch=launch))
    (line,) = _lines(tmp_path / "b")
    assert totals.failed == 1 and line["status"] == "failed"
    assert line["error"] == "internal error: ModuleNotFoundError: No module named 'engine'"


def test_a_hostile_row_fails_alone_never_an_internal_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A line nested past the JSON decoder's own depth, and a line longer than MAX_ROW_CHARS
    (read a bounded piece at a time, never whole): each a failed row saying why."""
    import engine.batch.rows as rows_module

    monkeypatch.setattr(rows_module, "MAX_ROW_CHARS", 5000)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join([
        '{"idea": ' + "[" * 2400 + "]" * 2400 + "}", "[" * 2400 + "]" * 2400,
        json.dumps({"idea": "x" * 20_000}), json.dumps({"idea": "fine"}),
        json.dumps({"idea": "y" * 4000})]) + "\n", encoding="utf-8")
    got = list(read_rows(rows))
    assert [r.number for r in got] == [1, 2, 3, 4, 5]
    assert "line 1: nested too deeply to read" in got[0].problem
    assert "line 2: nested too deeply to read" in got[1].problem
    assert got[2].problem == "line 3: longer than 5,000 characters"
    assert got[3].inputs == {"idea": "fine"} and got[4].inputs == {"idea": "y" * 4000}


def test_csv_rows_an_unknown_column_fails_the_rows_that_use_it(tmp_path: Path) -> None:
    sop = tmp_path / "typed.sop.yaml"
    sop.write_text(TYPED_SOP, encoding="utf-8")
    rows = tmp_path / "rows.csv"
    rows.write_text('idea,count,colour\n"a, b",2,\nc,,red\n', encoding="utf-8")
    out = tmp_path / "b"
    assert _batch(str(sop), "--inputs", str(rows), "--model", "fake", "--out", str(out)) == 1
    first, second = _lines(out)
    assert first["status"] == "idle" and read_run(out / first["dir"]).inputs == {"idea": "a, b", "count": 2}
    assert second["status"] == "failed" and "unknown input 'colour'" in second["error"]


def test_rows_are_read_as_they_go(tmp_path: Path) -> None:
    """The reader is lazy: a row appended after the first was handed over is still read, which
    a reader that loads the file first would miss."""
    rows = _jsonl(tmp_path / "rows.jsonl", *({"idea": f"idea {i}"} for i in range(10_000)))
    reader = read_rows(rows)
    assert next(reader).inputs == {"idea": "idea 0"}
    with rows.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps({"idea": "appended"}) + "\n")
    rest = list(reader)
    assert len(rest) == 10_000 and rest[-1].inputs == {"idea": "appended"} and rest[-1].number == 10_001


def test_an_unknown_inputs_format_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = tmp_path / "rows.txt"
    rows.write_text("idea\n", encoding="utf-8")
    assert _batch(str(PIPELINE), "--inputs", str(rows), "--model", "fake", "--out", str(tmp_path / "b")) == 2
    assert "unknown format" in capsys.readouterr().err


# --- concurrency and budget ------------------------------------------------------------------


def _ctx(out: Path, model: str) -> RowContext:
    return RowContext(sop_file=str(PIPELINE), out=str(out), options=RunOptions(model=model))


class _Meeting(ScriptedModel):
    """Answers nothing until two calls are in flight at once, then answers everything: the
    rows' calls answer instantly, so whether two ever overlap would otherwise depend on how
    their journals' fsyncs happen to interleave, not on the batch's concurrency."""

    async def complete(self, request: Any) -> Any:
        if self.gate is None:
            self.gate = asyncio.Event()
        if self.in_flight + 1 >= 2:
            self.gate.set()
        return await super().complete(request)


def test_rows_run_concurrently_at_most_n_at_a_time(tmp_path: Path) -> None:
    rows = _jsonl(tmp_path / "rows.jsonl", *({"idea": f"idea {i}"} for i in range(6)))
    model = _Meeting(default_answer)
    with use_model(model, name="scripted"):
        run = run_batch(_ctx(tmp_path / "b", model="scripted"), rows, concurrency=2)
        totals, interrupted = asyncio.run(asyncio.wait_for(run, timeout=120))  # one at a time: never
    assert not interrupted and totals.statuses == {"idle": 6}
    assert model.max_in_flight == 2 and model.calls == 18


def test_no_row_starts_once_the_batch_budget_is_spent(tmp_path: Path) -> None:
    rows = _jsonl(tmp_path / "rows.jsonl", *({"idea": f"idea {i}"} for i in range(5)))
    out = tmp_path / "b"
    model = ScriptedModel(default_answer, cost_per_call=1.0)
    with use_model(model, name="scripted"):
        totals, _ = asyncio.run(run_batch(_ctx(out, model="scripted"), rows, concurrency=1, budget_usd=3.5))
    statuses = [line["status"] for line in _lines(out)]
    # row 1 gets the whole $3.50 and spends $3; row 2 gets the $0.50 left: its first call
    # starts (a run always makes progress), its second would pass its budget; then nothing
    # is left and rows 3-5 never start.
    assert statuses == ["idle", "budget", "skipped", "skipped", "skipped"]
    assert model.calls == 4 and totals.cost_usd == 4.0
    assert not (out / "rows" / "000003").exists()
    with use_model(model, name="scripted"):      # a rerun with more budget runs the skipped rows
        asyncio.run(run_batch(_ctx(out, model="scripted"), rows, concurrency=1, budget_usd=100))
    assert [line["status"] for line in _lines(out)] == ["idle", "budget", "idle", "idle", "idle"]


# --- resumable -------------------------------------------------------------------------------


def _sopctl(*args: str, **env: str) -> subprocess.Popen[str]:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.Popen([sys.executable, "-m", "engine.cli", *args], env=environment, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_kill_9_loses_no_finished_row_and_repeats_no_journaled_call(tmp_path: Path) -> None:
    rows = _jsonl(tmp_path / "rows.jsonl", *({"idea": f"idea {i}"} for i in range(6)))
    out = tmp_path / "b"
    args = ("batch", str(PIPELINE), "--inputs", str(rows), "--model", "fake", "--out", str(out), "--concurrency", "2")
    batch = _sopctl(*args, SOPCTL_FAKE_LATENCY_MS="150")
    results = out / "results.jsonl"
    while batch.poll() is None and not (results.is_file() and results.read_text().count("\n") >= 2):
        time.sleep(0.05)
    batch.send_signal(signal.SIGKILL)
    _, err = batch.communicate()
    assert batch.returncode == -signal.SIGKILL, f"the batch ended before it could be killed: {err}"
    before = {line["row"]: line for line in _lines(out)}
    assert len(before) >= 2
    again = _sopctl(*args)
    _, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    after = _lines(out)
    assert [line["row"] for line in after] == [1, 2, 3, 4, 5, 6]     # one line a row, in order
    for line in after:
        assert line["status"] == "idle" and line["calls"] == 3
        with Journal.open(out / line["dir"]) as journal:
            assert len(journal.answers()) == 3          # no call journaled twice
        if line["row"] in before:                       # finished before the kill: kept as it was
            assert line == before[line["row"]] and read_run(out / line["dir"]).invocations == 1


def test_ctrl_c_stops_the_batch_and_a_rerun_finishes_it(tmp_path: Path) -> None:
    rows = _jsonl(tmp_path / "rows.jsonl", *({"idea": f"idea {i}"} for i in range(6)))
    out = tmp_path / "b"
    args = ("batch", str(PIPELINE), "--inputs", str(rows), "--model", "fake", "--out", str(out))
    batch = _sopctl(*args, SOPCTL_FAKE_LATENCY_MS="150")
    results = out / "results.jsonl"
    while batch.poll() is None and not (results.is_file() and results.read_text().count("\n") >= 1):
        time.sleep(0.05)
    batch.send_signal(signal.SIGINT)
    _, err = batch.communicate(timeout=60)
    assert batch.returncode == 130, err
    assert "Traceback" not in err
    stopped = {line["row"]: line["status"] for line in _lines(out)}
    assert "interrupted" not in stopped.values() and len(stopped) < 6   # rows in flight: no line
    again = _sopctl(*args)
    _, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    assert [(line["row"], line["status"], line["calls"]) for line in _lines(out)] == \
        [(n, "idle", 3) for n in range(1, 7)]


# --- evaluation ------------------------------------------------------------------------------


def test_expectations_per_batch_and_per_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = _jsonl(tmp_path / "rows.jsonl", {"idea": "a"},
                  {"idea": "b", "_expect": "{{ run.inputs.idea == 'c' }}"})
    out = tmp_path / "b"
    code = _batch(str(PIPELINE), "--inputs", str(rows), "--model", "fake", "--out", str(out),
                  "--expect", "{{ run.status == 'idle' }}", "--expect", "msgs.WriteDesign | length == 1",
                  "--expect", "{{ msgs.WritePRD[-1].out['Project Name'] }}")
    assert code == 1
    first, second = _lines(out)
    assert [c["passed"] for c in first["checks"]] == [True, True, True]
    assert [c["passed"] for c in second["checks"]] == [True, True, True, False]
    assert "row 2: idle: expectation failed: {{ run.inputs.idea == 'c' }}" in capsys.readouterr().out


def test_an_expectation_that_cannot_be_evaluated_fails_with_why(tmp_path: Path) -> None:
    rows = _jsonl(tmp_path / "rows.jsonl", {"idea": "a"})
    out = tmp_path / "b"
    assert _batch(str(PIPELINE), "--inputs", str(rows), "--model", "fake", "--out", str(out),
                  "--expect", "{{ msgs.NoSuchAction | length }}",
                  "--expect", "{{ run.__class__ }}") == 1
    checks = _lines(out)[0]["checks"]
    assert not any(c["passed"] for c in checks) and all(c["error"] for c in checks)


def test_a_broken_expectation_is_refused_before_any_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = _jsonl(tmp_path / "rows.jsonl", {"idea": "a"})
    assert _batch(str(PIPELINE), "--inputs", str(rows), "--model", "fake", "--out", str(tmp_path / "b"),
                  "--expect", "{{ run.status == }}") == 2
    assert "does not parse" in capsys.readouterr().err and not (tmp_path / "b").exists()


def test_conformance_modes() -> None:
    golden = (("PM", "WritePRD"), ("Arch", "WriteDesign"), ("Eng", "WriteCode"))
    reordered = [golden[1], golden[0], golden[2]]
    longer = [golden[0], ("QA", "WriteTest"), golden[1], golden[2]]
    assert conformance(Golden(golden, "exact"), list(golden))["score"] == 1.0
    assert conformance(Golden(golden, "exact"), longer)["score"] == 0.0
    assert conformance(Golden(golden, "in_order"), longer)["conforms"]
    in_order = conformance(Golden(golden, "in_order"), reordered)
    assert in_order["score"] == round(2 / 3, 4) and "step 1" in in_order["first_difference"]
    assert conformance(Golden(golden, "any_order"), reordered)["conforms"]
    assert conformance(Golden(golden, "any_order"), list(golden[:1]))["score"] == round(1 / 3, 4)


def test_conformance_against_a_golden_run_and_junit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    golden = tmp_path / "golden"
    assert main(["run", str(SOPS / "journal_small.sop.yaml"), "--idea", "g", "--model", "fake",
                 "--out", str(golden)]) == 0
    rows = _jsonl(tmp_path / "rows.jsonl", {"idea": "a"}, {"idea": "b"})
    capsys.readouterr()
    code = _batch(str(PIPELINE), "--inputs", str(rows), "--model", "fake", "--out", str(tmp_path / "b"),
                  "--golden", str(golden), "--match", "any_order", "--format", "junit")
    assert code == 1                        # the pipeline's trajectory is not journal_small's
    suite = ET.fromstring(capsys.readouterr().out).find("testsuite")
    assert suite is not None and suite.get("tests") == "2" and suite.get("failures") == "2"
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == ["row 000001", "row 000002"]
    assert all("conformance" in (c.find("failure").get("message") or "") for c in cases)  # type: ignore[union-attr]
    line = _lines(tmp_path / "b")[0]
    assert line["conformance"]["mode"] == "any_order" and 0 < line["conformance"]["score"] < 1
    # a row of the batch itself as the golden run: every row conforms exactly
    code = _batch(str(PIPELINE), "--inputs", str(rows), "--model", "fake", "--out", str(tmp_path / "c"),
                  "--golden", str(tmp_path / "b" / "rows" / "000001"), "--match", "exact", "--format", "json")
    summary = json.loads(capsys.readouterr().out)
    assert code == 0 and summary["conformance"] == 1.0 and summary["ok"]


# --- regression by replay --------------------------------------------------------------------


def test_replay_reports_no_divergence_then_the_one_an_sop_change_makes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sop = tmp_path / "pipeline.sop.yaml"
    sop.write_text(PIPELINE.read_text(encoding="utf-8"), encoding="utf-8")
    rows = _jsonl(tmp_path / "rows.jsonl", {"idea": "a"}, {"idea": "b"})
    assert _batch(str(sop), "--inputs", str(rows), "--model", "fake", "--out", str(tmp_path / "b")) == 0
    assert _batch("--replay", str(tmp_path / "b"), "--out", str(tmp_path / "r1")) == 0
    lines = _lines(tmp_path / "r1")
    assert [(line["diverged"], line["calls"], line["status"]) for line in lines] == [(False, 0, "idle")] * 2
    sop.write_text(sop.read_text(encoding="utf-8").replace("Break the design into tasks.",
                                                           "Break the design into small tasks."))
    capsys.readouterr()
    assert _batch("--replay", str(tmp_path / "b"), "--out", str(tmp_path / "r2")) == 1
    lines = _lines(tmp_path / "r2")
    assert all(line["diverged"] and "WriteTasks" in line["where"] for line in lines)
    assert "2/2 diverge" in capsys.readouterr().out


# --- Ray -------------------------------------------------------------------------------------


def test_ray_without_the_extra_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)       # import ray -> ImportError
    rows = _jsonl(tmp_path / "rows.jsonl", {"idea": "a"})
    assert _batch(str(PIPELINE), "--inputs", str(rows), "--model", "fake", "--out", str(tmp_path / "b"),
                  "--ray") == 2
    assert "pip install -e '.[ray]'" in capsys.readouterr().err and not (tmp_path / "b").exists()


def test_ray_address_that_cannot_be_reached_is_refused_before_any_row(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ray")
    rows = _jsonl(tmp_path / "rows.jsonl", {"idea": "a"})
    assert _batch(str(PIPELINE), "--inputs", str(rows), "--model", "fake", "--out", str(tmp_path / "b"),
                  "--ray", "127.0.0.1:9") == 2
    assert "cannot reach the Ray cluster at 127.0.0.1:9" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


@pytest.mark.slow
def test_ray_local_cluster_gives_the_local_results(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    rows = _jsonl(tmp_path / "rows.jsonl", {"idea": "a"}, {"idea": "b"}, {"ide": "bad"})
    common = ("batch", str(PIPELINE), "--inputs", str(rows), "--model", "fake")
    local = _sopctl(*common, "--out", str(tmp_path / "local"))
    on_ray = _sopctl(*common, "--out", str(tmp_path / "ray"), "--ray")
    for process in (local, on_ray):
        _, err = process.communicate(timeout=300)
        assert process.returncode == 1, err              # row 3 fails in both
    strip = lambda lines: [{k: v for k, v in line.items() if k != "run_id"} for line in lines]  # noqa: E731
    assert strip(_lines(tmp_path / "ray")) == strip(_lines(tmp_path / "local"))


def test_a_row_killed_while_its_journal_was_created_starts_afresh(tmp_path: Path) -> None:
    rows = _jsonl(tmp_path / "rows.jsonl", {"idea": "a"}, {"idea": "b"})
    out = tmp_path / "b"
    for number in (1, 2):      # an empty journal file; one with its tables and nothing in them
        (out / "rows" / f"00000{number}" / ".sopctl").mkdir(parents=True)
    (out / "rows/000001/.sopctl/journal.sqlite").write_bytes(b"")
    import sqlite3

    from engine.journal.database import SCHEMA  # the journal's own tables, made in one go

    with sqlite3.connect(out / "rows/000002/.sopctl/journal.sqlite") as conn:
        conn.executescript(SCHEMA)
    assert _batch(str(PIPELINE), "--inputs", str(rows), "--model", "fake", "--out", str(out)) == 0
    assert [(line["status"], line["calls"]) for line in _lines(out)] == [("idle", 3), ("idle", 3)]


def test_a_row_whose_inputs_changed_since_its_run_started_fails(tmp_path: Path) -> None:
    out = tmp_path / "b"
    assert main(["run", str(PIPELINE), "--idea", "old", "--model", "fake", "--out",
                 str(out / "rows" / "000001")]) == 0            # a run already in row 1's folder
    rows = _jsonl(tmp_path / "rows.jsonl", {"idea": "new"}, {"idea": "other"})
    assert _batch(str(PIPELINE), "--inputs", str(rows), "--model", "fake", "--out", str(out)) == 1
    first, second = _lines(out)
    assert first["status"] == "failed" and "inputs changed" in first["error"]
    assert second["status"] == "idle"
