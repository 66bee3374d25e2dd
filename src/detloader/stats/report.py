"""Class distributions before and after balancing: raw per epoch (every image once), the
expectation under a balanced sampler (from its ``expected_counts()``, analytic) and one real draw,
which checks the expectation. See docs/balancing.md, "Statistics".
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from detloader._system.plotting import new_figure
from detloader.annotations.index import MISSING, AnnotationIndex
from detloader.balance.groups import ByKey, Groups, balance_groups, group_counts
from detloader.balance.weights import DEFAULT_THRESHOLD, parse_strategy
from detloader.errors import DetloaderValueError, EmptyIndexError
from detloader.stats.describe import frequency_groups, imbalance_ratio, training_frequency

Unit = Literal["objects", "images"]
LogScale = bool | Literal["auto"]

#: :func:`balance_report` warns when one image is expected more than this many times per epoch.
REPEAT_WARNING = 10.0


def default_unit(groups: Groups) -> Unit:
    """What is counted per group by default: objects for object keys, images for image keys."""
    return "objects" if groups.level == "object" else "images"


def group_totals(groups: Groups, per_image: np.ndarray, unit: Unit = "objects") -> np.ndarray:
    """float64 ``[G]``: per group, the objects or the images containing it (``unit``; image keys
    count images) in a draw where image ``i`` appears ``per_image[i]`` times."""
    e = np.asarray(per_image, dtype=np.float64)
    if e.shape != (groups.num_images,):
        raise DetloaderValueError(f"per_image has shape {e.shape}, expected ({groups.num_images},)")
    g = len(groups.names)
    if unit == "objects" or groups.level == "image":
        valid = groups.ids != MISSING
        return np.bincount(groups.ids[valid], weights=e[groups.image_of[valid]], minlength=g)
    if unit != "images":
        raise DetloaderValueError(f"unit={unit!r} is not one of 'objects', 'images'")
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
    #: the image drawn most often per epoch in expectation (path relative to the root) and how
    #: often; over ``balance_report(repeat_warning=)`` it is in ``warnings``
    most_repeated: str = ""
    max_repeats: float = 0.0
    warnings: list[str] = field(default_factory=list)
    #: per frequency group (rare, common, frequent: ``frequency_names``), the share of an epoch's
    #: ``unit`` that holds it, raw and balanced (expected); objects of classes in no group count
    #: in the total, in no group; image shares may overlap (an image can hold several groups)
    frequency_names: tuple[str, ...] = ()
    frequency_raw: np.ndarray = field(default_factory=lambda: np.zeros(0))
    frequency_expected: np.ndarray = field(default_factory=lambda: np.zeros(0))

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
            return None if values is None else {n: round(float(v), digits) for n, v in zip(self.names, values)}

        dev = self.max_deviation()
        ratios = {"raw": _round(imbalance_ratio(self.raw)),
                  "balanced": _round(imbalance_ratio(np.where(self.raw > 0, self.expected, 0)))}
        return {"by": list(self.by), "unit": self.unit, "strategy": self.strategy,
                "raw": {n: int(round(float(v))) for n, v in zip(self.names, self.raw)},
                "balanced": table(self.expected), "drawn": table(self.drawn, 0),
                "epoch_length": {k: round(v, 2) for k, v in self.epoch_length.items()}, "imbalance_ratio": ratios,
                "max_drawn_deviation": None if dev is None else round(dev, 4), "seed": self.seed,
                "notes": list(self.notes),
                "max_repeats": {"image": self.most_repeated, "expected": round(self.max_repeats, 2)},
                "warnings": list(self.warnings),
                "frequency_shares": {n: {"raw": round(float(r), 4), "balanced": round(float(e), 4)} for n, r, e in
                                     zip(self.frequency_names, self.frequency_raw, self.frequency_expected)}}


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
    repeat_warning: float = REPEAT_WARNING,
    frequency: Mapping[str, str | None] | None = None,
) -> BalanceReport:
    """Raw vs balanced per-epoch distribution of ``index`` under ``balance``.

    ``balance`` is what :func:`detloader.balance.make_balanced_sampler` takes (a sampler must
    have ``expected_counts()``); the sampler is built with ``by`` and ``seed``. ``unit``: what
    is counted per group (default: :func:`default_unit`). ``draw=True`` adds one real epoch's
    counts (all ranks). When one image is expected more than ``repeat_warning`` times per
    epoch, ``warnings`` names it and suggests a milder strategy. ``frequency``: class name ->
    ``"r"`` / ``"c"`` / ``"f"`` / None, the LVIS frequency groups whose epoch shares the report
    gives (default: :func:`~detloader.stats.describe.training_frequency` of ``index``). An index
    without images raises :class:`EmptyIndexError`.
    """
    if len(index) == 0:
        raise EmptyIndexError(f"the index holds no images ({index.root}): nothing to count or balance (is the path "
                              "or the annotation format wrong?)")
    groups = balance_groups(index, by)
    if unit is None:
        unit = default_unit(groups)
    if unit not in ("objects", "images"):
        raise DetloaderValueError(f"unit={unit!r} is not one of 'objects', 'images'")
    from detloader.balance.weighted import make_balanced_sampler  # torch loads with the samplers

    sampler = make_balanced_sampler(index, balance, by=by, seed=seed, num_samples=num_samples, rank=0, world_size=1)
    if not hasattr(sampler, "expected_counts"):
        raise DetloaderValueError(f"balance={type(sampler).__name__}: the sampler has no expected_counts(), so the "
                                  "balanced distribution cannot be computed")
    n = len(index)
    per_image = np.zeros(n, dtype=np.float64)
    expected_draws = np.asarray(sampler.expected_counts(), dtype=np.float64)
    per_image[: min(n, len(expected_draws))] = expected_draws[:n]
    raw = group_totals(groups, np.ones(n), unit)
    expected = group_totals(groups, per_image, unit)
    drawn = group_totals(groups, _draw_counts(sampler, n), unit) if draw else None
    strategy = balance if isinstance(balance, str) else type(sampler).__name__
    name, params = parse_strategy(strategy)
    notes: list[str] = []
    if name == "repeat_factor" and np.allclose(per_image, 1.0):
        threshold = params.get("threshold", DEFAULT_THRESHOLD)
        fractions = group_counts(groups, "images") / max(n, 1)
        fractions = fractions[fractions > 0]
        note = f"every repeat factor is 1 at threshold {threshold:g}"
        if len(fractions):
            note += f": each group is in at least {fractions.min():.1%} of the images, so balancing changes nothing"
        if len(fractions) and fractions.max() > fractions.min():
            suggest = math.floor(fractions.max() * 100) / 100
            note += (f"; a threshold between {fractions.min():.2f} and {fractions.max():.2f} repeats "
                     f"the rarer groups (e.g. repeat_factor:{suggest:g})")
        notes.append(note)
    top = int(np.argmax(per_image))
    most_repeated, max_repeats = index.relative_image_path(top), float(per_image[top])
    warnings = []
    if max_repeats > repeat_warning:
        warnings.append(f"{most_repeated} is drawn {max_repeats:.1f} times per epoch in expectation (over "
                        f"{repeat_warning:g}); {_milder(name, params)} repeats it less")
    freq = frequency_groups(index, training_frequency(index)[0] if frequency is None else frequency)
    per_object = index.objects_per_image.astype(np.float64)
    totals = (float(n), float(per_image.sum())) if unit == "images" else (
        float(per_object.sum()), float(per_object @ per_image))
    freq_raw, freq_expected = (group_totals(freq, e, unit) / max(t, 1e-12)
                               for e, t in ((np.ones(n), totals[0]), (per_image, totals[1])))
    return BalanceReport(by=groups.by, unit=unit, strategy=strategy, names=groups.names, raw=raw, expected=expected,
                         drawn=drawn, epoch_length={"raw": float(n), "balanced": float(per_image.sum())}, seed=seed,
                         notes=notes, most_repeated=most_repeated, max_repeats=max_repeats, warnings=warnings,
                         frequency_names=freq.names, frequency_raw=freq_raw, frequency_expected=freq_expected)


def _milder(name: str, params: dict[str, Any]) -> str:
    """A strategy that repeats the rarest images less than ``name`` with ``params``."""
    if name == "sqrt":
        return "a milder strategy such as power:0.25 or repeat_factor"
    if name == "power" and "power" in params:
        return f"a milder strategy such as power:{params['power'] / 2:g} or repeat_factor"
    if name == "repeat_factor":
        threshold = params.get("threshold", DEFAULT_THRESHOLD)
        return f"a lower threshold (repeat_factor:{threshold / 10:g}) or sqrt"
    return "a milder strategy such as sqrt or repeat_factor"


def summary_rows(report: BalanceReport) -> list[dict[str, Any]]:
    """One dict per group: name, raw, raw share, expected, expected share, drawn, factor."""
    raw_total = float(report.raw.sum()) or 1.0
    exp_total = float(report.expected.sum()) or 1.0
    rows = []
    for i, name in enumerate(report.names):
        raw, exp = float(report.raw[i]), float(report.expected[i])
        rows.append({"name": name, "raw": raw, "raw_share": raw / raw_total, "expected": exp,
                     "expected_share": exp / exp_total,
                     "drawn": None if report.drawn is None else float(report.drawn[i]),
                     "factor": exp / raw if raw > 0 else None})
    return rows


#: ``log="auto"`` draws a log axis when the largest bar is more than this many times the
#: smallest non-zero one: on a linear axis such a rare group is a bar of a pixel or two.
LOG_AUTO_RATIO = 20.0


def use_log_scale(report: BalanceReport, log: LogScale = "auto") -> bool:
    """Whether :func:`plot_balance` draws ``report`` on a log axis: ``True`` / ``False`` as
    given; ``"auto"``: when the largest / smallest non-zero bar (raw or balanced) is over
    :data:`LOG_AUTO_RATIO`."""
    if log == "auto":
        ratio = imbalance_ratio(np.concatenate([report.raw, report.expected]))
        return ratio is not None and ratio > LOG_AUTO_RATIO
    if isinstance(log, bool):
        return log
    raise DetloaderValueError(f"log={log!r} is not one of True, False, 'auto'")


def plot_balance(
    report: BalanceReport, path: str | os.PathLike[str], log: LogScale = "auto", top: int = 20
) -> None:
    """Raw vs balanced (expected) bars per group, and the real draw as markers; a PNG at
    ``path``. ``log``: a log y axis, ``True``, ``False`` or ``"auto"`` (see
    :func:`use_log_scale`). With more than ``top + 1`` groups (``top=0``: no limit), the ``top``
    largest by raw count and one "N more" group summing the rest. Needs matplotlib (the ``plot``
    extra); no pyplot state is touched."""
    logarithmic = use_log_scale(report, log)
    names, raw, expected, drawn = list(report.names), report.raw, report.expected, report.drawn
    if 0 < top < len(names) - 1:
        order = np.argsort(-raw, kind="stable")
        head, rest = order[:top], order[top:]
        names = [names[i] for i in head] + [f"{len(rest):,} more"]
        raw, expected = (np.append(a[head], a[rest].sum()) for a in (report.raw, report.expected))
        drawn = None if drawn is None else np.append(drawn[head], drawn[rest].sum())
    x = np.arange(len(names))
    fig = new_figure(figsize=(max(6.0, 0.6 * len(names) + 2), 4.0), dpi=100)
    ax = fig.add_subplot(1, 1, 1)
    ax.bar(x - 0.2, raw, width=0.4, label="raw (each image once)")
    ax.bar(x + 0.2, expected, width=0.4, label=f"balanced: {report.strategy} (expected)")
    if drawn is not None:
        ax.plot(x + 0.2, drawn, "k_", markersize=14, label=f"one draw (seed {report.seed})")
    ax.set_xticks(x)
    ax.set_xticklabels(names, rotation=30 if len(names) > 6 else 0, ha="right" if len(names) > 6 else "center")
    ax.set_ylabel(f"{report.unit} per epoch" + (" (log scale)" if logarithmic else ""))
    if logarithmic:
        ax.set_yscale("log", nonpositive="clip")
        heights = np.concatenate([raw, expected])
        heights = heights[heights > 0]
        if len(heights):
            ax.set_ylim(bottom=heights.min() / 2)
    ax.set_title(f"by {', '.join(report.by)}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.fspath(path), format="png")
