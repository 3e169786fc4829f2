"""The terminal: one persistent shell per role, for the whole run (engine/run/tools/terminal.py)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
from run_helpers import run_sop, sop_text

from engine.models.types import CallSpec
from engine.run.events import ToolCalled
from engine.run.toolloop import MAX_OUTPUT_CHARS
from engine.testing import ScriptedModel, use_model

TERMINAL = """
apiVersion: sop/v1
name: terminal_session
inputs:
  idea: {required: true}
actions:
  Build:
    prompt: "Build {{ inputs.idea }}"
    tools: [terminal, human]
    max_steps: 8
roles:
  Engineer:
    actions: [Build]
    watch: [UserRequirement]
"""


def step(*commands: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"thought": "next", "commands": [{"command_name": n, "args": a} for n, a in commands]}


def sh(command: str, timeout_s: float | None = None) -> dict[str, Any]:
    args: dict[str, Any] = {"command": command}
    if timeout_s is not None:
        args["timeout_s"] = timeout_s
    return step(("terminal.run", args))


END = step(("end", {"answer": "built"}))


def outputs(result: Any) -> list[str]:
    return [e.output for e in result.events if isinstance(e, ToolCalled) and e.tool == "terminal.run"]


def run(tmp_path: Path, *answers: dict[str, Any], **options: Any) -> Any:
    result = run_sop(sop_text(TERMINAL), ScriptedModel([*answers, END]), tmp_path / "ws",
                     allow_exec=True, **options)
    assert result.status == "idle", result.error
    return result


def test_cd_and_exported_variables_persist_from_command_to_command(tmp_path: Path) -> None:
    result = run(tmp_path, sh("mkdir -p src/app && cd src/app"), sh("export GREETING=hello; f() { echo fn; }"),
                 sh("pwd; echo $GREETING; f"))
    last = outputs(result)[-1]
    assert last.startswith("[exit code 0]\n[stdout]\n")
    assert f"{tmp_path / 'ws' / 'src' / 'app'}\nhello\nfn\n" in last


def test_each_command_has_its_exit_code_and_its_streams(tmp_path: Path) -> None:
    result = run(tmp_path, sh("echo out; echo err >&2; false"), sh("printf 'no newline'"))
    first, second = outputs(result)
    assert first == "[exit code 1]\n[stdout]\nout\n\n[stderr]\nerr\n"
    assert second == "[exit code 0]\n[stdout]\nno newline\n[stderr]\n"


def test_a_command_reading_stdin_reads_nothing(tmp_path: Path) -> None:
    result = run(tmp_path, sh("cat; echo after-cat"), sh("echo still here"))
    assert "after-cat" in outputs(result)[0] and "still here" in outputs(result)[1]


def test_a_timeout_interrupts_the_command_and_keeps_the_session(tmp_path: Path) -> None:
    result = run(tmp_path, sh("mkdir -p sub && cd sub && export X=kept"), sh("sleep 30", timeout_s=0.5),
                 sh("pwd; echo $X"))
    timed_out, after = outputs(result)[1:]
    assert timed_out.startswith("[exit code 124]")
    assert "timed out after 0.5 s: the command was interrupted" in timed_out
    assert "the shell session is kept" in timed_out
    assert f"{tmp_path / 'ws' / 'sub'}\nkept\n" in after


def test_a_command_that_ignores_the_interrupt_ends_the_session_and_the_next_says_so(tmp_path: Path) -> None:
    result = run(tmp_path, sh("cd / && export X=gone"), sh("while :; do :; done", timeout_s=0.5),
                 sh("pwd; echo \"[$X]\""))
    stuck, after = outputs(result)[1:]
    assert "did not stop when interrupted: the shell session was ended" in stuck
    assert after.startswith("[sopctl: a new shell session: the last one ended; the working folder is the "
                            "workspace again")
    assert f"{tmp_path / 'ws'}\n[]\n" in after


def test_exit_ends_the_session_and_the_next_command_starts_a_new_one(tmp_path: Path) -> None:
    result = run(tmp_path, sh("echo bye; exit 3"), sh("echo again"))
    ended, after = outputs(result)
    assert ended.startswith("[exit code 3]\n[stdout]\nbye\n")
    assert "the shell exited (exit code 3)" in ended
    assert "a new shell session" in after and "again" in after


def test_output_is_bounded_and_the_cut_is_told(tmp_path: Path) -> None:
    result = run(tmp_path, sh("seq 1 100000"))
    out = outputs(result)[0]
    assert len(out) < MAX_OUTPUT_CHARS   # nothing is left for the loop's own cut
    assert out.startswith("[exit code 0]\n[stdout]\n1\n2\n3\n")
    assert "99999\n100000\n" in out   # the end, where errors are, is kept
    cut = re.search(r"\[sopctl: (\d+) bytes of stdout cut here; to see them all", out)
    assert cut is not None and int(cut.group(1)) > 500_000


def test_the_environment_is_the_allowlisted_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECRET_TOKEN_FOR_TEST", "leak")
    result = run(tmp_path, sh("echo \"[$SECRET_TOKEN_FOR_TEST]\"; pwd"))
    assert f"[]\n{tmp_path / 'ws'}\n" in outputs(result)[0]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def test_the_session_ends_with_the_run_and_leaves_no_process(tmp_path: Path) -> None:
    result = run(tmp_path, sh("echo shell=$$; sleep 300 & echo job=$!; (setsid sleep 301 &) ; echo started"),
                 isolate=False)   # the unisolated reaper: the pids are the host's
    out = outputs(result)[0]
    pids = [int(p) for p in re.findall(r"(?:shell|job)=(\d+)", out)]
    assert len(pids) == 2 and "started" in out
    assert not [pid for pid in pids if _alive(pid)]
    leftovers = [p for p in os.listdir("/proc") if p.isdigit() and _cmdline(p) == b"sleep\x00301\x00"]
    assert leftovers == []


def _cmdline(pid: str) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read()
    except OSError:
        return b""


def test_two_roles_have_two_shells(tmp_path: Path) -> None:
    two = TERMINAL + """  Tester:
    actions: [Build]
    watch: [UserRequirement]
"""
    script = {"Engineer": [sh("cd /tmp && export WHO=eng"), sh("echo $WHO; pwd"), END],
              "Tester": [sh("export WHO=test"), sh("echo $WHO; pwd"), END]}

    def answer(spec: CallSpec, attempt: int) -> Any:
        return script[spec.role].pop(0)
    result = run_sop(sop_text(two), ScriptedModel(answer), tmp_path / "ws", allow_exec=True)
    assert result.status == "idle", result.error
    seen = {e.role: e.output for e in result.events if isinstance(e, ToolCalled) and e.step == 2}
    assert "eng\n/tmp\n" in seen["Engineer"]
    assert f"test\n{tmp_path / 'ws'}\n" in seen["Tester"]


def _bwrap_works() -> bool:
    from engine.errors import RunError
    from engine.run.isolation import find_sandbox

    try:
        find_sandbox(allow_network=False)
    except RunError:
        return False
    return True


@pytest.mark.skipif(not _bwrap_works(), reason="bwrap missing or cannot create namespaces here")
def test_under_isolate_the_session_runs_in_the_sandbox_and_keeps_its_state(tmp_path: Path) -> None:
    result = run(tmp_path, sh("mkdir sub && cd sub && export X=1 && echo inside > f.txt"),
                 sh("sleep 30", timeout_s=0.5), sh("pwd; echo $X; ls /proc | grep -c '^[0-9]'; touch /etc/x"),
                 isolate=True)
    _, timed_out, last = outputs(result)
    assert "the shell session is kept" in timed_out
    lines = last.split("\n")
    assert lines[2:4] == [str(tmp_path / "ws" / "sub"), "1"]
    assert int(lines[4]) < 10   # its own PID namespace: sopctl and the host's processes unseen
    assert "Read-only file system" in last
    assert (tmp_path / "ws" / "sub" / "f.txt").read_text() == "inside\n"


def test_after_a_crash_the_restarted_shell_says_so(tmp_path: Path) -> None:
    from engine import api

    first = [sh("mkdir -p sub && cd sub && export X=lost"), sh("echo $X")]
    asked: list[str] = []

    def crash_at_the_third_call(spec: CallSpec, attempt: int) -> Any:
        asked.append(spec.action)
        if len(asked) == 3:
            raise KeyboardInterrupt   # sopctl dies before the model's third answer
        return first[len(asked) - 1]
    sop_file = tmp_path / "terminal.sop.yaml"
    sop_file.write_text(TERMINAL, encoding="utf-8")
    options = api.RunOptions(workspace=tmp_path / "ws", allow_exec=True)
    with use_model(ScriptedModel(crash_at_the_third_call)), pytest.raises(KeyboardInterrupt):
        api.run(api.load(sop_file), {"idea": "x"}, options)
    events: list[Any] = []

    class Sink:
        def on_event(self, event: Any) -> None:
            events.append(event)
    rest = ScriptedModel([sh("pwd; echo \"[$X]\""), END])
    with use_model(rest):
        resumed = api.resume(tmp_path / "ws", api.ResumeOptions(allow_exec=True, observers=[Sink()]))
    assert resumed.status == "idle", resumed.error
    runs = [e for e in events if isinstance(e, ToolCalled) and e.tool == "terminal.run"]
    assert [e.reused for e in runs] == [True, True, False]   # the journaled ones are not run again
    assert "lost" in runs[1].output
    assert runs[2].output.startswith("[sopctl: the shell was restarted: sopctl stopped since your earlier "
                                     "commands")
    assert f"{tmp_path / 'ws'}\n[]\n" in runs[2].output
