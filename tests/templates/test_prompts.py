"""The template sandbox: a shared SOP's template cannot build a huge value, only fail cleanly.

"refused by the sandbox" means the value was refused *before* it was built; the output-size
check alone would only see it after the memory was spent.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from engine.templates import render
from engine.templates.render import compile_expression, render_template
from engine.templates.sandbox import TemplateFailure
from run_helpers import ROOT

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
    "power": "{{ 2 ** (10**10) }}",
    "squaring": "{% set ns = namespace(x=3) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}{% endfor %}",
    "percent width": "{{ '%999999999s' % 'x' }}",
    "percent widths together": "{{ ('%999999s' * 50)|format(*range(50)) }}",
    "bytes repeat": "{{ 'x'.encode() * 10**9 }}",
    "lipsum": "{{ lipsum(1000000) }}",
    "indent on a long text": "{% set t = 'x\n' * 400000 %}{{ t|indent(999999) }}",
    "wordwrap string": "{{ ('x ' * 400000)|wordwrap(1, wrapstring='y' * 1000) }}",
    "expandtabs": "{{ ('\t' * 100000).expandtabs(999999) }}",
    "shared rows": "{% set a = [0] * 1000 %}{% set b = [a] * 1000 %}{{ [b] * 1000 }}",
    "nested displays": "{% set a = ['x' * 1000] * 900 %}{% set b = [a, a, a, a, a, a, a, a, a, a] %}"
                       "{{ [b, b, b, b, b, b, b, b, b, b] }}",
    "format fields": "{{ ('{0}' * 1000).format('x' * 100000) }}",
    "join of shared": "{{ (['x' * 100000] * 10)|join }}",
    # the filters that only select (first, last, default, where) are not weighed after: what
    # they select was weighed when it was built
    "doubling under first": "{% set a = ['x' * 600000] %}{{ (a + a)|first }}",
    "doubling under default": "{% set a = 'x' * 600000 %}{{ (a ~ a)|default('') }}",
    "doubling under where": "{% set a = [['k', 'x' * 600000]] %}{{ (a + a)|where(0, 'k') }}",
    "percent mapping key width": "{{ '%(a)1000000000s' % {'a': 'x'} }}",
    "percent nested key width": "{{ '%(a(b))1000000000s' % {'a(b)': 'x'} }}",
    "percent precision": "{{ '%.1000000000f' % 1.0 }}",
    "percent width and precision": "{{ '%10.1000000000f' % 1.0 }}",
    "percent flags then width": "{{ '%-+ #01000000000d' % 5 }}",
    "percent after a literal percent": "{{ '%%%(a)1000000000s' % {'a': 1} }}",
    "percent digits past int()": "{{ '%99999999999999999999999s' % 1 }}",
    "format filter mapping key": "{{ '%(a)1000000000s'|format(a='x') }}",
    "str.format precision": "{{ '{:10.1000000000f}'.format(1.0) }}",
    "str.format conversion then width": "{{ '{!r:>1000000000}'.format('x') }}",
    "str.format indexed field width": "{{ '{0[0]:>1000000000}'.format(['x']) }}",
    "str.format nested width": "{{ ('{0:>{1}}' * 100).format('x', 999999) }}",
    "str.format nested keyword width": "{{ ('{0:>{w}}' * 100).format('x', w=999999) }}",
    "format_map nested width": "{{ ('{a:>{w}}' * 100).format_map({'a': 'x', 'w': 999999}) }}",
    "str.format repeated keyword": "{{ ('{a}' * 1000).format(a='x' * 999999) }}",
    "ljust repeated": "{{ ('{0}' * 1000).format('x'.ljust(999999)) }}",
}


@pytest.mark.parametrize("template", BOMBS.values(), ids=BOMBS.keys())
def test_a_template_bomb_is_refused_before_it_is_built(template):
    with pytest.raises(TemplateFailure, match="refused by the sandbox"):
        render_template(template, {})


def test_every_bomb_is_refused_under_a_tight_memory_limit():
    """Refused *before* it is built: under an address-space limit 600 MB above what the
    interpreter uses, a bomb built first and measured after would be a MemoryError (the
    1 GB string of `'%(a)1000000000s' % {...}`), not the sandbox's refusal."""
    script = (
        "import json, resource, sys\n"
        "from engine.templates.render import render_template\n"
        "from engine.templates.sandbox import TemplateFailure\n"
        "size = int(open('/proc/self/status').read().split('VmSize:')[1].split()[0]) * 1024\n"
        "resource.setrlimit(resource.RLIMIT_AS, (size + 600 * 2**20, resource.RLIM_INFINITY))\n"
        "out = {}\n"
        "for name, template in json.loads(sys.stdin.read()).items():\n"
        "    try:\n"
        "        render_template(template, {}); out[name] = 'rendered'\n"
        "    except TemplateFailure as exc:\n"
        "        out[name] = str(exc)\n"
        "print(json.dumps(out))\n")
    done = subprocess.run([sys.executable, "-c", script], input=json.dumps(BOMBS), capture_output=True,
                          text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    outcomes = json.loads(done.stdout)
    assert {name: why for name, why in outcomes.items() if "refused by the sandbox" not in why} == {}


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


def test_where_picks_the_rows_whose_column_is_a_value_or_one_of_several():
    rows = [["a.py", "A"], ["b.py", "B", "a.py"], [], ["c.py"], "text"]
    variables = {"rows": rows, "objects": [{"name": "x"}, {"other": 1}, {"name": "y"}]}
    assert render_template("{{ rows | where(0, 'b.py') }}", variables) == "[['b.py', 'B', 'a.py']]"
    assert render_template("{{ rows | where(0, ['c.py', 'a.py']) | map('first') | join(',') }}",
                           variables) == "a.py,c.py"
    assert render_template("{{ rows | where(2, 'a.py') | length }}|{{ rows | where(5, 'x') }}",
                           variables) == "1|[]"                   # short rows are skipped
    assert render_template("{{ objects | where('name', 'y') }}", variables) == "[{'name': 'y'}]"
    assert render_template("{{ none | where(0, 'x') }}", {}) == "[]"  # an optional field left out
    with pytest.raises(TemplateFailure, match="where: expected a list of rows, got str"):
        render_template("{{ 'abc' | where(0, 'a') }}", {})


def test_slug_makes_an_identifier_from_model_text():
    assert render_template("{{ v | slug }}|{{ '' | slug }}", {"v": "Aerius 2048: The Game!"}) == "aerius_2048_the_game|x"


# --- CPU time and memory: what no static rule catches stops at a bound, located ---------

def test_a_long_loop_stops_at_the_cpu_bound_with_its_line(monkeypatch):
    monkeypatch.setattr(render, "MAX_RENDER_CPU_S", 0.2)
    template = "line one\n{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    with pytest.raises(TemplateFailure, match="CPU time") as failure:
        render_template(template, {})
    assert failure.value.line == 2


def test_a_profiler_still_runs_after_a_render_was_stopped(tmp_path):
    """A stop must leave no trace in the thread it stopped: CPython 3.11 hangs any profiler
    or tracer (cProfile, coverage) once an asynchronous exception was taken back with NULL."""
    script = tmp_path / "after_stop.py"
    script.write_text(
        "import cProfile\n"
        "from engine.templates import render, sandbox\n"
        "render.MAX_RENDER_CPU_S = 0.2\n"
        "try:\n"
        "    render.render_template('{% for i in range(100000) %}{% for j in range(100000) %}"
        "{% endfor %}{% endfor %}', {})\n"
        "except sandbox.TemplateFailure as exc:\n"
        "    print('stopped:', exc)\n"
        "print('profiled:', cProfile.Profile().runcall(sum, range(100000)))\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "stopped: template used more than" in proc.stdout
    assert "profiled: 4999950000" in proc.stdout


def test_a_slow_accumulation_stops_at_the_memory_bound(monkeypatch):
    monkeypatch.setattr(render, "MAX_RENDER_MEMORY", 64 * 2**20)
    monkeypatch.setattr(render, "MAX_RENDER_CPU_S", 600.0)   # memory, not time, must stop it
    template = "{{ range(100000)|map('string')|map('center', 999999)|list|length }}"
    with pytest.raises(TemplateFailure, match="grew memory"):
        render_template(template, {})


def test_a_when_or_for_each_expression_is_bounded_too(monkeypatch):
    monkeypatch.setattr(render, "MAX_RENDER_CPU_S", 0.05)
    evaluate = compile_expression("range(100000)|map('string')|map('center', 9)|map('trim')"
                                  "|map('upper')|map('lower')|map('title')|list|length")
    with pytest.raises(TemplateFailure, match="CPU time"):
        evaluate()


def test_a_render_under_its_bounds_leaves_nothing_behind():
    # the watchdog's stop must never land in a later render or outside one
    for _ in range(200):
        assert render_template("{{ x }}", {"x": 1}) == "1"
    assert not render._WATCHDOG._renders


# --- in a run -----------------------------------------------------------------------------

SLOW_PROMPT = """
apiVersion: sop/v1
name: slow_prompt
inputs:
  idea: {type: str, required: true}
actions:
  Think:
    prompt: |
      {{ inputs.idea }}
      {% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}
roles:
  Thinker: {actions: [Think], watch: [UserRequirement]}
"""


def _run_slow(tmp_path, journal=True):
    from engine.api import RunOptions, run
    from engine.compile.compiler import compile_text
    from engine.testing import ScriptedModel, use_model

    model = ScriptedModel(lambda spec, attempt: "ok")
    with use_model(model):
        result = run(compile_text(SLOW_PROMPT), {"idea": "x"}, RunOptions(model="fake",
                     workspace=tmp_path / "ws"), journal=journal)
    return result, model


def test_a_prompt_past_its_cpu_bound_fails_the_run_at_its_template_line(tmp_path, monkeypatch):
    monkeypatch.setattr(render, "MAX_RENDER_CPU_S", 0.2)
    result, model = _run_slow(tmp_path, journal=False)
    assert result.status == "failed"
    assert "error[SOP501]: action Think failed: prompt template: template used more than" in result.error
    assert result.diagnostic.line == 10        # the loop's line in the file
    assert model.requests == []


@pytest.mark.skipif(sys.version_info < (3, 11), reason="a render sees its run cancelled through Task.cancelling(), "
                    "new in Python 3.11; on 3.10 the Ctrl-C lands once the render ends (within its CPU bound)")
def test_ctrl_c_stops_a_run_in_the_middle_of_a_render(tmp_path, monkeypatch):
    import os
    import signal
    import threading

    from engine.journal.history import read_run

    monkeypatch.setattr(render, "MAX_RENDER_CPU_S", 600.0)   # only Ctrl-C can stop it

    test_over = threading.Event()

    def ctrl_c_once_the_loop_renders() -> None:
        while not any(r.cpu_used() > 0.3 for r in list(render._WATCHDOG._renders.values())):
            if test_over.wait(0.01):     # never a Ctrl-C into a later test
                return
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=ctrl_c_once_the_loop_renders, daemon=True).start()
    try:
        result, model = _run_slow(tmp_path)
    finally:
        test_over.set()
    assert result.status == "interrupted" and model.requests == []
    state = read_run(tmp_path / "ws")
    assert state.ended and state.status == "interrupted"    # journaled, not a CPU-bound failure


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_a_forked_child_still_bounds_its_renders(monkeypatch):
    import os

    monkeypatch.setattr(render, "MAX_RENDER_CPU_S", 0.2)
    render_template("{{ 1 }}", {})       # the parent's watchdog thread exists now
    pid = os.fork()
    if pid == 0:                          # the child: the loop must stop, not hang
        try:
            render_template("{% for i in range(100000) %}{% for j in range(100000) %}"
                            "{% endfor %}{% endfor %}", {})
        except TemplateFailure as failure:
            os._exit(0 if "CPU time" in str(failure) else 2)
        os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
