"""Fuzzing every reader: mutated copies of a valid seed file (numbers made inf / nan / huge /
text / lists, elements and keys dropped, bytes cut or inserted) must either read, with the
index's invariants holding, or raise a documented detloader error. Nothing else may escape,
and the last-resort ``reader_error`` problem must never be needed.

The suite runs a short pass (``DETLOADER_FUZZ_EXAMPLES`` examples per reader, default 25);
``make fuzz`` runs the long one. Counts and findings: docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
from helpers import keypoints_xml, voc_object, voc_xml, write_image
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from detloader import read_annotations

EXAMPLES = int(os.environ.get("DETLOADER_FUZZ_EXAMPLES", "25"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    database=None,
)

_LM = keypoints_xml([("left_eye", 3, 3, 2), ("right_eye", 6, 3, 1), ("nose", 4, 5, 0)])
SEEDS: dict[str, str] = {
    "voc": '<?xml version="1.0"?>'
    + voc_xml(
        "a.jpg", [voc_object("cat", (1, 2, 9, 9), truncated="1", extra=_LM), voc_object("dog", (10.5, 3, 30, 40))]
    ),
    "cvat": '<?xml version="1.0"?><annotations><version>1.1</version>'
    '<image id="0" name="a.jpg" width="64" height="48">'
    '<box label="face" occluded="0" xtl="1" ytl="2" xbr="20" ybr="30" rotation="15" group_id="1">'
    '<attribute name="age">adult</attribute></box>'
    '<points label="nose" occluded="0" points="5.5,6.5" group_id="1"></points>'
    '<skeleton label="face5" group_id="2">'
    '<points label="left_eye" outside="0" occluded="0" points="3,4"></points></skeleton>'
    '<tag label="indoor"></tag></image></annotations>',
    "imglab": "<?xml version='1.0'?><dataset><images><image file='a.jpg' width='64' height='48'>"
    "<box top='2' left='1' width='20' height='30' ignore='0'><label>face</label>"
    "<part name='00' x='5' y='6'/><part name='01' x='7' y='8'/></box></image></images></dataset>",
    "coco": json.dumps(
        {
            "images": [{"id": 1, "file_name": "a.jpg", "width": 64, "height": 48}],
            "annotations": [
                {"id": 1, "image_id": 1, "category_id": 1, "bbox": [1, 2, 20, 30], "iscrowd": 0,
                 "keypoints": [5, 6, 2, 7, 8, 1], "attributes": {"occluded": False}},
                {"id": 2, "image_id": 1, "category_id": 2, "bbox": [30, 3, 10, 10]},
            ],
            "categories": [{"id": 1, "name": "person", "keypoints": ["a", "b"]}, {"id": 2, "name": "dog"}],
        }
    ),
    "yolo": "0 0.5 0.5 0.2 0.4\n1 0.1 0.2 0.1 0.1\n",
    "openimages": "ImageID,Source,LabelName,Confidence,XMin,XMax,YMin,YMax,IsOccluded,IsTruncated,IsGroupOf,"
    "IsDepiction,IsInside\na,xclick,/m/cat,1,0.1,0.5,0.2,0.9,0,1,0,-1,0\na,xclick,/m/dog,1,0.5,0.9,0.1,0.4,1,0,1,0,1\n",
    "txt": "images/a.jpg cat\n",
}

# -- mutations -----------------------------------------------------------------------------------
_HOSTILE_NUMBERS = ["inf", "-inf", "nan", "NaN", "1e309", "-1e309", str(2**31), str(2**63), str(2**64 + 1),
                    "-0", "0", "-5", "abc", "", " ", "0x10", "1_000", "1e-400", "3.5e38", "[1]"]
number_text = st.one_of(
    st.sampled_from(_HOSTILE_NUMBERS),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(2**80), max_value=2**80).map(str),
    st.text(max_size=4),
)
json_value = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**80), max_value=2**80),
              st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5),
              st.sampled_from(["../../x.jpg", "/etc/passwd", "a.jpg"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=3)),
    max_leaves=6,
)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_ELEMENT = re.compile(r"<(\w+)[^<>]*/>|<(\w+)[^<>]*>[^<]*</\2>")


@st.composite
def mutate_text(draw: st.DrawFn, seed: str) -> bytes:
    """The seed with some numbers replaced by hostile text, some XML elements dropped, then
    some bytes cut, inserted or the file truncated."""
    spans = [m.span() for m in _NUMBER.finditer(seed)]
    chosen = draw(st.sets(st.sampled_from(range(len(spans))), max_size=4)) if spans else set()
    out, last = [], 0
    for i, (a, b) in enumerate(spans):
        if i in chosen:
            out += [seed[last:a], draw(number_text)]
            last = b
    text = "".join(out) + seed[last:]
    elements = [m.span() for m in _ELEMENT.finditer(text)]
    for a, b in sorted(draw(st.sets(st.sampled_from(elements), max_size=2)) if elements else (), reverse=True):
        text = text[:a] + text[b:]  # drop whole elements (no overlap: innermost ones only)
    data = text.encode("utf-8", "surrogatepass")
    for _ in range(draw(st.integers(0, 2))):
        op = draw(st.sampled_from(["cut", "insert", "truncate"]))
        i = draw(st.integers(0, len(data)))
        if op == "cut":
            data = data[:i] + data[i + draw(st.integers(1, 40)):]
        elif op == "insert":
            data = (
                data[:i]
                + draw(
                    st.binary(min_size=1, max_size=8) | st.sampled_from([b"<x>", b"</", b"&", b'"', b"'", b">", b"\n"])
                )
                + data[i:]
            )
        else:
            data = data[:i]
    return data


def _paths(value: object, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, prefix + (i,))
    return out


@st.composite
def mutate_json(draw: st.DrawFn, seed: str) -> bytes:
    """The seed's JSON with some values replaced by any JSON value or keys dropped, sometimes
    then cut like text."""
    data = json.loads(seed)
    for _ in range(draw(st.integers(1, 4))):
        paths = [p for p in _paths(data) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = data
        for key in path[:-1]:
            parent = parent[key]
        if draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(json_value)
    text = json.dumps(data, allow_nan=True).replace("Infinity", draw(st.sampled_from(["Infinity", "1e309"])))
    if draw(st.integers(0, 9)) == 0:
        text = text[: draw(st.integers(0, len(text)))]
    return text.encode("utf-8", "surrogatepass")


# -- datasets and the invariants ----------------------------------------------------------------
def _dataset(root: Path, fmt: str) -> tuple[Path, Path]:
    """(path to read, annotation file to overwrite) of a dataset holding image a.jpg (64x48)."""
    if fmt == "voc":
        write_image(root / "JPEGImages" / "a.jpg")
        (root / "Annotations").mkdir(parents=True)
        return root, root / "Annotations" / "a.xml"
    if fmt == "yolo":
        write_image(root / "images" / "train" / "a.jpg")
        (root / "labels" / "train").mkdir(parents=True)
        (root / "data.yaml").write_text("train: images/train\nnames: {0: cat, 1: dog}\n")
        return root / "data.yaml", root / "labels" / "train" / "a.txt"
    if fmt == "openimages":
        write_image(root / "validation" / "a.jpg")
        (root / "class-descriptions-boxable.csv").write_text("/m/cat,Cat\n/m/dog,Dog\n")
        return root, root / "validation-annotations-bbox.csv"
    write_image(root / "images" / "a.jpg")
    name = {"cvat": "annotations.xml", "imglab": "faces.xml", "coco": "annotations.json", "txt": "list.txt"}[fmt]
    return root / name, root / name


def check_read(path: Path, fmt: str) -> None:
    """Read ``path`` with ``on_error="warn"``: an index whose invariants hold, or a documented
    detloader error (a ValueError / OSError naming the file)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            index = read_annotations(path, format=fmt, on_error="warn", cache=False, workers=1)
    except (ValueError, OSError) as err:
        assert not isinstance(err, UnicodeError), repr(err)
        assert type(err).__module__.startswith("detloader") or type(err) in (ValueError, FileNotFoundError), repr(err)
        assert path.name in str(err) or "annotation" in str(err), repr(err)
        return
    kinds = {p.kind for p in index.problems}
    assert "reader_error" not in kinds, index.problems.summary()
    for p in index.problems:
        assert p.file and p.message, p
    a = index.arrays()
    width, height, boxes = a["width"], a["height"], a["boxes"]
    assert (width > 0).all() and (height > 0).all()
    assert np.isfinite(boxes).all()
    assert (boxes[:, 0] < boxes[:, 2]).all() and (boxes[:, 1] < boxes[:, 3]).all()
    owner = np.repeat(np.arange(len(width)), np.diff(a["object_offsets"]))
    assert (boxes[:, :2] >= 0).all()
    assert (boxes[:, 2] <= width[owner]).all() and (boxes[:, 3] <= height[owner]).all()
    assert np.isfinite(a["landmarks"]).all()
    assert np.isin(a["visibility"], (0, 1, 2)).all()
    assert len(a["labels"]) == len(boxes) and (a["labels"] >= 0).all()
    for i in range(len(index)):
        rel = index.relative_image_path(i)
        assert not os.path.isabs(rel) and not rel.startswith(".."), rel


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    return {fmt: _dataset(tmp_path_factory.mktemp(fmt), fmt) for fmt in SEEDS}


@pytest.mark.parametrize("fmt", list(SEEDS))
def test_seed_reads_cleanly(datasets, fmt):
    path, file = datasets[fmt]
    file.write_text(SEEDS[fmt])
    index = read_annotations(path, format=fmt, cache=False, workers=1)
    assert len(index) == 1 and not index.problems.errors, index.problems.summary()


@pytest.mark.parametrize("fmt", [f for f in SEEDS if f != "coco"])
@FUZZ
@given(data=st.data())
def test_fuzz_text_readers(datasets, fmt, data):
    path, file = datasets[fmt]
    file.write_bytes(data.draw(mutate_text(SEEDS[fmt]), label="file"))
    check_read(path, fmt)


@FUZZ
@given(data=st.data())
def test_fuzz_coco(datasets, data):
    path, file = datasets["coco"]
    mutate = mutate_json(SEEDS["coco"]) if data.draw(st.integers(0, 3), label="how") else mutate_text(SEEDS["coco"])
    file.write_bytes(data.draw(mutate, label="file"))
    check_read(path, "coco")
