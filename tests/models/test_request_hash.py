"""The request hash: the journal's key for an answer. Its text is spliced from encodings kept
across calls (a tool loop hashes its earlier messages and its schema at every step); it must
stay the text one json.dumps gives, or a resumed run would miss the answers it paid for."""
from __future__ import annotations

import hashlib
import json
import random
from typing import Any

from engine.models.types import canonical_json, request_hash


def _plain(canonical: dict[str, Any]) -> str:
    return json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


SLOT_LIKE = "\x00sopctl-slot\x00"


def test_the_spliced_text_is_the_plain_json_whatever_the_values() -> None:
    rng = random.Random(7)
    words = ["a", "é", "\n", '"', "\\", "\x00", SLOT_LIKE + "messages", SLOT_LIKE + "schema", "{", "]", "😀"]
    schema = {"type": "object", "properties": {"x": {"type": "string", "default": SLOT_LIKE + "schema"}}}
    other = {"type": "object", "properties": {"y": {"type": "string", "default": SLOT_LIKE + "messages"}}}
    for _ in range(300):
        def text() -> str:
            return "".join(rng.choice(words) for _ in range(rng.randint(0, 8)))
        messages: list[Any] = [{"role": rng.choice(["user", "assistant", "system"]), "content": text()}
                               for _ in range(rng.randint(0, 5))]
        if rng.random() < 0.3:
            messages.append({"role": "user", "content": text(), "name": text()})   # not a plain message
        canonical = {"v": 1, "model": text(), "kind": "json", "messages": messages,
                     "schema": rng.choice([schema, other, {"type": "object"}, None]), "format": text(),
                     "temperature": None, "max_tokens": rng.choice([None, 10])}
        for _ in range(2):   # the second time from what was kept
            assert canonical_json(canonical) == _plain(canonical)
            assert request_hash(canonical) == hashlib.sha256(_plain(canonical).encode()).hexdigest()


def test_a_journaled_hash_is_unchanged() -> None:
    """A known request's hash, as journals written before the splicing hold it."""
    canonical = {"v": 1, "model": "fake", "kind": "text", "messages": [{"role": "user", "content": "hi"}],
                 "response_format": None, "temperature": None, "max_tokens": None}
    assert request_hash(canonical) == hashlib.sha256(
        b'{"kind":"text","max_tokens":null,"messages":[{"content":"hi","role":"user"}],"model":"fake",'
        b'"response_format":null,"temperature":null,"v":1}').hexdigest()


def test_a_conversation_hashed_step_by_step_is_hashed_as_a_whole() -> None:
    """A tool loop's requests: each repeats the one before and adds two messages; the hash
    goes on from the last one's, and must be the plain JSON's hash whatever happens to the
    conversation (an earlier message cut down, a message changed in place, a non-plain one)."""
    rng = random.Random(11)

    def plain_hash(canonical: dict[str, Any]) -> str:
        return hashlib.sha256(_plain(canonical).encode()).hexdigest()

    messages: list[Any] = [{"role": "system", "content": "You act."}, {"role": "user", "content": "Do it é"}]
    for step in range(40):
        messages = messages + [{"role": "assistant", "content": f'{{"step": {step}}}'},
                               {"role": "user", "content": "output\n" * rng.randint(0, 5) + SLOT_LIKE * (step % 7 == 0)}]
        if step % 9 == 4:      # an older step cut down: a new message object in the middle
            messages[3] = {"role": "user", "content": "(cut)"}
        if step % 11 == 5:     # a message changed in place after it was hashed
            messages[-1]["content"] += " more"
        if step % 13 == 6:     # a message that is not plain (a name)
            messages.append({"role": "user", "content": "x", "name": "tool"})
        canonical = {"v": 1, "model": "fake", "kind": "json", "messages": messages,
                     "schema": {"type": "object"}, "temperature": None}
        assert request_hash(canonical) == plain_hash(canonical), step
        assert request_hash(dict(canonical)) == plain_hash(canonical)   # from what was kept
