"""detloader show: grids of annotated images (pixels checked, not only the file)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import detloader
from detloader.cli.parser import main
from detloader.dataset import DetectionDataset
from detloader.show import (
    POINT_RADIUS,
    class_color,
    grid_size,
    landmark_colors,
    pick_images,
    show_dataset,
    show_predictions,
)
from detloader.synth import make_synthetic
from detloader.train import ImagePredictions
from detloader.transforms import Compose, RandomHorizontalFlip


@pytest.fixture(scope="module")
def single_faces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six images with exactly one face each."""
    return make_synthetic(tmp_path_factory.mktemp("show") / "faces", 6, seed=5, max_objects=1, empty_fraction=0.0)


def _pixel(img: Image.Image, x: float, y: float) -> tuple[int, int, int]:
    return img.getpixel((int(round(x)), int(round(y))))[:3]


def _near(img: Image.Image, x: float, y: float, color: tuple[int, int, int], radius: int) -> bool:
    return any(
        _pixel(img, x + dx, y + dy) == color
        for dx in range(-radius, radius + 1)
        for dy in range(-radius, radius + 1)
    )


def test_grid_size_and_box_edge_colour(single_faces: Path, tmp_path: Path) -> None:
    index = detloader.read_annotations(single_faces)
    out = tmp_path / "grid.png"
    grid = show_dataset(index, out, n=4, tile=192)
    assert out.is_file()
    picture = Image.open(out)
    assert picture.size == grid_size(4, 192, 2) == (2 * 192 + 3 * 4, 2 * 192 + 3 * 4)
    raw = DetectionDataset(index)
    for k, image_id in enumerate(grid.image_ids):
        sample = raw[image_id]
        (x1, y1, x2, y2), label = sample.boxes[0], int(sample.labels[0])
        place = grid.placements[k]
        bx, by = place.map(x1 + 0.1 * (x2 - x1), y2)  # bottom edge, clear of the mouth corners
        color = class_color(label)
        assert any(_pixel(picture, bx, by + dy) == color for dy in (-2, -1, 0, 1))
        # the middle of the box holds the face, not the box colour
        cx, cy = place.map((x1 + x2) / 2, (y1 + y2) / 2 + 0.15 * (y2 - y1))
        assert _pixel(picture, cx, cy) != color


def test_flipped_sample_draws_pair_hue_on_the_mirrored_feature(single_faces: Path) -> None:
    index = detloader.read_annotations(single_faces)
    raw = DetectionDataset(index)
    image_id = next(
        i for i in range(len(index)) if (raw[i].visibility[0, :2] == 2).all() and int(raw[i].labels[0]) == 0
    )
    flipped = DetectionDataset(index, Compose([RandomHorizontalFlip(p=1.0)]), seed=0)
    grid = show_dataset(flipped, after_transform=True, n=len(index), tile=256)
    k = grid.image_ids.index(image_id)
    place, picture = grid.placements[k], grid.image
    before, after = raw[image_id], flipped[image_id]
    width = index.width[image_id]
    face_centre = (after.boxes[0, 0] + after.boxes[0, 2]) / 2
    left_x, left_y = before.landmarks[0, 0]
    # the physical left eye moved to the right side of the face, and is now the right_eye slot
    np.testing.assert_allclose(after.landmarks[0, 1], [width - left_x, left_y], atol=0.01)
    assert width - left_x > face_centre
    hue = landmark_colors(5, index.landmark_schema.flip_pairs)[0]
    assert hue == landmark_colors(5, index.landmark_schema.flip_pairs)[1]
    rx, ry = place.map(width - left_x, left_y)
    assert _near(picture, rx, ry, hue, POINT_RADIUS), "the pair's hue is drawn on the right side"
    assert _pixel(picture, rx, ry) != hue, "the right point of a pair is a ring (hollow)"
    lx, ly = place.map(*after.landmarks[0, 0])
    assert lx < place.map(face_centre, 0)[0]
    assert _pixel(picture, lx, ly) == hue, "the left point of a pair is a filled disc"


def test_landmark_colours_pairs_share_a_hue() -> None:
    colors = landmark_colors(5, ((0, 1), (3, 4)))
    assert colors[0] == colors[1] and colors[3] == colors[4]
    assert len({colors[0], colors[2], colors[3]}) == 3
    assert len(set(landmark_colors(4, ()))) == 4


def test_pick_images_by_class_and_errors(single_faces: Path) -> None:
    index = detloader.read_annotations(single_faces)
    ids = pick_images(index, 3, seed=1)
    assert len(ids) == 3 and list(ids) == sorted(ids)
    for name in set(index.image_classes) & set(index.image_class_counts()):
        chosen = pick_images(index, 10, class_name=name)
        assert all(index.image_classes[index.image_labels[i]] == name for i in chosen)
    with pytest.raises(ValueError, match="class='nope'"):
        pick_images(index, 3, class_name="nope")
    with pytest.raises(ValueError, match="after_transform"):
        show_dataset(index, n=2, after_transform=True)


def test_predictions_beside_truth(single_faces: Path, tmp_path: Path) -> None:
    index = detloader.read_annotations(single_faces)
    preds = []
    for i in range(3):
        lo, hi = index.object_offsets[i], index.object_offsets[i + 1]
        preds.append(ImagePredictions(
            i, np.asarray(index.boxes[lo:hi]), np.full(hi - lo, 0.9, np.float32),
            np.asarray(index.labels[lo:hi], np.int64), np.asarray(index.landmarks[lo:hi]),
            np.asarray([0.7, 0.2, 0.1], np.float32),
        ))
    grid = show_predictions(index, preds, tmp_path / "pred.png", tile=160, pairs_per_row=1)
    assert grid.image.size == grid_size(6, 160, 2)
    assert grid.image_ids == [0, 0, 1, 1, 2, 2]
    for k in (0, 1):  # truth and prediction tiles of image 0 both draw its box
        x1, y1, x2, y2 = index.boxes[0]
        bx, by = grid.placements[k].map(x1 + 0.1 * (x2 - x1), y2)
        assert any(_pixel(grid.image, bx, by + dy) == class_color(int(index.labels[0])) for dy in (-2, -1, 0, 1))


def test_cli_show(single_faces: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.png"
    assert main(["show", str(single_faces), "--out", str(out), "--n", "3", "--tile", "100",
                 "--after-transform", "--size", "96", "--split", "train"]) == 0
    assert Image.open(out).size == grid_size(3, 100, 2)
    assert "3 images" in capsys.readouterr().out
    assert main(["show", str(single_faces), "--out", str(out), "--class", "nope"]) == 2
