"""The experience pool at run time (MetaGPT's `exp_cache`): accepted answers across runs.

Opt-in (`sopctl run --pool FILE`, `$SOPCTL_POOL`). Before a model call, the pool is asked
for the call's request (the action, what is asked for and the prompt; not the model):

- an **exact hit** is reused with no model call: its answer is written into this run's
  journal under the request's key, so the gateway takes it from there as any journaled
  answer (validated again, shown as reused, counted in `reused_calls`, kept for `resume`
  and `replay`), and a `RunLog` says it came from the pool;
- a **near hit** (word-set similarity of the prompts >= the pool's threshold, same action
  and same output) is offered to the model as an example of an accepted answer; the model
  still answers, and a `RunLog` says which entry was offered and how similar it was.

Every answer the gateway accepts is then added to the pool (an existing entry is kept).

Entries belong to the SOP file that made them (`scope`: its source hash, includes and all):
a pool shared between SOPs never lets one file's answers be reused, or offered as examples,
by another, so a shared file run once cannot plant answers in a trusted SOP's later runs;
an edited file starts with no hits of its own.
The pool's storage (SQLite, `engine.journal.pool`) sits in a later layer; this module
knows it through the `ExperiencePool` protocol.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Protocol
from collections.abc import Awaitable, Callable

from engine.models.types import AnswerStore, CallResult, CallSpec, StoredAnswer
from engine.run.longterm import words
from engine.run.workspace import sha256_text

__all__ = ["Experience", "ExperiencePool", "POOL_ORIGIN", "request_key", "signature", "similarity",
           "pooled_call", "EXAMPLE_NOTE"]


POOL_ORIGIN = "experience-pool"
"""The `model` of a pooled answer written into a run's journal."""


EXAMPLE_NOTE = ("\n\n## Example\nAn answer accepted earlier for a similar request (adapt it; do "
                "not copy what does not fit):\n{answer}")


@dataclass(frozen=True)
class Experience:
    """One accepted answer in the pool."""

    id: int
    action: str
    key: str
    prompt: str
    answer: str
    score: float
    uses: int
    similarity: float = 1.0


class ExperiencePool(Protocol):
    threshold: float

    def exact(self, action: str, key: str) -> Experience | None: ...

    def nearest(self, action: str, signature: str, prompt: str) -> Experience | None: ...

    def add(self, action: str, key: str, signature: str, prompt: str, answer: str) -> None: ...

    def reused(self, entry: Experience) -> None: ...

    def offered(self, entry: Experience) -> None: ...


def signature(spec: CallSpec, scope: str = "") -> str:
    """What an answer must be (kind, output schema, format, language) and for which SOP file
    (`scope`): entries of one signature are interchangeable answers, whatever the prompt."""
    what = [spec.kind, spec.schema, spec.format, spec.code_lang, scope]
    return sha256_text(json.dumps(what, sort_keys=True, ensure_ascii=False))


def request_key(spec: CallSpec, scope: str = "") -> str:
    """The request as the pool keys it: action, signature (with the SOP file's scope), system
    prompt and prompt, and a tool step's earlier turns (no model); without turns, the key
    pools made before tool steps had turns."""
    what: list[Any] = [spec.action, signature(spec, scope), spec.system, spec.prompt]
    if spec.turns:   # each step of a loop is a request of its own
        what.append(list(spec.turns))
    return sha256_text(json.dumps(what, ensure_ascii=False))


def similarity(a: str, b: str) -> float:
    """Jaccard similarity of the two texts' word sets (0..1)."""
    left, right = set(words(a)), set(words(b))
    if not left and not right:
        return 1.0
    return len(left & right) / len(left | right)


Log = Callable[[str, str], None]


async def pooled_call(call: Callable[[CallSpec], Awaitable[CallResult]], spec: CallSpec, *,
                      pool: ExperiencePool, journal_key: Callable[[CallSpec], str],
                      store: AnswerStore | None,
                      log: Log, scope: str = "") -> CallResult:
    """`call(spec)` with the pool consulted first and the accepted answer added after.

    `store` is the run's answer store (the journal); without one an exact hit cannot be
    journaled, so it is not reused. `journal_key(spec)` is the key the gateway looks the
    first request up by; `scope` the SOP file's source hash (see the module docstring)."""
    key = request_key(spec, scope)
    hit = pool.exact(spec.action, key)
    if hit is not None and store is not None:
        if store.lookup(journal_key(spec)) is None:
            store.record(journal_key(spec), spec.action,
                         StoredAnswer(hit.answer, 0, 0, 0.0, model=POOL_ORIGIN))
        log("notice", f"answer reused from the experience pool (entry {hit.id}, score {hit.score:g}): "
                    "no model call")
        result = await call(spec)
        pool.reused(hit)
        return result
    asked = spec
    near = pool.nearest(spec.action, signature(spec, scope), spec.prompt)
    if near is not None:
        asked = dataclasses.replace(spec, prompt=spec.prompt + EXAMPLE_NOTE.format(answer=near.answer))
        log("notice", f"experience pool entry {near.id} (similarity {near.similarity:.2f}) offered "
                    "to the model as an example")
        pool.offered(near)
    result = await call(asked)
    pool.add(spec.action, key, signature(spec, scope), spec.prompt, result.text)
    return result
