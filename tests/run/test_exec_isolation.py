"""Exec isolation: what a command from a shared file can see, what it leaves in the journal,
and what it leaves running (issue 10, "Exec isolation")."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from run_helpers import ROOT, default_answer, run_sop, sop_text

from engine.compile.compiler import compile_text
from engine.load.secrets import REDACTED, is_secret_name, scrub, secret_values
from engine.testing import ScriptedModel

SECRETS = {
    "OPENAI_KEY": "sk-openai-SENTINEL-0123456789",
    "GITHUB_PAT": "github_pat_SENTINEL_abcdefghij",
    "ANTHROPIC_AUTH": "anthropic-SENTINEL-auth-987654",
    "DATABASE_URL": "postgres://app:db-SENTINEL-pw-42@db.internal:5432/prod",
}
"""Shapes that reached the child (and the journal) when the environment was a denylist."""

PRINT_ENV = '["python", "-c", "import os, json; print(json.dumps(dict(os.environ)))"]'


def _exec_source(command: str, extra: str = "", timeout: float = 30) -> str:
    return f"""
apiVersion: sop/v1
name: cmd
inputs: {{idea: {{type: str}}}}
actions:
  Run: {{kind: exec, command: {command}, command_timeout_s: {timeout}, send_to: ["<none>"]{extra}}}
roles:
  Runner: {{actions: [Run], watch: [UserRequirement]}}
"""


def _exec_sop(command: str, extra: str = "", timeout: float = 30) -> Any:
    return sop_text(_exec_source(command, extra, timeout))


def _child_environ(result: Any) -> dict[str, str]:
    out = result.messages[-1].out
    assert out["exit_code"] == 0, out["stderr"]
    return json.loads(out["stdout"])


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SOPCTL_DECLARED", "declared-value")
    monkeypatch.setenv("SOPCTL_UNDECLARED", "undeclared-value")
    return SECRETS


# --- 1. the child's environment is an allowlist ---------------------------------------------

def test_exec_child_gets_no_secret_and_nothing_undeclared(tmp_path: Path, secret_env: dict) -> None:
    result = run_sop(_exec_sop(PRINT_ENV), ScriptedModel(default_answer), tmp_path, allow_exec=True)
    seen = _child_environ(result)
    assert not set(secret_env) & set(seen)
    assert not any(value in json.dumps(seen) for value in secret_env.values())
    assert "SOPCTL_UNDECLARED" not in seen and "SOPCTL_DECLARED" not in seen
    assert seen["PATH"] == os.environ["PATH"]


def test_exec_child_gets_the_names_its_action_declares(tmp_path: Path, secret_env: dict) -> None:
    compiled = _exec_sop(PRINT_ENV, ", env: [SOPCTL_DECLARED, NOT_SET_ANYWHERE]")
    seen = _child_environ(run_sop(compiled, ScriptedModel(default_answer), tmp_path, allow_exec=True))
    assert seen["SOPCTL_DECLARED"] == "declared-value"
    assert "NOT_SET_ANYWHERE" not in seen and "SOPCTL_UNDECLARED" not in seen
    assert not set(secret_env) & set(seen)


def test_declaring_a_secret_looking_name_is_a_warning() -> None:
    compiled = _exec_sop(PRINT_ENV, ", env: [PYTHONPATH, OPENAI_KEY]")
    found = [(d.code, d.pointer) for d in compiled.warnings if d.code == "SOP214"]
    assert found == [("SOP214", "/actions/Run/env/1")]


def test_env_must_be_names() -> None:
    from engine.errors import CompileError

    with pytest.raises(CompileError) as err:
        compile_text(_sop_source(', env: ["A=b"]'))
    assert [d.code for d in err.value.diagnostics] == ["SOP105"]
    assert "'A=b' is not an environment variable name" in str(err.value)


def test_env_on_an_llm_action_is_an_error_naming_its_kind() -> None:
    from engine.errors import CompileError

    with pytest.raises(CompileError) as err:
        compile_text("""
apiVersion: sop/v1
name: cmd
actions:
  Say: {prompt: hi, env: [HOME], send_to: ["<none>"]}
roles:
  Sayer: {actions: [Say], watch: [UserRequirement]}
""")
    found = [(d.code, d.pointer, d.message) for d in err.value.diagnostics]
    assert found == [("SOP110", "/actions/Say/env",
                      "`env` belongs to actions of kind exec; this action is of kind llm (it has no `kind`)")]


def _sop_source(extra: str) -> str:
    return f"""
apiVersion: sop/v1
name: cmd
actions:
  Run: {{kind: exec, command: ["true"], send_to: ["<none>"]{extra}}}
roles:
  Runner: {{actions: [Run], watch: [UserRequirement]}}
"""


@pytest.mark.parametrize("name", ["OPENAI_KEY", "GITHUB_PAT", "ANTHROPIC_AUTH", "OPENAI_API_KEY",
                                  "SLACK_TOKEN", "AWS_SECRET_ACCESS_KEY", "PGPASSWORD", "DB_PASS",
                                  "GOOGLE_APPLICATION_CREDENTIALS", "private_key"])
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["PATH", "HOME", "MONKEY", "COMPAT_MODE", "AUTHOR", "KEYBOARD", "PYTHONPATH"])
def test_ordinary_names(name: str) -> None:
    assert not is_secret_name(name)


# --- 2. the journal never holds those shapes in clear ---------------------------------------

def _journal_bytes(workspace: Path) -> bytes:
    return b"".join(p.read_bytes() for p in (workspace / ".sopctl").iterdir() if p.is_file())


def test_secrets_in_answers_and_command_output_never_reach_the_journal(tmp_path: Path,
                                                                       secret_env: dict) -> None:
    stranger_url = "mysql://root:S3cret-not-in-env@10.0.0.1/app"  # in no variable at all
    leaky = " ".join([*secret_env.values(), stranger_url])
    compiled = sop_text(f"""
apiVersion: sop/v1
name: leaky
inputs: {{idea: {{type: str}}}}
actions:
  Say: {{prompt: "say it", send_to: [Runner]}}
  Run:
    kind: exec
    command: ["python", "-c", "import os, sys; print(sys.argv[1], *(os.environ[n] for n in sys.argv[2:]))",
              "{stranger_url}", {", ".join(secret_env)}]
    env: [{", ".join(secret_env)}]
    send_to: ["<none>"]
roles:
  Sayer: {{actions: [Say], watch: [UserRequirement]}}
  Runner: {{actions: [Run], watch: [Say]}}
""")
    result = run_sop(compiled, ScriptedModel(lambda spec, _: f"here: {leaky}"), tmp_path / "ws",
                     allow_exec=True)
    assert result.status == "idle"
    assert all(v in result.messages[-1].out["stdout"] for v in secret_env.values())  # the run had them
    blobs = _journal_bytes(tmp_path / "ws")
    for secret in [*secret_env.values(), "db-SENTINEL-pw-42", "S3cret-not-in-env"]:
        assert secret.encode() not in blobs, secret
    assert b"mysql://root:" + REDACTED.encode() + b"@10.0.0.1/app" in blobs


def test_url_passwords_are_scrubbed_in_any_text() -> None:
    text = 'a "redis://:pw-long-enough@cache:6379/0" and https://u:p@h/x and https://example.com/a:b@c'
    scrubbed = scrub(text, ())
    assert "pw-long-enough" not in scrubbed and "u:[REDACTED]@h" in scrubbed
    assert "https://example.com/a:b@c" in scrubbed  # a path, not a password
    assert scrub(scrubbed, ()) == scrubbed


def test_url_password_of_an_env_value_is_a_secret_value() -> None:
    values = secret_values({"DATABASE_URL": "postgres://app:long-password-1@db/x", "SHORT": "x://a:b@c"})
    assert "long-password-1" in values and "b" not in values



# --- 4. no process outlives its action -----------------------------------------------------

def _gone(pid: int) -> bool:
    """No such process: not running, and not a zombie left for nobody to reap."""
    return not Path(f"/proc/{pid}").exists()


linux_only = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reaping needs Linux /proc")

LEAVE_ESCAPEES = """
import os, subprocess, sys, time
if sys.argv[1:] == ["child"]:  # in its own session: start a grandchild, tell its pids, linger
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    print(os.getpid(), grandchild.pid, flush=True)
    time.sleep(60)
child = subprocess.Popen([sys.executable, __file__, "child"], start_new_session=True,
                         stdout=subprocess.PIPE, text=True)
print(child.stdout.readline().strip(), flush=True)
if sys.argv[1:] == ["linger"]:
    time.sleep(60)
"""
"""The command starts a `setsid` child (sleeping 60 s) that starts a grandchild of its own,
prints both pids and exits, leaving them behind (or lingers itself with `linger`)."""


def _escapee_script(tmp_path: Path) -> str:
    """The script in the workspace-to-be (where a sandboxed command can read it too)."""
    script = tmp_path / "ws" / "escape.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text(LEAVE_ESCAPEES)
    return str(script)


@linux_only
def test_a_setsid_child_and_its_own_child_do_not_outlive_the_action(tmp_path: Path) -> None:
    compiled = _exec_sop(json.dumps(["python", _escapee_script(tmp_path)]))
    result = run_sop(compiled, ScriptedModel(default_answer), tmp_path / "ws", allow_exec=True,
                     isolate=False)   # the reaper of unisolated commands (pids are the host's)
    out = result.messages[-1].out
    assert out["exit_code"] == 0, out["stderr"]
    pids = [int(p) for p in out["stdout"].split()]
    assert len(pids) == 2 and all(_gone(pid) for pid in pids)


@linux_only
def test_a_timed_out_command_leaves_no_setsid_child_and_keeps_its_output(tmp_path: Path) -> None:
    compiled = _exec_sop(json.dumps(["python", _escapee_script(tmp_path), "linger"]), timeout=2)
    result = run_sop(compiled, ScriptedModel(default_answer), tmp_path / "ws", allow_exec=True,
                     isolate=False)
    out = result.messages[-1].out
    assert out["exit_code"] == 124 and "timeout" in out["stderr"]
    pids = [int(p) for p in out["stdout"].split()]  # the pipes closed: nothing was lost
    assert len(pids) == 2 and all(_gone(pid) for pid in pids)


@linux_only
def test_a_cancelled_run_leaves_no_setsid_child(tmp_path: Path) -> None:
    """Ctrl-C (and SIGTERM, handled alike) cancels the run: the command's escapees go too."""
    import asyncio

    from engine import api

    pid_file = tmp_path / "pids"
    script = tmp_path / "escape.py"
    script.write_text(LEAVE_ESCAPEES.replace("print(child.stdout.readline().strip(), flush=True)",
                                             f"open({str(pid_file)!r}, 'w').write(child.stdout.readline())"))
    compiled = _exec_sop(json.dumps(["python", str(script), "linger"]))

    async def cancel_mid_command() -> None:
        task = asyncio.ensure_future(api.run_async(compiled, {"idea": "x"}, api.RunOptions(model="fake", workspace=tmp_path / "ws", allow_exec=True, isolate=False), journal=False))
        while not (pid_file.exists() and pid_file.read_text().strip()) and not task.done():
            await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(cancel_mid_command())
    pids = [int(p) for p in pid_file.read_text().split()]
    assert len(pids) == 2 and all(_gone(pid) for pid in pids)


@linux_only
def test_ctrl_c_to_sopctl_leaves_no_setsid_child(tmp_path: Path) -> None:
    """A real `sopctl run` interrupted while its command runs: exit 130, and what the command
    left behind is gone with it."""
    import signal
    import subprocess
    import sys
    import time

    from run_helpers import sopctl_env

    script = Path(_escapee_script(tmp_path))
    pid_file = tmp_path / "pids"
    script.write_text(LEAVE_ESCAPEES.replace("print(child.stdout.readline().strip(), flush=True)",
                                             f"open({str(pid_file)!r}, 'w').write(child.stdout.readline())"))
    (tmp_path / "cmd.sop.yaml").write_text(_exec_source(json.dumps(["python", str(script), "linger"])))
    sopctl = subprocess.Popen([sys.executable, "-m", "engine.cli", "run", str(tmp_path / "cmd.sop.yaml"),
                               "--idea", "x", "--model", "fake", "--allow-exec", "--no-isolate", "--out", str(tmp_path / "ws")],
                              cwd=ROOT, env=sopctl_env({"PYTHONPATH": str(ROOT)}),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.05)
        sopctl.send_signal(signal.SIGINT)
        assert sopctl.wait(timeout=60) == 130
    finally:
        if sopctl.poll() is None:
            sopctl.kill()
    pids = [int(p) for p in pid_file.read_text().split()]
    assert len(pids) == 2 and all(_gone(pid) for pid in pids)


# --- 3. --isolate: bubblewrap ------------------------------------------------------------------

def _bwrap_works() -> bool:
    """bwrap installed and able to make the sandbox here (the probe `--isolate` itself runs)."""
    from engine.errors import RunError
    from engine.run.isolation import find_sandbox

    try:
        find_sandbox(allow_network=False)
    except RunError:
        return False
    return True


needs_bwrap = pytest.mark.skipif(not _bwrap_works(), reason="bwrap missing or cannot create namespaces here")

SNOOP = """
import json, os, socket, sys
visible = [p for p in os.listdir("/proc") if p.isdigit()]
environs = []
for pid in visible:  # every environment it can read, its parent's included
    try:
        environs.append(open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace"))
    except OSError:
        pass
def attempt(what):
    try:
        what()
        return "ok"
    except OSError as exc:
        return type(exc).__name__
open("inside.txt", "w").write("written")
json.dump({
    "visible": len(visible), "environs": environs,
    "root_write": attempt(lambda: open("/sopctl-isolation-probe", "w")),
    "journal_write": attempt(lambda: open(".sopctl/journal.sqlite", "ab")),
    "outside_write": attempt(lambda: open(sys.argv[1], "w").write("escaped")),
    "network": attempt(lambda: socket.create_connection(("127.0.0.1", int(sys.argv[2])), timeout=5)),
}, open("report.json", "w"))
"""
"""Reads every process's environment it can see, writes in the workspace, at / and outside the
workspace, and connects to a port the test listens on (on the host's loopback)."""


def _snoop(tmp_path: Path, *flags: str, where: tuple[str, ...] = ("--isolate",),
           path: str | None = None) -> tuple[dict[str, Any], Path, str]:
    """`sopctl run --allow-exec --isolate FLAGS` (`where`: the isolation flags, none for the
    default) as a real process with the secrets in *its* environment (what
    /proc/$PPID/environ shows), running SNOOP; its report, the outside file, its stderr."""
    import socket
    import subprocess
    import sys

    from run_helpers import sopctl_env

    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "snoop.py").write_text(SNOOP)  # in the workspace: /tmp is private in there
    outside = tmp_path / "outside.txt"
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        command = json.dumps(["python", "snoop.py", str(outside), str(server.getsockname()[1])])
        (tmp_path / "snoop.sop.yaml").write_text(_exec_source(command))
        done = subprocess.run(
            [sys.executable, "-m", "engine.cli", "run", str(tmp_path / "snoop.sop.yaml"), "--idea", "x",
             "--model", "fake", "--allow-exec", *where, *flags, "--out", str(workspace)],
            cwd=ROOT, env=sopctl_env({**SECRETS, "PYTHONPATH": str(ROOT), **({"PATH": path} if path else {})}),
            capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads((workspace / "report.json").read_text()), outside, done.stderr


@needs_bwrap
def test_isolate_hides_the_parent_and_confines_writes_and_network(tmp_path: Path) -> None:
    seen, outside, _ = _snoop(tmp_path)
    assert seen["environs"]  # it could read its own, so it would have read sopctl's
    assert not any(value in "".join(seen["environs"]) for value in SECRETS.values())
    assert seen["visible"] <= 3  # bwrap's init and the command: no other process is visible
    assert seen["root_write"] != "ok" and seen["network"] != "ok"
    assert seen["journal_write"] != "ok"  # the run's own files stay the run's
    assert not outside.exists()  # /tmp in there is the sandbox's own
    assert (tmp_path / "ws" / "inside.txt").read_text() == "written"


@needs_bwrap
def test_isolate_with_allow_network_keeps_the_network(tmp_path: Path) -> None:
    seen, _, _ = _snoop(tmp_path, "--allow-network")
    assert seen["network"] == "ok" and seen["root_write"] != "ok"


@needs_bwrap
def test_commands_are_isolated_by_default_where_bubblewrap_works(tmp_path: Path) -> None:
    """No flag: the same sandbox as --isolate (issue 26), and no warning."""
    seen, outside, err = _snoop(tmp_path, where=())
    assert seen["environs"] and not any(v in "".join(seen["environs"]) for v in SECRETS.values())
    assert seen["visible"] <= 3 and seen["root_write"] != "ok" and seen["network"] != "ok"
    assert seen["journal_write"] != "ok" and not outside.exists()
    assert "outside a sandbox" not in err


@needs_bwrap
def test_allow_network_keeps_the_network_of_commands_isolated_by_default(tmp_path: Path) -> None:
    seen, _, _ = _snoop(tmp_path, "--allow-network", where=())
    assert seen["network"] == "ok" and seen["root_write"] != "ok"


@needs_bwrap
def test_no_isolate_runs_commands_as_the_user(tmp_path: Path) -> None:
    """--no-isolate is the old way, with what the docs say it costs: sopctl's environment
    (its keys) is readable through /proc, and a write outside the workspace lands."""
    seen, outside, err = _snoop(tmp_path, "--no-isolate", where=())
    assert any(v in "".join(seen["environs"]) for v in SECRETS.values())
    assert outside.read_text() == "escaped" and "outside a sandbox" not in err


def test_without_bubblewrap_commands_run_as_the_user_with_a_warning(tmp_path: Path) -> None:
    """No flag and no bwrap on PATH: the run goes on unisolated, and says so, naming the fix."""
    # (`python` in a command is this interpreter, found without PATH)
    seen, outside, err = _snoop(tmp_path, where=(), path=str(tmp_path / "empty"))
    assert "commands run as you, outside a sandbox: isolation needs bubblewrap" in err
    assert "--no-isolate" in err and "Traceback" not in err
    assert outside.read_text() == "escaped"


def test_a_run_that_starts_no_command_never_looks_for_bubblewrap(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import engine.run.team as team

    def no_probe(allow_network: bool) -> Any:
        raise AssertionError("probed bwrap for a run that runs no command")

    monkeypatch.setattr(team, "find_sandbox", no_probe)
    text = _exec_source(PRINT_ENV).replace("kind: exec, command: " + PRINT_ENV + ", command_timeout_s: 30, ",
                                           "prompt: hi, ")
    assert run_sop(sop_text(text), ScriptedModel(default_answer), tmp_path / "ws").status == "idle"
    result = run_sop(_exec_sop(PRINT_ENV), ScriptedModel(default_answer), tmp_path / "ws2",
                     allow_exec=True, isolate=False)
    assert result.status == "idle"


@needs_bwrap
def test_isolate_missing_program_is_a_clear_failure(tmp_path: Path) -> None:
    result = run_sop(_exec_sop('["no-such-program-sopctl"]'), ScriptedModel(default_answer), tmp_path,
                     allow_exec=True, isolate=True)
    assert result.status == "failed" and "cannot start 'no-such-program-sopctl'" in result.error


@needs_bwrap
def test_isolate_leaves_no_setsid_child(tmp_path: Path) -> None:
    script = _escapee_script(tmp_path)
    result = run_sop(_exec_sop(json.dumps(["python", script])), ScriptedModel(default_answer),
                     tmp_path / "ws", allow_exec=True, isolate=True)
    assert result.messages[-1].out["exit_code"] == 0
    assert _running(script) == []  # (pids inside the sandbox are not ours: look by command line)


def _running(script: str) -> list[str]:
    """The processes whose command line names `script`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if script.encode() in (entry / "cmdline").read_bytes():
                found.append(entry.name)
        except OSError:
            continue
    return found


def test_isolate_without_bwrap_refuses_before_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from engine.cli.commands import main as sopctl

    sop_file = tmp_path / "cmd.sop.yaml"
    sop_file.write_text(_exec_source(PRINT_ENV))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no bwrap on it
    code = sopctl(["run", str(sop_file), "--idea", "x", "--model", "fake", "--allow-exec", "--isolate",
                   "--out", str(tmp_path / "ws")])
    assert code == 2
    assert "--isolate needs bubblewrap (`bwrap`)" in capsys.readouterr().err
    assert not (tmp_path / "ws").exists()


@pytest.mark.parametrize("options", [dict(allow_exec=True, isolate=False),   # --no-isolate
                                     dict(allow_exec=False)])                # no command runs
def test_allow_network_where_no_command_is_isolated_is_refused(tmp_path: Path, options: dict) -> None:
    from engine.errors import RunError

    with pytest.raises(RunError, match="--allow-network only applies with --isolate"):
        run_sop(_exec_sop(PRINT_ENV) if options["allow_exec"] else sop_text(_exec_source(PRINT_ENV).replace(
            "kind: exec, command: " + PRINT_ENV + ", command_timeout_s: 30, ", "prompt: hi, ")),
            ScriptedModel(default_answer), tmp_path / "ws", allow_network=True, **options)
    assert not (tmp_path / "ws").exists()
