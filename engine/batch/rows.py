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
    number = 0
    for line_no, line in enumerate(handle, start=1):
        if not line.strip():
            continue
        number += 1
        yield _jsonl_row(number, line_no, line)


def _jsonl_row(number: int, line_no: int, line: str) -> Row:
    try:
        value = json.loads(line)
    except json.JSONDecodeError as exc:
        return Row(number, problem=f"line {line_no}: not valid JSON: {exc.msg} (column {exc.colno})")
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
