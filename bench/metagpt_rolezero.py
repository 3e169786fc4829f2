"""Runs INSIDE MetaGPT main's private venv: one RoleZero tool loop on a scripted model.

Launched by `bench/metagpt_main.py` as `python metagpt_rolezero.py --steps 5,40`
with HOME pointing at a dummy config and TIKTOKEN_CACHE_DIR at a folder holding
`cl100k_base` (see that module's docstring for the venv). Only the lowest LLM method
(`acompletion_text`) is replaced, so RoleZero's prompt building (system prompt, plan status,
memory), command parsing, duplicate check, tool recommendation and the Plan tool all run for
real. The scenario is the sopctl side's: each step gives one `Plan.append_task` in RoleZero's
own format (prose, then a fenced JSON array), the last step `end` (whose reply to the human
and summary are two more scripted answers).

The figure is CPU per extra tool step: (CPU of a run of the larger step count - CPU of a run
of the smaller) / the steps between, so a run's fixed costs (the role's construction, the
language detection, the end's report) cancel out. One untimed run first pays the one-time
costs (lazy imports, caches), then the process prints a ready line and measures one pair of
runs for each line it reads on stdin, so the caller can interleave its own runs with these
(both sides then see the same load). Replies are JSON lines prefixed `REPLY` (MetaGPT may
print too). Standard library plus MetaGPT only.

`--record STEPS` instead runs one loop of STEPS steps and replies with every request's
messages (bench.prefix_bench replays them through a provider's caching rule), RoleZero's
clock moved SECONDS_PER_CALL per call, as a hosted model's answers would move it.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import sys
import time

import pandas  # noqa: F401 - before metagpt: qianfan's pyarrow stub breaks a later pandas import

STATS: dict = {"calls": 0, "steps": 0, "unknown": 0, "prompt_chars": 0}
RECORDED: list[list[dict]] = []
"""With --record: every request's messages, in order."""
SECONDS_PER_CALL = 5.0
"""With --record: how far RoleZero's clock moves per model call (a hosted model's answer takes
seconds, and RoleZero's system prompt says the time to the second)."""


def step_answer(index: int, last: bool) -> str:
    """RoleZero's format: thoughts, then one fenced JSON array of commands."""
    if last:
        command = {"command_name": "end", "args": {}}
        thought = "All tasks are planned; I end here."
    else:
        command = {"command_name": "Plan.append_task",
                   "args": {"task_id": str(index + 1), "dependent_task_ids": [],
                            "instruction": f"task {index + 1}", "assignee": "Zero"}}
        thought = f"I add task {index + 1} to the plan."
    return f"{thought}\n```json\n{json.dumps([command], indent=4)}\n```"


def install_fake(steps: list[int], recording: bool = False) -> None:
    """Replace the one method every MetaGPT LLM call goes through; `steps[0]` is the number
    of steps the current run gives (the runner sets it before each run); `recording`: keep
    each request's messages in RECORDED."""
    from metagpt.provider.base_llm import BaseLLM
    from metagpt.provider.openai_api import OpenAILLM

    async def fake_completion_text(self, messages, stream=False, timeout=None) -> str:
        last = str(messages[-1].get("content", "")) if messages else ""
        STATS["calls"] += 1
        if recording:
            RECORDED.append([{"role": str(m.get("role", "")), "content": str(m.get("content", ""))}
                             for m in messages])
        STATS["prompt_chars"] += sum(len(str(m.get("content", ""))) for m in messages)
        if "Determine the previous message's intent" in last:   # quick think: once per run
            return "Thought: work to plan.\nResponse Category: TASK"
        if "Which Natural Language must you respond in" in last:
            return "English"
        if "Your commands in a json array" in last:
            index = STATS["steps"]
            STATS["steps"] += 1
            return step_answer(index, last=index + 1 >= steps[0])
        if "respond to the user in the expected language" in last:
            return "The tasks are planned."
        if "Summarize what you have accomplished lately" in last:
            return "Planned the tasks."
        STATS["unknown"] += 1
        return "OK"

    OpenAILLM.acompletion_text = fake_completion_text
    BaseLLM.acompletion_text = fake_completion_text


ROLES = ("rolezero", "engineer2")
"""`rolezero`: a bare RoleZero holding the Plan tool alone; `engineer2`: MGX's engineer
(Engineer2, its default tools: Plan, Editor, Terminal, Browser, CodeReview, ...), whose think
reads the terminal's folder and the editor's file into every step's prompt."""


def make_role(kind: str, steps: int):
    """A new role of `kind` (ROLES) that may take `steps` steps and a few more."""
    if kind == "engineer2":
        from metagpt.roles.di.engineer2 import Engineer2

        return Engineer2(max_react_loop=steps + 5, use_summary=True)
    from metagpt.roles.di.role_zero import RoleZero

    return RoleZero(tools=["Plan"], max_react_loop=steps + 5, use_summary=True)


async def one_run(steps: int, kind: str = "rolezero") -> float:
    """CPU seconds of one run of `steps` steps of a new role of `kind` (ROLES)."""
    from metagpt.actions import UserRequirement
    from metagpt.schema import UserMessage

    STATS["steps"] = 0
    role = make_role(kind, steps)
    role._watch([UserRequirement])    # as the MGX roles do: the user's request starts it
    started = time.process_time()
    await role.run(UserMessage(content="Plan a small command-line game."))
    cpu = time.process_time() - started
    if STATS["steps"] != steps:
        raise RuntimeError(f"RoleZero took {STATS['steps']} steps, not {steps} ({STATS})")
    return cpu


def install_clock() -> None:
    """RoleZero's clock, moved SECONDS_PER_CALL per model call (the scripted answers come at
    once; a hosted model's take seconds, and the time in RoleZero's system prompt with them)."""
    import datetime as dt

    from metagpt.roles.di import role_zero

    start = dt.datetime(2026, 1, 1, 12, 0, 0)

    class Clock(dt.datetime):
        @classmethod
        def now(cls, tz=None):  # noqa: ANN206 - datetime's own signature
            return start + dt.timedelta(seconds=SECONDS_PER_CALL * STATS["calls"])

    role_zero.datetime = Clock


REPLY = "@@rolezero-bench "


def reply(obj: dict) -> None:
    print(REPLY + json.dumps(obj), flush=True)


async def serve(small: int, large: int, current: list[int], kind: str) -> None:
    """One untimed run, then one pair of runs per line on stdin, until it closes."""
    current[0] = small
    await one_run(small, kind)
    reply({"ready": True, "version": importlib.metadata.version("metagpt")})
    while sys.stdin.readline():
        current[0] = small
        low = await one_run(small, kind)
        current[0] = large
        before = STATS["prompt_chars"]
        high = await one_run(large, kind)
        reply({"cpu_s_per_step": (high - low) / (large - small), "unknown_calls": STATS["unknown"],
               "prompt_chars_large_run": STATS["prompt_chars"] - before})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", default="5,40", help="SMALL,LARGE step counts")
    ap.add_argument("--role", choices=ROLES, default="rolezero", help="the role measured (ROLES)")
    ap.add_argument("--record", type=int, default=0, metavar="STEPS",
                    help="instead: one run of STEPS steps, replying with every request's messages")
    args = ap.parse_args()
    small, large = (int(n) for n in args.steps.split(","))
    import metagpt.roles.di.role_zero  # noqa: F401
    if args.record:
        install_fake([args.record], recording=True)
        install_clock()
        asyncio.run(one_run(args.record))
        reply({"requests": RECORDED, "unknown_calls": STATS["unknown"]})
        return
    current = [small]
    install_fake(current)
    asyncio.run(serve(small, large, current, args.role))


if __name__ == "__main__":
    main()
