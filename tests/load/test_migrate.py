"""Deprecated spellings (engine/load/migrations.py): the old form keeps working, with a located
warning; a bad value under the old key is reported at that key; both spellings are an error;
included libraries are read the same way; `rewrite_text` changes only the old tokens."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from run_helpers import SOPS, run_sop

from engine.compile.compiler import check_path, check_text, compile_path, compile_text
from engine.load.migrations import MIGRATIONS, apply_changes, find_changes, migrate, rewrite_text
from engine.load.source import load_path, load_text
from engine.testing import ScriptedModel

DEPRECATED = SOPS / "deprecated"
FIXTURES = sorted(DEPRECATED.glob("*.sop.yaml"))


def _migrated_text(path: Path) -> str:
    source = load_path(path)
    text, done, skipped = rewrite_text(source.text, find_changes(source.data, source.map))
    assert done and not skipped
    return text


def _line_of(path: Path, token: str) -> int:
    """The line where `token` is written as a key or a value (not in a comment or a name)."""
    written = re.compile(r"(^|[\s{,'\"])" + token + r"['\"]?\s*[:}]")
    lines = path.read_text(encoding="utf-8").splitlines()
    return next(i for i, line in enumerate(lines, 1) if written.search(line.split("#")[0]))


def test_every_migration_has_a_fixture_and_one_place() -> None:
    """One fixture per deprecated spelling proves the old form still works."""
    assert len({(m.where, m.old) for m in MIGRATIONS}) == len(MIGRATIONS)
    covered = {(c.migration.where, c.migration.old) for f in FIXTURES
               for c in find_changes(load_path(f).data, load_path(f).map)}
    assert covered == {(m.where, m.old) for m in MIGRATIONS}


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_old_spelling_compiles_to_the_new_one_with_a_located_warning(path: Path) -> None:
    result = check_path(path)
    assert result.ok, result.diagnostics
    warnings = [d for d in result.diagnostics if d.code == "SOP015"]
    [change] = find_changes(load_path(path).data, load_path(path).map)
    assert [(w.severity, w.file, w.line, w.pointer) for w in warnings] == [
        ("warning", str(path), _line_of(path, change.migration.old), change.pointer)]
    assert warnings[0].message == (f"`{change.old_text}` is deprecated here: write `{change.new_text}` "
                                   "(sopctl migrate FILE rewrites it)")
    new = compile_text(_migrated_text(path), str(path))
    assert new.warnings == tuple(d for d in result.diagnostics if d.code != "SOP015")
    assert result.compiled is not None and result.compiled.spec == new.spec


def test_the_warning_says_what_to_write_and_why() -> None:
    [warning] = compile_path(DEPRECATED / "exec_timeout_s.sop.yaml").warnings
    assert warning.message == ("`timeout_s` is deprecated here: write `command_timeout_s` "
                               "(sopctl migrate FILE rewrites it)")
    assert (warning.line, warning.col) == (12, 5)   # the key, as the file has it
    assert "wall-clock limit" in warning.hint and "llm.timeout_s" in warning.hint


def test_the_old_spellings_values_are_the_ones_read() -> None:
    """Each old key sets the field (none is silently dropped to its default)."""
    assert compile_path(DEPRECATED / "exec_timeout_s.sop.yaml").spec.actions["Sleep"].command_timeout_s == 0.5
    assert compile_path(DEPRECATED / "action_retries.sop.yaml").spec.actions["Count"].max_retries == 1
    planner = compile_path(DEPRECATED / "planner_task_retries.sop.yaml").spec.roles["Interpreter"].planner
    assert planner is not None and planner.max_task_retries == 0
    assert compile_path(DEPRECATED / "mcp_timeout_s.sop.yaml").spec.mcp["notes"].call_timeout_s == 5
    revise = compile_path(DEPRECATED / "revise_human_review.sop.yaml").spec.actions["Draft"].revise
    assert revise is not None and (revise.review, revise.revise) == ("human", "auto")


def _run_both(tmp_path: Path, name: str, answers: object, **options: object) -> tuple[object, object, int, int]:
    path = DEPRECATED / name
    old_model, new_model = ScriptedModel(answers), ScriptedModel(answers)  # type: ignore[arg-type]
    old = run_sop(compile_path(path), old_model, tmp_path / "old", **options)
    new = run_sop(compile_text(_migrated_text(path), str(path)), new_model, tmp_path / "new", **options)
    return old, new, old_model.calls, new_model.calls


def test_old_command_timeout_still_kills_the_command(tmp_path: Path) -> None:
    old, new, _, _ = _run_both(tmp_path, "exec_timeout_s.sop.yaml", [], allow_exec=True)
    assert [m.out["exit_code"] for m in old.messages[1:]] == [124]  # type: ignore[attr-defined]
    assert old.history == new.history  # type: ignore[attr-defined]


def test_old_retries_still_bound_the_re_asks(tmp_path: Path) -> None:
    old, new, old_calls, new_calls = _run_both(tmp_path, "action_retries.sop.yaml", lambda spec, attempt: "no json")
    assert (old.status, new.status) == ("failed", "failed")  # type: ignore[attr-defined]
    assert old_calls == new_calls == 2                        # retries: 1 (the default 2 would be 3)


def test_old_task_retries_still_bound_a_failed_task(tmp_path: Path) -> None:
    def answer(spec: object, attempt: int) -> object:
        if spec.action == "WritePlan":  # type: ignore[attr-defined]
            return {"tasks": [{"task_id": "1", "dependent_task_ids": [], "instruction": "x"}]}
        return "no json"

    old, new, old_calls, new_calls = _run_both(tmp_path, "planner_task_retries.sop.yaml", answer)
    assert (old.status, new.status) == ("failed", "failed")  # type: ignore[attr-defined]
    assert old_calls == new_calls == 1 + 3   # the plan, then one run of the task (3 attempts), no retry


# ----------------------------------------------------------------------------- the loader


ACTION = """apiVersion: sop/v1
name: x
actions:
  Run:
    kind: exec
    command: [make]
{keys}    send_to: ["<none>"]
roles:
  R: {{actions: [Run], watch: [UserRequirement]}}
"""


def test_a_bad_value_under_the_old_key_is_reported_at_its_line() -> None:
    result = check_text(ACTION.format(keys="    timeout_s: -3\n"), "x.sop.yaml")
    codes = [(d.code, d.line, d.col) for d in result.diagnostics]
    assert codes == [("SOP015", 7, 5), ("SOP105", 7, 16)]
    assert result.diagnostics[1].pointer == "/actions/Run/command_timeout_s"


def test_both_spellings_in_one_mapping_are_an_error() -> None:
    result = check_text(ACTION.format(keys="    command_timeout_s: 5\n    timeout_s: 9\n"), "x.sop.yaml")
    [error] = result.diagnostics
    assert (error.code, error.severity, error.line, error.col) == ("SOP016", "error", 8, 5)
    assert error.message == "both `timeout_s` (deprecated) and `command_timeout_s` in one action"
    assert [(r.message, r.line) for r in error.related] == [("`command_timeout_s` is here", 7)]


def test_human_review_without_a_persons_review_is_an_error_not_a_silent_auto() -> None:
    text = ("apiVersion: sop/v1\nname: x\nactions:\n  D:\n    prompt: p\n    output: {T: {type: str}}\n"
            "    revise: {revise: human_review}\nroles:\n  R: {actions: [D], watch: [UserRequirement]}\n")
    [error] = check_text(text).diagnostics
    assert (error.code, error.line, error.pointer) == ("SOP218", 7, "/actions/D/revise/revise")
    assert "review: human" in error.hint


def test_the_renamed_key_keeps_its_place_and_its_positions() -> None:
    text = ACTION.format(keys="    timeout_s: 30\n    env: [HOME]\n")
    source = migrate(load_text(text))
    assert list(source.data["actions"]["Run"]) == ["kind", "command", "command_timeout_s", "env", "send_to"]
    assert source.map.keys["/actions/Run/command_timeout_s"] == (7, 5)
    assert source.map.values["/actions/Run/command_timeout_s"] == (7, 16)
    assert "/actions/Run/timeout_s" not in source.map.keys


def test_a_file_without_old_spellings_is_returned_as_it_is() -> None:
    source = load_path(SOPS / "exec.sop.yaml")
    assert migrate(source) is source


def test_llm_timeout_keeps_its_name() -> None:
    text = ("apiVersion: sop/v1\nname: x\nllm: {timeout_s: 30}\nactions:\n  A: {prompt: p, llm: {timeout_s: 5}}\n"
            "roles:\n  R: {actions: [A], watch: [UserRequirement], llm: {timeout_s: 9}}\n")
    assert check_text(text).diagnostics == ()


def test_an_old_timeout_on_an_llm_action_is_a_key_of_another_kind() -> None:
    text = ("apiVersion: sop/v1\nname: x\nactions:\n  A: {prompt: p, timeout_s: 5}\n"
            "roles:\n  R: {actions: [A], watch: [UserRequirement]}\n")
    found = check_text(text).diagnostics
    assert [d.code for d in found] == ["SOP015", "SOP110"]
    assert "belongs to actions of kind exec" in found[1].message and found[1].line == 4


# ----------------------------------------------------------------------------- includes


def _library(tmp_path: Path, action: str) -> Path:
    (tmp_path / "lib.sop.yaml").write_text(f"apiVersion: sop/v1\nactions:\n  Shared:\n{action}", encoding="utf-8")
    main = tmp_path / "main.sop.yaml"
    main.write_text("apiVersion: sop/v1\nname: x\ninclude: [lib.sop.yaml]\n"
                    "roles:\n  R: {actions: [Shared], watch: [UserRequirement]}\n", encoding="utf-8")
    return main


def test_an_included_librarys_old_spelling_is_a_warning_located_in_the_library(tmp_path: Path) -> None:
    main = _library(tmp_path, "    prompt: p\n    retries: 1\n")
    result = check_path(main)
    [warning] = result.diagnostics
    assert (warning.code, Path(warning.file).name, warning.line, warning.col) == ("SOP015", "lib.sop.yaml", 5, 5)
    assert result.compiled is not None and result.compiled.spec.actions["Shared"].max_retries == 1


def test_an_included_library_with_both_spellings_is_refused_there(tmp_path: Path) -> None:
    main = _library(tmp_path, "    prompt: p\n    retries: 1\n    max_retries: 2\n")
    [error] = check_path(main).diagnostics
    assert (error.code, Path(error.file).name, error.line) == ("SOP016", "lib.sop.yaml", 5)
    assert [r.message for r in error.related][-1] == "included from here"


# ----------------------------------------------------------------------------- rewriting text


def _rewrite(text: str) -> tuple[str, list, list]:
    source = load_text(text)
    return rewrite_text(source.text, find_changes(source.data, source.map))


def test_rewrite_changes_only_the_tokens() -> None:
    text = ("apiVersion: sop/v1  # c0\nname: x\nactions:\n  A:\n    prompt: 'p'   # kept\n"
            "    \"retries\": 3     # aligned comment\n    revise: {review: human, revise: \"human_review\"}\n"
            "    output: {T: {type: str}}\n  B: {kind: exec, command: [make], 'timeout_s': 2}\n"
            "mcp:\n  m: {url: 'http://h/mcp', timeout_s: 1}\nroles:\n  R:\n    actions: [A, B]\n"
            "    planner: {action: A, task_action: B,\n              task_retries: 1}\n")
    new, done, skipped = _rewrite(text)
    assert skipped == [] and len(done) == 5
    assert new == (text.replace('"retries"', '"max_retries"').replace('"human_review"', '"auto"')
                   .replace("'timeout_s'", "'command_timeout_s'").replace("timeout_s: 1}", "call_timeout_s: 1}")
                   .replace("task_retries", "max_task_retries"))
    assert _rewrite(new)[1] == []   # a second pass finds nothing


def test_rewrite_keeps_crlf_line_ends() -> None:
    text = "apiVersion: sop/v1\r\nname: x\r\nactions:\r\n  A:\r\n    prompt: p\r\n    retries: 1\r\n"
    assert _rewrite(text)[0] == text.replace("retries", "max_retries")


def test_rewrite_skips_what_it_cannot_decide() -> None:
    both, done, skipped = _rewrite("apiVersion: sop/v1\nactions:\n  A: {retries: 1, max_retries: 2}\n")
    assert done == [] and [c.conflict for c in skipped] == [(3, 19)] and "retries: 1," in both
    escaped = 'apiVersion: sop/v1\nactions:\n  A: {"retr\\x69es": 1}\n'
    new, done, skipped = _rewrite(escaped)
    assert (new, done, len(skipped)) == (escaped, [], 1)


def test_an_alias_copy_shares_its_token() -> None:
    text = "apiVersion: sop/v1\nactions:\n  A: &a {prompt: p, retries: 1}\n  B: *a\n"
    new, done, _ = _rewrite(text)
    assert len(done) == 2 and new == text.replace("retries", "max_retries")


def test_apply_changes_is_what_the_rewritten_text_loads_as() -> None:
    text = ACTION.format(keys="    timeout_s: 30\n")
    source = load_text(text)
    changes = find_changes(source.data, source.map)
    assert load_text(rewrite_text(text, changes)[0]).data == apply_changes(source.data, changes)
    assert "timeout_s" in source.data["actions"]["Run"]   # the loaded data is left as it was
