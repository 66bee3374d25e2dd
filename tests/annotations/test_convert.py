"""Writers (VOC, COCO, YOLO) and ``detloader convert``: read -> write -> read gives the same index."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from helpers import write_image
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from detloader import AnnotationError, LandmarkSchema, read_annotations
from detloader.annotations.landmarks import IBUG68
from detloader.annotations.writers import write_annotations, write_coco, write_voc, write_yolo
from detloader.cli import main

# unsplit indexes written as YOLO warn that val names the training images (tested below)
pytestmark = pytest.mark.filterwarnings("ignore::detloader.annotations.writers.yolo.YoloExportWarning")

GEOMETRY = ("width", "height", "object_offsets", "boxes", "labels", "landmarks", "visibility")
EVERYTHING = GEOMETRY + (
    "difficult",
    "truncated",
    "occluded",
    "image_labels",
    "image_attributes",
    "object_attributes",
)


def _keys(index) -> list[str]:
    """Image paths below the images' common folder (what the writers mirror)."""
    paths = [str(index.image_path(i)) for i in range(len(index))]
    common = os.path.commonpath([os.path.dirname(p) for p in paths]) if paths else ""
    return [os.path.relpath(p, common) for p in paths]


def assert_same(a, b, fields=EVERYTHING, *, vocab: bool | None = True) -> None:
    """Same images (matched by file name and folder: folder formats list images in path order), same
    arrays, same vocabularies (or at least classes and landmark schema)."""
    assert len(a) == len(b)
    names_a, names_b = _keys(a), _keys(b)
    assert sorted(names_a) == sorted(names_b)
    b = b.subset([names_b.index(n) for n in names_a])
    for name in fields:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    if vocab:
        assert a.vocab == b.vocab
    elif vocab is not None:
        assert a.classes == b.classes and a.landmark_schema == b.landmark_schema


def _split_names(index) -> dict[str, list[str]]:
    """Each split's image names (as :func:`_keys`), sorted."""
    keys = _keys(index)
    return {name: sorted(keys[int(i)] for i in ids) for name, ids in index.splits.items()}


def _with_splits(index, splits: dict[str, object]):
    """``index`` with ``splits`` (name -> image ids) instead of its own."""
    out = index.subset(np.arange(len(index)))
    out.splits = {name: np.asarray(ids, dtype=np.int64) for name, ids in splits.items()}
    return out


@pytest.fixture
def synth(small_synth_root):
    return read_annotations(small_synth_root)


@pytest.mark.parametrize("target", ["voc", "coco", "yolo"])
@pytest.mark.parametrize("splits", ["train/val/test", "none"])
def test_convert_keeps_splits(small_synth_root, tmp_path, target, splits, capsys):
    """convert, then read the export: the same images per split, the same objects."""
    parts = {"train": range(0, 14), "val": range(14, 20), "test": range(20, 24)} if splits != "none" else {}
    source = _with_splits(read_annotations(small_synth_root), parts)
    src = tmp_path / "src"
    write_voc(source, src)  # the source as a user has it: its splits in ImageSets/Main
    assert _split_names(read_annotations(src)) == _split_names(source)
    assert main(["convert", str(src), "--to", target, str(tmp_path / target)]) == 0
    printed = capsys.readouterr().out
    back = read_annotations(tmp_path / target, cache=False)
    assert not back.problems, back.problems.summary()
    if target == "yolo" and not parts:  # data.yaml needs a key: every image is train, and no val is said
        assert _split_names(back) == {"train": sorted(_keys(source))}
        assert "note: " in printed and "no val split" in printed and "val" not in _yaml(tmp_path / "yolo/data.yaml")
    else:
        assert _split_names(back) == _split_names(source)
        assert "note: " not in printed
    if target == "yolo":
        assert_same(source, back, GEOMETRY, vocab=False)
    else:
        assert_same(source, back)
    if target == "coco":  # one file per split, as COCO's own; nothing else needed
        names = sorted(p.name for p in (tmp_path / "coco").glob("*.json"))
        assert names == (["instances_test.json", "instances_train.json", "instances_val.json"] if parts
                         else ["annotations.json"])


def test_coco_keeps_splits_its_files_cannot(synth, tmp_path):
    """trainval, images in no split, a single split, CVAT's spelling: splits.json beside the JSON."""
    n = len(synth)
    cases = {
        "trainval": {"train": range(0, 14), "val": range(14, 20), "test": range(20, n), "trainval": range(0, 20)},
        "rest": {"train": range(0, 14), "val": range(14, 20)},  # images 20.. in no split
        "one": {"train": range(n)},
        "cvat": {"Train": range(0, 20), "Validation": range(20, n)},
    }
    for case, parts in cases.items():
        index = _with_splits(synth, parts)
        path = write_coco(index, tmp_path / case)
        written = sorted(p.name for p in (tmp_path / case).glob("*.json"))
        back = read_annotations(path, cache=False)
        assert _split_names(back) == _split_names(index), case
        assert back.meta["split_sources"]["train" if case != "cvat" else "Train"].startswith("splits.json (made by")
        assert_same(index, back)
        if case in ("trainval", "cvat"):  # the train/val/test files too, for other tools
            files = ["instances_Train.json", "instances_Validation.json"] if case == "cvat" else [
                "instances_test.json", "instances_train.json", "instances_val.json"]
            assert path == tmp_path / case and written == sorted(files + ["splits.json"])
        else:  # no file per split holds them: one file, and the splits beside it
            assert path.name == "annotations.json" and written == ["annotations.json", "splits.json"]
    # the reader's root for a folder named annotations is the one above, outside out: refused
    with pytest.raises(ValueError, match="need splits.json at the dataset root"):
        write_coco(_with_splits(synth, cases["rest"]), tmp_path / "ds" / "annotations")
    assert not (tmp_path / "ds").exists()
    # images left where they are: splits.json names them as the export's reader finds them
    index = _with_splits(synth, cases["rest"])
    back = read_annotations(write_coco(index, tmp_path / "none", images="none"), allow_outside_images=True)
    assert _split_names(back) == _split_names(index)


def test_voc_round_trip_keeps_everything(synth, tmp_path):
    out = write_voc(synth, tmp_path / "voc")
    back = read_annotations(out)
    assert_same(synth, back)
    np.testing.assert_array_equal(back.verified, synth.verified)
    assert {k: v.tolist() for k, v in back.splits.items()} == {k: v.tolist() for k, v in synth.splits.items()}
    assert not back.problems
    assert os.path.samefile(back.image_path(0), synth.image_path(0))  # hard links


def test_coco_round_trip_keeps_everything_but_verified(synth, tmp_path):
    path = write_coco(synth, tmp_path / "coco")
    assert path == tmp_path / "coco"  # one file per split: read the folder
    assert sorted(p.name for p in path.glob("*.json")) == ["instances_train.json", "instances_val.json"]
    data = json.loads((path / "instances_train.json").read_text())
    assert len(data["images"]) == len(synth.splits["train"]) and len(data["categories"]) == len(synth.classes)
    face = next(c for c in data["categories"] if c["name"] == "face")
    assert face["keypoints"] == list(synth.landmark_schema.names) and face["skeleton"] == []
    assert data["annotations"][0]["bbox"][2] > 0 and "num_keypoints" in data["annotations"][0]
    back = read_annotations(path)
    assert_same(synth, back)
    assert _split_names(back) == _split_names(synth)
    assert not back.problems


def test_yolo_round_trip_keeps_geometry_classes_schema_and_splits(synth, tmp_path):
    path = write_yolo(synth, tmp_path / "yolo")
    config = (tmp_path / "yolo" / "data.yaml").read_text()
    assert "kpt_shape:\n- 5\n- 3" in config and "flip_idx" in config
    back = read_annotations(path)
    assert_same(synth, back, GEOMETRY, vocab=False)
    assert {k: v.tolist() for k, v in back.splits.items()} == {k: v.tolist() for k, v in synth.splits.items()}
    assert not back.problems


def _cvat_source(tmp_path: Path) -> Path:
    for name in ("a.jpg", "b.jpg"):
        write_image(tmp_path / "images" / name, (100, 80))
    xml = """<annotations><version>1.1</version><meta><task><labels>
      <label><name>face</name><type>rectangle</type></label>
      <label><name>pose</name><type>skeleton</type></label>
      <label><name>left_eye</name><type>points</type><parent>pose</parent></label>
      <label><name>right_eye</name><type>points</type><parent>pose</parent></label>
      <label><name>nose</name><type>points</type><parent>pose</parent></label></labels></task></meta>
      <image id="0" name="a.jpg" width="100" height="80" subset="Train">
        <box label="face" occluded="1" xtl="10.25" ytl="12" xbr="50.5" ybr="60" group_id="1">
          <attribute name="age">child</attribute><attribute name="difficult">true</attribute></box>
        <skeleton label="pose" group_id="1">
          <points label="left_eye" outside="0" occluded="0" points="20.1,30.7"/>
          <points label="right_eye" outside="0" occluded="1" points="40.3,30.2"/>
          <points label="nose" outside="1" occluded="0" points="0,0"/></skeleton>
        <box label="car" occluded="0" xtl="60" ytl="10" xbr="99.9" ybr="79.5"/>
        <tag label="indoor"><attribute name="light">dim</attribute></tag>
      </image>
      <image id="1" name="b.jpg" width="100" height="80" subset="Validation"/>
    </annotations>"""
    (tmp_path / "annotations.xml").write_text(xml)
    return tmp_path / "annotations.xml"


@pytest.mark.parametrize("target", ["voc", "coco"])
def test_cvat_to_voc_and_coco_round_trip(tmp_path, target):
    source = read_annotations(_cvat_source(tmp_path / "src"))
    assert source.landmark_schema.names == ("left_eye", "right_eye", "nose")
    assert source.image(0).attributes == {"light": "dim", "subset": "Train"}
    written = write_annotations(source, tmp_path / target, target)
    # the VOC reader takes names that fit its 5-point face schema as that schema: say which
    schema = source.landmark_schema if target == "voc" else None
    assert_same(source, read_annotations(written, landmark_schema=schema))


def test_iscrowd_survives_voc_and_coco(tmp_path):
    write_image(tmp_path / "src" / "a.jpg")
    data = {
        "images": [{"id": 1, "file_name": "a.jpg", "width": 64, "height": 48}],
        "annotations": [
            {"id": 1, "image_id": 1, "category_id": 1, "bbox": [1, 1, 10, 10], "iscrowd": 1},
            {"id": 2, "image_id": 1, "category_id": 1, "bbox": [2, 2, 10, 10], "iscrowd": 0},
        ],
        "categories": [{"id": 1, "name": "person"}],
    }
    (tmp_path / "src" / "x.json").write_text(json.dumps(data))
    source = read_annotations(tmp_path / "src" / "x.json")
    voc = read_annotations(write_voc(source, tmp_path / "voc"))
    assert voc.image(0).object_attributes == [{"iscrowd": "1"}, {}]
    coco_path = write_coco(voc, tmp_path / "coco")
    assert [a["iscrowd"] for a in json.loads(coco_path.read_text())["annotations"]] == [1, 0]
    assert_same(source, read_annotations(coco_path))


def _ibug_source(tmp_path: Path) -> Path:
    write_image(tmp_path / "a.jpg", (120, 100))
    rng = np.random.default_rng(5)
    parts = "".join(
        f"<part name='{i:02d}' x='{int(x)}' y='{int(y)}'/>" for i, (x, y) in enumerate(rng.integers(20, 80, (68, 2)))
    )
    xml = (
        "<dataset><images><image file='a.jpg' width='120' height='100'>"
        f"<box top='10' left='10' width='80' height='80'>{parts}</box></image></images></dataset>"
    )
    (tmp_path / "faces.xml").write_text(xml)
    return tmp_path / "faces.xml"


def test_ibug68_schema_survives_coco_and_yolo(tmp_path):
    source = read_annotations(_ibug_source(tmp_path / "src"))
    assert source.landmark_schema == IBUG68
    coco = read_annotations(write_coco(source, tmp_path / "coco"))
    assert_same(source, coco)
    yolo = read_annotations(write_yolo(source, tmp_path / "yolo"))
    assert_same(source, yolo, GEOMETRY, vocab=False)
    voc = read_annotations(write_voc(source, tmp_path / "voc"), landmark_schema=IBUG68)
    assert_same(source, voc)  # VOC keeps no flip pairs: the schema is passed when reading


@pytest.mark.dataset
def test_real_dlib_faces_round_trip(dlib_faces_root, tmp_path):
    source = read_annotations(dlib_faces_root / "training_with_face_landmarks.xml")
    for target in ("coco", "yolo"):
        back = read_annotations(write_annotations(source, tmp_path / target, target, images="symlink"))
        assert_same(source, back, EVERYTHING if target == "coco" else GEOMETRY, vocab=target == "coco")


def test_image_modes(synth, tmp_path):
    copy = read_annotations(write_voc(synth, tmp_path / "copy", images="copy"))
    assert not os.path.samefile(copy.image_path(0), synth.image_path(0))
    assert copy.image_path(0).read_bytes() == synth.image_path(0).read_bytes()
    link = read_annotations(write_coco(synth, tmp_path / "symlink", images="symlink"))
    # COCO lists images in file order (one file per split): match them by name
    first = _keys(synth).index(_keys(link)[0])
    assert link.image_path(0).is_symlink() and os.path.samefile(link.image_path(0), synth.image_path(first))
    for writer in (write_voc, write_coco):
        out = writer(synth, tmp_path / f"none-{writer.__name__}", images="none")
        with pytest.raises(AnnotationError, match="outside_dataset"):
            read_annotations(out, cache=False)  # names pointing back to the source: refused by default
        ref = read_annotations(out, allow_outside_images=True)
        assert_same(synth, ref)
        assert os.path.samefile(ref.image_path(3), synth.image_path(_keys(synth).index(_keys(ref)[3])))
        assert not (tmp_path / f"none-{writer.__name__}" / "images").exists()
    with pytest.raises(ValueError, match="images='none' is not possible for YOLO"):
        write_yolo(synth, tmp_path / "y", images="none")
    with pytest.raises(ValueError, match="images='move' is not one of link, copy, symlink, none"):
        write_annotations(synth, tmp_path / "z", "voc", images="move")
    with pytest.raises(ValueError, match="format='csv' is not one of voc, coco, yolo"):
        write_annotations(synth, tmp_path / "z", "csv")


def test_refuses_non_empty_output_unless_overwrite(synth, tmp_path):
    write_voc(synth, tmp_path / "out")
    with pytest.raises(ValueError, match="is not empty; pass overwrite=True"):
        write_voc(synth, tmp_path / "out")
    assert_same(synth, read_annotations(write_voc(synth, tmp_path / "out", overwrite=True), cache=False))


def test_same_base_name_in_two_folders(tmp_path):
    for sub in ("x", "y"):
        write_image(tmp_path / "src" / sub / "img.png")
    (tmp_path / "src" / "list.txt").write_text("x/img.png cat\ny/img.png dog\n")
    source = read_annotations(tmp_path / "src" / "list.txt")
    for target in ("voc", "coco", "yolo"):
        back = read_annotations(write_annotations(source, tmp_path / target, target))
        assert [back.relative_image_path(i).replace(os.sep, "/")[-9:] for i in range(2)] == ["x/img.png", "y/img.png"]
        if target != "yolo":
            assert_same(source, back)


def test_split_option_writes_one_split(synth, tmp_path):
    val = synth.split("val")
    back = read_annotations(write_annotations(synth, tmp_path / "val", "coco", split="val"))
    # classes without objects in the split are not in the new index: compare by name
    assert [val.classes[c] for c in val.labels] == [back.classes[c] for c in back.labels]
    assert_same(val, back, tuple(f for f in EVERYTHING if f != "labels"), vocab=None)
    with pytest.raises(KeyError, match="split='nope' not found"):
        write_annotations(synth, tmp_path / "x", "coco", split="nope")


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_geometry_round_trips_exactly(tmp_path_factory, data):
    """Any float32 box and landmark inside any image size comes back bit-identical."""
    root = tmp_path_factory.mktemp("prop")
    schema = LandmarkSchema.from_names(["left_a", "right_a", "mid"])
    w = data.draw(st.integers(1, 4000), label="width")
    h = data.draw(st.integers(1, 4000), label="height")
    (root / "src").mkdir()
    Image.new("1", (w, h)).save(root / "src" / "a.png")  # 1-bit: quick to write at any size
    coord = lambda hi: st.floats(0, hi, allow_nan=False, width=32)  # noqa: E731
    objects = []
    for _ in range(data.draw(st.integers(0, 3), label="objects")):
        x1, x2 = sorted(data.draw(st.tuples(coord(w), coord(w)).filter(lambda t: t[0] != t[1])))
        y1, y2 = sorted(data.draw(st.tuples(coord(h), coord(h)).filter(lambda t: t[0] != t[1])))
        pts = [(data.draw(coord(w)), data.draw(coord(h)), data.draw(st.sampled_from([0, 1, 2]))) for _ in range(3)]
        objects.append(((x1, y1, x2, y2), pts))
    kps = []
    anns = []
    for j, (box, pts) in enumerate(objects):
        kps = [v for x, y, vis in pts for v in ((x, y, vis) if vis else (0, 0, 0))]
        anns.append(
            {
                "id": j + 1,
                "image_id": 1,
                "category_id": 1,
                "bbox": [box[0], box[1], box[2] - box[0], box[3] - box[1]],
                "keypoints": kps,
            }
        )
    coco = {
        "images": [{"id": 1, "file_name": "a.png", "width": w, "height": h}],
        "annotations": anns,
        "categories": [{"id": 1, "name": "thing", "keypoints": list(schema.names)}],
    }
    (root / "src" / "x.json").write_text(json.dumps(coco))
    source = read_annotations(root / "src" / "x.json", landmark_schema=schema, cache=False)
    assert not source.problems and source.num_objects == len(objects)
    for target in ("voc", "coco", "yolo"):
        back = read_annotations(
            write_annotations(source, root / target, target), landmark_schema=schema, cache=False
        )
        assert not back.problems, (target, back.problems.summary())
        # VOC has no class list: a class without objects cannot survive it
        vocab = None if target == "voc" and not source.num_objects else False
        if target != "yolo":
            assert_same(source, back, GEOMETRY, vocab=vocab)
            continue
        # normalised float64 values carry ~1e-16 of the image size: bit-identical float32
        # except within ~1e-5 px of zero (the synthetic round trip above is exact)
        assert_same(source, back, ("width", "height", "labels", "visibility"), vocab=False)
        scale = max(w, h)
        np.testing.assert_allclose(back.boxes, source.boxes, rtol=1e-6, atol=1e-12 * scale)
        np.testing.assert_allclose(back.landmarks, source.landmarks, rtol=1e-6, atol=1e-12 * scale)


def test_cli_convert_then_index(small_synth_root, tmp_path, capsys):
    out = tmp_path / "coco"
    assert main(["convert", str(small_synth_root), "--to", "coco", str(out), "--images", "copy"]) == 0
    printed = capsys.readouterr().out
    assert "wrote 24 images" in printed and "voc -> coco" in printed
    assert main(["index", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["format"] == "coco" and data["images"] == 24
    assert main(["convert", str(small_synth_root), "--to", "coco", str(out)]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert main(["convert", str(small_synth_root), "--to", "yolo", str(tmp_path / "y"), "--split", "train"]) == 0
    assert "yolo" in capsys.readouterr().out
    assert main(["index", str(tmp_path / "y"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["format"] == "yolo"


def test_coco_written_into_a_folder_named_annotations(synth, tmp_path):
    path = write_coco(synth, tmp_path / "ds" / "annotations")
    back = read_annotations(path)
    assert back.root == (tmp_path / "ds").resolve()  # the COCO layout rule: root above annotations/
    assert_same(synth, back)


def _unsplit(index):
    whole = index.subset(np.arange(len(index)))
    whole.splits = {}
    return whole


def _yaml(path: Path) -> dict:
    import yaml

    return yaml.safe_load(path.read_text())


def _listed(root: Path, name: str) -> list[str]:
    return (root / name).read_text().splitlines()


def test_yolo_of_an_unsplit_index_names_no_val_and_says_so(synth, tmp_path):
    from detloader.annotations.writers.yolo import YoloExportWarning

    with pytest.warns(YoloExportWarning, match="no val split, so data.yaml has no val key; Ultralytics needs"):
        path = write_yolo(_unsplit(synth), tmp_path / "y")
    config = _yaml(path)
    assert config["train"] == "images" and "val" not in config  # never val: the training images
    assert path.read_text().startswith("# no val split")  # said in the file too
    assert not list((tmp_path / "y").glob("*.txt"))
    # an empty val split (here: after split="train") is no val either
    with pytest.warns(YoloExportWarning, match="no val split"):
        path = write_annotations(synth, tmp_path / "t", "yolo", split="train")
    assert _yaml(path)["train"] == "train.txt" and "val" not in _yaml(path)
    assert _split_names(read_annotations(path)) == {"train": _split_names(synth)["train"]}


def test_yolo_refuses_images_in_no_split_and_names_splits_it_drops(synth, tmp_path):
    from detloader.annotations.writers.yolo import YoloExportWarning

    rest = _with_splits(synth, {"train": range(0, 14), "val": range(14, 20)})
    with pytest.raises(ValueError, match=r"write_yolo: 4 of 24 images are in none of the splits data.yaml can name "
                       r"\(train, val\), first '.*'; YOLO reads only the images data.yaml names"):
        write_yolo(rest, tmp_path / "rest")
    assert not (tmp_path / "rest").exists()  # refused before anything is written
    # no train split: data.yaml names none (it named every image before, val's too), and says so
    with pytest.warns(YoloExportWarning, match="no train split, so data.yaml has no train key"):
        path = write_yolo(_with_splits(synth, {"val": range(24)}), tmp_path / "val")
    assert _yaml(path)["val"] == "val.txt" and "train" not in _yaml(path)
    # trainval: its images are in train and val; the split itself is said to be left out of data.yaml
    parts = {"train": range(0, 20), "val": range(20, 24), "trainval": range(24)}
    index = _with_splits(synth, parts)
    with pytest.warns(YoloExportWarning, match="trainval is written as trainval.txt but data.yaml names"):
        path = write_yolo(index, tmp_path / "tv")
    expected = _split_names(index)
    del expected["trainval"]
    assert _split_names(read_annotations(path)) == expected
    assert len(_listed(tmp_path / "tv", "trainval.txt")) == 24


def test_yolo_val_fraction_holds_out_a_seeded_part_of_train(synth, tmp_path):
    import warnings

    whole = _unsplit(synth)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        path = write_yolo(whole, tmp_path / "a", val_fraction=0.25, seed=3)
    config, root = _yaml(path), tmp_path / "a"
    assert (config["train"], config["val"]) == ("train.txt", "val.txt")
    train, val = _listed(root, "train.txt"), _listed(root, "val.txt")
    assert len(val) == round(0.25 * len(whole)) and not set(train) & set(val)
    assert len(train) + len(val) == len(whole)
    again = write_yolo(whole, tmp_path / "b", val_fraction=0.25, seed=3).parent
    assert _listed(again, "val.txt") == val
    other = write_yolo(whole, tmp_path / "c", val_fraction=0.25, seed=4).parent
    assert _listed(other, "val.txt") != val
    back = read_annotations(path)
    assert sorted(len(back.splits[k]) for k in ("train", "val")) == sorted((len(train), len(val)))
    # a train split without val: val comes out of the train split only
    train_only = synth.subset(synth.splits["train"])
    train_only.splits = {"train": np.arange(len(train_only))}
    root = write_yolo(train_only, tmp_path / "d", val_fraction=0.5).parent
    assert len(_listed(root, "train.txt")) + len(_listed(root, "val.txt")) == len(train_only)


def test_yolo_val_fraction_refusals(synth, tmp_path):
    with pytest.raises(ValueError, match="the index has a val split already"):
        write_yolo(synth, tmp_path / "a", val_fraction=0.2)
    for bad in (0, 1, 1.5, "0.2"):
        with pytest.raises(ValueError, match="must be a number between 0 and 1"):
            write_yolo(_unsplit(synth), tmp_path / "b", val_fraction=bad, overwrite=True)
    with pytest.raises(ValueError, match="val_fraction=0.2 is for format='yolo', not 'coco'"):
        write_annotations(synth, tmp_path / "c", "coco", val_fraction=0.2)


def test_cli_convert_val_fraction_and_the_note(small_synth_root, tmp_path, capsys):
    argv = ["convert", str(small_synth_root), "--to", "yolo", "--split", "train"]
    assert main([*argv, str(tmp_path / "a")]) == 0
    assert "note: " in capsys.readouterr().out  # val names the training images
    assert main([*argv, str(tmp_path / "b"), "--val-fraction", "0.2", "--seed", "1"]) == 0
    assert "note: " not in capsys.readouterr().out
    config = _yaml(tmp_path / "b" / "data.yaml")
    assert (config["train"], config["val"]) == ("train.txt", "val.txt")
    assert _listed(tmp_path / "b", "val.txt")
