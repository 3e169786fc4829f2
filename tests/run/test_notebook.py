"""The notebook: one Jupyter kernel per role whose state lasts across cells
(engine/run/tools/notebook.py)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from run_helpers import run_sop, sop_text

from engine.errors import RunError
from engine.models.types import CallSpec
from engine.run.events import ToolCalled
from engine.testing import ScriptedModel, use_model

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("jupyter_client") is None or importlib.util.find_spec("ipykernel") is None,
    reason="the notebook extra (jupyter_client, ipykernel) is not installed")

NOTEBOOK = """
apiVersion: sop/v1
name: notebook_test
inputs:
  idea: {required: true}
actions:
  Analyze:
    prompt: "Analyze {{ inputs.idea }}"
    tools: [notebook]
    max_steps: 8
roles:
  Analyst:
    actions: [Analyze]
    watch: [UserRequirement]
"""


def cell(code: str, timeout_s: float | None = None) -> dict[str, Any]:
    args: dict[str, Any] = {"code": code}
    if timeout_s is not None:
        args["timeout_s"] = timeout_s
    return {"thought": "next", "commands": [{"command_name": "notebook.run", "args": args}]}


END = {"thought": "done", "commands": [{"command_name": "end", "args": {"answer": "analysed"}}]}


def cells(result: Any) -> list[ToolCalled]:
    return [e for e in result.events if isinstance(e, ToolCalled) and e.tool == "notebook.run"]


def run(tmp_path: Path, *answers: dict[str, Any], **options: Any) -> Any:
    result = run_sop(sop_text(NOTEBOOK), ScriptedModel([*answers, END]), tmp_path / "ws",
                     allow_exec=True, **options)
    assert result.status == "idle", result.error
    return result


def test_state_lasts_across_cells(tmp_path: Path) -> None:
    result = run(tmp_path, cell("import math\nx = 41\ndef twice(v):\n    return 2 * v"),
                 cell("print('x is', x)\ntwice(math.floor(x + 0.5))"), cell("import os; os.getcwd()"))
    first, second, where = (e.output for e in cells(result))
    assert first == "[cell: ok]\n[output]\n"
    assert second == "[cell: ok]\n[output]\nx is 41\n82\n"   # what it printed, then its value
    assert f"'{tmp_path / 'ws'}'" in where


def test_an_error_cell_fails_with_a_short_traceback_and_the_state_stays(tmp_path: Path) -> None:
    result = run(tmp_path, cell("x = 1"), cell("def f():\n    return 1 / 0\nf()"), cell("x + 1"))
    _, failed, after = cells(result)
    assert failed.error and failed.output.startswith("[cell: error]\n")
    assert "[error]\nZeroDivisionError: division by zero\nTraceback (last lines):" in failed.output
    assert "----> 2     return 1 / 0" in failed.output and "\x1b[" not in failed.output
    assert not after.error and after.output.endswith("\n2\n")


PNG = """
import struct, zlib
from IPython.display import Image, display
def chunk(kind, data):
    return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data))
raw = b''.join(b'\\x00' + b'\\xff\\x00\\x00' * 4 for _ in range(4))
png = (b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 4, 4, 8, 2, 0, 0, 0))
       + chunk(b'IDAT', zlib.compress(raw)) + chunk(b'IEND', b''))
display(Image(data=png))
print('drawn')
"""


def test_an_image_is_saved_as_a_file_in_the_workspace(tmp_path: Path) -> None:
    result = run(tmp_path, cell(PNG))
    output = cells(result)[0].output
    found = re.search(r"\[image\] (notebook/[0-9a-f]+-1\.png) \((\d+) bytes\)", output)
    assert found is not None, output
    saved = tmp_path / "ws" / found.group(1)
    assert saved.read_bytes().startswith(b"\x89PNG") and saved.stat().st_size == int(found.group(2))
    assert "drawn" in output and "image/png" not in output   # no base64 in the model's text


def test_a_timeout_interrupts_the_kernel_and_keeps_its_state(tmp_path: Path) -> None:
    result = run(tmp_path, cell("x = 'kept'"), cell("import time\ntime.sleep(30)", timeout_s=0.5), cell("x"))
    _, timed_out, after = (e.output for e in cells(result))
    assert timed_out.startswith("[cell: timeout]")
    assert "timed out after 0.5 s: the kernel was interrupted; it is kept, with its variables" in timed_out
    assert after.endswith("'kept'\n")


def test_output_is_bounded_and_the_cut_is_told(tmp_path: Path) -> None:
    result = run(tmp_path, cell("for i in range(5000):\n    print(i)"))
    output = cells(result)[0].output
    assert "characters cut here" in output and "\n4999\n" in output and output.startswith("[cell: ok]\n[output]\n0\n1\n")
    assert len(output) < 7000


def test_the_notebook_needs_allow_exec_before_any_model_call(tmp_path: Path) -> None:
    from engine.check.diagnostics import needs_lines

    model = ScriptedModel([END])
    with pytest.raises(RunError, match=r"need --allow-exec: notebook \(Analyze\)"):
        run_sop(sop_text(NOTEBOOK), model, tmp_path / "ws")
    assert model.calls == 0
    assert needs_lines("nb.sop.yaml", sop_text(NOTEBOOK)) == ["nb.sop.yaml: needs --allow-exec: notebook (Analyze)"]


def test_a_missing_extra_is_told_with_the_install_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.check.diagnostics import needs_lines

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ipykernel" else real(name, *a))
    assert needs_lines("nb.sop.yaml", sop_text(NOTEBOOK))[1] == (
        "nb.sop.yaml: needs the `notebook` extra, not installed here (pip install -e '.[notebook]' in the sopctl clone): "
        "notebook (Analyze)")
    model = ScriptedModel([END])
    with pytest.raises(RunError, match=r"need the `notebook` extra, which is not installed: notebook \(Analyze\)"
                       ) as raised:
        run_sop(sop_text(NOTEBOOK), model, tmp_path / "ws", allow_exec=True)
    assert raised.value.hint == "pip install -e '.[notebook]' in the sopctl clone" and model.calls == 0


def test_validate_does_not_import_the_notebook_extra(tmp_path: Path) -> None:
    sop_file = tmp_path / "nb.sop.yaml"
    sop_file.write_text(NOTEBOOK, encoding="utf-8")
    probe = ("import sys\nfrom engine.cli import main\n"
             f"code = main(['validate', {str(sop_file)!r}])\n"
             "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('jupyter_client', 'ipykernel', 'zmq', 'asyncio'))\n"
             "print('HEAVY', heavy, code)\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False)
    assert result.stdout.strip().endswith("HEAVY [] 0"), result.stdout + result.stderr
    assert "needs --allow-exec: notebook (Analyze)" in result.stdout


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def test_the_kernel_is_gone_after_the_run(tmp_path: Path) -> None:
    result = run(tmp_path, cell("import os, subprocess\nchild = subprocess.Popen(['sleep', '300'])\n"
                                "print(os.getpid(), child.pid)"), isolate=False)   # host pids
    pids = [int(p) for p in cells(result)[0].output.split("\n")[2].split()]
    assert len(pids) == 2 and not [pid for pid in pids if _alive(pid)]


def test_two_roles_have_two_kernels(tmp_path: Path) -> None:
    two = NOTEBOOK + "  Second:\n    actions: [Analyze]\n    watch: [UserRequirement]\n"
    script = {"Analyst": [cell("who = 'analyst'"), cell("who"), END],
              "Second": [cell("who = 'second'"), cell("who"), END]}

    def answer(spec: CallSpec, attempt: int) -> Any:
        return script[spec.role].pop(0)
    result = run_sop(sop_text(two), ScriptedModel(answer), tmp_path / "ws", allow_exec=True)
    assert result.status == "idle", result.error
    seen = {e.role: e.output for e in cells(result) if e.step == 2}
    assert seen == {"Analyst": "[cell: ok]\n[output]\n'analyst'\n", "Second": "[cell: ok]\n[output]\n'second'\n"}


def _bwrap_works() -> bool:
    from engine.run.isolation import find_sandbox

    try:
        find_sandbox(allow_network=False)
    except RunError:
        return False
    return True


@pytest.mark.skipif(not _bwrap_works(), reason="bwrap missing or cannot create namespaces here")
def test_under_isolate_the_kernel_runs_in_the_sandbox(tmp_path: Path) -> None:
    result = run(tmp_path, cell("import os\nx = len([p for p in os.listdir('/proc') if p.isdigit()])"),
                 cell("open('inside.txt', 'w').write('ok')\ntry:\n    open('/etc/sopctl-probe', 'w')\n"
                      "except OSError as exc:\n    print(type(exc).__name__)\nx < 10"), isolate=True)
    assert cells(result)[1].output == "[cell: ok]\n[output]\nOSError\nTrue\n"
    assert (tmp_path / "ws" / "inside.txt").read_text() == "ok"


def test_after_a_crash_the_restarted_kernel_says_so(tmp_path: Path) -> None:
    from engine import api

    first = [cell("x = 'lost'"), cell("x")]
    asked: list[str] = []

    def crash_at_the_third_call(spec: CallSpec, attempt: int) -> Any:
        asked.append(spec.action)
        if len(asked) == 3:
            raise KeyboardInterrupt   # sopctl dies before the model's third answer
        return first[len(asked) - 1]
    sop_file = tmp_path / "nb.sop.yaml"
    sop_file.write_text(NOTEBOOK, encoding="utf-8")
    with use_model(ScriptedModel(crash_at_the_third_call)), pytest.raises(KeyboardInterrupt):
        api.run(api.load(sop_file), {"idea": "x"}, api.RunOptions(workspace=tmp_path / "ws", allow_exec=True))
    events: list[Any] = []

    class Sink:
        def on_event(self, event: Any) -> None:
            events.append(event)
    with use_model(ScriptedModel([cell("'x' in globals()"), END])):
        resumed = api.resume(tmp_path / "ws", api.ResumeOptions(allow_exec=True, observers=[Sink()]))
    assert resumed.status == "idle", resumed.error
    runs = [e for e in events if isinstance(e, ToolCalled) and e.tool == "notebook.run"]
    assert [e.reused for e in runs] == [True, True, False]
    assert runs[2].output.startswith("[sopctl: the kernel was restarted: sopctl stopped since your earlier cells")
    assert runs[2].output.endswith("False\n")
