"""Dataset statistics: what an index holds, per class, image class, attribute and landmark."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from detloader.annotations.index import MISSING, AnnotationIndex

#: Quantiles reported for box sizes.
QUANTILES: tuple[float, ...] = (0.0, 0.05, 0.25, 0.5, 0.75, 0.95, 1.0)


def imbalance_ratio(counts: Sequence[float] | np.ndarray) -> float | None:
    """Largest / smallest of the positive counts (``None`` with fewer than one positive)."""
    c = np.asarray(counts, dtype=np.float64)
    c = c[c > 0]
    return float(c.max() / c.min()) if len(c) else None


def _quantiles(values: np.ndarray, digits: int = 2) -> list[float]:
    return [round(float(v), digits) for v in np.quantile(values, QUANTILES)] if len(values) else []


def dataset_stats(index: AnnotationIndex) -> dict[str, Any]:
    """Plain-data statistics of ``index`` (JSON-ready; docs/balancing.md, "Statistics"). Box
    sizes are in pixels at :data:`QUANTILES`, ``relative_sqrt_area`` = sqrt(box area / image
    area); imbalance ratios leave empty classes out."""
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
    landmarks = {name: {"visible": int((vis[:, k] == 2).sum()), "hidden": int((vis[:, k] == 1).sum()),
                        "absent": int((vis[:, k] == 0).sum())} for k, name in enumerate(index.landmark_schema.names)}
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
        "object_attributes": {n: index.attribute_counts(n, "object") for n, _ in index.vocab.object_attributes},
        "image_attributes": {n: index.attribute_counts(n, "image") for n, _ in index.vocab.image_attributes},
        "landmarks": landmarks,
        "box_size": {
            "quantiles": list(QUANTILES),
            "width": _quantiles(w),
            "height": _quantiles(h),
            "sqrt_area": _quantiles(area),
            "relative_sqrt_area": _quantiles(relative, 4),
        },
        "box_sqrt_area_median": per_class_median,
    }
