"""The `editor` toolset in a tool loop: ranged reads and a windowed view of code, line edits,
search and find, several files written in one step, outputs that say which lines they show
(never cut blind), and paths confined to the workspace."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
from run_helpers import run_sop, sop_text

from engine.compile.compiler import compile_path
from engine.load.catalog import MAX_WRITE_BYTES
from engine.run.events import ToolCalled
from engine.run.toolloop import MAX_OUTPUT_CHARS
from engine.run.tools.editor import MAX_SEARCH_HITS, Editor
from engine.run.workspace import Workspace
from engine.testing import ScriptedModel, use_model

CODER = """
apiVersion: sop/v1
name: editor_test
inputs:
  idea: {required: true}
actions:
  Code:
    prompt: "Work on {{ inputs.idea }}"
    tools: [editor]
    max_steps: 8
    output:
      Summary: {type: str}
roles:
  Coder:
    actions: [Code]
    watch: [UserRequirement]
"""

LINES_400 = "".join(f"line {n}\n" for n in range(1, 401))


def step(*commands: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"thought": "next", "commands": [{"command_name": n, "args": a} for n, a in commands]}


END = ("end", {"Summary": "done"})


def loop(ws: Path, *steps: dict[str, Any], files: dict[str, str] | None = None) -> tuple[Any, list[str]]:
    """Run the steps (then `end`) on a workspace seeded with `files`; the result and the
    prompts, where prompts[k] shows the outputs of step k (1-based)."""
    for rel, text in (files or {}).items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(text, encoding="utf-8")
    model = ScriptedModel([*steps, step(END)])
    result = run_sop(sop_text(CODER), model, ws)
    assert result.status == "idle", result.error
    return result, model.prompts()


def outputs(result: Any) -> list[str]:
    return [e.output for e in result.events if isinstance(e, ToolCalled)]


def test_a_range_of_a_400_line_file_is_read(tmp_path: Path) -> None:
    result, prompts = loop(tmp_path, step(("editor.read", {"path": "app.py", "start": 291, "end": 300})),
                           files={"app.py": LINES_400})
    shown = outputs(result)[0]
    assert shown.splitlines()[0] == (
        '[app.py: lines 291-300 of 400; 290 above: editor.read {"path": "app.py", "start": 191, '
        '"end": 290}; 100 below: editor.read {"path": "app.py", "start": 301}]')
    assert shown.splitlines()[1:] == [f"{n}|line {n}" for n in range(291, 301)]
    assert "300|line 300" in prompts[1] and "301|" not in prompts[1]


def test_a_whole_read_too_big_is_shortened_to_whole_lines_with_the_next_range(tmp_path: Path) -> None:
    result, _ = loop(tmp_path, step(("editor.read", {"path": "big.py"})),
                     files={"big.py": "".join(f"{'x' * 60} {n}\n" for n in range(1, 1001))})
    shown = outputs(result)[0]
    assert len(shown) <= MAX_OUTPUT_CHARS
    header, *rows, footer = shown.splitlines()
    last = len(rows)
    assert rows[-1] == f"{last}|{'x' * 60} {last}"           # whole lines only
    assert header.startswith(f"[big.py: lines 1-{last} of 1000; shortened to fit 8,000 characters;")
    assert footer == f'[shortened at line {last}; next: editor.read {{"path": "big.py", "start": {last + 1}}}]'


def test_a_huge_line_is_cut_saying_so(tmp_path: Path) -> None:
    result, prompts = loop(tmp_path, step(("editor.read", {"path": "min.js"})),
                           files={"min.js": "y" * 30_000 + "\nshort\n"})
    shown = outputs(result)[0]
    assert "[line 1 is 30,000 characters; the first" in shown
    assert '1 below: editor.read {"path": "min.js", "start": 2}' in shown
    assert "y" * (MAX_OUTPUT_CHARS + 1) not in prompts[1] and "[output cut" not in prompts[1]


def test_the_window_opens_at_a_line_and_scrolls(tmp_path: Path) -> None:
    result, _ = loop(tmp_path,
                     step(("editor.open", {"path": "app.py", "line": 150, "window": 20})),
                     step(("editor.scroll_down", {}), ("editor.scroll_down", {"path": "app.py"})),
                     step(("editor.scroll_up", {})),
                     step(("editor.open", {"path": "app.py", "line": 400, "window": 20}),
                          ("editor.scroll_down", {})),
                     files={"app.py": LINES_400})
    headers = [o.splitlines()[0] for o in outputs(result)]
    assert headers[0] == ('[app.py: lines 140-159 of 400 (a window of 20); 139 above: editor.scroll_up '
                          '{"path": "app.py"}; 241 below: editor.scroll_down {"path": "app.py"}]')
    assert [h.split(";")[0] for h in headers[1:4]] == [
        "[app.py: lines 160-179 of 400 (a window of 20)", "[app.py: lines 180-199 of 400 (a window of 20)",
        "[app.py: lines 160-179 of 400 (a window of 20)"]
    assert headers[4] == ('[app.py: lines 381-400 of 400 (a window of 20); 380 above: editor.scroll_up '
                          '{"path": "app.py"}]')
    assert outputs(result)[5] == "[app.py: already at the end; lines 381-400 of 400 were shown]"


def test_a_scroll_with_nothing_open_says_what_to_do(tmp_path: Path) -> None:
    _, prompts = loop(tmp_path, step(("editor.scroll_down", {})))
    assert "editor.scroll_down failed: no file is open; give editor.open first" in prompts[1]


def test_lines_are_inserted_replaced_and_appended(tmp_path: Path) -> None:
    result, _ = loop(tmp_path,
                     step(("editor.insert", {"path": "m.py", "line": 2, "content": "import os\nimport re\n"})),
                     step(("editor.replace_lines", {"path": "m.py", "start": 4, "end": 5, "content": "x = 2"})),
                     step(("editor.append", {"path": "m.py", "content": "print(x)\n"})),
                     step(("editor.replace_lines", {"path": "m.py", "start": 1, "end": 1, "content": ""})),
                     files={"m.py": "# m\nx = 1\ny = 1\n"})
    assert (tmp_path / "m.py").read_text() == "import os\nimport re\nx = 2\nprint(x)\n"
    shown = outputs(result)
    assert shown[0].startswith("inserted 2 lines before line 2 of m.py (now 5 lines)\n[m.py: lines 1-5 of 5]\n"
                               "1|# m\n2|import os\n3|import re\n4|x = 1")
    assert shown[1].startswith("replaced lines 4-5 of m.py with 1 lines (now 4 lines)")
    assert shown[2].startswith("appended 1 lines to m.py (now 5 lines)") and "5|print(x)" in shown[2]
    assert shown[3].startswith("replaced lines 1-1 of m.py with 0 lines (now 4 lines)")
    assert "m.py" in result.artifacts


def test_an_append_creates_a_file_and_keeps_a_missing_newline_apart(tmp_path: Path) -> None:
    loop(tmp_path, step(("editor.append", {"path": "new/notes.md", "content": "one"})),
         step(("editor.append", {"path": "new/notes.md", "content": "two\n"})))
    assert (tmp_path / "new" / "notes.md").read_text() == "one\ntwo\n"


def test_line_numbers_out_of_the_file_go_back_to_the_model(tmp_path: Path) -> None:
    _, prompts = loop(tmp_path,
                      step(("editor.insert", {"path": "m.py", "line": 9, "content": "z"})),
                      step(("editor.replace_lines", {"path": "m.py", "start": 2, "end": 7, "content": "z"})),
                      step(("editor.read", {"path": "m.py", "start": 2, "end": 1})),
                      step(("editor.read", {"path": "m.py", "start": 0})),
                      files={"m.py": "a\nb\n"})
    assert "m.py has 2 lines: insert at a line from 1 to 3 (the end)" in prompts[1]
    assert "m.py has 2 lines; `end` (7) is past its end" in prompts[2]
    assert "`end` (1) is before `start` (2)" in prompts[3]
    assert "the arguments do not match the command's schema" in prompts[4]
    assert (tmp_path / "m.py").read_text() == "a\nb\n"


def test_search_in_one_file_or_under_a_folder(tmp_path: Path) -> None:
    files = {"src/a.py": "def main():\n    pass\n", "src/b.py": "main()\n", "docs/readme.md": "run main\n"}
    result, _ = loop(tmp_path, step(("editor.search", {"term": "main", "path": "src/a.py"}),
                                    ("editor.search", {"term": "main", "path": "src"}),
                                    ("editor.search", {"term": "main"}),
                                    ("editor.search", {"term": "absent", "path": "src"})), files=files)
    shown = outputs(result)
    assert shown[0] == "src/a.py:1: def main():"
    assert shown[1] == "src/a.py:1: def main():\nsrc/b.py:1: main()"
    assert shown[2] == "docs/readme.md:1: run main\nsrc/a.py:1: def main():\nsrc/b.py:1: main()"
    assert shown[3] == "no line contains 'absent'"


def test_a_search_with_too_many_hits_says_to_narrow_it(tmp_path: Path) -> None:
    result, _ = loop(tmp_path, step(("editor.search", {"term": "line"})), files={"app.py": LINES_400})
    shown = outputs(result)[0]
    assert len(shown) <= MAX_OUTPUT_CHARS
    assert shown.endswith("matching lines shown; there are more: narrow the search (a longer term, "
                          "or a file or folder as `path`)]")
    assert len(shown.splitlines()) - 1 <= MAX_SEARCH_HITS


def test_files_are_found_by_name(tmp_path: Path) -> None:
    files = {"src/game.py": "", "src/test_game.py": "", "tests/test_ui.py": "", "README.md": "",
             ".git/config.py": ""}
    result, _ = loop(tmp_path, step(("editor.find", {"pattern": "test_*.py"}),
                                    ("editor.find", {"pattern": "*.py", "path": "src"}),
                                    ("editor.find", {"pattern": "tests/*"}),
                                    ("editor.find", {"pattern": "*.rs"})), files=files)
    assert outputs(result) == ["src/test_game.py\ntests/test_ui.py", "src/game.py\nsrc/test_game.py",
                               "tests/test_ui.py", "no file under . matches '*.rs'"]


def test_writes_to_different_files_and_an_end_run_in_one_step(tmp_path: Path) -> None:
    model = ScriptedModel([step(("editor.write", {"path": "a.py", "content": "a = 1\n"}),
                                ("editor.write", {"path": "b.py", "content": "b = 2\n"}),
                                ("editor.append", {"path": "c.py", "content": "c = 3\n"}), END)])
    result = run_sop(sop_text(CODER), model, tmp_path)
    assert result.status == "idle", result.error
    assert model.calls == 1                       # the `end` of the first step was taken
    assert [(tmp_path / f).read_text() for f in ("a.py", "b.py", "c.py")] == ["a = 1\n", "b = 2\n", "c = 3\n"]
    assert result.messages[-1].out == {"Summary": "done"}
    assert {"a.py", "b.py", "c.py"} <= set(result.artifacts)


def test_two_edits_of_one_file_in_one_step_conflict(tmp_path: Path) -> None:
    result, prompts = loop(tmp_path, step(("editor.write", {"path": "a.py", "content": "a = 1\n"}),
                                          ("editor.insert", {"path": "./a.py", "line": 1, "content": "#\n"}),
                                          ("editor.write", {"path": "b.py", "content": "b"}), END),
                           step(("editor.read", {"path": "a.py"})))
    assert (tmp_path / "a.py").read_text() == "a = 1\n" and not (tmp_path / "b.py").exists()
    assert ("Not run, a second edit of a.py in one step: editor.insert, editor.write, end. Give it in "
            "the next step, once you have seen the first edit's result.") in prompts[1]
    assert [e.tool for e in result.events if isinstance(e, ToolCalled)] == ["editor.write", "editor.read"]


def test_a_file_over_the_write_bound_is_refused_telling_the_bound(tmp_path: Path) -> None:
    _, prompts = loop(tmp_path, step(("editor.write", {"path": "big.txt", "content": "z" * (MAX_WRITE_BYTES + 1)})))
    assert (f"big.txt would be {MAX_WRITE_BYTES + 1:,} bytes; a file the editor writes is at most "
            f"{MAX_WRITE_BYTES:,} bytes") in prompts[1]
    assert not (tmp_path / "big.txt").exists()


def test_paths_stay_confined(tmp_path: Path) -> None:
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret\n")
    ws.mkdir()
    os.symlink(outside, ws / "link")
    os.symlink(outside / "secret.txt", ws / "s.txt")
    result, prompts = loop(ws, step(("editor.read", {"path": "link/secret.txt"})),
                           step(("editor.open", {"path": "s.txt"})),
                           step(("editor.insert", {"path": "s.txt", "line": 1, "content": "x"})),
                           step(("editor.append", {"path": "../escape.txt", "content": "x"})),
                           step(("editor.search", {"term": "secret"}), ("editor.find", {"pattern": "*.txt"}),
                                ("editor.search", {"term": "secret", "path": "link"})),
                           step(("editor.read", {"path": ".sopctl/journal.sqlite"})))
    assert "goes through a symlink and leads outside the workspace; refused" in prompts[1]
    assert "'s.txt' goes through a symlink" in prompts[2] and "'s.txt' goes through a symlink" in prompts[3]
    assert "contains '..'" in prompts[4]
    assert outputs(result)[4:6] == ["no line contains 'secret'", "no file under . matches '*.txt'"]
    assert "goes through a symlink" in outputs(result)[6]
    assert "writes into .sopctl/" in prompts[6]
    assert (outside / "secret.txt").read_text() == "secret\n" and not (tmp_path / "escape.txt").exists()


def test_a_resumed_loop_scrolls_on_from_the_window_in_the_journal(tmp_path: Path) -> None:
    from engine import api

    (tmp_path / "editor.sop.yaml").write_text(CODER)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "app.py").write_text(LINES_400)
    steps = [step(("editor.open", {"path": "app.py", "window": 10})), step(("editor.scroll_down", {})),
             step(END)]

    def killed_before_the_scroll(spec: Any, attempt: int) -> Any:
        if any("editor.open: " in turn["content"] for turn in spec.turns):
            raise KeyboardInterrupt   # the process dies while step 2 is asked
        return steps[0]
    with use_model(ScriptedModel(killed_before_the_scroll)), pytest.raises(KeyboardInterrupt):
        api.run(compile_path(tmp_path / "editor.sop.yaml"), {"idea": "an idea"}, api.RunOptions(workspace=ws))
    rest = ScriptedModel(steps[1:])
    with use_model(rest):
        resumed = api.resume(ws)
    assert resumed.status == "idle", resumed.error
    assert "[app.py: lines 11-20 of 400 (a window of 10)" in rest.prompts()[1]


def test_the_window_is_the_editors_own_state(tmp_path: Path) -> None:
    """Kept per file; an outcome carries it, so one taken from the journal sets it again."""
    async def scenario() -> tuple[Any, Any]:
        editor = Editor(Workspace(tmp_path))
        opened = await editor.do_open("a.txt", line=1, window=5)
        again = Editor(Workspace(tmp_path))
        again.restore(opened.state)
        return opened, await again.do_scroll_down()

    (tmp_path / "a.txt").write_text(LINES_400)
    opened, scrolled = asyncio.run(scenario())
    assert opened.state == {"window": {"path": "a.txt", "top": 1, "size": 5, "last": 5}}
    assert scrolled.output.startswith("[a.txt: lines 6-10 of 400 (a window of 5)")
