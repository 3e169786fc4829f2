"""Actions: prompt, prefix and declared context; models; fan-out; artifacts; exec; failures."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from run_helpers import TESTS, default_answer, fenced, run_sop, sop, sop_text

from engine.errors import RunError
from engine.models.gateway import Gateway
from engine.models.types import CallSpec, ModelAnswer, ModelRequest
from engine.testing import ScriptedModel

PIPELINE = (TESTS / "sops/pipeline.sop.yaml").read_text()


def _request(model: ScriptedModel, action: str) -> CallSpec:
    return next(r.spec for r in model.requests if r.spec.action == action)


# --- prompt, prefix, context ----------------------------------------------------------------

def test_system_prompt_is_the_role_prefix(tmp_path: Path) -> None:
    model = ScriptedModel(default_answer)
    run_sop(sop("pipeline"), model, tmp_path)
    system = _request(model, "WritePRD").system
    for part in ("Alice", "Product Manager", "write a good PRD", "a tiny software company",
                 "Bob (Architect)", "Eve (Project Manager)"):
        assert part in system
    assert "Alice (" not in system  # the others, not itself


def test_prompt_renders_inputs_and_defaults(tmp_path: Path) -> None:
    model = ScriptedModel(default_answer)
    run_sop(sop("pipeline"), model, tmp_path, idea="a 2048 game")
    assert _request(model, "WritePRD").prompt.startswith("Write a PRD in Python for: a 2048 game")


def test_declared_context_only(tmp_path: Path) -> None:
    model = ScriptedModel(default_answer)
    run_sop(sop("pipeline"), model, tmp_path, idea="IDEA-TEXT")
    design = _request(model, "WriteDesign").prompt
    assert "## Context" in design and "### WritePRD from Alice (Product Manager)" in design
    assert "IDEA-TEXT" not in design  # UserRequirement is remembered but not declared
    assert "## Context" not in _request(model, "WriteTasks").prompt  # context: none


def test_context_all_is_the_whole_memory(tmp_path: Path) -> None:
    model = ScriptedModel(default_answer)
    text = PIPELINE.replace("    context: [WritePRD]\n", "    context: all\n")
    run_sop(sop_text(text), model, tmp_path, idea="IDEA-TEXT")
    design = _request(model, "WriteDesign").prompt
    assert "### UserRequirement from Human\nIDEA-TEXT" in design
    assert "### WritePRD from Alice (Product Manager)" in design


CODE_THEN_REVIEW = """\
apiVersion: sop/v1
name: code_review
actions:
  WriteCode:
    prompt: "Write {{ news[-1].content }}."
    output: {code: python}
    artifacts: [{path: main.py, content: "{{ out }}"}]
  Review:
    prompt: "Review this file: {{ msgs.WriteCode[-1].content }}"
    context: [WriteCode]
    output: text
roles:
  Engineer: {name: Alex, profile: Engineer, actions: [WriteCode], watch: [UserRequirement]}
  Reviewer: {actions: [Review], watch: [WriteCode]}
"""


def test_context_names_the_sender_by_name_and_profile_and_code_has_no_fence(tmp_path: Path) -> None:
    model = ScriptedModel(default_answer)
    result = run_sop(sop_text(CODE_THEN_REVIEW), model, tmp_path)
    review = _request(model, "Review").prompt
    assert "### WriteCode from Alex (Engineer)\nprint('hello')" in review
    assert "Review this file: print('hello')" in review and "```" not in review
    assert result.messages[1].content == (tmp_path / "main.py").read_text()


STRUCTURED_THEN_READ = """\
apiVersion: sop/v1
name: quoted_fields
actions:
  Design:
    prompt: "Design it."
    output:
      Zeta approach: {type: str, instruction: how}
      Alpha files: {type: "list[str]", instruction: files}
      Rows: {type: "list[list[str]]", instruction: rows}
      Diagram: {type: str, instruction: a diagram}
      Notes: {type: "optional[str]", instruction: notes}
  Plan:
    prompt: "Plan it."
    context: [Design]
    output: text
  Speak:
    prompt: "Say it."
    output: {Line: {type: str, instruction: a line}}
    content: "{{ out.Line }}!"
  Hear:
    prompt: "Answer it."
    context: [Speak]
    output: text
roles:
  Architect: {actions: [Design], watch: [UserRequirement]}
  Speaker: {actions: [Speak], watch: [UserRequirement]}
  Planner: {actions: [Plan], watch: [Design]}
  Listener: {actions: [Hear], watch: [Speak]}
"""


def _design_answer(spec: CallSpec, attempt: int) -> Any:
    if spec.action == "Design":
        return {"Zeta approach": "curses", "Alpha files": ["main.py", "game.py"], "Rows": [["P0", "move"]],
                "Diagram": "classDiagram\n    class Game", "Notes": None}
    return {"Line": "hello"} if spec.action == "Speak" else default_answer(spec)


def test_context_quotes_a_structured_output_as_its_fields_in_its_own_order(tmp_path: Path) -> None:
    """Not as indented JSON (a tenth more tokens, a diagram as one escaped string): a line
    per field, in the order the model wrote them, a text of several lines below its key as
    written, a list a line per item, a skipped optional field not at all. A message whose
    `content:` the SOP computes is quoted as it is; `.content` stays the JSON."""
    model = ScriptedModel(_design_answer)
    result = run_sop(sop_text(STRUCTURED_THEN_READ), model, tmp_path)
    plan = _request(model, "Plan").prompt
    assert plan.split("### Design from Architect (Architect)\n", 1)[1] == (
        "Zeta approach: curses\nAlpha files:\n- main.py\n- game.py\nRows:\n- [\"P0\", \"move\"]\n"
        "Diagram:\nclassDiagram\n    class Game")
    assert "### Speak from Speaker (Speaker)\nhello!" in _request(model, "Hear").prompt
    design = next(m for m in result.messages if m.cause_by == "Design")
    assert design.content.startswith("{\n  \"Zeta approach\": \"curses\"")


def test_msgs_and_out_keys_reach_the_template(tmp_path: Path) -> None:
    model = ScriptedModel(lambda s, _: {"Project Name": "snake_game", "Product Goals": ["g"]}
                            if s.action == "WritePRD" else default_answer(s))
    run_sop(sop("pipeline"), model, tmp_path)
    assert _request(model, "WriteDesign").prompt.startswith("Design snake_game.")


def test_json_output_uses_the_compiled_schema_and_message_holds_both_forms(tmp_path: Path) -> None:
    model = ScriptedModel(default_answer)
    result = run_sop(sop("pipeline"), model, tmp_path)
    spec = _request(model, "WritePRD")
    assert spec.kind == "json" and spec.schema["required"] == ["Project Name", "Product Goals"]
    prd = result.messages[1]
    assert prd.out == {"Project Name": "Project Name text", "Product Goals": ["Product Goals text"]}
    assert '"Project Name": "Project Name text"' in prd.content


def test_news_role_and_run_variables(tmp_path: Path) -> None:
    text = """
apiVersion: sop/v1
name: vars
inputs: {idea: {type: str}}
actions:
  Show:
    prompt: "{{ role.id }}/{{ role.name }}/{{ role.profile }} r{{ run.round }} n={{ news | length }} {{ news[0].content }} from {{ news[0].sent_from }}"
    output: text
    context: none
roles:
  Shower: {name: Sam, profile: Tester, actions: [Show], watch: [UserRequirement]}
"""
    model = ScriptedModel(default_answer)
    run_sop(sop_text(text), model, tmp_path, idea="hello")
    assert model.requests[0].spec.prompt == "Shower/Sam/Tester r1 n=1 hello from Human"


def test_model_resolution_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = PIPELINE.replace("team:", "llm: {model: file-model, temperature: 0.5, max_tokens: 100}\nteam:")
    text = text.replace("    profile: Architect\n",
                        "    profile: Architect\n    llm: {model: role-model, temperature: 0.1}\n")
    text = text.replace("  WriteTasks:\n", "  WriteTasks:\n    llm: {model: action-model}\n")
    compiled = sop_text(text)
    monkeypatch.delenv("SOPCTL_MODEL", raising=False)
    model = ScriptedModel(default_answer)
    run_sop(compiled, model, tmp_path / "a")
    models = {r.spec.action: (r.spec.model, r.spec.temperature, r.spec.max_tokens) for r in model.requests}
    assert models == {"WritePRD": ("file-model", 0.5, 100), "WriteDesign": ("role-model", 0.1, 100),
                      "WriteTasks": ("action-model", 0.5, 100)}
    # $SOPCTL_MODEL and --model replace the file's and the role's model; an action's own model
    # wins over them (MetaGPT's per-action llm), except `fake`, which replaces every model
    monkeypatch.setenv("SOPCTL_MODEL", "env-model")
    model = ScriptedModel(default_answer)
    run_sop(compiled, model, tmp_path / "b")
    assert {r.spec.action: r.spec.model for r in model.requests} == {
        "WritePRD": "env-model", "WriteDesign": "env-model", "WriteTasks": "action-model"}
    model = ScriptedModel(default_answer)
    run_sop(compiled, model, tmp_path / "c", model="flag-model")
    assert {r.spec.action: r.spec.model for r in model.requests} == {
        "WritePRD": "flag-model", "WriteDesign": "flag-model", "WriteTasks": "action-model"}
    model = ScriptedModel(default_answer)
    run_sop(compiled, model, tmp_path / "d", model="fake")
    assert {r.spec.model for r in model.requests} == {"fake"}


def test_default_model_is_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SOPCTL_MODEL", raising=False)
    model = ScriptedModel(default_answer)
    run_sop(sop("pipeline"), model, tmp_path)
    assert {r.spec.model for r in model.requests} == {"local"}


# --- template failures --------------------------------------------------------------------

@pytest.mark.parametrize("bomb", [
    "{% for i in range(100000) %}{% for j in range(100000) %}xxxxxxxxxx{% endfor %}{% endfor %}",
    "{{ 'x' * 100000000 }}",
    "{{ news[5].content }}",
    "{{ (news | first).content | int // 0 }}",
    "{{ msgs.WritePRD[-1].content }}",
])
def test_template_bomb_or_error_fails_the_action_cleanly(tmp_path: Path, bomb: str) -> None:
    text = PIPELINE.replace("prompt: Break the design into tasks.", f"prompt: \"{bomb}\"")
    text = text.replace("    actions: [WriteTasks]\n    watch: [WriteDesign]",
                        "    actions: [WriteTasks]\n    watch: [UserRequirement]")
    model = ScriptedModel(default_answer)
    result = run_sop(sop_text(text), model, tmp_path)
    assert result.status == "failed"
    assert "error[SOP501]: action WriteTasks failed: prompt template" in result.error
    assert "WriteTasks" not in model.asked()


# --- for_each -----------------------------------------------------------------------------

class _OutOfOrderModel(ScriptedModel):
    """Later items answer first: item i waits (n - i) more turns of the event loop."""

    def __init__(self, files: list[str]) -> None:
        super().__init__(self._answer)
        self.files = files
        self.finished: list[str] = []

    def _answer(self, spec: CallSpec, attempt: int) -> Any:
        if spec.action == "ListFiles":
            return {"Task list": self.files}
        name = re.search(r"Write (\S+) ", spec.prompt).group(1)
        return fenced(f"# code of {name}")

    async def complete(self, request: ModelRequest) -> ModelAnswer:
        answer = await super().complete(request)
        if request.spec.action == "WriteFile":
            index = int(re.search(r"file (\d+)", request.spec.prompt).group(1))
            for _ in range(len(self.files) - index):
                await asyncio.sleep(0)
            self.finished.append(self.files[index])
        return answer


def test_fan_out_keeps_item_order_when_later_items_finish_first(tmp_path: Path) -> None:
    files = [f"f{i}.py" for i in range(3)]
    model = _OutOfOrderModel(files)
    result = run_sop(sop("fanout"), model, tmp_path)
    assert model.finished == ["f2.py", "f1.py", "f0.py"]
    message = result.messages[-1]
    assert message.out == ["# code of f0.py\n", "# code of f1.py\n", "# code of f2.py\n"]
    assert message.content.index("f0.py") < message.content.index("f2.py")
    assert result.artifacts == ["src/f0.py", "src/f1.py", "src/f2.py"]
    assert (tmp_path / "src/f1.py").read_text() == "# code of f1.py\n"


def test_fan_out_is_concurrent_and_bounded_by_max_concurrency(tmp_path: Path) -> None:
    model = _OutOfOrderModel([f"f{i}.py" for i in range(10)])
    run_sop(sop("fanout"), model, tmp_path)
    assert model.max_in_flight == 4  # max_concurrency: 4
    assert len(model.asked("code")) == 10


def test_for_each_that_is_not_a_list_fails_naming_the_action(tmp_path: Path) -> None:
    text = (TESTS / "sops/fanout.sop.yaml").read_text()
    text = text.replace("""for_each: "{{ msgs.ListFiles[-1].out['Task list'] }}\"""",
                        """for_each: "{{ msgs.ListFiles[-1].out['Task list'][0] }}\"""")
    result = run_sop(sop_text(text), ScriptedModel(default_answer), tmp_path)
    assert result.status == "failed"
    assert "action WriteFile failed: for_each must give a list, got str" in result.error


def test_for_each_item_failure_cancels_the_others_and_fails(tmp_path: Path) -> None:
    def answer(spec: CallSpec, attempt: int) -> Any:
        if spec.action == "ListFiles":
            return {"Task list": ["a.py", "b.py", "c.py"]}
        if "b.py" in spec.prompt:
            from engine.errors import ActionFailed
            return ActionFailed("WriteFile", "no valid answer")
        return fenced("code")
    result = run_sop(sop("fanout"), ScriptedModel(answer), tmp_path)
    assert result.status == "failed" and "WriteFile" in result.error


# --- artifacts ----------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/tmp/sopctl-evil.txt", "../evil.txt", "docs/../../evil.txt"])
def test_artifact_escape_fails_the_action_naming_the_path(tmp_path: Path, path: str) -> None:
    """The path comes from the model's answer, so only the run time check can catch it."""
    text = PIPELINE.replace("path: docs/prd.json", "path: \"{{ out['Project Name'] }}\"")
    model = ScriptedModel(lambda s, _: {"Project Name": path, "Product Goals": []}
                            if s.action == "WritePRD" else default_answer(s))
    result = run_sop(sop_text(text), model, tmp_path / "ws")
    assert result.status == "failed"
    assert "action WritePRD failed" in result.error and path in result.error
    assert not (tmp_path / "evil.txt").exists() and not Path("/tmp/sopctl-evil.txt").exists()
    assert [h["cause_by"] for h in result.history] == ["UserRequirement"]


def test_artifact_through_a_symlink_fails(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "ws" / "docs").symlink_to(tmp_path / "outside")
    result = run_sop(sop("pipeline"), ScriptedModel(default_answer), tmp_path / "ws")
    assert result.status == "failed" and "docs/prd.json" in result.error
    assert list((tmp_path / "outside").iterdir()) == []


def test_artifacts_are_reported_with_their_hash(tmp_path: Path) -> None:
    from engine.run.events import ActionCompleted
    from engine.run.workspace import sha256_text
    result = run_sop(sop("pipeline"), ScriptedModel(default_answer), tmp_path)
    completed = next(e for e in result.events if isinstance(e, ActionCompleted) and e.artifacts)
    content = (tmp_path / "docs/prd.json").read_text()
    assert completed.artifacts == [{"path": "docs/prd.json", "sha256": sha256_text(content)}]


# --- exec ---------------------------------------------------------------------------------

def test_exec_is_refused_before_any_call_without_allow_exec(tmp_path: Path) -> None:
    model = ScriptedModel(default_answer)
    with pytest.raises(RunError, match="--allow-exec: RunCode"):
        run_sop(sop("exec"), model, tmp_path / "ws")
    assert model.requests == []
    assert not (tmp_path / "ws").exists()


def test_exec_runs_in_the_workspace_with_allow_exec(tmp_path: Path) -> None:
    model = ScriptedModel(lambda s, _: fenced("import os\nprint('hi from', os.path.basename(os.getcwd()))"))
    result = run_sop(sop("exec"), model, tmp_path / "ws", allow_exec=True)
    assert result.status == "idle"
    out = result.messages[-1].out
    assert out == {"exit_code": 0, "stdout": "hi from ws\n", "stderr": ""}
    assert result.messages[-1].cause_by == "RunCode"


def _exec_sop(command: str, timeout: float = 30) -> Any:
    return sop_text(f"""
apiVersion: sop/v1
name: cmd
inputs: {{idea: {{type: str}}}}
actions:
  Run: {{kind: exec, command: {command}, command_timeout_s: {timeout}, send_to: ["<none>"]}}
roles:
  Runner: {{actions: [Run], watch: [UserRequirement]}}
""")


def test_exec_nonzero_exit_is_output_not_failure(tmp_path: Path) -> None:
    compiled = _exec_sop('["python", "-c", "import sys; sys.stderr.write(\'bad\'); sys.exit(3)"]')
    result = run_sop(compiled, ScriptedModel(default_answer), tmp_path, allow_exec=True)
    assert result.status == "idle"
    assert result.messages[-1].out == {"exit_code": 3, "stdout": "", "stderr": "bad"}


def test_exec_output_is_bounded(tmp_path: Path) -> None:
    compiled = _exec_sop('["python", "-c", "print(\'x\' * 200000)"]')
    result = run_sop(compiled, ScriptedModel(default_answer), tmp_path, allow_exec=True)
    stdout = result.messages[-1].out["stdout"]
    assert len(stdout) < 70_000 and "truncated" in stdout


def test_exec_timeout_kills_the_process(tmp_path: Path) -> None:
    compiled = _exec_sop('["python", "-c", "import time; time.sleep(60)"]', timeout=0.5)
    result = run_sop(compiled, ScriptedModel(default_answer), tmp_path, allow_exec=True)
    out = result.messages[-1].out
    assert out["exit_code"] == 124 and "timeout" in out["stderr"]


def test_exec_timeout_does_not_wait_for_a_child_that_left_the_group(tmp_path: Path, monkeypatch) -> None:
    """A process that leaves the session *and* clears its environment, whose parent exits at
    once, escapes the reaper's mark (tests/run/test_exec_isolation.py reaps the others): the run
    still goes on, without waiting for the pipes it holds."""
    import engine.run.exec as exec_runner

    monkeypatch.setattr(exec_runner, "DRAIN_AFTER_KILL_S", 0.5)
    script = tmp_path / "escape.py"
    script.write_text(
        "import subprocess, sys, time\n"
        "if sys.argv[1:] == ['middle']:\n"
        "    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'],"
        " start_new_session=True, env={})\n"
        "    sys.exit()\n"
        "subprocess.run([sys.executable, __file__, 'middle'])\n"
        "time.sleep(60)\n")
    compiled = _exec_sop(f'["python", "{script}"]', timeout=2)
    result = run_sop(compiled, ScriptedModel(default_answer), tmp_path / "ws", allow_exec=True,
                     isolate=False)   # an escape only an unisolated command can make
    out = result.messages[-1].out
    assert result.status == "idle"
    assert out["exit_code"] == 124 and "kept the pipes open" in out["stderr"]


def test_exec_missing_program_fails_naming_the_action(tmp_path: Path) -> None:
    compiled = _exec_sop('["no-such-program-sopctl"]')
    result = run_sop(compiled, ScriptedModel(default_answer), tmp_path, allow_exec=True)
    assert result.status == "failed" and "action Run failed: cannot start" in result.error


# --- malformed answers through the real gateway ---------------------------------------------

class _Garbage:
    """A provider that never answers valid JSON."""

    def __init__(self) -> None:
        self.calls = 0

    def supports_schema(self, model: str) -> bool:
        return False

    async def complete(self, request: ModelRequest) -> ModelAnswer:
        self.calls += 1
        return ModelAnswer(text="this is not json at all")


def test_malformed_answers_are_retried_then_fail_naming_the_action(tmp_path: Path) -> None:
    provider = _Garbage()
    gateway = Gateway(providers={"garbage": provider})
    from run_helpers import run_sop as run
    result = run(sop("pipeline"), gateway, tmp_path, model="garbage")
    assert result.status == "failed"
    assert "WritePRD" in result.error
    assert provider.calls == 3  # the first ask and max_retries: 2
    assert result.llm_calls == 3
    assert len(result.messages) == 1  # nothing was published from an invalid answer


def test_exec_does_not_see_api_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-value-123456")
    monkeypatch.setenv("SOPCTL_VISIBLE", "yes")
    compiled = _exec_sop('["python", "-c", "import os; print(os.environ.get(\'OPENAI_API_KEY\'), '
                         'os.environ.get(\'SOPCTL_VISIBLE\'))"], env: [SOPCTL_VISIBLE]')
    result = run_sop(compiled, ScriptedModel(default_answer), tmp_path, allow_exec=True)
    assert result.messages[-1].out["stdout"] == "None yes\n"
