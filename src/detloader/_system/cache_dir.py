"""The record of the index caches and image stores detloader writes: one JSON line per file
written (``path``, ``kind``, ``root``, ``created``) appended to ``made.jsonl`` in the cache
folder, read by :mod:`detloader.dataset.caches` (``detloader cache list|clear``). A leaf module:
the writers of caches and stores import it without importing what reads it."""

from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path

import platformdirs

#: The record's file name in :func:`cache_root`.
RECORD_NAME = "made.jsonl"


#: The environment variable that moves every cache of the project (index caches, stores, tuning).
CACHE_DIR_ENV = "DETLOADER_CACHE_DIR"


def user_cache_dir() -> Path:
    """The user cache folder of detloader (``$XDG_CACHE_HOME/detloader``, ``~/.cache/detloader``
    on Linux; each system's own place elsewhere)."""
    return Path(platformdirs.user_cache_dir("detloader", appauthor=False))


def cache_root() -> Path:
    """The cache folder: ``$DETLOADER_CACHE_DIR``, else :func:`user_cache_dir` (not created here)."""
    env = os.environ.get(CACHE_DIR_ENV)
    return Path(env) if env else user_cache_dir()


def record_file() -> Path:
    return cache_root() / RECORD_NAME


def remember(path: str | os.PathLike[str], kind: str, root: str | os.PathLike[str]) -> None:
    """Append ``path`` (an index cache or store just written for the dataset at ``root``; ``kind``
    ``"index"``, ``"store disk"`` or ``"store ram"``) to the record. Never raises: a record that
    cannot be written only hides a cache beside its dataset from ``cache list``."""
    line = json.dumps({
        "path": str(Path(path).absolute()), "kind": kind, "root": str(Path(root).absolute()),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }) + "\n"  # ASCII escapes: a name that is not UTF-8 (surrogate escapes) reads back exactly
    try:
        folder = cache_root()
        folder.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        fd = os.open(folder / RECORD_NAME, flags, 0o644)
        try:
            os.write(fd, line.encode("utf-8"))  # one write of one short line: lines never interleave
        finally:
            os.close(fd)
    except OSError:
        pass
