"""`about`: a file's part of a design's diagram when the design has no row for the file."""
from __future__ import annotations

from engine.templates.sandbox import environment


def render(text: str, **values: object) -> str:
    return environment().from_string(text).render(**values)


DIAGRAM = "classDiagram\n" + "".join(
    f"    class Part{i} {{\n        +run(x: int) int\n    }}\n" for i in range(200)) + \
    "    Part1 --> Part2\n    Game_Board ..> Part7\n"


def test_a_long_diagram_is_cut_to_the_lines_that_name_the_files() -> None:
    shown = render("{{ d | about(['pkg/part1.py', 'game_board.py']) }}", d=DIAGRAM)
    assert shown.splitlines()[0] == "classDiagram"
    assert "class Part1 {" in shown and "+run(x: int) int" in shown      # the class block whole
    assert "Part1 --> Part2" in shown and "Game_Board ..> Part7" in shown
    assert "class Part2 {" not in shown and len(shown) < 300


def test_a_short_diagram_is_shown_whole_and_nothing_named_says_so() -> None:
    assert render("{{ d | about(['x.py']) }}", d="classDiagram\n  class A") == "classDiagram\n  class A"
    shown = render("{{ d | about(['nothing.py']) }}", d=DIAGRAM)
    assert "names nothing of nothing.py" in shown and "class Part1" not in shown
    assert render("{{ none | about(['x.py']) }}", none=None) == ""


def test_a_bound_of_zero_cuts_even_a_short_diagram() -> None:
    """`about(files, 0)`, as the shipped review quotes a design: only the file's own lines."""
    short = "classDiagram\n    class Game {\n        +move(d: str) bool\n    }\n    class Board {\n    }\n    Game --> Board\n"
    assert render("{{ d | about(['game.py']) }}", d=short) == short
    shown = render("{{ d | about(['game.py'], 0) }}", d=short)
    assert "class Game {" in shown and "+move(d: str) bool" in shown and "Game --> Board" in shown
    assert "class Board {" not in shown


def test_a_one_line_diagram_is_shown_as_it_is() -> None:
    """Nothing to cut and nothing left out: no note that lines were not shown."""
    assert render("{{ d | about(['game.py'], 0) }}", d="Example interfaces") == "Example interfaces"
