"""Helpers for the interpreter's tests: scripted answers, runs, and crash runs.

The one model double is the public `engine.testing.ScriptedModel`: tests script what the
model says (`default_answer` below answers every kind of call), and `run_sop` runs a SOP on
it through the real gateway, so answers are parsed, validated, journaled and reported as in
any run. `ForkedSopctl` runs `sopctl` commands that may die mid-way (the journal's crash
hooks) as real processes, without paying Python's start-up for each one.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import IO, Any
from collections.abc import Callable, Iterator, Mapping

from engine.compile.compiler import CompiledSop, compile_path, compile_text
from engine.models.gateway import Gateway
from engine.models.types import CallSpec, Provider, StoredAnswer

TESTS = Path(__file__).resolve().parent
"""The tests folder: data (cases, golden, sops, mcp_servers) lives here, tests in its subfolders."""
ROOT = TESTS.parent
SOPS = TESTS / "sops"


def instance(schema: dict | None, key: str = "value") -> Any:
    """A small value that validates against `schema` (like the contract's `fake`)."""
    schema = schema or {"type": "string"}
    if "anyOf" in schema:
        return instance(schema["anyOf"][0], key)
    kind = schema.get("type")
    if "enum" in schema:
        return schema["enum"][0]
    if kind == "object":
        props = schema.get("properties") or {}
        return {k: instance(v, k) for k, v in props.items()}
    if kind == "array":
        return [instance(schema.get("items"), key)]
    if kind == "boolean":
        return False
    if kind in ("integer", "number"):
        return 0
    return f"{key} text"


def fenced(code: str) -> str:
    """A code answer as a model writes it: in a fenced block (the gateway reads its body)."""
    return f"```python\n{code}\n```"


def default_answer(spec: CallSpec, attempt: int = 0) -> Any:
    """A valid answer to any call: a small instance of a json action's schema, a line of
    Python, the next state of a react choice (then -1), or a line of text."""
    if spec.kind == "json":
        return instance(spec.schema)
    if spec.kind == "code":
        return fenced("print('hello')")
    if spec.kind == "choice":
        nxt = spec.previous_choice + 1
        return nxt if nxt < spec.n_choices else -1
    return f"{spec.action} says hello"


class _EveryModel(Mapping[str, Provider]):
    """Gateway providers in which one model answers every model name."""

    def __init__(self, model: Provider) -> None:
        self.model = model

    def __getitem__(self, name: str) -> Provider:
        return self.model

    def __contains__(self, name: object) -> bool:
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


class _NoReuse:
    """An answer store that keeps nothing: every call the run makes reaches the model (with
    `reuse_identical` too), so a test can count the calls."""

    def lookup(self, request_hash: str) -> StoredAnswer | None:
        return None

    def holds(self, request_hash: str) -> bool:
        return False

    def record(self, request_hash: str, action: str, answer: StoredAnswer) -> None:
        pass


def gateway_for(model: Provider, **options: Any) -> Gateway:
    """A real gateway on which `model` answers whatever model the SOP, --model or
    $SOPCTL_MODEL names (`local` included), every call (no answer is reused)."""
    return Gateway(**{"providers": _EveryModel(model), "store": _NoReuse(), **options})


def sop(name: str) -> CompiledSop:
    return compile_path(SOPS / f"{name}.sop.yaml")


EDITOR_WRITER = """
apiVersion: sop/v1
name: editor_writer
inputs:
  idea: {required: true}
actions:
  Write:
    prompt: "Write about {{ inputs.idea }}"
    tools: [editor]
    max_steps: 4
    output:
      Summary: {type: str}
roles:
  Writer:
    actions: [Write]
    watch: [UserRequirement]
"""
"""One role whose action is a tool loop with the editor, ending with a `Summary`: the tool
tests' common SOP."""


def sop_text(text: str) -> CompiledSop:
    return compile_text(text)


def run_sop(compiled: CompiledSop, provider: Provider | Gateway, workspace: Path,
            idea: str = "an idea", **options: Any) -> Any:
    """Run to the end on `provider` (a ScriptedModel; or a gateway of the test's own),
    collecting every event in `result.events`. Options are `api.run`'s (`model=` included)."""
    from engine import api

    class Collect:
        def __init__(self) -> None:
            self.events: list[Any] = []

        def on_event(self, event: Any) -> None:
            self.events.append(event)

    sink = Collect()
    gateway = provider if isinstance(provider, Gateway) else gateway_for(provider)
    observers = [*options.pop("observers", []), sink]
    result = api.run(compiled, {"idea": idea, **options.pop("inputs", {})}, api.RunOptions(gateway=gateway,
                     workspace=workspace, observers=observers, **options))
    result.events = sink.events
    return result


def logs(result: Any, level: str | None = None) -> list[str]:
    """The RunLog lines of a run (optionally of one level)."""
    from engine.run.events import RunLog

    return [e.message for e in result.events
            if isinstance(e, RunLog) and (level is None or e.level == level)]


# --------------------------------------------------------------------------- crash runs


def sopctl_in_process(capsys: Any, *args: str) -> tuple[int, str, str]:
    """`sopctl ARGS` run in this process (exit code, stdout, stderr), what was printed
    before it left out."""
    from engine.cli.commands import main

    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def sopctl_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without any SOPCTL_ setting (no crash hook, no model
    choice, no latency unless a test gives it)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("SOPCTL_")}
    return {**base, **(extra or {})}


class ForkedSopctl:
    """`sopctl` commands as real processes, each a fork of one helper process that imported
    sopctl once: a crash test pays Python's start-up once, not once per run (most of the
    time of a small run). A child is the whole process of its command: its `os._exit(137)`
    at a crash hook leaves exactly what a kill -9 at that instant would."""

    def __init__(self) -> None:
        boot = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
                "import run_helpers; run_helpers.serve_forks()")
        self.proc = subprocess.Popen([sys.executable, "-c", boot], cwd=ROOT, env=sopctl_env(),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def __call__(self, *argv: str, env: Mapping[str, str] | None = None
                 ) -> subprocess.CompletedProcess[str]:
        """`sopctl *argv` with `env` added; its exit code (137 after a crash hook) and output."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"argv": argv, "env": dict(env or {})}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the fork server died (exit code {self.proc.wait()})")
        reply = json.loads(line)
        return subprocess.CompletedProcess(["sopctl", *argv], reply["code"], reply["stdout"],
                                           reply["stderr"])

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


CHILD_TIMEOUT_S = 120

_PRELOAD = ("engine.api", "engine.models.fake", "engine.cli.live", "engine.cli.report",
            "jsonschema", "networkx", "ruamel.yaml")
"""What a command imports on first use: imported once by the server, not once per child
(only a speed-up: a name that no longer imports is skipped)."""


def serve_forks() -> None:
    """The helper process of ForkedSopctl: one JSON job a line in, one JSON reply a line out."""
    import importlib

    from engine.cli.commands import main

    for module in _PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    for line in sys.stdin:
        job = json.loads(line)
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            pid = os.fork()
            if pid == 0:
                _forked_command(main, job, out, err)
            _, status = os.waitpid(pid, 0)
            out.seek(0)
            err.seek(0)
            reply = {"code": os.waitstatus_to_exitcode(status), "stdout": out.read(),
                     "stderr": err.read()}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


def _forked_command(main: Callable[[list[str]], int], job: dict[str, Any],
                    out: IO[str], err: IO[str]) -> None:
    """In the child: run the command with its own stdio and environment, then exit; never
    return into the server's loop. A command still running after CHILD_TIMEOUT_S is ended by
    SIGALRM (exit code -14) instead of hanging the suite."""
    code = 70
    try:
        signal.alarm(CHILD_TIMEOUT_S)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        os.environ.update(job["env"])
        code = main(list(job["argv"]))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - report it as the command's own crash would be
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def here(capsys: Any, *args: str) -> subprocess.CompletedProcess[str]:
    """`sopctl ...` in this process (where no crash hook is set), its output captured."""
    from engine.cli.commands import main

    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["sopctl", *args], code, out, err)
