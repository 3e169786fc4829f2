"""The pydantic models of an SOP file (`apiVersion: sop/v1`): the language's one definition.

The JSON Schema (`engine/load/sop.schema.json`, `schemas/sop.schema.json`) and the key
reference (docs/language.md) are generated from these models by `python -m engine.load.schema_gen`;
every field's `description` is what an editor shows. Models are frozen and forbid unknown
keys. Trusted run-time switches (allow-exec, budget overrides...) are deliberately *not*
fields here, so that a shared file can never set them.
"""

from __future__ import annotations

import unicodedata
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Discriminator, Field, StringConstraints, Tag, model_validator

__all__ = ["ACTION_ID", "ROLE_ID", "USER_REQUIREMENT", "SPECIAL_ADDRESSES", "InputSpec", "LLMSpec", "PriceSpec",
           "TeamSpec", "OutputNode", "ReviseSpec", "RecallSpec", "CodeOutput", "Output", "ArtifactSpec", "ActionSpec",
           "JoinSpec", "McpServerSpec", "SearchSpec", "PlannerSpec", "RoleSpec", "Sop", "ENGINE_DIR", "in_engine_dir", "is_template",
           "VAR_NAME", "Absent", "Branch", "enum_docs", "LlmAction", "ExecAction", "AskAction",
           "ReplyAction", "ComputeAction", "ToolAction", "StateVar", "state_value_fits", "EMPTY_STATE", "ActionBase", "PromptedAction", "AnsweredAction", "action_kind", "output_of", "tools_of",
           "retries_of", "DEFAULT_RETRIES"]


ACTION_ID = r"^[A-Z][A-Za-z0-9_]*$"


ROLE_ID = r"^[A-Z][A-Za-z0-9_]*$"


SOP_NAME = r"^[a-z][a-z0-9_-]*$"


ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


VAR_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
"""A role variable's name: an identifier, so that `role.vars.X` reads it."""


MCP_NAME = r"^[a-z][a-z0-9_]*$"


USER_REQUIREMENT = "UserRequirement"
"""Built-in action id of the run's first message (the idea)."""


SPECIAL_ADDRESSES = ("<all>", "<self>", "<none>")


class Absent:
    """`Annotated[X | None, Absent()]`: None only means the key is absent (the default); a file
    may not write `null` there. The model refuses an explicit null and the generated schema
    does not offer it (an editor would otherwise propose `null` as, say, a node's type)."""

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        schema = handler(source)
        return schema["schema"] if schema.get("type") == "nullable" else schema


class Branch:
    """`Annotated[X, Branch(title, description)]` in a union: the title and description of
    that branch in the schema (the diagnostics list a union's branches by title)."""

    def __init__(self, title: str, description: str) -> None:
        self.title, self.description = title, description

    def __get_pydantic_json_schema__(self, core_schema: Any, handler: Any) -> dict[str, Any]:
        return {**handler(core_schema), "title": self.title, "description": self.description}


def enum_docs(**values: str) -> dict[str, Any]:
    """What each value of an enum means, as editors show it on completion and hover (the
    YAML language server reads `markdownEnumDescriptions`, else `enumDescriptions`); the
    generator checks that the values are the enum's, in its order."""
    texts = list(values.values())
    return {"x-enum-values": list(values), "markdownEnumDescriptions": texts, "enumDescriptions": texts}


ActionId = Annotated[str, StringConstraints(pattern=ACTION_ID)]


RoleId = Annotated[str, StringConstraints(pattern=ROLE_ID)]


EnvName = Annotated[str, StringConstraints(pattern=ENV_NAME)]


VarName = Annotated[str, StringConstraints(pattern=VAR_NAME)]


NonEmpty = Annotated[str, StringConstraints(min_length=1)]


def is_template(text: str) -> bool:
    """Whether a `send_to` item is a template (rendered per role) rather than an address."""
    return "{{" in text or "{%" in text


class _Model(BaseModel):
    """Base of every model: unknown keys are errors, instances are immutable, and types are
    strict (no "2" -> 2 coercion) so that the models accept what the schema accepts."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True)


class InputSpec(_Model):
    """A run parameter, set with --idea (for `idea`) or --input key=value."""

    model_config = ConfigDict(title="Input")

    type: Literal["str", "int", "float", "bool", "file"] = Field(default="str", json_schema_extra=enum_docs(
        str="Text (default).", int="A whole number.", float="A number.", bool="true or false.",
        file=("A file the user names (`--input KEY=@PATH`, or the default: a path beside the SOP): copied into "
              "the workspace under `inputs/`, binary or not, and the value is its workspace path (for exec "
              "commands).")), description=(
        "The value's type (default str); `file`: a file copied into the workspace, the value its path there."))
    required: bool = Field(default=False, description="The run refuses to start without it.")
    default: Any = Field(default=None, description="Value when the run does not set it.")
    description: str = Field(default="", description="What the input means (shown by --help-style listings).")


class PriceSpec(_Model):
    """USD per million tokens of a model whose price litellm does not know (a self-hosted one),
    for the budget and `sopctl show`. Never replaces a known price; `--price` on the command
    line takes precedence."""

    model_config = ConfigDict(title="Price")

    input_per_million: float = Field(ge=0, description="USD per million prompt tokens.")
    output_per_million: float = Field(ge=0, description="USD per million completion tokens.")


class LLMSpec(_Model):
    """Settings of LLM calls. The file's `llm` is the default; a role's and an action's `llm`
    override it key by key."""

    model_config = ConfigDict(title="LLM settings")

    model: str | None = Field(default=None, description=(
        "Any litellm model string (e.g. `openai/gpt-4o-mini`), or `local` / `fake`. A shared file usually "
        "leaves it out. `--model` and `SOPCTL_MODEL` take precedence over the file's and a role's; an action's own "
        "model wins over them (MetaGPT's per-action llm), except `--model fake`, which replaces every model."))
    temperature: float | None = Field(default=None, ge=0, le=2, description="Sampling temperature, 0 to 2.")
    max_tokens: int | None = Field(default=None, ge=1, description="Upper bound on completion tokens of one call.")
    timeout_s: float | None = Field(default=None, gt=0, description=(
        "Seconds before one call is abandoned (then retried). Hosted models default to 120."))
    price: Annotated[PriceSpec | None, Absent()] = None
    response_format: Annotated[Literal["json_schema", "json_object", "none"] | None, Absent()] = Field(
        default=None, description=(
            "How an OpenAI-compatible server takes a JSON action's output schema: `json_schema` (OpenAI's "
            "structured outputs), `json_object` (JSON mode with the schema beside it: llama.cpp's Python server, "
            "older vLLM) or `none` (the schema in the prompt only). Default: what the model supports; a "
            "self-hosted server is tried in that order and what it takes is remembered for the run. "
            "`--response-format` overrides it."))


class TeamSpec(_Model):
    """MetaGPT's Team: rounds, investment and the environment description."""

    model_config = ConfigDict(title="Team")

    max_rounds: int = Field(default=12, ge=1, description="Most rounds of a run (MetaGPT n_round; default 12).")
    budget_usd: float = Field(default=0.0, ge=0, description=(
        "Most dollars a run may spend (MetaGPT investment); 0 = no limit."))
    env_desc: str = Field(default="", description="MetaGPT Environment.desc: goes into every role's prompt prefix.")
    send_to: list[Annotated[str, Field(description="A role id or name, or <all>.", examples=["<all>"])]] = Field(
        default_factory=lambda: ["<all>"], min_length=1, description=(
            "Addresses of the first message, the idea (MetaGPT `run_project(idea, send_to=...)`): role ids or "
            "names, or `<all>` (default). An addressed role acts on the idea without watching UserRequirement; "
            "`sopctl run --send-to ROLE` overrides it."))
    leader: str | None = Field(default=None, description=(
        "MGX's TeamLeader: the role (id or name) that routes the team's work. A message the user sends straight "
        "to another role (`team.send_to`, `sopctl run --send-to`) is a direct chat: that role's reply goes back "
        "to the user (`Human`), not to its `send_to`, so the leader takes no turn for it."))
    public_chat: bool = Field(default=False, description=(
        "MGX's public chat: every role also hears every message published (the user's request, the team's "
        "messages): it joins the role's memory and, for a tool-using role, its working memory, without "
        "waking it. Only a message the role watches or is sent wakes it."))


class OutputNode(_Model):
    """An ActionNode: a typed leaf, an object (`children`), or a list of objects (`type: list`
    with `children`)."""

    model_config = ConfigDict(title="Output node")

    type: Annotated[str | None, Absent()] = Field(default=None, examples=[
        "str", "list[str]", "enum[P0|P1|P2]", "optional[int]", "list"], description=(
        "`str`, `int`, `float`, `bool`, `list[T]`, `dict[str, T]`, `enum[a|b|c]` or `optional[T]`; with "
        "`children`, leave it out for an object or write `list` for a list of objects. Default `str`."))
    instruction: str = Field(default="", description="What the model must put in this key; shown to the model.")
    example: Any = Field(default=None, description=(
        "An example value: in the answer's JSON Schema as `examples`, and shown to a hosted model beside the "
        "instruction (the embedded `local` model is not shown it: its small model copies examples)."))
    pattern: str | None = Field(default=None, description=(
        "A regular expression every string of this node must match (each item of a list[str], each value of a "
        "dict[str, str]); it constrains the local model's grammar and is checked on every answer. RE2 syntax, "
        "matched in linear time: no backreferences or lookaround. Example: "
        "'^[A-Za-z0-9_][A-Za-z0-9_./-]*\\.[a-z]+$' for file paths."))
    children: Annotated[dict[str, OutputNode] | None, Absent()] = Field(
        default=None, description="Keys of an object node, in order: key -> node.")


class CodeOutput(_Model):
    """`output: {code: python}`: the answer's first fenced code block."""

    model_config = ConfigDict(title="{code: LANG}")

    code: str = Field(pattern=r"^[a-z][a-z0-9_+-]*$", description="Language of the fenced code block, e.g. python.")


OutputTree = dict[str, OutputNode]


Output = (
    Annotated[Literal["text"], Branch("'text'", "Free text.")]
    | Annotated[CodeOutput, Branch("{code: LANG}", "The first fenced code block of the answer.")]
    | Annotated[OutputTree, Branch("a tree of output nodes", (
        "The ActionNode tree: ordered keys -> nodes. The answer is a JSON object with these keys, "
        "validated against them."))]
)


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
    """A file written into the workspace when the action succeeds."""

    model_config = ConfigDict(title="Artifact")

    path: str = Field(min_length=1, description=(
        "Path relative to the workspace (a template); may not be absolute or leave the workspace."))
    content: str = Field(description="The file's content (a template; `out` is the action's parsed output).")


class JoinSpec(_Model):
    """for_each only: after the items, one message (and optionally one file) made from all
    items' outputs, in item order."""

    model_config = ConfigDict(title="Join")

    separator: str = Field(default="\n\n", description=(
        "Put between the items' texts when `content` is not given (default a blank line)."))
    content: str | None = Field(default=None, description=(
        "A template for the joined text: the prompt's variables plus `outs` (the items' outputs) and "
        "`contents` (the items' texts), in item order. Replaces the separator join."))
    path: str | None = Field(default=None, min_length=1, description=(
        "A template: the workspace path the joined text is written to (relative, inside the workspace), "
        "as one artifact."))


class ReviseSpec(_Model):
    """MetaGPT's ActionNode review → revise after the output tree is filled: a review comments
    on each top-level key that misses its instruction, a revise re-fills only the commented
    keys and merges them; repeated until a review has no comment, at most max_passes
    revisions. Every model call goes through the journal; a person's part is asked as any
    question. Only for kind llm with an output tree."""

    model_config = ConfigDict(title="Review and revise")

    review: Literal["auto", "human"] = Field(default="auto", json_schema_extra=enum_docs(
        auto="The model writes the comments.", human="A person writes the comments."), description=(
        "Who reviews: auto (the model, default) or human (a person writes the comments)."))
    revise: Literal["auto", "human"] = Field(default="auto", json_schema_extra=enum_docs(
        auto="The model re-fills the commented keys.", human="A person writes the new values."),
        description=(
            "Who re-fills the commented keys: auto (the model, default) or human (a person writes the new values). "
            "MetaGPT's `human_review` (a person comments, the model revises) is `review: human` with `revise: auto`."))
    max_passes: int = Field(default=2, ge=1, le=5, description=(
        "The most revisions (1-5, default 2); a review still commenting after them is logged and the output kept."))


class RecallSpec(_Model):
    """Long-term memory (MetaGPT's try_remember, RoleZero's overflow): messages older than the
    memory window, brought back into the context: first those holding a keyword, then the
    most relevant (BM25) to the keywords, else to the action's prompt; at most top_k. Needs a
    memory_window (on the action or its role)."""

    model_config = ConfigDict(title="Recall")

    keywords: list[NonEmpty] = Field(default_factory=list, description=(
        "Older messages holding any of these words (case-insensitive) come back first."))
    top_k: int = Field(default=3, ge=1, le=50, description="The most older messages brought back (1-50, default 3).")


Context = (
    Annotated[list[Annotated[str, Field(description="An action id or UserRequirement.")]],
              Branch("a list of action ids", "The messages of these actions (or UserRequirement).")]
    | Annotated[Literal["all", "none"], Branch("'all' or 'none'", "The whole memory, or no context."),
                Field(json_schema_extra=enum_docs(all="The whole memory (default).", none="No context section."))]
)


KIND_DOCS = enum_docs(
    llm="One LLM call filling the output (the default when `kind` is absent); with `tools`, a tool loop.",
    exec="Run `command` in the workspace (needs --allow-exec).",
    ask="Ask a person the rendered `prompt`, answered against `output`.",
    reply="Send the rendered `prompt` to the person as a message (shown live, journaled; no answer).",
    compute="Publish the rendered `content` (and apply `set`) without a model or a person.",
    tool="Call one built-in or MCP `tool` with templated `args`, gated and journaled like a tool loop's call.")


KIND_DESCRIPTION = (
    "`llm` (default): one LLM call; `exec`: run `command` in the workspace (needs --allow-exec); `ask`: ask a "
    "person the rendered `prompt`, answered against `output`; `reply`: send the rendered `prompt` to the person "
    "as a message (shown live, journaled; no answer); `compute`: publish the rendered `content` without a model; "
    "`tool`: call one `tool` with templated `args`. Each kind has its own keys.")


DEFAULT_RETRIES = 2
"""An llm action's `max_retries` when it sets none; also how often a plan written by an action of
another kind (a person's) is asked again when it is not a valid plan."""


def retries_of(action: ActionBase) -> int:
    """How often an invalid answer to the action is asked again (only kind llm sets it)."""
    return action.max_retries if isinstance(action, LlmAction) else DEFAULT_RETRIES


class ActionBase(_Model):
    """The keys every kind of action has: what it is, where its message goes, its files, its
    fan-out and its bounds. A base class (as are PromptedAction and AnsweredAction): code that
    reads a shared key narrows an ActionSpec with `isinstance` on it."""

    description: str = Field(default="", description=(
        "What the action does (documentation; shown in menus of react roles)."))
    send_to: list[Annotated[str, Field(description="A role id or name, or <all>, <self>, <none>.",
                                       examples=["<all>", "<self>", "<none>"])]] = Field(
        default_factory=lambda: ["<all>"], description=(
            "Addresses of the published message: role ids or names, `<all>` (default), `<self>`, `<none>`, or a "
            "template using only `role` (e.g. \"{{ role.vars.opponent }}\"), resolved for each role that runs the "
            "action and checked by validate, or one reading `state` (e.g. \"{{ state.turn }}\"), rendered when the "
            "action publishes."))
    artifacts: list[ArtifactSpec] = Field(default_factory=list, description=(
        "Files written into the workspace when the action succeeds."))
    for_each: str | None = Field(default=None, description=(
        "A template giving a list: the action runs once per element (concurrently), with the element as `item` "
        "(or the `as` name) and its position as `index`. A mapping gives one `{key, value}` item per entry; pairs "
        "(`.items()`, zip's) are lists, so `item[0]` reads them."))
    when: str | None = Field(default=None, description=(
        "A condition, as a jinja expression with the prompt's variables (e.g. "
        "\"{{ msgs.RunTests[-1].out.exit_code != 0 }}\"): the action runs only when it is true; otherwise it is "
        "skipped with no model call and no message. This is how a loop ends on a result, not only on max_runs."))
    as_: str = Field(default="item", alias="as", pattern=r"^[a-z_][a-z0-9_]*$", description=(
        "Name of the element variable under for_each (default item)."))
    join: Annotated[JoinSpec | None, Absent()] = Field(default=None, description=(
        "for_each only: after the items, one message (and optionally one file) made from all items' outputs, "
        "in item order."))
    max_concurrency: int = Field(default=8, ge=1, le=64, description="Most for_each items in flight at once (default 8).")
    max_runs: int | None = Field(default=None, ge=1, description=(
        "Most times this action may run in one run, counted per role (two roles that share it may each run it "
        "N times): declares a loop through it bounded."))
    content: str | None = Field(default=None, description=(
        "The published message's text, as a template rendered after the action acted: its variables plus `out` "
        "(e.g. \"{{ out.RESPONSE }}\" publishes one field of the output tree, \"{{ out.stdout }}\" an exec's "
        "stdout). Default: the whole output (JSON for a tree). `out` stays the whole output. Under for_each, "
        "per item."))
    set_: dict[VarName, NonEmpty] = Field(default_factory=dict, alias="set", description=(
        "Shared state to change after the action acted: variable (declared under the file's `state`) -> a jinja "
        "expression (braces optional) with the templates' variables plus `out` (a list under for_each), e.g. "
        "`day: \"state.day + 1\"`. Every expression reads the state as it was before; the values must fit the "
        "variables' types. The role sees them at once, the others from the next round."))
    publish: Literal["last", "each"] = Field(default="last", json_schema_extra=enum_docs(
        last="Only the activation's last message is published (default, as MetaGPT).",
        each="Every message this action makes is published."), description=(
        "`last` (default, as MetaGPT): only the activation's last message is published; `each`: every message "
        "this action makes is."))

    @model_validator(mode="after")
    def _join_needs_for_each(self) -> ActionBase:
        if "join" in self.model_fields_set and self.for_each is None:
            raise ValueError("`join` needs `for_each`")
        return self


class PromptedAction(ActionBase):
    """An action with a prompt: sent to a model or shown to a person."""

    prompt: str = Field(default="", description=(
        "The instruction to the model (or the person): a sandboxed jinja2 template. Variables: inputs, role, "
        "msgs, news, run, plan, state; item/index (or the `as` name) under for_each; task in a plan's task action."))


class AnsweredAction(PromptedAction):
    """An action whose prompt is answered against its `output` (by a model or a person), with
    the messages its `context` picks."""

    context: Context = Field(default="all", description=(
        "Which observed/remembered messages are shown: a list of action ids (or UserRequirement), `all` (the "
        "whole memory, default) or `none`."))
    memory_window: int | None = Field(default=None, ge=1, le=10000, description=(
        "The `## Context` section shows at most the last N messages the action's `context` picks (MetaGPT's "
        "memory.get(k)); overrides the role's. `msgs` in templates still see every message."))
    recall: Annotated[RecallSpec | None, Absent()] = Field(default=None, description=(
        "Long-term memory past the memory window: older messages recalled by keyword and relevance "
        "(overrides the role's)."))
    output: Output = Field(default="text", description=(
        "What the action produces: `text` (free text), `{code: LANG}` (the first fenced code block) or a tree of "
        "output nodes. Default `text`."))
    format: Literal["json", "markdown", "content", "xml"] = Field(default="json", json_schema_extra=enum_docs(
        json="A JSON object (default).", markdown="`## Key` sections.",
        content="MetaGPT's `[CONTENT]{json}[/CONTENT]` raw fill.",
        xml="`<key>value</key>` per top-level key, values coerced to their types."), description=(
        "How a prompt-based fill asks for and parses the answer: json (default), markdown (`## Key` sections), "
        "content (MetaGPT's `[CONTENT]{json}[/CONTENT]` raw fill) or xml (`<key>value</key>` per top-level key, "
        "values coerced to their types)."))


class LlmAction(AnsweredAction):
    """`kind: llm` (the default): one LLM call filling the output; with `tools`, a tool loop
    (RoleZero) in which each step is one model call."""

    model_config = ConfigDict(title="Action (kind llm)")

    kind: Literal["llm"] = Field(default="llm", description=(
        "`llm` (the default): one LLM call filling the output; with `tools`, a tool loop."))
    system: str | None = Field(default=None, description=(
        "This action's own system prompt (a template with the prompt's variables), sent after the role's prefix "
        "(its name, profile, goal, constraints and team) and a blank line; for an action that needs its own "
        "persona or rules."))
    role_prefix: bool = Field(default=True, description=(
        "false: the system prompt is this action's `system` alone, without the role's prefix (MetaGPT's "
        "`system_msgs`, which replace the prefix). Default true: the prefix, then `system`."))
    fill: Literal["simple", "complex"] = Field(default="simple", json_schema_extra=enum_docs(
        simple="One call for the whole tree (default).",
        complex="One call per top-level key, independent keys concurrently, merged."), description=(
        "How an output tree is filled: simple (one call for the whole tree, default) or complex (one call per "
        "top-level key, independent keys concurrently, merged: smaller prompts for weak models and long trees). "
        "Only with an output tree."))
    revise: Annotated[ReviseSpec | None, Absent()] = Field(default=None, description=(
        "MetaGPT's review → revise of a filled output tree: a review comments on the keys that miss their "
        "instruction, a revise re-fills them."))
    max_retries: int = Field(default=DEFAULT_RETRIES, ge=0, le=10, description=(
        "Re-asks on an unparseable or invalid answer, with the error shown (default 2). Was `retries` (deprecated)."))
    review: Literal["human"] | None = Field(default=None, description=(
        "`human`: before the model's output is published a person approves it, edits it, or rejects it with a "
        "comment (the model is then asked again with the comment, up to `max_retries` times). On a plan_and_act "
        "planner's action, the person reviews the plan."))
    llm: Annotated[LLMSpec | None, Absent()] = Field(default=None, description=(
        "This action's LLM settings, over its role's and the file's (key by key)."))
    tools: list[NonEmpty] = Field(default_factory=list, description=(
        "The tools the model may call, which makes the action a tool loop (RoleZero): a built-in toolset "
        "(editor, terminal, plan, team, human, browser, search), one command of it (e.g. editor.write), or "
        "`mcp.<server>` for a server declared under `mcp`. Each step is one model call that gives commands or `end` "
        "(whose args are the output); terminal and stdio MCP servers need --allow-exec, HTTP MCP servers and the "
        "`search:` endpoint --allow-host, the browser --allow-network or --allow-host."))
    max_steps: int = Field(default=10, ge=1, le=100, description=(
        "With `tools`: the most steps (model calls) of one tool loop (default 10). The last step offers only "
        "`end`; a model that still does not end ends the action without output (a warning; the run goes on). "
        "At 10 or more, a person who can be asked is asked first whether to go on (yes: as many steps again)."))
    tool_top_k: int | None = Field(default=None, ge=1, le=100, description=(
        "With `tools`: offer the model only the k commands that rank best by BM25 (rank-bm25) against the action's "
        "prompt, plus `end` (RoleZero's tool recommendation, for actions with many tools, e.g. a big MCP server)."))
    quick_think: bool = Field(default=False, description=(
        "With `tools` and `output: text`: one model call first classifies the request (RoleZero's quick think: "
        "QUICK, AMBIGUOUS, SEARCH or TASK) and answers a QUICK or AMBIGUOUS one directly, without the tool loop; "
        "SEARCH and TASK run the loop."))
    experience: list[NonEmpty] = Field(default_factory=list, description=(
        "With `tools`: files beside the SOP (relative paths inside its folder, no `..`, no symlink out; at most "
        "100,000 bytes each) whose text the tool loop's system prompt shows as past experience (RoleZero's "
        "experience: a worked example of the commands)."))
    working_memory: int | None = Field(default=None, ge=0, le=1000, description=(
        "With `tools`: the most entries of the role's working memory (its earlier tool steps, commands and "
        "outputs, and the messages it received) shown to this loop, newest last; overrides the role's "
        "(default 20; 0: none, each activation starts blank)."))


class ExecAction(ActionBase):
    """`kind: exec`: a command run in the workspace without a shell (needs --allow-exec); its
    output is `{exit_code, stdout, stderr}`."""

    model_config = ConfigDict(title="Action (kind exec)")

    kind: Literal["exec"] = Field(description="`exec`: run `command` in the workspace (needs --allow-exec).")
    command: list[str] = Field(min_length=1, description=(
        "The command and its arguments, run inside the workspace without a shell; each item is a template, "
        "rendered into exactly one argument."))
    command_timeout_s: float = Field(default=60, gt=0, le=3600, description=(
        "Seconds before the command is killed (default 60; a model request's limit is `llm.timeout_s`). Was "
        "`timeout_s` (deprecated)."))
    env: list[Annotated[EnvName, Field(description="An environment variable name, e.g. PYTHONPATH.")]] = Field(
        default_factory=list, description=(
            "Names of the user's environment variables the command may see, besides PATH, HOME, LANG, LC_*, TMPDIR "
            "and TERM (all others are withheld). Names only: the values come from the user's environment, never "
            "from the file."))
    output: Annotated[OutputTree | None, Absent()] = Field(default=None, description=(
        "A tree of output nodes: the command's stdout is one JSON object, validated against the tree like a "
        "model's answer, and `out` is that object (a non-zero exit, or stdout that is not such an object, fails "
        "the action). Without it `out` is `{exit_code, stdout, stderr}`."))
    workdir: Literal["workspace", "sop"] = Field(default="workspace", json_schema_extra=enum_docs(
        workspace="The run's workspace (default).",
        sop="The SOP file's own folder, read-only: a script shipped beside the SOP."), description=(
        "Where the command runs: `workspace` (default) or `sop`, the SOP file's folder (read-only under "
        "--isolate; the workspace's path is then in $SOPCTL_WORKSPACE)."))


class AskAction(AnsweredAction):
    """`kind: ask` (MetaGPT's ask_human): a person answers the rendered prompt against
    `output`, on a terminal inline or through `sopctl answer`."""

    model_config = ConfigDict(title="Action (kind ask)")

    kind: Literal["ask"] = Field(description="`ask`: ask a person the rendered `prompt`, answered against `output`.")


class ReplyAction(PromptedAction):
    """`kind: reply` (MetaGPT's reply_to_human): the rendered prompt is sent to the person as
    a message (shown live, journaled); no answer is awaited."""

    model_config = ConfigDict(title="Action (kind reply)")

    kind: Literal["reply"] = Field(description=(
        "`reply`: send the rendered `prompt` to the person as a message (shown live, journaled; no answer)."))


class ComputeAction(ActionBase):
    """`kind: compute`: a message computed from templates, without a model or a person
    (MetaGPT's code that publishes a verdict, a summary, a moderator's announcement); with
    `set`, a step of the shared state. Its `out` is the rendered `content`."""

    model_config = ConfigDict(title="Action (kind compute)")

    kind: Literal["compute"] = Field(description=(
        "`compute`: publish the rendered `content` (and apply `set`) without a model or a person."))


class ToolAction(ActionBase):
    """`kind: tool`: one call of a built-in command or an MCP server's tool, made by the file
    (MetaGPT's code calling search, browse, OCR) with templated arguments: no model chooses
    them. Gated (--allow-exec, --allow-host, --allow-network), journaled and reused on resume
    and replay exactly as the same call in a tool loop. Its `out` is the result (parsed when
    it is JSON), its message the result's text."""

    model_config = ConfigDict(title="Action (kind tool)")

    kind: Literal["tool"] = Field(description=(
        "`tool`: call one built-in or MCP `tool` with templated `args`, gated and journaled like a tool loop's "
        "call."))
    tool: NonEmpty = Field(description=(
        "The command to call: a built-in command (e.g. `search.query`, `editor.read`, `terminal.run`, "
        "`browser.goto`) or `mcp.<server>.<tool>` for a server declared under `mcp`."))
    args: dict[NonEmpty, Any] = Field(default_factory=dict, description=(
        "The command's arguments: each string is a template (the prompt's variables), rendered, and parsed as "
        "JSON when the command's schema wants a number, boolean, list or object; other values are passed as "
        "written."))
    on_error: Literal["fail", "continue"] = Field(default="fail", json_schema_extra=enum_docs(**{
        "fail": "A failed call fails the action (default).",
        "continue": "The error text is the output, and the run goes on."}), description=(
        "What a failed call does: `fail` (default) fails the action, as a failed exec step does; `continue` makes "
        "the error text its output (`out` is then `{error: TEXT}`) and the run goes on."))


class StateVar(_Model):
    """One variable of the file's shared state (MetaGPT's Environment state: a game's day,
    who is alive, the attempts so far): typed, with a default, set by actions' `set`,
    read by every template and `when` as `state.NAME`, journaled and restored on resume."""

    model_config = ConfigDict(title="State variable")

    type: Literal["str", "int", "float", "bool", "list", "dict"] = Field(default="str", description=(
        "The value's type (default str): every `set` must give a value of it (an int is a float too)."))
    default: Any = Field(default=None, description=(
        "The value at the start of a run (default: the type's empty value: \"\", 0, 0.0, false, [], {})."))
    description: str = Field(default="", description="What the variable means (documentation).")

    def initial(self) -> Any:
        """The value at the start of a run."""
        return EMPTY_STATE[self.type]() if self.default is None else self.default


EMPTY_STATE: dict[str, Any] = {"str": str, "int": int, "float": float, "bool": bool, "list": list, "dict": dict}


def state_value_fits(type_: str, value: Any) -> bool:
    """Whether a value is of a state variable's type (bool is not an int; an int is a float)."""
    if type_ == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if type_ == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, EMPTY_STATE[type_])


def action_kind(value: Any) -> str | None:
    """The union's discriminator: an action's `kind`, `llm` when the key is absent."""
    if isinstance(value, dict):
        kind = value.get("kind", "llm")
        return kind if isinstance(kind, str) else None
    return getattr(value, "kind", None)


class _ActionDoc:
    """The action union's schema: titled, with `kind` (and what each kind means) on top of
    the branches, so that an editor completes `kind` and then offers only that kind's keys."""

    def __get_pydantic_json_schema__(self, core_schema: Any, handler: Any) -> dict[str, Any]:
        branches = handler(core_schema)
        kind = {"type": "string", "enum": list(KIND_DOCS["x-enum-values"]), "default": "llm",
                "description": KIND_DESCRIPTION, **KIND_DOCS}
        return {"title": "Action", "description": (
                    "What a role can do: an LLM call (`kind: llm`, the default), a command (`exec`), a question to a "
                    "person (`ask`), a message to the person (`reply`), a computed message (`compute`) or one "
                    "tool call (`tool`); each kind has its own keys."),
                "type": "object", "properties": {"kind": kind}, "oneOf": branches["oneOf"],
                "dependentSchemas": {"join": {"required": ["for_each"], "properties": {"for_each": {
                    "type": "string", "description": "`join` needs `for_each`: it joins the items' outputs."}}}}}


ActionSpec = Annotated[
    Annotated[LlmAction, Tag("llm")] | Annotated[ExecAction, Tag("exec")]
    | Annotated[AskAction, Tag("ask")] | Annotated[ReplyAction, Tag("reply")]
    | Annotated[ComputeAction, Tag("compute")] | Annotated[ToolAction, Tag("tool")],
    Discriminator(action_kind), _ActionDoc(),
]
"""An action of any kind; narrow it with `isinstance` (LlmAction, ExecAction, AskAction, ReplyAction,
ComputeAction, ToolAction)."""


def output_of(action: ActionBase) -> Output:
    """An action's declared `output` (an exec action's tree, when it declares one; else `text`
    for exec and reply: an exec action's `out` is then its fixed `{exit_code, stdout, stderr}`)."""
    if isinstance(action, ExecAction):
        return action.output if action.output is not None else "text"
    return action.output if isinstance(action, AnsweredAction) else "text"


def tools_of(action: ActionBase) -> list[str]:
    """The tools an action calls: a model's in a loop (kind llm's `tools`), or the file's own
    call (kind tool's `tool`), so that the flags, servers and extras they need are the same."""
    if isinstance(action, ToolAction):
        return [action.tool]
    return action.tools if isinstance(action, LlmAction) else []


_PICK_TRANSPORT = "pick one of `command` (stdio) or `url` (HTTP)"


def _transport(key: str, other: str, title: str, description: str) -> dict[str, Any]:
    """One branch of an MCP server's `oneOf`: it has `key` and not `other`. `errorMessage`
    (yaml-language-server's) says in the editor what `validate` says (SOP104), where it would
    say "Matches multiple schemas when only one must validate" or "Missing property"."""
    return {"title": title, "description": description, "required": [key],
            "errorMessage": f"{_PICK_TRANSPORT}: it has neither",
            "allOf": [{"properties": {other: False}, "errorMessage": f"{_PICK_TRANSPORT}: it has both; keep one"}]}


class McpServerSpec(_Model):
    """An MCP server (official `mcp` SDK): `command` starts a stdio server (needs
    --allow-exec), `url` reaches a streamable HTTP server (needs --allow-host for its host);
    exactly one of the two."""

    model_config = ConfigDict(title="MCP server", json_schema_extra={"oneOf": [
        _transport("command", "url", "`command` (stdio)", "A stdio server, started with `command` (needs --allow-exec)."),
        _transport("url", "command", "`url` (HTTP)", "A streamable HTTP server at `url` (needs --allow-host for its host)."),
    ]})

    command: Annotated[list[NonEmpty] | None, Absent()] = Field(default=None, min_length=1, description=(
        "stdio: the server's argv (no shell; `python` is the interpreter running sopctl)."))
    url: Annotated[str | None, Absent()] = Field(default=None, pattern=r"^https?://[^\s/]+", description=(
        "streamable HTTP: the server's URL."))
    env: list[EnvName] = Field(default_factory=list, description=(
        "stdio: names of the user's environment variables the server may see, besides PATH, HOME, LANG, LC_*, "
        "TMPDIR and TERM. Names only."))
    headers: dict[Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9-]+$")], EnvName] = Field(
        default_factory=dict, description=(
            "HTTP: header name -> the NAME of the environment variable holding its value (e.g. Authorization: "
            "MY_TOKEN)."))
    tools: list[NonEmpty] | None = Field(default=None, description=(
        "The tools the server offers, when known: validate checks the names actions use, and the run checks the "
        "server offers them."))
    call_timeout_s: float = Field(default=60, gt=0, le=3600, description=(
        "The longest one tool call may take (default 60). Was `timeout_s` (deprecated)."))
    start_timeout_s: float = Field(default=120, gt=0, le=3600, description=(
        "The longest the server may take to start, answer `initialize` and list its tools (default 120: "
        "`npx` may download it first); a server that does not is named and the run does not start."))

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerSpec:
        if (self.command is None) == (self.url is None):
            raise ValueError(_PICK_TRANSPORT)
        return self


class SearchSpec(_Model):
    """A search endpoint (MetaGPT's SearchEnhancedQA engine), offered to the model as
    `search.query`: an HTTP GET of `url` with the query in `query_param`, answered with JSON
    results (title, url, snippet). Needs --allow-host for its host."""

    model_config = ConfigDict(title="search endpoint")

    url: str = Field(pattern=r"^https?://[^\s/]+", description=(
        "The endpoint, e.g. http://127.0.0.1:8765/search (SearxNG: https://searx.example/search)."))
    query_param: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]+$")] = Field(default="q", description=(
        "The query parameter that carries the query (default q)."))
    params: dict[Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]+$")], str] = Field(
        default_factory=dict, description="Fixed query parameters sent with every query (SearxNG: format: json).")
    headers: dict[Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9-]+$")], EnvName] = Field(
        default_factory=dict, description=(
            "Header name -> the NAME of the environment variable holding its value (e.g. X-API-Key: SEARCH_KEY)."))
    max_results: int = Field(default=5, ge=1, le=20, description=(
        "The most results the model sees for one query (default 5)."))
    timeout_s: float = Field(default=20, gt=0, le=300, description="The longest one query may take (default 20).")


class PlannerSpec(_Model):
    """plan_and_act (MetaGPT's Planner): the action that writes the plan, what runs each task
    (task_action, or task_actions by the task's task_type), and how a failed task is retried,
    then re-planned."""

    model_config = ConfigDict(title="Planner")

    action: ActionId = Field(description=(
        "The action that writes the plan; its output tree must have `tasks`: a list of objects with task_id, "
        "dependent_task_ids and instruction."))
    task_action: Annotated[ActionId | None, Absent()] = Field(default=None, description=(
        "The action that runs each task (sees it as `task`); with task_actions, the one for a type it does not "
        "name. A planner needs task_action, task_actions or both."))
    task_actions: dict[NonEmpty, (
        Annotated[ActionId, Branch("an action id", "The action that runs a task of this type.")]
        | Annotated[list[ActionId], Field(min_length=1),
                    Branch("a list of action ids", "The actions that run a task of this type, in order.")]
    )] = Field(default_factory=dict, description=(
        "Task type -> the action (or list of actions, run in order) that runs a task of that type; the plan's "
        "tasks then need a `task_type` (MetaGPT's Data Interpreter)."))
    max_tasks: int = Field(default=10, ge=1, le=100, description="Most tasks one plan may run (default 10).")
    max_task_retries: int = Field(default=2, ge=0, le=10, description=(
        "How often a failed task (an exec step exits non-zero, an answer stays invalid) runs again with the error "
        "shown, before the planner is asked to re-plan (default 2). Was `task_retries` (deprecated)."))
    max_replans: int = Field(default=1, ge=0, le=10, description=(
        "How often the plan may be updated after a task's retries are spent; then the run fails (default 1)."))

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

    model_config = ConfigDict(title="Role")

    name: str | None = Field(default=None, description=(
        "The role's address besides its id (MetaGPT name, e.g. Bob); defaults to the id."))
    profile: str = Field(default="", description=(
        "The role's profile, e.g. Architect; part of every prompt's prefix. A template, rendered once when the run starts, "
        "with `inputs`, `role.id`, `role.name`, `role.vars` and `run.id`, e.g. \"{{ inputs.language }} Teacher\"."))
    goal: str = Field(default="", description="The role's goal; part of every prompt's prefix. A template, as profile.")
    constraints: str = Field(default="", description=(
        "The role's constraints; part of every prompt's prefix. A template, as profile."))
    desc: str = Field(default="", description=(
        "MetaGPT's Role.desc: when not empty, the whole prefix (the system prompt of the role's calls) instead of "
        "the one made from profile, name, goal, constraints and team.env_desc. A template, as profile, that may "
        "also read role.profile, role.goal and role.constraints (rendered)."))
    vars: dict[VarName, Annotated[str | int | float | bool, Field(description="A string, number or boolean.")]] = Field(
        default_factory=dict, description=(
            "Values this role gives its actions' templates as `role.vars.NAME`, and `send_to` templates such as "
            "\"{{ role.vars.opponent }}\": roles can share one action, each with its own values. Every role running "
            "an action must declare every `role.vars.X` the action reads."))
    human: bool | Annotated[str, StringConstraints(pattern=r"\{[{%]")] = Field(default=False, description=(
        "true, or a template giving true or false (e.g. \"{{ inputs.interactive }}\", rendered once when the run "
        "starts) = MetaGPT is_human: a person answers this role's actions instead of a model, against the same "
        "output trees (on a terminal inline; otherwise the run waits for `sopctl answer`). Its react_mode must be "
        "by_order, or react with one action."))
    actions: list[Annotated[ActionId, Field(description="An action id.")]] = Field(min_length=1, description=(
        "The role's actions in order: the states of its state machine."))
    watch: list[Annotated[str, Field(description="An action id or UserRequirement.")]] = Field(
        default_factory=list, description="Action ids (or UserRequirement) whose messages this role observes.")
    react_mode: Literal["react", "by_order", "plan_and_act"] = Field(default="react", json_schema_extra=enum_docs(
        react="The model picks the next action (default).", by_order="The actions run in order.",
        plan_and_act="A plan (the `planner`'s action), then its tasks."), description=(
        "react (default): the model picks the next action; by_order: the actions run in order; plan_and_act: a "
        "plan, then its tasks."))
    max_react_loop: int = Field(default=1, ge=1, le=100, description=(
        "Most think/act steps per activation in react mode (default 1, as MetaGPT)."))
    memory: bool = Field(default=True, description=(
        "false = MetaGPT enable_memory=False: messages already seen are processed again."))
    memory_window: int | None = Field(default=None, ge=1, le=10000, description=(
        "MetaGPT's memory.get(k): the `## Context` of this role's actions shows at most its last N messages, so "
        "prompts stay bounded as a run grows (an action's own memory_window wins). `msgs` in templates still see "
        "every message."))
    recall: Annotated[RecallSpec | None, Absent()] = Field(default=None, description=(
        "Long-term memory past the window: older messages recalled by keyword and relevance."))
    working_memory: int | None = Field(default=None, ge=0, le=1000, description=(
        "A tool-using role's working memory (MetaGPT's RoleZero memory): the most entries of its earlier tool "
        "steps (commands and outputs) and received messages its tool loops are shown, across activations "
        "(default 20; 0: none; an action's own working_memory wins). Its plan is kept too."))
    llm: Annotated[LLMSpec | None, Absent()] = Field(default=None, description=(
        "This role's LLM settings, over the file's (key by key); an action's own win."))
    planner: Annotated[PlannerSpec | None, Absent()] = Field(default=None, description=(
        "react_mode plan_and_act: the planner (MetaGPT's Planner)."))

    def runnable_actions(self) -> list[str]:
        """Every action the role may run: its `actions`, then its planner's (each once)."""
        planned = [self.planner.action, *self.planner.task_action_ids()] if self.planner else []
        return list(dict.fromkeys([*self.actions, *planned]))


_A = TypeVar("_A", bound=ActionBase)


class Sop(_Model):
    """A declarative multi-agent SOP: roles that watch each other's actions, with MetaGPT semantics."""

    model_config = ConfigDict(title="sopctl SOP file (apiVersion sop/v1)")

    schema_: str | None = Field(default=None, alias="$schema", description="Optional URI of this schema (for editors).")
    apiVersion: Literal["sop/v1"] = Field(description="The language version; exactly sop/v1.")
    name: Annotated[str, StringConstraints(pattern=SOP_NAME)] = Field(description=(
        "The SOP's name: lower case, digits, _ and -."))
    description: str = Field(default="", description="What the SOP does.")
    include: list[NonEmpty] = Field(default_factory=list, description=(
        "SOP library files whose inputs, actions and roles join this file's: paths relative to this file, inside "
        "its folder or a folder given with --include-path (no .., no absolute path, no URL). A library holds "
        "apiVersion, optional name and description, include, inputs, actions and roles."))
    inputs: dict[str, InputSpec] = Field(default_factory=dict, description=(
        "Run parameters, by name; `idea` is what --idea sets."))
    llm: LLMSpec = Field(default_factory=LLMSpec, description=(
        "The default LLM settings of every call; a role's and an action's `llm` override them key by key."))
    team: TeamSpec = Field(default_factory=TeamSpec, description=(
        "MetaGPT's Team: rounds, investment and the environment description."))
    actions: dict[ActionId, ActionSpec] = Field(description="The actions, by id ([A-Z][A-Za-z0-9_]*).")
    roles: dict[RoleId, RoleSpec] = Field(min_length=1, description=(
        "The roles, by id ([A-Z][A-Za-z0-9_]*), in order: the order of each round's messages."))
    mcp: dict[Annotated[str, StringConstraints(pattern=MCP_NAME)], McpServerSpec] = Field(
        default_factory=dict, description=(
            "MCP servers, by name ([a-z][a-z0-9_]*), that actions name in `tools` as `mcp.<name>`."))
    search: Annotated[SearchSpec | None, Absent()] = Field(default=None, description=(
        "The search endpoint of the `search` tool (`search.query`): an HTTP GET answered with JSON results."))
    state: dict[VarName, StateVar] = Field(default_factory=dict, description=(
        "Shared state (MetaGPT's Environment state), by name: typed variables that actions change with `set` and "
        "every template and `when` reads as `state.NAME`; journaled, so a resume and a replay restore it."))

    def role_name(self, role_id: str) -> str:
        return self.roles[role_id].name or role_id

    def role_at(self, address: str | None) -> str | None:
        """The id of the role whose id or name is `address` (e.g. `team.leader`), or None."""
        if address is None or address in self.roles:
            return address
        return next((rid for rid, role in self.roles.items() if role.name == address), None)

    def action_as(self, action_id: str, kind: type[_A]) -> _A:
        """The action, as the kind the caller runs it as (a model fills only kind llm, a tool
        loop is kind llm): a mismatch is an engine bug, never a file's mistake."""
        action = self.actions[action_id]
        if not isinstance(action, kind):
            raise TypeError(f"action {action_id} is of kind {action.kind}, not {kind.__name__}")
        return action

    def role_view(self, role_id: str) -> dict[str, Any]:
        """What templates see as `role` in an action this role runs."""
        role = self.roles[role_id]
        return {"id": role_id, "name": self.role_name(role_id), "profile": role.profile, "goal": role.goal,
                "constraints": role.constraints, "vars": dict(role.vars)}
