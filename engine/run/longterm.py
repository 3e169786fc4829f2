"""Memory windows and long-term recall: what an action's `## Context` may show.

MetaGPT's `memory.get(k)` gives a prompt the last k messages; RoleZero moves what overflows
its working memory to a long-term store and retrieves from it by relevance to the current
request. Here, with a `memory_window` of N, the context shows the last N messages its
`context` picks; with `recall`, up to `top_k` of the older ones come back too: first those
holding one of the `keywords` (MetaGPT's `try_remember`, most recent first), then the most
relevant by BM25 (`rank-bm25`, offline, lexical) to the keywords, else to the action's
prompt. So a prompt holds at most N + top_k messages however long the run grows. Every
message stays in the role's memory: `msgs` in templates still reads all of them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from engine.load.spec import RecallSpec
from engine.run.message import Message

__all__ = ["visible_messages", "recall_older", "words"]


_WORD = re.compile(r"\w+", re.UNICODE)


def words(text: str) -> list[str]:
    """The lowercase words of a text: BM25's terms."""
    return _WORD.findall(text.lower())


def visible_messages(messages: Sequence[Message], window: int | None, recall: RecallSpec | None,
                     query: str) -> list[Message]:
    """The messages a context shows: the last `window`, and with `recall` the older ones it
    brings back (in their original order, before the window's)."""
    if window is None or len(messages) <= window:
        return list(messages)
    older, recent = list(messages[:-window]), list(messages[-window:])
    if recall is None:
        return recent
    return recall_older(older, recall, query) + recent


def recall_older(older: list[Message], recall: RecallSpec, query: str) -> list[Message]:
    """Up to `top_k` of `older`: keyword hits first (most recent first), then by BM25 score
    against the keywords (else `query`); messages with no shared word are never recalled."""
    keywords = [k.lower() for k in recall.keywords]
    hits = [i for i in reversed(range(len(older)))
            if any(k in older[i].content.lower() for k in keywords)]
    terms = words(" ".join(recall.keywords) if recall.keywords else query)
    scored = _bm25_order(older, terms)
    chosen = list(dict.fromkeys([*hits, *scored]))[:recall.top_k]
    return [older[i] for i in sorted(chosen)]


def _bm25_order(older: list[Message], terms: list[str]) -> list[int]:
    """Indices of `older` that share a word with `terms`, best BM25 score first."""
    if not terms or not older:
        return []
    from rank_bm25 import BM25Okapi

    docs = [words(m.content) or [""] for m in older]
    scores = BM25Okapi(docs).get_scores(terms)
    wanted = set(terms)
    sharing = [i for i, doc in enumerate(docs) if wanted & set(doc)]
    return sorted(sharing, key=lambda i: (-scores[i], -i))
