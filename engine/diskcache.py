"""The on-disk cache of what a run would otherwise rebuild in every new process: compiled SOP
files, the sandbox's compiled templates and output schemas known to be valid.

Entries live in `$SOPCTL_CACHE_DIR`, else `$XDG_CACHE_HOME/sopctl`, else `~/.cache/sopctl`
(one folder per kind). `SOPCTL_NO_CACHE=1` turns the cache off: every process then compiles
everything itself, as it would the first time. Deleting the folder clears it.

An entry is never trusted blindly. The folder is created 0700 and used only while it is
this user's and nobody else can write to it (an entry is pickled or marshalled Python: a
folder others can write to would let them run code in sopctl). Each entry starts with a magic
line and the sha256 of its key and payload: a truncated, corrupt or foreign entry (another
key, another format) reads as a miss, and the caller rebuilds and rewrites it. Keys are
hashes of everything the entry depends on: its input, the format below, Python's version,
and the engine's own code (each `engine` module's size and time stamp), so that upgrading
or editing sopctl never reads an entry written by other code. Writes go to a temporary file
renamed into place: a crash or two processes writing at once never leave half an entry.
Every failure of the cache (a full disk, a read-only home) is a miss, never an error.

The cache is bounded: a folder that holds more than MAX_ENTRIES entries after a write drops
its oldest-written ones down to KEEP_ENTRIES (a batch of generated SOPs, or years of edits,
must not fill the disk). Writes happen only on misses, so the count is paid rarely.
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

__all__ = ["FORMAT", "cache_dir", "code_fingerprint", "entry_key", "module_stamp", "package_stamp", "read", "write"]


FORMAT = b"sopctl-cache 1\n"
"""The magic line of every entry; a new layout of entries gets a new number."""

_DIGEST = 32


MAX_ENTRIES = 1000
"""Entries one kind's folder may hold; past it the oldest are removed down to KEEP_ENTRIES."""


KEEP_ENTRIES = 800


def cache_dir() -> Path | None:
    """The cache's folder, created if need be; None when the cache is off or unsafe to use.
    Looked up for every template: the environment is read each time (a test or a caller may
    change it), the folder checked once per setting."""
    env = os.environ
    return _usable(env.get("SOPCTL_NO_CACHE", ""), env.get("SOPCTL_CACHE_DIR", ""),
                   env.get("XDG_CACHE_HOME", ""), env.get("HOME", ""))


@lru_cache(maxsize=8)
def _usable(off: str, chosen: str, xdg: str, _home: str) -> Path | None:
    """The folder these settings name if it is (or could be made) a private folder of this
    user, else None."""
    if off not in ("", "0"):
        return None
    if chosen:
        folder = Path(chosen)
    else:
        base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
        folder = base / "sopctl"
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        return folder if _private(folder) else None
    except OSError:
        return None


def _private(path: Path) -> bool:
    """Owned by this user and writable by nobody else (not a symlink to someone else's)."""
    return _private_info(os.stat(path))


def _private_info(info: os.stat_result) -> bool:
    mine = not hasattr(os, "getuid") or info.st_uid == os.getuid()
    return mine and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """Python's version and every engine module's (name, size, mtime): a different sopctl
    (upgraded, edited in a checkout) never reads what another one wrote."""
    root = Path(__file__).resolve().parent   # engine/ (this module is at its top): not the checkout or site-packages
    digest = hashlib.sha256(sys.version.encode())
    for folder, _dirs, files in sorted(os.walk(root)):
        for name in sorted(f for f in files if f.endswith((".py", ".json"))):
            info = os.stat(os.path.join(folder, name))
            digest.update(f"{folder[len(str(root)):]}/{name}:{info.st_size}:{info.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def module_stamp(*modules: object) -> str:
    """Where each module's file is, its size and time stamp: a library upgraded or patched in
    place gives other keys (cheaper than asking its package metadata for a version)."""
    return _file_stamps(getattr(module, "__file__", None) or "" for module in modules)


def package_stamp(*names: str) -> str:
    """`module_stamp` of installed packages by name, without importing them (networkx takes
    a tenth of a second to import; a cache hit must not pay that to learn its version)."""
    from importlib.util import find_spec  # only for keys that name a package

    def origin(name: str) -> str:
        try:
            spec = find_spec(name)
        except (ImportError, ValueError):
            return name
        return (spec.origin if spec is not None else None) or name
    return _file_stamps(origin(name) for name in names)


def _file_stamps(files: Iterable[str]) -> str:
    stamps = []
    for file in files:
        try:
            info = os.stat(file)
            stamps.append(f"{file}:{info.st_size}:{info.st_mtime_ns}")
        except OSError:
            stamps.append(file)
    return "\n".join(stamps)


def entry_key(*parts: str | bytes) -> str:
    """The key of an entry: the hash of what it depends on and of the engine's code."""
    digest = hashlib.sha256(FORMAT + code_fingerprint().encode())
    for part in parts:
        data = part if isinstance(part, bytes) else part.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()


def _file(kind: str, key: str) -> Path | None:
    folder = cache_dir()
    return None if folder is None else folder / kind / key


def read(kind: str, key: str) -> bytes | None:
    """The payload stored under `key`, or None (missing, corrupt, foreign, cache off)."""
    path = _file(kind, key)
    if path is None:
        return None
    try:
        # No symlink followed, no FIFO waited on; what was opened must be this user's own
        # plain file, writable by nobody else.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
        with open(fd, "rb") as handle:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or not _private_info(info):
                return None
            blob = handle.read()
    except OSError:
        return None
    head = len(FORMAT) + _DIGEST
    if not blob.startswith(FORMAT) or len(blob) < head:
        return None
    payload = blob[head:]
    if hashlib.sha256(key.encode() + payload).digest() != blob[len(FORMAT):head]:
        return None
    return payload


def write(kind: str, key: str, payload: bytes) -> None:
    """Store `payload` under `key` (atomically); a failure leaves the cache as it was."""
    path = _file(kind, key)
    if path is None:
        return
    try:
        import tempfile  # only when writing: `sopctl validate` of a cached file never needs it

        path.parent.mkdir(mode=0o700, exist_ok=True)
        handle, temp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(FORMAT + hashlib.sha256(key.encode() + payload).digest() + payload)
            os.replace(temp, path)
        except BaseException:
            os.unlink(temp)
            raise
        _trim(path.parent)
    except OSError:
        pass


def _trim(folder: Path) -> None:
    """Past MAX_ENTRIES entries, remove the oldest-written down to KEEP_ENTRIES (another
    process trimming at the same time only makes some removals fail, which is fine)."""
    with os.scandir(folder) as listing:
        entries = [e for e in listing if not e.name.startswith(".tmp-")]
    if len(entries) <= MAX_ENTRIES:
        return
    entries.sort(key=lambda e: e.stat(follow_symlinks=False).st_mtime_ns)
    for entry in entries[:len(entries) - KEEP_ENTRIES]:
        try:
            os.unlink(entry.path)
        except OSError:
            pass
