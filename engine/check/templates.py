"""The template phase of the checks: every jinja template of an SOP, statically.

Prompts, `for_each`, `when` and artifact paths and contents must parse in the sandbox, read
only the variables their place has, and name only declared inputs, actions and output keys
(`out['Key']`, `msgs.X[-1].out['Key']`); artifact paths must stay inside the workspace.
Its rules are listed in `RULES`, which `check.phases` runs third.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from jinja2 import nodes

from engine.check.graph import delivered, runners
from engine.check.rules import Context, error, rule, warning
from engine.check.sandbox import TemplateFailure, environment, parse
from engine.errors import Diagnostic
from engine.load.schema import did_you_mean
from engine.load.spec import (
    ENGINE_DIR,
    USER_REQUIREMENT,
    ActionSpec,
    OutputNode,
    Sop,
    in_engine_dir,
)

__all__ = ["BASE_VARIABLES", "RULES"]


BASE_VARIABLES = frozenset({"inputs", "role", "msgs", "news", "run"})
"""Names every template may read (contract §3)."""


_DICT_METHODS = frozenset({"items", "keys", "values", "get"})


_EXEC_OUT = {"exit_code": None, "stdout": None, "stderr": None}


@dataclass(frozen=True)
class _Template:
    """One template of an action: where it is, what it may read, what `out` means there."""

    action: str
    pointer: str
    source: str
    allowed: frozenset[str]


def _templates(spec: Sop) -> Iterator[_Template]:
    task_actions = {aid for r in spec.roles.values() if r.planner for aid in r.planner.task_action_ids()}
    for aid, action in spec.actions.items():
        base = set(BASE_VARIABLES) | ({"task"} if aid in task_actions else set())
        per_item = {action.as_, "index"} if action.for_each else set()
        here = f"/actions/{aid}"
        if action.prompt:
            yield _Template(aid, here + "/prompt", action.prompt, frozenset(base | per_item))
        if action.for_each:
            yield _Template(aid, here + "/for_each", action.for_each, frozenset(base))
        if action.when:
            yield _Template(aid, here + "/when", action.when, frozenset(base))
        for i, artifact in enumerate(action.artifacts):
            allowed = frozenset(base | per_item | {"out"})
            yield _Template(aid, f"{here}/artifacts/{i}/path", artifact.path, allowed)
            yield _Template(aid, f"{here}/artifacts/{i}/content", artifact.content, allowed)


@dataclass
class _Analysis:
    """What one walk over a template's AST finds (jinja's own `meta` runs its code
    generator, several times slower than this walk over a typical prompt)."""

    loads: dict[str, int] = field(default_factory=dict)
    """Names read, with the template line of the first read."""
    stores: set[str] = field(default_factory=set)
    """Names the template binds itself (for, set, macro parameters...)."""
    filters: list[tuple[str, str, int]] = field(default_factory=list)
    """(filter or test, name, line)."""
    chains: list[tuple[str, list[Any], int]] = field(default_factory=list)
    """(variable, accessors, line) of each outermost `a.b[c]...`; None = dynamic accessor."""
    loads_files: list[tuple[str, int]] = field(default_factory=list)
    """(tag, line) of include/import/extends: a sandboxed SOP template has no files to load."""

    @property
    def free(self) -> set[str]:
        return set(self.loads) - self.stores - _JINJA_IMPLICIT


_JINJA_IMPLICIT = frozenset({"loop", "caller", "varargs", "kwargs", "self"})


def _analyse(ast: Any) -> _Analysis:
    found = _Analysis()
    stack = [ast]
    while stack:
        node = stack.pop()
        if isinstance(node, nodes.Name):
            if node.ctx == "load":
                found.loads[node.name] = min(found.loads.get(node.name, node.lineno), node.lineno)
            else:
                found.stores.add(node.name)
        elif isinstance(node, (nodes.Filter, nodes.Test)):
            found.filters.append(("filter" if isinstance(node, nodes.Filter) else "test", node.name, node.lineno))
        elif isinstance(node, nodes.Macro):
            found.stores.add(node.name)
        elif isinstance(node, (nodes.Include, nodes.Import, nodes.FromImport, nodes.Extends)):
            found.loads_files.append((type(node).__name__.lower(), node.lineno))
        if isinstance(node, (nodes.Getattr, nodes.Getitem)):
            chain = _chain(node)
            if chain is not None:
                found.chains.append(chain)
            stack.extend(_beside_chain(node))
            continue
        stack.extend(node.iter_child_nodes())
    return found


def _chain(node: Any) -> tuple[str, list[Any], int] | None:
    path: list[Any] = []
    current = node
    while isinstance(current, (nodes.Getattr, nodes.Getitem)):
        path.append(current.attr if isinstance(current, nodes.Getattr) else _constant(current.arg))
        current = current.node
    return (current.name, path[::-1], node.lineno) if isinstance(current, nodes.Name) else None


def _beside_chain(node: Any) -> list[Any]:
    """The chain's root and its subscript expressions, still to be walked (not the links)."""
    rest = []
    while isinstance(node, (nodes.Getattr, nodes.Getitem)):
        if isinstance(node, nodes.Getitem):
            rest.append(node.arg)
        node = node.node
    return [*rest, node]


def _parsed(ctx: Context) -> list[tuple[_Template, Any]]:
    """Each template with its analysis, or the TemplateFailure when it does not parse."""
    if "templates" not in ctx.cache:
        result: list[tuple[_Template, Any]] = []
        for template in _templates(ctx.spec):
            try:
                result.append((template, _analyse(parse(template.source))))
            except TemplateFailure as exc:
                result.append((template, exc))
        ctx.cache["templates"] = result
    return ctx.cache["templates"]


@rule("SOP401", "SOP406")
def template_syntax(ctx: Context) -> Iterator[Diagnostic]:
    """Templates must parse, and use only filters and tests the sandbox has."""
    env = environment()
    for template, found in _parsed(ctx):
        if isinstance(found, Exception):
            line = _template_line(str(found))
            yield error("SOP401", template.pointer, str(found), "check the {{ }} and {% %} pairs", line=line)
            continue
        for tag, line in found.loads_files:
            yield error("SOP401", template.pointer, f"{{% {tag} %}} is not available: SOP templates cannot load "
                        "other templates", "write the text inline", line=line)
        for kind, name, line in found.filters:
            table = env.filters if kind == "filter" else env.tests
            if name not in table:
                yield error("SOP406", template.pointer, f"unknown {kind} '{name}'",
                            did_you_mean(name, list(table)), line=line)


def _template_line(message: str) -> int:
    match = re.search(r"template line (\d+)", message)
    return int(match.group(1)) if match else 0


@rule("SOP402")
def template_variables(ctx: Context) -> Iterator[Diagnostic]:
    """A template reads only the variables its place provides (anything else fails at run time)."""
    globals_ = set(environment().globals)
    for template, found in _parsed(ctx):
        if isinstance(found, Exception):
            continue
        for name in sorted(found.free - template.allowed - globals_):
            yield error("SOP402", template.pointer, f"undeclared template variable '{name}'",
                        did_you_mean(name, sorted(template.allowed)) or
                        f"available here: {', '.join(sorted(template.allowed))}", line=found.loads[name])


@rule("SOP403", "SOP404", "SOP407", "SOP408")
def template_references(ctx: Context) -> Iterator[Diagnostic]:
    """`inputs.X`, `msgs.X` and `out['Key']` must name declared inputs, actions and keys."""
    for template, found in _parsed(ctx):
        if isinstance(found, Exception):
            continue
        for name, path, line in found.chains:
            rule = _REFERENCE_RULES.get(name)
            if rule is None:
                continue
            for diag in rule(ctx, template, path):
                yield replace(diag, line=line)


def _constant(arg: Any) -> Any:
    if isinstance(arg, nodes.Const) and isinstance(arg.value, (str, int)):
        return arg.value
    if isinstance(arg, nodes.Neg) and isinstance(arg.node, nodes.Const) and isinstance(arg.node.value, int):
        return -arg.node.value
    return None


def _inputs_rule(ctx: Context, template: _Template, path: list[Any]) -> Iterator[Diagnostic]:
    spec = ctx.spec
    name = path[0] if path else None
    if isinstance(name, str) and name not in _DICT_METHODS and name not in spec.inputs:
        known = list(spec.inputs)
        yield error("SOP404", template.pointer, f"undeclared input '{name}'",
                    did_you_mean(name, known) or f"declare it under `inputs:` (declared: {', '.join(known) or 'none'})")


def _msgs_rule(ctx: Context, template: _Template, path: list[Any]) -> Iterator[Diagnostic]:
    spec = ctx.spec
    source = path[0] if path else None
    if not isinstance(source, str) or source in _DICT_METHODS:
        return
    if source not in spec.actions and source != USER_REQUIREMENT:
        known = [USER_REQUIREMENT, *spec.actions]
        yield error("SOP407", template.pointer, f"msgs.{source}: no action '{source}'", did_you_mean(source, known))
        return
    yield from _never_delivered(ctx, template.action, source, template.pointer, f"msgs.{source}")
    if source == USER_REQUIREMENT or len(path) < 4 or path[2] != "out" or isinstance(path[1], str):
        return
    producer = spec.actions[source]
    keys = path[3:]
    if producer.for_each:
        if not isinstance(keys[0], int):
            return
        keys = keys[1:]
    yield from _key_rule(spec, template, source, producer, keys)


def _out_rule(ctx: Context, template: _Template, path: list[Any]) -> Iterator[Diagnostic]:
    if template.pointer.split("/")[3] != "artifacts":
        return
    yield from _key_rule(ctx.spec, template, template.action, ctx.spec.actions[template.action], path)


def _never_delivered(ctx: Context, reader: str, source: str, pointer: str, what: str) -> Iterator[Diagnostic]:
    """Warn for each role running `reader` that can never remember a message of `source`.

    A role remembers every message delivered to it (watched or not) and its own; so
    `msgs.X` or `context: [X]` stays empty for a role that X's `send_to` never reaches."""
    if "runners" not in ctx.cache:
        ctx.cache["runners"] = runners(ctx.spec)
    ran_by = ctx.cache["runners"]
    if source == USER_REQUIREMENT or source not in ctx.spec.actions or not ran_by.get(source):
        return
    send = list(ctx.spec.actions[source].send_to)
    for rid in ran_by.get(reader, []):
        runs_it = rid in ran_by[source]
        if not runs_it and not delivered(send, rid, ctx.spec.role_name(rid), runs_it)[0]:
            yield warning("SOP408", pointer, f"{what} is always empty for role '{rid}': '{source}' is "
                          f"sent only to {', '.join(send)}", f"add '{rid}' or <all> to {source}'s send_to")


@rule("SOP408")
def context_reachable(ctx: Context) -> Iterator[Diagnostic]:
    """A `context` entry the role never receives shows the model nothing."""
    for aid, action in ctx.spec.actions.items():
        if isinstance(action.context, list):
            for i, source in enumerate(action.context):
                yield from _never_delivered(ctx, aid, source, f"/actions/{aid}/context/{i}", f"context {source}")


def _key_rule(spec: Sop, template: _Template, aid: str, action: ActionSpec, keys: list[Any]) -> Iterator[Diagnostic]:
    tree: Any = _EXEC_OUT if action.kind == "exec" else action.output
    if not isinstance(tree, dict) or not keys:
        return
    missing = _missing_key(tree, keys)
    if missing:
        key, level, trail = missing
        where = f"'{aid}'" + "".join(f"['{k}']" for k in trail)
        yield error("SOP403", template.pointer, f"the output of {where} has no key '{key}'",
                    did_you_mean(key, list(level)) or f"its keys: {', '.join(level)}")


def _missing_key(tree: dict[str, Any], keys: list[Any]) -> tuple[str, list[str], list[str]] | None:
    """(missing key, keys available there, keys walked) for the first key not in the tree."""
    level: Any = tree
    trail: list[str] = []
    for key in keys:
        if isinstance(level, tuple):  # a list of objects: an index steps into its element
            if not isinstance(key, int):
                return None
            level = level[0]
            continue
        if not isinstance(key, str) or not isinstance(level, dict) or key in _DICT_METHODS and key not in level:
            return None
        if key not in level:
            return key, list(level), trail
        trail.append(key)
        level = _step(level[key])
    return None


def _step(node: Any) -> Any:
    if not isinstance(node, OutputNode) or node.children is None:
        return None
    return (node.children,) if (node.type or "").strip() == "list" else node.children


_REFERENCE_RULES = {"inputs": _inputs_rule, "msgs": _msgs_rule, "out": _out_rule}


_DRIVE = re.compile(r"^[A-Za-z]:")


@rule("SOP405")
def artifact_paths(ctx: Context) -> Iterator[Diagnostic]:
    """Artifact paths stay inside the workspace: relative, forward slashes, no `..`, and
    never into ENGINE_DIR (an artifact there would replace the run's journal or lock)."""
    for aid, action in ctx.spec.actions.items():
        for i, artifact in enumerate(action.artifacts):
            problem = _path_problem(artifact.path)
            if problem:
                yield error("SOP405", f"/actions/{aid}/artifacts/{i}/path", f"artifact path '{artifact.path}' {problem}",
                            "write a relative path inside the workspace, such as docs/prd.md")


def _path_problem(path: str) -> str:
    text = path.strip()
    if not text:
        return "is empty"
    if "\\" in text:
        return "contains a backslash (use /)"
    if text.startswith(("/", "~")) or _DRIVE.match(text):
        return "is absolute"
    if ".." in re.split(r"/+", text):
        return "leaves the workspace (..)"
    if "\x00" in text:
        return "contains a NUL character"
    if in_engine_dir(text):
        return f"writes into {ENGINE_DIR}/, the folder of sopctl's own journal and lock"
    return ""


RULES = (template_syntax, template_variables, template_references, context_reachable, artifact_paths)
"""This phase's rules, in the order they run."""
