"""What a run no longer rebuilds for every call or every command gives what it gave: events
serialise to `dataclasses.asdict`'s dict, and the CLI's parser, built once per process,
hands each command options of its own."""

from __future__ import annotations

import dataclasses
import enum
from collections import OrderedDict, namedtuple
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.cli import commands, parser as cli_parser
from engine.models.types import AnswerContent, Event, ModelAnswered, event_json, plain_fields
from engine.run.events import ActionCompleted, MessagePublished, RunEnded, RunStarted, RunStatus

Pair = namedtuple("Pair", "a b")


class Colour(enum.Enum):
    RED = "red"


@dataclass(frozen=True)
class _Inner:
    items: list[Any]
    pair: tuple[Any, ...] = (1, [2])


@dataclass(frozen=True)
class _Odd(Event):
    inner: _Inner
    mapping: dict[Any, Any]
    named: Pair
    ordered: OrderedDict[str, int]
    colour: Colour
    none: None = None
    numbers: list[float] = field(default_factory=lambda: [1.5, True, 2])


EVENTS = [
    RunStarted(run_id="r", sop_file="f", sop_name="n", sop_hash="h", inputs={"idea": ["x", {"y": 1}]},
               model="fake", engine_version="0", workspace="w", max_rounds=3, budget_usd=0.5, send_to=["A"]),
    ActionCompleted(round=1, role="R", action="A", key="k", messages=[{"id": 1, "out": {"k": [1, 2]}}],
                    artifacts=[{"path": "a.py", "sha256": "0"}]),
    MessagePublished(message={"content": "c", "send_to": ["<all>"]}),
    RunEnded(status=list(RunStatus)[-1], rounds=2),
    ModelAnswered(round=1, role="R", action="A", attempt=0, request_hash="h", prompt_tokens=1,
                  completion_tokens=2, cost_usd=0.0, seconds=0.5, model="fake"),
    _Odd(inner=_Inner([1, {"k": [_Inner([])]}]), mapping={"x": (1, 2), 3: None}, named=Pair(1, [2]),
         ordered=OrderedDict(z=1), colour=Colour.RED),
]


def _journaled(event: Any) -> dict[str, Any]:
    """asdict's dict without the fields only live observers get (LIVE_ONLY)."""
    kept = {f.name for f in dataclasses.fields(event) if f.metadata.get("journal", True)}
    return {k: v for k, v in asdict(event).items() if k in kept}


def test_events_serialise_to_what_asdict_gives() -> None:
    for event in EVENTS:
        assert event.to_json() == _journaled(event)
        assert [type(v) for v in event.to_json().values()] == [type(v) for v in _journaled(event).values()]


def test_an_answers_content_reaches_observers_but_not_the_journal() -> None:
    told = ModelAnswered(1, "R", "A", 0, "h", 3, 2, 0.0, 0.1,
                         content=AnswerContent(({"role": "user", "content": "a prompt"},), "an answer"))
    assert "content" not in told.to_json() and "a prompt" not in event_json(told)
    assert told == ModelAnswered(1, "R", "A", 0, "h", 3, 2, 0.0, 0.1)    # as read back from a journal


def test_a_serialised_event_shares_no_container_with_the_event() -> None:
    event = EVENTS[0]
    data = plain_fields(event)
    data["inputs"]["idea"][1]["y"] = 2
    data["send_to"].append("B")
    assert event.inputs == {"idea": ["x", {"y": 1}]} and event.send_to == ["A"]


def test_the_parser_is_built_once_and_each_command_gets_its_own_lists() -> None:
    assert cli_parser._parser() is cli_parser._parser()
    argv = ["run", "x.sop.yaml", "--model", "fake"]
    first = cli_parser._fresh_lists(cli_parser._parser().parse_args(argv))
    second = cli_parser._fresh_lists(cli_parser._parser().parse_args(argv))
    first.input.append("leaked=1")
    assert second.input == [] and first.input is not second.input
    third = cli_parser._fresh_lists(cli_parser._parser().parse_args([*argv, "--input", "k=v"]))
    assert third.input == ["k=v"]


def test_the_command_list_is_every_command_of_the_parser() -> None:
    full = cli_parser.build_parser()
    [sub] = [a for a in full._actions if a.dest == "command"]
    assert tuple(sub.choices) == cli_parser.COMMANDS
    assert set(commands.HANDLERS) == set(cli_parser.COMMANDS)   # each command has its handler


def test_a_one_command_parser_parses_as_the_whole_parser_does() -> None:
    cases = [["run", "x.sop.yaml", "--model", "fake", "--idea", "i", "--input", "a=1", "--format", "json"],
             ["validate", "a.sop.yaml", "b.sop.yaml", "--strict"], ["batch", "x.sop.yaml", "rows.jsonl"],
             ["resume", "runs/r", "--budget", "1"], ["pool", "list"], ["show", "runs/r", "--prompts"]]
    for argv in cases:
        whole = cli_parser.build_parser().parse_known_args(argv)
        alone = cli_parser.build_parser(argv[0]).parse_known_args(argv)
        assert vars(whole[0]) == vars(alone[0]) and whole[1] == alone[1]
    for name in cli_parser.COMMANDS:
        assert cli_parser.build_parser(name).format_usage() == cli_parser.build_parser().format_usage()


def test_errors_and_help_read_as_with_the_whole_parser(capsys) -> None:
    import pytest

    for argv in (["run"], ["run", "x.sop.yaml", "--no-such-flag"], ["nosuch"], [], ["run", "--help"]):
        outputs = []
        for parser in (cli_parser.build_parser(), cli_parser._parser(argv[0] if argv and argv[0] in cli_parser.COMMANDS else None)):
            with pytest.raises(SystemExit) as stop:
                parser.parse_args(argv)
            outputs.append((stop.value.code, capsys.readouterr()))
        assert outputs[0] == outputs[1], argv

