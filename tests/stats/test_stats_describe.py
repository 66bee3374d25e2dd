"""dataset_stats: per-class counts, box sizes, landmarks, imbalance ratios."""

from __future__ import annotations

import json
import math

import pytest
from balance_helpers import tiny_index

from detloader.annotations.index import MISSING
from detloader.stats import dataset_stats, imbalance_ratio


def test_dataset_stats_by_hand():
    idx = tiny_index(
        [[0, 0, 1], [0], [], [2]],
        image_labels=[0, 1, MISSING, 0],
        ages=[[0, 1, 0], [MISSING], [], [1]],
        visibility=[[[2, 2], [1, 0], [2, 1]], [[0, 0]], [], [[2, 2]]],
    )
    s = dataset_stats(idx)
    assert s["images"] == 4 and s["objects"] == 5 and s["empty_images"] == 1
    assert s["classes"] == {
        "a": {"objects": 3, "images": 2},
        "b": {"objects": 1, "images": 1},
        "c": {"objects": 1, "images": 1},
    }
    assert s["imbalance_ratio"] == {"objects": 3.0, "images": 2.0}
    assert s["image_classes"] == {"day": 2, "night": 1} and s["images_without_image_class"] == 1
    assert s["object_attributes"] == {"age": {"adult": 2, "child": 2}}
    assert s["landmarks"] == {
        "left_eye": {"visible": 3, "hidden": 1, "absent": 1},
        "right_eye": {"visible": 2, "hidden": 1, "absent": 2},
    }
    # boxes: widths 10, 11, 12 (image 0), 10, 10; heights all 20
    assert s["box_size"]["width"] == [10.0, 10.0, 10.0, 10.0, 11.0, 11.8, 12.0]
    assert s["box_size"]["height"][0] == s["box_size"]["height"][-1] == 20.0
    assert s["box_size"]["relative_sqrt_area"][0] == pytest.approx(math.sqrt(200 / 8000), abs=1e-4)
    assert s["objects_per_image"] == {"mean": 1.25, "max": 3}
    json.dumps(s)  # plain data


def test_imbalance_ratio_ignores_empty_classes():
    assert imbalance_ratio([100, 0, 4]) == 25.0
    assert imbalance_ratio([0, 0]) is None
