"""The template sandbox: a shared SOP's template cannot build a huge value, only fail cleanly.

"refused by the sandbox" means the value was refused *before* it was built; the output-size
check alone would only see it after the memory was spent.
"""

from __future__ import annotations

import pytest

from engine.check.sandbox import TemplateFailure, render_template

BOMBS = {
    "repeat": "{{ 'x' * 10**9 }}",
    "concat doubling": "{% set a = 'x' * 600000 %}{% set a = a ~ a %}{{ a|length }}",
    "plus doubling": "{% set a = 'x' * 600000 %}{% set a = a + a %}{{ a|length }}",
    "list doubling": "{% set a = [1] * 600000 %}{% set a = a + a %}{{ a|length }}",
    "center filter": "{{ 'x'|center(10**9) }}",
    "center method": "{{ 'x'.center(10**9) }}",
    "indent": "{{ 'x\nx'|indent(10**9) }}",
    "replace": "{{ ('a' * 100000)|replace('a', 'b' * 50) }}",
    "str.format width": "{{ '{:>1000000000}'.format('x') }}",
    "format filter width": "{{ '%1000000000s'|format('x') }}",
    "range": "{% for i in range(10**8) %}{% endfor %}",
}


@pytest.mark.parametrize("template", BOMBS.values(), ids=BOMBS.keys())
def test_a_template_bomb_is_refused_before_it_is_built(template):
    with pytest.raises(TemplateFailure, match="refused by the sandbox"):
        render_template(template, {})


def test_ordinary_templates_still_render():
    template = ("{{ 'ab' ~ 'cd' }}|{{ [1, 2] + [3] }}|{{ 'x'|center(3) }}|{{ 'a-b'|replace('-', '+') }}|"
                "{{ '{:>3}'.format(1) }}|{{ [3, 1]|sort|join(',') }}|{{ {'a': 1}|tojson }}|{{ 'abc'|upper }}")
    assert render_template(template, {}) == 'abcd|[1, 2, 3]| x |a+b|  1|1,3|{"a": 1}|ABC'


def test_the_rendered_output_is_still_bounded():
    with pytest.raises(TemplateFailure, match="exceeds the limit"):
        render_template("{% for i in range(2000) %}{{ 'x' * 900 }}{% endfor %}", {})


def test_the_sandbox_still_refuses_python_internals():
    with pytest.raises(TemplateFailure, match="sandbox"):
        render_template("{{ ''.__class__.__mro__ }}", {})


@pytest.mark.parametrize("value, expected", [
    ("Program call flow: Aerius", "Program_call_flow_Aerius.py"),
    ("src/game.py", "src/game.py"),
    ("../../etc/passwd", "etc/passwd.py"),          # never leaves the workspace
    ("/abs/x.py", "abs/x.py"),
    ("   ", "file.py"),
    ("dataiku vs. datarobot", "dataiku_vs_datarobot.py"),  # a dot in the text is no extension
    ("v1.2 notes", "v1.2_notes.py"),
    ("archive.tar.gz", "archive.tar.gz"),
])
def test_file_name_turns_model_text_into_a_safe_relative_path(value, expected):
    assert render_template("{{ v | file_name('.py') }}", {"v": value}) == expected


def test_slug_makes_an_identifier_from_model_text():
    assert render_template("{{ v | slug }}|{{ '' | slug }}", {"v": "Aerius 2048: The Game!"}) == "aerius_2048_the_game|x"
