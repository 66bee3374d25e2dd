"""Hostile input: bad values, paths that leave the dataset, and a generated corpus of broken
files. Every read either returns an index (problems reported, naming file, element and value)
or raises a documented detloader error; nothing else escapes a reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import voc_dataset, voc_object, voc_xml, write_image

from detloader import AnnotationError, read_annotations


def _read(path: Path, **kw):
    with pytest.warns(UserWarning):
        return read_annotations(path, on_error="warn", cache=False, **kw)


def _problems(index, kind: str | None = None) -> list[str]:
    return [str(p) for p in index.problems if kind is None or p.kind == kind]


# -- 1. one bad value never aborts the read ---------------------------------------------------
HUGE = ["inf", "1e309", str(2**31), str(2**64), "-inf", "nan"]


@pytest.mark.parametrize("value", HUGE)
def test_voc_huge_size_is_a_problem_not_an_overflow(tmp_path, value):
    files = {
        "a": voc_xml("a.jpg", [voc_object("cat", (1, 1, 9, 9))], extra="").replace(
            "<width>64</width>", f"<width>{value}</width>"
        ),
        "b": voc_xml("b.jpg", [voc_object("dog", (1, 1, 9, 9))]),
    }
    root = voc_dataset(tmp_path, files)
    index = _read(root)
    assert len(index) == 2  # the size came from the image header for a.jpg
    shown = _problems(index, "missing_size") + _problems(index, "bad_value")
    assert any("Annotations/a.xml" in s and value in s for s in shown), shown


@pytest.mark.parametrize("value", ["1e309", "inf", "nan", "abc", str(2**200)])
def test_voc_bad_coordinate_names_file_element_value(tmp_path, value):
    files = {"a": voc_xml("a.jpg", [voc_object("cat", (1, 1, value, 9)), voc_object("cat", (1, 1, 9, 9))])}
    index = _read(voc_dataset(tmp_path, files))
    assert index.num_objects == 1
    text = " ".join(_problems(index))
    assert "Annotations/a.xml" in text and "object[1]" in text


def _cvat(tmp_path: Path, images: str) -> Path:
    write_image(tmp_path / "images" / "a.jpg")
    write_image(tmp_path / "images" / "b.jpg")
    path = tmp_path / "annotations.xml"
    path.write_text(f"<annotations><version>1.1</version>{images}</annotations>", encoding="utf-8")
    return path


def _cvat_box(extra: str = "", box=(1, 1, 9, 9)) -> str:
    x1, y1, x2, y2 = box
    return f'<box label="face" occluded="0" xtl="{x1}" ytl="{y1}" xbr="{x2}" ybr="{y2}"{extra}></box>'


@pytest.mark.parametrize("value", HUGE)
def test_cvat_huge_size(tmp_path, value):
    path = _cvat(
        tmp_path,
        f'<image id="0" name="a.jpg" width="{value}" height="48">{_cvat_box()}</image>'
        f'<image id="1" name="b.jpg" width="64" height="48">{_cvat_box()}</image>',
    )
    index = _read(path)
    assert len(index) == 2
    assert any("annotations.xml" in s and value in s for s in _problems(index)), _problems(index)


@pytest.mark.parametrize("rotation", ["inf", "nan", "1e309", "-inf", "abc"])
def test_cvat_rotation_not_finite(tmp_path, rotation):
    path = _cvat(
        tmp_path,
        f'<image id="0" name="a.jpg" width="64" height="48">{_cvat_box(f" rotation={chr(34)}{rotation}{chr(34)}")}'
        f"{_cvat_box()}</image>",
    )
    index = _read(path)
    assert index.num_objects == 1
    shown = _problems(index)
    assert any("annotations.xml" in s and "rotation" in s and rotation in s for s in shown), shown


@pytest.mark.parametrize("value", ["1e309", "inf", str(2**31), str(2**64)])
def test_cvat_huge_image_id(tmp_path, value):
    path = _cvat(tmp_path, f'<image id="{value}" name="a.jpg" width="64" height="48">{_cvat_box()}</image>')
    index = _read(path) if False else read_annotations(path, on_error="skip", cache=False)
    assert len(index) == 1


def _coco(tmp_path: Path, images: list, annotations: list, categories=None) -> Path:
    write_image(tmp_path / "images" / "a.jpg")
    write_image(tmp_path / "images" / "b.jpg")
    data = {"images": images, "annotations": annotations, "categories": categories or [{"id": 1, "name": "cat"}]}
    path = tmp_path / "annotations.json"
    path.write_text(json.dumps(data, allow_nan=True).replace('"__INF__"', "Infinity").replace('"__BIG__"', "1e309"))
    return path


def _img(i, name, w=64, h=48):
    return {"id": i, "file_name": name, "width": w, "height": h}


def _ann(i, image, cat, bbox):
    return {"id": i, "image_id": image, "category_id": cat, "bbox": bbox, "iscrowd": 0}


@pytest.mark.parametrize("value", ["__INF__", "__BIG__", 2**31, 2**64, -(2**70), 1e300, True, [64], {"w": 64}])
def test_coco_huge_or_wrong_size(tmp_path, value):
    path = _coco(
        tmp_path,
        [_img(1, "a.jpg", w=value), _img(2, "b.jpg")],
        [_ann(1, 1, 1, [1, 1, 5, 5]), _ann(2, 2, 1, [1, 1, 5, 5])],
    )
    index = _read(path)
    assert len(index) == 2
    assert any("annotations.json" in s and "images[0]" in s for s in _problems(index)), _problems(index)


@pytest.mark.parametrize("value", [[1], {"a": 1}, "__INF__", "__BIG__", 1.5, None, True, 2**70])
@pytest.mark.parametrize("where", ["image_id", "category_id", "id"])
def test_coco_ids_of_the_wrong_type(tmp_path, where, value):
    images = [_img(1, "a.jpg"), _img(2, "b.jpg")]
    anns = [_ann(1, 1, 1, [1, 1, 5, 5]), _ann(2, 2, 1, [1, 1, 5, 5])]
    anns[0][where] = value
    index = read_annotations(_coco(tmp_path, images, anns), on_error="skip", cache=False)
    assert index.num_objects >= 1
    if where != "id":
        assert any("annotations[0]" in s for s in _problems(index)), _problems(index)


@pytest.mark.parametrize("value", [[1], {"a": 1}, "__INF__", 1.5, True])
def test_coco_image_and_category_ids_of_the_wrong_type(tmp_path, value):
    images = [_img(value, "a.jpg"), _img(2, "b.jpg")]
    cats = [{"id": value, "name": "dog"}, {"id": 1, "name": "cat"}]
    anns = [_ann(1, 2, 1, [1, 1, 5, 5])]
    index = read_annotations(_coco(tmp_path, images, anns, cats), on_error="skip", cache=False)
    assert index.num_objects == 1
    shown = _problems(index)
    assert any("images[0]" in s for s in shown) and any("categories[0]" in s for s in shown), shown


@pytest.mark.parametrize("value", ["__INF__", "__BIG__", "nan", 1e300, [1], {"x": 1}])
def test_coco_bbox_values(tmp_path, value):
    path = _coco(tmp_path, [_img(1, "a.jpg")], [_ann(1, 1, 1, [1, 1, value, 5]), _ann(2, 1, 1, [1, 1, 5, 5])])
    index = read_annotations(path, on_error="skip", cache=False)
    assert index.num_objects == 1
    assert any("annotations[0]" in s for s in _problems(index))


def test_raise_policy_raises_annotation_error_naming_the_file(tmp_path):
    path = _coco(tmp_path, [_img(1, "a.jpg")], [_ann(1, 1, [7], [1, 1, 5, 5])])
    with pytest.raises(AnnotationError, match=r"annotations.json: annotations\[0\]/category_id: category_id=\[7\]"):
        read_annotations(path, cache=False)


# -- 7. paths that leave the dataset are reported, never followed -----------------------------
def _outside(tmp_path: Path) -> tuple[Path, Path]:
    """A dataset folder ``ds`` and an image beside it, outside the dataset."""
    secret = write_image(tmp_path / "secret.jpg")
    ds = tmp_path / "ds"
    write_image(ds / "images" / "a.jpg")
    return ds, secret


@pytest.mark.parametrize("kind", ["relative", "absolute"])
def test_coco_file_name_outside_the_dataset(tmp_path, kind):
    ds, secret = _outside(tmp_path)
    name = "../../secret.jpg" if kind == "relative" else str(secret)
    data = {"images": [_img(1, name), _img(2, "a.jpg")], "annotations": [], "categories": []}
    (ds / "annotations.json").write_text(json.dumps(data))
    index = read_annotations(ds / "annotations.json", on_error="skip", cache=False)
    assert [index.relative_image_path(i) for i in range(len(index))] == ["images/a.jpg"]
    shown = _problems(index, "outside_dataset")
    assert shown and "annotations.json: images[0]/file_name" in shown[0] and name in shown[0]
    with pytest.raises(AnnotationError, match="leaves the dataset"):
        read_annotations(ds / "annotations.json", cache=False)


def test_coco_escaping_name_whose_base_name_is_inside_is_repaired(tmp_path):
    ds, _ = _outside(tmp_path)
    data = {"images": [_img(1, "../../../../a.jpg")], "annotations": [], "categories": []}
    (ds / "annotations.json").write_text(json.dumps(data))
    index = read_annotations(ds / "annotations.json", cache=False)  # a repair never raises
    assert index.relative_image_path(0) == "images/a.jpg"
    assert [p.severity for p in index.problems if p.kind == "outside_dataset"] == ["repaired"]


def test_absolute_name_inside_the_dataset_is_fine(tmp_path):
    ds, _ = _outside(tmp_path)
    data = {"images": [_img(1, str(ds / "images" / "a.jpg"))], "annotations": [], "categories": []}
    (ds / "annotations.json").write_text(json.dumps(data))
    index = read_annotations(ds / "annotations.json", cache=False)
    assert index.relative_image_path(0) == "images/a.jpg" and not index.problems


@pytest.mark.parametrize("fmt", ["voc", "cvat", "imglab", "txt"])
def test_other_formats_do_not_follow_escaping_names(tmp_path, fmt):
    ds, secret = _outside(tmp_path)
    name = "../../secret.jpg"
    if fmt == "voc":
        (ds / "Annotations").mkdir()
        (ds / "JPEGImages").mkdir()
        (ds / "Annotations" / "x.xml").write_text(voc_xml(name, [voc_object("cat", (1, 1, 9, 9))]))
        path = ds
    elif fmt == "cvat":
        path = ds / "annotations.xml"
        path.write_text(
            '<annotations><version>1.1</version>'
            f'<image id="0" name="{name}" width="64" height="48"></image></annotations>'
        )
    elif fmt == "imglab":
        path = ds / "faces.xml"
        path.write_text(
            f"<?xml version='1.0'?><dataset><images><image file='{name}' width='64' height='48'/></images></dataset>"
        )
    else:
        path = ds / "list.txt"
        path.write_text(f"{name} cat\nimages/a.jpg cat\n")
    index = read_annotations(path, on_error="skip", cache=False)
    assert all("secret" not in index.relative_image_path(i) for i in range(len(index)))
    assert any(p.kind == "outside_dataset" for p in index.problems), index.problems.summary()


# -- the last line of defence: a reader gap costs one file, never the read ------------------
def test_unforeseen_reader_error_becomes_a_problem_of_that_file(tmp_path, monkeypatch):
    from detloader.annotations.readers import voc

    files = {
        "a": voc_xml("a.jpg", [voc_object("cat", (1, 1, 9, 9))]),
        "b": voc_xml("b.jpg", [voc_object("cat", (1, 1, 9, 9))]),
    }
    root = voc_dataset(tmp_path, files)
    real = voc.parse_object

    def boom(obj, where, b):
        if b.file.endswith("a.xml"):
            raise TypeError("unforeseen")
        return real(obj, where, b)

    monkeypatch.setattr(voc, "parse_object", boom)
    index = read_annotations(root, on_error="skip", cache=False, workers=1)
    assert index.num_objects == 1
    (p,) = [p for p in index.problems if p.kind == "reader_error"]
    assert p.file == "Annotations/a.xml" and "TypeError: unforeseen" in p.message


# -- the hostile corpus -----------------------------------------------------------------------
# Each case is one broken annotation file, written into a dataset that also holds one good
# image; the read must finish with the listed problem kind (or none, where the file is valid)
# and never raise anything but AnnotationError. ``python tests/robustness/test_hostile_annotations.py``
# prints the table of docs/reliability.md (behaviour, time and peak memory per case).
_DTD_BOMB = (
    '<!DOCTYPE r [<!ENTITY a "aaaaaaaaaa">'
    + "".join(f'<!ENTITY {c} "{("&" + p + ";") * 10}">' for p, c in zip("abcdefgh", "bcdefghi"))
    + "]>"
)
_DTD_EXTERNAL = '<!DOCTYPE r [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
_DEEP = "<d>" * 10_000 + "</d>" * 10_000


def _xml_doc(fmt: str, box=(1, 1, 9, 9), name: str = "cat", width="64") -> str:
    x1, y1, x2, y2 = box
    if fmt == "voc":
        body = voc_xml("a.jpg", [voc_object(name, box)]).replace("<width>64</width>", f"<width>{width}</width>")
        return f'<?xml version="1.0"?>{body}'
    if fmt == "cvat":
        return (
            '<?xml version="1.0"?><annotations><version>1.1</version>'
            f'<image id="0" name="a.jpg" width="{width}" height="48">'
            f'<box label="{name}" occluded="0" xtl="{x1}" ytl="{y1}" xbr="{x2}" ybr="{y2}"></box></image></annotations>'
        )
    return (
        f"<?xml version='1.0'?><dataset><images><image file='a.jpg' width='{width}' height='48'>"
        f"<box top='{y1}' left='{x1}' width='{x2}' height='{y2}'><label>{name}</label></box></image></images></dataset>"
    )


_ROOTS = {"voc": "annotation", "cvat": "annotations", "imglab": "dataset"}


def _xml_cases(fmt: str) -> dict[str, tuple[bytes, set[str]]]:
    doc = _xml_doc(fmt)
    root = _ROOTS[fmt]
    bad_box = "empty_box" if fmt != "imglab" else "empty_box"
    return {
        "entity bomb": (
            doc.replace("?>", "?>" + _DTD_BOMB, 1).replace(">cat<", ">&i;<").replace('"cat"', '"&i;"').encode(),
            {"unsafe_xml"},
        ),
        "external entity": (
            doc.replace("?>", "?>" + _DTD_EXTERNAL, 1).replace(">cat<", ">&x;<").replace('"cat"', '"&x;"').encode(),
            {"unsafe_xml"},
        ),
        "10k-deep nesting": (doc.replace(f"</{root}>", _DEEP + f"</{root}>").encode(), {"unparseable"}),
        "truncated": (doc.encode()[: len(doc) * 2 // 3], {"unparseable"}),
        "wrong root": (b"<html><body><p>not annotations</p></body></html>", {"unsupported"}),
        "zero bytes": (b"", {"unparseable"}),
        "not UTF-8": (doc.encode().replace(b"cat", b"\xff\xfe"), {"unparseable"}),
        "text in a number": (_xml_doc(fmt, box=(1, "abc", 9, 9)).encode(), {"bad_value"}),
        "NaN in a number": (
            _xml_doc(fmt, box=(1, 1, "nan", 9)).encode(),
            {"non_finite"} if fmt != "imglab" else {"non_finite"},
        ),
        "inverted box": (_xml_doc(fmt, box=(9, 9, 1, 1) if fmt != "imglab" else (9, 9, -8, -8)).encode(), {bad_box}),
        "size 1e309": (_xml_doc(fmt, width="1e309").encode(), {"missing_size"}),
    }


def _coco_doc(bbox=(1, 1, 8, 8), width: object = 64) -> str:
    w = width if isinstance(width, str) else json.dumps(width)
    box = ", ".join(
        str(v) if not isinstance(v, str) or v in ("NaN", "Infinity", "1e309") else json.dumps(v) for v in bbox
    )
    return (
        f'{{"images": [{{"id": 1, "file_name": "a.jpg", "width": {w}, "height": 48}}],'
        f'"annotations": [{{"id": 1, "image_id": 1, "category_id": 1, "bbox": [{box}]}}],'
        f'"categories": [{{"id": 1, "name": "cat"}}]}}'
    )


def _coco_cases() -> dict[str, tuple[bytes, set[str]]]:
    doc = _coco_doc()
    return {
        "10k-deep nesting": (('{"images": ' + "[" * 10_000 + "]" * 10_000 + "}").encode(), {"unparseable"}),
        "truncated": (doc.encode()[: len(doc) * 2 // 3], {"unparseable"}),
        "wrong root": (b"[1, 2, 3]", {"unsupported"}),
        "zero bytes": (b"", {"unparseable"}),
        "not UTF-8": (doc.encode().replace(b"cat", b"\xff\xfe"), {"unparseable"}),
        "text in a number": (_coco_doc(bbox=(1, "abc", 8, 8)).encode(), {"bad_value"}),
        "NaN in a number": (_coco_doc(bbox=(1, 1, "NaN", 8)).encode(), {"non_finite"}),
        "inverted box": (_coco_doc(bbox=(9, 9, -8, -8)).encode(), {"empty_box"}),
        "size 1e309": (_coco_doc(width="1e309").encode(), {"missing_size"}),
        "id is a list": (doc.replace('"image_id": 1', '"image_id": [1]').encode(), {"bad_value"}),
    }


def _line_cases(fmt: str) -> dict[str, tuple[bytes, set[str]]]:
    if fmt == "yolo":
        good, line = "0 0.5 0.5 0.2 0.2", "0 {} 0.5 {} 0.2"
    else:
        good, line = "images/a.jpg cat", None
    # a txt file is recognised by its lines: one that is no list is refused as a whole
    refused = {"!ValueError"} if fmt == "txt" else None
    cases = {
        "zero bytes": (b"", refused or set()),  # YOLO: an empty label file is a background image
        "not UTF-8": (b"\xff\xfe\x00garbage\n", refused or {"unparseable"}),
        "truncated": (good[: len(good) // 2].encode(), refused or {"bad_value"}),
    }
    if line is not None:
        cases.update(
            {
                "text in a number": (line.format("abc", 0.2).encode(), {"bad_value"}),
                "NaN in a number": (line.format("nan", 0.2).encode(), {"non_finite"}),
                "inverted box": (line.format(0.5, -0.2).encode(), {"empty_box"}),
                "value 1e309": (line.format("1e309", 0.2).encode(), {"non_finite"}),
            }
        )
    return cases


def _write_case(tmp: Path, fmt: str, data: bytes) -> Path:
    """A dataset holding image ``a.jpg`` and the annotation file ``data``; the path to read."""
    if fmt == "voc":
        write_image(tmp / "JPEGImages" / "a.jpg")
        (tmp / "Annotations").mkdir(parents=True)
        (tmp / "Annotations" / "a.xml").write_bytes(data)
        return tmp
    if fmt == "yolo":
        write_image(tmp / "images" / "train" / "a.jpg")
        (tmp / "labels" / "train").mkdir(parents=True)
        (tmp / "labels" / "train" / "a.txt").write_bytes(data)
        (tmp / "data.yaml").write_text("train: images/train\nnames: {0: cat}\n")
        return tmp / "data.yaml"
    write_image(tmp / "images" / "a.jpg")
    name = {"cvat": "annotations.xml", "imglab": "faces.xml", "coco": "annotations.json", "txt": "list.txt"}[fmt]
    (tmp / name).write_bytes(data)
    return tmp / name


def hostile_corpus() -> list[tuple[str, str, bytes, set[str]]]:
    """``(format, case, file bytes, expected problem kinds)`` for every reader."""
    out = []
    for fmt in ("voc", "cvat", "imglab"):
        out += [(fmt, case, data, kinds) for case, (data, kinds) in _xml_cases(fmt).items()]
    out += [("coco", case, data, kinds) for case, (data, kinds) in _coco_cases().items()]
    for fmt in ("yolo", "txt"):
        out += [(fmt, case, data, kinds) for case, (data, kinds) in _line_cases(fmt).items()]
    return out


_CORPUS = hostile_corpus()


def read_case(tmp: Path, fmt: str, data: bytes):
    """Read one corpus case with ``on_error="skip"``: the index."""
    path = _write_case(tmp, fmt, data)
    return read_annotations(path, format=fmt, on_error="skip", cache=False, workers=1)


@pytest.mark.parametrize("fmt,case,data,kinds", _CORPUS, ids=[f"{f}-{c}" for f, c, _, _ in _CORPUS])
def test_hostile_corpus(tmp_path, fmt, case, data, kinds):
    if kinds == {"!ValueError"}:  # refused whole, naming the file
        with pytest.raises(ValueError, match=r"list\.txt"):
            read_case(tmp_path, fmt, data)
        return
    index = read_case(tmp_path, fmt, data)
    found = {p.kind for p in index.problems}
    assert kinds <= found, index.problems.summary()
    assert "reader_error" not in found, index.problems.summary()
    if index.problems.errors:
        with pytest.raises(AnnotationError):
            read_annotations(_write_case(tmp_path / "again", fmt, data), format=fmt, cache=False, workers=1)


def _measure_main() -> None:  # pragma: no cover - prints the table of docs/reliability.md
    import subprocess
    import sys
    import tempfile

    code = (
        "import sys, time, resource, pathlib; sys.path[:0] = ['tests/robustness', 'tests', 'src'];"
        "import test_hostile_annotations as t; fmt, case = sys.argv[1], sys.argv[2];"
        "data = next(d for f, c, d, _ in t._CORPUS if f == fmt and c == case);"
        "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss;"
        "t0 = time.perf_counter(); idx = t.read_case(pathlib.Path(sys.argv[3]), fmt, data);"
        "dt = time.perf_counter() - t0; peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss;"
        "kinds = sorted({p.kind for p in idx.problems});"
        "print(f'{dt * 1000:.1f}\\t{(peak - base) / 1024:.1f}\\t{len(idx)}\\t{idx.num_objects}\\t' + ', '.join(kinds))"
    )
    print("| format | case | bytes | outcome (images, objects) | problems | time (ms) | extra peak RSS (MiB) |")
    print("|---|---|---|---|---|---|---|")
    for fmt, case, data, _ in _CORPUS:
        with tempfile.TemporaryDirectory() as tmp:
            out = subprocess.run([sys.executable, "-c", code, fmt, case, tmp], capture_output=True, text=True)
        if out.returncode:
            error = out.stderr.strip().splitlines()[-1].split(tmp)[-1].replace("|", "/")
            print(f"| {fmt} | {case} | {len(data)} | refused | {error} | | |")
            continue
        ms, mib, n, m, kinds = out.stdout.rstrip("\n").split("\t")
        print(f"| {fmt} | {case} | {len(data)} | read ({n}, {m}) | {kinds} | {ms} | {mib} |")


if __name__ == "__main__":
    _measure_main()


@pytest.mark.parametrize("visible", ["inf", "1e309", "nan", "-inf"])
def test_voc_keypoint_visibility_not_finite(tmp_path, visible):
    """Found by the fuzzer: ``visible="inf"`` raised OverflowError."""
    lm = f'<keypoints><keypoint name="nose" x="3" y="3" visible="{visible}"/></keypoints>'
    files = {"a": voc_xml("a.jpg", [voc_object("cat", (1, 1, 9, 9), extra=lm)])}
    index = read_annotations(voc_dataset(tmp_path, files), on_error="skip", cache=False)
    assert index.num_objects == 1
    assert any("object[1]/keypoints" in s and visible in s for s in _problems(index, "bad_value")), _problems(index)


def test_cli_follows_outside_images_only_when_asked(tmp_path, capsys):
    from detloader.cli import main

    ds, secret = _outside(tmp_path)
    data = {"images": [_img(1, "../secret.jpg")], "annotations": [], "categories": []}
    (ds / "annotations.json").write_text(json.dumps(data))
    assert main(["index", str(ds / "annotations.json"), "--json", "--no-cache"]) == 2  # nothing indexed
    refused = capsys.readouterr().err
    assert "every image was dropped (outside_dataset: 1)" in refused and "--allow-outside-images" in refused
    assert main(["index", str(ds / "annotations.json"), "--json", "--no-cache", "--allow-outside-images"]) == 0
    followed = json.loads(capsys.readouterr().out)
    assert followed["images"] == 1 and followed["problems"] == {}
