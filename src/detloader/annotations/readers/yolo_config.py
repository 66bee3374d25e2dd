"""YOLO's configuration: ``data.yaml`` (class names, keypoint shape, splits), class-name files
and the image lists of a split. Everything wrong in it is a :class:`YoloConfigError` naming the
file, the key and the value (``data.yaml: kpt_shape=[17] is not [K, 2] or [K, 3]``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from detloader._system.files import read_capped
from detloader.annotations.checks import MAX_FILE_BYTES
from detloader.annotations.problems import Problem
from detloader.annotations.readers.common import Stamp, scan_files, stat_entry
from detloader.annotations.readers.locate import IMAGE_SUFFIXES
from detloader.errors import FileTooLargeError, YoloConfigError

YAML_NAMES = ("data.yaml", "dataset.yaml", "data.yml", "dataset.yml")
NAMES_FILES = ("classes.txt", "obj.names", "names.txt", "classes.names")
#: The most values a data.yaml may hold with its aliases expanded. YAML anchors let a few
#: hundred bytes stand for billions of values (``&a [x, x, ...]``, ``&b [*a, *a, ...]``, ...):
#: whatever walks the result (class names, the cache) would expand them. A million is far more
#: than any dataset's names, splits and keypoint settings.
MAX_YAML_VALUES = 1_000_000


def find_yaml(folder: Path) -> Path | None:
    """``data.yaml`` (or one of :data:`YAML_NAMES`) in ``folder``, None when absent."""
    return next((folder / name for name in YAML_NAMES if (folder / name).is_file()), None)


def find_names_file(*folders: Path | None) -> Path | None:
    """The first class-names file (:data:`NAMES_FILES`) in ``folders``, in order."""
    found = (folder / name for folder in folders if folder is not None for name in NAMES_FILES)
    return next((path for path in found if path.is_file()), None)


def load_yaml(path: Path) -> dict[str, Any]:
    """The YAML mapping in ``path``: read under ``MAX_FILE_BYTES``, at most
    :data:`MAX_YAML_VALUES` values once its aliases are expanded, no value that holds itself;
    else :class:`YoloConfigError` naming the file and the count."""
    try:
        data = yaml.safe_load(read_capped(path, MAX_FILE_BYTES).decode("utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError, FileTooLargeError) as err:
        raise YoloConfigError(f"{path.name}: not readable YAML: {err}") from None
    except RecursionError:
        raise YoloConfigError(f"{path.name}: not readable YAML: nested too deeply") from None
    if not isinstance(data, dict):
        raise YoloConfigError(f"{path.name}: top level is a {type(data).__name__}, not a mapping")
    count = expanded_values(data, MAX_YAML_VALUES)
    if count < 0:
        raise YoloConfigError(f"{path.name}: a YAML alias (*name) refers to a value that holds it: endless; refused")
    if count > MAX_YAML_VALUES:
        message = f"expands to more than {MAX_YAML_VALUES:,} values through YAML aliases (*name); refused"
        raise YoloConfigError(f"{path.name}: {message}")
    return data


def expanded_values(data: Any, cap: int) -> int:
    """How many values ``data`` (lists, dicts, scalars as ``yaml.safe_load`` makes them) holds
    as a tree, each alias expanded (a list met twice counts twice), found without expanding
    anything: each list or dict is counted once, in time linear in the file. Counts stop just
    over ``cap``; -1 when a value holds itself (``&a [*a]``)."""
    sizes: dict[int, int] = {}  # id -> expanded size of a finished list or dict
    entered: set[int] = set()  # entered and not finished: the path from the top
    stack: list[tuple[Any, bool]] = [(data, False)]
    while stack:
        value, finished = stack.pop()
        key = id(value)
        children = [*value.keys(), *value.values()] if isinstance(value, dict) else value
        if finished:
            total = 1 + sum(sizes[id(c)] if isinstance(c, (list, dict)) else 1 for c in children)
            sizes[key] = min(total, cap + 1)
            entered.discard(key)
        elif isinstance(value, (list, dict)) and key not in sizes:
            if key in entered:
                return -1
            entered.add(key)
            stack.append((value, True))
            stack.extend((c, False) for c in children if isinstance(c, (list, dict)))
    return sizes.get(id(data), 1)


def class_names(value: Any, where: str) -> list[str]:
    """``names`` as a list indexed by class id (a list, or ``{id: name}`` with gaps named by id)."""
    if value is None:
        return []
    if isinstance(value, (list, dict)):  # a list or a mapping of lists is no class name
        listed = value.items() if isinstance(value, dict) else enumerate(value)
        bad = next(((k, v) for k, v in listed if isinstance(v, (list, dict))), None)
        if bad is not None:
            raise YoloConfigError(f"{where}: names[{bad[0]!r}] is a {type(bad[1]).__name__}, not a class name")
    if isinstance(value, list):
        return [str(v) for v in value]
    if isinstance(value, dict):
        try:
            ids = {int(k): str(v) for k, v in value.items()}
        except (TypeError, ValueError):
            raise YoloConfigError(f"{where}: names={value!r} keys are not class ids") from None
        if not ids:
            return []
        if min(ids) < 0:
            raise YoloConfigError(f"{where}: names={value!r} has a negative class id")
        return [ids.get(i, str(i)) for i in range(max(ids) + 1)]
    raise YoloConfigError(f"{where}: names={value!r} is neither a list nor a mapping")


def kpt_config(data: dict[str, Any], where: str) -> dict[str, Any] | None:
    """``{"k", "dims", "names", "flip_pairs", "symmetric"}`` from ``kpt_shape`` / ``flip_idx`` /
    ``kpt_names`` (``symmetric``: a ``flip_idx`` that swaps nothing); None without ``kpt_shape``."""
    shape = data.get("kpt_shape")
    if shape is None:
        return None
    two_ints = isinstance(shape, list) and len(shape) == 2 and all(isinstance(v, int) for v in shape)
    if not two_ints or shape[0] < 1 or shape[1] not in (2, 3):
        raise YoloConfigError(f"{where}: kpt_shape={shape!r} is not [K, 2] or [K, 3]")
    k, d = shape
    flip = data.get("flip_idx")
    pairs: list[list[int]] = []
    if flip is not None:
        if not (isinstance(flip, list) and len(flip) == k and sorted(flip) == list(range(k))):
            raise YoloConfigError(f"{where}: flip_idx={flip!r} is not a permutation of 0..{k - 1}")
        for i, j in enumerate(flip):
            if flip[j] != i:
                raise YoloConfigError(f"{where}: flip_idx={flip!r} is not symmetric ({i} -> {j} -> {flip[j]})")
            if i < j:
                pairs.append([i, j])
    names_value = data.get("kpt_names")
    if isinstance(names_value, dict) and names_value:
        names_value = names_value[sorted(names_value, key=str)[0]]
    names = [str(n) for n in names_value] if isinstance(names_value, list) else [f"p{i}" for i in range(k)]
    if len(names) != k or len(set(names)) != k:
        raise YoloConfigError(f"{where}: kpt_names={names_value!r} is not {k} distinct names")
    return {"k": k, "dims": d, "names": names, "flip_pairs": pairs, "symmetric": flip is not None and not pairs}


def images_under(
    folder: Path, root: Path, problems: list[Problem] | None = None, follow_outside: bool = False
) -> list[Stamp]:
    """Stamps of the (non-hidden) images below ``folder``, relative to ``root``; special files,
    symlink loops and (unless ``follow_outside``) folder links out of the dataset go to ``problems``
    (:func:`~detloader.annotations.readers.common.scan_files`)."""
    found = scan_files(folder, IMAGE_SUFFIXES, root=root, problems=problems, follow_outside=follow_outside)
    return [entry for entry in found if not os.path.basename(entry[0]).startswith(".")]


def split_images(
    entry: str, root: Path, where: str, problems: list[Problem] | None = None, follow_outside: bool = False
) -> list[Stamp]:
    """Images of one ``train``/``val``/``test`` entry: a folder (recursive, :func:`images_under`)
    or a list file."""
    target = Path(entry) if os.path.isabs(entry) else root / entry
    if target.is_dir():
        return images_under(target, root, problems, follow_outside)
    if target.is_file() and target.suffix.lower() == ".txt":
        out: list[Stamp] = []
        for line in target.read_text(encoding="utf-8").splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("./"):
                path = target.parent / line[2:]
            elif os.path.isabs(line):
                path = Path(line)
            else:
                path = root / line
            try:
                out.append(stat_entry(path, root))
            except OSError:
                out.append((os.path.relpath(path, root), 0, -1, 0, 0))  # reported when parsed
        return out
    raise YoloConfigError(f"{where}: {entry!r} is neither a folder nor a .txt list under {root.name}/")
