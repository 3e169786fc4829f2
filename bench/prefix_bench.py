"""Provider prompt caching: what consecutive requests share, and what a user would pay.

Two figures (issue 28, targets 1 and 2):

- exact-prefix share of consecutive requests of one role and action (the steps of a tool
  loop): the characters the request shares, from its first, with the one before it, over its
  own length (system prompt and messages in order, as sent); min / median / max. Scenarios:
  a 10-step tool loop whose plan changes twice (`plan` and `editor` commands, a scripted
  model), and the shipped MGX team on `fake` (every tool loop of it). Target: at least 0.9.
- what a user pays for input: the recorded requests of a run, replayed in order through
  OpenAI's published caching rule (a request's longest exact prefix, in tokens, shared with
  any earlier request of the run, is cached when it is at least 1,024 tokens, counted in
  128-token steps; every request within the cache's lifetime), priced at gpt-4o's cached
  rate (half the input price; `CACHED_RATE`). Billed-equivalent input tokens = uncached +
  cached x rate. sopctl's software company (without QA, MetaGPT's team; the widened `fake`
  of bench.compare) against MetaGPT 0.8.2's on the same task list, the same tokenizer
  (cl100k_base) for both, twice: on the bench's small answers, and on answers of a hosted
  model's size (bench/realistic_answers.py, the same texts for both engines; the target is
  judged on these). Target: at most 0.25x MetaGPT's. Beside it a floor (`quoted_answers`):
  the tokens of the answers' parts later requests quote word for word, which any engine
  pays uncached once. Then MetaGPT main (bench/metagpt_main.py, when its venv is there):
  one tool loop beside its RoleZero (`loop_pays`), and the whole MGX team beside its MGX
  team (`team_pays`: TeamLeader, ProductManager, Architect, Engineer2 and DataAnalyst in an
  MGXEnv, bench/metagpt_mgx.py; one scripted scenario for both, bench/mgx_scenario.py: Mike
  assigns a PRD, a design and the code in turn, each member writes its file and ends; the
  same files, the same texts; every request of each run, MetaGPT's language checks, replies
  and summaries too; sopctl's side runs without the venv as well). Target: at most 0.25x each.

    python -m bench.prefix_bench
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

__all__ = ["main", "prefix_shares", "billed_input", "team_pays"]

ROOT = Path(__file__).resolve().parent.parent
SHARE_TARGET = 0.9
BILLED_TARGET = 0.25
CACHED_RATE = 0.5
"""gpt-4o's cached input price over its input price (litellm's cost map: 1.25e-6 / 2.5e-6)."""
MIN_CACHED, STEP = 1024, 128
"""OpenAI's rule: prompts from 1,024 tokens, cache hits in 128-token increments."""

LOOP_SOP = """
apiVersion: sop/v1
name: prefix_bench
inputs:
  idea: {required: true}
actions:
  Work:
    prompt: "Build {{ inputs.idea }}: plan it, write it, check it."
    tools: [plan, editor]
    max_steps: 20
roles:
  Worker:
    actions: [Work]
    watch: [UserRequirement]
"""


def _loop_answers() -> list[dict[str, Any]]:
    """Ten steps; the plan changes at steps 1 and 6 (and its status with it)."""
    def step(name: str, args: dict[str, Any]) -> dict[str, Any]:
        return {"thought": f"next: {name}", "commands": [{"command_name": name, "args": args}]}
    code = "def main() -> None:\n    print('hello')\n" * 20
    return [step("plan.append_task", {"task_id": "1", "instruction": "write the game"}),
            step("editor.write", {"path": "game.py", "content": code}),
            step("editor.read", {"path": "game.py"}),
            step("editor.write", {"path": "util.py", "content": code}),
            step("editor.read", {"path": "util.py"}),
            step("plan.finish_current_task", {}),
            step("editor.list", {"path": "."}),
            step("editor.read", {"path": "game.py"}),
            step("editor.search", {"term": "main"}),
            {"thought": "done", "commands": [{"command_name": "end", "args": {"answer": "built"}}]}]


def request_text(messages: Sequence[dict[str, Any]]) -> str:
    """A request as one text, in the order the provider reads it."""
    return "".join(f"<|{m.get('role')}|>{m.get('content') or ''}" for m in messages)


def _common(a: Sequence[Any], b: Sequence[Any]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def prefix_shares(requests: list[tuple[str, str]], of_earlier: bool = False) -> list[float]:
    """For each request (group, text) after the first of its group: the share of it that is
    the exact beginning of the group's request before it; `of_earlier`: the share of that
    earlier request that begins this one (1.0 when nothing sent before was changed: then the
    later share is as high as it can be, the earlier request's length over its own)."""
    last: dict[str, str] = {}
    shares = []
    for group, text in requests:
        if group in last and text and last[group]:
            shares.append(_common(last[group], text) / len(last[group] if of_earlier else text))
        last[group] = text
    return shares


def _spread(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    return {"n": len(values), "min": round(min(values), 3), "median": round(statistics.median(values), 3),
            "max": round(max(values), 3)}


class _Recorder:
    """Wraps a provider: keeps each request's (role.action, text)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.requests: list[tuple[str, str]] = []

    def supports_schema(self, model: str) -> bool:
        return bool(self.inner.supports_schema(model))

    def price(self, model: str) -> Any:
        return getattr(self.inner, "price", lambda _m: None)(model)

    async def complete(self, request: Any) -> Any:
        self.requests.append((f"{request.spec.role}.{request.spec.action}.{request.spec.place}",
                              request_text(request.messages)))
        return await self.inner.complete(request)


def _run(compiled: Any, inputs: dict[str, str], provider: Any, name: str, folder: Path,
         allow_exec: bool = False) -> None:
    from engine import api
    from engine.models.gateway import Gateway

    options = api.RunOptions(gateway=Gateway(providers={name: provider}), workspace=folder, model=name,
                             allow_exec=allow_exec)
    result = api.run(compiled, inputs, options, journal=False)
    if result.status != "idle":
        raise RuntimeError(f"{compiled.spec.name} ended {result.status}: {result.error}")


def loop_requests() -> list[tuple[str, str]]:
    from engine.compile.compiler import compile_text
    from engine.testing import ScriptedModel

    recorder = _Recorder(ScriptedModel(_loop_answers()))
    with tempfile.TemporaryDirectory() as folder:
        _run(compile_text(LOOP_SOP), {"idea": "a game"}, recorder, "local", Path(folder) / "ws")
    return recorder.requests


def mgx_requests() -> list[tuple[str, str]]:
    """Every tool loop of the shipped MGX team on `fake`: consecutive steps of one loop."""
    from engine.compile.compiler import compile_path
    from engine.models.fake import FakeModel

    recorder = _Recorder(FakeModel())
    compiled = compile_path(ROOT / "sops" / "mgx_team.sop.yaml")
    inputs = {name: "a command-line 2048 game" for name, spec in compiled.spec.inputs.items()
              if getattr(spec, "required", False)}
    with tempfile.TemporaryDirectory() as folder:
        _run(compiled, inputs, recorder, "fake", Path(folder) / "ws", allow_exec=True)   # a scratch folder
    return recorder.requests


# --------------------------------------------------------------------------- what a user pays

def billed_input(prompts: list[list[int]], rate: float = CACHED_RATE) -> dict[str, float]:
    """Input tokens of a run's requests (token lists, in order) under OpenAI's caching rule:
    total, cached, and billed-equivalent (uncached + cached x rate)."""
    total = cached = 0
    for index, tokens in enumerate(prompts):
        total += len(tokens)
        shared = max((_common(tokens, earlier) for earlier in prompts[:index]), default=0)
        shared = min(shared, len(tokens) - 1)   # the request's last token is always computed
        hit = MIN_CACHED + (shared - MIN_CACHED) // STEP * STEP if shared >= MIN_CACHED else 0
        cached += hit
    return {"input_tokens": total, "cached_tokens": cached,
            "billed_equivalent": round(total - cached + cached * rate, 1)}


def quoted_answers(prompts: list[str], answers: list[str]) -> int:
    """Tokens of the answers' parts that a later request quotes word for word (a drafted file
    in its review, a PRD's or a design's fields in the next document's request, the reviewed
    files in a summary), each part once: text no earlier request held, so no cache has it
    when it is first sent and any engine running this team on these answers pays it in full.
    A floor under every engine's billed-equivalent input, whatever its templates."""
    quoted = []
    for index, answer in enumerate(answers):
        later = prompts[index + 1:]
        for part in _parts(answer):
            if len(part) >= 40 and any(part in prompt for prompt in later):
                quoted.append(part)
    return sum(len(tokens) for tokens in _encode(quoted)[0]) if quoted else 0


def _parts(answer: str) -> list[str]:
    """An answer's quotable parts: a fenced file's body; a JSON answer's string fields (and the
    strings in its lists), as a template quotes them."""
    fenced = re.search(r"```[a-z]*\n(.*?)```", answer, re.S)
    if fenced:
        return [fenced.group(1).strip()]
    try:
        value = json.loads(answer)
    except ValueError:
        return [answer.strip()]
    found: list[str] = []

    def walk(item: Any) -> None:
        if isinstance(item, str):
            found.append(item.strip())
        elif isinstance(item, dict):
            for inner in item.values():
                walk(inner)
        elif isinstance(item, list):
            for inner in item:
                walk(inner)
    walk(value)
    return found


LOOP_STEPS = 10


def loop_pays(steps: int = LOOP_STEPS) -> dict[str, Any]:
    """One tool loop beside MetaGPT main's RoleZero (the loop every MGX role runs), the
    scenario of bench.toolloop_bench with the plan tool alone, as RoleZero's (tools=["Plan"]):
    `steps` steps, each a plan append, the last `end`.
    Every request of each side's run (RoleZero's language detection, reply and summary too)
    replayed through the caching rule; RoleZero's clock moves 5 s per call, as a hosted
    model's answers would move it (its system prompt says the time to the second)."""
    from bench import metagpt_main, toolloop_bench
    from engine.compile.compiler import compile_text
    from engine.testing import ScriptedModel

    recorder = _Recorder(ScriptedModel(toolloop_bench._answers(steps)))
    plan_only = toolloop_bench.sop_text(["plan"])   # RoleZero's Plan
    with tempfile.TemporaryDirectory() as folder:
        _run(compile_text(plan_only), {"idea": "a game"}, recorder, "local", Path(folder) / "ws")
    ours = _encode([text for _, text in recorder.requests])[0]
    out: dict[str, Any] = {"steps": steps, "sopctl": {**billed_input(ours), "requests": len(ours)},
                           "sopctl_at_0.1": billed_input(ours, 0.1)}
    missing = metagpt_main.available()
    if missing:
        out["metagpt"] = {"skipped": missing}
        return out
    try:
        theirs = [request_text(messages) for messages in metagpt_main.rolezero_requests(steps)]
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        out["metagpt"] = {"skipped": f"MetaGPT main failed: {str(exc).splitlines()[0][:300]}"}
        return out
    _beside(out, theirs)
    out["metagpt_commit"] = metagpt_main._source_commit()
    return out


class TeamScript:
    """sopctl's side of bench/mgx_scenario.py: each role's answer by its name, its turn and its
    step (a function of the request, so the order across roles is the run's own); `calls`:
    each request's role and kind, as bench/metagpt_mgx.py names them."""

    @classmethod
    def for_sop(cls, compiled: Any, extra: int = 0) -> TeamScript:
        """The script for the roles of `compiled` (sops/mgx_team.sop.yaml), by their names."""
        return cls({rid: compiled.spec.role_name(rid) for rid in compiled.spec.roles}, extra)

    def __init__(self, names: dict[str, str], extra: int = 0) -> None:
        self.names = names
        self.extra = extra
        """mgx_scenario.STEPPER's extra steps (bench.toolloop_bench)."""
        self.turns: dict[str, int] = {}
        self.calls: list[str] = []

    def __call__(self, spec: Any, attempt: int) -> Any:
        from bench import mgx_scenario

        name = self.names[spec.role]
        if attempt:   # a re-ask: the scenario's answers are all valid, so the run is not the scenario's
            return RuntimeError(f"sopctl re-asked {name} ({spec.action}, step {spec.tool_step})")
        if spec.tool_step < 0:   # Mike's quick think on the user's message
            self.calls.append(f"{name}: quick think")
            return {"thought": "the user asks for software; the team builds it.", "intent": "TASK"}
        self.calls.append(f"{name}: command")
        if spec.tool_step == 0:
            self.turns[name] = self.turns.get(name, -1) + 1
        if name == "Mike":
            return mgx_scenario.sopctl_leader(self.turns[name])
        return mgx_scenario.sopctl_member(name, spec.tool_step, self.extra)


def team_requests() -> tuple[list[str], list[str]]:
    """The shipped MGX team (sops/mgx_team.sop.yaml) on bench/mgx_scenario.py's scenario: every
    request's text, and each one's role and kind. Raises RuntimeError if a file is not written
    as the scenario has it."""
    from bench import mgx_scenario
    from engine.compile.compiler import compile_path
    from engine.testing import ScriptedModel

    compiled = compile_path(ROOT / "sops" / "mgx_team.sop.yaml")
    script = TeamScript.for_sop(compiled)
    recorder = _Recorder(ScriptedModel(script))
    with tempfile.TemporaryDirectory() as folder:
        workspace = Path(folder) / "ws"
        _run(compiled, {"idea": mgx_scenario.IDEA}, recorder, "local", workspace, allow_exec=True)
        wrong = [path for path, text in mgx_scenario.files().items()
                 if not (workspace / path).exists() or (workspace / path).read_text(encoding="utf-8") != text]
    if wrong:
        raise RuntimeError(f"sopctl's MGX team did not write {wrong} as the scenario has them ({script.calls})")
    return [text for _, text in recorder.requests], script.calls


def _per_role(calls: list[str]) -> dict[str, dict[str, int]]:
    """"Alice: summary"-style calls counted by role (in the order they first call) and kind."""
    counted: dict[str, dict[str, int]] = {}
    for call in calls:
        name, _, kind = call.partition(": ")
        counted.setdefault(name, {})
        counted[name][kind] = counted[name].get(kind, 0) + 1
    return counted


def _calls_line(counted: dict[str, dict[str, int]]) -> str:
    return "; ".join(f"{name} {sum(kinds.values())} ({', '.join(f'{kind} {n}' for kind, n in kinds.items())})"
                     for name, kinds in counted.items())


def team_pays(with_metagpt: bool = True) -> dict[str, Any]:
    """The whole MGX team beside MetaGPT main's (TeamLeader, ProductManager, Architect,
    Engineer2, DataAnalyst in an MGXEnv; bench/metagpt_mgx.py): the same scenario and the same
    files on both sides (bench/mgx_scenario.py), each in its engine's command format; every
    request of each run (MetaGPT's intent check, language checks, the members' replies to the
    human and summaries too) replayed through the caching rule. RoleZero's clock moves 5 s per
    call, as in `loop_pays`. Without `with_metagpt`, sopctl's side alone (the scenario still
    runs, in seconds)."""
    from bench import metagpt_main

    ours, calls = team_requests()
    tokens = _encode(ours)[0]
    out: dict[str, Any] = {"sopctl": {**billed_input(tokens), "requests": len(ours)},
                           "sopctl_at_0.1": billed_input(tokens, 0.1), "sopctl_calls": _per_role(calls)}
    missing = metagpt_main.available() if with_metagpt else "not asked for"
    if missing:
        out["metagpt"] = {"skipped": missing}
        return out
    try:
        theirs = metagpt_main.mgx_run()
    except (RuntimeError, OSError, ValueError, KeyError, subprocess.TimeoutExpired) as exc:
        out["metagpt"] = {"skipped": f"MetaGPT main failed: {str(exc).splitlines()[0][:300]}"}
        return out
    _beside(out, [request_text(messages) for messages in theirs["requests"]])
    out["metagpt_calls"] = _per_role(theirs["calls"])
    out["metagpt_commit"] = metagpt_main._source_commit()
    return out


def _beside(out: dict[str, Any], theirs: list[str]) -> None:
    """The other engine's requests through the caching rule, and sopctl's ratios to them
    (`out` already holds sopctl's side and its figures at 0.1)."""
    tokens = _encode(theirs)[0]
    out["metagpt"] = {**billed_input(tokens), "requests": len(theirs)}
    out["metagpt_at_0.1"] = billed_input(tokens, 0.1)
    out["ratio"] = round(out["sopctl"]["billed_equivalent"] / out["metagpt"]["billed_equivalent"], 3)
    out["ratio_at_0.1"] = round(out["sopctl_at_0.1"]["billed_equivalent"]
                                / out["metagpt_at_0.1"]["billed_equivalent"], 3)
    out["input_ratio"] = round(out["sopctl"]["input_tokens"] / out["metagpt"]["input_tokens"], 3)


def _encode(texts: list[str]) -> tuple[list[list[int]], str]:
    from bench.compare import _tokenizer

    enc = _tokenizer()
    if enc is None:   # characters / 4, split as tokens would be (the rule needs positions)
        return [[ord(c) for c in t[::4]] for t in texts], "chars/4"
    return [list(enc.encode(t, disallowed_special=())) for t in texts], "cl100k_base"


def pays(files: int, with_metagpt: bool, realistic: bool = False) -> dict[str, Any]:
    """sopctl's and MetaGPT 0.8.2's software company, replayed through the caching rule;
    `realistic`: on answers of a hosted model's size (bench/realistic_answers.py)."""
    from bench import compare

    out: dict[str, Any] = {"files": files, "realistic": realistic}
    with tempfile.TemporaryDirectory() as folder:
        sop = compare.no_qa_variant(compare.SOP, Path(folder) / "no_qa.sop.yaml")
        ours = compare.run_sopctl(files, 0.0, sop=sop, realistic=realistic)
    tokens, method = _encode(ours["prompts"])
    out["sopctl"], out["tokenizer"] = billed_input(tokens), method
    out["floor"] = quoted_answers(ours["prompts"], ours["answers"])
    out["sopctl"]["requests"] = len(ours["prompts"])
    out["sopctl_at_0.1"] = billed_input(tokens, 0.1)
    if not with_metagpt:
        out["metagpt"] = {"skipped": "not asked for"}
        return out
    try:
        from bench import metagpt_baseline

        metagpt_baseline.ensure_installed(log=lambda *a: print(*a, file=sys.stderr))
        theirs = metagpt_baseline.run_team(files, 0.0, realistic=realistic)["prompts"]
    except (RuntimeError, OSError, ValueError) as exc:
        out["metagpt"] = {"skipped": f"MetaGPT 0.8.2 failed: {str(exc).splitlines()[0][:300]}"}
        return out
    _beside(out, theirs)
    out["floor_ratio"] = round(out["floor"] / out["metagpt"]["billed_equivalent"], 3)
    return out


def _pays_table(paid: dict[str, Any], title: str, other: str = "MetaGPT 0.8.2") -> list[str]:
    lines = ["", title, "",
             "| engine | requests | input tokens | cached | billed-equivalent at 0.5 (gpt-4o) | at 0.1 |",
             "|---|---|---|---|---|---|"]
    for name, key in (("sopctl", "sopctl"), (other, "metagpt")):
        side = paid[key]
        if "skipped" in side:
            lines.append(f"| {name} | skipped: {side['skipped']} | | | | |")
            continue
        lines.append(f"| {name} | {side['requests']} | {side['input_tokens']:,} | {side['cached_tokens']:,} | "
                     f"{side['billed_equivalent']:,.0f} | {paid[key + '_at_0.1']['billed_equivalent']:,.0f} |")
    if "ratio" in paid:
        met = "met" if paid["ratio"] <= BILLED_TARGET else "not met"
        lines += ["", f"sopctl / {other}: **{paid['ratio']:.3f}** billed-equivalent at 0.5 "
                  f"({paid['ratio_at_0.1']:.3f} at 0.1; {paid['input_ratio']:.3f} before caching); "
                  f"target <= {BILLED_TARGET} ({met})."]
    return lines


def main(size_factor: float = 1.0, with_metagpt: bool = True) -> dict[str, Any]:
    files = 10 if size_factor >= 1 else 3
    loop_sent, mgx_sent = loop_requests(), mgx_requests()
    loop, mgx = _spread(prefix_shares(loop_sent)), _spread(prefix_shares(mgx_sent))
    loop_kept, mgx_kept = (_spread(prefix_shares(sent, of_earlier=True)) for sent in (loop_sent, mgx_sent))
    tiny, sized = pays(files, with_metagpt), pays(files, with_metagpt, realistic=True)
    figures: dict[str, Any] = {"loop": loop, "mgx": mgx, "loop_kept": loop_kept, "mgx_kept": mgx_kept,
                               "pays": tiny, "pays_realistic": sized}
    lines = ["Exact-prefix share of consecutive requests of one role and action (the later request's "
             "characters that begin as the earlier one does, over its length), and beside it the share "
             "of the earlier request that begins the later one (1.000: nothing sent before was changed, "
             "so the later share is the most it can be, what the step adds being the rest):", "",
             "| scenario | pairs | min | median | max | target | earlier request kept: min / median |",
             "|---|---|---|---|---|---|---|"]
    for label, side, kept in (("10-step tool loop, the plan changing twice (scripted model)", loop, loop_kept),
                              ("the shipped MGX team's tool loops (`fake`)", mgx, mgx_kept)):
        if side["n"]:
            met = "met" if side["min"] >= SHARE_TARGET else \
                ("median met" if side["median"] >= SHARE_TARGET else "not met")
            lines.append(f"| {label} | {side['n']} | {side['min']:.3f} | {side['median']:.3f} | "
                         f"{side['max']:.3f} | >= {SHARE_TARGET} ({met}) | {kept['min']:.3f} / {kept['median']:.3f} |")
    rule = (f"every request replayed through OpenAI's caching rule (from {MIN_CACHED:,} tokens, {STEP}-token "
            f"steps), tokens by {tiny['tokenizer']}")
    lines += _pays_table(tiny, f"Input tokens a user pays, the software company with {files} files on the "
                               f"bench's small answers (a 10-line module per file), {rule}:")
    if tiny["metagpt"].get("cached_tokens") == 0 and tiny["sopctl"]["cached_tokens"] == 0:
        lines += ["", f"No request of either engine reaches {MIN_CACHED:,} tokens on answers this small: "
                  "caching plays no part, the ratio is the templates'."]
    lines += _pays_table(sized, f"The same on answers of a hosted model's size (bench/realistic_answers.py: "
                                f"a full PRD, a class of four methods per file, 70-line modules; the design "
                                f"skips sopctl's optional `Interfaces per file`), {rule}:")
    if "ratio" in sized:
        figures.update(ratio=sized["ratio"], target=f"<= {BILLED_TARGET}", ratio_label=(
            "billed-equivalent input tokens under OpenAI's prompt caching, software company on answers "
            "of a hosted model's size (sopctl / MetaGPT 0.8.2)"))
        lines += ["", "MetaGPT's write-code prompts put the design, the tasks and all code so far first and "
                  "the file's own part last, so each one begins as the one before it: its cache hits are "
                  "high, and caching narrows sopctl's lead in input tokens.",
                  "", f"A floor: the answers' parts that a later request quotes word for word (each drafted "
                  f"file in its review, the documents' fields in the next one's request) are "
                  f"{sized['floor']:,} tokens that no cache holds when they are first sent, "
                  f"so any engine running this team on these answers pays them in full: "
                  f"**{sized['floor_ratio']:.3f}**x MetaGPT's billed-equivalent. What sopctl pays above it "
                  f"({sized['sopctl']['billed_equivalent'] - sized['floor']:,.0f} tokens) is its instructions, "
                  f"the parts of the design each file's requests repeat, and the role prefix of every request."]
        figures["floor_ratio"] = sized["floor_ratio"]
    loop_paid = loop_pays(LOOP_STEPS if size_factor >= 1 else 3) if with_metagpt else None
    if loop_paid is not None:
        figures["pays_loop"] = loop_paid
        commit = loop_paid.get("metagpt_commit", "")
        lines += _pays_table(loop_paid, (
            f"One tool loop beside MetaGPT main's RoleZero{f' ({commit})' if commit else ''}, the loop every MGX "
            f"role runs: {loop_paid['steps']} steps of the toolloop bench's scenario (a plan append per step, then "
            "`end`), the plan tool alone on both sides, every request of each run (RoleZero's language check, "
            f"reply and summary too), {rule}. RoleZero's clock moves 5 s per call, as a hosted model's answers "
            "would move it: its system prompt says the time to the second, so no request of it begins as the "
            "one before it for long:"), other="MetaGPT main RoleZero")
        if "ratio" in loop_paid:
            figures.update(loop_ratio=loop_paid["ratio"], loop_ratio_label=(
                "billed-equivalent input tokens under OpenAI's prompt caching, one tool loop "
                "(sopctl / MetaGPT main's RoleZero)"))
    team_paid = team_pays(with_metagpt)
    figures["pays_team"] = team_paid
    commit = team_paid.get("metagpt_commit", "")
    lines += _pays_table(team_paid, (
        f"The whole MGX team beside MetaGPT main's{f' ({commit})' if commit else ''} (TeamLeader, ProductManager, "
        "Architect, Engineer2 and DataAnalyst in an MGXEnv, as `metagpt IDEA` hires them), both on the same "
        "scripted scenario (bench/mgx_scenario.py): the user asks for a command-line 2048 game; Mike plans three "
        "tasks and assigns the PRD to Alice, the design to Bob, the code to Alex, one turn each, and tells the "
        "user when it is done; each member writes one file of a hosted model's size (the same texts on both "
        "sides) with the editor, then ends. Every request of each run (MetaGPT's intent check, language "
        f"checks, the members' replies to the human and summaries too), {rule}; RoleZero's clock moves 5 s "
        "per call:"), other="MetaGPT main MGX team")
    for engine, key in (("sopctl", "sopctl_calls"), ("MetaGPT main", "metagpt_calls")):
        if key in team_paid:
            lines += ["", f"{engine}'s calls: {_calls_line(team_paid[key])}."]
    if "ratio" in team_paid:
        lines += ["", "The calls MetaGPT main makes besides the steps are its own: each role's language check "
                  "on its first turn, and each member's reply to the human and summary at `end` (sopctl's "
                  "members end with their summary, which goes to Mike). RoleZero's system prompt, first in each "
                  "step's request, says the time to the second within its first lines, so no step's request "
                  "begins as an earlier one for long; MetaGPT's cache hits are each member's summary request, "
                  "which begins as its reply to the human did."]
        figures.update(team_ratio=team_paid["ratio"], team_ratio_label=(
            "billed-equivalent input tokens under OpenAI's prompt caching, the MGX team "
            "(sopctl / MetaGPT main's MGX team)"))
    figures["markdown"] = "\n".join(lines)
    print(figures["markdown"])
    print(json.dumps({k: v for k, v in figures.items() if k != "markdown"}), file=sys.stderr)
    return figures


if __name__ == "__main__":
    main()
