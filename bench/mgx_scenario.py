"""The MGX team's scenario of bench.prefix_bench, the same texts for both engines.

The user asks for a command-line 2048 game. Mike (the TeamLeader) plans three tasks and
assigns the PRD to Alice; Alice writes it with the editor, then ends; Mike marks the task
finished and assigns the design to Bob, who writes it and ends; then the code to Alex, who
writes one module and ends; then Mike tells the user it is done and ends. Every Mike turn
is one step (its commands, then `end`), every member's two (the file, then `end` with a
summary). The files are answers of a hosted model's size (bench/realistic_answers.py: a
full PRD, the design of one module, a module of about 70 lines).

What differs between the engines is only how a step is written: RoleZero's format (prose,
then a fenced JSON array of commands named `Plan.append_task`, `TeamLeader.publish_team_message`,
`RoleZero.reply_to_human`, `Editor.write`, `end`) for MetaGPT main (bench/metagpt_mgx.py),
sopctl's (a JSON object of a thought and commands named `plan.append_task`, `team.publish`,
`human.reply`, `editor.write`, `end` with the action's output) for sopctl. Standard library
only: bench/metagpt_mgx.py imports it inside MetaGPT main's venv (this file's folder is on
its sys.path).
"""
from __future__ import annotations

import functools
import json
from typing import Any

try:
    import realistic_answers  # run as a script in MetaGPT main's venv: this file's folder is on sys.path
except ImportError:   # imported as bench.mgx_scenario
    from bench import realistic_answers

__all__ = ["IDEA", "MEMBERS", "PRD_PATH", "DESIGN_PATH", "CODE_PATH", "STEPPER", "leader_turns", "member_work",
           "member_steps", "metagpt_leader", "metagpt_member", "sopctl_leader", "sopctl_member", "files"]

IDEA = "a command-line 2048 game"
PROJECT = "game_2048"
PRD_PATH, DESIGN_PATH, CODE_PATH = "docs/prd.md", "docs/system_design.md", "game.py"
MEMBERS = ("Alice", "Bob", "Alex")
"""Who works, in order (David, the data analyst, is on the team but gets no task)."""
STEPPER = "Alex"
"""The member whose loop may take `extra` steps before its file (bench.toolloop_bench: CPU
per extra tool step inside the team): each a plan append of one part of the code."""


def _markdown(title: str, fields: dict[str, Any]) -> str:
    """A document's fields as Markdown sections (lists as bullets, rows as `a: b`)."""
    parts = [f"# {title}"]
    for key, value in fields.items():
        if isinstance(value, list):
            body = "\n".join(f"- {': '.join(item) if isinstance(item, list) else item}" for item in value)
        elif key in ("Competitive Quadrant Chart", "Data structures and interfaces", "Program call flow"):
            body = f"```mermaid\n{value}\n```"
        else:
            body = str(value)
        parts.append(f"## {key}\n{body or '-'}")
    return "\n\n".join(parts) + "\n"


@functools.lru_cache(maxsize=1)
def files() -> dict[str, str]:
    """The three files the members write, by path."""
    return {PRD_PATH: _markdown("PRD: a command-line 2048 game", realistic_answers.prd(IDEA, PROJECT)),
            DESIGN_PATH: _markdown("System design: a command-line 2048 game",
                                   realistic_answers.design([CODE_PATH])),
            CODE_PATH: realistic_answers.code(CODE_PATH)}


def leader_turns() -> list[dict[str, Any]]:
    """Mike's turns, in order: a thought, the tasks he plans, whether he finishes the current
    one, whom he sends what, what he tells the user, and his end-of-turn status."""
    return [
        {"thought": "A software task: a PRD, then a system design, then the code. Alice starts; I plan "
                    "all three tasks at once.",
         "plan": [("1", [], "Write the PRD for a command-line 2048 game in Python (standard library only, "
                            f"curses UI) to {PRD_PATH}.", "Alice"),
                  ("2", ["1"], f"Design the system from {PRD_PATH} and write it to {DESIGN_PATH}.", "Bob"),
                  ("3", ["2"], f"Write the game in Python from {DESIGN_PATH}.", "Alex")],
         "finish": False, "send_to": "Alice",
         "content": f"Write the PRD for {IDEA} in Python (standard library only, curses UI) to {PRD_PATH}: "
                    "goals, user stories, requirement pool P0-P2, UI sketch, open questions.",
         "reply": "Alice is writing the PRD; Bob designs the system next, then Alex writes the code.",
         "status": "PRD assigned to Alice."},
        {"thought": "Alice has written the PRD: her task is done. The design is next, for Bob.",
         "plan": [], "finish": True, "send_to": "Bob",
         "content": f"Read the PRD at {PRD_PATH} and write the system design of {IDEA} in Python (standard "
                    f"library only, curses UI) to {DESIGN_PATH}: approach, file list, data structures, call flow.",
         "reply": "The PRD is written; Bob is designing the system.",
         "status": "Design assigned to Bob."},
        {"thought": "Bob has written the design: his task is done. The code is next, for Alex.",
         "plan": [], "finish": True, "send_to": "Alex",
         "content": f"Read the system design at {DESIGN_PATH} (and the PRD at {PRD_PATH}) and write {IDEA} "
                    f"in Python, standard library only, as it says: the module {CODE_PATH}.",
         "reply": "The design is written; Alex is writing the code.",
         "status": "Code assigned to Alex."},
        {"thought": "Alex has written the code: the last task is done, and so is the request.",
         "plan": [], "finish": True, "send_to": None, "content": None,
         "reply": f"The 2048 game is done: the PRD is in {PRD_PATH}, the design in {DESIGN_PATH} and the "
                  f"code in {CODE_PATH}.",
         "status": "The request is done."},
    ]


@functools.lru_cache(maxsize=1)
def member_work() -> dict[str, dict[str, str]]:
    """Each member's two steps: the file it writes, then its summary (its `end`)."""
    written = files()
    return {
        "Alice": {"write": f"I write the PRD to {PRD_PATH}.", "path": PRD_PATH, "content": written[PRD_PATH],
                  "end": "The PRD is written; I end here.",
                  "summary": f"Wrote the PRD of the 2048 game to {PRD_PATH}: goals, user stories, competitive "
                             "analysis, requirement pool (P0-P2), UI design draft."},
        "Bob": {"write": f"I write the system design to {DESIGN_PATH}.", "path": DESIGN_PATH,
                "content": written[DESIGN_PATH], "end": "The design is written; I end here.",
                "summary": f"Wrote the system design to {DESIGN_PATH}: curses UI, one module {CODE_PATH} "
                           "with the Game class (load, update, render), its call flow."},
        "Alex": {"write": f"I write {CODE_PATH} as the design says.", "path": CODE_PATH,
                 "content": written[CODE_PATH], "end": "The code is written; I end here.",
                 "summary": f"Wrote {CODE_PATH}: the Game class (load, update, render) with a main entry point."},
    }


# --------------------------------------------------------------------------- the two formats

def _fenced(thought: str, commands: list[dict[str, Any]]) -> str:
    """RoleZero's format: the thought, then one fenced JSON array of commands."""
    return f"{thought}\n```json\n{json.dumps(commands, indent=4, ensure_ascii=False)}\n```"


def metagpt_leader(turn: int) -> str:
    """Mike's answer on MetaGPT main for his `turn` (0-based), in RoleZero's format."""
    spec = leader_turns()[turn]
    commands: list[dict[str, Any]] = [
        {"command_name": "Plan.append_task", "args": {"task_id": task_id, "dependent_task_ids": after,
                                                      "instruction": instruction, "assignee": assignee}}
        for task_id, after, instruction, assignee in spec["plan"]]
    if spec["finish"]:
        commands.append({"command_name": "Plan.finish_current_task", "args": {}})
    if spec["send_to"]:
        commands.append({"command_name": "TeamLeader.publish_team_message",
                         "args": {"content": spec["content"], "send_to": spec["send_to"]}})
    commands += [{"command_name": "RoleZero.reply_to_human", "args": {"content": spec["reply"]}},
                 {"command_name": "end", "args": {}}]
    return _fenced(spec["thought"], commands)


def member_steps(name: str, extra: int = 0) -> int:
    """How many steps the member's loop takes: the file, then `end`; STEPPER's `extra` more first."""
    return 2 + (extra if name == STEPPER else 0)


def _member_step(name: str, step: int, extra: int) -> tuple[tuple[str, str] | None, int]:
    """An extra step's task (its id and instruction) when STEPPER's `step` is one of its `extra`
    first, else None; and the step counted from the file (0: the file, 1: `end`)."""
    if name != STEPPER:
        return None, step
    if step < extra:
        return (f"a{step + 1}", f"Write part {step + 1} of {CODE_PATH}."), step
    return None, step - extra


def metagpt_member(name: str, step: int, extra: int = 0) -> str:
    """A member's answer on MetaGPT main for its `step` (the file, then `end`; STEPPER's
    `extra` plan appends first)."""
    work = member_work()[name]
    part, step = _member_step(name, step, extra)
    if part is not None:
        return _fenced(f"I plan part {step + 1}.", [{"command_name": "Plan.append_task", "args": {
            "task_id": part[0], "dependent_task_ids": [], "instruction": part[1], "assignee": name}}])
    if step == 0:
        return _fenced(work["write"], [{"command_name": "Editor.write",
                                        "args": {"path": work["path"], "content": work["content"]}}])
    return _fenced(work["end"], [{"command_name": "end", "args": {}}])


def sopctl_leader(turn: int) -> dict[str, Any]:
    """Mike's answer on sopctl for his `turn` (0-based): its thought and commands."""
    spec = leader_turns()[turn]
    commands: list[dict[str, Any]] = [
        {"command_name": "plan.append_task", "args": {"task_id": task_id, "instruction": instruction,
                                                      "dependent_task_ids": after, "assignee": assignee}}
        for task_id, after, instruction, assignee in spec["plan"]]
    if spec["finish"]:
        commands.append({"command_name": "plan.finish_current_task", "args": {}})
    if spec["send_to"]:
        commands.append({"command_name": "team.publish",
                         "args": {"send_to": spec["send_to"], "content": spec["content"]}})
    commands += [{"command_name": "human.reply", "args": {"text": spec["reply"]}},
                 {"command_name": "end", "args": {"answer": spec["status"]}}]
    return {"thought": spec["thought"], "commands": commands}


def sopctl_member(name: str, step: int, extra: int = 0) -> dict[str, Any]:
    """A member's answer on sopctl for its `step` (the file, then `end` with its summary;
    STEPPER's `extra` plan appends first)."""
    work = member_work()[name]
    part, step = _member_step(name, step, extra)
    if part is not None:
        return {"thought": f"I plan part {step + 1}.", "commands": [{"command_name": "plan.append_task", "args": {
            "task_id": part[0], "instruction": part[1], "dependent_task_ids": [], "assignee": name}}]}
    if step == 0:
        return {"thought": work["write"], "commands": [{"command_name": "editor.write",
                                                        "args": {"path": work["path"], "content": work["content"]}}]}
    return {"thought": work["end"], "commands": [{"command_name": "end", "args": {"answer": work["summary"]}}]}
