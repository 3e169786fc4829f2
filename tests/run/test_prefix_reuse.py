"""A tool loop's requests begin as the one before them did (what providers' prompt caches
need), and cached prompt tokens are read, priced and reported."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from run_helpers import EDITOR_WRITER, run_sop, sop_text

from engine.models.hosted import cache_points, cached_tokens
from engine.models.types import Price, Usage
from engine.testing import ScriptedModel

WRITER = EDITOR_WRITER.replace("tools: [editor]", "tools: [editor, plan]")


def step(*commands: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"thought": "t", "commands": [{"command_name": n, "args": a} for n, a in commands]}


def test_each_step_request_begins_with_the_whole_request_before_it(tmp_path: Path) -> None:
    model = ScriptedModel([step(("plan.append_task", {"task_id": "1", "instruction": "write it"})),
                           step(("editor.write", {"path": "a.md", "content": "one"})),
                           step(("editor.read", {"path": "a.md"})),
                           step(("end", {"Summary": "done"}))])      # step 4 of 4: the last
    result = run_sop(sop_text(WRITER), model, tmp_path / "ws")
    assert result.status == "idle", result.error
    requests = [list(r.messages) for r in model.requests]
    assert len(requests) == 4
    for before, after in zip(requests, requests[1:], strict=False):
        assert after[:len(before)] == before      # nothing earlier rewritten: only new messages
        assert [m["role"] for m in after[len(before):]] == ["assistant", "user"]
    last = requests[-1][-1]["content"]
    assert "## Plan status" in requests[1][-1]["content"]           # the plan changed: its status last
    assert "This is your last step" in last                          # the volatile part last
    assert "editor.read: " in last                # what the step before gave back


def test_cached_tokens_are_read_from_either_provider_shape() -> None:
    assert cached_tokens({"prompt_tokens": 2000, "prompt_tokens_details": {"cached_tokens": 1024}}) == 1024
    assert cached_tokens({"prompt_tokens": 9, "cache_read_input_tokens": 7}) == 7
    assert cached_tokens(None) == 0 and cached_tokens({"prompt_tokens": 5}) == 0


def test_cached_tokens_are_priced_at_the_cache_rate_and_counted() -> None:
    price = Price(1e-6, 2e-6, cached_input_per_token=1e-7)
    assert abs(price.cost(1000, 10, cached_tokens=800) - (200e-6 + 800e-7 + 20e-6)) < 1e-12
    assert Price(1e-6, 2e-6).cost(1000, 0, cached_tokens=800) == 1000e-6    # no cache price: full
    total = Usage.of_answer(100, 1, 0.0, cached_tokens=60) + Usage.of_answer(50, 1, 0.0)
    assert total.cached_tokens == 60
    assert Usage.of_answer(100, 1, 0.0, reused=True, cached_tokens=60).cached_tokens == 0   # not paid now


def test_cache_points_are_marked_only_where_the_provider_wants_them() -> None:
    assert cache_points("anthropic/claude-3-5-sonnet") == [{"location": "message", "role": "system"},
                                                           {"location": "message", "index": -1}]
    assert cache_points("openai/gpt-4o") == [] and cache_points("gpt-4o") == []


def test_commands_are_listed_with_their_args_in_words_not_json_schema(tmp_path: Path) -> None:
    """Every request of a loop carries the command list: each arg once, with what its schema
    says (type, optional, bounds, default, pattern), and the answer's shape in one line."""
    model = ScriptedModel([step(("end", {"Summary": "done"}))])
    assert run_sop(sop_text(WRITER), model, tmp_path / "ws").status == "idle"
    system, user = model.requests[0].messages[0]["content"], model.requests[0].messages[1]["content"]
    assert "JSON Schema" not in system and "JSON Schema" not in user
    assert "- editor.read: " in system and "start (integer, optional, at least 1)" in system
    assert "path (string matching ^[^\\s]+$): a path relative to the workspace" in system
    assert "window (integer, optional, at least 1, at most 500)" in system
    assert "plan.finish_current_task: Mark the current task finished. Args: none" in system
    answer_format = user.split("## Answer format", 1)[1]
    assert '"command_name"' in answer_format and "plan.append_task|" in answer_format
    assert answer_format.count("editor.write") == 1          # the names once, not in a schema and a list


def test_an_arg_that_words_cannot_say_is_shown_as_its_json_schema() -> None:
    from engine.models.answers import args_text

    nested = {"type": "object", "required": ["where"],
              "properties": {"where": {"type": "object", "properties": {"x": {"type": "integer"}}},
                             "tags": {"type": "array", "items": {"type": "string"}},
                             "mode": {"enum": ["a", "b"], "default": "a"}}}
    text = args_text(nested)
    assert 'where (JSON Schema {"type":"object","properties":{"x":{"type":"integer"}}})' in text
    assert "tags (list of string, optional)" in text and 'mode (one of a|b, optional, default "a")' in text
    odd = {"type": "object", "anyOf": [{"required": ["a"]}, {"required": ["b"]}], "properties": {}}
    assert args_text(odd).startswith("(JSON Schema) {")         # a rule across args: the whole schema
    assert args_text({"type": "object", "properties": {}}) == "none"
    mcp = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "required": ["path"],
           "additionalProperties": False, "properties": {"path": {"type": "string"}}}
    assert args_text(mcp) == "path (string)"           # an MCP server's schema, in words too


def _plan_statuses(model: ScriptedModel, tmp_path: Path) -> list[str | None]:
    """The plan status each step's request shows (None where it shows none), the writer
    running up to six steps on `model`."""
    result = run_sop(sop_text(WRITER.replace("max_steps: 4", "max_steps: 6")), model, tmp_path / "ws")
    assert result.status == "idle", result.error
    asked = [r.messages[-1]["content"] for r in model.requests]
    return [a.split("## Plan status\n", 1)[1].split("\n\n## Step", 1)[0] if "## Plan status" in a else None
            for a in asked]


def test_an_unchanged_plan_is_not_repeated_at_every_step(tmp_path: Path) -> None:
    """Every step's message stays in the history: a plan shown whole at each step would weigh
    on every later request. Once shown, an unchanged plan is not shown again (the commands
    say so); a change shows it whole."""
    tasks = [("plan.append_task", {"task_id": str(i), "instruction": f"write part {i} of the game module"})
             for i in (1, 2, 3)]
    model = ScriptedModel([step(*tasks),
                           step(("editor.write", {"path": "a.md", "content": "one"})),
                           step(("editor.read", {"path": "a.md"})),
                           step(("plan.finish_current_task", {})),
                           step(("end", {"Summary": "done"}))])
    status = _plan_statuses(model, tmp_path)
    assert status[0] == "No plan yet."
    assert status[1].startswith("[TASK_ID 1] write part 1") and "[TASK_ID 3]" in status[1]
    assert status[2] is None and status[3] is None
    assert status[4].startswith("[TASK_ID 1] (finished)")     # changed: whole again
    assert "The plan's status comes with a step's output when the plan changed." in model.requests[0].messages[0]["content"]
    assert status[1] in model.requests[-1].messages[3]["content"]   # the step pointed to is in the history


def test_a_plan_that_only_grew_is_shown_as_its_new_tasks(tmp_path: Path) -> None:
    """A model that appends a task per step would otherwise see the whole plan again at every
    step, each kept in the history: requests growing with the square of the steps."""
    model = ScriptedModel([step(("plan.append_task", {"task_id": "1", "instruction": "write the game"})),
                           step(("plan.append_task", {"task_id": "2", "instruction": "test the game"}),
                                ("plan.append_task", {"task_id": "3", "instruction": "write the docs"})),
                           step(("plan.finish_current_task", {})),
                           step(("end", {"Summary": "done"}))])
    status = _plan_statuses(model, tmp_path)
    assert status[1] == "[TASK_ID 1] write the game\nCurrent task: 1: write the game"
    assert status[2] == ("The 1 task shown before, unchanged, then:\n[TASK_ID 2] test the game\n"
                         "[TASK_ID 3] write the docs\nCurrent task: 1: write the game")
    assert status[3].startswith("[TASK_ID 1] (finished) write the game\n[TASK_ID 2] test the game\n")  # whole
    assert status[3].endswith("Current task: 2: test the game")


BODY = "".join(f"line {i} of the module\n" for i in range(40))


def test_a_reread_that_gives_the_same_output_points_to_the_step_that_showed_it(tmp_path: Path) -> None:
    """A model rereads files often: the same long output again is a pointer in the history,
    not a thousand more characters in every later request; a changed file is shown again."""
    model = ScriptedModel([step(("editor.write", {"path": "a.md", "content": BODY})),
                           step(("editor.read", {"path": "a.md"})),
                           step(("editor.read", {"path": "a.md"}), ("editor.list", {"path": "."})),
                           step(("editor.append", {"path": "a.md", "content": "one more\n"})),
                           step(("end", {"Summary": "done"}))])
    text = WRITER.replace("max_steps: 4", "max_steps: 6")
    result = run_sop(sop_text(text), model, tmp_path / "ws")
    assert result.status == "idle", result.error
    history = model.requests[-1].messages
    third = next(m["content"] for m in history if m["content"].startswith("## Step 3: what came back"))
    assert "editor.read: the same output as at step 2, word for word (shown there)" in third
    assert "line 39 of the module" not in third and "editor.list: a.md" in third     # short: as it is
    second = next(m["content"] for m in history if m["content"].startswith("## Step 2: what came back"))
    assert "40|line 39 of the module" in second                                   # shown there


def test_a_pointer_to_a_step_whose_output_was_cut_shows_the_output_again(
        tmp_path: Path, monkeypatch: Any) -> None:
    """Past the history's bound, the outputs of all but the newest steps are cut: a pointer to
    one of them would point at nothing, so the history shows that output there again."""
    from engine.run import toolloop

    monkeypatch.setattr(toolloop, "_HISTORY_CHARS", 3_000)
    monkeypatch.setattr(toolloop, "_FULL_STEPS", 2)
    reads = [step(("editor.read", {"path": "a.md"}), ("editor.search", {"term": f"line {i} "})) for i in range(4)]
    model = ScriptedModel([step(("editor.write", {"path": "a.md", "content": BODY})), *reads,
                           step(("end", {"Summary": "done"}))])
    text = WRITER.replace("max_steps: 4", "max_steps: 8")
    result = run_sop(sop_text(text), model, tmp_path / "ws")
    assert result.status == "idle", result.error
    history = model.requests[-1].messages
    shown = {m["content"].split(":", 1)[0]: m["content"] for m in history
             if m["content"].startswith("## Step ")}
    assert "the same output as at step 2" not in shown["## Step 3"] or "40|line" in shown["## Step 2"]
    fourth = shown["## Step 4"]      # step 2 (the first read) is cut now: its text is here again
    assert "40|line 39 of the module" in fourth and "the same output" not in fourth
