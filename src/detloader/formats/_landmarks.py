"""Landmark schemas that formats use by name: iBUG 300-W 68 points and COCO person 17.

Readers choose a fallback schema from the names they found (see ``default_landmarks`` in
:mod:`detloader.formats`): names that are exactly a preset's take the preset, with its flip
pairs, which spelling alone cannot give (dlib names the 68 points ``"00"`` .. ``"67"``).
"""

from __future__ import annotations

from typing import Sequence

from detloader.index import LandmarkSchema


def _ibug68_pairs() -> tuple[tuple[int, int], ...]:
    pairs: list[tuple[int, int]] = []
    pairs += [(i, 16 - i) for i in range(8)]  # jaw 0..16, 8 is the chin
    pairs += [(17 + i, 26 - i) for i in range(5)]  # eyebrows 17..21 <-> 26..22
    pairs += [(31, 35), (32, 34)]  # nostrils; 27..30 and 33 are on the midline
    pairs += [(36, 45), (37, 44), (38, 43), (39, 42), (40, 47), (41, 46)]  # eyes
    pairs += [(48, 54), (49, 53), (50, 52), (55, 59), (56, 58)]  # outer lips; 51, 57 midline
    pairs += [(60, 64), (61, 63), (65, 67)]  # inner lips; 62, 66 midline
    return tuple(pairs)


#: iBUG 300-W 68-point face landmarks as dlib names them (``"00"`` .. ``"67"``), with the
#: 29 left/right pairs of the standard markup (jaw, brows, nostrils, eyes, lips).
IBUG68 = LandmarkSchema(tuple(f"{i:02d}" for i in range(68)), _ibug68_pairs())

#: COCO person keypoints, in COCO's order; flip pairs are the left_*/right_* names.
COCO17_NAMES = (
    "nose",
    "left_eye",
    "right_eye",
    "left_ear",
    "right_ear",
    "left_shoulder",
    "right_shoulder",
    "left_elbow",
    "right_elbow",
    "left_wrist",
    "right_wrist",
    "left_hip",
    "right_hip",
    "left_knee",
    "right_knee",
    "left_ankle",
    "right_ankle",
)
COCO17 = LandmarkSchema.from_names(COCO17_NAMES)

#: COCO person skeleton (limbs) as 1-based index pairs, as COCO's category record writes it.
COCO17_SKELETON = (
    (16, 14), (14, 12), (17, 15), (15, 13), (12, 13), (6, 12), (7, 13), (6, 7), (6, 8),
    (7, 9), (8, 10), (9, 11), (2, 3), (1, 2), (1, 3), (2, 4), (3, 5), (4, 6), (5, 7),
)  # fmt: skip

PRESETS: tuple[LandmarkSchema, ...] = (IBUG68, COCO17)


def preset_schema(names: Sequence[str]) -> LandmarkSchema | None:
    """The preset whose names are exactly ``names`` (as a set), else None."""
    wanted = set(names)
    for preset in PRESETS:
        if wanted == set(preset.names):
            return preset
    return None


def skeleton_for(schema: LandmarkSchema) -> list[list[int]]:
    """COCO ``skeleton`` (1-based limb pairs) for a schema: COCO's own for COCO person,
    else empty (flip pairs are symmetries, not limbs, so they are not written as edges)."""
    if schema.names == COCO17_NAMES:
        return [list(edge) for edge in COCO17_SKELETON]
    return []
