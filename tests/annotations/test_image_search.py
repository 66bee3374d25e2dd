"""Finding the images: image_dir (relative to the dataset root), the search for the image
folder when the layout's holds none of the images, its cache key, forced formats that find
nothing, and the hint under many missing images."""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from pathlib import Path

import pytest
from helpers import voc_dataset, voc_xml, write_image
from hypothesis import given, settings
from hypothesis import strategies as st

import detloader.annotations.read as read_module
from detloader import AnnotationError, read_annotations
from detloader.annotations.image_search import find_image_folder, should_search
from detloader.errors import ImageFolderWarning


def _coco(root: Path, names: list[str], json_name: str = "annotations/my_export.json") -> Path:
    data = {
        "images": [{"id": i, "file_name": n, "width": 64, "height": 48} for i, n in enumerate(names)],
        "annotations": [{"id": 1, "image_id": 0, "category_id": 1, "bbox": [1, 1, 10, 10]}],
        "categories": [{"id": 1, "name": "cell"}],
    }
    path = root / json_name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def _images(folder: Path, names: list[str]) -> None:
    for name in names:
        write_image(folder / name)


def _cvat(path: Path, names: list[str]) -> Path:
    images = "".join(f'<image id="{i}" name="{n}" width="64" height="48"></image>' for i, n in enumerate(names))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"<annotations><version>1.1</version>{images}</annotations>")
    return path


NAMES = ["a.jpg", "b.jpg", "c.jpg", "d.jpg"]


def test_coco_export_with_images_in_a_sibling_folder(tmp_path):
    _coco(tmp_path, NAMES)
    _images(tmp_path / "train2017", NAMES)
    _images(tmp_path / "other", NAMES[:1])  # holds fewer of the names: not chosen
    with pytest.warns(
        ImageFolderWarning,
        match=r"4 of 4 images not found in \., annotations; 4 of 4 names looked for are in train2017/",
    ):
        index = read_annotations(tmp_path)  # on_error="raise": the first read's missing images do not count
    assert len(index) == 4 and index.num_objects == 1
    assert index.relative_image_path(0) == os.path.join("train2017", "a.jpg")
    assert index.meta["image_search"]["folder"] == "train2017"
    (note,) = index.problems
    assert note.kind == "images_found_elsewhere" and note.severity == "repaired"
    assert note.file == os.path.join("annotations", "my_export.json") and "image_dir='train2017'" in note.action


def test_cvat_export_with_images_in_a_folder_of_its_own_name(tmp_path):
    export = tmp_path / "task_7"
    _cvat(export / "annotations.xml", ["frame_0.jpg", "frame_1.jpg", "frame_2.jpg"])
    _images(export / "task_7", ["frame_0.jpg", "frame_1.jpg", "frame_2.jpg"])
    with pytest.warns(ImageFolderWarning, match="are in task_7/"):
        index = read_annotations(export / "annotations.xml")
    assert len(index) == 3 and index.relative_image_path(2) == os.path.join("task_7", "frame_2.jpg")


def test_folder_holding_a_vocdevkit_needs_no_search(tmp_path):
    devkit = tmp_path / "download" / "VOCdevkit" / "VOC2007"
    voc_dataset(devkit, {"000001": voc_xml("000001.jpg"), "000002": voc_xml("000002.jpg")})
    with warnings.catch_warnings():
        warnings.simplefilter("error", ImageFolderWarning)
        index = read_annotations(tmp_path / "download")  # read as VOCdevkit/VOC2007
    assert len(index) == 2 and index.root == devkit.resolve()
    assert index.relative_image_path(0) == os.path.join("JPEGImages", "000001.jpg")


def test_no_search_when_the_layout_holds_most_images_or_image_dir_is_given(tmp_path):
    _coco(tmp_path, NAMES)
    _images(tmp_path / "images", NAMES[:3])  # the layout's folder: 3 of 4
    _images(tmp_path / "train2017", NAMES)
    index = read_annotations(tmp_path, on_error="skip")
    assert len(index) == 3 and "image_search" not in index.meta
    assert index.problems.counts() == {"missing_image": 1}
    (tmp_path / "empty").mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ImageFolderWarning)
        explicit = read_annotations(tmp_path, image_dir="empty", on_error="skip")
    assert len(explicit) == 0 and explicit.problems.counts() == {"missing_image": 4}
    assert "image_search" not in explicit.meta


def test_search_finds_nothing_keeps_the_missing_images(tmp_path):
    _coco(tmp_path, NAMES)
    _images(tmp_path / "pictures", ["x.jpg"])
    index = read_annotations(tmp_path, on_error="skip")
    assert len(index) == 0 and index.problems.counts() == {"missing_image": 4}


def test_cache_follows_the_folder_found(tmp_path, monkeypatch):
    _coco(tmp_path, NAMES)
    _images(tmp_path / "valid", NAMES)
    builds = []
    real = read_module.build_index
    monkeypatch.setattr(read_module, "build_index", lambda *a, **k: builds.append(1) or real(*a, **k))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ImageFolderWarning)
        assert len(read_annotations(tmp_path)) == 4
        assert len(builds) == 2  # the layout's folders, then the folder found
        warm = read_annotations(tmp_path)
        assert len(builds) == 2 and len(warm) == 4 and warm.meta["image_search"]["folder"] == "valid"
        (tmp_path / "valid" / "d.jpg").unlink()  # the folder found changes: rebuilt
        index = read_annotations(tmp_path, on_error="skip")
        assert len(builds) == 4 and len(index) == 3
    _images(tmp_path / "images", NAMES)  # now the layout's place has them: no search
    index = read_annotations(tmp_path)
    assert len(builds) == 5 and len(index) == 4 and "image_search" not in index.meta
    assert index.relative_image_path(0) == os.path.join("images", "a.jpg")


def test_relative_image_dir_is_relative_to_the_dataset_root(tmp_path, monkeypatch):
    root = tmp_path / "coco"
    path = _coco(root, NAMES[:2])
    _images(root / "pics", NAMES[:2])
    monkeypatch.chdir(tmp_path)  # "pics" is not in the working directory
    index = read_annotations(path, image_dir="pics")
    assert len(index) == 2 and index.relative_image_path(1) == os.path.join("pics", "b.jpg")
    assert len(read_annotations(path, image_dir="coco/pics")) == 2  # else relative to the working directory
    with pytest.raises(FileNotFoundError, match=r"image_dir='nowhere' is not a folder \(looked for .*coco/nowhere"):
        read_annotations(path, image_dir="nowhere")


def test_forced_format_that_finds_nothing_names_folder_and_format(tmp_path):
    root = voc_dataset(tmp_path / "voc", {"a": voc_xml("a.jpg")})
    with pytest.raises(
        ValueError, match=r"voc: format='yolo' found 1 images but no label files there; it looks like voc"
    ):
        read_annotations(root, format="yolo")
    (tmp_path / "nothing").mkdir()
    with pytest.raises(ValueError, match=r"nothing: format='voc' found no annotation files there"):
        read_annotations(tmp_path / "nothing", format="voc")


def test_many_missing_images_hint_image_dir_and_images_by(tmp_path):
    _coco(tmp_path, NAMES)
    with pytest.raises(AnnotationError, match=r"not found .*hint: images elsewhere\? pass image_dir= .*images_by='id'"):
        read_annotations(tmp_path)
    index = read_annotations(tmp_path, on_error="skip")
    assert "    hint: images elsewhere? pass image_dir= (detloader --image-dir DIR" in index.problems.summary()
    _images(tmp_path / "images", NAMES[1:])
    one_missing = read_annotations(tmp_path, on_error="skip")
    assert one_missing.problems.counts() == {"missing_image": 1} and "hint" not in one_missing.problems.summary()


def test_find_image_folder_bounds_and_ties(tmp_path):
    _images(tmp_path / "a" / "b" / "c" / "d" / "e", ["x.jpg", "y.jpg"])  # level 5: beyond the depth
    _images(tmp_path / "one", ["x.png"])  # same stem, other extension
    _images(tmp_path / "two", ["x.jpg"])
    _images(tmp_path / "deep" / "er", ["y.jpg"])
    assert find_image_folder(tmp_path, ["img/x.jpg", "y.jpg"]).folder == "one"  # tie: name order
    assert find_image_folder(tmp_path, ["x.jpg"], skip=["one"]).folder == "two"
    assert find_image_folder(tmp_path, ["x.jpg", "y.jpg"], max_depth=5).folder == os.path.join("a", "b", "c", "d", "e")
    assert find_image_folder(tmp_path, ["x.jpg", "y.jpg"], max_folders=2) is None  # the root and a/ only
    assert find_image_folder(tmp_path, ["z.jpg"]) is None
    assert should_search(0, 5) and should_search(1, 20) and not should_search(1, 5) and not should_search(0, 0)


@settings(max_examples=30, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["", "a", "b", "a/c", "b/d", "a/c/e"]),
        st.sets(st.sampled_from(["1.jpg", "2.jpg", "3.png", "4.jpg", "notes.txt"]), min_size=1),
        min_size=1,
    ),
    st.sets(st.sampled_from(["1.jpg", "x/2.jpg", "3.jpg", "4.jpg"]), min_size=1),
)
def test_the_folder_found_holds_the_most_names(layout, names):
    def holds(folder: str) -> int:
        files = layout.get(folder, set())
        stems = {os.path.splitext(f)[0] for f in files if not f.endswith(".txt")}
        return sum(
            1 for n in names if os.path.basename(n) in files or os.path.splitext(os.path.basename(n))[0] in stems
        )

    with tempfile.TemporaryDirectory() as tmp:
        for folder, files in layout.items():
            os.makedirs(os.path.join(tmp, folder), exist_ok=True)
            for name in files:
                Path(tmp, folder, name).touch()  # names are compared: nothing is opened
        hit = find_image_folder(tmp, names)
    best = max(holds(f) for f in layout)
    if best == 0:
        assert hit is None
    else:
        assert hit is not None and hit.hits == best == holds(hit.folder) and hit.names == len(names)
