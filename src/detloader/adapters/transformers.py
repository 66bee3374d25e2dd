"""Hugging Face transformers: fine-tune DETR-family detectors (DETR, Conditional / Deformable
DETR, RT-DETR, D-FINE, YOLOS) with ``Trainer`` and detloader's class-balanced draw
(``pip install 'detloader[transformers]'``)::

    train = detection_dataset(index.split("train"), processor)   # any index or DetectionDataset
    val = detection_dataset(index.split("val"), processor)
    model = DetrForObjectDetection(DetrConfig(..., id2label=id2label(train), label2id=label2id(train)))
    trainer = balanced_trainer("inverse")(model=model, args=args, train_dataset=train, eval_dataset=val,
                                          data_collator=train.collate,
                                          compute_metrics=coco_metrics(val, processor))

The training sampler is one global draw per epoch, the same on every process (Accelerate shares it
out; a resume skips the batches already trained). docs/transformers.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from detloader.errors import DetloaderTypeError, DetloaderValueError, MissingExtraError, ModelLabelsError

try:
    from transformers import Trainer
    from transformers.utils import ModelOutput
except ImportError:
    raise MissingExtraError(
        "detloader.transformers needs transformers: pip install 'detloader[transformers]'"
    ) from None

from detloader.annotations.index import MISSING, AnnotationIndex
from detloader.balance.groups import normalize_by
from detloader.balance.label_lists import check_balance
from detloader.balance.weighted import make_balanced_sampler
from detloader.dataset import DetectionDataset
from detloader.train.metrics import Backend, score_predictions
from detloader.transforms.functional import affine_boxes

__all__ = [
    "BalancedTrainer", "DetectionCollator", "HFDetectionDataset", "balanced_trainer", "check_model_labels",
    "coco_metrics", "detection_dataset", "flat_metrics", "id2label", "label2id", "metric_labels",
]

#: The key each image's ``labels`` dict carries beside the processor's: float64 ``[1, 6]`` ``(sx,
#: sy, ox, oy, H, W)``: ``x = x' * sx + ox`` maps a box of the processed (resized, unpadded) image to
#: annotation coordinates, ``H, W`` the (padded) frame its normalised boxes refer to, what
#: :func:`coco_metrics` needs to put predictions back in the dataset's pixels. One row: at the end
#: of an evaluation ``Trainer`` (Accelerate's ``gather_for_metrics``) cuts every label tensor to
#: the last batch's count of images, which would cut a ``[6]``.
TO_ORIGINAL = "to_original"


def _index_of(data: Any) -> AnnotationIndex:
    index = getattr(data, "index", data)
    if not isinstance(index, AnnotationIndex):
        raise DetloaderTypeError(
            f"{type(data).__name__}: expected an AnnotationIndex, a DetectionDataset or detection_dataset(...)"
        )
    return index


def id2label(data: Any) -> dict[int, str]:
    """``{class id: name}`` of an index, a DetectionDataset or :func:`detection_dataset` (the ids the
    processor's ``class_labels`` hold: ``index.classes`` in order), for the model's config."""
    return dict(enumerate(_index_of(data).classes))


def label2id(data: Any) -> dict[str, int]:
    """``{name: class id}``: the inverse of :func:`id2label`."""
    return {name: k for k, name in id2label(data).items()}


class HFDetectionDataset(Dataset[dict[str, Any]]):
    """A :class:`DetectionDataset` as the image processors and ``Trainer`` take it: item ``i`` is
    the processor's output for image ``i`` after the dataset's transform (augmentations
    included): ``{"pixel_values": float [3, h, w], "pixel_mask": [h, w] (when the processor makes
    one), "labels": {...}}``. The processor gets ``{"image_id": row of the index, "annotations":
    [{"category_id": class id, "bbox": xywh pixels of the transformed image, "area", "iscrowd"}]}``
    (the processors drop crowd objects); ``labels`` also holds :data:`TO_ORIGINAL`.

    ``collate`` (a :class:`DetectionCollator`) is the ``data_collator`` it needs."""

    def __init__(self, dataset: DetectionDataset, image_processor: Any) -> None:
        if not callable(image_processor):
            raise DetloaderTypeError(f"image_processor={image_processor!r} is not callable")
        self.dataset, self.image_processor = dataset, image_processor
        self.collate = DetectionCollator(bool(getattr(image_processor, "do_convert_annotations", True)))

    @property
    def index(self) -> AnnotationIndex:
        return self.dataset.index

    def __len__(self) -> int:
        return len(self.dataset)

    def set_epoch(self, epoch: int) -> None:
        """The epoch of the augmentations' generators (the sampler of :class:`BalancedTrainer` calls it)."""
        self.dataset.set_epoch(epoch)

    def __getitem__(self, i: int) -> dict[str, Any]:
        sample = self.dataset[i]
        boxes = np.asarray(sample.boxes, dtype=np.float64).reshape(-1, 4)
        crowd = (np.zeros(len(boxes), bool) if isinstance(sample.object_ids, int) and sample.object_ids == MISSING
                 else np.asarray(self.index.crowd)[sample.object_ids])
        wh = boxes[:, 2:] - boxes[:, :2]
        annotations = [
            {"category_id": int(c), "bbox": [float(b[0]), float(b[1]), float(s[0]), float(s[1])],
             "area": float(s[0] * s[1]), "iscrowd": int(k)}
            for b, s, c, k in zip(boxes, wh, np.asarray(sample.labels).tolist(), crowd.tolist())
        ]
        target = {"image_id": int(sample.image_id), "annotations": annotations}
        image = sample.image.permute(1, 2, 0).contiguous().numpy()  # HWC uint8
        out = self.image_processor(images=[image], annotations=[target], return_tensors="pt")
        labels = dict(out["labels"][0])
        h, w = (int(v) for v in labels["size"])
        isx, isy, iox, ioy = sample._to_original()  # sample image -> annotation coordinates
        width, height = sample.size
        labels[TO_ORIGINAL] = torch.tensor([[width / w * isx, height / h * isy, iox, ioy, h, w]], dtype=torch.float64)
        item = {"pixel_values": out["pixel_values"][0], "labels": labels}
        if "pixel_mask" in out:
            item["pixel_mask"] = out["pixel_mask"][0]
        return item


class DetectionCollator:
    """Pads a list of :class:`HFDetectionDataset` items to the largest height and width (zeros
    below and right, ``pixel_mask`` 0 there) as the processors' ``pad`` does: normalised boxes
    (``normalized``, the processors' ``do_convert_annotations``) are rescaled to the padded
    size, and ``labels[k]["size"]`` becomes it. Returns ``{"pixel_values": [B, 3, H, W],
    "pixel_mask": [B, H, W] (when the items have one), "labels": [dict per image]}``."""

    def __init__(self, normalized: bool = True) -> None:
        self.normalized = normalized

    def __call__(self, items: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        height = max(int(x["pixel_values"].shape[-2]) for x in items)
        width = max(int(x["pixel_values"].shape[-1]) for x in items)
        first = items[0]["pixel_values"]
        pixels = first.new_zeros((len(items), first.shape[0], height, width))
        mask = torch.zeros((len(items), height, width), dtype=torch.int64)
        labels = []
        for k, x in enumerate(items):
            h, w = x["pixel_values"].shape[-2:]
            pixels[k, :, :h, :w] = x["pixel_values"]
            mask[k, :h, :w] = x["pixel_mask"] if "pixel_mask" in x else 1
            target = dict(x["labels"])
            if self.normalized and (h, w) != (height, width) and len(target.get("boxes", ())):
                factor = torch.tensor([w / width, h / height, w / width, h / height], dtype=target["boxes"].dtype)
                target["boxes"] = target["boxes"] * factor
            target["size"] = torch.tensor([height, width], dtype=torch.int64)
            if TO_ORIGINAL in target:
                target[TO_ORIGINAL] = target[TO_ORIGINAL].clone()
                target[TO_ORIGINAL][:, 4:] = torch.tensor([height, width], dtype=torch.float64)
            labels.append(target)
        batch = {"pixel_values": pixels, "labels": labels}
        if "pixel_mask" in items[0]:
            batch["pixel_mask"] = mask
        return batch


def detection_dataset(index_or_dataset: AnnotationIndex | DetectionDataset, image_processor: Any) -> HFDetectionDataset:
    """``index_or_dataset`` (an index: its images as they are; a :class:`DetectionDataset`: with its
    transform) through ``image_processor`` (a transformers image processor of a DETR-family
    model), as :class:`HFDetectionDataset`; ``.collate`` is its ``data_collator``."""
    if isinstance(index_or_dataset, HFDetectionDataset):
        return HFDetectionDataset(index_or_dataset.dataset, image_processor)
    if isinstance(index_or_dataset, AnnotationIndex):
        index_or_dataset = DetectionDataset(index_or_dataset, seed=0)
    if not isinstance(index_or_dataset, DetectionDataset):
        raise DetloaderTypeError(
            f"index_or_dataset={type(index_or_dataset).__name__}: expected an AnnotationIndex or a DetectionDataset"
        )
    return HFDetectionDataset(index_or_dataset, image_processor)


# -- the model's classes ----------------------------------------------------------------------
_DEFAULT_NAME = re.compile(r"LABEL_\d+")


def check_model_labels(model: Any, data: Any) -> None:
    """Raises :class:`ModelLabelsError` when ``model.config`` does not have the classes of
    ``data`` (an index or dataset): another ``num_labels``, or ``id2label`` names (other than
    transformers' placeholders ``LABEL_k``) that differ from the index's, in order."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "num_labels"):
        return
    names = list(_index_of(data).classes)
    fix = f"build it with num_labels={len(names)}, id2label=id2label(dataset), label2id=label2id(dataset)"
    if int(config.num_labels) != len(names):
        raise ModelLabelsError(
            f"model.config.num_labels={config.num_labels}, the dataset has {len(names)} classes {names}: {fix}"
        )
    given = [str(config.id2label[k]) for k in sorted(config.id2label)]
    if not all(_DEFAULT_NAME.fullmatch(n) for n in given) and given != names:
        raise ModelLabelsError(f"model.config.id2label names {given}, the dataset's classes are {names}: {fix}")


# -- training ---------------------------------------------------------------------------------
class _GlobalDraw(Sampler[int]):
    """The balanced sampler of the whole dataset (rank 0 of 1: every process draws the same order,
    Accelerate shares out its batches); ``set_epoch`` selects the epoch's draw and the epoch of
    the dataset's augmentations."""

    def __init__(self, sampler: Any, dataset: HFDetectionDataset) -> None:
        self.sampler, self.dataset = sampler, dataset

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)
        self.dataset.set_epoch(epoch)

    def indices(self) -> np.ndarray:
        """The current epoch's global order (int array)."""
        return np.asarray(self.sampler.indices())

    def __iter__(self) -> Iterator[int]:
        return iter(self.sampler)

    def __len__(self) -> int:
        return len(self.sampler)


class BalancedTrainer(Trainer):
    """transformers' ``Trainer`` whose training sampler is detloader's balanced draw of the
    :func:`detection_dataset` it trains on.

    The class attributes hold the strategy (:func:`balanced_trainer` makes subclasses):
    ``balance`` any ``make_loader(balance=)`` strategy or ``{class: weight}``; ``balance_by``
    ``make_loader``'s ``balance_by``; ``balance_seed`` the draw's seed. A new draw each epoch
    (``Trainer`` calls ``set_epoch``); the same global order on every process. On construction the
    model's classes are checked against the training (and evaluation) dataset's
    (:class:`ModelLabelsError`)."""

    balance: ClassVar[str | Mapping[Any, float]] = "sqrt"
    balance_by: ClassVar[str | tuple[str, ...]] = "class"
    balance_seed: ClassVar[int] = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        train = kwargs.get("train_dataset")
        if kwargs.get("data_collator") is None and isinstance(train, HFDetectionDataset):
            kwargs["data_collator"] = train.collate  # the default collator cannot batch the labels
        super().__init__(*args, **kwargs)
        for data in (self.train_dataset, self.eval_dataset):
            if isinstance(data, HFDetectionDataset):
                check_model_labels(self.model, data)

    def prediction_step(self, model: Any, inputs: Any, prediction_loss_only: bool,
                        ignore_keys: list[str] | None = None) -> tuple[Any, Any, Any]:
        """``Trainer``'s, the labels handed on to the metrics as :func:`metric_labels`: one tensor
        of fixed width per batch, which Accelerate gathers across processes (the per-image dicts
        of different lengths make its ``all_gather`` fail) and ``Trainer`` can concatenate."""
        loss, logits, labels = super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys)
        if isinstance(labels, (list, tuple)) and labels and isinstance(labels[0], Mapping):
            labels = metric_labels(labels).to(self.args.device)
        return loss, logits, labels

    def _get_train_sampler(self, train_dataset: Any = None) -> Sampler[int]:
        dataset = self.train_dataset if train_dataset is None else train_dataset
        if not isinstance(dataset, HFDetectionDataset):
            raise DetloaderTypeError(
                f"train_dataset={type(dataset).__name__}: BalancedTrainer draws from detloader's index; "
                "pass detection_dataset(index_or_dataset, image_processor)"
            )
        sampler = make_balanced_sampler(dataset.index, self.balance, by=self.balance_by, seed=self.balance_seed,
                                        rank=0, world_size=1)
        return _GlobalDraw(sampler, dataset)


def balanced_trainer(
    balance: str | Mapping[Any, float] = "sqrt", by: str | Sequence[str] = "class", seed: int = 0
) -> type[BalancedTrainer]:
    """A :class:`BalancedTrainer` subclass with this strategy, used as ``Trainer`` is. ``balance``
    as ``make_loader(balance=)`` takes it, ``by`` as its ``balance_by`` (checked here, before any
    data is read); ``seed`` the draw's (the ``TrainingArguments`` seed stays the model's)."""
    balance = check_balance(balance)
    keys = normalize_by(by)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise DetloaderValueError(f"seed={seed!r} must be an int >= 0")
    attrs = {"balance": balance, "balance_by": keys, "balance_seed": seed, "__module__": __name__,
             "__doc__": f"BalancedTrainer with balance={balance!r}, by={','.join(keys)!r}, seed={seed!r}."}
    return type("BalancedTrainer", (BalancedTrainer,), attrs)


# -- evaluation -------------------------------------------------------------------------------
def _outputs(batch: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(logits, pred_boxes)`` of one batch of ``Trainer``'s predictions: the first two 3-D
    arrays of the model output in order (every DETR-family output has ``logits`` then
    ``pred_boxes``; ``loss_dict`` and the other fields are passed over)."""
    parts = batch if isinstance(batch, (tuple, list)) else (batch,)
    arrays = [np.asarray(p) for p in parts if not isinstance(p, Mapping) and np.ndim(p) == 3]
    if len(arrays) < 2 or arrays[1].shape[-1] != 4 or arrays[0].shape[:2] != arrays[1].shape[:2]:
        shapes = [np.shape(p) if not isinstance(p, Mapping) else "dict" for p in parts]
        raise DetloaderValueError(
            f"predictions of shapes {shapes}: expected logits [B, Q, C] then pred_boxes [B, Q, 4]"
        )
    return arrays[0], arrays[1]


def metric_labels(labels: Sequence[Mapping[str, Any]]) -> torch.Tensor:
    """What :func:`coco_metrics` reads of a batch's ``labels``, float64 ``[B, 7]``: each image's
    ``image_id`` (an index row: exact in float64) then its :data:`TO_ORIGINAL` row."""
    return torch.stack([
        torch.cat([torch.as_tensor(t["image_id"], dtype=torch.float64).reshape(-1)[:1],
                   torch.as_tensor(t[TO_ORIGINAL], dtype=torch.float64).reshape(-1)[:6]])
        for t in labels
    ])


def _eval_batches(predictions: Any, labels: Any) -> list[tuple[Any, np.ndarray]]:
    """``(predictions, metric labels [B, 7])`` per batch of ``Trainer``'s evaluation: the labels
    as :class:`BalancedTrainer` hands them on (one array, or one per batch with
    ``eval_do_concat_batches=False``), or ``Trainer``'s per-image dicts per batch."""
    if isinstance(labels, np.ndarray) and labels.ndim == 2 and labels.shape[1] == 7:
        return [(predictions, labels)]
    if isinstance(labels, (list, tuple)) and isinstance(predictions, (list, tuple)) and len(labels) == len(predictions):
        if all(isinstance(t, np.ndarray) and t.ndim == 2 and t.shape[1] == 7 for t in labels):
            return list(zip(predictions, labels))
        if all(isinstance(t, (list, tuple)) and all(isinstance(d, Mapping) for d in t) for t in labels):
            return [(p, metric_labels(t).numpy()) for p, t in zip(predictions, labels)]
    raise DetloaderValueError(
        "coco_metrics: the labels are neither BalancedTrainer's nor a list of batches of per-image dicts; "
        "with a plain Trainer set TrainingArguments(eval_do_concat_batches=False) (under several processes "
        "use balanced_trainer(), whose labels gather across processes)"
    )


def coco_metrics(
    eval_dataset: HFDetectionDataset,
    image_processor: Any,
    *,
    threshold: float = 0.0,
    score_threshold: float = 0.3,
    backend: Backend = "auto",
) -> Callable[[Any], dict[str, float]]:
    """A ``compute_metrics`` for ``Trainer``: each batch's ``logits`` / ``pred_boxes`` through
    ``image_processor.post_process_object_detection(threshold=threshold)``, mapped back to the
    annotation's pixels, scored by :func:`detloader.train.score_predictions` against
    ``eval_dataset``'s index (every image counts, the dataset's own ids and categories;
    ``score_threshold`` its operating point). Returns the numeric figures flat: ``map50``,
    ``map50_95``, ``precision``, ``recall``, ``tp``, ``fp``, ``fn``, ... and per class
    ``ap50/<class>``, ``ap50_95/<class>`` (``Trainer`` prefixes ``eval_``).

    With :class:`BalancedTrainer` it works under any number of processes and either
    ``eval_do_concat_batches``. A plain ``Trainer`` needs ``eval_do_concat_batches=False`` and
    one process (its per-image labels cannot be concatenated or gathered); a DetloaderValueError
    says so otherwise."""
    index = _index_of(eval_dataset)

    def compute(eval_pred: Any) -> dict[str, float]:
        predictions = []
        for batch, target in _eval_batches(eval_pred.predictions, eval_pred.label_ids):
            logits, boxes = _outputs(batch)
            target = np.asarray(target, dtype=np.float64)
            sizes = torch.as_tensor(target[:, 5:], dtype=torch.int64)
            output = ModelOutput(logits=torch.as_tensor(logits), pred_boxes=torch.as_tensor(boxes))
            found = image_processor.post_process_object_detection(output, threshold=threshold, target_sizes=sizes)
            for row, f in zip(target.tolist(), found):
                sx, sy, ox, oy = row[1:5]
                predictions.append({
                    "image_id": int(row[0]),
                    "boxes": affine_boxes(f["boxes"].detach().cpu().numpy(), sx, sy, ox, oy),
                    "scores": f["scores"], "labels": f["labels"],
                })
        metrics = score_predictions(predictions, index, score_threshold=score_threshold, backend=backend)
        return flat_metrics(metrics)

    return compute


def flat_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The numeric figures of :func:`~detloader.train.score_predictions`' dict, one level deep:
    top-level numbers as they are, per class ``ap50/<class>`` and ``ap50_95/<class>``; undefined
    figures (None) and text are left out."""
    out = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    for name, row in metrics.get("per_class", {}).items():
        for key in ("ap50", "ap50_95"):
            if row.get(key) is not None:
                out[f"{key}/{name}"] = float(row[key])
    return out
