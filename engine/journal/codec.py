"""The journal's rows as Python values: events decoded and validated, exchanges (un)packed.

An event row's JSON is validated by pydantic against its event dataclass
(`engine.run.events`) in strict JSON mode: every field of its declared type (a whole number
is not `true`, a string is not a number), none missing, none unknown, a `RunStatus` one this
sopctl knows, and the messages an event carries with what `Message.from_json` reads. So a
hand-edited or damaged row is a JournalError naming its seq and what is wrong, here, not an
AttributeError deep in `show` or `resume`. An unknown event type, field or status says the
journal comes from another sopctl; a wrong value says it was damaged.
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from dataclasses import dataclass
from functools import cache, cached_property
from typing import Annotated, Any, Union

from pydantic import ConfigDict, Discriminator, Json, Tag, TypeAdapter, ValidationError
from pydantic_core import ErrorDetails
from typing_extensions import Required, TypedDict

from engine.errors import JournalError
from engine.journal.sqlite_errors import DAMAGED, NEWER, OTHER_VERSION
from engine.models.types import StoredAnswer
from engine.run import events as _events
from engine.run.events import ActionCompleted, MessagePublished, RunEvent

__all__ = ["EventRow", "AnswerRow", "EXCHANGE_COMPRESS_AT", "decode_event", "loads",
           "pack_exchange", "unpack_exchange"]


EXCHANGE_COMPRESS_AT = 16384
"""An exchange's JSON longer than this many characters is stored zlib-compressed (a BLOB).
A shorter one is stored as it is: compressing a few KiB cost more CPU (about 30 us per
exchange here, once per model call) than writing the pages it saves (issue 28); a tool
loop's steps store only what each adds (engine.journal.store `_delta`), rarely this long."""


@dataclass(frozen=True)
class EventRow:
    """One stored event: its position, wall time, type name and JSON text."""

    seq: int
    ts: float
    type: str
    text: str

    @cached_property
    def data(self) -> dict[str, Any]:
        """The payload as JSON data, unchecked (`decode_event` checks it)."""
        return loads(self.text, self.seq)


@dataclass(frozen=True)
class AnswerRow:
    """One stored answer; `origin` is `model` (paid for) or `replay` (copied from a journal)."""

    request_hash: str
    action: str
    answer: StoredAnswer
    origin: str
    seq: int


_EVENT_TYPES: dict[str, type] = {
    name: obj for name in _events.__all__
    if isinstance(obj := getattr(_events, name), type) and dataclasses.is_dataclass(obj)
}


class _Message(TypedDict, total=False):
    """What `Message.from_json` reads from a recorded message (other keys are left alone)."""

    id: Required[str]
    cause_by: Required[str]
    sent_from: Required[str]
    round: int
    content: str
    send_to: list[str]


_STRICT = ConfigDict(strict=True, extra="forbid")


@cache
def _rows() -> TypeAdapter[tuple[str, RunEvent]]:
    """(type name, JSON text) -> (type name, event), each type against its own dataclass, in
    one tagged union (the tag: the row's type column). Built once, at the first row decoded
    (about 20 ms: a command that reads no journal never pays it)."""
    members = tuple(Annotated[tuple[str, Json[cls]], Tag(name)]  # type: ignore[valid-type]  # a type per name
                    for name, cls in _EVENT_TYPES.items())
    row: Any = Annotated[Union[members], Discriminator(_type_name)]  # noqa: UP007 - a union of a tuple built here
    return TypeAdapter(row, config=_STRICT)


def _type_name(row: tuple[str, str]) -> str:
    return row[0]


@cache
def _messages() -> TypeAdapter[list[_Message]]:
    return TypeAdapter(list[_Message], config=ConfigDict(strict=True))


def decode_event(row: EventRow) -> RunEvent:
    """Turn a stored row back into its event dataclass, validated (a JournalError if not)."""
    if row.type not in _EVENT_TYPES:
        raise JournalError(f"journal event {row.seq} has an unknown type {row.type!r}", NEWER)
    try:
        event: RunEvent = _rows().validate_python((row.type, row.text))[1]
    except ValidationError as exc:
        raise _refusal(row, exc.errors(include_url=False)[0]) from None
    carried = [event.message] if isinstance(event, MessagePublished) else \
        event.messages if isinstance(event, ActionCompleted) else []
    if carried:
        try:
            _messages().validate_python(carried)
        except ValidationError as exc:
            raise _message_refusal(row, exc.errors(include_url=False)[0]) from None
    return event


_WHAT = {"string_type": "a string", "int_type": "a whole number", "float_type": "a number",
         "bool_type": "true or false", "list_type": "a list", "dict_type": "an object",
         "dataclass_type": "an object", "typed_dict_type": "an object"}
"""What a value should have been, by pydantic's error type."""


def _refusal(row: EventRow, error: ErrorDetails) -> JournalError:
    where = f"journal event {row.seq} ({row.type})"
    kind, loc = error["type"], error["loc"][2:]      # after the type's tag and the tuple's 1
    if not loc:                                      # the whole row: not JSON, not an object
        loads(row.text, row.seq)
        return JournalError(f"{where} is not a JSON object", DAMAGED)
    if kind == "missing":
        return JournalError(f"{where} does not match this sopctl: it has no {_path(loc)}",
                            OTHER_VERSION)
    if kind == "unexpected_keyword_argument":
        return JournalError(f"{where} does not match this sopctl: it has a field {_path(loc)} "
                            "this sopctl does not know", OTHER_VERSION)
    has = f"{where} has {_path(loc)} = {_short(error['input'])}"
    if kind == "enum":
        return JournalError(f"{has}, which is none of {error.get('ctx', {}).get('expected')}", NEWER)
    return JournalError(f"{has}, which is not {_WHAT.get(kind, error['msg'].lower())}", DAMAGED)


def _message_refusal(row: EventRow, error: ErrorDetails) -> JournalError:
    where = f"journal event {row.seq} ({row.type}) holds a message that"
    kind, loc = error["type"], error["loc"][1:]      # after the message's index
    if not loc:
        return JournalError(f"{where} is {_short(error['input'])}, not an object", DAMAGED)
    if kind == "missing":
        return JournalError(f"{where} has no {_path(loc)}", DAMAGED)
    return JournalError(f"{where} has {_path(loc)} = {_short(error['input'])}, which is not "
                        f"{_WHAT.get(kind, error['msg'].lower())}", DAMAGED)


def _path(loc: tuple[int | str, ...]) -> str:
    """`artifacts[0].sha256` of ('artifacts', 0, 'sha256')."""
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=True, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def loads(text: str, seq: int) -> dict[str, Any]:
    """An event row's JSON object (a JournalError naming the row if it is none)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise JournalError(f"journal event {seq} is not valid JSON ({exc})", DAMAGED) from None
    if not isinstance(data, dict):
        raise JournalError(f"journal event {seq} is not a JSON object", DAMAGED)
    return data


def pack_exchange(text: str) -> str | bytes:
    """An exchange's JSON as stored: as it is, or zlib-compressed when long."""
    return _compress(text.encode("utf-8")) if len(text) > EXCHANGE_COMPRESS_AT else text


def _compress(data: bytes) -> bytes:
    """A zlib stream (`zlib.decompress` reads it) at level 1: most of level 6's saving for a
    third of its CPU. Its window and hash table are sized to the text (a 4 KiB exchange gets a
    4 KiB window, not 32): setting up a full-size stream, memory cleared for every exchange,
    cost more than compressing a few KiB, and a window larger than the text finds nothing
    more to repeat."""
    window = min(15, max(9, len(data).bit_length()))
    packer = zlib.compressobj(1, zlib.DEFLATED, window, max(1, min(9, window - 7)))
    return packer.compress(data) + packer.flush()


def unpack_exchange(request_hash: str, data: str | bytes) -> dict[str, Any]:
    """A stored exchange back as JSON (a BLOB is zlib-compressed); damage is a JournalError."""
    try:
        text = zlib.decompress(data).decode("utf-8") if isinstance(data, bytes) else str(data)
        value = json.loads(text)
    except (zlib.error, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise JournalError(f"journal exchange {request_hash[:12]} cannot be read ({exc})", DAMAGED) from None
    if not isinstance(value, dict) or not isinstance(value.get("messages"), list):
        raise JournalError(f"journal exchange {request_hash[:12]} has no list of messages", DAMAGED)
    return value
