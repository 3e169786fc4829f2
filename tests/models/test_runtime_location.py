"""A failure at run time names its place in the SOP file, as the checker's diagnostics do.

A template that fails while running, an artifact the workspace refuses, a command that cannot
start: the run's error is `file:line:col: error[SOP5xx]: action X failed: ...` (result,
journal, `sopctl show`) and `sopctl run` prints the offending line with a caret on stderr.
Each SOP below is small and written inline; the expected position is found in its text, so
the tests say *which* line is blamed, not a number that drifts with the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine import api
from engine.compile.compiler import compile_path
from engine.cli.commands import main
from engine.models.gateway import Gateway
from engine.models.types import ModelAnswer, ModelRequest

HEAD = """\
apiVersion: sop/v1
name: located
inputs:
  idea: {type: str, required: true}
  dir: {type: str, default: docs}
actions:
"""

ROLES = """\
roles:
  Writer:
    actions: [Write]
    watch: [UserRequirement]
"""

PROMPT_FAILS = HEAD + """\
  Write:
    prompt: |
      Write about {{ inputs.idea }}.
      The fifth news is {{ news[5].content }}.
    context: none
    output: text
    send_to: ["<none>"]
""" + ROLES

CONTENT_TOO_LARGE = HEAD + """\
  Write:
    prompt: "Write about {{ inputs.idea }}."
    output: text
    artifacts:
      - path: notes.md
        content: |
          # Notes
          {{ 'x' * 100000000 }}
""" + ROLES

PATH_REFUSED = HEAD + """\
  Write:
    prompt: "Write about {{ inputs.idea }}."
    output: text
    artifacts:
      - path: "{{ inputs.dir }}/notes.md"
        content: "{{ out }}"
""" + ROLES

EXEC_MISSING = HEAD + """\
  Write:
    kind: exec
    command:
      - no-such-program-sopctl
      - "{{ inputs.idea }}"
    send_to: ["<none>"]
""" + ROLES

EXEC_ITEM_FAILS = EXEC_MISSING.replace('"{{ inputs.idea }}"', '"{{ news[3].content }}"')

FOR_EACH_NOT_A_LIST = HEAD + """\
  Write:
    prompt: "Write about {{ item }}."
    for_each: "{{ inputs.idea }}"
    output: text
    send_to: ["<none>"]
""" + ROLES

NEVER_VALID = HEAD + """\
  Write:
    prompt: "Write about {{ inputs.idea }}."
    retries: 1
    output:
      Title: {type: str}
    send_to: ["<none>"]
""" + ROLES


def _position(text: str, needle: str, template_line: bool = False) -> tuple[int, int]:
    """1-based line:col of `needle` in `text`; a template line is blamed at its first character."""
    lines = text.splitlines()
    number = next(i for i, line in enumerate(lines) if needle in line)
    line = lines[number]
    col = len(line) - len(line.lstrip()) if template_line else line.index(needle)
    return number + 1, col + 1


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "located.sop.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _run(tmp_path: Path, text: str, inputs: dict[str, Any] | None = None, **options: Any) -> api.RunResult:
    path = _write(tmp_path, text)
    options.setdefault("model", "fake")
    return api.run(compile_path(path), {"idea": "x", **(inputs or {})},
                   workspace=tmp_path / "ws", **options)


def _assert_located(result: api.RunResult, path: Path, code: str, pointer: str,
                    where: tuple[int, int]) -> None:
    line, col = where
    assert result.status == "failed"
    assert result.error.startswith(f"{path}:{line}:{col}: error[{code}]: action Write failed: ")
    diagnostic = result.diagnostic
    assert diagnostic is not None
    assert (diagnostic.file, diagnostic.line, diagnostic.col) == (str(path), line, col)
    assert (diagnostic.code, diagnostic.pointer) == (code, pointer)


# --- the API: RunResult.error and RunResult.diagnostic ------------------------------------------

def test_prompt_failing_at_run_time_names_its_template_line(tmp_path: Path) -> None:
    result = _run(tmp_path, PROMPT_FAILS)
    _assert_located(result, tmp_path / "located.sop.yaml", "SOP501", "/actions/Write/prompt",
                    _position(PROMPT_FAILS, "news[5]", template_line=True))
    assert "list object has no element 5" in result.error


def test_artifact_content_over_the_output_limit_names_its_line(tmp_path: Path) -> None:
    result = _run(tmp_path, CONTENT_TOO_LARGE)
    _assert_located(result, tmp_path / "located.sop.yaml", "SOP501",
                    "/actions/Write/artifacts/0/content",
                    _position(CONTENT_TOO_LARGE, "100000000", template_line=True))
    assert "output limit" in result.error


def test_artifact_path_refused_by_the_workspace_names_the_path(tmp_path: Path) -> None:
    result = _run(tmp_path, PATH_REFUSED, {"dir": "../outside"})
    _assert_located(result, tmp_path / "located.sop.yaml", "SOP502",
                    "/actions/Write/artifacts/0/path", _position(PATH_REFUSED, '"{{ inputs.dir }}'))
    assert "'../outside/notes.md' contains '..'" in result.error
    assert not (tmp_path / "outside").exists()


def test_exec_that_cannot_start_names_the_program(tmp_path: Path) -> None:
    result = _run(tmp_path, EXEC_MISSING, allow_exec=True)
    _assert_located(result, tmp_path / "located.sop.yaml", "SOP503", "/actions/Write/command/0",
                    _position(EXEC_MISSING, "no-such-program-sopctl"))
    assert "cannot start 'no-such-program-sopctl'" in result.error


def test_exec_command_item_failing_names_that_item(tmp_path: Path) -> None:
    result = _run(tmp_path, EXEC_ITEM_FAILS, allow_exec=True)
    _assert_located(result, tmp_path / "located.sop.yaml", "SOP501", "/actions/Write/command/1",
                    _position(EXEC_ITEM_FAILS, '"{{ news[3]'))


def test_for_each_that_gives_no_list_names_the_expression(tmp_path: Path) -> None:
    result = _run(tmp_path, FOR_EACH_NOT_A_LIST)
    _assert_located(result, tmp_path / "located.sop.yaml", "SOP504", "/actions/Write/for_each",
                    _position(FOR_EACH_NOT_A_LIST, '"{{ inputs.idea }}"'))
    assert result.diagnostic is not None and "msgs.X[-1]" in result.diagnostic.hint


class _NeverJson:
    def supports_schema(self, model: str) -> bool:
        return False

    async def complete(self, request: ModelRequest) -> ModelAnswer:
        return ModelAnswer(text="no json here")


def test_answers_that_never_fit_name_the_declared_output(tmp_path: Path) -> None:
    gateway = Gateway(providers={"never": _NeverJson()})
    result = _run(tmp_path, NEVER_VALID, model="never", gateway=gateway)
    _assert_located(result, tmp_path / "located.sop.yaml", "SOP505", "/actions/Write/output",
                    _position(NEVER_VALID, "output:"))
    assert "no valid answer from model 'never' after 2 attempt(s)" in result.error


def test_a_compiled_sop_without_its_source_reports_the_message_alone(tmp_path: Path) -> None:
    from dataclasses import replace

    compiled = replace(compile_path(_write(tmp_path, PROMPT_FAILS)), source=None)
    result = api.run(compiled, {"idea": "x"}, model="fake", workspace=tmp_path / "ws")
    assert result.status == "failed" and result.diagnostic is None
    assert result.error.startswith("action Write failed: prompt template")


# --- the command line: exit code, the excerpt, the journal -------------------------------------

def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_prints_the_failure_as_the_checker_does(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, PROMPT_FAILS)
    line, col = _position(PROMPT_FAILS, "news[5]", template_line=True)
    code, out, err = _cli(capsys, "run", str(path), "--idea", "x", "--model", "fake",
                          "--out", str(tmp_path / "ws"))
    assert code == 1
    header = f"{path}:{line}:{col}: error[SOP501]: action Write failed: prompt template"
    assert header in err and header in out  # the block on stderr, the summary's status line
    assert f"{line} |       The fifth news is {{{{ news[5].content }}}}." in err
    assert "|       ^" in err and "at /actions/Write/prompt" in err
    assert "Traceback" not in err


def test_cli_json_error_and_show_carry_the_location(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, EXEC_MISSING)
    line, col = _position(EXEC_MISSING, "no-such-program-sopctl")
    code, out, err = _cli(capsys, "run", str(path), "--idea", "x", "--model", "fake", "--allow-exec",
                          "--out", str(tmp_path / "ws"), "--format", "json")
    located = f"{path}:{line}:{col}: error[SOP503]: action Write failed: cannot start"
    assert code == 1 and json.loads(out)["error"].startswith(located)
    assert "      - no-such-program-sopctl" in err
    code, out, _ = _cli(capsys, "show", str(tmp_path / "ws"))
    assert code == 0 and located in out
    code, out, _ = _cli(capsys, "show", str(tmp_path / "ws"), "--format", "json")
    assert json.loads(out)["error"].startswith(located)


def test_cli_prints_a_failure_hint_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from engine.testing import ScriptedModel, use_model

    path = _write(tmp_path, NEVER_VALID)
    with use_model(ScriptedModel(lambda spec, attempt: "no json here"), name="never"):
        code, out, err = _cli(capsys, "run", str(path), "--idea", "x", "--model", "never",
                              "--out", str(tmp_path / "ws"))
    assert code == 1 and "no valid answer from model 'never'" in out
    hint = "hint: raise the action's `retries`"
    assert (out + err).count(hint) == 1, out + err
