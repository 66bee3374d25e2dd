from __future__ import annotations

import io

from PIL import Image

from detloader.validate_images import check_image


def _png(w: int, h: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h)).save(buf, "PNG")
    return buf.getvalue()


def test_header_checks_report_file_field_and_value(tmp_path) -> None:
    (tmp_path / "ok.png").write_bytes(_png(40, 30))
    (tmp_path / "zero.png").write_bytes(b"")
    (tmp_path / "text.png").write_bytes(b"hello")
    big = bytearray(_png(4, 4))
    big[16:24] = (50000).to_bytes(4, "big") * 2
    (tmp_path / "big.png").write_bytes(bytes(big))
    assert check_image(tmp_path / "ok.png", "a.xml", (40, 30)) == []
    assert [p.kind for p in check_image(tmp_path / "gone.png", "a.xml", (40, 30))] == ["missing_image"]
    assert [p.kind for p in check_image(tmp_path / "zero.png", "a.xml", None)] == ["unreadable_image"]
    assert [p.kind for p in check_image(tmp_path / "text.png", "a.xml", None)] == ["unreadable_image"]
    (bomb,) = check_image(tmp_path / "big.png", "a.xml", None)
    assert bomb.kind == "too_many_pixels" and "50000x50000" in bomb.message
    (mismatch,) = check_image(tmp_path / "ok.png", "a.xml", (64, 48))
    assert mismatch.file == "a.xml" and mismatch.element == "size" and "64x48 != image header 40x30" in mismatch.message


def test_decode_finds_a_truncated_png(tmp_path) -> None:
    data = _png(40, 30)
    (tmp_path / "cut.png").write_bytes(data[: 40])
    assert check_image(tmp_path / "cut.png", "a.xml", (40, 30)) == []
    assert [p.kind for p in check_image(tmp_path / "cut.png", "a.xml", (40, 30), decode=True)] == ["unreadable_image"]


def test_validate_cli_reports_image_problems(tmp_path, capsys) -> None:
    import json

    from detloader.cli.parser import main
    from detloader.synth import make_synthetic

    root = tmp_path / "s"
    make_synthetic(root, 6)
    images = sorted(p for p in root.rglob("*.jpg"))
    images[0].write_bytes(b"")
    code = main(["validate", str(root), "--json", "--decode"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and any(i["kind"] == "unreadable_image" for i in out["items"])


def test_a_missing_image_is_reported_once(tmp_path) -> None:
    from helpers import voc_dataset, voc_object, voc_xml

    from detloader import read_annotations
    from detloader.annotations.problems import Problem
    from detloader.validate_images import check_images

    obj = voc_object("cat", (2, 2, 20, 20))
    root = voc_dataset(tmp_path / "voc", {"a": voc_xml("a.jpg", [obj]), "b": voc_xml("b.jpg", [obj])})
    index = read_annotations(root)
    (root / "JPEGImages" / "a.jpg").unlink()
    # an image named by several rows is checked (and reported) once
    twice = index.subset([0, 0, 1])
    (gone,) = check_images(twice)
    assert (gone.kind, gone.file) == ("missing_image", "Annotations/a.xml")
    # what the reader already reported for that image is not reported again ...
    reader = Problem(
        "missing_image", "Annotations/a.xml", "filename", "filename='a.jpg' not found in JPEGImages/", "image skipped"
    )
    assert check_images(index, reported=[reader]) == []
    # ... but the same kind for another image, or another kind, is no reason to drop it
    other = Problem("missing_image", "Annotations/a.xml", "filename", "filename='c.jpg' not found in JPEGImages/")
    size = Problem("missing_size", "Annotations/a.xml", "size", "filename='a.jpg' unreadable")
    assert [p.kind for p in check_images(index, reported=[other, size])] == ["missing_image"]
