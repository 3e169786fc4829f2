"""`sopctl report`: the HTML report of a run, read from its journal alone (no browser here;
tests/cli/test_report_browser.py opens it in Chromium)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine.compile.compiler import check_path
from engine.cli import html_report
from engine.cli.commands import main
from engine.journal.history import read_run
from engine.journal.run_folder import journal_path

from run_helpers import ROOT

COMPANY = ROOT / "sops" / "software_company.sop.yaml"
DEBATE = ROOT / "examples" / "debate.sop.yaml"
HOSTILE = "<script>window.pwned=1</script><img src=x onerror=alert(1)>"
"""An idea that is markup: the idea is the first message, shown in the report."""


def fake_run(sop: Path, ws: Path, idea: str, crash_after_event: int = 0) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOPCTL_")}
    if crash_after_event:
        env["SOPCTL_CRASH_AFTER_EVENT"] = str(crash_after_event)
    return subprocess.run([sys.executable, "-m", "engine.cli", "run", str(sop), "--idea", idea,
                           "--model", "fake", "--out", str(ws)], cwd=ROOT, env=env,
                          capture_output=True, text=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The software company's run (its idea is hostile markup), a debate, and a killed run."""
    root = tmp_path_factory.mktemp("report")
    company = fake_run(COMPANY, root / "company", HOSTILE)
    assert company.returncode == 0, company.stderr
    debate = fake_run(DEBATE, root / "debate", "cats are better than dogs")
    assert debate.returncode == 0, debate.stderr
    killed = fake_run(COMPANY, root / "killed", "a 2048 game", crash_after_event=12)
    assert killed.returncode == 137, killed.stderr
    return {"company": root / "company", "debate": root / "debate", "killed": root / "killed"}


def report(capsys: pytest.CaptureFixture[str], run_dir: Path, *extra: str) -> tuple[int, str, str]:
    code = main(["report", str(run_dir), *extra])
    _, err = capsys.readouterr()
    out = Path(extra[extra.index("-o") + 1]) if "-o" in extra else html_report.default_output(run_dir)
    return code, out.read_text(encoding="utf-8") if code == 0 else "", err


def test_report_is_written_beside_the_run_by_default(runs: dict[str, Path],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, html, err = report(capsys, runs["company"])
    assert code == 0, err
    assert html_report.default_output(runs["company"]) == runs["company"].parent / "company.html"
    assert "written to" in err and html.startswith("<!DOCTYPE html>")


def test_model_and_user_text_is_escaped(runs: dict[str, Path], tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    code, html, _ = report(capsys, runs["company"], "-o", str(tmp_path / "r.html"))
    assert code == 0
    assert "<script>window.pwned" not in html and "<img src=x" not in html
    assert "&lt;script&gt;window.pwned=1&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;" in html
    assert html.count("<script>") == 1            # the report's own script, nothing else


def test_the_only_script_is_allowed_by_its_hash_and_nothing_loads(runs: dict[str, Path], tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code, html, _ = report(capsys, runs["company"], "-o", str(tmp_path / "r.html"))
    assert code == 0
    (script,) = re.findall(r"<script>(.*?)</script>", html, re.S)
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode()
    assert f"default-src 'none'; style-src 'unsafe-inline'; script-src 'sha256-{digest}'" in html
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)   # nothing from the network


def test_graph_has_every_role_and_action(runs: dict[str, Path], tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    code, html, _ = report(capsys, runs["company"], "-o", str(tmp_path / "r.html"))
    assert code == 0
    graph = check_path(COMPANY).graph
    assert graph is not None
    drawn = set(re.findall(r'<g class="node [^"]*" data-node="([^"]+)"', html))
    assert drawn == set(graph.nodes)
    assert len(re.findall(r'<path class="edge ', html)) == graph.number_of_edges()
    assert 'data-node="action:WritePRD"' in html and 'data-node="role:ProductManager"' in html


def test_loops_are_drawn_with_their_bounds(runs: dict[str, Path], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    code, html, _ = report(capsys, runs["debate"], "-o", str(tmp_path / "d.html"))
    assert code == 0
    loops = re.search(r'<ul id="loops">(.*?)</ul>', html, re.S)
    assert loops is not None and "bounded by Argue max_runs=3" in loops.group(1)
    assert "unbounded" not in loops.group(1)
    assert re.search(r'<path class="edge watch bounded"', html)
    assert "Argue ≤3 ×" in html                    # its bound and how often it ran


def test_timeline_has_one_bar_per_action_run(runs: dict[str, Path], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    code, html, _ = report(capsys, runs["debate"], "-o", str(tmp_path / "d.html"))
    assert code == 0
    state = read_run(runs["debate"])
    bars = re.findall(r'<rect class="bar[^"]*" data-run="(\d+)" data-round="(\d+)" data-role="([^"]+)" '
                      r'data-action="([^"]+)"', html)
    assert [(int(r), role, action) for _, r, role, action in bars] == \
        [(r.round, r.role, r.action) for r in state.timeline]
    assert len(state.timeline) >= 6                # three speeches each, at least
    assert all(r.started_at > 0 and r.ended_at is not None and r.ended_at >= r.started_at
               for r in state.timeline)
    assert "calls in flight" in html and 'class="flight"' in html


def test_usage_per_action_and_per_role(runs: dict[str, Path], tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    code, html, _ = report(capsys, runs["debate"], "-o", str(tmp_path / "d.html"))
    assert code == 0
    state = read_run(runs["debate"])
    per_action, per_role = html.split("<h3>Per action</h3>")[1].split("<h3>Per role</h3>")
    for stats in state.actions.values():
        usage = stats.usage
        assert f"<td>{stats.action}</td>" in per_action
        assert f"{usage.prompt_tokens}+{usage.completion_tokens}" in per_action
    for role in ("Proposer", "Opponent"):
        mine = [r.usage for r in state.timeline if r.role == role]
        tokens = f"{sum(u.prompt_tokens for u in mine)}+{sum(u.completion_tokens for u in mine)}"
        assert re.search(rf"<td>{role}</td>.*?{re.escape(tokens)}", per_role.split("</table>")[0], re.S)


def test_every_message_with_route_and_content(runs: dict[str, Path], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    code, html, _ = report(capsys, runs["debate"], "-o", str(tmp_path / "d.html"))
    assert code == 0
    state = read_run(runs["debate"])
    import html as htmllib

    for message in state.history:
        block = html.split(f'id="msg-{message["id"]}"')[1].split("</div>\n</div>")[0]
        to = ", ".join(sorted(message["send_to"]))
        assert htmllib.escape(f'{message["sent_from"]} → {to}') in block
        assert htmllib.escape(str(message["content"])).replace("&#x27;", "&#39;") in block


def test_artifacts_are_shown_and_changes_said(runs: dict[str, Path], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    state = read_run(runs["company"])
    assert "docs/prd.md" in state.artifacts
    original = (runs["company"] / "docs" / "prd.md").read_text(encoding="utf-8")
    shown = {a["path"]: a for a in html_report._view(state)["artifacts"]}
    assert shown["docs/prd.md"]["text"] == original and shown["docs/prd.md"]["note"] == ""
    copy = tmp_path / "ws"
    import shutil

    shutil.copytree(runs["company"], copy)
    (copy / "docs" / "prd.md").write_text("edited", encoding="utf-8")
    (copy / "requirements.txt").unlink()
    (copy / "docs" / "tasks.md").unlink()
    (copy / "docs" / "tasks.md").symlink_to("/etc/passwd")
    shown = {a["path"]: a for a in html_report._view(read_run(copy))["artifacts"]}
    assert shown["docs/prd.md"]["note"] == "changed since the run wrote it"
    assert shown["docs/prd.md"]["text"] == "edited"
    assert shown["requirements.txt"]["note"] == "missing from the workspace"
    assert shown["docs/tasks.md"]["text"] is None and "symlink" in shown["docs/tasks.md"]["note"]


def test_an_interrupted_run_shows_where_it_stopped(runs: dict[str, Path], tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, html, err = report(capsys, runs["killed"], "-o", str(tmp_path / "k.html"))
    assert code == 0, err
    state = read_run(runs["killed"])
    assert state.status == "interrupted"
    banner = html.split('<div class="banner interrupted" id="stopped">')[1].split("</div>")[0]
    assert "interrupted" in banner and f"stopped in round {state.rounds}" in banner
    unfinished = [r for r in state.timeline if not r.completed]
    for record in unfinished:
        assert f"{record.role}.{record.action} (round {record.round})" in banner
    assert 'id="stop-mark"' in html
    assert html.count('class="bar unfinished') == len(unfinished)


def test_prompts_are_folded_and_escaped_when_recorded(runs: dict[str, Path], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    state = read_run(runs["debate"])
    first = state.timeline[0]
    exchange: dict[str, Any] = {
        "round": first.round, "role": first.role, "action": first.action, "attempt": 0,
        "origin": "model", "model": "fake", "prompt_tokens": 3, "completion_tokens": 2,
        "request_hash": first.requests[0],         # an answer the action read
        "messages": [{"role": "system", "content": "You are <b>Biden</b>"},
                     {"role": "user", "content": "Argue."}],
        "answer": "I <i>agree</i>"}
    monkeypatch.setattr(html_report, "_exchanges", lambda _state: [exchange])
    html = html_report.render_report(state)
    run_block = html.split('id="run-0"')[1].split('id="run-1"')[0]
    assert '<details class="prompt">' in run_block
    assert "You are &lt;b&gt;Biden&lt;/b&gt;" in run_block and "I &lt;i&gt;agree&lt;/i&gt;" in run_block
    assert "not recorded" not in run_block
    other = html.split('id="run-1"')[1].split('id="run-2"')[0]
    assert "not recorded" in other                 # it had model calls but no exchange
    exchange["messages"][1]["content"] = "x" * (html_report.PROMPT_SHOWN_CHARS + 10)
    html = html_report.render_report(state)
    assert "x" * html_report.PROMPT_SHOWN_CHARS + "\n… (10 more characters: `sopctl show RUN_DIR " \
        f"--prompts {first.action}`)" in html


def test_prompts_not_recorded_says_so(runs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(html_report, "_exchanges", lambda _state: None)
    state = read_run(runs["company"])
    html = html_report.render_report(state)
    assert html.count("prompts: not recorded in this run's journal") == len(state.timeline)


def test_a_folder_that_is_not_a_run_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = report(capsys, tmp_path)
    assert code == 2 and "has no journal" in err and "Traceback" not in err
    code, _, err = report(capsys, tmp_path / "missing")
    assert code == 2 and "Traceback" not in err
    assert not html_report.default_output(tmp_path).exists()


@pytest.mark.parametrize("damage", ["garbage", "truncated", "newer"])
def test_a_damaged_journal_is_exit_2(runs: dict[str, Path], tmp_path: Path, damage: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    copy = tmp_path / "ws"
    shutil.copytree(runs["company"], copy)
    path = journal_path(copy)
    data = path.read_bytes()
    if damage == "newer":
        import sqlite3

        with contextlib.closing(sqlite3.connect(path)) as conn, conn:
            conn.execute("UPDATE meta SET value = '999' WHERE key = 'schema_version'")
    else:
        path.write_bytes(b"not a database at all" * 50 if damage == "garbage" else data[: len(data) // 3])
    code, _, err = report(capsys, copy, "-o", str(tmp_path / "r.html"))
    assert code == 2, err
    assert "journal" in err and "Traceback" not in err and "internal error" not in err
    assert not (tmp_path / "r.html").exists()


def test_output_in_a_missing_folder_is_exit_2(runs: dict[str, Path], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = report(capsys, runs["company"], "-o", str(tmp_path / "nope" / "r.html"))
    assert code == 2 and "does not exist" in err
    code, _, err = report(capsys, runs["company"], "-o", str(tmp_path))
    assert code == 2 and "is a folder" in err


def test_report_without_the_sop_file_still_renders(runs: dict[str, Path], tmp_path: Path) -> None:
    state = read_run(runs["company"])
    state.sop_path, state.sop_file = str(tmp_path / "gone.sop.yaml"), "gone.sop.yaml"
    html = html_report.render_report(state)
    assert "is gone: no graph" in html and 'id="graph-svg"' not in html
    assert html.count('<rect class="bar') == len(state.timeline)


def test_a_failed_run_shows_its_error_where_it_stopped(runs: dict[str, Path]) -> None:
    from engine.run.events import RunStatus

    state = read_run(runs["debate"])
    state.status, state.error = RunStatus.FAILED, "action Argue failed: <b>boom</b>"
    html = html_report.render_report(state)
    banner = html.split('<div class="banner failed" id="stopped">')[1].split("</div>")[0]
    assert "action Argue failed: &lt;b&gt;boom&lt;/b&gt;" in banner
    assert f"stopped in round {state.rounds}" in banner
    assert 'id="stop-mark"' in html and "failed here" in html


def test_a_changed_sop_file_is_drawn_as_it_is_now_and_says_so(runs: dict[str, Path]) -> None:
    state = read_run(runs["company"])
    assert "changed since the run" not in html_report.render_report(state)
    state.sop_hash = "0" * 64                      # as if the file had been edited since
    html = html_report.render_report(state)
    assert "changed since the run: this is the graph of the file as it is now" in html
    assert 'id="graph-svg"' in html


def test_the_report_redacts_what_the_journal_redacts(runs: dict[str, Path], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A report is shared: an artifact (which the workspace keeps as written) holding a key's
    value, a token or a URL password is redacted in the page, and so is a journaled text that
    holds a secret of the environment the report is made in."""
    import shutil

    copy = tmp_path / "ws"
    shutil.copytree(runs["debate"], copy)
    rel = sorted(read_run(copy).artifacts)[0]
    value, token = "plain-service-secret-42", "ghp_AbCdEf0123456789AbCdEf0123456789AbCd"
    monkeypatch.setenv("MY_SERVICE_TOKEN", value)
    monkeypatch.setenv("ANOTHER_SECRET", "better than dogs")      # in the journaled idea
    (copy / rel).write_text(f"key {value}\ntoken {token}\ndb postgres://app:hunter2-long@db/app\n",
                            encoding="utf-8")
    code, html, _ = report(capsys, copy, "-o", str(tmp_path / "r.html"))
    assert code == 0
    for secret in (value, token, "hunter2-long", "better than dogs"):
        assert secret not in html
    assert "key [REDACTED]\ntoken [REDACTED]\ndb postgres://app:[REDACTED]@db/app" in html


def test_output_into_the_run_folders_own_files_is_refused(runs: dict[str, Path], tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    copy = tmp_path / "ws"
    shutil.copytree(runs["debate"], copy)
    before = journal_path(copy).read_bytes()
    for target in (journal_path(copy), copy / ".SOPCTL" / "x.html", copy / ".sopctl" / "r.html"):
        assert main(["report", str(copy), "-o", str(target)]) == 2
        assert ".sopctl/ (its journal and lock); refused" in capsys.readouterr().err
    (tmp_path / "link.html").symlink_to(journal_path(copy))
    assert main(["report", str(copy), "-o", str(tmp_path / "link.html")]) == 2
    assert journal_path(copy).read_bytes() == before


def test_a_planted_temporary_report_link_is_not_written_through(runs: dict[str, Path], tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    mine = tmp_path / "mine.txt"
    mine.write_text("mine\n", encoding="utf-8")
    (tmp_path / ".r.html.tmp").symlink_to(mine)
    assert main(["report", str(runs["debate"]), "-o", str(tmp_path / "r.html")]) == 0
    assert mine.read_text(encoding="utf-8") == "mine\n" and (tmp_path / "r.html").is_file()


def test_more_ways_into_the_run_folders_own_files_are_refused_or_harmless(
        runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """More of the class (issue 26): a path through `..`, a linked folder, the WAL and the
    lock, another run's journal; a hard link to the journal is replaced, not written through."""
    import shutil

    copy, other = tmp_path / "ws", tmp_path / "other"
    shutil.copytree(runs["debate"], copy)
    shutil.copytree(runs["debate"], other)
    before = {p: journal_path(p).read_bytes() for p in (copy, other)}
    (tmp_path / "dirlink").symlink_to(copy / ".sopctl")
    for target in (copy / ".sopctl" / ".." / ".sopctl" / "journal.sqlite-wal", copy / ".sopctl" / "writer.lock",
                   tmp_path / "dirlink" / "journal.sqlite", journal_path(other)):
        assert main(["report", str(copy), "-o", str(target)]) == 2, target
        err = capsys.readouterr().err
        assert "refused" in err and "Traceback" not in err
    os.link(journal_path(copy), tmp_path / "hard.html")
    assert main(["report", str(copy), "-o", str(tmp_path / "hard.html")]) == 0
    assert {p: journal_path(p).read_bytes() for p in (copy, other)} == before
