"""Image checks for ``detloader validate``: every image's header, and optionally a full decode.

Files are refused by type and size before a byte is read (:func:`~detloader.images.image_bytes`).
Each image file is checked once, and what the reader already reported is left out, so one
missing or broken image is one row per kind (docs/reliability.md, "``detloader validate`` and
images").
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

from detloader._system.pool import run_in_processes
from detloader.annotations.index import AnnotationIndex
from detloader.annotations.problems import Problem
from detloader.errors import FileTooLargeError, ImageDecodeError, NotRegularFileError
from detloader.images import check_pixels, decode_image, image_bytes

_READ_ERRORS = {
    FileNotFoundError: "missing_image", NotRegularFileError: "not_a_regular_file", FileTooLargeError: "file_too_large"
}


def check_image(
    path: str | os.PathLike[str], annotation: str, expected_size: tuple[int, int] | None, decode: bool = False
) -> list[Problem]:
    """Problems of the image at ``path`` (reported against ``annotation``); header only unless
    ``decode``, which decodes the whole file (truncated and corrupt data)."""
    p = Path(path)
    try:
        data = image_bytes(p)
    except ImageDecodeError as err:
        cause = err.__cause__
        kind = _READ_ERRORS.get(type(cause), "unreadable_image")
        return [Problem(kind, annotation, "filename", f"image={p}: {getattr(cause, 'strerror', None) or cause}")]
    if not data:
        return [Problem("unreadable_image", annotation, "filename", f"image={p} is 0 bytes")]
    try:
        size = check_pixels(data, str(p))
    except (ImageDecodeError, ValueError) as err:
        return [Problem("too_many_pixels", annotation, "size", str(err))]
    if size is None:
        return [Problem("unreadable_image", annotation, "filename", f"image={p} is not an image (no readable header)")]
    out: list[Problem] = []
    if expected_size is not None and all(expected_size) and tuple(expected_size) not in (size, size[::-1]):
        message = f"annotation {expected_size[0]}x{expected_size[1]} != image header {size[0]}x{size[1]}"
        out.append(Problem("size_mismatch", annotation, "size", message))
    if decode:
        try:
            decode_image(data, source=str(p), expected_size=expected_size)
        except MemoryError:
            out.append(Problem("unreadable_image", annotation, "pixels", f"image={p}: out of memory decoding it"))
        except ImageDecodeError as err:
            out.append(Problem("unreadable_image", annotation, "pixels", str(err)))
    return out


def check_images(
    index: AnnotationIndex,
    decode: bool = False,
    workers: int = 1,
    progress: Callable[[int, int], None] | None = None,
    reported: Iterable[Problem] = (),
) -> list[Problem]:
    """:func:`check_image` for every distinct image file of ``index``, once each (against its first
    annotation), in index order; ``workers > 1`` runs them in worker processes. A problem already
    in ``reported`` (same kind, same annotation file, same image named) is not reported again.
    """
    calls: dict[str, tuple[str, str, tuple[int, int], bool]] = {}
    for i in range(len(index)):
        path = str(index.image_path(i))
        if path not in calls:
            calls[path] = (path, index.annotation_path(i), (int(index.width[i]), int(index.height[i])), decode)
    jobs = list(calls.values())
    results: list[list[Problem]] = [[] for _ in jobs]
    if workers > 1 and len(jobs) > 1:
        done = 0
        for i, found in run_in_processes(check_image, jobs, max_workers=workers):
            results[i] = found
            done += 1
            if progress is not None:
                progress(done, len(jobs))
    else:
        for i, args in enumerate(jobs):
            results[i] = check_image(*args)
            if progress is not None:
                progress(i + 1, len(jobs))
    known: dict[tuple[str, str], list[str]] = {}
    for p in reported:
        known.setdefault((p.kind, p.file.partition("#")[0]), []).append(p.message)
    out = []
    for (path, *_), found in zip(jobs, results):
        name = os.path.basename(path)
        out.extend(p for p in found if not any(name in m for m in known.get((p.kind, p.file.partition("#")[0]), ())))
    return out
