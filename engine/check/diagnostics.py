"""Diagnostics for people (compiler-style text) and for tools (JSON).

Text follows the shape users know from compilers::

    sops/review.sop.yaml:5:17: error[SOP102]: 'by_orderr' is not one of 'react', ...
        5 |     react_mode: by_orderr
          |                 ^
      at /roles/Reviewer/react_mode
      hint: did you mean 'by_order'?

JSON is one object: overall `ok`, counts, a summary per file and every diagnostic with all of
its fields, so an editor or CI can consume it without parsing text.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from engine.errors import Diagnostic, diagnostic_header, format_failure, install_hint

__all__ = ["CODES", "format_json", "format_diagnostic", "format_failure", "format_report",
           "strict", "summary"]


CODES: dict[str, str] = {
    # loading (engine/load/source.py): the file is refused before anything else looks at it
    "SOP001": "file missing, unreadable, a directory, or not a regular file (a FIFO, socket or device)",
    "SOP002": "file larger than the size limit (1 MB)",
    "SOP003": "file is binary or not UTF-8, or holds a lone surrogate escape (`\"\\ud800\"`)",
    "SOP004": "file is empty",
    "SOP005": "not valid YAML (syntax), or more than one document",
    "SOP006": "a tag outside YAML's core schema (e.g. !!python/object), or a value its tag refuses",
    "SOP007": "duplicate key",
    "SOP008": "alias bomb: too many aliases, too large an expansion, or a recursive alias",
    "SOP009": "nesting deeper than the limit (64)",
    "SOP010": "the top level is not a mapping",
    "SOP011": "a merge key (<<) or a non-scalar key",
    # includes (engine/load/includes.py): library files are loaded as the main file is
    "SOP012": "an `include` that is refused: absolute, a URL, `..`, out of its folder through a symlink, or too many files",
    "SOP013": "an include cycle (the chain of files is named)",
    "SOP014": "an input, action or role defined in two files (the file and a library, or two libraries)",
    # deprecated spellings (engine/load/migrations.py): rewritten before the schema sees the file
    "SOP015": "warning: a deprecated spelling (e.g. an exec action's `timeout_s`), still accepted; `sopctl migrate FILE` rewrites it",
    "SOP016": "a deprecated key and its new spelling both in one mapping (e.g. `retries` and `max_retries`)",
    # structure (the pydantic models, engine/load/spec.py; explained with the schema generated from them)
    "SOP101": "unknown key",
    "SOP102": "a value that is not one of the allowed values (enum, apiVersion)",
    "SOP103": "wrong type",
    "SOP104": "missing required key (e.g. `command` of a kind exec action), or an MCP server with both or neither of `command` and `url`",
    "SOP105": "a value out of range, too short, or not matching its pattern",
    "SOP106": "a badly formed action or role id (key)",
    "SOP107": "an output node `type` the type grammar does not accept",
    "SOP108": "a value the SOP models refuse although the schema allowed it (internal safety net)",
    "SOP109": "an output node `pattern` that is not a valid linear-time (RE2) regular expression",
    "SOP110": "a key of another kind of action (e.g. `command` on a kind llm action, `review` on a kind exec one)",
    # references (engine/check/references.py)
    "SOP201": "a role's `actions` names an unknown action",
    "SOP202": "`watch` names an unknown action",
    "SOP203": "`send_to` names an unknown role or special address",
    "SOP204": "`context` names an unknown action",
    "SOP205": "`planner` names an unknown action",
    "SOP206": "react_mode plan_and_act without a `planner`, or a planner with neither `task_action` nor `task_actions`",
    "SOP207": "a planner action whose output is not a plan (`tasks` with task_id, dependent_task_ids, instruction; and task_type when the planner has `task_actions`)",
    "SOP208": "warning: `planner` on a role whose react_mode is not plan_and_act",
    "SOP210": "two roles share an address (id or name)",
    "SOP211": "warning: an action no role runs",
    "SOP212": "an action redefines the built-in UserRequirement",
    "SOP213": "an input's default does not have the input's type",
    "SOP214": "warning: an exec action's `env` names a secret-looking variable (a key, token, password)",
    "SOP216": "a role with `human: true` in react_mode plan_and_act, or in react mode with several actions",
    "SOP217": "`fill: complex` or `revise` on an action that is not a model filling an output tree",
    "SOP218": "`revise: human_review` without `review: human` (MetaGPT's mode: a person comments, the model revises)",
    "SOP219": "`recall` without a `memory_window` (on the action or the role running it), or on an action with `context: none`",
    "SOP221": "`tools` names an unknown toolset, command or MCP server (or a tool the server does not declare)",
    "SOP222": "`tools` on an action that has `review: human`, or that a person's role runs; `team` with no one to address, `quick_think` without `output: text` (warning: `max_steps`, `experience`, `quick_think`, `tool_top_k` or `working_memory` without `tools`)",
    "SOP223": "an MCP server named like a built-in toolset (warning: `env` or `headers` that do not apply to its transport, or `env` or a header (MCP or `search`) naming a secret)",
    "SOP224": "an `experience` path that is absolute, a URL, or leaves the SOP's folder (..)",
    "SOP225": "a `kind: tool` action's `tool` is unknown, a whole toolset or MCP server, or a tool loop's own command (plan, team, human); or its `args` name an argument the command does not take, or lack a required one",
    # the watch graph (engine/check/watch.py)
    "SOP301": "a cycle of activations on which no action declares `max_runs` (and the file sets no `team.max_rounds`)",
    "SOP302": "warning: a role no message can ever reach",
    "SOP303": "warning: an action whose output is neither kept by a role, read later, nor written as an artifact",
    "SOP304": "warning: a role watches an action whose `send_to` never delivers to it",
    # templates
    "SOP401": "template syntax error",
    "SOP402": "a template reads a variable that does not exist there",
    "SOP403": "`out['Key']` names a key the producing action's output tree does not have",
    "SOP404": "`inputs.X` names an undeclared input",
    "SOP405": "an artifact path that is absolute, leaves the workspace, or writes into `.sopctl/` (the run's own journal and lock)",
    "SOP406": "a template uses an unknown filter or test",
    "SOP407": "`msgs.X` names an unknown action",
    "SOP408": "warning: `msgs.X` or `context: [X]` read messages that never reach the reading role",
    "SOP409": "a template reads `role.vars.X` that a role running its action does not declare",
    "SOP410": "`for_each` over a message's text (`.content`, or `.out` of a text or code output): never a list",
    "SOP411": "`state.X` or `set: {X: ...}` names a state variable the file does not declare under `state:`",
    "SOP412": "a state variable's `default`, or a `set` value (a constant, or another state variable), that is not of the variable's type",
    "SOP413": "warning: a role is woken by a message its one action never shows (not in its `context`, not read as `news` or `msgs.X`)",
    "SOP414": "a `file('...')` path that is absolute, leaves the SOP's folder (..), or (the SOP's path known) names no regular file there, or one over 100,000 bytes",
    # run time (engine/run/): a failed run names the place in the file that failed
    "SOP501": "a template failed while running (prompt, command item, artifact path or content)",
    "SOP502": "the workspace refused an artifact (outside it, through a symlink, into `.sopctl/`, a folder, a name over 255 bytes) or could not write it",
    "SOP503": "an exec action's command could not start",
    "SOP504": "a `for_each` or `when` expression failed, or `for_each` gave no list or too many items",
    "SOP505": "no valid answer (or plan) from the model after the action's retries, or the model failed",
}


"""Every diagnostic code, with what it means (docs/writing.md's table is this one)."""


def strict(diagnostics: Iterable[Diagnostic]) -> tuple[Diagnostic, ...]:
    """`--strict`: every warning becomes an error."""
    return tuple(replace(d, severity="error") if not d.is_error else d for d in diagnostics)


def format_diagnostic(diagnostic: Diagnostic, lines: Sequence[str] = ()) -> str:
    """One diagnostic: header, the offending line with a caret, its pointer, hint and notes."""
    out = [diagnostic_header(diagnostic)]
    out += _excerpt(lines, diagnostic.line, diagnostic.col)
    if diagnostic.pointer:
        out.append(f"  at {diagnostic.pointer}")
    if diagnostic.hint:
        out.append(f"  hint: {diagnostic.hint}")
    for rel in diagnostic.related:
        place = f"{rel.file or diagnostic.file}:{rel.line}:{rel.col}" if rel.line else rel.pointer
        out.append(f"  note: {rel.message} ({place})")
    return "\n".join(out)


def _excerpt(lines: Sequence[str], line: int, col: int) -> list[str]:
    if not (0 < line <= len(lines)):
        return []
    text = lines[line - 1].replace("\t", " ")
    if len(text) > 200:
        text = text[:200] + "..."
    width = len(str(line))
    caret = " " * max(col - 1, 0) + "^" if col <= len(text) + 1 else ""
    return [f"  {line:>{width + 2}} | {text}", f"  {'':>{width + 2}} | {caret}".rstrip()]


def summary(file: str, diagnostics: Sequence[Diagnostic]) -> str:
    """`file: ok`, or `file: 2 errors, 1 warning`."""
    errors = sum(d.is_error for d in diagnostics)
    warnings = len(diagnostics) - errors
    if not diagnostics:
        return f"{file}: ok"
    parts = [f"{errors} error{'s' * (errors != 1)}"] if errors else []
    parts += [f"{warnings} warning{'s' * (warnings != 1)}"] if warnings else []
    return f"{file}: {', '.join(parts)}"


def format_json(results: Sequence[tuple[str, Sequence[Diagnostic]]]) -> str:
    """All files' diagnostics as one JSON document."""
    files: list[dict[str, Any]] = []
    every: list[dict[str, Any]] = []
    for file, diagnostics in results:
        errors = sum(d.is_error for d in diagnostics)
        files.append({"file": file, "ok": errors == 0, "errors": errors,
                      "warnings": len(diagnostics) - errors})
        every += [d.to_json() for d in diagnostics]
    total = sum(f["errors"] for f in files)
    document = {"ok": total == 0, "errors": total, "warnings": sum(f["warnings"] for f in files),
                "files": files, "diagnostics": every}
    return json.dumps(document, indent=2, ensure_ascii=False)


def format_report(results: Sequence[Any], fmt: str = "text", strict_mode: bool = False) -> tuple[str, int]:
    """What `sopctl validate` prints for some CheckResults, and its exit code (0 ok, 1 errors)."""
    checked = [(r.file, strict(r.diagnostics) if strict_mode else r.diagnostics, r) for r in results]
    failed = any(d.is_error for _, diags, _ in checked for d in diags)
    if fmt == "json":
        return format_json([(file, diags) for file, diags, _ in checked]), int(failed)
    blocks = []
    for file, diags, result in checked:
        blocks += [format_diagnostic(d, result.lines_of(d.file)) + "\n" for d in diags]
        blocks.append(summary(file, diags))
        blocks += needs_lines(file, result.compiled)
    return "\n".join(blocks), int(failed)


def needs_lines(file: str, compiled: Any) -> list[str]:
    """What a file's tools need from the command line: `file: needs --allow-exec: terminal (A)`."""
    if compiled is None:
        return []
    from engine.load.catalog import missing_extras   # the loader's; loaded already when a file compiled

    lines = [f"{file}: needs {flag}: {', '.join(users)}" for flag, users in compiled.plan.flags.items()]
    return lines + [f"{file}: needs the `{extra}` extra, not installed here ({install_hint(extra)}): "
                    f"{', '.join(users)}" for extra, users in missing_extras(compiled.spec).items()]
