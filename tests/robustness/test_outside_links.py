"""Issue 31, case 10: a folder link that leads out of the dataset (``evil -> /``, ``other ->
../other_dataset``) is not followed, and named: the index holds the dataset's own images only,
and the read ends in seconds instead of listing the whole machine.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from helpers import voc_dataset, voc_object, voc_xml, write_image

from detloader import read_annotations
from detloader.cli import main
from detloader.errors import AnnotationError, ImageFolderWarning

BOX = voc_object("dog", (10, 10, 30, 30))


def _voc(root: Path, stem: str) -> Path:
    return voc_dataset(root, {f"{stem}{i}": voc_xml(f"{stem}{i}.jpg", [BOX]) for i in range(2)})


def _linked(tmp_path: Path) -> Path:
    """``ds`` with ``evil -> /`` and ``other -> ../../other_dataset/...`` in both its folders."""
    root = _voc(tmp_path / "ds", "ds")
    _voc(tmp_path / "other_dataset", "ot")
    for folder in ("Annotations", "JPEGImages"):
        os.symlink("/", root / folder / "evil")
        os.symlink(f"../../other_dataset/{folder}", root / folder / "other")
    return root


@pytest.mark.timeout(20)
def test_links_out_of_the_dataset_are_named_not_followed(tmp_path: Path) -> None:
    root = _linked(tmp_path)
    start = time.perf_counter()
    index = read_annotations(root, on_error="skip")
    assert time.perf_counter() - start < 10  # a walk of / takes far longer
    assert sorted(index.image_paths()) == ["JPEGImages/ds0.jpg", "JPEGImages/ds1.jpg"]
    links = {p.file: p for p in index.problems if p.kind == "link_outside_dataset"}
    assert set(links) == {"Annotations/evil", "Annotations/other", "JPEGImages/evil", "JPEGImages/other"}
    assert {p.kind for p in index.problems} == {"link_outside_dataset"}  # nothing read below them
    target = tmp_path.resolve() / "other_dataset" / "Annotations"
    assert str(links["Annotations/other"]) == (
        f"Annotations/other: a folder link to ../../other_dataset/Annotations ({target}) leaves the dataset; "
        "remove it, or pass allow_outside_images=True (--allow-outside-images) to follow it "
        "(not followed: nothing below it read)"
    )
    assert str(links["Annotations/evil"]).startswith("Annotations/evil: a folder link to / leaves the dataset;")
    assert all(p.severity == "error" for p in links.values())


@pytest.mark.timeout(20)
def test_a_link_out_fails_a_strict_read_by_name(tmp_path: Path) -> None:
    root = _linked(tmp_path)
    with pytest.raises(AnnotationError, match=r"Annotations/evil: a folder link to / leaves the dataset"):
        read_annotations(root)


@pytest.mark.timeout(20)
def test_index_and_validate_name_the_links(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _linked(tmp_path)
    assert main(["index", str(root), "--json"]) == 1  # the links are errors: status 1, the index is read
    assert '"images": 2' in capsys.readouterr().out
    assert main(["validate", str(root)]) == 1
    out = capsys.readouterr().out
    assert "4 errors, 0 repaired: link_outside_dataset: 4" in out
    assert "ds0.jpg" not in out and "ot0" not in out  # nothing of the other dataset


@pytest.mark.timeout(20)
def test_allow_outside_images_follows_links_out(tmp_path: Path) -> None:
    root = _voc(tmp_path / "ds", "ds")
    _voc(tmp_path / "other_dataset", "ot")
    for folder in ("Annotations", "JPEGImages"):
        os.symlink(f"../../other_dataset/{folder}", root / folder / "other")
    index = read_annotations(root, on_error="raise", allow_outside_images=True)
    assert len(index) == 2 + 2 and not index.problems
    assert "JPEGImages/other/ot0.jpg" in index.image_paths()
    assert len(read_annotations(root, on_error="skip")) == 2  # not followed without the option


def test_links_inside_the_dataset_keep_working(tmp_path: Path) -> None:
    root = _voc(tmp_path / "ds", "ds")
    (root / "more").mkdir()
    (root / "more" / "m0.xml").write_text(voc_xml("m0.jpg", [BOX]))
    write_image(root / "JPEGImages" / "m0.jpg")
    os.symlink("../more", root / "Annotations" / "more")
    index = read_annotations(root)
    assert len(index) == 3 and not index.problems


def test_a_layout_folder_that_is_a_link_is_read(tmp_path: Path) -> None:
    """The layout's own folders may lie elsewhere (images on another disk): only links met
    below them are checked."""
    images = tmp_path / "disk" / "JPEGImages"
    root = _voc(tmp_path / "ds", "ds")
    images.parent.mkdir()
    (root / "JPEGImages").rename(images)
    os.symlink(images, root / "JPEGImages")
    assert len(read_annotations(root)) == 2


@pytest.mark.timeout(20)
def test_the_image_search_names_links_out_and_does_not_walk_them(tmp_path: Path) -> None:
    """Images not where the layout says: the search below the root skips ``evil -> /``."""
    root = tmp_path / "ds"
    (root / "Annotations").mkdir(parents=True)
    (root / "JPEGImages").mkdir()
    for i in range(3):
        (root / "Annotations" / f"a{i}.xml").write_text(voc_xml(f"a{i}.jpg", [BOX]))
        write_image(root / "pics" / f"a{i}.jpg")
    os.symlink("/", root / "evil")
    with pytest.warns(ImageFolderWarning, match="read from there"):
        index = read_annotations(root, on_error="skip")
    assert len(index) == 3 and index.meta["image_search"]["folder"] == "pics"
    links = [p for p in index.problems if p.kind == "link_outside_dataset"]
    assert [(p.file, p.action, p.severity) for p in links] == [("evil", "not searched for images", "repaired")]


@pytest.mark.timeout(20)
def test_yolo_images_below_a_link_out_are_not_listed(tmp_path: Path) -> None:
    root = tmp_path / "yolo"
    for i in range(2):
        write_image(root / "images" / f"a{i}.jpg")
        (root / "labels").mkdir(parents=True, exist_ok=True)
        (root / "labels" / f"a{i}.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    os.symlink("/", root / "images" / "evil")
    index = read_annotations(root, format="yolo", on_error="skip")
    assert sorted(index.image_paths()) == ["images/a0.jpg", "images/a1.jpg"]
    assert [(p.kind, p.file) for p in index.problems] == [("link_outside_dataset", "images/evil")]
