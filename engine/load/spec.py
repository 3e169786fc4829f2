"""The pydantic models of an SOP file (`apiVersion: sop/v1`).

These models and `sop.schema.json` describe the same language; a test feeds every valid and
invalid case through both. Models are frozen and forbid unknown keys. Trusted run-time
switches (allow-exec, budget overrides...) are deliberately *not* fields here, so that a
shared file can never set them.
"""

from __future__ import annotations

import unicodedata
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

__all__ = ["ACTION_ID", "ROLE_ID", "USER_REQUIREMENT", "SPECIAL_ADDRESSES", "InputSpec", "LLMSpec", "PriceSpec",
           "TeamSpec", "OutputNode", "ReviseSpec", "RecallSpec", "CodeOutput", "Output", "ArtifactSpec", "ActionSpec",
           "JoinSpec", "McpServerSpec", "PlannerSpec", "RoleSpec", "Sop", "ENGINE_DIR", "in_engine_dir", "is_template",
           "VAR_NAME"]


ACTION_ID = r"^[A-Z][A-Za-z0-9_]*$"


ROLE_ID = r"^[A-Z][A-Za-z0-9_]*$"


SOP_NAME = r"^[a-z][a-z0-9_-]*$"


ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


VAR_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
"""A role variable's name: an identifier, so that `role.vars.X` reads it."""


USER_REQUIREMENT = "UserRequirement"
"""Built-in action id of the run's first message (the idea)."""


SPECIAL_ADDRESSES = ("<all>", "<self>", "<none>")


ActionId = Annotated[str, StringConstraints(pattern=ACTION_ID)]


RoleId = Annotated[str, StringConstraints(pattern=ROLE_ID)]


EnvName = Annotated[str, StringConstraints(pattern=ENV_NAME)]


VarName = Annotated[str, StringConstraints(pattern=VAR_NAME)]


def is_template(text: str) -> bool:
    """Whether a `send_to` item is a template (rendered per role) rather than an address."""
    return "{{" in text or "{%" in text


class _Model(BaseModel):
    """Base of every model: unknown keys are errors, instances are immutable, and types are
    strict (no "2" -> 2 coercion) so that the models accept what `sop.schema.json` accepts."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True)


class InputSpec(_Model):
    """A run parameter, set with `--idea` (for `idea`) or `--input key=value`."""

    type: Literal["str", "int", "float", "bool"] = "str"
    required: bool = False
    default: Any = None
    description: str = ""


class PriceSpec(_Model):
    """USD per million tokens of a model whose price litellm does not know (self-hosted)."""

    input_per_million: float = Field(ge=0)
    output_per_million: float = Field(ge=0)


class LLMSpec(_Model):
    """Defaults for LLM calls; a role's and an action's `llm` override the file's."""

    model: str | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    max_tokens: int | None = Field(default=None, ge=1)
    timeout_s: float | None = Field(default=None, gt=0)
    price: PriceSpec | None = None


class TeamSpec(_Model):
    """MetaGPT's Team: rounds, investment and the environment description."""

    max_rounds: int = Field(default=12, ge=1)
    budget_usd: float = Field(default=0.0, ge=0)
    env_desc: str = ""
    send_to: list[str] = Field(default_factory=lambda: ["<all>"])
    """Addresses of the first message, the idea (MetaGPT `run_project(idea, send_to=...)`)."""


class OutputNode(_Model):
    """One ActionNode: a typed leaf, an object (`children`), or a list of objects."""

    type: str | None = None
    instruction: str = ""
    example: Any = None
    pattern: str | None = None
    """A regular expression every string of the node must match (each item of a list[str])."""
    children: dict[str, OutputNode] | None = None


class CodeOutput(_Model):
    """`output: {code: python}`: the answer's first fenced code block."""

    code: str = Field(pattern=r"^[a-z][a-z0-9_+-]*$")


Output = Literal["text"] | CodeOutput | dict[str, OutputNode]


ENGINE_DIR = ".sopctl"
"""The folder of a workspace that holds sopctl's own files (journal, lock): no artifact's."""


def in_engine_dir(path: str) -> bool:
    """Whether an artifact path's first component names ENGINE_DIR, on any file system.

    Compared as a case-insensitive, Windows or macOS file system would see it (case folded,
    compatibility-normalised, trailing dots and spaces dropped), so `.SOPCTL/x` is refused too."""
    parts = PurePosixPath(path.strip()).parts
    if not parts:
        return False
    first = unicodedata.normalize("NFKC", parts[0]).casefold().rstrip(". ")
    return first == ENGINE_DIR


class ArtifactSpec(_Model):
    """A file written into the workspace when the action succeeds (path and content are templates)."""

    path: str = Field(min_length=1)
    content: str


class JoinSpec(_Model):
    """After `for_each`: the items' outputs made one message (and optionally one file), in item order."""

    separator: str = "\n\n"
    content: str | None = None
    """A template (the prompt's variables, plus `outs` and `contents`, the items' outputs and
    texts in item order); when given, it replaces joining the texts with `separator`."""
    path: str | None = Field(default=None, min_length=1)
    """A template: the workspace path the joined text is written to."""


class ReviseSpec(_Model):
    """MetaGPT's ActionNode review → revise, after the output tree is filled: a review names
    each top-level key that misses its instruction (with a comment), a revise re-fills only
    those keys; repeated until a review has no comment or `max_passes` revisions are made."""

    review: Literal["auto", "human"] = "auto"
    """Who writes the comments: the model (`auto`) or a person (`human`)."""
    revise: Literal["auto", "human"] = "auto"
    """Who re-fills the commented keys: the model, or a person. MetaGPT's `human_review` (a
    person comments, the model revises) is `review: human` with `revise: auto`."""
    max_passes: int = Field(default=2, ge=1, le=5)
    """The most revisions; a review still commenting after them is logged, the output kept."""


class RecallSpec(_Model):
    """Long-term memory (MetaGPT's `try_remember` and RoleZero's overflow): messages older
    than the memory window, brought back into the context by keyword and relevance."""

    keywords: list[Annotated[str, StringConstraints(min_length=1)]] = Field(default_factory=list)
    """Older messages holding any of these words (case-insensitive) come back first."""
    top_k: int = Field(default=3, ge=1, le=50)
    """The most older messages brought back; the rest ranked by BM25 relevance to the
    keywords (else to the action's prompt)."""


class ActionSpec(_Model):
    """What a role can do: one LLM call filling an output tree, or (`kind: exec`) a command."""

    description: str = ""
    kind: Literal["llm", "exec", "ask", "reply"] = "llm"
    """`ask`: a person answers the rendered prompt against `output`; `reply`: the rendered
    prompt is sent to the person (MetaGPT's ask_human / reply_to_human)."""
    prompt: str = ""
    system: str | None = None
    """A template: this action's own system prompt, after the role's prefix."""
    context: list[str] | Literal["all", "none"] = "all"
    output: Output = "text"
    format: Literal["json", "markdown", "content", "xml"] = "json"
    """How a prompt-based fill is asked and read: a JSON object, `## Key` sections,
    MetaGPT's `[CONTENT]{json}[/CONTENT]` raw fill, or `<key>value</key>` tags (xml)."""
    fill: Literal["simple", "complex"] = "simple"
    """`complex`: one call per top-level key of the output tree, concurrently, merged."""
    revise: ReviseSpec | None = None
    memory_window: int | None = Field(default=None, ge=1, le=10000)
    """The `## Context` shows at most the last N messages `context` picks (over the role's)."""
    recall: RecallSpec | None = None
    """With a memory window: older messages brought back by keyword and relevance (over the role's)."""
    max_retries: int = Field(default=2, ge=0, le=10)
    review: Literal["human"] | None = None
    """`human`: a person approves, edits or rejects (with a comment) the model's output
    before it is published; a rejection asks the model again, up to `max_retries` times."""
    send_to: list[str] = Field(default_factory=lambda: ["<all>"])
    artifacts: list[ArtifactSpec] = Field(default_factory=list)
    for_each: str | None = None
    when: str | None = None
    """A condition (jinja expression, same variables as the prompt): the action runs only when it
    is true; otherwise it is skipped without a model call or a message. Lets a loop end on a
    result (e.g. tests passing) instead of only on its `max_runs` counter."""
    as_: str = Field(default="item", alias="as", pattern=r"^[a-z_][a-z0-9_]*$")
    join: JoinSpec | None = None
    max_concurrency: int = Field(default=8, ge=1, le=64)
    max_runs: int | None = Field(default=None, ge=1)
    publish: Literal["last", "each"] = "last"
    command: list[str] | None = None
    command_timeout_s: float = Field(default=60, gt=0, le=3600)
    """kind exec: the command's wall-clock limit (a model request's is `llm.timeout_s`)."""
    env: list[EnvName] = Field(default_factory=list)
    """kind exec: names of the user's environment variables the command may see, besides PATH,
    HOME, LANG, LC_*, TMPDIR and TERM. Names only: a shared file never sets a value."""
    llm: LLMSpec | None = None
    tools: list[Annotated[str, StringConstraints(min_length=1)]] = Field(default_factory=list)
    """kind llm: the tools the model may call (toolsets, single commands, `mcp.<server>`); the
    action then runs as a tool loop (RoleZero): each step one model call, until `end`."""
    max_steps: int = Field(default=10, ge=1, le=100)
    """The most model calls of one tool loop; reaching it without `end` fails the action."""
    tool_top_k: int | None = Field(default=None, ge=1, le=100)
    """With `tools`: offer only the k commands that rank best by BM25 against the prompt
    (RoleZero's tool recommendation), plus `end`; for actions with many tools."""
    quick_think: bool = False
    """With `tools` and a text output: one model call first classifies the request (RoleZero's
    quick think: QUICK, AMBIGUOUS, SEARCH or TASK) and answers a quick or ambiguous one at once,
    without the loop."""
    experience: list[Annotated[str, StringConstraints(min_length=1)]] = Field(default_factory=list)
    """With `tools`: files beside the SOP whose text is shown in the loop's system prompt as
    past experience (RoleZero's `_retrieve_experience`), e.g. a worked example."""

    @model_validator(mode="after")
    def _exec_needs_command(self) -> ActionSpec:
        if self.kind == "exec" and not self.command:
            raise ValueError("an action of kind exec needs a non-empty `command`")
        if "join" in self.model_fields_set and self.for_each is None:
            raise ValueError("`join` needs `for_each`")
        return self


class McpServerSpec(_Model):
    """An MCP server (official `mcp` SDK): a stdio server started with `command` (needs
    --allow-exec), or a streamable HTTP server at `url` (needs --allow-host for its host)."""

    command: list[Annotated[str, StringConstraints(min_length=1)]] | None = Field(default=None, min_length=1)
    url: str | None = Field(default=None, pattern=r"^https?://[^\s/]+")
    env: list[EnvName] = Field(default_factory=list)
    """Names of the user's environment variables the stdio server may see (never values)."""
    headers: dict[Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9-]+$")], EnvName] = Field(default_factory=dict)
    """HTTP header -> the name of the environment variable holding its value (e.g. a token)."""
    tools: list[Annotated[str, StringConstraints(min_length=1)]] | None = None
    """The tools the server offers, when known in advance: checked by validate and at start."""
    call_timeout_s: float = Field(default=60, gt=0, le=3600)
    """The longest one tool call may take."""

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerSpec:
        if (self.command is None) == (self.url is None):
            raise ValueError("an MCP server needs exactly one of `command` (stdio) or `url` (HTTP)")
        return self


class PlannerSpec(_Model):
    """`plan_and_act` (MetaGPT's Planner): the action that writes the plan, what runs each task
    (one `task_action`, or by the task's `task_type` through `task_actions`), and how a failed
    task is retried and then re-planned."""

    action: ActionId
    task_action: ActionId | None = None
    """The action that runs a task (of a type `task_actions` does not name)."""
    task_actions: dict[Annotated[str, StringConstraints(min_length=1)],
                       ActionId | Annotated[list[ActionId], Field(min_length=1)]] = Field(default_factory=dict)
    """task type -> the action (or actions, run in order) that run a task of that type."""
    max_tasks: int = Field(default=10, ge=1, le=100)
    max_task_retries: int = Field(default=2, ge=0, le=10)
    """A failed task (an exec step exits non-zero, an answer stays invalid) runs again, with
    the error in its prompt, up to this many times; then the planner is asked to re-plan."""
    max_replans: int = Field(default=1, ge=0, le=10)
    """How often the plan may be updated after a task failed; then the run fails."""

    def steps_for(self, task_type: object) -> list[str]:
        """The actions that run a task of this type, in order ([] when none does)."""
        mapped = self.task_actions.get(task_type) if isinstance(task_type, str) else None
        if mapped is None:
            return [self.task_action] if self.task_action else []
        return [mapped] if isinstance(mapped, str) else list(mapped)

    def task_action_ids(self) -> list[str]:
        """Every action that may run a task (each once, in file order)."""
        steps = [self.task_action] if self.task_action else []
        for mapped in self.task_actions.values():
            steps += [mapped] if isinstance(mapped, str) else mapped
        return list(dict.fromkeys(steps))


class RoleSpec(_Model):
    """A MetaGPT Role: its prefix fields, its actions (states), what it watches, how it reacts."""

    name: str | None = None
    profile: str = ""
    goal: str = ""
    constraints: str = ""
    vars: dict[VarName, str | int | float | bool] = Field(default_factory=dict)
    """Values this role gives its actions' templates (`role.vars.X`) and `send_to` templates,
    so that roles can share one action (each debater sends to its own opponent)."""
    human: bool = False
    """MetaGPT's is_human: a person answers this role's actions instead of a model."""
    actions: list[ActionId] = Field(min_length=1)
    watch: list[str] = Field(default_factory=list)
    react_mode: Literal["react", "by_order", "plan_and_act"] = "react"
    max_react_loop: int = Field(default=1, ge=1, le=100)
    memory: bool = True
    memory_window: int | None = Field(default=None, ge=1, le=10000)
    """MetaGPT's `memory.get(k)`: the last N messages are what its actions' context shows."""
    recall: RecallSpec | None = None
    """Long-term memory past the window: older messages recalled by keyword and relevance."""
    llm: LLMSpec | None = None
    planner: PlannerSpec | None = None

    def runnable_actions(self) -> list[str]:
        """Every action the role may run: its `actions`, then its planner's (each once)."""
        planned = [self.planner.action, *self.planner.task_action_ids()] if self.planner else []
        return list(dict.fromkeys([*self.actions, *planned]))


class Sop(_Model):
    """A whole SOP file."""

    schema_: str | None = Field(default=None, alias="$schema")
    apiVersion: Literal["sop/v1"]
    name: Annotated[str, StringConstraints(pattern=SOP_NAME)]
    description: str = ""
    include: list[Annotated[str, StringConstraints(min_length=1)]] = Field(default_factory=list)
    """Library files merged in at load time (engine/load/includes.py); kept for the record."""
    inputs: dict[str, InputSpec] = Field(default_factory=dict)
    llm: LLMSpec = Field(default_factory=LLMSpec)
    team: TeamSpec = Field(default_factory=TeamSpec)
    actions: dict[ActionId, ActionSpec]
    roles: dict[RoleId, RoleSpec] = Field(min_length=1)
    mcp: dict[Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]*$")], McpServerSpec] = Field(default_factory=dict)
    """MCP servers the actions' `tools` may name as `mcp.<server>`."""

    def role_name(self, role_id: str) -> str:
        return self.roles[role_id].name or role_id

    def role_view(self, role_id: str) -> dict[str, Any]:
        """What templates see as `role` in an action this role runs."""
        role = self.roles[role_id]
        return {"id": role_id, "name": self.role_name(role_id), "profile": role.profile,
                "vars": dict(role.vars)}
