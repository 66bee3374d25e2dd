"""The real BCCD dataset (VOCdevkit, 364 images). Skips when ../shared/datasets is absent."""

from __future__ import annotations

import pytest

from detloader import AnnotationError, read_annotations

pytestmark = pytest.mark.dataset


def test_bccd_counts_and_zero_size_boxes(bccd_root):
    with pytest.raises(AnnotationError) as err:
        read_annotations(bccd_root)
    assert str(err.value).startswith("Annotations/BloodImage_00338.xml: object[13]/bndbox: xmax=504 <= xmin=504")
    index = read_annotations(bccd_root, on_error="skip")
    assert len(index) == 364
    empty = [p for p in index.problems if p.kind == "empty_box"]
    assert [(p.file, p.element) for p in empty] == [
        ("Annotations/BloodImage_00338.xml", "object[13]/bndbox"),
        ("Annotations/BloodImage_00343.xml", "object[4]/bndbox"),
    ]
    # 4155 RBC in the files, two of them zero-size and dropped
    assert index.class_counts() == {"Platelets": 361, "RBC": 4153, "WBC": 372}
    assert {k: len(v) for k, v in index.splits.items()} == {"test": 72, "train": 205, "trainval": 292, "val": 87}
    assert index.image(0).size == (640, 480) and index.image(0).path.is_file()


def test_bccd_warm_reload(bccd_root):
    read_annotations(bccd_root, on_error="skip")
    index = read_annotations(bccd_root, on_error="skip")
    assert index._source_file is not None and index.num_objects == 4886
