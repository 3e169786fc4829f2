"""MetaGPT's ActionNode, beyond one fill: fill strategies and review → revise.

- **`fill: complex`** (MetaGPT's `complex_fill`): the output tree is filled one top-level key
  at a time, each with the action's prompt and a schema of that key alone, so a weak model
  or a long tree gets smaller answers to write; the keys do not depend on one another, so
  their calls run concurrently (the caller gathers them) and the parts are merged in the
  tree's order. `split_schema` and `merge_parts` are the two halves.
- **`revise:`** (MetaGPT's `review` + `revise`): after the tree is filled, a review names
  each top-level key whose value misses its instruction, with a comment; a revise re-fills
  only those keys and merges them. The model reviews with `REVIEW_PROMPT` against
  `review_schema` (a list of `{key, comment}`, empty when the output is accepted); a person
  reviews key by key (`person_review_schema`: a comment, or nothing). The loop stops when a
  review has no comment, or after `max_passes` revisions (a run never loops for ever on a
  reviewer that is never satisfied: the last output is kept and a warning logged).

Nothing here calls a model or a person itself: `revise_output` is given the two ways to ask
(each through the gateway or the person-in-the-loop mechanism, so journaled and reused on
resume), which keeps this module below `engine.run.actions`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from collections.abc import Awaitable, Callable

from engine.load.spec import ReviseSpec
from engine.models.answers import field_list

__all__ = ["split_schema", "part_prompt", "merge_parts", "review_schema", "person_review_schema", "comments_of",
           "review_prompt", "revise_prompt", "Asker", "revise_output", "RevisePass"]


Asker = Callable[[str, dict[str, Any], str], Awaitable[Any]]
"""(prompt, JSON Schema, step) -> an accepted value; `step` names the pass for question keys."""


# --------------------------------------------------------------------------- fill: complex


def split_schema(schema: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """One object schema per top-level key of an output tree's schema, in the tree's order."""
    props: dict[str, Any] = schema.get("properties") or {}
    return [(key, _keys_schema(schema, [key])) for key in props]


def _keys_schema(schema: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    """The tree's schema cut down to `keys` (each kept required when it was)."""
    props: dict[str, Any] = schema.get("properties") or {}
    required = [k for k in schema.get("required", []) if k in keys]
    return {"type": "object", "properties": {k: props[k] for k in keys if k in props},
            "required": required, "additionalProperties": False}


def part_prompt(prompt: str, key: str) -> str:
    """The action's prompt for one key of a complex fill."""
    return (f"{prompt.rstrip()}\n\n## Part\nFill only the field \"{key}\" of the output now; "
            "the other fields are written separately.")


def merge_parts(schema: dict[str, Any], parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The parts' keys as one object, in the tree's order (a key a part lacks stays absent)."""
    merged: dict[str, Any] = {}
    for part in parts:
        merged.update(part)
    order = list((schema.get("properties") or {}).keys())
    return {k: merged[k] for k in order if k in merged}


# --------------------------------------------------------------------------- review → revise


def review_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """What a model's review is: a list of comments, each naming a top-level key (an empty
    list accepts the output). Keys are an enum, so a comment on no key is an invalid answer."""
    keys = list((schema.get("properties") or {}).keys())
    comment = {"type": "object", "additionalProperties": False, "required": ["key", "comment"],
               "properties": {"key": {"type": "string", "enum": keys,
                                      "description": "the field that misses its instruction"},
                              "comment": {"type": "string", "minLength": 1,
                                          "description": "what is wrong and how to fix it"}}}
    return {"type": "object", "additionalProperties": False, "required": ["comments"],
            "properties": {"comments": {"type": "array", "minItems": 0, "items": comment,
                                        "description": "one per field that misses its instruction; "
                                                       "empty when every field meets it"}}}


def person_review_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """What a person's review is: for each top-level key a comment, or nothing (null) when the
    value meets its instruction; asked key by key at a terminal (Enter: no comment)."""
    keys = list((schema.get("properties") or {}).keys())
    field = {"type": ["string", "null"], "description": "a comment, or nothing when it is right"}
    return {"type": "object", "additionalProperties": False, "required": keys,
            "properties": {k: dict(field) for k in keys}}


def comments_of(review: Any) -> dict[str, str]:
    """{key: comment} from either review's answer; empty or blank comments are no comment."""
    if isinstance(review, dict) and isinstance(review.get("comments"), list):
        pairs = [(c.get("key"), c.get("comment")) for c in review["comments"] if isinstance(c, dict)]
    elif isinstance(review, dict):
        pairs = list(review.items())
    else:
        pairs = []
    found: dict[str, str] = {}
    for key, comment in pairs:
        if isinstance(key, str) and isinstance(comment, str) and comment.strip():
            found[key] = f"{found[key]} {comment.strip()}" if key in found else comment.strip()
    return found


REVIEW_PROMPT = """{prompt}

## Output to review
{output}

## Review
Check each field of the output above against its instruction:
{fields}
For each field whose value does not meet its instruction, write one comment naming the field,
saying what is wrong and how to fix it. Write no comment for a field that meets it; no
comment at all accepts the output."""


REVISE_PROMPT = """{prompt}

## Current output
{output}

## Review comments
{comments}

## Revise
Write these fields again, taking their comments into account: {keys}. Write only these fields;
the others are kept as they are."""


def review_prompt(prompt: str, value: dict[str, Any], schema: dict[str, Any]) -> str:
    return REVIEW_PROMPT.format(prompt=prompt.rstrip(), output=_shown(value), fields=field_list(schema))


def revise_prompt(prompt: str, value: dict[str, Any], comments: dict[str, str]) -> str:
    listed = "\n".join(f'- "{k}": {c}' for k, c in comments.items())
    return REVISE_PROMPT.format(prompt=prompt.rstrip(), output=_shown(value), comments=listed,
                                keys=", ".join(f'"{k}"' for k in comments))


def _shown(value: dict[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=False, indent=2)


@dataclass(frozen=True)
class RevisePass:
    """One review of the loop: its comments, and whether a revision followed."""

    number: int
    comments: dict[str, str]
    revised: bool


async def revise_output(revise: ReviseSpec, *, prompt: str, value: dict[str, Any],
                        schema: dict[str, Any], model: Asker, person: Asker,
                        log: Callable[[str, str], None]) -> tuple[dict[str, Any], list[RevisePass]]:
    """Review → revise until a review has no comment or `max_passes` revisions are made.

    `model` and `person` ask (each journaled by the caller); `log(level, message)` reports
    each pass. Returns the final output and the passes made."""
    passes: list[RevisePass] = []
    for number in range(revise.max_passes + 1):
        comments = await _review(revise, prompt, value, schema, model, person, number)
        last = number == revise.max_passes
        passes.append(RevisePass(number + 1, comments, bool(comments) and not last))
        if not comments:
            log("notice", f"review {number + 1}: accepted")
            return value, passes
        if last:
            log("warning", f"review {number + 1} still comments on {', '.join(comments)} after "
                           f"{revise.max_passes} revision(s) (max_passes); the output is kept as it is")
            return value, passes
        log("notice", f"review {number + 1}: revising {', '.join(comments)}")
        value = await _revise(revise, prompt, value, schema, comments, model, person, number)
    raise AssertionError("unreachable")  # pragma: no cover


async def _review(revise: ReviseSpec, prompt: str, value: dict[str, Any], schema: dict[str, Any],
                  model: Asker, person: Asker, number: int) -> dict[str, str]:
    asked = review_prompt(prompt, value, schema)
    if revise.review == "human":
        return _known(comments_of(await person(asked, person_review_schema(schema),
                                               f"review/{number}")), schema)
    return _known(comments_of(await model(asked, review_schema(schema), f"review/{number}")), schema)


def _known(comments: dict[str, str], schema: dict[str, Any]) -> dict[str, str]:
    """Comments on the tree's own keys only (a person's form cannot name others; a model's
    enum cannot either, this is the guard)."""
    props = schema.get("properties") or {}
    return {k: c for k, c in comments.items() if k in props}


async def _revise(revise: ReviseSpec, prompt: str, value: dict[str, Any], schema: dict[str, Any],
                  comments: dict[str, str], model: Asker, person: Asker, number: int) -> dict[str, Any]:
    keys = list(comments)
    part_schema = _keys_schema(schema, keys)
    part_schema["required"] = keys   # a revision rewrites every commented key
    asked = revise_prompt(prompt, value, comments)
    ask = person if revise.revise == "human" else model
    part = await ask(asked, part_schema, f"revise/{number}")
    return merge_parts(schema, [value, {k: v for k, v in part.items() if k in comments}])
