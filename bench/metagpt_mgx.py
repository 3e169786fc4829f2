"""Runs INSIDE MetaGPT main's private venv: its MGX team on a scripted model, every request recorded.

Launched by `bench/metagpt_main.py` (`mgx_requests`) as `python metagpt_mgx.py --record`,
offline as bench/metagpt_rolezero.py is (HOME holding a dummy config, TIKTOKEN_CACHE_DIR
the `cl100k_base` file). The team is the one `metagpt "IDEA"` builds
(metagpt/software_company.py `generate_repo`): a `Team` (so an `MGXEnv`, public chat) hiring
TeamLeader (Mike), ProductManager (Alice), Architect (Bob), Engineer2 (Alex) and
DataAnalyst (David), given the idea "a command-line 2048 game". Only the lowest LLM method
(`BaseLLM.acompletion_text`) is replaced, by a script that tells the calling role by its
system prompt ("named Mike", ...) and the kind of call by its last message, so MGX's message
routing, every role's memory of the public chat, RoleZero's prompts (system prompt with the
team, the tools' schemas and the examples; plan status; editor state), command parsing and
the tools (Plan, Editor, Terminal, TeamLeader.publish_team_message) all run for real.

The scenario is bench/mgx_scenario.py's, in RoleZero's format (prose, then a fenced JSON
array of commands): Mike plans three tasks and assigns the PRD to Alice, who writes
docs/prd.md with Editor.write, then ends; Mike finishes the task and assigns the design to
Bob (docs/system_design.md), then the code to Alex (game.py); then he tells the user and
ends. Each Mike turn is one step (his commands, then `RoleZero.reply_to_human` and `end`, as
MetaGPT's own TeamLeader example has them), each member's two (the file, then `end`). The calls MetaGPT makes besides are answered and recorded too: Mike's intent
classification (quick think; "TASK"), every role's language detection ("English"), each
member's reply to the human and summary at `end`.

What differs from `metagpt "IDEA"`: `n_round` is 24 (sopctl's team.max_rounds) instead of
the command line's default 5, which would stop this team before Alex starts; Alex writes
his file with Editor.write (the command the other members and sopctl's side use) rather
than Engineer2.write_new_code, which would ask the model once more for the code. Nothing of
MetaGPT's is turned off: the Browser every RoleZero holds is never started (no command
uses it), and search (`enable_search`), the experience pool and long-term memory are off in
MetaGPT's defaults, which the dummy config keeps. RoleZero's clock is moved SECONDS_PER_CALL
per call (bench/metagpt_rolezero.py's `install_clock`), as a hosted model's answers would
move it. Alex's system prompt names the scratch folder (a temporary name) and a folder
stamped with the import time, so MetaGPT's input tokens can differ by a few tens between
runs.

Replies with one JSON line prefixed REPLY (metagpt_rolezero's): every request's messages
in order, who made each call and what kind it was, the unknown calls (none expected) and
the files the team wrote. Standard library plus MetaGPT only.

`--cpu SMALL,LARGE` instead measures the CPU per extra tool step of the engineer's loop
inside the team (bench.toolloop_bench): Alex (mgx_scenario.STEPPER) plans SMALL, then LARGE,
parts of the code, one `Plan.append_task` per step, before his file; one untimed run, then a
pair of whole-team runs per line read on stdin, each replying (LARGE run's CPU - SMALL run's)
/ (LARGE - SMALL), as bench/metagpt_rolezero.py does for a lone role.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import re
import sys
import time
from pathlib import Path

import pandas  # noqa: F401 - before metagpt: qianfan's pyarrow stub breaks a later pandas import

import mgx_scenario   # this file's folder is on sys.path (run as a script)
from metagpt_rolezero import STATS, install_clock, reply

RECORDED: list[list[dict]] = []
"""Every request's messages, in order."""
CALLS: list[str] = []
"""Each request's caller and kind, e.g. "Mike: command", "Alice: summary"."""
N_ROUND = 24
_STEPS: dict[str, int] = {}
"""Command calls answered so far, by role name."""
EXTRA = [0]
"""The extra steps of mgx_scenario.STEPPER in the current run (--cpu sets it per run)."""
RECORDING = [True]
"""Whether each request's messages are kept (--record), not in --cpu's timed runs."""


def _caller(messages: list[dict]) -> str:
    """The role's name, from its system prompt ("You are a Team Leader, named Mike, ...")."""
    system = " ".join(str(m.get("content", "")) for m in messages if m.get("role") == "system")
    found = re.search(r"named (\w+)", system)
    return found.group(1) if found else "?"


def _answer(name: str, last: str) -> tuple[str, str]:
    """(kind, answer) for one call of role `name` whose last message is `last`."""
    if "Determine the previous message's intent" in last:   # quick think: Mike, on the user's message
        return "quick think", "Thought: the user asks for software; the team builds it.\nResponse Category: TASK"
    if "Which Natural Language must you respond in" in last:
        return "language", "English"
    work = mgx_scenario.member_work()
    if "Your commands in a json array" in last:
        step = _STEPS.get(name, 0)
        _STEPS[name] = step + 1
        if name == "Mike" and step < len(mgx_scenario.leader_turns()):
            return "command", mgx_scenario.metagpt_leader(step)
        if name in work and step < mgx_scenario.member_steps(name, EXTRA[0]):
            return "command", mgx_scenario.metagpt_member(name, step, EXTRA[0])
    if "respond to the user in the expected language" in last and name in work:
        return "reply to human", work[name]["summary"]
    if "Summarize what you have accomplished lately" in last and name in work:
        return "summary", work[name]["summary"]
    STATS["unknown"] += 1
    return "unknown", "OK"


def install_fake() -> None:
    """Replace the one method every MetaGPT LLM call goes through with the script."""
    from metagpt.provider.base_llm import BaseLLM
    from metagpt.provider.openai_api import OpenAILLM

    async def fake_completion_text(self, messages, stream=False, timeout=None) -> str:
        STATS["calls"] += 1
        if RECORDING[0]:
            RECORDED.append([{"role": str(m.get("role", "")), "content": str(m.get("content", ""))}
                             for m in messages])
        name = _caller(messages)
        kind, text = _answer(name, str(messages[-1].get("content", "")) if messages else "")
        CALLS.append(f"{name}: {kind}")
        return text

    OpenAILLM.acompletion_text = fake_completion_text
    BaseLLM.acompletion_text = fake_completion_text


async def run_team() -> list[str]:
    """MGX's default team on the idea, as `metagpt IDEA` runs it; the files it wrote as the
    scenario has them."""
    from metagpt.config2 import config
    from metagpt.const import DEFAULT_WORKSPACE_ROOT
    from metagpt.context import Context
    from metagpt.roles import Architect, DataAnalyst, Engineer2, ProductManager, TeamLeader
    from metagpt.team import Team

    DEFAULT_WORKSPACE_ROOT.mkdir(parents=True, exist_ok=True)   # the terminals start there
    company = Team(context=Context(config=config))
    company.hire([TeamLeader(), ProductManager(), Architect(), Engineer2(), DataAnalyst()])
    company.invest(3.0)
    await company.run(n_round=N_ROUND, idea=mgx_scenario.IDEA)
    root = Path(DEFAULT_WORKSPACE_ROOT)
    return sorted(path for path, text in mgx_scenario.files().items()
                  if (root / path).exists() and (root / path).read_text(encoding="utf-8") == text)


async def timed_run(extra: int) -> float:
    """CPU seconds of one team run whose STEPPER takes `extra` steps more; RuntimeError if the
    run is not the scenario's (a file missing, a call the script does not know)."""
    EXTRA[0] = extra
    _STEPS.clear()
    unknown = STATS["unknown"]
    started = time.process_time()
    written = await run_team()
    cpu = time.process_time() - started
    stepper = mgx_scenario.STEPPER
    if STATS["unknown"] != unknown or _STEPS.get(stepper) != mgx_scenario.member_steps(stepper, extra) \
            or written != sorted(mgx_scenario.files()):
        raise RuntimeError(f"the team's run was not the scenario's: {stepper} took {_STEPS.get(stepper)} steps, "
                           f"wrote {written}, {STATS['unknown'] - unknown} unknown calls")
    return cpu


async def serve(small: int, large: int) -> None:
    """bench.toolloop_bench's CPU per extra tool step inside the team: one untimed run, then a
    pair of runs (STEPPER taking `small`, then `large` extra steps) per line on stdin."""
    await timed_run(small)
    reply({"ready": True, "version": importlib.metadata.version("metagpt")})
    while sys.stdin.readline():
        low = await timed_run(small)
        high = await timed_run(large)
        reply({"cpu_s_per_step": (high - low) / (large - small), "unknown_calls": 0})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--record", action="store_true",
                      help="run the team once, replying with every request's messages")
    mode.add_argument("--cpu", metavar="SMALL,LARGE",
                      help="instead: CPU per extra step of the stepper's loop, one pair of runs per stdin line")
    args = ap.parse_args()
    import metagpt.roles.di.role_zero  # noqa: F401 - install_clock patches it
    install_fake()
    install_clock()
    if args.cpu:
        RECORDING[0] = False
        small, large = (int(n) for n in args.cpu.split(","))
        asyncio.run(serve(small, large))
        return
    written = asyncio.run(run_team())
    reply({"requests": RECORDED, "calls": CALLS, "unknown_calls": STATS["unknown"], "files_written": written,
           "files_expected": sorted(mgx_scenario.files())})


if __name__ == "__main__":
    main()
