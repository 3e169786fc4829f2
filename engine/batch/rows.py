"""A batch's rows, read from a JSONL or CSV file as they are needed (memory stays flat).

A row that cannot be used (a broken JSON line, not an object, a value that is a list or an
object) is still a `Row`, with the reason in `problem`: the batch records it as a failed row
and goes on. Keys starting with `_` are the batch's own, never inputs: `_expect` (one
expectation or a list of them) adds expectations for that row.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Iterator

from engine.errors import UsageError
from engine.load.files import FileRefused, open_regular

__all__ = ["Row", "read_rows", "count_rows", "EXPECT_KEY"]

EXPECT_KEY = "_expect"


MAX_ROW_CHARS = 1_000_000
"""The longest JSONL line read as a row (as `--input KEY=@FILE`, it goes into prompts): a
longer one is a failed row, read no further, so one endless line cannot fill memory."""


_SCALARS = (str, int, float, bool, type(None))


@dataclass(frozen=True)
class Row:
    """One row: its number (1-based, in file order), its inputs, its own expectations, or
    why it cannot run."""

    number: int
    inputs: dict[str, Any] = field(default_factory=dict)
    expect: tuple[str, ...] = ()
    problem: str = ""


def read_rows(path: str | Path) -> Iterator[Row]:
    """Every row of a `.jsonl` (one JSON object a line; blank lines skipped) or `.csv` file
    (a header row; an empty cell is an input not given)."""
    source = Path(path)
    kind = _kind(source)
    try:           # a FIFO would hang the batch (nothing may ever write it): a regular file only
        handle = os.fdopen(open_regular(source), encoding="utf-8", newline="")
    except FileRefused as exc:
        raise UsageError(f"cannot read --inputs {path}: {exc.message}", exc.hint) from None
    with handle:
        try:
            yield from (_jsonl_rows(handle) if kind == "jsonl" else _csv_rows(handle, source))
        except UnicodeDecodeError as exc:
            raise UsageError(f"--inputs {path} is not UTF-8 text: {exc.reason}") from None


def count_rows(path: str | Path) -> int:
    """How many rows `read_rows` will yield (one more streaming pass; for the ETA)."""
    return sum(1 for _ in read_rows(path))


def _kind(source: Path) -> str:
    suffix = source.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    if suffix == ".csv":
        return "csv"
    raise UsageError(f"--inputs {source}: unknown format '{suffix or source.name}'",
                     "give a .jsonl file (one JSON object a line) or a .csv file with a header row")


def _jsonl_rows(handle: Any) -> Iterator[Row]:
    number, line_no = 0, 0
    while line := handle.readline(MAX_ROW_CHARS + 1):
        line_no += 1
        if len(line) > MAX_ROW_CHARS and line[-1] not in "\r\n":
            while (rest := handle.readline(MAX_ROW_CHARS)) and rest[-1] not in "\r\n":
                pass            # the rest of the line, skipped a bounded piece at a time
            number += 1
            yield Row(number, problem=f"line {line_no}: longer than {MAX_ROW_CHARS:,} characters")
            continue
        if not line.strip():
            continue
        number += 1
        yield _jsonl_row(number, line_no, line)


def _jsonl_row(number: int, line_no: int, line: str) -> Row:
    try:
        value = json.loads(line)
    except json.JSONDecodeError as exc:
        return Row(number, problem=f"line {line_no}: not valid JSON: {exc.msg} (column {exc.colno})")
    except RecursionError:      # the C decoder's own depth limit: never an internal error
        return Row(number, problem=f"line {line_no}: nested too deeply to read (a row is an "
                                   f"object of plain values)")
    if not isinstance(value, dict):
        return Row(number, problem=f"line {line_no}: a row must be a JSON object, got {type(value).__name__}")
    return _row(number, f"line {line_no}", value)


def _csv_rows(handle: Any, source: Path) -> Iterator[Row]:
    reader = csv.DictReader(handle, strict=True)
    number = 0
    try:
        if reader.fieldnames is None:
            return
        if len(set(reader.fieldnames)) != len(reader.fieldnames):
            raise UsageError(f"--inputs {source}: the header names a column twice")
        for record in reader:
            number += 1
            yield _csv_row(number, reader.line_num, record)
    except csv.Error as exc:
        raise UsageError(f"--inputs {source}: line {reader.line_num}: broken CSV: {exc}") from None


def _csv_row(number: int, line_no: int, record: dict[str | None, Any]) -> Row:
    if None in record:      # more cells than the header has columns
        return Row(number, problem=f"line {line_no}: more cells than the header has columns")
    given = {str(k): v for k, v in record.items() if v not in (None, "")}
    return _row(number, f"line {line_no}", given)


def _row(number: int, where: str, values: dict[str, Any]) -> Row:
    """Split the batch's own keys from the inputs; refuse values no input can take."""
    expect = values.get(EXPECT_KEY, ())
    if isinstance(expect, str):
        expect = (expect,)
    if not (isinstance(expect, (list, tuple)) and all(isinstance(e, str) for e in expect)):
        return Row(number, problem=f"{where}: {EXPECT_KEY} must be a string or a list of strings")
    inputs = {k: v for k, v in values.items() if not k.startswith("_")}
    for key, value in inputs.items():
        if not isinstance(value, _SCALARS):
            return Row(number, problem=f"{where}: input '{key}' must be a single value, "
                                       f"got {type(value).__name__}")
    return Row(number, inputs, tuple(expect))
