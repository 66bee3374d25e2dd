"""What a horizontal mirror does to names: landmark schemas (ordered points and their left/right
flip pairs; the presets iBUG 300-W 68 points and COCO person 17) and :class:`ClassFlip`, the classes
that swap with their mirror class (``redleft`` <-> ``redright``) or cannot be mirrored at all.

Readers choose a fallback schema from the names they found (see ``default_landmarks`` in
:mod:`detloader.annotations.readers`): names that are exactly a preset's take the preset, with its flip
pairs, which spelling alone cannot give (dlib names the 68 points ``"00"`` .. ``"67"``).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from detloader.errors import DetloaderValueError, FlipPairWarning

#: A side in a landmark name: the word left/right (any case, not inside a longer lower-case
#: word: ``cleft`` is no side) or a lone l/r (``l_ear``, ``eye-r``, ``eyeL``, ``LEye``).
_SIDE = re.compile(
    r"(?<![A-Za-z])(?:left|right)|(?<![A-Z])(?:Left|Right|LEFT|RIGHT)"
    r"|(?<![A-Za-z])[lr](?![A-Za-z])|(?<![A-Z])[LR](?=[^A-Za-z]|$|[A-Z][a-z])"
)
_OTHER_SIDE = {"left": "right", "Left": "Right", "LEFT": "RIGHT", "l": "r", "L": "R"}
_OTHER_SIDE.update({v: k for k, v in _OTHER_SIDE.items()})

#: Kinds of doubtful flip pair (:meth:`LandmarkSchema.flip_problems`) and what each means.
FLIP_PROBLEMS: dict[str, str] = {
    "flip_partner_missing": "a landmark named for one side whose mirror name is not in the "
    "schema: a flip keeps it in its slot, on the wrong side",
    "flip_pair_asymmetric": "a flip pair whose names do not mirror each other, or a side-named "
    "landmark that is not paired with its mirror",
    "flip_pairs_missing": "two or more landmarks and no flip pair at all, and nobody said the points "
    "are symmetric: a flip keeps every point in its slot",
    "class_partner_missing": "a class named for one side (redleft) with no mirror class: images "
    "holding it are never mirrored",
}

def flip_remedy(option: str) -> str:
    """How to act on a flip warning about ``option`` (``"flip_pairs"`` or ``"class_flip_pairs"``),
    in Python and on the command line."""
    flag = "--" + option.replace("_", "-")
    return (f"give the pairs ({option}=[('a', 'b')] of DetectionDataset or TrainConfig; {flag} A=B,C=D), say there "
            f"are none ({option}=[]; {flag} none), or turn flipping off (RandomHorizontalFlip(p=0); --hflip 0)")


@dataclass(frozen=True)
class LandmarkSchema:
    """Ordered landmark names and the left/right pairs that a horizontal flip swaps.

    ``flip_pairs`` holds index pairs ``(i, j)`` into ``names``. ``symmetric`` says that the
    points have no left/right partners (no pair is owed): set where a user or a format said so
    (``flip_pairs=[]``, YOLO's ``flip_idx``), never guessed from the names.
    """

    names: tuple[str, ...] = ()
    flip_pairs: tuple[tuple[int, int], ...] = ()
    symmetric: bool = False

    def __post_init__(self) -> None:
        names = tuple(str(n) for n in self.names)
        object.__setattr__(self, "names", names)
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise DetloaderValueError(f"LandmarkSchema: names={list(names)} repeat {dup}")
        pairs = tuple((int(a), int(b)) for a, b in self.flip_pairs)
        for a, b in pairs:
            if not (0 <= a < len(names) and 0 <= b < len(names)) or a == b:
                raise DetloaderValueError(
                    f"LandmarkSchema: flip pair ({a}, {b}) is not two distinct indices "
                    f"in 0..{len(names) - 1}"
                )
        used = [i for pair in pairs for i in pair]
        if len(set(used)) != len(used):
            raise DetloaderValueError(f"LandmarkSchema: flip_pairs={list(pairs)} use an index twice")
        object.__setattr__(self, "flip_pairs", pairs)

    def __len__(self) -> int:
        return len(self.names)

    @classmethod
    def from_names(
        cls, names: Sequence[str], flip_pairs: Sequence[tuple[str | int, str | int]] | None = None
    ) -> LandmarkSchema:
        """Schema from names; ``flip_pairs`` by name or index (given: ``[]`` means the points
        are symmetric), else inferred from the names (:func:`infer_flip_pairs`:
        ``left_eye``/``right_eye``, ``l_ear``/``r_ear``, ``eye_left``/``eye_right``, ``eyeL``/``eyeR``)."""
        names = tuple(names)
        if flip_pairs is None:
            return cls(names, infer_flip_pairs(names))
        pairs = _pair_ids("LandmarkSchema: flip pair", names, flip_pairs)
        return cls(names, pairs, symmetric=not pairs)

    def flip_permutation(self, *, warn: bool = True) -> np.ndarray:
        """int64 ``[K]``: new slot ``k`` takes the point from slot ``perm[k]`` after a flip.
        With ``warn``, a :class:`FlipPairWarning` for each of :meth:`flip_problems` (the dataset
        whose transform mirrors and the mirroring transforms ask for it before they flip anything)."""
        for kind, message in self.flip_problems() if warn else ():
            warnings.warn(FlipPairWarning(kind, f"{message}; {flip_remedy('flip_pairs')}"), stacklevel=2)
        perm = np.arange(len(self.names), dtype=np.int64)
        for a, b in self.flip_pairs:
            perm[a], perm[b] = b, a
        return perm

    def flip_problems(self) -> list[tuple[str, str]]:
        """``(kind, message)`` for each doubtful pair, judged by the names' sides
        (:data:`FLIP_PROBLEMS`): a side-named point whose mirror name is absent and that has no
        pair; a pair whose names do not mirror; a point and its mirror that are not a pair.
        Names without a side (``nose``, dlib's ``"00"``) are not judged, but two or more points
        without any pair (``p0`` .. ``p4``) are, unless the schema is ``symmetric``."""
        names, found = self.names, []
        if len(names) > 1 and not self.flip_pairs and not self.symmetric:
            shown = ", ".join(repr(n) for n in names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
            found.append(("flip_pairs_missing", f"landmarks {shown} have no left/right flip pair: a flip keeps "
                          "each point in its slot, so a point that marked the left corner marks the right one"))
        lookup = {n: i for i, n in enumerate(names)}
        partner = dict(self.flip_pairs) | {b: a for a, b in self.flip_pairs}
        for i, name in enumerate(names):
            mirror = _mirror_name(name)
            j, has = lookup.get(mirror, -1) if mirror else -1, partner.get(i)
            if mirror is None or has == j:
                continue
            if has is not None:
                found.append(("flip_pair_asymmetric", f"landmark {name!r} is paired with "
                              f"{names[has]!r}, not its mirror {mirror!r}"))
            elif j < 0:
                found.append(("flip_partner_missing", f"landmark {name!r} has no partner "
                              f"{mirror!r}: a flip keeps it in its slot"))
            elif i < j and j not in partner:
                found.append(("flip_pair_asymmetric", f"landmarks {name!r} and {mirror!r} are "
                              "not a flip pair: a flip keeps both in their slots"))
        return found

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"names": list(self.names), "flip_pairs": [list(p) for p in self.flip_pairs]}
        return out | ({"symmetric": True} if self.symmetric else {})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LandmarkSchema:
        pairs = tuple(tuple(p) for p in data["flip_pairs"])
        return cls(tuple(data["names"]), pairs, symmetric=bool(data.get("symmetric", False)))  # type: ignore[arg-type]


def _pair_ids(
    what: str, names: Sequence[str], pairs: Sequence[tuple[str | int, str | int]]
) -> tuple[tuple[int, int], ...]:
    """``pairs`` of names or indices as index pairs into ``names``; ValueError naming ``what``,
    the pair and the names when a name is unknown."""
    lookup = {n: i for i, n in enumerate(names)}
    out = []
    for pair in pairs:
        if isinstance(pair, str) or len(pair) != 2:
            raise DetloaderValueError(f"{what} {pair!r} is not two names")
        try:
            out.append(tuple(x if isinstance(x, int) else lookup[x] for x in pair))
        except KeyError as err:
            known = list(names)
            raise DetloaderValueError(f"{what} {tuple(pair)!r} names {err.args[0]!r}, not one of {known}") from None
    return tuple(out)  # type: ignore[return-value]


#: A side in a class name: ``left`` / ``right`` in any case, also inside a word (``redleft``,
#: ``LeftArrow``), except in words that merely contain them (``bright``, ``upright``, ``cleft``,
#: ``leftover``).
_CLASS_SIDE = re.compile(
    r"(?<![bfw])(?<!up)(?<!al)(?<!out)(?<!down)(?<!forth)(?<!copy)(?<!birth)right|(?<!c)left(?!over)", re.I
)


def _mirror_class(name: str) -> str | None:
    """``name`` with every side word swapped, in its case (``redLeft`` -> ``redRight``), or None
    without one."""
    if _CLASS_SIDE.search(name) is None:
        return None

    def swap(m: re.Match[str]) -> str:
        word, other = m.group(), "right" if m.group().lower() == "left" else "left"
        return other.upper() if word.isupper() else other.capitalize() if word[0].isupper() else other

    return _CLASS_SIDE.sub(swap, name)


@dataclass(frozen=True)
class ClassFlip:
    """What a horizontal mirror does to each class of ``classes``.

    ``pairs`` (index pairs) swap: a mirrored ``redleft`` object is a ``redright`` one.
    ``one_sided`` are classes named for a side whose mirror class does not exist: an image holding
    one is never mirrored (its objects would be mislabelled). Every other class is the same in a
    mirror. :meth:`infer` finds both from the names (case-insensitive, also inside a word:
    ``redleft``/``redright``, ``left_hand``/``right_hand``, ``LeftArrow``/``RightArrow``);
    :meth:`from_pairs` takes the user's pairs as the whole map (no class is one-sided).
    """

    classes: tuple[str, ...]
    pairs: tuple[tuple[int, int], ...] = ()
    one_sided: tuple[int, ...] = ()
    _permutation: np.ndarray = field(init=False, repr=False, compare=False)
    _fixed: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        perm = np.arange(len(self.classes), dtype=np.int64)
        used = [i for pair in self.pairs for i in pair]
        if not all(0 <= i < len(self.classes) for i in used):
            raise DetloaderValueError(f"class_flip_pairs={list(self.pairs)}: class ids in 0..{len(self.classes) - 1}")
        if len(set(used)) != len(used) or any(a == b for a, b in self.pairs):
            raise DetloaderValueError(f"class_flip_pairs={self.named_pairs()} name a class twice")
        for a, b in self.pairs:
            perm[a], perm[b] = b, a
        fixed = np.zeros(len(self.classes), dtype=bool)
        fixed[list(self.one_sided)] = True
        object.__setattr__(self, "_permutation", perm)
        object.__setattr__(self, "_fixed", fixed)

    @classmethod
    def infer(cls, classes: Sequence[str]) -> ClassFlip:
        """Pairs and one-sided classes found in the class names."""
        classes = tuple(classes)
        exact = {n: i for i, n in enumerate(classes)}
        folded: dict[str, list[int]] = {}
        for i, n in enumerate(classes):
            folded.setdefault(n.lower(), []).append(i)
        pairs, one_sided, seen = [], [], set()
        for i, name in enumerate(classes):
            mirror = _mirror_class(name)
            if i in seen:
                continue
            if mirror is None:  # a lone l / r (hand_l, arrow-R) pairs with its partner, but alone is no side
                j = exact.get(_mirror_name(name) or "")
                if j is not None and j != i and j not in seen:
                    pairs.append((i, j))
                    seen.update((i, j))
                continue
            j = exact.get(mirror)
            if j is None and len(folded.get(mirror.lower(), ())) == 1:
                j = folded[mirror.lower()][0]
            if j is None or j == i or j in seen:
                one_sided.append(i)
            else:
                pairs.append((i, j))
                seen.update((i, j))
        return cls(classes, tuple(pairs), tuple(one_sided))

    @classmethod
    def from_pairs(cls, classes: Sequence[str], pairs: Sequence[tuple[str | int, str | int]]) -> ClassFlip:
        """Exactly ``pairs`` (class names or ids) swap; every other class is the same mirrored."""
        return cls(tuple(classes), _pair_ids("class_flip_pairs: pair", tuple(classes), pairs))

    @classmethod
    def resolve(cls, classes: Sequence[str], pairs: Sequence[tuple[str | int, str | int]] | None) -> ClassFlip:
        """:meth:`infer` when ``pairs`` is None, else :meth:`from_pairs`."""
        return cls.infer(classes) if pairs is None else cls.from_pairs(classes, pairs)

    def named_pairs(self) -> list[tuple[str, str]]:
        return [(self.classes[a], self.classes[b]) for a, b in self.pairs]

    def mirror(self, labels: np.ndarray) -> np.ndarray | None:
        """int64 labels after a mirror, or None when one is :attr:`one_sided` (do not mirror)."""
        if self.one_sided and self._fixed[labels].any():
            return None
        return self._permutation[labels] if self.pairs else labels

    def problem(self, labels: np.ndarray, object_image: np.ndarray, images: int) -> str | None:
        """The warning for :attr:`one_sided` classes among ``labels`` (of an index: its
        ``labels`` and ``object_image``, ``images`` in all), with how many images a flip skips."""
        if not self.one_sided:
            return None
        held = np.unique(object_image[self._fixed[labels]]).size
        names = ", ".join(repr(self.classes[i]) for i in self.one_sided)
        return (f"classes {names} are named for one side and have no mirror class: the {held} of {images} images "
                f"holding them are never mirrored; {flip_remedy('class_flip_pairs')}")


#: The 5-point face schema (RetinaFace order; also the synthetic dataset's).
FACE5 = LandmarkSchema(("left_eye", "right_eye", "nose", "left_mouth", "right_mouth"), ((0, 1), (3, 4)))


def _mirror_name(name: str) -> str | None:
    """``name`` with its first side word (:data:`_SIDE`) swapped, or None without one."""
    m = _SIDE.search(name)
    return None if m is None else name[: m.start()] + _OTHER_SIDE[m.group()] + name[m.end() :]


def infer_flip_pairs(names: Sequence[str]) -> tuple[tuple[int, int], ...]:
    """Left/right pairs found in ``names`` by their spelling; unmatched names stay put."""
    lookup = {n: i for i, n in enumerate(names)}
    pairs: list[tuple[int, int]] = []
    seen: set[int] = set()
    for i, name in enumerate(names):
        mirror = _mirror_name(name)
        j = lookup.get(mirror) if mirror is not None else None
        if j is not None and j != i and i not in seen and j not in seen:
            pairs.append((i, j))
            seen.update((i, j))
    return tuple(pairs)


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
    "nose", "left_eye", "right_eye", "left_ear", "right_ear", "left_shoulder", "right_shoulder", "left_elbow",
    "right_elbow", "left_wrist", "right_wrist", "left_hip", "right_hip", "left_knee", "right_knee", "left_ankle",
    "right_ankle",
)  # fmt: skip
COCO17 = LandmarkSchema.from_names(COCO17_NAMES)

#: COCO person skeleton (limbs) as 1-based index pairs, as COCO's category record writes it.
COCO17_SKELETON = (
    (16, 14), (14, 12), (17, 15), (15, 13), (12, 13), (6, 12), (7, 13), (6, 7), (6, 8),
    (7, 9), (8, 10), (9, 11), (2, 3), (1, 2), (1, 3), (2, 4), (3, 5), (4, 6), (5, 7),
)  # fmt: skip

PRESETS: tuple[LandmarkSchema, ...] = (IBUG68, COCO17)


def preset_schema(names: Sequence[str]) -> LandmarkSchema | None:
    """The preset whose names are exactly ``names`` (as a set), else None."""
    return next((preset for preset in PRESETS if set(names) == set(preset.names)), None)


def skeleton_for(schema: LandmarkSchema) -> list[list[int]]:
    """COCO ``skeleton`` (1-based limb pairs) for a schema: COCO's own for COCO person,
    else empty (flip pairs are symmetries, not limbs, so they are not written as edges)."""
    if schema.names == COCO17_NAMES:
        return [list(edge) for edge in COCO17_SKELETON]
    return []
