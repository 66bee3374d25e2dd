"""Statistics: chi-square tail, dataset figures, raw vs balanced distributions, the CLI."""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest
from balance_helpers import tiny_index
from hypothesis import given, settings
from hypothesis import strategies as st

import detloader
from detloader.cli import main
from detloader.annotations.index import MISSING
from detloader.balance import BalancedBatchSampler, WeightedSampler
from detloader.stats import (
    balance_report,
    chi_square_sf,
    chi_square_test,
    dataset_stats,
    group_totals,
    imbalance_ratio,
    plot_balance,
)
from detloader.balance import balance_groups, repeat_factors

# -- chi-square ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "x, dof",
    [(3.841458820694124, 1), (5.991464547107979, 2), (18.307038053275146, 10), (124.34211340400407, 100)],
)
def test_chi_square_critical_values(x, dof):
    """Tabulated 95 % critical values give p = 0.05."""
    assert chi_square_sf(x, dof) == pytest.approx(0.05, rel=1e-9)


@settings(max_examples=80, deadline=None)
@given(st.floats(1e-6, 400.0))
def test_chi_square_closed_forms(x):
    """dof 2: exp(-x/2); dof 1: erfc(sqrt(x/2)); dof 4: (1 + x/2) exp(-x/2)."""
    assert chi_square_sf(x, 2) == pytest.approx(math.exp(-x / 2), rel=1e-10, abs=1e-300)
    assert chi_square_sf(x, 1) == pytest.approx(math.erfc(math.sqrt(x / 2)), rel=1e-9, abs=1e-300)
    assert chi_square_sf(x, 4) == pytest.approx((1 + x / 2) * math.exp(-x / 2), rel=1e-9, abs=1e-300)


def test_chi_square_test_pools_small_cells_and_rejects_the_impossible():
    r = chi_square_test([10, 20, 30, 1, 0], [10, 20, 30, 0.6, 0.4])
    assert r.cells == 4 and r.dof == 3 and r.statistic == pytest.approx(0.0)
    assert chi_square_test([5, 5, 1], [5.5, 5.5, 0]).p_value == 0.0
    with pytest.raises(ValueError, match="3 cells"):
        chi_square_test([1, 2, 3], [1, 2])


# -- dataset statistics ----------------------------------------------------------------------


def test_dataset_stats_by_hand():
    idx = tiny_index(
        [[0, 0, 1], [0], [], [2]],
        image_labels=[0, 1, MISSING, 0],
        ages=[[0, 1, 0], [MISSING], [], [1]],
        visibility=[[[2, 2], [1, 0], [2, 1]], [[0, 0]], [], [[2, 2]]],
    )
    s = dataset_stats(idx)
    assert s["images"] == 4 and s["objects"] == 5 and s["empty_images"] == 1
    assert s["classes"] == {"a": {"objects": 3, "images": 2}, "b": {"objects": 1, "images": 1}, "c": {"objects": 1, "images": 1}}
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


# -- raw vs balanced -------------------------------------------------------------------------

LABELS = [[0, 0, 0], [0, 1], [0], [1, 1], [], [2, 0]]


def test_group_totals_objects_and_images():
    idx = tiny_index(LABELS)
    g = balance_groups(idx, "class")
    draws = np.array([2.0, 0, 1, 0, 5, 1])
    assert group_totals(g, draws, "objects").tolist() == [8, 0, 1]  # 2x3 a + 1 a + (c, a)
    assert group_totals(g, draws, "images").tolist() == [4, 0, 1]
    assert group_totals(g, np.ones(6)).tolist() == [6, 3, 1]


def test_balance_report_weighted_is_analytic():
    idx = tiny_index(LABELS)
    report = balance_report(idx, "inverse", seed=3)
    w = np.array([1 / 6, 1 / 3, 1 / 6, 1 / 3, 1 / 6, 1.0])  # inverse object counts, max per image
    p = w / w.sum()
    m = np.array([[3, 0, 0], [1, 1, 0], [1, 0, 0], [0, 2, 0], [0, 0, 0], [1, 0, 1]])
    np.testing.assert_allclose(report.expected, 6 * p @ m)
    assert report.raw.tolist() == [6, 3, 1]
    assert report.epoch_length == pytest.approx({"raw": 6.0, "balanced": 6.0})
    d = report.to_dict()
    assert set(d) >= {"raw", "balanced", "drawn", "imbalance_ratio"} and d["raw"] == {"a": 6, "b": 3, "c": 1}
    # the drawn column is a real epoch of the same sampler
    drawn = np.bincount(WeightedSampler(w, seed=3).indices(), minlength=6)
    np.testing.assert_allclose(report.drawn, drawn @ m)


def test_balance_report_repeat_factor_and_notes():
    idx = tiny_index(LABELS)
    report = balance_report(idx, "repeat_factor:0.5")
    r = repeat_factors(idx, 0.5)
    m = np.array([[3, 0, 0], [1, 1, 0], [1, 0, 0], [0, 2, 0], [0, 0, 0], [1, 0, 1]])
    np.testing.assert_allclose(report.expected, r @ m)
    assert report.epoch_length["balanced"] == pytest.approx(r.sum())
    assert not report.notes
    assert "every repeat factor is 1" in balance_report(idx, "repeat_factor").notes[0]


def test_balance_report_units_and_image_keys():
    idx = tiny_index(LABELS, image_labels=[0, 0, 1, 0, MISSING, 1])
    images = balance_report(idx, "inverse", unit="images", draw=False)
    assert images.raw.tolist() == [4, 2, 1] and images.drawn is None
    by_image = balance_report(idx, "inverse", by="image_class")
    assert by_image.unit == "images" and by_image.raw.tolist() == [3, 2]
    # inverse on image classes: equal expected shares for the image classes; the image
    # without a class keeps the background weight
    e = by_image.expected
    assert e[0] == pytest.approx(e[1])


def test_balance_report_of_a_batch_sampler(small_synth_root):
    idx = detloader.read_annotations(small_synth_root)
    from detloader.balance import class_members

    s = BalancedBatchSampler(class_members(idx)[1], 2, 2, num_batches=50, seed=0)
    report = balance_report(idx, s)
    assert report.strategy == "BalancedBatchSampler"
    assert report.epoch_length["balanced"] == pytest.approx(200)
    assert report.max_deviation() is not None


def test_plot_writes_a_png(tmp_path):
    idx = tiny_index(LABELS)
    out = tmp_path / "bars.png"
    plot_balance(balance_report(idx, "sqrt"), out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- CLI -------------------------------------------------------------------------------------


def test_cli_json_raw_and_balanced(small_synth_root, capsys):
    assert main(["stats", str(small_synth_root), "--balance", "sqrt", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    idx = detloader.read_annotations(small_synth_root)
    assert data["raw"] == idx.class_counts()
    assert set(data["balanced"]) == set(idx.classes)
    assert sum(data["balanced"].values()) == pytest.approx(sum(data["drawn"].values()), rel=0.5)
    assert data["unit"] == "objects" and data["stats"]["images"] == len(idx)


def test_cli_json_by_image_counts_images(small_synth_root, capsys):
    assert main(["stats", str(small_synth_root), "--by", "image", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    idx = detloader.read_annotations(small_synth_root)
    assert data["unit"] == "images" and data["balanced"] is None
    assert data["raw"] == idx.image_class_counts()


def test_cli_tables_and_plot(small_synth_root, tmp_path, capsys):
    out = tmp_path / "b.png"
    assert main(["stats", str(small_synth_root), "--balance", "repeat_factor:0.5", "--plot", str(out)]) == 0
    text = capsys.readouterr().out
    for word in ("object classes", "imbalance ratio", "landmark visibility", "box sizes", "balance repeat_factor:0.5"):
        assert word in text
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_cli_plot_needs_balance_and_matplotlib(small_synth_root, tmp_path, capsys, monkeypatch):
    assert main(["stats", str(small_synth_root), "--plot", str(tmp_path / "x.png")]) == 2
    assert "--plot needs --balance" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    assert main(["stats", str(small_synth_root), "--balance", "sqrt", "--plot", str(tmp_path / "x.png")]) == 2
    assert "plotting needs matplotlib: pip install 'detloader[plot]'" in capsys.readouterr().err


def test_cli_bad_strategy_is_one_line(small_synth_root, capsys):
    assert main(["stats", str(small_synth_root), "--balance", "magic"]) == 2
    assert "balance='magic' is not one of" in capsys.readouterr().err


@pytest.mark.dataset
def test_cli_on_bccd(bccd_root, capsys):
    assert main(["stats", str(bccd_root), "--balance", "repeat_factor", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["raw"] == {"Platelets": 361, "RBC": 4153, "WBC": 372}
    assert data["balanced"] == {k: float(v) for k, v in data["raw"].items()}  # t = 0.001: all r = 1
    assert data["notes"]
