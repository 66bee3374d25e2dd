"""APr / APc / APf: the mean AP@0.5:0.95 over the classes of each LVIS frequency group that have
ground truth in the evaluated images, checked against the per-class APs."""

from __future__ import annotations

import numpy as np
import pytest
from balance_helpers import long_tail_index

from detloader.annotations.index import AnnotationIndex
from detloader.stats import training_frequency
from detloader.train import score_predictions

pytest.importorskip("pycocotools")


def _long_tail(num_images: int, num_classes: int, seed: int) -> AnnotationIndex:
    """:func:`long_tail_index` with image ids 1..n, as the evaluator numbers images."""
    base = long_tail_index(num_images, num_classes, seed=seed)
    arrays = base.arrays() | {"image_ids": np.arange(1, num_images + 1, dtype=np.int64)}
    return AnnotationIndex(root=base.root, arrays=arrays, vocab=base.vocab)


def _noisy(index, seed: int = 0) -> dict[int, dict[str, np.ndarray]]:
    """Ground truth moved by a few pixels, half the labels of the rarer classes wrong, and a
    false positive per image: the per-class APs differ."""
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(len(index)):
        v = index.image(i)
        boxes = v.boxes + rng.normal(0, 2.0, v.boxes.shape).astype(np.float32)
        labels = v.labels.astype(np.int64).copy()
        flip = (labels > 5) & (rng.random(len(labels)) < 0.5)
        labels[flip] = rng.integers(0, len(index.classes), int(flip.sum()))
        fp = rng.uniform(0, 40, 2).astype(np.float32)
        out[i] = {"boxes": np.concatenate([boxes, [[*fp, *(fp + 20)]]]).astype(np.float32),
                  "scores": rng.uniform(0.2, 1.0, len(labels) + 1).astype(np.float32),
                  "labels": np.concatenate([labels, [rng.integers(0, len(index.classes))]])}
    return out


def _direct(metrics, index, groups):
    """Mean of the per-class AP@0.5:0.95 over each group's classes scored."""
    out = {}
    for letter in "rcf":
        aps = [metrics["per_class"][c]["ap50_95"] for c in index.classes
               if groups[c] == letter and metrics["per_class"][c]["ap50_95"] is not None]
        out[letter] = float(np.mean(aps)) if aps else None
    return out


def test_apr_apc_apf_are_the_means_of_the_per_class_ap():
    index = _long_tail(300, 50, seed=3)
    groups, source = training_frequency(index)
    assert {"r", "c", "f"} <= set(groups.values())
    m = score_predictions(_noisy(index), index)
    direct = _direct(m, index, groups)
    for letter in "rcf":
        assert m[f"ap{letter}"] == pytest.approx(direct[letter], abs=1e-12)
        assert m[f"ap{letter}"] is not None
    assert len({round(m["apr"], 6), round(m["apc"], 6), round(m["apf"], 6)}) == 3
    fg = m["frequency_groups"]
    assert fg["source"] == source
    assert fg["rare"]["classes"] == sum(g == "r" for g in groups.values())
    assert fg["rare"]["names"] == [c for c in index.classes if groups[c] == "r"][:20]
    assert fg["rare"]["more"] == max(fg["rare"]["classes"] - 20, 0)
    assert fg["without_training_images"] == sum(g is None for g in groups.values())
    assert all(m["per_class"][c]["frequency"] == groups[c] for c in index.classes)


def test_given_frequency_decides_and_unscored_classes_are_left_out():
    """With the groups of the training images given, a group's mean leaves out its classes
    without ground truth in the evaluated images (as LVIS does)."""
    index = _long_tail(300, 50, seed=3)
    val = index.subset(np.arange(100))
    groups = {c: "r" if k % 3 == 0 else "c" if k % 3 == 1 else "f" for k, c in enumerate(index.classes)}
    m = score_predictions(_noisy(val, seed=1), val, frequency=groups)
    direct = _direct(m, val, groups)
    assert [m["apr"], m["apc"], m["apf"]] == pytest.approx([direct["r"], direct["c"], direct["f"]], abs=1e-12)
    scored = sum(m["per_class"][c]["ap50_95"] is not None for c in index.classes if groups[c] == "r")
    assert m["frequency_groups"]["rare"]["scored"] == scored < m["frequency_groups"]["rare"]["classes"]
    assert m["frequency_groups"]["source"] == "given"


@pytest.mark.slow
def test_evaluate_groups_by_the_checkpoints_training_images(tmp_path, capsys):
    """``detloader evaluate``: the groups are counted on the run's training images (recorded in
    the checkpoint), not on the evaluated ones; the printed line gives APr / APc / APf."""
    import json

    from detloader import read_annotations
    from detloader.balance.groups import balance_groups, group_counts
    from detloader.cli import main
    from detloader.stats import class_frequency
    from detloader.synth import make_synthetic
    from detloader.train.checkpoint import load_checkpoint
    from detloader.train.run_data import recorded_rows

    data = make_synthetic(tmp_path / "faces", 40, seed=1, size=(96, 72))
    out = tmp_path / "run"
    args = ["--size", "64", "--batch-size", "4", "--width", "4", "--num-workers", "0", "--out", str(out)]
    assert main(["train", str(data), "--epochs", "1", *args, "--json"]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(out / "last.pt"), str(data), "--json"]) == 0
    m = json.loads(capsys.readouterr().out)
    source = m["frequency_groups"]["source"]
    assert source.startswith("the checkpoint's training split") and "(32 images" in source
    index = read_annotations(data)
    rows, _ = recorded_rows(index, load_checkpoint(out / "last.pt")["data"]["splits"]["train"])
    assert m["images"] == 8 and len(rows) == 32
    want = class_frequency(index.classes, group_counts(balance_groups(index.subset(rows), "class"), "images"))
    assert {c: m["per_class"][c]["frequency"] for c in index.classes} == want
    groups = {c: m["per_class"][c]["frequency"] for c in m["per_class"]}
    assert _direct(m, index, groups) == {k: m[f"ap{k}"] for k in "rcf"}
    assert main(["evaluate", str(out / "last.pt"), str(data)]) == 0
    assert "APr " in capsys.readouterr().out
