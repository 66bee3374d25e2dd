"""``detloader validate PATH --store``: each image store of the dataset (``cache="disk"`` beside
its index cache, ``cache="ram"`` in shared memory) checked against the CRC-32 of every image's
stored bytes (:meth:`detloader.dataset.store.ImageStore.verify`)."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from detloader.annotations.index import AnnotationIndex


def add_store_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--store", action="store_true",
        help="also check the dataset's image stores (cache=disk|ram) against their per-image checksums; "
        "a damaged one exits 1",
    )


def check_stores(index: AnnotationIndex) -> list[dict[str, Any]]:
    """One finding per store file of ``index``'s dataset: ``store`` (its path), ``images``,
    ``damaged`` (``index`` and ``image`` path of each image whose bytes fail their checksum)
    and, for a file that cannot be checked at all, ``error`` (why)."""
    from detloader.dataset.store import ImageStore
    from detloader.dataset.store_files import store_paths
    from detloader.errors import DetloaderValueError

    found: list[dict[str, Any]] = []
    for path in store_paths(index.root):
        try:
            store = ImageStore.at(path)
            bad = store.verify()
        except (OSError, DetloaderValueError) as err:
            found.append({"store": str(path), "images": 0, "damaged": [], "error": str(err)})
            continue
        named = store.n == len(index)  # made for this index: name the image files
        found.append({"store": str(path), "images": store.n, "damaged": [
            {"index": i, "image": os.fspath(index.image_path(i)) if named else None} for i in bad
        ]})
    return found


def store_lines(found: list[dict[str, Any]]) -> list[str]:
    """What ``validate --store`` prints for ``found`` (:func:`check_stores`), one line each."""
    from rich.markup import escape

    if not found:
        return ["no image store of this dataset (cache=disk|ram makes one)"]
    lines = []
    for f in found:
        if "error" in f:
            lines.append(
                f"[red]store damaged[/red] {escape(f['store'])}: {escape(f['error'])}; "
                "remove it (it is rebuilt when used)"
            )
        elif f["damaged"]:
            names = ", ".join(f"{d['index']} ({d['image']})" if d["image"] else str(d["index"]) for d in f["damaged"])
            lines.append(
                f"[red]store damaged[/red] {escape(f['store'])}: {len(f['damaged'])} of {f['images']} images "
                f"fail their checksum: {escape(names)}; remove the file (it is rebuilt when used)"
            )
        else:
            lines.append(f"[green]store ok[/green] {escape(f['store'])}: {f['images']} images match their checksums")
    return lines


def stores_damaged(found: list[dict[str, Any]]) -> bool:
    return any("error" in f or f["damaged"] for f in found)
