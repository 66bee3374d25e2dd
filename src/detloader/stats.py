"""Dataset statistics, and class distributions before and after balancing.

:func:`dataset_stats` describes an index: objects and images per class, image classes,
attribute values, landmark visibility, box-size quantiles, imbalance ratios.

:func:`balance_report` sets the raw per-epoch distribution (every image once) beside the
distribution a balanced sampler gives *in expectation*, computed from the sampler's expected
draws per image (analytic: ``num_samples * w_i / sum(w)`` for weighted sampling, the repeat
factors for repeat-factor sampling, ...), and beside the counts of one real draw, which checks
the expectation. :func:`plot_balance` draws raw vs balanced bars (matplotlib, optional).

:func:`chi_square_test` is the goodness-of-fit test used to check frequencies against their
expectation (exact chi-square tail via the regularised incomplete gamma function; no scipy).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

import numpy as np

from detloader._plotting import new_figure
from detloader.annotations.index import MISSING, AnnotationIndex
from detloader.balance.groups import ByKey, Groups, balance_groups, group_counts

Unit = Literal["objects", "images"]

#: Quantiles reported for box sizes.
QUANTILES: tuple[float, ...] = (0.0, 0.05, 0.25, 0.5, 0.75, 0.95, 1.0)


# --------------------------------------------------------------------------------------------
# Chi-square goodness of fit
# --------------------------------------------------------------------------------------------


def chi_square_sf(statistic: float, dof: int) -> float:
    """``P(X >= statistic)`` for X chi-square with ``dof`` degrees of freedom: the regularised
    upper incomplete gamma ``Q(dof / 2, statistic / 2)`` (series below ``a + 1``, Lentz's
    continued fraction above; relative accuracy about 1e-12)."""
    if dof < 1:
        raise ValueError(f"dof={dof!r} must be >= 1")
    if statistic <= 0:
        return 1.0
    if not math.isfinite(statistic):
        return 0.0
    a, x = dof / 2.0, statistic / 2.0
    log_prefix = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1.0:  # series for the lower P(a, x)
        term = total = 1.0 / a
        ap = a
        for _ in range(10_000):
            ap += 1.0
            term *= x / ap
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(log_prefix))
    tiny = 1e-300  # continued fraction for the upper Q(a, x)
    b = x + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return min(1.0, math.exp(log_prefix) * h)


@dataclass(frozen=True)
class ChiSquare:
    """Result of :func:`chi_square_test`."""

    statistic: float
    dof: int
    p_value: float
    cells: int


def chi_square_test(observed: Any, expected: Any, *, min_expected: float = 5.0) -> ChiSquare:
    """Pearson's goodness-of-fit test of counts ``observed`` against ``expected`` (same total).

    Cells expected below ``min_expected`` are pooled into one cell (the usual validity rule);
    a cell expected 0 but observed is an impossible outcome (p = 0). ``dof = cells - 1``.
    """
    obs = np.asarray(observed, dtype=np.float64).reshape(-1)
    exp = np.asarray(expected, dtype=np.float64).reshape(-1)
    if obs.shape != exp.shape:
        raise ValueError(f"observed has {obs.shape[0]} cells, expected {exp.shape[0]}")
    if (exp < 0).any() or (obs < 0).any():
        raise ValueError("chi_square_test: counts must be >= 0")
    if ((exp == 0) & (obs > 0)).any():
        return ChiSquare(math.inf, max(len(obs) - 1, 1), 0.0, len(obs))
    big = exp >= min_expected
    o = list(obs[big])
    e = list(exp[big])
    if (~big).any() and exp[~big].sum() > 0:
        o.append(float(obs[~big].sum()))
        e.append(float(exp[~big].sum()))
    if len(e) < 2:
        raise ValueError("chi_square_test: fewer than 2 cells with enough expectation")
    o_arr, e_arr = np.array(o), np.array(e)
    stat = float(((o_arr - e_arr) ** 2 / e_arr).sum())
    dof = len(e_arr) - 1
    return ChiSquare(stat, dof, chi_square_sf(stat, dof), len(e_arr))


# --------------------------------------------------------------------------------------------
# Dataset statistics
# --------------------------------------------------------------------------------------------


def imbalance_ratio(counts: Sequence[float] | np.ndarray) -> float | None:
    """Largest / smallest of the positive counts (``None`` with fewer than one positive)."""
    c = np.asarray(counts, dtype=np.float64)
    c = c[c > 0]
    return float(c.max() / c.min()) if len(c) else None


def _quantiles(values: np.ndarray) -> list[float]:
    if not len(values):
        return []
    return [round(float(v), 2) for v in np.quantile(values, QUANTILES)]


def dataset_stats(index: AnnotationIndex) -> dict[str, Any]:
    """Plain-data statistics of ``index`` (JSON-ready).

    Keys: ``images``, ``objects``, ``empty_images``, ``objects_per_image`` (mean, max),
    ``classes`` (name -> objects, images), ``imbalance_ratio`` (objects, images: largest /
    smallest class, empty classes left out), ``empty_classes``, ``image_classes`` (name ->
    images), ``image_class_imbalance_ratio``, ``images_without_image_class``,
    ``object_attributes`` / ``image_attributes`` (name -> value -> count), ``landmarks`` (name
    -> visible, hidden, absent), ``box_size`` (``quantiles`` and, at those quantiles, box
    ``width``, ``height``, ``sqrt_area`` in pixels and ``relative_sqrt_area`` = sqrt(box area
    / image area)), ``box_sqrt_area_median`` per class.
    """
    objects = index.class_counts("objects")
    images = index.class_counts("images")
    image_classes = index.image_class_counts()
    per_image = index.objects_per_image
    boxes = index.boxes.astype(np.float64)
    w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    area = np.sqrt(np.clip(w * h, 0, None))
    img = index.object_image
    image_area = index.width[img].astype(np.float64) * index.height[img].astype(np.float64)
    relative = np.sqrt(np.clip(w * h, 0, None) / np.where(image_area > 0, image_area, np.nan))
    relative = relative[np.isfinite(relative)]
    vis = index.visibility
    landmarks = {
        name: {
            "visible": int((vis[:, k] == 2).sum()),
            "hidden": int((vis[:, k] == 1).sum()),
            "absent": int((vis[:, k] == 0).sum()),
        }
        for k, name in enumerate(index.landmark_schema.names)
    }
    per_class_median = {
        name: (round(float(np.median(area[index.labels == c])), 2) if objects[name] else None)
        for c, name in enumerate(index.classes)
    }
    return {
        "images": len(index),
        "objects": index.num_objects,
        "empty_images": int((per_image == 0).sum()),
        "objects_per_image": {
            "mean": round(float(per_image.mean()), 3) if len(index) else 0.0,
            "max": int(per_image.max()) if len(index) else 0,
        },
        "classes": {n: {"objects": objects[n], "images": images[n]} for n in index.classes},
        "imbalance_ratio": {
            "objects": imbalance_ratio(list(objects.values())),
            "images": imbalance_ratio(list(images.values())),
        },
        "empty_classes": [n for n, c in objects.items() if c == 0],
        "image_classes": image_classes,
        "image_class_imbalance_ratio": imbalance_ratio(list(image_classes.values())),
        "images_without_image_class": int((index.image_labels == MISSING).sum()),
        "object_attributes": {
            n: index.attribute_counts(n, "object") for n, _ in index.vocab.object_attributes
        },
        "image_attributes": {
            n: index.attribute_counts(n, "image") for n, _ in index.vocab.image_attributes
        },
        "landmarks": landmarks,
        "box_size": {
            "quantiles": list(QUANTILES),
            "width": _quantiles(w),
            "height": _quantiles(h),
            "sqrt_area": _quantiles(area),
            "relative_sqrt_area": [round(v, 4) for v in np.quantile(relative, QUANTILES).tolist()]
            if len(relative)
            else [],
        },
        "box_sqrt_area_median": per_class_median,
    }


# --------------------------------------------------------------------------------------------
# Before and after balancing
# --------------------------------------------------------------------------------------------


def group_totals(groups: Groups, per_image: np.ndarray, unit: Unit = "objects") -> np.ndarray:
    """float64 ``[G]``: per group, the objects (``unit="objects"``) or images containing it
    (``"images"``) in a draw where image ``i`` appears ``per_image[i]`` times (a count or an
    expectation). For image-level keys both units count images."""
    e = np.asarray(per_image, dtype=np.float64)
    if e.shape != (groups.num_images,):
        raise ValueError(f"per_image has shape {e.shape}, expected ({groups.num_images},)")
    g = len(groups.names)
    if unit == "objects" or groups.level == "image":
        valid = groups.ids != MISSING
        return np.bincount(groups.ids[valid], weights=e[groups.image_of[valid]], minlength=g)
    if unit != "images":
        raise ValueError(f"unit={unit!r} is not one of 'objects', 'images'")
    images, group, _ = groups.pairs()
    return np.bincount(group, weights=e[images], minlength=g)


@dataclass
class BalanceReport:
    """Per group: raw counts per epoch, expected counts per epoch after balancing, and the
    counts of one real draw. ``epoch_length`` is images per epoch (raw: each image once;
    balanced: expected draws of the sampler over all ranks)."""

    by: tuple[str, ...]
    unit: str
    strategy: str
    names: tuple[str, ...]
    raw: np.ndarray
    expected: np.ndarray
    drawn: np.ndarray | None
    epoch_length: dict[str, float]
    seed: int
    notes: list[str] = field(default_factory=list)

    def max_deviation(self) -> float | None:
        """Largest |drawn - expected| / expected over groups expected >= 1 (None: no draw)."""
        if self.drawn is None:
            return None
        keep = self.expected >= 1
        if not keep.any():
            return None
        return float((np.abs(self.drawn[keep] - self.expected[keep]) / self.expected[keep]).max())

    def to_dict(self) -> dict[str, Any]:
        def table(values: np.ndarray | None, digits: int = 2) -> dict[str, float] | None:
            if values is None:
                return None
            return {n: round(float(v), digits) for n, v in zip(self.names, values)}

        dev = self.max_deviation()
        return {
            "by": list(self.by),
            "unit": self.unit,
            "strategy": self.strategy,
            "raw": {n: int(round(float(v))) for n, v in zip(self.names, self.raw)},
            "balanced": table(self.expected),
            "drawn": table(self.drawn, 0),
            "epoch_length": {k: round(v, 2) for k, v in self.epoch_length.items()},
            "imbalance_ratio": {
                "raw": _round(imbalance_ratio(self.raw)),
                "balanced": _round(imbalance_ratio(np.where(self.raw > 0, self.expected, 0))),
            },
            "max_drawn_deviation": None if dev is None else round(dev, 4),
            "seed": self.seed,
            "notes": list(self.notes),
        }


def _round(v: float | None, digits: int = 3) -> float | None:
    return None if v is None else round(v, digits)


def _draw_counts(sampler: Any, n: int) -> np.ndarray:
    """Draws of each image in one epoch of ``sampler`` over all ranks."""
    if hasattr(sampler, "global_batches"):
        drawn = np.asarray(sampler.global_batches()).reshape(-1)
    elif hasattr(sampler, "global_indices"):
        drawn = np.asarray(sampler.global_indices())
    else:
        drawn = np.fromiter(iter(sampler), dtype=np.int64)
    return np.bincount(drawn.astype(np.int64), minlength=n)[:n].astype(np.float64)


def balance_report(
    index: AnnotationIndex,
    balance: Any,
    *,
    by: ByKey = "class",
    unit: Unit | None = None,
    seed: int = 0,
    num_samples: int | None = None,
    draw: bool = True,
) -> BalanceReport:
    """Raw vs balanced per-epoch distribution of ``index`` under ``balance``.

    ``balance`` is what :func:`detloader.balance.samplers.make_balanced_sampler` takes (a strategy
    name such as ``"sqrt"`` or ``"repeat_factor:0.1"``, a {group: weight} mapping, or a sampler
    with ``expected_counts()``); the sampler is built with ``by`` and ``seed``. ``unit``:
    what is counted per group, ``"objects"`` (default for object keys) or ``"images"``
    containing the group (image keys always count images). ``draw=True`` adds one real
    epoch's counts (all ranks) to check the expectation.
    """
    from detloader.balance.factory import make_balanced_sampler  # torch: lazy, keeps the CLI fast

    groups = balance_groups(index, by)
    if unit is None:
        unit = "objects" if groups.level == "object" else "images"
    if unit not in ("objects", "images"):
        raise ValueError(f"unit={unit!r} is not one of 'objects', 'images'")
    sampler = make_balanced_sampler(
        index, balance, by=by, seed=seed, num_samples=num_samples, rank=0, world_size=1
    )
    if not hasattr(sampler, "expected_counts"):
        raise ValueError(
            f"balance={type(sampler).__name__}: the sampler has no expected_counts(), so the "
            "balanced distribution cannot be computed"
        )
    n = len(index)
    per_image = np.zeros(n, dtype=np.float64)
    expected_draws = np.asarray(sampler.expected_counts(), dtype=np.float64)
    per_image[: min(n, len(expected_draws))] = expected_draws[:n]
    raw = group_totals(groups, np.ones(n), unit)
    expected = group_totals(groups, per_image, unit)
    drawn = group_totals(groups, _draw_counts(sampler, n), unit) if draw else None
    strategy = balance if isinstance(balance, str) else type(sampler).__name__
    notes: list[str] = []
    if strategy.startswith("repeat_factor") and np.allclose(per_image, 1.0):
        threshold = float(strategy.partition(":")[2] or 0.001)
        fractions = group_counts(groups, "images") / max(n, 1)
        fractions = fractions[fractions > 0]
        note = (
            f"every repeat factor is 1 at threshold {threshold:g}: each group is in at least "
            f"{fractions.min():.1%} of the images, so balancing changes nothing"
            if len(fractions)
            else f"every repeat factor is 1 at threshold {threshold:g}"
        )
        if len(fractions) and fractions.max() > fractions.min():
            suggest = math.floor(fractions.max() * 100) / 100
            note += (
                f"; a threshold between {fractions.min():.2f} and {fractions.max():.2f} repeats "
                f"the rarer groups (e.g. repeat_factor:{suggest:g})"
            )
        notes.append(note)
    return BalanceReport(
        by=groups.by,
        unit=unit,
        strategy=strategy,
        names=groups.names,
        raw=raw,
        expected=expected,
        drawn=drawn,
        epoch_length={"raw": float(n), "balanced": float(per_image.sum())},
        seed=seed,
        notes=notes,
    )


def plot_balance(report: BalanceReport, path: str | os.PathLike[str]) -> None:
    """Raw vs balanced (expected) bars per group, and the real draw as markers; a PNG at
    ``path``. Needs matplotlib (the ``plot`` extra); no pyplot state is touched."""
    names = list(report.names)
    x = np.arange(len(names))
    fig = new_figure(figsize=(max(6.0, 0.6 * len(names) + 2), 4.0), dpi=100)
    ax = fig.add_subplot(1, 1, 1)
    ax.bar(x - 0.2, report.raw, width=0.4, label="raw (each image once)")
    ax.bar(x + 0.2, report.expected, width=0.4, label=f"balanced: {report.strategy} (expected)")
    if report.drawn is not None:
        ax.plot(x + 0.2, report.drawn, "k_", markersize=14, label=f"one draw (seed {report.seed})")
    ax.set_xticks(x)
    ax.set_xticklabels(names, rotation=30 if len(names) > 6 else 0, ha="right" if len(names) > 6 else "center")
    ax.set_ylabel(f"{report.unit} per epoch")
    ax.set_title(f"by {', '.join(report.by)}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.fspath(path), format="png")


def summary_rows(report: BalanceReport) -> list[dict[str, Any]]:
    """One dict per group: name, raw, raw share, expected, expected share, drawn, factor."""
    raw_total = float(report.raw.sum()) or 1.0
    exp_total = float(report.expected.sum()) or 1.0
    rows = []
    for i, name in enumerate(report.names):
        raw, exp = float(report.raw[i]), float(report.expected[i])
        rows.append(
            {
                "name": name,
                "raw": raw,
                "raw_share": raw / raw_total,
                "expected": exp,
                "expected_share": exp / exp_total,
                "drawn": None if report.drawn is None else float(report.drawn[i]),
                "factor": exp / raw if raw > 0 else None,
            }
        )
    return rows

