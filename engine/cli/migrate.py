"""`sopctl migrate FILE...`: rewrite deprecated spellings in place (engine/load/migrations.py).

Each file is read by the safe loader (so a file `validate` refuses, for a tag, an alias
bomb, a FIFO or bad YAML, is refused here too, located, exit 2), its deprecated spellings are
found on the plain data and only their tokens are replaced in the text: comments, key order,
quoting, flow style, line ends and a BOM stay byte for byte. The new text must load as the
old data with the renames made, or nothing is written. Writes are atomic (a temporary file
beside it, then a rename) and keep the file's mode. The rewritten file is then checked: a
file with problems other than deprecations says so (run `sopctl validate`), exit 1.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from engine.check.diagnostics import format_diagnostic
from engine.compile.compiler import check_text, source_lines
from engine.errors import Diagnostic, LoadError, SopError
from engine.load.includes import LIBRARY_KEYS
from engine.load.migrations import apply_changes, find_changes, rewrite_text
from engine.load.source import load_path, load_text

if TYPE_CHECKING:
    import argparse

    from engine.load.migrations import Change
    from engine.load.source import Source

__all__ = ["migrate_files"]


_BOM = b"\xef\xbb\xbf"


def migrate_files(args: argparse.Namespace) -> int:
    """Exit 0: done (or nothing to do); 1: `--check` found something to change, or a file has
    other errors; 2: a file could not be read, refused by the loader, or not written."""
    code = 0
    for file in args.files:
        code = max(code, _migrate_file(file, args))
    return code


def _migrate_file(file: str, args: argparse.Namespace) -> int:

    try:
        source = load_path(file)
    except LoadError as exc:
        _print_diagnostics(exc.diagnostics, file)
        print(f"{file}: not migrated: the file cannot be loaded (fix it, then run `sopctl validate {file}`)",
              file=sys.stderr)
        return 2
    changes = find_changes(source.data, source.map)
    text, done, skipped = rewrite_text(source.text, changes)
    for change in done:
        _say(args, f"{file}:{change.line}:{change.col}: {change.old_text} -> {change.new_text} (at {change.mapping})")
    for change in skipped:
        print(f"{file}:{change.line}:{change.col}: not rewritten: {_why(change)}", file=sys.stderr)
    if done and not _loads_as_expected(source, text, done, file):
        return 2
    left = 1 if skipped else 0   # each one said: the file still has that error
    if not done:
        _say(args, f"{file}: {'nothing rewritten' if skipped else 'nothing to migrate'}")
        return max(left, _other_problems(file, text, args))
    if args.diff:
        _print_diff(file, source.text, text)
    code = _write(file, source, text, done, args)
    return code if code == 2 else max(code, left, _other_problems(file, text, args))


def _why(change: Change) -> str:
    m = change.migration
    if change.conflict:
        return f"`{m.new}` is there too (line {change.conflict[0]}): keep one of them (SOP016)"
    if change.blocked:
        return f"{change.blocked}: set `review: human` or `revise: auto` yourself (SOP218)"
    return f"`{m.old}` is not written plainly here (an escape?): write `{change.new_text}` yourself"


def _loads_as_expected(source: Source, text: str, done: list[Change], file: str) -> bool:
    """The safety net: the new text must load as the old data with exactly these renames."""

    try:
        ok = load_text(text, file).data == apply_changes(source.data, done)
    except LoadError:
        ok = False
    if not ok:
        print(f"{file}: not migrated: the rewritten text would not load as intended "
              "(a bug in sopctl; please report it); the file is unchanged", file=sys.stderr)
    return ok


def _print_diff(file: str, before: str, after: str) -> None:
    """A unified diff with git's a/ and b/ prefixes (`git apply` and `patch -p1` take it)."""
    name = file.lstrip("/")
    sys.stdout.writelines(difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                               fromfile=f"a/{name}", tofile=f"b/{name}"))


def _write(file: str, source: Source, text: str, done: list[Change], args: argparse.Namespace) -> int:
    count = f"{len(done)} change{'s' * (len(done) != 1)}"
    if args.check or args.diff:
        _say(args, f"{file}: {count} to make (run `sopctl migrate {file}`)")
        return 1 if args.check else 0
    data = (_BOM if source.raw.startswith(_BOM) else b"") + text.encode("utf-8")
    try:
        _replace_atomically(Path(file), source.raw, data)
    except (OSError, SopError) as exc:
        print(f"{file}: error: not written: {getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
        return 2
    _say(args, f"{file}: {count} written")
    return 0


def _say(args: argparse.Namespace, line: str) -> None:
    """What was (or would be) changed: on stdout, or on stderr with --diff (stdout is the patch)."""
    print(line, file=sys.stderr if args.diff else sys.stdout)


def _replace_atomically(path: Path, expected: bytes, data: bytes) -> None:
    """Write `data` over the file (its target if it is a symlink) through a temporary file
    beside it and a rename, with the file's mode; refused if it changed since it was read."""
    real = Path(os.path.realpath(path))
    mode = stat.S_IMODE(real.stat().st_mode)
    if real.read_bytes() != expected:
        raise SopError("the file changed while it was being migrated; run sopctl migrate again")
    handle, temp = tempfile.mkstemp(dir=real.parent, prefix=f".{real.name}.", suffix=".migrate")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temp, mode)
        os.replace(temp, real)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def _other_problems(file: str, text: str, args: argparse.Namespace) -> int:
    """1 (said) when the migrated file still has errors: they are for `validate` to show."""

    data = load_text(text, file).data
    if set(data) <= set(LIBRARY_KEYS) and not {"name", "roles"} <= set(data):
        return 0  # a library: checked as part of the file that includes it
    errors = sum(d.is_error for d in check_text(text, file, tuple(args.include_path)).diagnostics)
    if not errors:
        return 0
    print(f"{file}: has other problems ({errors} error{'s' * (errors != 1)}): "
          f"run `sopctl validate {file}`", file=sys.stderr)
    return 1


def _print_diagnostics(diagnostics: list[Diagnostic], file: str) -> None:

    for diagnostic in diagnostics:
        print(format_diagnostic(diagnostic, source_lines(diagnostic.file or file)), file=sys.stderr)
