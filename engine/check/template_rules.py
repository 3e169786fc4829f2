"""The template phase of the checks: every jinja template of an SOP, statically.

Prompts, `for_each`, `when` and artifact paths and contents must parse in the sandbox, read
only the variables their place has, and name only declared inputs, actions and output keys
(`out['Key']`, `msgs.X[-1].out['Key']`); artifact paths must stay inside the workspace.
Its rules are listed in `RULES`, which `check.phases` runs third.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import lru_cache, partial
from typing import Any

from jinja2 import nodes

from engine.check.graph import delivered, render_address, runners, send_targets
from engine.check.references import known_addresses
from engine.check.rules import Context, error, rule, unknown, warning
from engine.errors import Diagnostic, did_you_mean
from engine.load.outputs import output_kind
from engine.load.spec import (
    ENGINE_DIR,
    USER_REQUIREMENT,
    ActionSpec,
    AnsweredAction,
    ComputeAction,
    ExecAction,
    LlmAction,
    OutputNode,
    PromptedAction,
    Sop,
    ToolAction,
    in_engine_dir,
    is_template,
    output_of,
)
from engine.templates.filters import file_problem, refusal
from engine.templates.sandbox import TemplateFailure, environment, parse
from engine.templates.code import expression_text

__all__ = ["BASE_VARIABLES", "JOIN_VARIABLES", "RULES", "REFERENCE_RULES", "read_by_templates"]


BASE_VARIABLES = frozenset({"inputs", "role", "msgs", "news", "run", "plan", "state"})
"""Names every template may read (contract §3; `plan`: the role's `plan` tool, kept across
activations, empty for a role without it; `state`: the file's shared state)."""


VARIABLE_FIELDS: dict[str, frozenset[str]] = {
    "role": frozenset({"id", "name", "profile", "goal", "constraints",
                       "vars"}),  # role variables: a mapping; its keys are checked per role
    "run": frozenset({"id", "round"}),
    "plan": frozenset({"status", "tasks", "current"}),
}
"""The fields of the mapping variables, as `run.actions.template_variables` builds them."""


MESSAGE_FIELDS = frozenset({"content", "out", "sent_from", "cause_by", "round", "sent_from_name",
                            "sent_from_profile", "send_to"})
"""The fields of a message in `news[i]` and `msgs.X[i]` (`run.actions.message_view`)."""


JOIN_VARIABLES = frozenset({"outs", "contents"})
"""What a `join` template reads besides BASE_VARIABLES: the items' outputs and texts, in order."""


_DICT_METHODS = frozenset({"items", "keys", "values", "get"})


_EXEC_OUT = {"exit_code": None, "stdout": None, "stderr": None}


@dataclass(frozen=True)
class _Template:
    """One template of an action: where it is, what it may read, what `out` means there."""

    action: str
    pointer: str
    source: str
    allowed: frozenset[str]


def _as_expression(source: str) -> str:
    return "{{ " + expression_text(source) + " }}"


def _templates(spec: Sop) -> Iterator[_Template]:
    task_actions = {aid for r in spec.roles.values() if r.planner for aid in r.planner.task_action_ids()}
    for aid, action in spec.actions.items():
        base = set(BASE_VARIABLES) | ({"task"} if aid in task_actions else set())
        per_item = {action.as_, "index"} if action.for_each else set()
        here = f"/actions/{aid}"
        if isinstance(action, PromptedAction) and action.prompt:
            yield _Template(aid, here + "/prompt", action.prompt, frozenset(base | per_item))
        if isinstance(action, LlmAction) and action.system:
            yield _Template(aid, here + "/system", action.system, frozenset(base | per_item))
        if isinstance(action, ExecAction):
            for i, part in enumerate(action.command):
                yield _Template(aid, f"{here}/command/{i}", part, frozenset(base | per_item))
        # checked as the run reads them: one expression (what {{ }} would hold), no {% %} blocks
        if action.for_each:
            yield _Template(aid, here + "/for_each", _as_expression(action.for_each), frozenset(base))
        if action.when:
            yield _Template(aid, here + "/when", _as_expression(action.when), frozenset(base))
        for i, artifact in enumerate(action.artifacts):
            allowed = frozenset(base | per_item | {"out"})
            yield _Template(aid, f"{here}/artifacts/{i}/path", artifact.path, allowed)
            yield _Template(aid, f"{here}/artifacts/{i}/content", artifact.content, allowed)
        if action.join is not None:
            joined = frozenset(base | JOIN_VARIABLES)
            for key in ("content", "path"):
                text = getattr(action.join, key)
                if text is not None:
                    yield _Template(aid, f"{here}/join/{key}", text, joined)
        for i, address in enumerate(action.send_to):
            if is_template(address):  # from `role` alone: checked exactly; from `state`: at run time
                yield _Template(aid, f"{here}/send_to/{i}", address, frozenset({"role", "state"}))
        yield from _shaping_templates(aid, action, frozenset(base), frozenset(per_item))
    yield from _role_templates(spec)


def _shaping_templates(aid: str, action: ActionSpec, base: frozenset[str],
                       per_item: frozenset[str]) -> Iterator[_Template]:
    """The templates that shape what an action publishes and changes (docs/state.md): its
    `content` (with `out`, except a compute action's, which makes the output), its `set`
    expressions (with `out`, the items' list under for_each) and a tool action's `args`."""
    here = f"/actions/{aid}"
    if action.content is not None:
        out = frozenset() if isinstance(action, ComputeAction) else frozenset({"out"})
        yield _Template(aid, here + "/content", action.content, base | per_item | out)
    for name, source in action.set_.items():
        yield _Template(aid, f"{here}/set/{name}", _as_expression(source), base | {"out"})
    if isinstance(action, ToolAction):
        for name, value in action.args.items():
            if isinstance(value, str):
                yield _Template(aid, f"{here}/args/{name}", value, base | per_item)


ROLE_FIELD_VARIABLES = frozenset({"inputs", "role", "run"})
"""What a role's templated fields read (engine.run.prompts.role_field_variables)."""


def _role_templates(spec: Sop) -> Iterator[_Template]:
    """A role's profile, goal, constraints, desc and human, when they are templates: rendered
    once when the run starts, from the inputs, the role's id, name and vars, and the run's id."""
    for rid, role in spec.roles.items():
        for name in ("profile", "goal", "constraints", "desc", "human"):
            value = getattr(role, name)
            if isinstance(value, str) and is_template(value):
                yield _Template("", f"/roles/{rid}/{name}", value, ROLE_FIELD_VARIABLES)


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
    whole: set[str] = field(default_factory=set)
    """Names read as a whole, not only through `a.b[c]` (`msgs | tojson`, `msgs[name]`)."""
    files: list[tuple[str, int]] = field(default_factory=list)
    """(path, line) of each `file('...')` call whose path is a constant."""

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
                found.whole.add(node.name)
            else:
                found.stores.add(node.name)
        elif isinstance(node, (nodes.Filter, nodes.Test)):
            found.filters.append(("filter" if isinstance(node, nodes.Filter) else "test", node.name, node.lineno))
        elif isinstance(node, nodes.Macro):
            found.stores.add(node.name)
        elif isinstance(node, (nodes.Include, nodes.Import, nodes.FromImport, nodes.Extends)):
            found.loads_files.append((type(node).__name__.lower(), node.lineno))
        elif _is_file_call(node):
            found.files.append((node.args[0].value, node.lineno))
        if isinstance(node, (nodes.Getattr, nodes.Getitem)):
            chain = _chain(node)
            beside = _beside_chain(node)
            if chain is not None:
                found.chains.append(chain)
                root = beside.pop()  # a load, but not of the whole: the chain names what it reads
                found.loads[root.name] = min(found.loads.get(root.name, root.lineno), root.lineno)
            stack.extend(beside)
            continue
        stack.extend(node.iter_child_nodes())
    return found


def _is_file_call(node: Any) -> bool:
    """`file('a/b.md')`: the global's call with one constant string (a computed path is the
    run's to check)."""
    return (isinstance(node, nodes.Call) and isinstance(node.node, nodes.Name) and node.node.name == "file"
            and len(node.args) == 1 and isinstance(node.args[0], nodes.Const) and isinstance(node.args[0].value, str))


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
        ctx.cache["templates"] = [(template, _analysed(template.source)) for template in _templates(ctx.spec)]
    return ctx.cache["templates"]


@lru_cache(maxsize=4096)
def _analysed(source: str) -> _Analysis | TemplateFailure:
    """A template's analysis, worked out once per text in a process (the rules only read it):
    `sopctl lsp` checks a file again at every pause in typing, and all but the edited
    template are the same text as before. Parsing is most of a check's time."""
    try:
        return _analyse(parse(source))
    except TemplateFailure as exc:
        return exc


@rule("SOP401", "SOP406")
def template_syntax(ctx: Context) -> Iterator[Diagnostic]:
    """Templates must parse, and use only filters and tests the sandbox has."""
    env = environment()
    for template, found in _parsed(ctx):
        if isinstance(found, Exception):
            line = _template_line(str(found))
            expression = template.pointer.endswith(("/for_each", "/when")) or "/set/" in template.pointer
            hint = ("for_each and when are one expression (what {{ }} holds), not a template: no {% %} "
                    "blocks; e.g. \"msgs.Outline[-1].out['Sections']\"") if expression else \
                "check the {{ }} and {% %} pairs"
            yield error("SOP401", template.pointer, str(found), hint, line=line)
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


@rule("SOP410")
def for_each_lists(ctx: Context) -> Iterator[Diagnostic]:
    """A `for_each` that reads a message's text (`.content`, or `.out` of an action whose
    output is text or code) never gives a list: it would fail at run time, after paid calls."""
    for template, found in _parsed(ctx):
        if isinstance(found, Exception) or not template.pointer.endswith("/for_each"):
            continue
        whole = [c for c in found.chains if c[0] == "msgs" and len(c[1]) == 3]
        if len(found.chains) != 1 or not whole or found.filters:
            continue   # more than one bare message read: not ours to judge
        producer, _, field = whole[0][1]
        action = ctx.spec.actions.get(producer) if isinstance(producer, str) else None
        if action is None or field not in ("out", "content"):
            continue
        text = field == "content" or (not isinstance(action, ExecAction) and
                                      output_kind(output_of(action)) != "json")
        if text:
            yield error("SOP410", template.pointer, f"for_each over msgs.{producer}[...].{field}, which is text, "
                        "never a list", f"give {producer} an output tree with a list key and iterate over that "
                        f"key, e.g. msgs.{producer}[-1].out['Items']", line=whole[0][2])


@rule("SOP402", "SOP403", "SOP404", "SOP407", "SOP408", "SOP411")
def template_references(ctx: Context) -> Iterator[Diagnostic]:
    """`inputs.X`, `msgs.X` and `out['Key']` must name declared inputs, actions and keys;
    `role.X`, `run.X` and a message's `.X` the fields those variables have."""
    for template, found in _parsed(ctx):
        if isinstance(found, Exception):
            continue
        for name, path, line in found.chains:
            rule = _REFERENCE_RULES.get(name)
            if rule is None or name in found.stores:  # a name the template rebinds is its own
                continue
            for diag in rule(ctx, template, path):
                yield replace(diag, line=line)


@rule("SOP403")
def for_each_item_keys(ctx: Context) -> Iterator[Diagnostic]:
    """`item.X` (or the `as` name) names a key of the list's elements, when `for_each` walks
    a list of objects of an output tree (`msgs.Plan[-1].out['Tasks']`): a misspelt key would
    fail only at run time, after paid calls."""
    parsed = _parsed(ctx)
    for template, found in parsed:
        if isinstance(found, Exception) or not template.pointer.endswith("/for_each"):
            continue
        action = ctx.spec.actions[template.action]
        element = _element_tree(ctx.spec, found)
        if element is None:
            continue
        for other, seen in parsed:
            if other.action != template.action or isinstance(seen, Exception) or other.pointer == template.pointer \
                    or action.as_ not in other.allowed:
                continue
            for name, path, line in seen.chains:
                if name != action.as_ or name in seen.stores or not path:
                    continue
                missing = _missing_key(element, path)
                if missing:
                    key, level, _ = missing
                    yield error("SOP403", other.pointer, f"a for_each item ({action.as_}) has no key '{key}'",
                                did_you_mean(key, list(level)) or f"its keys: {', '.join(level)}", line=line)


def _element_tree(spec: Sop, found: _Analysis) -> dict[str, Any] | None:
    """The keys of the elements a `for_each` of one `msgs.X[i].out[...]` chain walks, when
    that names a list of objects of X's output tree (None otherwise: not ours to judge)."""
    if len(found.chains) != 1 or found.filters:
        return None
    name, path, _ = found.chains[0]
    if name != "msgs" or len(path) < 4 or path[2] != "out" or not isinstance(path[0], str):
        return None
    producer = spec.actions.get(path[0])
    tree = output_of(producer) if producer is not None and not producer.for_each else None
    level: Any = tree if isinstance(tree, dict) else None
    for key in path[3:]:
        if not isinstance(level, dict) or not isinstance(key, str) or key not in level:
            return None
        level = _step(level[key])
    return level[0] if isinstance(level, tuple) else None


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
    found = _analysed(template.source)
    guarded = isinstance(found, _Analysis) and any(n == "msgs" and p == [source] for n, p, _ in found.chains)
    yield from _never_delivered(ctx, template.action, source, template.pointer, f"msgs.{source}", guarded)
    if len(path) > 2 and not isinstance(path[1], str):
        yield from _message_field(template.pointer, f"msgs.{source}[...]", path[2])
    if source == USER_REQUIREMENT or len(path) < 4 or path[2] != "out" or isinstance(path[1], str):
        return
    producer = spec.actions[source]
    keys = path[3:]
    if producer.for_each:
        if not isinstance(keys[0], int):
            return
        keys = keys[1:]
    yield from _key_rule(spec, template, source, producer, keys)


def _fields_rule(variable: str, ctx: Context, template: _Template, path: list[Any]) -> Iterator[Diagnostic]:
    """`role.X`, `run.X`: a field the variable has (an unknown one fails only at run time)."""
    field_name = path[0] if path else None
    if not isinstance(field_name, str) or field_name in _DICT_METHODS:
        return
    known = VARIABLE_FIELDS[variable]
    if field_name not in known:
        yield error("SOP402", template.pointer, f"{variable} has no field '{field_name}'",
                    did_you_mean(field_name, sorted(known)) or f"{variable}'s fields: {', '.join(sorted(known))}")


def _news_rule(ctx: Context, template: _Template, path: list[Any]) -> Iterator[Diagnostic]:
    if len(path) > 1 and not isinstance(path[0], str):
        yield from _message_field(template.pointer, "news[...]", path[1])


def _message_field(pointer: str, what: str, field_name: Any) -> Iterator[Diagnostic]:
    if isinstance(field_name, str) and field_name not in MESSAGE_FIELDS and field_name not in _DICT_METHODS:
        fields = sorted(MESSAGE_FIELDS)
        yield error("SOP402", pointer, f"a message ({what}) has no field '{field_name}'",
                    did_you_mean(field_name, fields) or f"a message's fields: {', '.join(fields)}")


def _state_rule(ctx: Context, template: _Template, path: list[Any]) -> Iterator[Diagnostic]:
    """`state.X` names a variable the file declares under `state:`."""
    name = path[0] if path else None
    if isinstance(name, str) and name not in _DICT_METHODS and name not in ctx.spec.state:
        known = list(ctx.spec.state)
        yield error("SOP411", template.pointer, f"undeclared state variable '{name}'",
                    did_you_mean(name, known) or f"declare it under `state:` (declared: {', '.join(known) or 'none'})")


def _out_rule(ctx: Context, template: _Template, path: list[Any]) -> Iterator[Diagnostic]:
    place = template.pointer.split("/")[3]
    if place == "set" and ctx.spec.actions[template.action].for_each:   # `out` is the items' list there
        return
    if place not in ("artifacts", "content", "set"):
        return
    yield from _key_rule(ctx.spec, template, template.action, ctx.spec.actions[template.action], path)


def _never_delivered(ctx: Context, reader: str, source: str, pointer: str, what: str,
                     guarded: bool = True) -> Iterator[Diagnostic]:
    """Warn for each role running `reader` that can never remember a message of `source`.

    A role remembers every message delivered to it (watched or not) and its own; so
    `msgs.X` or `context: [X]` stays empty for a role that X's `send_to` never reaches. An
    action shared by roles of which some receive X is meant to read nothing for the others
    when its template tests `msgs.X` first (`guarded`), and a context shows them nothing:
    then no warning (an unguarded `msgs.X[-1]` would fail for them)."""
    ran_by = _runners(ctx)
    idea = source == USER_REQUIREMENT
    if not idea and (source not in ctx.spec.actions or not ran_by.get(source)):
        return
    send = list(ctx.spec.team.send_to) if idea else send_targets(ctx.spec, source)
    readers = ran_by.get(reader, [])
    lacking = [rid for rid in readers if rid not in ran_by.get(source, ())
               and not delivered(send, rid, ctx.spec.role_name(rid), False)[0]]
    shared = len(lacking) < len(readers)
    if shared and guarded:
        return   # the roles that receive it read it, the others are meant to read nothing
    for rid in lacking:
        field = "team.send_to" if idea else f"{source}'s send_to"
        hint = f"add '{rid}' or <all> to {field}"
        if shared:
            hint += f", or test it first: {{{{ msgs.{source}[-1].content if msgs.{source} else '' }}}}"
        yield warning("SOP408", pointer, f"{what} is always empty for role '{rid}': '{source}' is "
                      f"sent only to {', '.join(send)}", hint)


@rule("SOP408")
def context_reachable(ctx: Context) -> Iterator[Diagnostic]:
    """A `context` entry the role never receives shows the model nothing."""
    for aid, action in ctx.spec.actions.items():
        if isinstance(action, AnsweredAction) and isinstance(action.context, list):
            for i, source in enumerate(action.context):
                yield from _never_delivered(ctx, aid, source, f"/actions/{aid}/context/{i}", f"context {source}")


@rule("SOP413")
def wakers_shown(ctx: Context) -> Iterator[Diagnostic]:
    """A role's one action shows the message that woke it: a role woken by X whose action's
    `context` leaves X out and whose templates read neither `news` nor `msgs.X` runs without
    seeing why it woke (often with an empty context)."""
    reads: dict[str, list[_Analysis]] = {}
    for template, found in _parsed(ctx):
        if not isinstance(found, Exception):
            reads.setdefault(template.action, []).append(found)
    for rid, role in ctx.spec.roles.items():
        if role.react_mode == "plan_and_act" or len(role.actions) > 1:
            continue   # the model, the plan or `when` picks the step: not ours to judge
        aid = role.actions[0]
        action = ctx.spec.actions[aid]
        if not isinstance(action, AnsweredAction) or action.context == "all":
            continue
        shown = set(action.context) if isinstance(action.context, list) else set()
        for source in role.watch:
            if source in shown or source in role.runnable_actions() or _reads_message(reads.get(aid, []), source):
                continue   # its own loop (by_order's next step) is not what woke it first
            if source == "UserRequirement" and "idea" not in ctx.spec.inputs:
                continue   # a run with no idea input only starts the role (docs/state.md): nothing to show
            yield warning("SOP413", f"/actions/{aid}/context", f"role '{rid}' is woken by {source}, which "
                          f"'{aid}' never shows: its context leaves it out and its templates read neither news "
                          f"nor msgs.{source}", f"add {source} to the context of '{aid}', or read it in the prompt "
                          f"(news, msgs.{source})")


def _reads_message(analyses: list[_Analysis], source: str) -> bool:
    """Whether the templates read `source`'s messages (the idea also as `inputs.idea`)."""
    for found in analyses:
        if "news" in found.free or "msgs" in found.whole or (source == USER_REQUIREMENT and "inputs" in found.free):
            return True
        if any(name == "news" or (name == "msgs" and path and path[0] in (source, None)) for name, path, _ in found.chains):
            return True
    return False


def _runners(ctx: Context) -> dict[str, list[str]]:
    if "runners" not in ctx.cache:
        ctx.cache["runners"] = runners(ctx.spec)
    return ctx.cache["runners"]


def _undeclared_vars(ctx: Context, found: _Analysis, action_id: str) -> Iterator[tuple[str, str, int]]:
    """(role, variable, line) for each `role.vars.X` some role running the action lacks."""
    seen: set[tuple[str, str]] = set()
    for name, path, line in found.chains:
        if name != "role" or len(path) < 2 or path[0] != "vars" or not isinstance(path[1], str):
            continue
        for rid in _runners(ctx).get(action_id, []):
            declared = ctx.spec.roles[rid].vars
            if path[1] not in declared and (rid, path[1]) not in seen \
                    and not (path[1] in _DICT_METHODS and len(path) == 2):
                seen.add((rid, path[1]))
                yield rid, path[1], line


@rule("SOP409")
def role_variables(ctx: Context) -> Iterator[Diagnostic]:
    """Every `role.vars.X` an action's templates read is declared by every role that runs it
    (roles share actions; a variable one of them lacks would fail only when that role acts)."""
    for template, found in _parsed(ctx):
        if isinstance(found, Exception):
            continue
        for rid, var, line in _undeclared_vars(ctx, found, template.action):
            declared = list(ctx.spec.roles[rid].vars)
            yield error("SOP409", template.pointer, f"role '{rid}' runs '{template.action}', which reads "
                        f"role.vars.{var}, but declares no variable '{var}'",
                        did_you_mean(var, declared) or f"add `vars: {{{var}: ...}}` to role '{rid}'"
                        + (f" (it declares: {', '.join(declared)})" if declared else ""), line=line)


@rule("SOP203")
def send_to_templates(ctx: Context) -> Iterator[Diagnostic]:
    """A template `send_to` item, rendered for each role that runs the action, names a role
    or a special address. Templates that do not parse or read more than `role` are left to
    SOP401/SOP402, undeclared role variables to SOP409."""
    known = known_addresses(ctx.spec)
    checked = {t.pointer: found for t, found in _parsed(ctx)}
    for aid, action in ctx.spec.actions.items():
        for i, item in enumerate(action.send_to):
            pointer = f"/actions/{aid}/send_to/{i}"
            found = checked.get(pointer)
            if not is_template(item) or not isinstance(found, _Analysis) or found.free - {"role"}:
                continue
            lacking = {rid for rid, _, _ in _undeclared_vars(ctx, found, aid)}
            for rid in _runners(ctx).get(aid, []):
                if rid not in lacking:
                    yield from _address_problem(ctx, known, item, pointer, aid, rid)


def _address_problem(ctx: Context, known: dict[str, None], item: str, pointer: str, aid: str,
                     rid: str) -> Iterator[Diagnostic]:
    try:
        address = render_address(ctx.spec, item, rid)
    except TemplateFailure as exc:
        yield error("SOP203", pointer, f"send_to of '{aid}' for role '{rid}': {exc}")
        return
    if address not in known:
        message, hint = unknown("address", address, list(known))
        yield error("SOP203", pointer, f"send_to of '{aid}' for role '{rid}' gives {message}", hint)


def _key_rule(spec: Sop, template: _Template, aid: str, action: ActionSpec, keys: list[Any]) -> Iterator[Diagnostic]:
    tree: Any = _EXEC_OUT if isinstance(action, ExecAction) and action.output is None else output_of(action)
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


def read_by_templates(ctx: Context) -> set[str] | None:
    """The actions whose messages some template reads by name (`msgs.X`, `msgs['X']`) in a
    prompt, `when`, `for_each`, artifact or exec command; None when one reads `msgs` as a whole
    (`msgs[name]`, `msgs | tojson`, `msgs.items()`): then any action may be read. A template
    that does not parse reads nothing here (the template phase reports it)."""
    analyses = [found for _, found in _parsed(ctx) if not isinstance(found, Exception)]
    for action in ctx.spec.actions.values():
        for part in action.command if isinstance(action, ExecAction) else []:
            try:
                analyses.append(_analyse(parse(part)))
            except TemplateFailure:
                continue
    read: set[str] = set()
    for found in analyses:
        if "msgs" in found.whole:
            return None
        for name, path, _ in found.chains:
            if name == "msgs":
                if not path or not isinstance(path[0], str) or path[0] in _DICT_METHODS:
                    return None
                read.add(path[0])
    return read


_ReferenceRule = Callable[[Context, _Template, list[Any]], Iterator[Diagnostic]]


_REFERENCE_RULES: dict[str, _ReferenceRule] = {
    "inputs": _inputs_rule, "msgs": _msgs_rule, "out": _out_rule, "news": _news_rule, "state": _state_rule,
    **{name: partial(_fields_rule, name) for name in VARIABLE_FIELDS},
}


_DRIVE = re.compile(r"^[A-Za-z]:")


@rule("SOP405")
def artifact_paths(ctx: Context) -> Iterator[Diagnostic]:
    """Artifact paths stay inside the workspace: relative, forward slashes, no `..`, and
    never into ENGINE_DIR (an artifact there would replace the run's journal or lock)."""
    for aid, action in ctx.spec.actions.items():
        for i, artifact in enumerate(action.artifacts):
            yield from _path_rule(f"/actions/{aid}/artifacts/{i}/path", artifact.path, "artifact path")
        if action.join is not None and action.join.path is not None:
            yield from _path_rule(f"/actions/{aid}/join/path", action.join.path, "join path")


_TAG = re.compile(r"\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\}", re.DOTALL)


def _path_rule(pointer: str, path: str, what: str) -> Iterator[Diagnostic]:
    """The path's own text, its tags aside: what a tag gives is checked when it is rendered,
    and a backslash inside one (`'{{ out.split("\\n") | first }}'`) is the template's, not the path's."""
    problem = _path_problem(_TAG.sub("x", path))
    if problem:
        yield error("SOP405", pointer, f"{what} '{path}' {problem}",
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


@rule("SOP414")
def file_paths(ctx: Context) -> Iterator[Diagnostic]:
    """A `file('...')` path is relative without `..`; when the checker knows the SOP's folder,
    it names a regular UTF-8-sized file there (what the run's `file()` would refuse)."""
    for template, found in _parsed(ctx):
        if isinstance(found, Exception):
            continue
        for rel, line in found.files:
            problem = refusal(rel) or (file_problem(ctx.folder, rel) if ctx.folder is not None else "")
            if problem:
                yield error("SOP414", template.pointer, problem,
                            "name a file inside the SOP's folder, e.g. file('prompts/write.md')", line=line)


RULES = (template_syntax, template_variables, template_references, for_each_lists, for_each_item_keys,
         context_reachable, wakers_shown, artifact_paths, file_paths)
"""This phase's rules, in the order they run."""


REFERENCE_RULES = (role_variables, send_to_templates)
"""Rules of the references phase that read templates: the watch graph needs every
`send_to` resolved for every role, so these run before it."""
