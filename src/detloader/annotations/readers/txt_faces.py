"""The two face kinds of the txt reader: RetinaFace ``label.txt`` and WIDER FACE ground truth.

Their layout and mapping are stated once, in :mod:`~detloader.annotations.readers.txt`'s
docstring. ``lines`` are ``(line number, stripped text)`` of the non-empty lines; problems name
``line N``. Boxes are ``x y w h`` in pixels, written to the index as xyxy.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from detloader.annotations.builder import ChunkBuilder
from detloader.annotations.landmarks import FACE5
from detloader.annotations.readers.common import parse_floats
from detloader.annotations.readers.locate import ImageLocator, add_listed_image

FACE_CLASS = "face"
#: A whole number, as the face count and size fields hold it.
INTEGER = re.compile(r"^[+-]?\d+$")

#: WIDER FACE attribute columns and the words for their values.
WIDER_ATTRIBUTES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("blur", ("clear", "normal", "heavy")),
    ("expression", ("typical", "exaggerate")),
    ("illumination", ("normal", "extreme")),
    ("invalid", ("false", "true")),
    ("occlusion", ("none", "partial", "heavy")),
    ("pose", ("typical", "atypical")),
)


def parse_retinaface(lines: Iterator[tuple[int, str]], locator: ImageLocator, b: ChunkBuilder) -> None:
    """A RetinaFace ``label.txt``: ``# path [w h]`` lines, then one face per line."""
    open_image = False
    for n, text in lines:
        where = f"line {n}"
        if text.startswith("#"):
            tokens = text[1:].split()
            if not tokens:
                b.problem("missing_field", where, "image path is missing after '#'", "image skipped")
                open_image = False
                continue
            size = None
            if len(tokens) >= 3 and INTEGER.match(tokens[-1]) and INTEGER.match(tokens[-2]):
                size = (int(tokens[-2]), int(tokens[-1]))
                tokens = tokens[:-2]
            open_image = add_listed_image(locator, " ".join(tokens), where, b, size)
            continue
        if not open_image:
            continue  # faces of a skipped image (its problem is reported)
        values = parse_floats(text.split(), where, b, "object skipped")
        if values is None:
            continue
        if len(values) not in (4, 5, 19, 20):
            b.problem(
                "bad_value",
                where,
                f"{len(values)} values: expected x y w h [+ 5 x (x y flag) + score]",
                "object skipped",
            )
            continue
        x, y, w, h = values[:4]
        points = None
        if len(values) >= 19:
            points = []
            for k, name in enumerate(FACE5.names):
                px, py, flag = values[4 + 3 * k : 7 + 3 * k]
                if px < 0 and py < 0:
                    points.append((name, 0.0, 0.0, 0))
                else:
                    points.append((name, px, py, 1 if flag == 1.0 else 2))
        b.add_object(
            (x, y, x + w, y + h), FACE_CLASS, element=where, box_field="", landmarks=points, landmark_field="landmarks"
        )


def parse_wider(lines: Iterator[tuple[int, str]], locator: ImageLocator, b: ChunkBuilder) -> None:
    """A WIDER FACE ``wider_face_*_bbx_gt.txt``: path, face count, one face per line."""
    for n, text in lines:
        where = f"line {n}"
        path = text
        try:
            n_count, count_text = next(lines)
        except StopIteration:
            b.problem("missing_field", where, f"{path!r}: the face count line is missing", "image skipped")
            return
        if not INTEGER.match(count_text):
            b.problem(
                "unparseable",
                f"line {n_count}",
                f"face count {count_text!r} is not an integer",
                "rest of the file skipped",
            )
            return
        count = int(count_text)
        rows: list[tuple[int, str]] = []
        for _ in range(max(count, 1)):  # a count of 0 is followed by one line of zeros
            try:
                rows.append(next(lines))
            except StopIteration:
                break
        if count == 0 and rows and set(rows[0][1].split()) != {"0"}:
            b.problem(
                "unparseable",
                f"line {rows[0][0]}",
                "expected a line of zeros after a count of 0",
                "rest of the file skipped",
            )
            return
        if len(rows) < count:
            b.problem("missing_field", where, f"{path!r}: {count} faces announced, {len(rows)} given", "image skipped")
            return
        if not add_listed_image(locator, path, where, b):
            continue
        for n_row, row in rows[:count]:
            _wider_face(row, f"line {n_row}", b)


def _wider_face(text: str, where: str, b: ChunkBuilder) -> None:
    values = parse_floats(text.split(), where, b, "object skipped")
    if values is None:
        return
    if len(values) != 10:
        b.problem("bad_value", where, f"{len(values)} values: expected x y w h + 6 attributes", "object skipped")
        return
    x, y, w, h = values[:4]
    attrs: dict[str, str] = {}
    codes: dict[str, int] = {}
    for (name, words), value in zip(WIDER_ATTRIBUTES, values[4:]):
        code = int(value) if value.is_integer() else -1
        if not 0 <= code < len(words):
            b.problem(
                "bad_value",
                f"{where}/{name}",
                f"{name}={value:g} is not one of 0..{len(words) - 1}",
                "attribute skipped",
            )
            continue
        codes[name] = code
        attrs[name] = words[code]
    b.add_object(
        (x, y, x + w, y + h),
        FACE_CLASS,
        element=where,
        box_field="",
        difficult=codes.get("invalid", 0) == 1,
        occluded=codes.get("occlusion", 0) > 0,
        attributes=attrs,
    )
