"""Prompts as MetaGPT sends them (issue 25): the role prefix in MetaGPT's words, `desc`,
`role_prefix: false`, templated role fields, an action's own model, filters that parse and
match without a model, a seeded order, files beside the SOP, and exec commands whose stdout
is an output tree, run in the SOP's folder, given input files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from run_helpers import default_answer, run_sop, sop_text

from engine.compile.compiler import check_text, compile_path
from engine.models.registry import choose_model
from engine.run.people import Question
from engine.run.prompts import role_prefix, with_role_fields
from engine.templates.filters import reading_beside
from engine.templates.render import render_template
from engine.templates.sandbox import TemplateFailure
from engine.testing import ScriptedModel

TEACHER = """
apiVersion: sop/v1
name: teacher
inputs:
  idea: {type: str, required: true}
  language: {type: str, default: Chinese}
team:
  env_desc: "{{ 'a classroom' }}"
roles:
  Teacher:
    name: Lily
    profile: "{{ inputs.language }} Teacher"
    goal: "teach {{ inputs.language }}"
    constraints: "answer in {{ inputs.language }}"
    watch: [UserRequirement]
    actions: [Teach]
actions:
  Teach:
    prompt: "Teach {{ inputs.idea }}"
"""


def test_a_role_alone_is_told_of_no_team(tmp_path: Path) -> None:
    model = ScriptedModel(default_answer)
    run_sop(sop_text(TEACHER.replace("team:\n  env_desc: \"{{ 'a classroom' }}\"\n", "")), model, tmp_path,
            idea="verbs", inputs={"language": "English"})
    assert model.requests[0].spec.system == (
        "You are Lily, the English Teacher. Your goal: teach English. Keep to these constraints: answer in English.")


def test_env_desc_and_the_teammates_are_named() -> None:
    compiled = sop_text(TEACHER.replace("\"{{ 'a classroom' }}\"", "a classroom").replace(
        "actions:\n  Teach:", "  Pupil:\n    watch: [Teach]\n    actions: [Learn]\nactions:\n  Learn:\n    prompt: x\n  Teach:"))
    compiled = with_role_fields(compiled, {"language": "Chinese"}, "r1")   # as a run starts
    assert role_prefix(compiled, "Pupil") == (
        "You are Pupil, the Pupil of a team. You work in a classroom with Lily (Chinese Teacher).")
    assert role_prefix(sop_text(TEACHER.replace("\"{{ 'a classroom' }}\"", "a classroom")), "Teacher").endswith(
        "You work in a classroom.")


METAGPT_DESC = ("You are a {{ role.profile }}, named {{ role.name }}, your goal is {{ role.goal }}. "
                "the constraint is {{ role.constraints }}. ")


def test_desc_gives_metagpts_own_words(tmp_path: Path) -> None:
    text = TEACHER.replace("    name: Lily\n", f"    name: Lily\n    desc: \"{METAGPT_DESC}\"\n")
    model = ScriptedModel(default_answer)
    run_sop(sop_text(text), model, tmp_path, idea="verbs")
    assert model.requests[0].spec.system == (
        "You are a Chinese Teacher, named Lily, your goal is teach Chinese. the constraint is answer in Chinese.")


def test_desc_replaces_the_prefix_and_role_prefix_false_drops_it(tmp_path: Path) -> None:
    text = TEACHER.replace("    name: Lily\n", "    name: Lily\n    desc: \"A {{ inputs.language }} tutor.\"\n")
    text = text.replace("    prompt: \"Teach", "    system: \"Only {{ inputs.language }}.\"\n    prompt: \"Teach")
    model = ScriptedModel(default_answer)
    run_sop(sop_text(text), model, tmp_path / "a", idea="verbs")
    assert model.requests[0].spec.system == "A Chinese tutor.\n\nOnly Chinese."
    model = ScriptedModel(default_answer)
    run_sop(sop_text(text.replace("    system:", "    role_prefix: false\n    system:")), model, tmp_path / "b",
            idea="verbs")
    assert model.requests[0].spec.system == "Only Chinese."


def test_human_is_a_template_rendered_once(tmp_path: Path) -> None:
    text = TEACHER.replace("  language:", "  interactive: {type: bool, default: false}\n  language:")
    text = text.replace("    name: Lily\n", "    name: Lily\n    human: \"{{ inputs.interactive }}\"\n")
    model = ScriptedModel(default_answer)
    result = run_sop(sop_text(text), model, tmp_path, idea="verbs")
    assert result.status == "idle" and len(model.requests) == 1   # false: the model answered


def test_an_actions_own_model_wins_over_model_except_fake(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SOPCTL_MODEL", raising=False)
    assert choose_model("openai/gpt-4o", "local", pinned="anthropic/claude") == "anthropic/claude"
    assert choose_model("fake", "local", pinned="anthropic/claude") == "fake"
    assert choose_model("openai/gpt-4o", "local") == "openai/gpt-4o"
    assert choose_model(None, "local") == "local"


# --- filters ---------------------------------------------------------------------------------

def _render(source: str, **variables: object) -> str:
    return render_template(source, {"run": {"id": "r1"}, **variables})


def test_json_and_re2_filters() -> None:
    assert _render("{{ (t | from_json).a[1] }}", t='```json\n{"a": [1, 2]}\n```') == "2"
    assert _render("{{ t | re_search('Score: (\\\\d+)', 1) }}", t="Score: 42") == "42"
    assert _render("{{ t | re_search('nope') }}", t="Score: 42") == ""
    assert _render("{{ t | re_findall('(\\\\w)=(\\\\d)') }}", t="a=1 b=2") == "[['a', '1'], ['b', '2']]"
    assert _render("{{ t | re_sub('\\\\s+', ' ') }}", t="a \n  b") == "a b"
    assert _render("{{ out.split('\\n') | first }}", out="one\ntwo") == "one"


def test_regexes_are_linear_and_inputs_bounded() -> None:
    with pytest.raises(TemplateFailure, match="backreference"):
        _render("{{ t | re_search('(a)\\\\1') }}", t="aa")
    with pytest.raises(TemplateFailure, match="longer than"):
        _render("{{ t | re_findall('a') }}", t="a" * 1_000_001)
    with pytest.raises(TemplateFailure, match="nests deeper"):
        _render("{{ t | from_json }}", t="[" * 100)
    with pytest.raises(TemplateFailure, match="not JSON"):
        _render("{{ t | from_json }}", t="{oops")


def test_zip_enumerate_and_a_seeded_order() -> None:
    assert _render("{{ a | zip(b) }}", a=[1, 2], b=["x", "y", "z"]) == "[[1, 'x'], [2, 'y']]"
    assert _render("{{ a | enumerate(1) }}", a=["x", "y"]) == "[[1, 'x'], [2, 'y']]"
    first = _render("{{ a | shuffle }} {{ a | choice }} {{ a | random }}", a=list(range(10)))
    assert first == _render("{{ a | shuffle }} {{ a | choice }} {{ a | random }}", a=list(range(10)))
    other = render_template("{{ a | shuffle }}", {"run": {"id": "r2"}, "a": list(range(10))})
    assert other != first.split("]")[0] + "]"
    assert _render("{{ a | shuffle('x') }}", a=list(range(10))) != _render("{{ a | shuffle }}", a=list(range(10)))


def test_file_reads_only_beside_the_sop(tmp_path: Path) -> None:
    (tmp_path / "persona.md").write_text("You teach.", encoding="utf-8")
    (tmp_path.parent / "secret.txt").write_text("no", encoding="utf-8")
    with reading_beside(str(tmp_path / "x.sop.yaml")):
        assert _render("{{ file('persona.md') }}") == "You teach."
        for bad in ("../secret.txt", "/etc/passwd", "missing.md"):
            with pytest.raises(TemplateFailure):
                _render("{{ file(p) }}", p=bad)
        os.link(tmp_path.parent / "secret.txt", tmp_path / "planted.md")   # a hard link planted in a shared folder
        with pytest.raises(TemplateFailure, match="hard links"):
            _render("{{ file('planted.md') }}")
        (tmp_path / "exp.md").symlink_to(tmp_path.parent / "secret.txt")
        with pytest.raises(TemplateFailure, match="through a symlink"):
            _render("{{ file('exp.md') }}")
    with pytest.raises(TemplateFailure, match="no folder"):
        _render("{{ file('persona.md') }}")


# --- exec --------------------------------------------------------------------------------------

EXEC = """
apiVersion: sop/v1
name: ocr
inputs:
  idea: {type: str}
  scan: {type: file, default: scan.bin}
actions:
  Read:
    kind: exec
    workdir: sop
    command: [python, tool.py, "{{ inputs.scan }}"]
    output:
      Total: {type: int}
      Name: {type: str}
  Report:
    prompt: "Total {{ msgs.Read[-1].out.Total }} of {{ msgs.Read[-1].out.Name }}"
    context: none
roles:
  Reader:
    watch: [UserRequirement]
    actions: [Read]
  Writer:
    watch: [Read]
    actions: [Report]
"""

TOOL = """
import json, os, sys
data = open(os.path.join(os.environ["SOPCTL_WORKSPACE"], sys.argv[1]), "rb").read()
print(json.dumps({"Total": len(data), "Name": os.path.basename(os.getcwd())}))
"""


def _exec_sop(tmp_path: Path, tool: str = TOOL) -> Path:
    folder = tmp_path / "sopdir"
    folder.mkdir()
    (folder / "tool.py").write_text(tool, encoding="utf-8")
    (folder / "scan.bin").write_bytes(b"\x00\xff\x10")
    (folder / "ocr.sop.yaml").write_text(EXEC, encoding="utf-8")
    return folder / "ocr.sop.yaml"


def test_exec_stdout_is_an_output_tree_run_in_the_sops_folder_with_a_file_input(tmp_path: Path) -> None:
    path = _exec_sop(tmp_path)
    model = ScriptedModel(default_answer)
    result = run_sop(compile_path(path), model, tmp_path / "ws", allow_exec=True)
    assert result.status == "idle", result.error
    assert (tmp_path / "ws" / "inputs" / "scan" / "scan.bin").read_bytes() == b"\x00\xff\x10"
    read = next(m for m in result.messages if m.cause_by == "Read")
    assert read.out == {"Total": 3, "Name": "sopdir"} and json.loads(read.content) == read.out
    assert model.requests[0].spec.prompt.startswith("Total 3 of sopdir")


def test_exec_stdout_that_misses_the_tree_fails_located(tmp_path: Path) -> None:
    path = _exec_sop(tmp_path, "print('{\"Total\": \"many\"}')")
    result = run_sop(compile_path(path), ScriptedModel(default_answer), tmp_path / "ws", allow_exec=True)
    assert result.status == "failed"
    assert "SOP505" in result.error and "stdout is not the JSON object" in result.error


# --- an output node's example ---------------------------------------------------------------

def test_an_example_is_in_the_schema_and_shown_to_hosted_models_only() -> None:
    from engine.load.outputs import output_schema
    from engine.load.spec import OutputNode
    from engine.models.answers import first_messages, response_format
    from engine.models.types import CallSpec

    schema = output_schema({"Files": OutputNode(type="list[str]", instruction="the files", example=["main.py"]),
                            "examples": OutputNode(instruction="a key named examples")})
    assert schema is not None and schema["properties"]["Files"]["examples"] == [["main.py"]]

    def prompt(model: str) -> str:
        spec = CallSpec(action="A", role="R", system="", prompt="p", kind="json", model=model, schema=schema)
        return first_messages(spec, schema_mode=False)[-1]["content"]

    assert '- "Files" (list of string): the files. Example: ["main.py"]' in prompt("openai/gpt-4o")
    assert "Example:" not in prompt("local") and '- "examples" (string): a key named examples' in prompt("local")
    spec = CallSpec(action="A", role="R", system="", prompt="p", kind="json", model="openai/x", schema=schema)
    sent = response_format(spec)["json_schema"]["schema"]["properties"]
    assert "examples" not in sent["Files"] and sent["examples"]["type"] == "string"   # a key named so stays


def _bwrap_works() -> bool:
    from engine.errors import RunError
    from engine.run.isolation import find_sandbox

    try:
        find_sandbox(allow_network=False)
    except RunError:
        return False
    return True


WRITER_TOOL = """
import json, os
try:
    open("written.txt", "w").write("x")
    wrote = "yes"
except OSError:
    wrote = "no"
print(json.dumps({"Total": 0, "Name": wrote}))
"""


@pytest.mark.skipif(not _bwrap_works(), reason="bwrap missing or cannot create namespaces here")
def test_workdir_sop_is_read_only_under_isolate(tmp_path: Path) -> None:
    path = _exec_sop(tmp_path, WRITER_TOOL)
    result = run_sop(compile_path(path), ScriptedModel(default_answer), tmp_path / "ws", allow_exec=True,
                     isolate=True)
    assert result.status == "idle", result.error
    assert next(m for m in result.messages if m.cause_by == "Read").out["Name"] == "no"
    assert not (path.parent / "written.txt").exists()


def test_a_templated_human_that_gives_true_asks_the_person(tmp_path: Path) -> None:
    from engine.testing import ScriptedPerson

    text = TEACHER.replace("  language:", "  interactive: {type: bool, default: true}\n  language:")
    text = text.replace("    name: Lily\n", "    name: Lily\n    human: \"{{ inputs.interactive }}\"\n")
    asked: list[str] = []

    def person(question: Question) -> str:
        asked.append(question.prompt)
        return "a lesson"

    model = ScriptedModel(default_answer)
    result = run_sop(sop_text(text), model, tmp_path, idea="verbs", person=ScriptedPerson(person))
    assert result.status == "idle" and model.requests == [] and asked and "Teach verbs" in asked[0]


FILE_SOP = """\
apiVersion: sop/v1
name: files
actions:
  Write:
    prompt: "{{ file('%s') }}"
roles:
  Writer: {watch: [UserRequirement], actions: [Write]}
"""


def test_validate_checks_a_file_path_beside_the_sop(tmp_path: Path) -> None:
    """SOP414: what the run's file() would refuse, found by validate when it knows the folder."""
    (tmp_path / "persona.md").write_text("You teach.", encoding="utf-8")
    (tmp_path / "big.md").write_text("x" * 100_001, encoding="utf-8")
    (tmp_path / "prompts").mkdir()
    cases = {"persona.md": "", "big.md": "larger than 100,000 bytes", "prompts": "not a regular file",
             "gone.md": "no such file", "/etc/passwd": "must be a relative path", "a/../../x.md": "leaves the SOP's folder"}
    for rel, problem in cases.items():
        path = tmp_path / "s.sop.yaml"
        path.write_text(FILE_SOP % rel, encoding="utf-8")
        found = [(d.code, d.message, d.line) for d in check_text(FILE_SOP % rel, str(path)).diagnostics]
        assert found == ([("SOP414", found[0][1], 5)] if problem else []), rel
        assert not problem or problem in found[0][1], (rel, found)


def test_validate_of_an_sop_given_as_text_checks_only_the_path_shape() -> None:
    assert check_text(FILE_SOP % "gone.md").diagnostics == ()   # no folder to look in
    assert [d.code for d in check_text(FILE_SOP % "../x.md").diagnostics] == ["SOP414"]
