"""Runs INSIDE MetaGPT main's private venv: one RoleZero tool loop on a scripted model.

Launched by `bench/toolloop_bench.py` as `python metagpt_rolezero.py --steps 5,40 --repeats 5`
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
costs (lazy imports, caches). Prints one JSON object on the last line of stdout. Standard
library plus MetaGPT only.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time

import pandas  # noqa: F401 - before metagpt: qianfan's pyarrow stub breaks a later pandas import

STATS: dict = {"calls": 0, "steps": 0, "unknown": 0, "prompt_chars": 0}


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


def install_fake(steps: list[int]) -> None:
    """Replace the one method every MetaGPT LLM call goes through; `steps[0]` is the number
    of steps the current run gives (the runner sets it before each run)."""
    from metagpt.provider.base_llm import BaseLLM
    from metagpt.provider.openai_api import OpenAILLM

    async def fake_completion_text(self, messages, stream=False, timeout=None) -> str:
        last = str(messages[-1].get("content", "")) if messages else ""
        STATS["calls"] += 1
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


async def one_run(steps: int) -> float:
    """CPU seconds of one RoleZero run of `steps` steps (a new role each time)."""
    from metagpt.actions import UserRequirement
    from metagpt.roles.di.role_zero import RoleZero
    from metagpt.schema import UserMessage

    STATS["steps"] = 0
    role = RoleZero(tools=["Plan"], max_react_loop=steps + 5, use_summary=True)
    role._watch([UserRequirement])    # as the MGX roles do: the user's request starts it
    started = time.process_time()
    await role.run(UserMessage(content="Plan a small command-line game."))
    cpu = time.process_time() - started
    if STATS["steps"] != steps:
        raise RuntimeError(f"RoleZero took {STATS['steps']} steps, not {steps} ({STATS})")
    return cpu


async def measure(small: int, large: int, repeats: int, current: list[int]) -> dict:
    current[0] = small
    await one_run(small)                          # untimed: one-time costs
    per_step, chars = [], 0
    for _ in range(repeats):
        current[0] = small
        low = await one_run(small)
        current[0] = large
        before = STATS["prompt_chars"]
        high = await one_run(large)
        chars = STATS["prompt_chars"] - before
        per_step.append((high - low) / (large - small))
    return {"system": "metagpt-main", "cpu_s_per_step": per_step, "steps": [small, large],
            "repeats": repeats, "prompt_chars_large_run": chars, "unknown_calls": STATS["unknown"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", default="5,40", help="SMALL,LARGE step counts")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    small, large = (int(n) for n in args.steps.split(","))
    t0 = time.perf_counter()
    import metagpt.roles.di.role_zero  # noqa: F401
    import_s = time.perf_counter() - t0
    import metagpt
    current = [small]
    install_fake(current)
    result = asyncio.run(measure(small, large, args.repeats, current))
    result["import_s"] = import_s
    result["version"] = getattr(metagpt, "__version__", "main")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
