"""docs/security.md's table of limits says what the code does: every number in it is checked
against the constant it names, and every row of the table is checked (a new row needs its
check here)."""

from __future__ import annotations

from pathlib import Path

from engine.batch import rows
from engine.cli import commands
from engine.load import catalog, includes, source, spec
from engine.models import answers, openai_http
from engine.run import actions, exec as exec_runner, inputs, mcp, toolloop, workspace
from engine.run.tools import base, editor, search
from engine.templates import render, sandbox

DOC = Path(__file__).resolve().parent.parent / "docs" / "security.md"


def n(value: float) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


EXPECTED: dict[str, list[str]] = {
    "an SOP file (and each `include`)": [
        f"{n(source.MAX_FILE_BYTES)} bytes", f"nesting {source.MAX_DEPTH}", f"{source.MAX_ALIASES} aliases",
        f"{n(source.MAX_EXPANDED_NODES)} expanded nodes", f"{includes.MAX_INCLUDED_FILES} included files"],
    "one template step": [f"{n(sandbox.MAX_RENDERED_CHARS)} characters or items"],
    "a template render": [f"{n(render.MAX_RENDER_CPU_S)} s of CPU",
                          f"{render.MAX_RENDER_MEMORY // 2**20} MiB of memory growth"],
    "`range()` in a template; an integer": [f"{n(sandbox._MAX_REPEAT)} items",
                                            f"{n(sandbox._MAX_INT_BITS)} bits"],
    "a `for_each` fan-out": [f"{n(actions.MAX_FOR_EACH_ITEMS)} items"],
    "`--input KEY=@FILE`, `answer --file`, `answer --json`": [
        f"{n(inputs.INPUT_FILE_LIMIT)} bytes", f"nested {answers.MAX_ANSWER_DEPTH} deep"],
    "a `batch --inputs` line": [f"{n(rows.MAX_ROW_CHARS)} characters"],
    "an `experience` file": [f"{n(catalog.MAX_EXPERIENCE_BYTES)} bytes"],
    "a model's answer": [f"{n(answers.MAX_ANSWER_CHARS)} characters",
                         f"nested {answers.MAX_ANSWER_DEPTH} deep"],
    "an answer's HTTP body (OpenAI-compatible servers)": [f"{openai_http.MAX_BODY_BYTES // 2**20} MiB"],
    "a tool step": [f"{toolloop.MAX_COMMANDS} commands", f"{n(base.MAX_OUTPUT_CHARS)} characters per output",
                    f"{n(toolloop.MAX_STEP_OUTPUT_CHARS)} per step"],
    "`editor`": [f"writes {n(catalog.MAX_WRITE_BYTES)} bytes", f"reads {n(editor.MAX_READ_BYTES)}"],
    "an artifact path": [f"{workspace.MAX_PATH_CHARS} characters", f"{workspace.MAX_NAME_BYTES} bytes a name"],
    "an exec command's stdout and stderr": [f"{exec_runner.MAX_STREAM_BYTES // 1024} KiB"],
    "a `search` answer": [f"{n(search.MAX_RESPONSE_BYTES)} bytes"],
    "an MCP server's start (starting, `initialize`, listing its tools)": [
        f"{n(spec.McpServerSpec.model_fields['start_timeout_s'].default)} s"],
    "what an MCP server offers an action": [f"{mcp.MAX_SERVER_TOOLS} tools",
                                            f"a description {n(mcp.MAX_TOOL_DESCRIPTION_CHARS)} characters",
                                            f"an input schema {n(mcp.MAX_TOOL_SCHEMA_CHARS)} characters"],
    "a budget": ["one call past it"],
    "a kill -9": ["the model calls in flight"],
}
"""Each row of the table by its first cell: what its value cell must say."""


def table_rows() -> dict[str, list[str]]:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## What is bounded, by how much", 1)[1].split("\n## ", 1)[0]
    found: dict[str, list[str]] = {}
    for line in section.splitlines():
        if line.startswith("| ") and not line.startswith("| limit |"):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            found[cells[0]] = cells[1:]
    return found


def test_every_row_of_the_limits_table_is_checked() -> None:
    assert set(table_rows()) == set(EXPECTED)


def test_the_limits_table_matches_the_code() -> None:
    found = table_rows()
    for label, phrases in EXPECTED.items():
        value = found[label][0]
        for phrase in phrases:
            assert phrase in value, f"{label}: the table says {value!r}, the code {phrase!r}"


def test_the_defaults_the_table_names_are_the_codes() -> None:
    section = DOC.read_text(encoding="utf-8")
    assert f"`max_concurrency` (default {spec.ActionBase.model_fields['max_concurrency'].default})" in section
    default_timeout = spec.ExecAction.model_fields["command_timeout_s"].default
    assert f"`command_timeout_s` (default {n(default_timeout)} s)" in section
    assert commands.ANSWER_FILE_LIMIT == inputs.INPUT_FILE_LIMIT      # one row says both
