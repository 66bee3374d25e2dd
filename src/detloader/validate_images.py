"""Image checks for ``detloader validate``: every image's header (missing, zero-byte, not an
image, declared size vs the annotation, over the pixel cap), and optionally a full decode.

Results are :class:`~detloader.annotations.problems.Problem` rows (annotation file, field,
value), the same report style as the annotation checks.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from detloader._pool import run_in_processes
from detloader.annotations.index import AnnotationIndex
from detloader.annotations.problems import Problem
from detloader.images import ImageDecodeError, check_pixels, decode_image

__all__ = ["check_image", "check_images"]


def check_image(
    path: str | os.PathLike[str],
    annotation: str,
    expected_size: tuple[int, int] | None,
    decode: bool = False,
) -> list[Problem]:
    """Problems of the image at ``path`` (reported against ``annotation``); header only unless
    ``decode``, which decodes the whole file (truncated and corrupt data)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        return [Problem("missing_image", annotation, "filename", f"image={p} does not exist")]
    except OSError as err:
        return [Problem("unreadable_image", annotation, "filename", f"image={p}: {err}")]
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
        out.append(
            Problem("size_mismatch", annotation, "size", f"annotation {expected_size[0]}x{expected_size[1]} != image header {size[0]}x{size[1]}")
        )
    if decode:
        try:
            decode_image(data, source=str(p), expected_size=expected_size)
        except ImageDecodeError as err:
            out.append(Problem("unreadable_image", annotation, "pixels", str(err)))
    return out


def check_images(
    index: AnnotationIndex,
    decode: bool = False,
    workers: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> list[Problem]:
    """:func:`check_image` for every image of ``index``, in index order; ``workers > 1``
    runs them in worker processes; ``progress(done, total)`` after each image."""
    calls = [
        (str(index.image_path(i)), index.annotation_path(i), (int(index.width[i]), int(index.height[i])), decode)
        for i in range(len(index))
    ]
    results: list[list[Problem]] = [[] for _ in calls]
    if workers > 1 and len(calls) > 1:
        done = 0
        for i, found in run_in_processes(check_image, calls, max_workers=workers):
            results[i] = found
            done += 1
            if progress is not None:
                progress(done, len(calls))
    else:
        for i, args in enumerate(calls):
            results[i] = check_image(*args)
            if progress is not None:
                progress(i + 1, len(calls))
    return [p for found in results for p in found]
