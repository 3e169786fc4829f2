"""Runs INSIDE MetaGPT's private venv: its classic software company with a fake LLM.

Launched by `bench/metagpt_baseline.py` as `python metagpt_fake_llm.py --files N ...` with
HOME pointing at a dummy config and METAGPT_PROJECT_ROOT at a scratch folder. Only the
lowest LLM method (`acompletion_text`) is replaced, so MetaGPT's prompt building, ActionNode
compile/parse, retries, git and file handling and logging all run for real and are measured
as engine overhead. Every answer is well formed: a malformed one would trigger MetaGPT's
retries with random 1-20 s waits and ruin the timing. Prints one JSON object on the last
line of stdout. Standard library plus MetaGPT only.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import resource
import time
from pathlib import Path

try:
    import realistic_answers  # run as a script in MetaGPT's venv: this file's folder is on sys.path
except ImportError:   # imported as bench.metagpt_fake_llm (the tests)
    from bench import realistic_answers

T_PROCESS = time.perf_counter()

PROJECT = "bench_app"
STATS: dict = {"calls": 0, "llm_s": 0.0, "prompts": [], "kinds": [], "unknown": 0}
REALISTIC = False
"""--realistic: answers of a hosted model's size (bench/realistic_answers.py, beside this file)."""


def task_files(n: int) -> list[str]:
    """The task list: n-1 modules in dependency order, then main.py (same as the sopctl side)."""
    return [f"module_{i}.py" for i in range(1, n)] + ["main.py"]


def _content(obj: dict) -> str:
    return "[CONTENT]\n" + json.dumps(obj, indent=2) + "\n[/CONTENT]"


def prd_answer(idea: str) -> str:
    if REALISTIC:
        return _content(realistic_answers.prd(idea, PROJECT))
    return _content({
        "Language": "en_us",
        "Programming Language": "Python",
        "Original Requirements": idea,
        "Project Name": PROJECT,
        "Product Goals": ["Make the core feature work", "Keep it simple to use"],
        "User Stories": ["As a user, I want to start it from the command line"],
        "Competitive Analysis": ["Tool A: complete but heavy", "Tool B: light, few features"],
        "Competitive Quadrant Chart": "quadrantChart\n    title \"Reach\"\n    x-axis Low --> High\n"
                                      "    y-axis Low --> High\n    \"Tool A\": [0.3, 0.6]",
        "Requirement Analysis": "A small command-line program.",
        "Requirement Pool": [["P0", "Core feature"], ["P1", "Help text"]],
        "UI Design draft": "Plain text in a terminal.",
        "Anything UNCLEAR": "",
    })


def design_answer(files: list[str]) -> str:
    if REALISTIC:
        return _content(realistic_answers.design(files))
    return _content({
        "Implementation approach": "Plain Python modules, standard library only.",
        "File list": files,
        "Data structures and interfaces": "classDiagram\n    class App {\n        +run() None\n    }",
        "Program call flow": "sequenceDiagram\n    participant M as Main\n    M->>App: run()",
        "Anything UNCLEAR": "",
    })


def tasks_answer(files: list[str]) -> str:
    if REALISTIC:
        return _content(realistic_answers.tasks(files))
    return _content({
        "Required packages": [],
        "Required Other language third-party packages": ["No third-party dependencies required"],
        "Logic Analysis": [[f, f"Implements part {i} of the program"] for i, f in enumerate(files, 1)],
        "Task list": files,
        "Full API spec": "",
        "Shared Knowledge": "Modules are imported by main.py.",
        "Anything UNCLEAR": "",
    })


def code_answer(filename: str) -> str:
    if REALISTIC:
        return f"## {filename}\n```python\n{realistic_answers.code(filename)}```\n"
    name = Path(filename).stem
    return (f"## {filename}\n```python\n\"\"\"{name}: part of the program.\"\"\"\n\n\n"
            f"def run() -> str:\n    \"\"\"Return the name of this part.\"\"\"\n    return \"{name}\"\n\n\n"
            f"if __name__ == \"__main__\":\n    print(run())\n```\n")


def review_answer(filename: str) -> str:
    return (f"## Code Review: {filename}\n1. Yes, it is implemented as required.\n"
            "## Actions\n1. No further action.\n## Code Review Result\nLGTM\n")


def _after(prompt: str, marker: str) -> str:
    """The filename that follows `marker` on its line (e.g. '## Code: main.py. Write ...')."""
    line = prompt.split(marker, 1)[1].split("\n", 1)[0].strip()
    return line.split(". ", 1)[0].strip().rstrip(".")


def answer(prompt: str, idea: str, files: list[str]) -> tuple[str, str]:
    """Pick the answer by what the prompt asks for; returns (kind, text)."""
    if "## nodes:" in prompt:
        nodes = prompt.split("## nodes:", 1)[1].split("## constraint", 1)[0]
        if "Task list" in nodes:
            return "tasks", tasks_answer(files)
        if "Implementation approach" in nodes:
            return "design", design_answer(files)
        if "Original Requirements" in nodes:
            return "prd", prd_answer(idea)
    if "## Code to be Reviewed:" in prompt and "Code Review Result" in prompt:
        return "review", review_answer(_after(prompt, "## Code to be Reviewed:"))
    if "## Code:" in prompt:
        return "code", code_answer(_after(prompt, "## Code:"))
    return "unknown", "OK"


def install_fake(latency_s: float, idea: str, files: list[str]) -> None:
    """Replace the one method every MetaGPT LLM call goes through."""
    from metagpt.provider.base_llm import BaseLLM
    from metagpt.provider.openai_api import OpenAILLM

    async def fake_completion_text(self, messages, stream=False, timeout=None) -> str:
        t0 = time.perf_counter()
        prompt = "\n".join(str(m.get("content", "")) for m in messages)
        kind, text = answer(prompt, idea, files)
        if latency_s:
            await asyncio.sleep(latency_s)
        STATS["calls"] += 1
        STATS["prompts"].append(prompt)
        STATS["kinds"].append(kind)
        STATS["unknown"] += kind == "unknown"
        STATS["llm_s"] += time.perf_counter() - t0
        return text

    OpenAILLM.acompletion_text = fake_completion_text
    BaseLLM.acompletion_text = fake_completion_text


def written_files(root: Path, files: list[str]) -> list[str]:
    """Task files that exist in the generated project (MetaGPT swallows write failures)."""
    found = {p.name for p in (root / "workspace").rglob("*.py")}
    return [f for f in files if f in found]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--files", type=int, default=10)
    ap.add_argument("--latency-ms", type=float, default=0.0)
    ap.add_argument("--idea", default="a command-line 2048 game")
    ap.add_argument("--root", required=True, help="METAGPT_PROJECT_ROOT (also set in the env)")
    ap.add_argument("--warm", action="store_true",
                    help="then run the team again in this process (one-time costs already paid)")
    ap.add_argument("--realistic", action="store_true", help="answers of a hosted model's size")
    args = ap.parse_args()
    files = task_files(args.files)
    global REALISTIC
    REALISTIC = args.realistic

    t0 = time.perf_counter()
    # Import time is one of the figures: everything the team run needs, not only the entry
    # module (generate_repo imports the roles, the team and the OpenAI provider lazily).
    import metagpt.provider.openai_api
    import metagpt.roles
    import metagpt.software_company as sc
    import metagpt.team  # noqa: F401
    import_s = time.perf_counter() - t0

    install_fake(args.latency_ms / 1000.0, args.idea, files)
    t0, c0 = time.perf_counter(), time.process_time()
    sc.generate_repo(args.idea, investment=3.0, n_round=5, code_review=True)
    run_s, run_cpu_s = time.perf_counter() - t0, time.process_time() - c0

    result = {
        "system": "metagpt",
        "import_s": import_s,
        "run_s": run_s,
        "run_cpu_s": run_cpu_s,
        "llm_s": STATS["llm_s"],
        "process_s": time.perf_counter() - T_PROCESS,
        "llm_calls": STATS["calls"],
        "call_kinds": STATS["kinds"],
        "unknown_calls": STATS["unknown"],
        "prompt_chars": sum(len(p) for p in STATS["prompts"]),
        "prompts": STATS["prompts"],
        "peak_rss_mb": _peak_rss_mb(),  # VmHWM: ru_maxrss survives exec (the parent's peak)
        "files_expected": files,
        "files_written": written_files(Path(args.root), files),
    }
    if args.warm:
        STATS.update(calls=0, llm_s=0.0, prompts=[], kinds=[], unknown=0)
        t0, c0 = time.perf_counter(), time.process_time()
        sc.generate_repo(args.idea, investment=3.0, n_round=5, code_review=True)
        result.update(warm_run_s=time.perf_counter() - t0, warm_llm_s=STATS["llm_s"],
                      warm_llm_calls=STATS["calls"], warm_run_cpu_s=time.process_time() - c0)
    print(json.dumps(result))


def _peak_rss_mb() -> float:
    """This process's peak RSS (as bench.compare.peak_rss_mb; this file runs in MetaGPT's venv)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


if __name__ == "__main__":
    main()

