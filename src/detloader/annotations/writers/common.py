"""What the writers share: argument checks, the output folder, placing images, attribute rows.
Every file is written whole or not at all (:func:`detloader._system.files.atomic_write`): a full disk
is one error naming the file and the space left, and leaves no partial file."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from detloader._system.files import atomic_write, open_regular
from detloader.annotations.index import MISSING, AnnotationIndex
from detloader.annotations.problems import check_choice
from detloader.errors import DetloaderValueError, NotRegularFileError

IMAGE_MODES = ("link", "copy", "symlink", "none")


def prepare_out(out: str | os.PathLike[str], overwrite: bool) -> Path:
    """The output folder, created; refused when it is a file, or not empty without ``overwrite``."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise DetloaderValueError(f"out={str(out)!r} is a file, not a folder")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise DetloaderValueError(f"out={str(out)!r} is not empty; pass overwrite=True (--overwrite) to write into it")
    path.mkdir(parents=True, exist_ok=True)
    return path


class ImagePlacer:
    """Where each image of the index goes under the output folder, and putting it there."""

    def __init__(self, index: AnnotationIndex, mode: str, names_as_text: bool = True) -> None:
        """``names_as_text``: the writer puts the image names in UTF-8 text (VOC, COCO, YOLO's
        split lists); a name that is not UTF-8 (its file's name holds such bytes) is then refused
        here, before anything is written."""
        check_choice("images", mode, IMAGE_MODES)
        self.mode = mode
        self.sources = [os.path.abspath(index.image_path(i)) for i in range(len(index))]
        if self.sources:
            common = os.path.commonpath([os.path.dirname(s) for s in self.sources])
            self.keys = [os.path.relpath(s, common) for s in self.sources]
        else:
            self.keys = []
        written = self.sources if mode == "none" else self.keys  # the names the files will hold
        odd = [i for i, s in enumerate(written) if names_as_text and not s.isprintable() and _not_utf8(s)]
        if odd:
            raise DetloaderValueError(
                f"{os.fsencode(self.sources[odd[0]])!r}: the image's name is not UTF-8 ({len(odd)} of "
                f"{len(written)} images so named), and this format writes image names as UTF-8 text: rename "
                "them first (nothing written)"
            )

    def place(self, i: int, folder: Path) -> Path:
        """Put image ``i`` at ``folder/key`` (by the mode) and return that path; with mode
        ``"none"`` return the source path instead."""
        src = self.sources[i]
        if self.mode == "none":
            return Path(src)
        dst = folder / self.keys[i]
        dst.parent.mkdir(parents=True, exist_ok=True)
        if dst.exists() or dst.is_symlink():
            dst.unlink()
        if self.mode == "symlink":
            os.symlink(os.path.relpath(src, dst.parent), dst)
            return dst
        if self.mode == "link":
            try:
                os.link(src, dst)
                return dst
            except OSError:
                pass  # another file system: copied
        try:
            fin = open_regular(src)  # a FIFO would block
        except NotRegularFileError as err:
            raise NotRegularFileError(f"{src}: {err}; image not copied (remove it or fix the index)") from None
        with fin, atomic_write(dst) as fout:
            shutil.copyfileobj(fin, fout)
        shutil.copystat(src, dst)
        return dst


def _not_utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # surrogate escapes: bytes that are not UTF-8 (os.fsdecode)
        return True
    return False


def attribute_rows(table: np.ndarray, vocab: Sequence[tuple[str, Sequence[str]]]) -> Callable[[int], dict[str, str]]:
    """``row(i) -> {name: value}`` of an index attribute table (``MISSING`` cells left out)."""
    def row(i: int) -> dict[str, str]:
        return {name: values[v] for (name, values), v in zip(vocab, table[i]) if v != MISSING}

    return row


def image_attributes(
    index: AnnotationIndex, rows: Callable[[int], dict[str, str]], i: int, image_class_attribute: str
) -> dict[str, str]:
    """Image ``i``'s attributes, its image-level class first as ``image_class_attribute``."""
    attrs = rows(i)
    label = int(index.image_labels[i])
    if label != MISSING:
        attrs = {image_class_attribute: index.image_classes[label], **attrs}
    return attrs
