"""Every index cache (``.dlindex``) and image store (``.dlstore``) detloader made on this machine
for this user: listed and removed (``detloader cache list|clear``; docs/loader.md, "The life of a
store").

They are found without a central database: in the cache folder (``$DETLOADER_CACHE_DIR``) and
the user cache folder (where a dataset's caches go when its folder is not writable), in shared
memory (``"ram"`` stores, by their ``.dlstore`` suffix) and through the record
:func:`~detloader._system.cache_dir.remember` appends to whenever an index cache or a store is
written (``made.jsonl`` in the cache folder, one JSON line each: ``path``, ``kind``, ``root``,
``created``), which is how caches beside a dataset (``DATASET/.detloader-cache/``) are found
again. :func:`find_made` drops the lines of files that are gone. Given a dataset, every folder
its caches may be in is searched too (:func:`detloader.annotations.cache.cache_dirs_of`), so
that what it holds is found recorded or not (a record of another cache folder, a file written
before the record existed), with the leftovers of writes that died: a lock, stamps or temporary
file without its cache.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from detloader._system.cache_dir import cache_root, record_file, user_cache_dir
from detloader._system.locks import held_elsewhere, locked, read_elsewhere
from detloader.annotations.cache import CACHE_SUBDIR, cache_dirs_of
from detloader.annotations.refresh import STAMPS_SUFFIX
from detloader.dataset import store_files
from detloader.errors import DetloaderValueError

Kind = Literal["index", "store disk", "store ram", "index leftover", "store leftover"]
KIND_CHOICES: tuple[str, ...] = ("index", "store", "all")
#: Lines of the record read at most (a record that grew past it is compacted by the next list).
MAX_RECORD_LINES = 100_000


@dataclass(frozen=True)
class MadeFile:
    """One file detloader made: ``path``, ``kind`` (``"index"``, ``"store disk"``, ``"store
    ram"``, or a leftover, :func:`_owner`: ``"index leftover"``, ``"store leftover"``),
    ``bytes``, ``root`` (the dataset's folder; ``""`` when unknown), ``last_use`` (the later of
    its access and modification times, ISO 8601) and ``in_use`` (a ``"ram"`` store that
    another process maps, or a file whose build lock is held)."""

    path: str
    kind: str
    bytes: int
    root: str
    last_use: str
    in_use: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _read_record() -> dict[str, dict[str, Any]]:
    """The record's entries by path (the last line of a path wins); bad lines are passed over."""
    entries: dict[str, dict[str, Any]] = {}
    try:
        with open(record_file(), encoding="utf-8", errors="replace") as fh:
            for n, line in enumerate(fh):
                if n >= MAX_RECORD_LINES:
                    break
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if isinstance(entry, dict) and isinstance(entry.get("path"), str):
                    entries[entry["path"]] = entry
    except OSError:
        pass
    return entries


def _write_record(entries: Iterable[dict[str, Any]]) -> None:
    """Replace the record with ``entries`` (atomically); left as it is when it cannot be written."""
    from detloader._system.files import atomic_write

    with contextlib.suppress(OSError):
        with atomic_write(record_file(), "w") as fh:
            fh.write("".join(json.dumps(e) + "\n" for e in entries))


def _index_root(path: Path) -> str:
    """The dataset root an index cache's header names; ``""`` when it cannot be read."""
    from detloader.annotations.cache import _read_header

    try:
        return str(_read_header(path)[0].get("root", ""))
    except (OSError, ValueError):
        return ""


def _owner(path: Path) -> Path | None:
    """The index cache or store that ``path`` belongs to when it is its lock, its stamps
    (``NAME.dlindex.stamps``) or a temporary file of its write (``atomic_write``'s
    ``.NAME.XXXXXXXX.tmp``); None for anything else."""
    name = path.name
    if name.startswith(".") and name.endswith(".tmp"):
        name = name[1 : -len(".tmp")].rpartition(".")[0]
    name = name.removesuffix(".lock").removesuffix(STAMPS_SUFFIX)
    return path.with_name(name) if name != path.name and name.endswith((".dlindex", store_files.SUFFIX)) else None


def _kind_of(path: Path) -> Kind | None:
    if path.name.endswith(".dlindex"):
        return "index"
    if path.name.endswith(store_files.SUFFIX):
        return "store ram" if path.parent == store_files.store_dir("ram", Path(".")) else "store disk"
    owner = _owner(path)
    if owner is None or (os.path.lexists(owner) and not path.name.endswith(".tmp")):
        return None  # not detloader's, or goes with its cache file
    return "index leftover" if owner.name.endswith(".dlindex") else "store leftover"


def _lock_of(path: Path, kind: str) -> Path:
    """The build lock that guards ``path``: its own, or its owner's (:func:`_owner`)."""
    return Path(f"{_owner(path) if kind.endswith('leftover') else path}.lock")


def _in_use(path: Path, kind: str) -> bool:
    """Whether another process holds ``path``: its build lock (:func:`_lock_of`), or (a store or
    an index cache) a reader's shared ``flock``, held while it maps the file
    (:mod:`detloader.dataset.store_files`, :func:`detloader.annotations.cache.load_index_file`)."""
    if kind in ("store disk", "store ram", "index") and read_elsewhere(path):
        return True
    return held_elsewhere(_lock_of(path, kind))


def _files_in(folder: Path) -> list[Path]:
    """The index caches, stores and leftovers in the cache folder ``folder`` (none when absent)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return [folder / n for n in names if n.endswith((".dlindex", store_files.SUFFIX)) or _owner(folder / n)]


def _candidates(dataset: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """Paths of every cache, store and leftover that may be detloader's, with the root where
    known: the recorded ones and those in the cache folders of every dataset (``dataset``'s
    when given, :func:`detloader.annotations.cache.cache_dirs_of`), in the folders of recorded
    caches beside their dataset, and this user's ``"ram"`` stores."""
    found = {path: str(entry.get("root", "")) for path, entry in _read_record().items()}
    folders = {Path(path).parent for path in found if Path(path).parent.name == CACHE_SUBDIR}
    for top in {cache_root(), user_cache_dir()}:
        with contextlib.suppress(OSError):
            folders |= {entry for entry in top.iterdir() if entry.is_dir() and not entry.is_symlink()}
    if dataset is not None:
        target = Path(dataset).absolute()
        for root in {target, target.parent} if target.is_file() else {target}:
            folders.update(cache_dirs_of(root))
    for folder in folders:
        for path in _files_in(folder):
            found.setdefault(str(path.absolute()), "")
    ram, uid = store_files.store_dir("ram", Path(".")), os.getuid()
    with contextlib.suppress(OSError):
        for path in ram.glob(f"*{store_files.SUFFIX}"):
            with contextlib.suppress(OSError):
                if path.lstat().st_uid == uid:
                    found.setdefault(str(path.absolute()), "")
    return found


def find_made(kind: str = "all", dataset: str | os.PathLike[str] | None = None) -> list[MadeFile]:
    """Every index cache, store and leftover of this user that still exists (``kind``:
    ``"index"``, ``"store"`` or ``"all"``; of ``dataset`` only when given, :func:`belongs_to`,
    whether the record knows them or not), by path; the record loses the lines of files that
    are gone.

    Raises:
        DetloaderValueError: ``kind`` is not one of :data:`KIND_CHOICES`.
    """
    if kind not in KIND_CHOICES:
        raise DetloaderValueError(f"kind={kind!r} is not one of {', '.join(KIND_CHOICES)}")
    record = _read_record()
    made, alive = [], []
    for name, root in sorted(_candidates(dataset).items()):
        path = Path(name)
        what = _kind_of(path)
        try:
            st = path.lstat()
        except OSError:
            continue
        if what is None or not path.is_file() or path.is_symlink():
            continue
        if name in record:
            alive.append(record[name])
        if what == "index":
            root = _index_root(path) or root
        elif not root and what != "store ram":  # beside the index caches of its dataset, else in its folder
            root = next((r for r in map(_index_root, sorted(path.parent.glob("*.dlindex"))) if r), "")
            root = root or (str(path.parent.parent) if path.parent.name == CACHE_SUBDIR else "")
        if kind != "all" and not what.startswith(kind):
            continue
        used = _dt.datetime.fromtimestamp(max(st.st_atime, st.st_mtime), _dt.timezone.utc)
        found = MadeFile(name, what, st.st_size, root, used.isoformat(timespec="seconds"), _in_use(path, what))
        if dataset is None or belongs_to(found, dataset):
            made.append(found)
    if len(alive) != len(record):
        _write_record(alive)
    return made


def belongs_to(made: MadeFile, dataset: str | os.PathLike[str]) -> bool:
    """Whether ``made`` is of the dataset at ``dataset`` (its root, a folder above it, or the
    annotation file whose folder it is), lies in one of ``dataset``'s cache folders
    (:func:`detloader.annotations.cache.cache_dirs_of`), or is a ``"ram"`` store named after it."""
    target = Path(dataset).absolute()
    folders = {target, target.resolve()}
    if target.is_file():
        folders |= {target.parent, target.resolve().parent}
    if made.kind == "store ram" and any(
        Path(made.path).name.startswith(f"{f.resolve().name}-{store_files.root_tag(f)}-") for f in folders
    ):
        return True
    if made.root:
        root = Path(made.root)
        if any(root == f or f in root.parents for f in folders):
            return True
    return any(place in Path(made.path).parents for f in folders for place in cache_dirs_of(f))


def remove(made: MadeFile) -> bool:
    """Remove ``made`` (an index cache: with its stamps) and its lock file, unless another
    process holds it (then False): a store as :func:`detloader.dataset.store_files.remove_unused`
    does, anything else while holding its build lock (:func:`_lock_of`), so that no build
    starts meanwhile. An emptied ``.detloader-cache`` or cache-folder entry folder goes too."""
    path = Path(made.path)
    if made.kind in ("store disk", "store ram"):
        if not store_files.remove_unused(path):
            return False
    else:
        with locked(_lock_of(path, made.kind), wait=False, remove=True) as mine:
            if not mine or (made.kind == "index" and read_elsewhere(path)):
                return False
            path.unlink(missing_ok=True)
            if made.kind == "index":
                Path(f"{path}{STAMPS_SUFFIX}").unlink(missing_ok=True)  # the files' stamps kept for a refresh
    folder = path.parent
    if folder.name == CACHE_SUBDIR or folder.parent in (cache_root(), user_cache_dir()):
        with contextlib.suppress(OSError):
            folder.rmdir()  # only when empty
    return True


def clear(dataset: str | os.PathLike[str] | None = None, kind: str = "all",
          dry_run: bool = False) -> tuple[list[MadeFile], list[MadeFile]]:
    """Remove the caches, stores and leftovers of ``dataset`` (all of them when None) of ``kind``
    (:func:`find_made`); ``(removed, kept in use)``. With ``dry_run`` nothing is removed:
    ``removed`` is what would be (a file in use is still named as kept)."""
    removed, busy = [], []
    for made in find_made(kind, dataset):
        if made.in_use or (not dry_run and not remove(made)):
            busy.append(made)
        else:
            removed.append(made)
    if not dry_run and removed:
        gone = {m.path for m in removed}
        _write_record(e for p, e in _read_record().items() if p not in gone)
    return removed, busy
