"""`sopctl validate`, `graph` and `schema` as a user runs them: output, formats, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.cli.commands import main

from run_helpers import ROOT, TESTS

CASES = TESTS / "cases"
VALID = str(CASES / "valid" / "company.sop.yaml")
ERROR = str(CASES / "invalid" / "bad_enum.sop.yaml")
WARNING = str(CASES / "invalid" / "unreachable_role.sop.yaml")


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_valid_file(capsys) -> None:
    code, out, _ = _run(capsys, "validate", VALID)
    # its exec action is named on the needs line (what --allow-exec unlocks)
    assert (code, out.strip()) == (0, f"{VALID}: ok\n{VALID}: needs --allow-exec: exec (RunTests)")


def test_error_is_rendered_compiler_style(capsys) -> None:
    code, out, _ = _run(capsys, "validate", ERROR)
    assert code == 1
    assert f"{ERROR}:13:17: error[SOP102]: 'by_orderr' is not one of" in out
    assert "    13 |     react_mode: by_orderr\n       |                 ^" in out
    assert "  at /roles/Writer/react_mode\n  hint: did you mean 'by_order'?" in out


def test_warnings_exit_0_unless_strict(capsys) -> None:
    code, out, _ = _run(capsys, "validate", WARNING)
    assert code == 0 and "warning[SOP302]" in out
    code, out, _ = _run(capsys, "validate", "--strict", WARNING)
    assert code == 1 and "error[SOP302]" in out


def test_several_files_and_json(capsys) -> None:
    code, out, _ = _run(capsys, "validate", "--format", "json", VALID, ERROR, WARNING)
    data = json.loads(out)
    assert code == 1
    assert (data["ok"], data["errors"], data["warnings"]) == (False, 1, 1)
    assert [f["ok"] for f in data["files"]] == [True, False, True]
    first = data["diagnostics"][0]
    assert set(first) == {"code", "severity", "message", "pointer", "hint", "file", "line", "col", "related"}


@pytest.mark.parametrize("name,code", [("directory.sop.yaml", "SOP001"), ("empty.sop.yaml", "SOP004"),
                                       ("binary.sop.yaml", "SOP003")])
def test_unusable_files_are_diagnostics(capsys, name: str, code: str) -> None:
    status, out, err = _run(capsys, "validate", str(CASES / "invalid" / name))
    assert status == 1 and f"error[{code}]" in out and "Traceback" not in out + err


def test_missing_file(capsys, tmp_path: Path) -> None:
    status, out, _ = _run(capsys, "validate", str(tmp_path / "nope.sop.yaml"))
    assert status == 1 and "error[SOP001]: no such file" in out


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    """A named pipe no one writes to: reading it would block forever. A real process, so a
    regression fails on the timeout instead of hanging the suite."""
    fifo = tmp_path / "pipe.sop.yaml"
    os.mkfifo(fifo)
    for command in (["validate", str(fifo)], ["run", str(fifo), "--model", "fake", "--out",
                                                str(tmp_path / "ws")]):
        result = subprocess.run([sys.executable, "-m", "engine.cli", *command], capture_output=True,
                                text=True, timeout=60, check=False, cwd=tmp_path,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
        text = result.stdout + result.stderr
        assert "error[SOP001]: is a FIFO (named pipe), not an SOP file" in text, text
        assert result.returncode == (1 if command[0] == "validate" else 2)
        assert "Traceback" not in text


def test_devices_are_refused(capsys, tmp_path: Path) -> None:
    status, out, _ = _run(capsys, "validate", os.devnull)
    assert status == 1 and "error[SOP001]: is a character device, not an SOP file" in out


def test_usage_errors_exit_2(capsys) -> None:
    for argv in (["validate"], ["validate", "--format", "xml", VALID], ["graph", VALID, "--format", "png"]):
        with pytest.raises(SystemExit) as caught:
            main(argv)
        assert caught.value.code == 2


def test_graph_formats(capsys) -> None:
    code, out, _ = _run(capsys, "graph", VALID)
    assert code == 0 and out.startswith("flowchart LR")
    code, out, _ = _run(capsys, "graph", VALID, "--format", "dot")
    assert code == 0 and out.startswith("digraph")
    code, out, _ = _run(capsys, "graph", VALID, "--format", "json")
    assert code == 0 and json.loads(out)["cycles"]


def test_graph_of_a_bad_file(capsys) -> None:
    code, out, err = _run(capsys, "graph", ERROR)
    assert code == 1 and out == "" and "error[SOP102]" in err


def test_schema_prints_the_schema(capsys) -> None:
    code, out, _ = _run(capsys, "schema")
    assert code == 0
    shipped = (ROOT / "schemas" / "sop.schema.json").read_text(encoding="utf-8")
    assert json.loads(out) == json.loads(shipped)


def test_validate_never_imports_litellm_rich_or_asyncio() -> None:
    """`sopctl validate` must stay lean: the LLM stack is never loaded to check a file."""
    researcher = str(ROOT / "examples" / "researcher.sop.yaml")  # MCP
    search = str(ROOT / "examples" / "search_qa.sop.yaml")       # a search endpoint
    probe = ("import sys\nfrom engine.cli import main\n"
             f"code = main(['validate', {VALID!r}, {ERROR!r}, {researcher!r}, {search!r}])\n"
             "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('litellm', 'rich', 'openai', 'httpx', 'mcp', 'asyncio', 'playwright'))\n"
             "print('HEAVY', heavy, code)\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False)
    assert result.stdout.strip().endswith("HEAVY [] 1"), result.stdout + result.stderr


def test_console_script_end_to_end() -> None:
    exe = Path(sys.executable).with_name("sopctl")
    if not exe.exists():
        pytest.skip("sopctl console script not installed in this environment")
    result = subprocess.run([str(exe), "validate", ERROR], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 1 and "error[SOP102]" in result.stdout


def test_graph_is_drawn_for_an_unbounded_loop(capsys) -> None:
    code, out, err = _run(capsys, "graph", str(CASES / "invalid" / "unbounded_cycle.sop.yaml"), "--format", "json")
    data = json.loads(out)
    assert code == 1 and "error[SOP301]" in err
    assert [c["bounded"] for c in data["cycles"]] == [False]
