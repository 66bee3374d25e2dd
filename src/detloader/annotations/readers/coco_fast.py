"""The fast path of the COCO reader, for files of boxes: a typed decode (msgspec) and object
columns built with numpy (ids looked up by ``np.searchsorted``, boxes checked as arrays); images,
and objects that need a named problem, go through the general path's code where it would meet
them, so the index and the problems, in their order, are the same. Which files take it and why:
docs/index.md, "COCO at scale"; :func:`parse_fast` returns False, having reported nothing, for
a file or a read that needs the general path.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
import numpy as np

from detloader.annotations.builder import ChunkBuilder
from detloader.annotations.checks import check_box
from detloader.annotations.readers import coco_records as rec
from detloader.annotations.readers.locate import ImageLocator

_I64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
_NONE = Annotated[list, msgspec.Meta(max_length=0)]


class _Image(msgspec.Struct, gc=False):
    """An image record: its fields as in the file (any JSON value; UNSET when absent)."""

    id: Any = msgspec.UNSET
    file_name: Any = msgspec.UNSET
    width: Any = msgspec.UNSET
    height: Any = msgspec.UNSET
    attributes: Any = msgspec.UNSET

    def get(self, key: str, default: Any = None) -> Any:
        """``dict.get`` over the fields, so that the general path's image code reads it."""
        value = getattr(self, key, msgspec.UNSET)
        return default if value is msgspec.UNSET else value


class _Object(msgspec.Struct, gc=False):
    """An object record as the fast path takes it (anything else refuses the file)."""

    image_id: _I64
    category_id: _I64
    bbox: tuple[float, float, float, float]
    iscrowd: int | None = 0
    keypoints: _NONE | None = None
    attributes: Annotated[dict, msgspec.Meta(max_length=0)] | None = None


class _File(msgspec.Struct):
    images: list[_Image] = []
    annotations: list[_Object] = []
    categories: list[Any] = []


_DECODER = msgspec.json.Decoder(_File)


def _lookup(keys: dict[Any, int], values: np.ndarray) -> np.ndarray:
    """``keys[v]`` for every int64 ``v`` of ``values``, -1 where it is not a key (only int keys
    can match)."""
    pairs = sorted((k, i) for k, i in keys.items() if type(k) is int and -(2**63) <= k < 2**63)
    out = np.full(len(values), -1, dtype=np.int64)
    if pairs and len(values):
        ks = np.fromiter((k for k, _ in pairs), np.int64, len(pairs))
        at = np.minimum(np.searchsorted(ks, values), len(ks) - 1)
        hit = ks[at] == values
        out[hit] = np.fromiter((i for _, i in pairs), np.int64, len(pairs))[at[hit]]
    return out


def _declared_sides(images: list[_Image]) -> np.ndarray:
    """``[n, 2]`` width, height as declared when both are positive ints (the size the image gets
    without reading its header), else -1 (its objects are checked one by one)."""
    sides = np.full((len(images), 2), -1, dtype=np.int64)
    for i, img in enumerate(images):
        w, h = img.width, img.height
        if type(w) is int and type(h) is int and 0 < w < 2**62 and 0 < h < 2**62:
            sides[i] = (w, h)
    return sides


def parse_fast(raw: bytes, locator: ImageLocator, b: ChunkBuilder) -> bool:
    """Parse the COCO file ``raw`` into ``b`` on the fast path (see the module docstring); False,
    with nothing added or reported, when the file needs the general path."""
    opts = b.options
    if opts.classes is not None or opts.class_map or opts.one_based:
        return False
    try:
        data = _DECODER.decode(raw)
    except (msgspec.MsgspecError, ValueError, RecursionError):
        return False
    images, objects = data.images, data.annotations
    found, names = rec.declare(data.categories, b)
    image_ids = rec.image_rows(images, b)
    m = len(objects)
    owner = _lookup(image_ids, np.fromiter((o.image_id for o in objects), np.int64, m))
    for j in np.flatnonzero(owner < 0).tolist():  # reported before any image, as the general path does
        message = f"image_id={objects[j].image_id!r} is not in images"
        b.problem("bad_value", f"annotations[{j}]/image_id", message, "object skipped")
    cat_rows = {cid: k for k, cid in enumerate(sorted(found, key=lambda c: rec.id_order((c, None))))}
    labels = _lookup(cat_rows, np.fromiter((o.category_id for o in objects), np.int64, m))
    xywh = np.fromiter((o.bbox for o in objects), np.dtype((np.float64, 4)), m).reshape(m, 4)
    xyxy64 = np.concatenate([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], axis=1)
    sides = _declared_sides(images)[np.maximum(owner, 0)]
    with np.errstate(over="ignore", invalid="ignore"):  # beyond float32: inf, named by check_box
        boxes = xyxy64.astype(np.float32)
        plain = (
            np.isfinite(boxes).all(axis=1)
            & (boxes[:, 2] > boxes[:, 0])
            & (boxes[:, 3] > boxes[:, 1])
            & (boxes[:, 0] >= 0)
            & (boxes[:, 1] >= 0)
            & (boxes[:, 2] <= sides[:, 0])
            & (boxes[:, 3] <= sides[:, 1])
        )
    slow = (owner >= 0) & ~(plain & (labels >= 0))
    order = np.argsort(owner, kind="stable")  # objects grouped by image, in file order within one
    starts = np.searchsorted(owner[order], np.arange(len(images) + 1))
    slow_per_image = np.bincount(owner[slow], minlength=len(images)) if slow.any() else None
    keep = plain & (labels >= 0)
    row_of = np.full(len(images), -1, dtype=np.int64)
    first = b.image_count
    for i, img in enumerate(images):
        where = f"images[{i}]"
        if rec.image_problem(img, where, image_ids, i, b):
            continue
        size = rec.image(img, where, locator, b)
        if size is None:
            continue
        row_of[i] = b.image_count - 1
        if slow_per_image is not None and slow_per_image[i]:
            for j in order[starts[i] : starts[i + 1]].tolist():
                if slow[j]:
                    keep[j] = _check_one(j, objects[j], xyxy64[j], labels[j], boxes, size, b)
    kept = order[keep[order] & (row_of[np.maximum(owner[order], 0)] >= 0) & (owner[order] >= 0)]
    crowd = np.fromiter(((o.iscrowd or 0) != 0 for o in objects), np.bool_, m)
    b.add_objects(first, row_of[owner[kept]], boxes[kept], labels[kept], names, crowd[kept])
    return True


def _check_one(
    j: int, obj: _Object, xyxy: np.ndarray, label: int, boxes: np.ndarray, size: tuple[int, int], b: ChunkBuilder
) -> bool:
    """The general path's checks of one object (unknown category, then the box); its stored box
    goes to ``boxes[j]``. Whether it is kept."""
    where = f"annotations[{j}]"
    if label < 0:
        message = f"category_id={obj.category_id!r} is not in categories"
        b.problem("bad_value", f"{where}/category_id", message, "object skipped")
        return False
    stored, finding = check_box(tuple(xyxy.tolist()), size[0], size[1], one_based=False, clip=b.options.clip_boxes)
    if finding is not None:
        b.report(finding, f"{where}/bbox")
    if stored is None:
        return False
    boxes[j] = stored
    return True
