"""Splits: found where the layout keeps them, or made once (seeded, stratified), recorded.

:func:`settle_splits` runs after every read (``splits.json``, else the reader's split files,
else split folders); :func:`make_splits` writes them once, cut by the pure rule of
:mod:`detloader.annotations.stratify` that ``AnnotationIndex.random_split`` cuts with too. The order, the
problems and the files written: docs/index.md ("Splits: found or made").
"""

from __future__ import annotations

import itertools
import json
import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from detloader._system.files import find_child_dir, read_capped
from detloader.annotations.problems import Problem, ProblemReport, problems_of
from detloader.annotations.stratify import class_groups, stratified_split
from detloader.errors import DetloaderValueError, NotRegularFileError, SplitsExistError

if TYPE_CHECKING:
    from detloader.annotations.index import AnnotationIndex

SPLITS_JSON = "splits.json"
ROLES = ("train", "val", "test")
_ROLE = re.compile(r"^(?:(train|training)|(val|valid|validation)|(test|testing))\d*$", re.IGNORECASE)
#: How many folders down a split folder may lie: ``train/``, ``images/train/``, ``train_zip/train/``.
SPLIT_DEPTH = 2


def split_role(name: str) -> str | None:
    """``train``, ``val`` or ``test`` for a split, folder or file name such as ``Train``,
    ``training``, ``valid``, ``validation``, ``val2017``, ``testing``; None for any other
    (``trainval``, which overlaps train and val by design in VOC)."""
    m = _ROLE.match(name)
    return None if m is None else ROLES[m.lastindex - 1]  # type: ignore[operator]


# -- found: problems, splits.json, folders ----------------------------------------------------
def report(index: AnnotationIndex, kind: str, file: str, found: list[tuple[str, str]], action: str) -> None:
    """Add ``found`` (element, message) as repaired problems of ``kind`` in ``file``
    (every one: :func:`~detloader.annotations.problems.problems_of`)."""
    for problem in problems_of(kind, [(file, element, message) for element, message in found], action):
        index.problems.add(problem)


def match_entries(
    index: AnnotationIndex, file: str, entries: Iterable[tuple[str, str]], position: Mapping[str, int]
) -> np.ndarray:
    """Image ids (sorted int64) of ``entries`` (element, name) looked up in ``position``; a
    name without an image is a ``split_mismatch``, a repeated one a ``split_duplicate``."""
    ids: list[int] = []
    seen: dict[str, str] = {}
    missing: list[tuple[str, str]] = []
    repeats: list[tuple[str, str]] = []
    for element, name in entries:
        if name in seen:
            repeats.append((element, f"{name!r} again (first at {seen[name]})"))
            continue
        seen[name] = element
        pos = position.get(name)
        if pos is None:
            missing.append((element, f"{name!r}: no such image in the index"))
        else:
            ids.append(pos)
    report(index, "split_mismatch", file, missing, "left out of the split")
    report(index, "split_duplicate", file, repeats, "counted once")
    return np.unique(np.asarray(ids, dtype=np.int64))


def files_as_splits(index: AnnotationIndex, names: Mapping[str, str]) -> dict[str, np.ndarray]:
    """Splits of a reader whose files are the splits: an image belongs to ``names[its
    annotation file]``; each file is recorded as its split's source."""
    members: dict[str, list[int]] = {name: [] for name in names.values()}
    for i in range(len(index)):
        name = names.get(index.annotation_path(i).split("#", 1)[0])
        if name is not None:
            members[name].append(i)
    index.meta.setdefault("split_sources", {}).update({name: rel for rel, name in names.items()})
    return {name: np.asarray(ids, dtype=np.int64) for name, ids in members.items()}


def _made_text(made: Any) -> str:
    """``splits.json (made by detloader 0.1.0, seed 0, val 0.2, test 0.1, stratified by class)``."""
    if not isinstance(made, dict) or not made:
        return SPLITS_JSON
    return f"{SPLITS_JSON} (made " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in made.items()) + ")"


def _json_splits(index: AnnotationIndex) -> tuple[dict[str, np.ndarray], dict[str, str]] | None:
    """Splits and sources of ``splits.json`` at the root; None when there is none, or (an
    error problem) when it is not ``{"splits": {name: [image path, ...]}}`` or not a regular
    file (a FIFO is never opened: ``not_a_regular_file``)."""
    path = index.root / SPLITS_JSON
    if not os.path.exists(path):
        return None
    try:
        data = json.loads(read_capped(path, None).decode("utf-8"))
    except NotRegularFileError as err:
        message = f"{err}; remove it (detloader split writes a new one)"
        index.problems.add(Problem("not_a_regular_file", SPLITS_JSON, "", message, "splits.json ignored"))
        return None
    except (OSError, UnicodeDecodeError, ValueError) as err:
        index.problems.add(Problem("unparseable", SPLITS_JSON, "", f"not JSON: {err}", "splits.json ignored"))
        return None
    splits = data.get("splits") if isinstance(data, dict) else None
    if not isinstance(splits, dict) or not all(
        isinstance(v, list) and all(isinstance(p, str) for p in v) for v in splits.values()
    ):
        shown = json.dumps(splits)[:80] if isinstance(data, dict) else type(data).__name__
        message = f"{shown} is not {{split name: [image path, ...]}}"
        index.problems.add(Problem("bad_value", SPLITS_JSON, "splits", message, "splits.json ignored"))
        return None
    position = {os.path.normpath(p): i for i, p in reversed(list(enumerate(index.image_paths())))}
    out = {
        str(name): match_entries(
            index, SPLITS_JSON, ((f"splits/{name}[{k}]", os.path.normpath(p)) for k, p in enumerate(paths)), position
        )
        for name, paths in splits.items()
    }
    return out, dict.fromkeys(out, _made_text(data.get("made")))


def _split_folders(path: str) -> list[tuple[str, str]]:
    """(role, folder) of each split-named folder among the first :data:`SPLIT_DEPTH` folders of
    ``path`` (relative to the root), shallowest first: ``train/a.jpg``, ``images/train/a.jpg``
    and ``train_zip/train/a.jpg`` lie in train; ``a/b/test/c.jpg`` in none."""
    folders = path.replace(os.sep, "/").split("/")[:-1]
    out = []
    for k, name in enumerate(folders[:SPLIT_DEPTH]):
        role = split_role(name)
        if role is not None:
            out.append((role, "/".join(folders[: k + 1]) + "/"))
    return out


def _may_name_split_folders(index: AnnotationIndex) -> bool:
    """Whether an image or annotation path may hold a split folder: False when the packed
    paths are ASCII and hold none of ``train``, ``val``, ``test`` in any case (a split name
    holds one; ``re.IGNORECASE`` also matches a few letters beyond ASCII, so any non-ASCII path
    is looked at). One search of the bytes instead of a split per path."""
    arrays = index.arrays()
    for name in ("image_paths", "annotation_paths"):
        blob = arrays[f"{name}_blob"]
        if not blob.size:
            continue
        text = blob.tobytes().lower()
        if int(blob.max()) >= 0x80 or b"train" in text or b"val" in text or b"test" in text:
            return True
    return False


def _folder_splits(index: AnnotationIndex) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Splits from ``train/ val/ test/`` folders one or two levels below the root (of the image
    path, else the annotation path); images outside them are in no split (one problem counts
    them). An image below two split folders of different roles (``train/test/a.jpg``) is in
    the shallowest one's split only (one ``split_nested`` problem counts them)."""
    members: dict[str, list[int]] = {}
    folders: dict[str, set[str]] = {}
    outside: list[int] = []
    nested: list[tuple[int, list[tuple[str, str]]]] = []
    by_folder: dict[str, list[tuple[str, str]]] = {}  # images share folders: one look per folder

    def hits_of(path: str) -> list[tuple[str, str]]:
        folder = path.replace(os.sep, "/").rpartition("/")[0]
        hits = by_folder.get(folder)
        if hits is None:
            hits = by_folder[folder] = _split_folders(path)
        return hits

    if not _may_name_split_folders(index):
        return {}, {}
    image_paths, annotation_paths = index.image_paths(), index.annotation_paths()
    unique = {p.replace(os.sep, "/").rpartition("/")[0] + "/" for p in image_paths}
    unique.update(p.split("#", 1)[0].replace(os.sep, "/").rpartition("/")[0] + "/" for p in annotation_paths)
    if not any(_split_folders(folder) for folder in unique):  # the usual case: no split folder at all
        return {}, {}
    for i, image_path in enumerate(image_paths):
        hits = hits_of(image_path) or hits_of(annotation_paths[i].split("#", 1)[0])
        if not hits:
            outside.append(i)
            continue
        role, folder = hits[0]
        members.setdefault(role, []).append(i)
        folders.setdefault(role, set()).add(folder)
        if any(other != role for other, _ in hits[1:]):
            nested.append((i, hits))
    if members and outside:
        shown = ", ".join(sorted(set().union(*folders.values())))
        message = f"{len(outside)} images lie outside the split folders ({shown})"
        first = index.annotation_path(outside[0]).split("#", 1)[0]
        index.problems.add(Problem("split_unassigned", first, "", message, "in no split", "repaired"))
    if nested:
        i, hits = nested[0]
        shown = " and ".join(folder for _, folder in hits)
        message = f"{len(nested)} images lie below two split folders, as {index.relative_image_path(i)!r} below {shown}"
        first = index.annotation_path(i).split("#", 1)[0]
        index.problems.add(Problem("split_nested", first, "", message, "in the shallowest one's split", "repaired"))
    sources = {role: "folder " + ", ".join(sorted(found)) for role, found in folders.items()}
    return {role: np.asarray(ids, dtype=np.int64) for role, ids in members.items()}, sources


#: Which of two splits keeps an image both list: a test image is never trained on, and a val
#: image that is also a training image leaves val (training cuts a val from train when none is left).
KEEPS_FIRST = ("test", "train", "val")


def _settle_overlap(index: AnnotationIndex) -> None:
    """Make the train / val / test splits disjoint: an image two of them list stays in the one
    earlier in :data:`KEEPS_FIRST` and leaves the other (splits of one role, as ``val`` and
    ``valid``, and names of no role, as ``trainval``, are not compared). Each pair that shares
    images is one ``split_overlap`` problem naming both splits, their sources and the count;
    the source of the split that lost them says so too (``data.yaml: val; 19 images also in
    train removed``). A split left empty stays, empty."""
    sources = index.meta["split_sources"]
    found = dict(sources)
    named = sorted((n for n in index.splits if split_role(n) is not None), key=lambda n: (_keeps(n), n))
    for a, b in itertools.combinations(named, 2):
        ids_b = index.splits[b]
        shared = np.intersect1d(index.splits[a], ids_b)
        if split_role(a) == split_role(b) or not len(shared):
            continue
        index.splits[b] = np.setdiff1d(ids_b, shared)
        every = len(shared) == len(ids_b)
        first = index.relative_image_path(int(shared[0]))
        message = (
            f"{'all' if every else f'{len(shared)} of'} {len(ids_b)} images of {b} ({found[b]}) "
            f"are also in {a} ({found[a]}), as {first!r}"
        )
        action = f"kept in {a}, removed from {b}" + (f"; {b} is left empty" if every else "")
        file = found[b].split(" (", 1)[0].split(": ", 1)[0]
        index.problems.add(Problem("split_overlap", file, "", message, action, "repaired"))
        sources[b] = f"{sources[b]}; {len(shared)} images also in {a} removed"


def _keeps(name: str) -> int:
    """Rank of a train / val / test split name in :data:`KEEPS_FIRST`."""
    return KEEPS_FIRST.index(split_role(name))  # type: ignore[arg-type]


def settle_splits(index: AnnotationIndex, found: Mapping[str, np.ndarray], default_source: str) -> None:
    """Give a freshly built ``index`` its splits: ``splits.json`` at the root when there is
    one, else ``found`` (the reader's; their sources as the reader recorded them in
    ``index.meta["split_sources"]``, else ``default_source``), else split folders. Makes
    them disjoint (:func:`_settle_overlap`) and records ``index.meta["split_sources"]``
    ({name: where from})."""
    recorded = index.meta.pop("split_sources", {})
    splits, sources = _json_splits(index) or (
        (dict(found), {name: recorded.get(name, default_source) for name in found}) if found else _folder_splits(index)
    )
    index.splits = {name: np.asarray(ids, dtype=np.int64) for name, ids in splits.items()}
    index.meta["split_sources"] = sources
    _settle_overlap(index)


# -- made ------------------------------------------------------------------------------------
def make_splits(
    index: AnnotationIndex, val: float = 0.2, test: float = 0.0, seed: int = 0, force: bool = False
) -> AnnotationIndex:
    """Split ``index`` into train / val (/ test) once, write them where the layout keeps splits
    (docs/index.md, "Making them once") and return the index with them. A dataset with train /
    val / test splits raises :class:`SplitsExistError` unless ``force``; then a test split
    it has is kept as it is and train / val are cut from the images outside it (``val`` a
    fraction of those), unless ``test > 0`` asks for a new test split, cut from every image.
    Old train / val / test files of ``ImageSets/Main`` not written again are removed.
    """
    for name, value in (("val", val), ("test", test)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise DetloaderValueError(f"make_splits: {name}={value!r} is not a fraction in [0, 1)")
    if not 0 < val + test < 1:
        raise DetloaderValueError(f"make_splits: val={val} + test={test} must be > 0 and < 1 (train gets the rest)")
    sources = index.meta.get("split_sources", {})
    existing = sorted(n for n in index.splits if split_role(n) is not None)
    if existing and not force:
        listed = ", ".join(f"{n} ({sources.get(n, 'found')})" for n in existing)
        raise SplitsExistError(
            f"{index.root}: the dataset has splits already: {listed}; "
            "force=True (detloader split --force) replaces them (and keeps a test split unless test > 0)"
        )
    kept = {} if test else {n: index.splits[n] for n in existing if split_role(n) == "test" and len(index.splits[n])}
    pool = np.setdiff1d(np.arange(len(index)), np.concatenate([np.zeros(0, np.int64), *kept.values()]))
    groups = class_groups(index.labels, index.object_image, index.image_labels, len(index.classes))
    fractions = {k: f for k, f in (("train", 1 - val - test), ("val", val), ("test", test)) if f > 0}
    cut = stratified_split(groups[pool], fractions, np.random.default_rng(seed))
    parts = {**{k: pool[ids] for k, ids in cut.items()}, **kept}
    from detloader._system import VERSION

    made: dict[str, Any] = {"by": f"detloader {VERSION}", "seed": int(seed), "val": val, "test": test}
    if kept:
        made["test"] = "kept from " + ", ".join(sources.get(n, n) for n in kept)
    made["stratified_by"] = "class"
    from detloader.annotations.index import AnnotationIndex

    return AnnotationIndex(
        root=index.root,
        arrays=index.arrays(),
        vocab=index.vocab,
        splits=parts,
        problems=ProblemReport(p for p in index.problems if not p.kind.startswith("split_")),
        meta={**index.meta, "split_sources": _write_splits(index, parts, made, force)},
    )


def split_moves(before: Mapping[str, np.ndarray], after: Mapping[str, np.ndarray], n: int) -> dict[str, int]:
    """How many of ``n`` images changed split between ``before`` and ``after`` (image ids per
    split name; only train / val / test names count), as ``{"test -> train": 48, ...}`` (``none``:
    in no such split), largest first."""

    def labels(splits: Mapping[str, np.ndarray]) -> np.ndarray:
        out = np.full(n, "none", dtype=object)
        for name in sorted((k for k in splits if split_role(k) is not None), key=lambda k: (-_keeps(k), k)):
            out[splits[name]] = name  # in two of one role (val, valid): the later name
        return out

    old, new = labels(before), labels(after)
    changed = old != new
    pairs = Counter(f"{a} -> {b}" for a, b in zip(old[changed], new[changed]))
    return dict(pairs.most_common())


def _write_splits(
    index: AnnotationIndex, parts: Mapping[str, np.ndarray], made: dict[str, Any], force: bool
) -> dict[str, str]:
    """Write ``parts`` where the layout keeps splits; their sources."""
    from detloader._system.files import atomic_write

    root = index.root
    stems = [os.path.splitext(os.path.basename(index.annotation_path(i)))[0] for i in range(len(index))]
    voc = index.meta.get("format") == "voc" and index.meta.get("source", {}).get("annotation_dir", ".") != "."
    if voc and len(set(stems)) == len(stems) and not (root / SPLITS_JSON).exists():
        main = (find_child_dir(root, ("ImageSets",)) or root / "ImageSets") / "Main"
        main.mkdir(parents=True, exist_ok=True)
        for old in main.glob("*.txt") if force else ():
            if split_role(old.stem) is not None and old.stem not in parts:
                old.unlink()
        for name, ids in parts.items():
            with atomic_write(main / f"{name}.txt", "w") as fh:
                fh.write("".join(f"{stems[i]}\n" for i in ids))
        return {name: os.path.relpath(main / f"{name}.txt", root) for name in parts}
    paths = {name: [Path(index.relative_image_path(int(i))).as_posix() for i in ids] for name, ids in parts.items()}
    write_splits_json(root, paths, made)
    return dict.fromkeys(parts, _made_text(made))


def write_splits_json(root: Path, paths: Mapping[str, list[str]], made: Mapping[str, Any]) -> Path:
    """Write ``root/splits.json``: ``{"splits": {name: [image path relative to root, "/"
    separated]}, "made": made}``, which every later read of ``root`` takes as its splits
    (:func:`settle_splits`); ``made`` says who wrote it (shown as the splits' source)."""
    from detloader._system.files import atomic_write

    path = root / SPLITS_JSON
    with atomic_write(path, "w") as fh:
        json.dump({"splits": dict(paths), "made": dict(made)}, fh, indent=1)
        fh.write("\n")
    return path
