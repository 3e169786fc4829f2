"""Safe loading of SOP files: bytes -> round-trip YAML nodes -> plain data plus a source map.

SOP files are shared and untrusted. Nothing here ever constructs a Python object from a tag:
the file is only *composed* (ruamel's node graph, which keeps every node's position) and the
nodes are converted to plain `dict`/`list`/`str`/`int`/`float`/`bool`/`None` by this module.
Before conversion the node graph is checked for what makes YAML dangerous or ambiguous: tags
outside the core schema, duplicate keys, alias bombs (many aliases or a huge expansion),
recursive aliases, deep nesting, merge keys and non-scalar keys. Every refusal is a located
`Diagnostic`; a file with any of them raises `LoadError`.

Composition uses ruamel's safe composer: node positions, no comments (the checker never
writes files back, so it does not need them) and no object construction. It parses with
libyaml (ruamel.yaml.clib) where that is installed, about 25 times faster than ruamel's
pure-Python parser on a typical SOP, with the same YAML 1.2 tag resolver, so both give the
same nodes; a file libyaml refuses is composed again by the pure-Python parser, whose
messages and positions the diagnostics are written for (and which accepts the few YAML 1.2
forms libyaml does not).

The source map maps a JSON pointer to the 1-based (line, col) of the value there, and of the
key for pointers that name a mapping entry, so later phases can report a position for any
pointer without knowing about YAML.
"""

from __future__ import annotations

import math
import os
import re
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from engine.errors import Diagnostic, LoadError, Related

__all__ = ["MAX_ALIASES", "MAX_DEPTH", "MAX_EXPANDED_NODES", "MAX_FILE_BYTES", "Source",
           "SourceMap", "escape_pointer", "iter_pointers", "join_pointer", "load_bytes",
           "load_path", "load_text"]


MAX_FILE_BYTES = 1_000_000
"""A real SOP is a few KiB; a megabyte is far beyond any hand-written file."""


MAX_DEPTH = 64
"""Deepest nesting of mappings/sequences accepted (an SOP needs about ten)."""


MAX_ALIASES = 100
"""Alias uses accepted in one file; anchors are rare in SOPs, bombs use thousands."""


MAX_EXPANDED_NODES = 200_000
"""Nodes the document may have once every alias is expanded (defeats 'billion laughs')."""


_CORE = "tag:yaml.org,2002:"


_CORE_TAGS = {f"{_CORE}{t}" for t in ("str", "int", "float", "bool", "null", "map", "seq")}


_AS_TEXT_TAGS = {f"{_CORE}timestamp"}
"""Implicitly resolved tags that plain data keeps as the text written (dates stay strings)."""


def escape_pointer(token: str) -> str:
    """Escape one reference token of a JSON pointer (RFC 6901)."""
    return token.replace("~", "~0").replace("/", "~1")


def join_pointer(base: str, *tokens: str | int) -> str:
    """`base` extended by the given tokens, escaped."""
    return base + "".join("/" + escape_pointer(str(t)) for t in tokens)


@dataclass
class SourceMap:
    """JSON pointer -> 1-based (line, col) of the value, and of the key of a mapping entry."""

    values: dict[str, tuple[int, int]] = field(default_factory=dict)
    keys: dict[str, tuple[int, int]] = field(default_factory=dict)
    containers: set[str] = field(default_factory=set)
    """Pointers whose value is a mapping or list (reported at their key, which names them)."""
    literals: set[str] = field(default_factory=set)
    """Pointers of `|` block scalars, whose template line N is file line (value line + N)."""

    def locate(self, pointer: str, prefer_key: bool = False) -> tuple[int, int]:
        """The position of `pointer`, or of its nearest ancestor that the file has.

        A container is located at its key (`Architect:`), a scalar at its value."""
        prefer_key = prefer_key or pointer in self.containers
        while True:
            table = (self.keys, self.values) if prefer_key else (self.values, self.keys)
            for positions in table:
                if pointer in positions:
                    return positions[pointer]
            if not pointer:
                return (1, 1)
            pointer = pointer.rsplit("/", 1)[0]


@dataclass
class Source:
    """A loaded file: its plain data, its source map and its text (for rendering lines)."""

    file: str
    text: str
    data: dict[str, Any]
    map: SourceMap
    raw: bytes = b""
    owners: dict[str, Source] = field(default_factory=dict)
    """Merged entries (`/actions/Speak`) that an included library defines, and that library."""
    included: tuple[Source, ...] = ()
    """Every library merged in (`include:`), in the order they were met."""
    warnings: tuple[Diagnostic, ...] = ()
    """Located warnings of loading: the deprecated spellings rewritten (engine/load/migrations.py)."""

    def owner_of(self, pointer: str) -> Source:
        """The file that defines what `pointer` names: a library, or this file."""
        if self.owners:
            entry = "/".join(pointer.split("/")[:3])
            return self.owners.get(entry, self)
        return self

    @property
    def lines(self) -> list[str]:
        return self.text.splitlines()


def load_path(path: str | Path) -> Source:
    """Read and load a file; every failure (missing, directory, binary...) is a LoadError."""
    file = str(path)
    return load_bytes(_read(Path(path), file), file)


def load_text(text: str, file: str = "<string>") -> Source:
    """Load SOP YAML given as text."""
    return load_bytes(text.encode("utf-8", "surrogatepass"), file)


def load_bytes(raw: bytes, file: str) -> Source:
    """Decode, compose and convert; raises LoadError with every problem found."""
    text = _decode(raw, file)
    _flow_depth(text, file)
    root = _compose(text, file)
    data, smap = _Converter(file).run(root)
    return Source(file=file, text=text, data=data, map=smap, raw=raw)


def _fail(file: str, code: str, message: str, hint: str = "", line: int = 1, col: int = 1) -> LoadError:
    diag = Diagnostic(code=code, severity="error", message=message, hint=hint, file=file, line=line, col=col)
    return LoadError([diag])


def _read(path: Path, file: str) -> bytes:
    try:
        if path.is_dir():
            raise _fail(file, "SOP001", "is a directory, not an SOP file",
                        "give the path of a .sop.yaml file inside it")
        _require_regular(path.stat().st_mode, file)   # before opening: a socket cannot be
        with open(path, "rb", opener=_open_nonblocking) as handle:
            info = os.fstat(handle.fileno())
            _require_regular(info.st_mode, file)      # what was opened, if it changed since
            if info.st_size > MAX_FILE_BYTES:
                raise _fail(file, "SOP002", f"file is {info.st_size:,} bytes; the limit is "
                            f"{MAX_FILE_BYTES:,}", "an SOP file is normally a few KiB; split "
                            "prompts into smaller ones")
            return handle.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise _fail(file, "SOP001", "no such file") from None
    except OSError as exc:
        raise _fail(file, "SOP001", f"cannot read file: {exc.strerror or exc}") from None


_SPECIAL_FILES = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
                  (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def _require_regular(mode: int, file: str) -> None:
    """Only regular files are read: a FIFO or a device would block or never end."""
    if stat.S_ISREG(mode):
        return
    kind = next((name for is_kind, name in _SPECIAL_FILES if is_kind(mode)), "not a regular file")
    raise _fail(file, "SOP001", f"is {kind}, not an SOP file",
                "give the path of a regular .sop.yaml file; sopctl does not read pipes or devices")


def _open_nonblocking(path: str, flags: int) -> int:
    """Open without waiting: a FIFO swapped in after the check must not block the open."""
    return os.open(path, flags | getattr(os, "O_NONBLOCK", 0))


def _decode(raw: bytes, file: str) -> str:
    if len(raw) > MAX_FILE_BYTES:
        raise _fail(file, "SOP002", f"file is over the limit of {MAX_FILE_BYTES:,} bytes")
    if b"\x00" in raw:
        raise _fail(file, "SOP003", "file is binary (it contains NUL bytes), not YAML text")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise _fail(file, "SOP003", f"file is not UTF-8 text (bad byte at offset {exc.start})",
                    "save the file as UTF-8", line=line) from None
    if not text.strip() or all(not ln.strip() or ln.lstrip().startswith("#") for ln in text.splitlines()):
        raise _fail(file, "SOP004", "file is empty",
                    "start from `apiVersion: sop/v1`, `name`, `actions` and `roles`")
    return text


_FLOW_SCAN_LIMIT = 4 * MAX_DEPTH


_BRACKETS = re.compile(r"[\[\]{}]")


def _flow_depth(text: str, file: str) -> None:
    """Refuse absurd `[[[[...` nesting before the YAML scanner, which is slow on it, sees it.

    A rough count of unclosed brackets (quotes are not tracked), so the limit is a multiple
    of MAX_DEPTH: only text that can never be a valid SOP is refused here; the exact depth
    check happens on the composed nodes."""
    depth = 0
    for match in _BRACKETS.finditer(text):
        index, char = match.start(), match.group()
        if char in "[{":
            depth += 1
            if depth > _FLOW_SCAN_LIMIT:
                line = text.count("\n", 0, index) + 1
                col = index - text.rfind("\n", 0, index)
                raise _fail(file, "SOP009", f"nesting is deeper than the limit of {MAX_DEPTH}",
                            "flatten the structure", line=line, col=col)
        elif char in "]}" and depth:
            depth -= 1


def _compose(text: str, file: str) -> Any:
    """Compose the single document into ruamel nodes (no object is constructed)."""
    # ruamel is imported when a file is parsed, not with this module (which `sopctl --help` loads)
    from ruamel.yaml.error import YAMLError

    try:
        return _composer(pure=False).compose(text)
    except (YAMLError, ValueError, RecursionError):
        return _compose_pure(text, file)


def _composer(*, pure: bool) -> Any:
    """A fresh safe loader (no state shared between files); only its composer runs, which
    gives every node its position, tag and alias identity. `pure=False` is libyaml where
    ruamel.yaml.clib is installed, the pure-Python parser otherwise."""
    from ruamel.yaml import YAML  # as in _compose: when a file is parsed

    return YAML(typ="safe", pure=pure)


def _compose_pure(text: str, file: str) -> Any:
    """Compose with the pure-Python parser; its failures as located SOP005/SOP009 errors."""
    from ruamel.yaml.error import MarkedYAMLError, YAMLError  # as in _compose

    try:
        return _composer(pure=True).compose(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        problem = " ".join(str(p) for p in (exc.context, exc.problem) if p)
        error = _fail(file, "SOP005", f"not valid YAML: {problem or exc}", _yaml_hint(problem), line=line, col=col)
        start = exc.context_mark
        if start is not None and mark is not None and (start.line, start.column) != (mark.line, mark.column):
            note = Related(message=str(exc.context or "started here"), line=start.line + 1, col=start.column + 1)
            error.diagnostics[0] = replace(error.diagnostics[0], related=(note,))
        raise error from None
    except RecursionError:
        raise _fail(file, "SOP009", f"nesting is deeper than the limit of {MAX_DEPTH}") from None
    except (YAMLError, ValueError) as exc:
        raise _fail(file, "SOP005", f"not valid YAML: {exc}") from None


def _yaml_hint(problem: str) -> str:
    if "single document" in problem:
        return "an SOP file holds one document; remove the extra `---`"
    if "\\t" in problem or "tab" in problem:
        return "indent with spaces; YAML does not allow tabs"
    if "mapping values are not allowed" in problem:
        return "quote a value that contains ': ', or indent the nested mapping"
    if "expected <block end>" in problem:
        return ("this line's indentation matches no key above it: indent it as far as its siblings "
                "(the keys of one mapping line up), with spaces")
    if "expected ',' or ']'" in problem or "expected ',' or '}'" in problem:
        return "a flow list or mapping ([...] or {...}) is not closed, or misses a comma"
    if "could not find expected ':'" in problem:
        return "a key needs ': ' after it; a plain value that spans lines needs quotes or `|`"
    return ""


class _Converter:
    """Checks the node graph and converts it to plain data, recording positions."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.diagnostics: list[Diagnostic] = []
        self.map = SourceMap()
        self.aliases = 0
        self.expanded = 0
        self.active: set[int] = set()
        self.seen: set[int] = set()

    def run(self, root: Any) -> tuple[dict[str, Any], SourceMap]:
        if root is None:
            raise _fail(self.file, "SOP004", "file is empty")
        data: Any = None
        try:
            data = self.convert(root, "", 0)
        except _Abort:
            pass
        except RecursionError:
            self.report(root, "SOP009", f"nesting is deeper than the limit of {MAX_DEPTH}")
        if not self.diagnostics and data is None:
            raise _fail(self.file, "SOP004", "file is empty")
        if not self.diagnostics and not isinstance(data, dict):
            self.report(root, "SOP010", f"the top level must be a mapping, not {_kind(data)}",
                        "start the file with `apiVersion: sop/v1`")
        if self.diagnostics:
            raise LoadError(self.diagnostics)
        return data, self.map

    def report(self, node: Any, code: str, message: str, hint: str = "", pointer: str = "") -> None:
        mark = node.start_mark
        self.diagnostics.append(Diagnostic(code=code, severity="error", message=message, hint=hint,
                                           pointer=pointer, file=self.file,
                                           line=mark.line + 1, col=mark.column + 1))

    def convert(self, node: Any, pointer: str, depth: int) -> Any:
        """Plain data for `node`; aliases and depth are counted on the expanded tree."""
        if depth > MAX_DEPTH:
            self.report(node, "SOP009", f"nesting is deeper than the limit of {MAX_DEPTH}",
                        "flatten the structure", pointer)
            raise _Abort
        try:
            self._count(node, pointer)
        except _Recursive:
            return None
        self.map.values.setdefault(pointer, _pos(node))
        if node.tag not in _CORE_TAGS and node.tag not in _AS_TEXT_TAGS:
            self.report(node, "SOP006", f"tag '{_short_tag(node.tag)}' is not allowed",
                        "SOP files use plain YAML: remove the tag (only core-schema "
                        "str/int/float/bool/null/map/seq tags are accepted)", pointer)
            return None
        self.active.add(id(node))
        try:
            return self._convert_kind(node, pointer, depth)
        finally:
            self.active.discard(id(node))

    def _count(self, node: Any, pointer: str) -> None:
        if id(node) in self.active:
            self.report(node, "SOP008", "recursive alias: a node contains itself",
                        "remove the alias", pointer)
            raise _Recursive
        if id(node) in self.seen:
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                self.report(node, "SOP008", f"more than {MAX_ALIASES} alias uses",
                            "write the values out instead of using anchors and aliases", pointer)
                raise _Abort
        self.seen.add(id(node))
        self.expanded += 1
        if self.expanded > MAX_EXPANDED_NODES:
            self.report(node, "SOP008", f"the document expands to more than {MAX_EXPANDED_NODES:,} "
                        "nodes (an alias bomb?)", "write the values out instead of using aliases",
                        pointer)
            raise _Abort

    def _convert_kind(self, node: Any, pointer: str, depth: int) -> Any:
        from ruamel.yaml.nodes import MappingNode, SequenceNode  # loaded by now: a file is being parsed

        if isinstance(node, MappingNode):
            self.map.containers.add(pointer)
            return self._mapping(node, pointer, depth)
        if isinstance(node, SequenceNode):
            self.map.containers.add(pointer)
            return [self.convert(item, join_pointer(pointer, i), depth + 1)
                    for i, item in enumerate(node.value)]
        if node.style == "|":
            self.map.literals.add(pointer)
        return self._scalar(node, pointer)

    def _mapping(self, node: Any, pointer: str, depth: int) -> dict[str, Any]:
        from ruamel.yaml.nodes import ScalarNode  # as above

        result: dict[str, Any] = {}
        first: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == f"{_CORE}merge":
                self.report(key_node, "SOP011", "merge keys (`<<`) are not supported",
                            "write the keys out", pointer)
                continue
            if not isinstance(key_node, ScalarNode):
                self.report(key_node, "SOP011", "a mapping key must be a plain scalar",
                            "use a string key", pointer)
                continue
            key = self._unicode(key_node, str(key_node.value), pointer)  # the key cannot name itself
            if key is None:
                continue
            child = join_pointer(pointer, key)
            if key in first:
                self._duplicate(key_node, key, first[key], child)
                continue
            first[key] = key_node
            self.map.keys[child] = _pos(key_node)
            result[key] = self.convert(value_node, child, depth + 1)
        return result

    def _duplicate(self, key_node: Any, key: str, earlier: Any, pointer: str) -> None:
        line, col = _pos(earlier)
        mark = key_node.start_mark
        self.diagnostics.append(Diagnostic(
            code="SOP007", severity="error", message=f"duplicate key '{key}'",
            hint="YAML keeps only one of them; merge the two entries or rename one",
            pointer=pointer, file=self.file, line=mark.line + 1, col=mark.column + 1,
            related=(Related(message="first defined here", pointer=pointer, line=line, col=col),)))

    def _scalar(self, node: Any, pointer: str) -> Any:
        tag = node.tag[len(_CORE):] if node.tag.startswith(_CORE) else ""
        text = self._unicode(node, str(node.value), pointer)
        if text is None:
            return None
        try:
            return _SCALARS.get(tag, str)(text)
        except ValueError:
            self.report(node, "SOP006", f"'{text}' is not a valid !!{tag}",
                        f"write a plain {tag} or quote the value", pointer)
            return None

    def _unicode(self, node: Any, text: str, pointer: str) -> str | None:
        """`text` with escaped surrogate pairs (`"\\ud83d\\ude00"`, JSON's way to write an
        emoji) joined into their character; None, reported, if a lone surrogate is left
        (`"\\ud800"`): it is no character, so no prompt, journal or file could hold it."""
        if not _SURROGATE.search(text):
            return text
        text = _SURROGATE_PAIR.sub(_join_pair, text)
        found = _SURROGATE.search(text)
        if found is None:
            return text
        self.report(node, "SOP003", f"text holds a lone surrogate (\\u{ord(found.group()):04x}), "
                    "which is not a Unicode character and cannot be written as UTF-8",
                    "remove the escape, or write the character itself (or a \\U0001xxxx escape)",
                    pointer)
        return None


_SURROGATE = re.compile("[\ud800-\udfff]")


_SURROGATE_PAIR = re.compile("([\ud800-\udbff])([\udc00-\udfff])")


def _join_pair(match: re.Match[str]) -> str:
    high, low = (ord(c) for c in match.groups())
    return chr(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00))


class _Abort(Exception):
    """Stops converting after a limit is hit (the diagnostic is already recorded)."""


class _Recursive(Exception):
    """A node reached again through an alias while it is being converted."""


def _short_tag(tag: str) -> str:
    return "!!" + tag[len(_CORE):] if tag.startswith(_CORE) else tag


def _pos(node: Any) -> tuple[int, int]:
    return (node.start_mark.line + 1, node.start_mark.column + 1)


def _kind(value: Any) -> str:
    return {list: "a list", str: "a string", type(None): "null"}.get(type(value), type(value).__name__)


def _to_int(text: str) -> int:
    clean = text.replace("_", "")
    sign = -1 if clean.startswith("-") else 1
    body = clean.lstrip("+-")
    for prefix, base in (("0x", 16), ("0o", 8), ("0b", 2)):
        if body.lower().startswith(prefix):
            return sign * int(body[2:], base)
    if body.startswith("0") and len(body) > 1 and body.isdigit():
        return sign * int(body, 8)  # YAML 1.1 octal, as ruamel resolves it
    return sign * int(body, 10)


def _to_float(text: str) -> float:
    lowered = text.lower().replace("_", "")
    if lowered.lstrip("+-") in (".inf", "inf"):
        return -math.inf if lowered.startswith("-") else math.inf
    if lowered in (".nan", "nan"):
        return math.nan
    return float(lowered)


def _to_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "yes", "on"):
        return True
    if lowered in ("false", "no", "off"):
        return False
    raise ValueError(text)


def _to_null(text: str) -> None:
    if text not in ("", "~", "null", "Null", "NULL"):
        raise ValueError(text)


_SCALARS: dict[str, Callable[[str], Any]] = {"int": _to_int, "float": _to_float, "bool": _to_bool, "null": _to_null, "str": str}


def iter_pointers(data: Any, pointer: str = "") -> Iterator[str]:
    """Every pointer in plain data (used by tests to check the source map is complete)."""
    yield pointer
    if isinstance(data, dict):
        for key, value in data.items():
            yield from iter_pointers(value, join_pointer(pointer, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from iter_pointers(value, join_pointer(pointer, index))
