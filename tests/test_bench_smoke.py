"""Smoke tests of the bench scripts: they run at a tiny size and produce their figures.

No timing assertions (timings depend on the machine): only that every figure is there,
numbers are positive and the work was done. MetaGPT is never installed here; its fake LLM
answers and the installer's requirement list are checked as plain functions.
"""
from __future__ import annotations

import importlib.util
import json
import math
import sys
import zipfile
from pathlib import Path

import pytest

# bench/ is not an installed package: make it importable under plain `pytest` too.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import batch_bench, compare, metagpt_fake_llm, report_bench, routing_bench
from bench.__main__ import DEFAULT_OUT
from bench.__main__ import main as bench_main
from bench.metagpt_baseline import _requirements


def _positive(stats: dict) -> None:
    assert stats["n"] >= 1
    assert 0 < stats["min"] <= stats["median"] <= stats["max"]


def test_compare_sopctl_side_produces_its_figures() -> None:
    res = compare.main(size_factor=0.2, reps=1, with_metagpt=False)
    for lat in res["latencies_ms"]:
        side = res[f"sopctl@{lat:g}"]
        for key in ("run_s", "import_s", "peak_rss_mb"):
            _positive(side[key])
        if lat > 0:       # a call is in flight for its latency only: none at 0 ms
            _positive(side["llm_busy_s"])
        assert side["llm_calls"] > 0 and side["prompt_tokens"] > 0
        assert side["files_written"] == res["files"]
    _positive(res[f"sopctl_fan_out_1@{res['latencies_ms'][-1]:g}"]["run_s"])
    _positive(res["sopctl@0"]["warm_overhead_per_call_ms"])
    _positive(res["sopctl@0"]["warm_cpu_per_call_ms"])
    _positive(res["sopctl_no_cache@0"]["cpu_per_call_ms"])       # a file's very first run
    assert res["sopctl_shipped"]["llm_calls"] > res["sopctl@0"]["llm_calls"]  # the QA engineer's calls
    for key in ("sopctl_help_s", "sopctl_validate_s"):
        _positive(res["cold"][key])
    assert "| engine overhead per LLM call" in res["markdown"]


def test_routing_bench_produces_a_curve() -> None:
    res = routing_bench.main(size_factor=0.02)
    assert len(res["curve"]) >= 2
    for point in res["curve"]:
        assert point["median_s"] > 0 and point["delivered"] >= point["messages"]
    assert math.isfinite(res["exponent"])
    assert res["hot_spots"] and all(0 < share <= 1 for _name, share in res["hot_spots"])


def test_bench_command_writes_the_report_where_asked(tmp_path: Path) -> None:
    before = DEFAULT_OUT.read_bytes() if DEFAULT_OUT.exists() else None
    out = tmp_path / "benchmarks.md"
    assert bench_main(["--quick", "--only", "routing", "--out", str(out)]) == 0
    text = out.read_text()
    for needle in ("# Benchmarks", "- machine:", "- versions: Python", "## Routing scale", "## Summary"):
        assert needle in text
    assert (DEFAULT_OUT.read_bytes() if DEFAULT_OUT.exists() else None) == before


def test_busy_time_is_the_union_of_call_intervals() -> None:
    assert compare.busy_time([[0, 1], [0.5, 2], [3, 4]]) == pytest.approx(3.0)
    assert compare.busy_time([]) == 0


def test_fit_exponent_of_linear_and_quadratic_growth() -> None:
    assert routing_bench.fit_exponent([(n, 2e-6 * n) for n in (10, 100, 1000)]) == pytest.approx(1.0)
    assert routing_bench.fit_exponent([(n, 1e-9 * n * n) for n in (10, 100, 1000)]) == pytest.approx(2.0)


def _content(text: str) -> dict:
    assert text.startswith("[CONTENT]") and text.rstrip().endswith("[/CONTENT]")
    return json.loads(text.split("[CONTENT]", 1)[1].rsplit("[/CONTENT]", 1)[0])


def test_metagpt_fake_answers_are_well_formed() -> None:
    files = metagpt_fake_llm.task_files(10)
    node_prompt = "## context\n...\n## nodes: \"<node>: <type>\"\n- {}: str\n## constraint\n..."
    kind, text = metagpt_fake_llm.answer(node_prompt.format("Task list"), "idea", files)
    assert kind == "tasks" and _content(text)["Task list"] == files
    kind, text = metagpt_fake_llm.answer(node_prompt.format("Implementation approach"), "idea", files)
    assert kind == "design" and _content(text)["File list"] == files
    kind, text = metagpt_fake_llm.answer(node_prompt.format("Original Requirements"), "idea", files)
    assert kind == "prd" and _content(text)["Original Requirements"] == "idea"
    kind, text = metagpt_fake_llm.answer("## Code: module_3.py. Write code with triple quoto", "i", files)
    assert kind == "code" and "```python\n" in text and "module_3" in text
    kind, text = metagpt_fake_llm.answer("## Code to be Reviewed: main.py\n## Code Review Result", "i", files)
    assert kind == "review" and text.rstrip().endswith("LGTM") and "main.py" in text
    assert metagpt_fake_llm.answer("something else", "i", files)[0] == "unknown"


def test_metagpt_requirements_follow_the_recipe(tmp_path: Path) -> None:
    wheel = tmp_path / "metagpt-0.8.2-py3-none-any.whl"
    meta = "\n".join(["Name: metagpt", "Requires-Dist: aiohttp==3.8.6", "Requires-Dist: lancedb==0.4.0",
                      "Requires-Dist: agentops", "Requires-Dist: pytest ; extra == \"test\""])
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("metagpt-0.8.2.dist-info/METADATA", meta)
    reqs = _requirements(wheel)
    assert "aiohttp==3.8.6" in reqs and "agentops==0.3.10" in reqs
    assert not any(r.startswith(("lancedb", "pytest")) for r in reqs)


def test_report_bench_measures_a_long_run_report() -> None:
    res = report_bench.main(size_factor=0.1)
    assert res["rounds"] == 10                     # one action per round, as the loop is bounded
    assert 0 < res["size_mb"] and res["render_s"] > 0
    assert ("open_s" in res) == ("blank_open_s" in res)
    assert "report size" in res["markdown"]


def test_batch_bench_produces_its_figures() -> None:
    res = batch_bench.main(size_factor=0.004, with_ray=False)
    assert res["rows"] == 4
    for key in ("rows_per_s", "peak_rss_mb", "wall_s"):
        assert res["local"][key] > 0
    assert res["latency"]["critical_path_s"] > 0 and res["ratio"] > 0
    assert "rows/s, local" in res["markdown"]


@pytest.mark.skipif(importlib.util.find_spec("tiktoken") is None, reason="tiktoken not installed")
def test_review_and_memory_benches_produce_their_figures() -> None:
    from bench import memory_bench, node_bench, review_bench

    review = review_bench.main(size_factor=0.25)
    merged, best, worst = review["rows"]
    assert review["statuses"] == ["idle"] * 3
    assert worst["review_calls"] > best["review_calls"] >= merged["review_calls"] > 0
    memory = memory_bench.main(size_factor=0.2)
    assert [r["turns"] for r in memory["rows"]] == sorted(r["turns"] for r in memory["rows"])
    assert all(r["windowed"] > 0 and r["whole_memory"] > 0 for r in memory["rows"])
    simple, complex_, revised = node_bench.main()["rows"]
    assert (simple["calls"], revised["calls"]) == (1, 2) and complex_["calls"] > 1


def test_lsp_bench_times_open_change_and_completion() -> None:
    from bench import lsp_bench

    res = lsp_bench.main(size_factor=0.2)
    for key in ("open_ms", "change_ms", "completion_ms"):
        _positive(res[key])
    assert "| diagnostics per change (debounce 0) |" in res["markdown"]


def test_scale_bench_runs_the_shipped_company_at_growing_sizes() -> None:
    from bench import scale_bench

    res = scale_bench.main(size_factor=0.05)
    points = res["points"]
    assert [p["files"] for p in points] == list(scale_bench.QUICK_SIZES)
    assert all(p["status"] == "idle" and p["peak_rss_mb"] > 0 for p in points)
    calls = [p["calls"] for p in points]
    chars = [p["prompt_chars"] for p in points]
    assert calls == sorted(calls) and chars == sorted(chars) and len(set(chars)) == len(chars)
    assert "| files | calls | prompt chars" in res["markdown"]


@pytest.mark.slow
def test_hosted_bench_reaches_the_local_server_directly_and_through_litellm() -> None:
    from bench import hosted_bench

    res = hosted_bench.main(size_factor=0.05)
    assert res["first_request_s"] > 0 and res["peak_rss_mb"] > 0 and res["import_s"] > 0
    assert res["first_request_via_litellm_s"] > 0 and res["import_via_litellm_s"] > 0
    assert "time from `sopctl run` to the first request" in res["markdown"]


def test_toolloop_bench_produces_its_figures() -> None:
    from bench import toolloop_bench

    figures = toolloop_bench.main(steps=4, repeats=1, with_metagpt=False)
    for side in ("no journal", "with journal"):
        assert figures[side]["engine_ms_per_step"] > 0 and figures[side]["steps"] == 4
    for scenario, cpu in figures["cpu per extra step"].items():   # the plan tool alone, an MGX engineer's tools
        for side in ("sopctl", "sopctl journaled"):   # tiny runs: only the shape, not the sign
            assert cpu[side]["min_ms"] <= cpu[side]["median_ms"] <= cpu[side]["max_ms"]
        assert cpu["steps"] == [2, 4] and cpu["scenario"] == scenario
    assert "MetaGPT main RoleZero, Plan tool alone | skipped" in figures["markdown"]
    assert "MetaGPT main Engineer2, its default tools | skipped" in figures["markdown"]
    assert "MetaGPT main MGX team, its engineer's steps | skipped" in figures["markdown"]


def test_toolloop_bench_says_it_skips_metagpt_main_without_its_venv(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from bench import metagpt_main, toolloop_bench

    monkeypatch.setattr(metagpt_main, "VENV", tmp_path / "no-venv")
    figures = toolloop_bench.main(steps=4, repeats=1)
    for cpu in figures["cpu per extra step"].values():
        assert "no MetaGPT main venv" in cpu["metagpt"]["skipped"] and "ratio" not in cpu
    assert "ratio" not in figures and "more_ratios" not in figures


def test_the_summary_shows_cpu_and_wall_cold_and_warm_against_their_targets() -> None:
    from bench.__main__ import summary_rows

    ratios = {"overhead_per_call": 0.2, "overhead_per_call_warm": 0.08, "cpu_per_call": 0.09,
              "cpu_per_call_warm": 0.3}
    rows = summary_rows([{"name": "compare", "result": {"ratios": ratios}}])
    found = {row.split(" | ")[0].lstrip("| "): row for row in rows[2:]}
    for clock, when, value, met in (("CPU time", "(cold)", "0.090", "yes"), ("CPU time", "(warm)", "0.300", "**no**"),
                                    ("(wall)", "(cold)", "0.200", "**no**"), ("(wall)", "(warm)", "0.080", "yes")):
        [row] = [r for label, r in found.items() if clock in label and when in label]
        assert f"**{value}** | <= 0.1 | {met} |" in row


def test_the_summary_shows_each_tool_loop_ratio_a_bench_gives() -> None:
    """The tool loop bench has two rows against MetaGPT main (an MGX engineer, the plan tool
    alone): both reach the summary, each with its verdict."""
    from bench.__main__ import summary_rows

    result = {"ratio": 0.2, "target": "<= 0.25", "ratio_label": "engineer's step",
              "more_ratios": [("plan tool's step", 1.1, "<= 0.25")]}
    rows = summary_rows([{"name": "toolloop", "result": result}])
    assert "| engineer's step | **0.200** | <= 0.25 | yes |" in rows
    assert "| plan tool's step | **1.100** | <= 0.25 | **no** |" in rows


def test_the_quick_report_runs_the_tool_loop_bench(tmp_path: Path) -> None:
    """`python -m bench --quick` passes the tool loop bench its own options (it once failed
    with a TypeError there and the report only said the bench was skipped)."""
    out = tmp_path / "benchmarks.md"
    assert bench_main(["--quick", "--only", "toolloop", "--out", str(out)]) == 0
    text = out.read_text()
    assert "toolloop" in text and "TypeError" not in text and "failed" not in text.lower()


def test_prefix_share_and_openai_caching_rule() -> None:
    from bench.prefix_bench import billed_input, prefix_shares

    shares = prefix_shares([("a", "abcd"), ("b", "zz"), ("a", "abcdefgh"), ("a", "abXX")])
    assert shares == [0.5, 0.5]                       # per group: the later request's share
    kept = prefix_shares([("a", "abcd"), ("a", "abcdefgh"), ("a", "abXX")], of_earlier=True)
    assert kept == [1.0, 0.25]                        # of the earlier one: all of it, then 2 of 8
    first, again = list(range(2000)), list(range(1500)) + [-1] * 500
    paid = billed_input([first, again], rate=0.5)
    assert paid["cached_tokens"] == 1024 + 3 * 128    # 1,500 shared: 1,024 then whole 128-steps
    assert paid["billed_equivalent"] == 4000 - 1408 + 1408 * 0.5
    assert billed_input([list(range(1000)), list(range(1000))])["cached_tokens"] == 0   # under 1,024


def test_realistic_answers_are_the_same_texts_for_both_engines(monkeypatch: pytest.MonkeyPatch) -> None:
    """The billing bench's second scenario: MetaGPT's fake and sopctl's answer with the same
    hosted-model-sized texts, and a sopctl run on them writes every file (its answers fit
    the SOP's schemas)."""
    from bench import realistic_answers

    files = metagpt_fake_llm.task_files(3)
    monkeypatch.setattr(metagpt_fake_llm, "REALISTIC", True)
    kind, text = metagpt_fake_llm.answer("## Code: module_2.py. Write code", "idea", files)
    assert kind == "code" and realistic_answers.code("module_2.py") in text
    assert len(realistic_answers.code("module_2.py").splitlines()) >= 60
    node_prompt = "## nodes: \"{}\"\n## constraint"
    design = json.loads(metagpt_fake_llm.answer(node_prompt.format("Implementation approach"), "i", files)[1]
                        .split("[CONTENT]")[1].split("[/CONTENT]")[0])
    assert design == realistic_answers.design(files)
    assert "class Module2 {" in design["Data structures and interfaces"]

    result = compare.run_sopctl(3, 0.0, realistic=True)
    code = [p for p in result["prompts"] if "## The file to write: `module_2.py`" in p]
    assert code and realistic_answers.design(files)["Implementation approach"] in code[0]
