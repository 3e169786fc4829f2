"""Answers of the size a capable hosted model writes, for both engines' fake models.

The default bench answers are tiny (a 10-line placeholder module, one-line fields): no
request of either engine then reaches the 1,024 tokens from which OpenAI caches a prompt,
so what a user would pay depends on the templates alone. These answers have the sizes a
real run has: a PRD with every list filled, a design whose class diagram has a class of
four methods per file and whose call flow has two lines per file, a task list with a
sentence per file, and modules of about 70 lines. The same texts go to MetaGPT 0.8.2
(bench/metagpt_fake_llm.py, run in its own venv: standard library only here) and to
sopctl (bench.compare's fake). The design leaves out sopctl's optional `Interfaces per
file`, as a model that skips optional fields would: that leans against sopctl.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

__all__ = ["prd", "design", "tasks", "code", "summary", "class_name"]


def class_name(filename: str) -> str:
    """module_3.py -> Module3 (what sopctl's `about` filter matches a file's lines by)."""
    return "".join(part.capitalize() for part in re.split(r"[_\W]+", Path(filename).stem) if part) or "Main"


def prd(idea: str, project: str) -> dict[str, Any]:
    return {
        "Language": "en_us",
        "Programming Language": "Python",
        "Original Requirements": idea,
        "Project Name": project,
        "Product Goals": ["Playable in any terminal with the arrow keys, with no installation beyond Python",
                          "Show the score and the best score at all times, and keep the best score between games",
                          "Start instantly and never lose a game in progress to a crash"],
        "User Stories": [f"As a player, I want {want} so that {why}" for want, why in (
            ("to slide the tiles with the arrow keys", "merging feels natural"),
            ("to see my score and my best score", "I know how well I am doing"),
            ("to start a new game with one key", "I can try again at once"),
            ("to be told when no move is left", "I am not left guessing"),
            ("the game to resize with my terminal", "it stays readable"))],
        "Competitive Analysis": [f"{name}: {verdict}" for name, verdict in (
            ("2048 web original", "clean and fast, but needs a browser"),
            ("gnome-2048", "polished, but tied to one desktop"),
            ("2048-cli", "small and terminal-based, but no best score and no colours"),
            ("2048 for Android", "smooth animations, but mobile only and full of ads"),
            ("term2048 (Python)", "terminal-based and scriptable, but unmaintained"),
            ("2048.c", "tiny and fast, but hard to extend"),
            ("Threes!", "the original idea, polished, but paid and different rules"))],
        "Competitive Quadrant Chart": "\n".join([
            "quadrantChart", '    title "Reach and engagement of 2048 games"',
            '    x-axis "Low reach" --> "High reach"', '    y-axis "Low engagement" --> "High engagement"',
            '    quadrant-1 "Expand"', '    quadrant-2 "Promote"', '    quadrant-3 "Re-evaluate"',
            '    quadrant-4 "Improve"', '    "2048 web original": [0.8, 0.7]', '    "gnome-2048": [0.3, 0.5]',
            '    "2048-cli": [0.2, 0.3]', '    "term2048": [0.25, 0.4]', '    "Our product": [0.5, 0.6]']),
        "Requirement Analysis": (
            "A single-player game loop on a 4x4 board, driven by the keyboard, with no network. The "
            "board logic must be independent of the display so that it can be tested, and the best "
            "score must survive between runs in a small file in the user's home folder."),
        "Requirement Pool": [["P0", "Slide and merge tiles in four directions"],
                             ["P0", "Spawn a 2 or a 4 after every move that changed the board"],
                             ["P1", "Show the score and persist the best score"],
                             ["P1", "Detect the end of the game and offer a new one"],
                             ["P2", "Colour the tiles by value where the terminal supports it"]],
        "UI Design draft": ("One screen: the 4x4 board in the middle, the score and the best score above it, "
                            "and the key hints below. Tiles are coloured by value; the end of the game is "
                            "shown as a banner over the board with the keys for a new game or quitting."),
        "Anything UNCLEAR": "",
    }


def _diagram(files: list[str]) -> str:
    lines = ["classDiagram"]
    for index, name in enumerate(files):
        cls = class_name(name)
        lines += [f"    class {cls} {{", "        -dict state", "        -int count",
                  "        +__init__(config: dict) None", f"        +load(source: str) {cls}",
                  "        +update(event: str) bool", "        +render() str", "    }"]
        if index:
            lines.append(f"    {cls} --> {class_name(files[index - 1])}")
    return "\n".join(lines)


def _flow(files: list[str]) -> str:
    lines = ["sequenceDiagram"] + [f"    participant {class_name(f)}" for f in files]
    for name in files:
        cls = class_name(name)
        lines += [f"    {class_name(files[-1])}->>{cls}: load(source)", f"    {cls}-->>{class_name(files[-1])}: update(event)"]
    return "\n".join(lines)


def design(files: list[str]) -> dict[str, Any]:
    return {
        "Implementation approach": (
            "The hard parts are keeping the game logic testable and drawing the board portably. The "
            "logic lives in plain classes with no input or output, one concern per module, so that "
            "each can be unit-tested; the entry point wires them together and owns the terminal "
            "through curses from the standard library, which works on every Unix terminal and on "
            "Windows with windows-curses. The best score is kept as JSON in the user's home folder. "
            "No third-party package is needed."),
        "File list": files,
        "Data structures and interfaces": _diagram(files),
        "Program call flow": _flow(files),
        "Anything UNCLEAR": "",
    }


def tasks(files: list[str]) -> dict[str, Any]:
    return {
        "Required packages": [],
        "Required Other language third-party packages": ["No third-party dependencies required"],
        "Logic Analysis": [[f, f"{class_name(f)}: loads its part of the game state, updates it on each "
                               f"event and renders it as text (part {i} of the program)"]
                           for i, f in enumerate(files, 1)],
        "Task list": files,
        "Full API spec": "",
        "Shared Knowledge": ("Events are the strings up, down, left, right, new and quit. Every class takes "
                             "its settings as a dict with defaults for every key, and render() returns text "
                             "without colour codes; main.py adds the colours."),
        "Anything UNCLEAR": "",
    }


def code(filename: str) -> str:
    """A module of about 70 lines: the class the design gives the file."""
    cls, stem = class_name(filename), Path(filename).stem
    return f'''"""{stem}: the {cls} part of the game (its state, its updates, its text)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

DEFAULTS = {{"size": 4, "target": 2048, "seed": 0, "name": "{stem}"}}
EVENTS = ("up", "down", "left", "right", "new", "quit")


@dataclass
class {cls}:
    """The {stem} part of the game: a small state machine driven by key events."""

    config: dict = field(default_factory=dict)
    state: dict = field(default_factory=dict)
    count: int = 0

    def __post_init__(self) -> None:
        self.config = {{**DEFAULTS, **self.config}}
        self.state = {{"cells": [[0] * self.config["size"] for _ in range(self.config["size"])],
                      "score": 0, "over": False}}

    @classmethod
    def load(cls, source: str) -> "{cls}":
        """Read a saved state (JSON) or start afresh when there is none."""
        path = Path(source)
        if not path.exists():
            return cls()
        data = json.loads(path.read_text(encoding="utf-8"))
        part = cls(config=data.get("config", {{}}))
        part.state.update(data.get("state", {{}}))
        part.count = int(data.get("count", 0))
        return part

    def update(self, event: str) -> bool:
        """Apply one key event; True when the state changed."""
        if event not in EVENTS:
            raise ValueError(f"unknown event {{event!r}}; expected one of {{', '.join(EVENTS)}}")
        if event == "quit" or self.state["over"]:
            return False
        if event == "new":
            self.__post_init__()
            self.count = 0
            return True
        self.count += 1
        cells = self.state["cells"]
        before = [row[:] for row in cells]
        for row in cells:
            merged = [v for v in row if v]
            row[:] = merged + [0] * (len(row) - len(merged))
        self.state["score"] += sum(sum(row) for row in cells) - sum(sum(row) for row in before)
        self.state["over"] = all(all(row) for row in cells)
        return cells != before

    def render(self) -> str:
        """The state as plain text, one line per row of the board."""
        rows = [" ".join(f"{{v:>5}}" if v else "    ." for v in row) for row in self.state["cells"]]
        header = f"{{self.config['name']}}: score {{self.state['score']}}, moves {{self.count}}"
        return "\\n".join([header, *rows])


if __name__ == "__main__":
    print({cls}().render())
'''


def summary(files: list[str]) -> dict[str, Any]:
    return {
        "Code Review All": " ".join(f"{f}: complete, follows the design's {class_name(f)}." for f in files),
        "Call flow": _flow(files),
        "Summary": ("Each module holds one class with the same small interface (load, update, render); "
                    "main.py builds them, feeds them key events and draws what they render."),
        "TODOs": {},
    }
