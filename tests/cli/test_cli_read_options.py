"""CLI: the dataset options every reading command shares (--image-dir, --images-by,
--class-map, --format, --on-error), the line saying where the images were found, and
commands that would produce nothing exiting 2 with the reason and what to try."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import voc_dataset, voc_object, voc_xml, write_image

from detloader.cli import COMMANDS, build_parser, main
from detloader.cli._common import dataset_kwargs, read_option_flags

OPTIONS = ["--format", "cvat", "--on-error", "skip", "--image-dir", "imgs", "--images-by", "id",
           "--class-map", "a=b", "--class-map", "c=", "--classes", "b,d", "--no-check-images",
           "--boxes-from-points", "image"]
EXPECTED = {"format": "cvat", "on_error": "skip", "image_dir": "imgs", "images_by": "id",
            "class_map": {"a": "b", "c": None}, "classes": ["b", "d"], "check_images": False,
            "boxes_from_points": "image"}
ARGV = {"convert": ["convert", "P", "--to", "coco", "OUT"], "evaluate": ["evaluate", "run/last.pt", "P"],
        "pack": ["pack", "P", "OUT"]}


def test_every_reading_command_takes_the_dataset_options():
    parser = build_parser()
    reading = []
    for command in COMMANDS:
        if command in ("demo", "synth", "cache"):
            continue
        args = parser.parse_args(ARGV.get(command, [command, "P"]) + OPTIONS)
        assert args.path == "P", command
        assert dataset_kwargs(args) == EXPECTED, command
        reading.append(command)
    assert set(reading) == {
        "index",
        "validate",
        "split",
        "convert",
        "pack",
        "show",
        "tune",
        "stats",
        "train",
        "evaluate",
        "bench",
    }
    assert dataset_kwargs(parser.parse_args(["index", "P"])) == {"format": "auto", "on_error": "warn"}


def _coco(root: Path, names: list[str]) -> Path:
    data = {
        "images": [{"id": i, "file_name": n, "width": 64, "height": 48} for i, n in enumerate(names)],
        "annotations": [{"id": 1, "image_id": 0, "category_id": 1, "bbox": [1, 1, 10, 10]}],
        "categories": [{"id": 1, "name": "cell"}],
    }
    path = root / "annotations" / "export.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(data))
    return path


def test_image_dir_and_class_map(tmp_path, capsys):
    objects = [voc_object("cat", (1, 1, 9, 9)), voc_object("dog", (2, 2, 8, 8)), voc_object("bird", (3, 3, 7, 7))]
    root = voc_dataset(tmp_path / "voc", {"a": voc_xml("a.jpg", objects)}, images=[])
    write_image(root / "shots" / "a.jpg")
    (tmp_path / "map.yaml").write_text("bird: null\ndog: animal\n")
    argv = [
        "index",
        str(root),
        "--json",
        "--image-dir",
        "shots",
        "--class-map",
        "cat=animal",
        "--class-map",
        str(tmp_path / "map.yaml"),
    ]
    assert main(argv) == 0
    out = capsys.readouterr()
    data = json.loads(out.out)
    assert data["images"] == 1 and data["classes"] == {"animal": 2} and data["problems"] == {}
    assert "read from there" not in out.err  # an explicit folder: no search
    (tmp_path / "map.json").write_text('{"cat": "feline", "dog": null}')
    assert main(["index", str(root), "--json", "--image-dir", "shots", "--class-map", str(tmp_path / "map.json")]) == 0
    assert json.loads(capsys.readouterr().out)["classes"] == {"bird": 1, "feline": 1}
    (tmp_path / "bad.json").write_text('["cat"]')
    assert main(["index", str(root), "--class-map", str(tmp_path / "bad.json")]) == 2
    assert "bad.json: top level is a list, not a mapping of class names" in capsys.readouterr().err
    assert main(["index", str(root), "--image-dir", "nowhere"]) == 2
    assert "image_dir='nowhere' is not a folder" in capsys.readouterr().err
    assert main(["index", str(root), "--class-map", "cat"]) == 2
    assert "--class-map 'cat' is neither NAME=NEW nor a JSON/YAML file" in capsys.readouterr().err


def test_images_by_id(tmp_path, capsys):
    images = (
        '<image id="12" name="cam/IMG_1.jpg" width="64" height="48"/>'
        '<image id="7" name="IMG_2.jpg" width="64" height="48"/>'
    )
    (tmp_path / "annotations.xml").write_text(f"<annotations><version>1.1</version>{images}</annotations>")
    write_image(tmp_path / "images" / "000012.jpg")
    write_image(tmp_path / "images" / "7.jpg")
    assert main(["index", str(tmp_path), "--json", "--images-by", "id"]) == 0
    assert json.loads(capsys.readouterr().out)["images"] == 2
    assert main(["convert", str(tmp_path), "--to", "voc", str(tmp_path / "out")]) == 2  # by name: none found
    err = capsys.readouterr().err
    assert "no images to convert: every image was dropped (missing_image: 2)" in err
    assert "--image-dir DIR" in err and "--images-by id" in err
    assert not (tmp_path / "out").exists()


def test_commands_that_would_produce_nothing_exit_2(tmp_path, capsys):
    root = tmp_path / "coco"
    _coco(root, ["a.jpg", "b.jpg", "c.jpg"])
    for argv, what in (
        (["index", str(root)], "index"),
        (["index", str(root), "--json"], "index"),
        (["stats", str(root)], "describe"),
        (["convert", str(root), "--to", "yolo", str(tmp_path / "out")], "convert"),
    ):
        assert main(argv) == 2, argv
        out = capsys.readouterr()
        assert (
            f"detloader {argv[0]}: error: {root}: no images to {what}: every image was dropped (missing_image: 3)"
            in out.err
        )
        assert "pass --image-dir DIR (relative to the dataset root)" in out.err and "--images-by" not in out.err
        assert "wrote 0 images" not in out.out and out.out == ""
    voc = voc_dataset(tmp_path / "voc", {"a": voc_xml("a.jpg")})
    assert main(["index", str(voc), "--format", "yolo"]) == 2
    assert f"{voc}: format='yolo' found 1 images but no label files there; it looks like voc" in capsys.readouterr().err


def test_images_found_elsewhere_are_named(tmp_path, capsys):
    root = tmp_path / "coco"
    _coco(root, ["a.jpg", "b.jpg"])
    for name in ("a.jpg", "b.jpg"):
        write_image(root / "valid" / name)
    assert main(["index", str(root), "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["images"] == 2
    assert (
        "detloader index: 2 of 2 images not found in ., annotations; "
        "2 of 2 names looked for are in valid/; read from there"
        in out.err
    )
    assert main(["validate", str(root), "--json", "--no-images"]) == 0  # the repair is listed, and fails nothing
    items = json.loads(capsys.readouterr().out)["items"]
    assert [(p["kind"], p["severity"], p["action"]) for p in items] == [
        ("images_found_elsewhere", "repaired", "read with image_dir='valid'")
    ]
    assert main(["index", str(root), "--image-dir", os.path.join(root, "annotations")]) == 2  # explicit: no search
    assert "no images to index" in capsys.readouterr().err


def test_train_and_evaluate_pass_the_dataset_options(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    import detloader.train
    from detloader.cli.train import _config

    args = build_parser().parse_args(
        ["train", "data", "--image-dir", "pics", "--class-map", "a=b", "--out", str(tmp_path)]
    )
    assert _config(args).read_options == {
        "format": "auto",
        "on_error": "warn",
        "image_dir": "pics",
        "class_map": {"a": "b"},
    }
    seen = {}

    def fake(checkpoint, data, *, read_options, **kwargs):
        seen.update(read_options)
        return {"images": 0}

    monkeypatch.setattr(detloader.train, "evaluate_checkpoint", fake)
    assert main(["evaluate", "run.pt", "data", "--images-by", "id", "--format", "cvat", "--json"]) == 0
    assert seen == {"format": "cvat", "images_by": "id"}  # only those given: the run's recorded ones fill in the rest


def test_given_options_are_told_from_defaults_and_said_in_cli_words():
    from detloader.cli.train import read_option_lines

    parser = build_parser()
    assert dataset_kwargs(parser.parse_args(["index", "P"]), given_only=True) == {}
    given = dataset_kwargs(parser.parse_args(["index", "P", *OPTIONS]), given_only=True)
    assert given == EXPECTED
    assert read_option_flags(given) == (
        "--format cvat --on-error skip --classes b,d --class-map a=b --class-map c= --image-dir imgs "
        "--images-by id --boxes-from-points image --no-check-images"
    )
    # the same words parse back to the same options
    assert dataset_kwargs(parser.parse_args(["index", "P", *read_option_flags(given).split()])) == EXPECTED
    assert read_option_flags({"workers": 2}) == "workers=2"
    # the CLI's own defaults recorded by a run are not worth a line; a given option that differs is
    assert read_option_lines({"format": "auto", "on_error": "warn"}, {}) == []
    assert read_option_lines({"format": "auto", "images_by": "id"}, {"on_error": ("warn", "skip")}) == [
        "read options from the run: --images-by id",
        "read options given that differ from the run's: --on-error skip (the run: --on-error warn)",
    ]
    assert read_option_lines({}, {"image_dir": (None, "pics")}) == [
        "read options given that differ from the run's: --image-dir pics (the run: not set)"
    ]
