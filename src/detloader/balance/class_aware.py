"""The samplers driven by per-class member lists: :class:`ClassAwareSampler` (Shen et al. 2016)
and :class:`BalancedBatchSampler` (P x K batches; its resume ``offset`` counts batches), on
:class:`ClassSampler`, which holds the member lists and the picks from a class's shuffled list.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from detloader.annotations.distinct import distinct_count, is_strictly_increasing, unique_sorted
from detloader.annotations.index import AnnotationIndex
from detloader.balance.base import (
    STREAM_BATCH,
    STREAM_CLASS_AWARE,
    EpochSampler,
    check_int,
    epoch_generator,
    index_dtype,
)
from detloader.balance.groups import ByKey, class_members, positions_by_group
from detloader.errors import DetloaderValueError


def _distinct_members(m: Any) -> np.ndarray:
    """``m`` as sorted distinct int64 ids (``np.unique``; an already strictly increasing array,
    as :func:`class_members` gives, is kept without a sort)."""
    a = np.array(m, dtype=np.int64).reshape(-1)  # a copy: the sampler never shares the caller's array
    return a if is_strictly_increasing(a) else unique_sorted(a)


def _as_members(class_members: Sequence[Any]) -> list[np.ndarray]:
    members = [_distinct_members(m) for m in class_members]
    if not members or not any(len(m) for m in members):
        raise DetloaderValueError("class_members: no class has a member")
    for c, m in enumerate(members):
        if len(m) and m[0] < 0:
            raise DetloaderValueError(f"class_members[{c}] holds a negative id {int(m[0])}")
    return members


def members_from_labels(labels: Any) -> list[np.ndarray]:
    """Per class, the ids of the items with that label (``labels`` int ``[n]``; negative
    labels, e.g. MISSING, belong to no class)."""
    labels = np.asarray(labels, dtype=np.int64).reshape(-1)
    if not (labels >= 0).any():
        return []
    return positions_by_group(labels, int(labels.max()) + 1)


def _cycled_picks(rng: np.random.Generator, members: np.ndarray, count: int) -> np.ndarray:
    """``count`` picks from ``members``: consecutive shuffled passes over all of them, so every
    member is used once before any is used twice."""
    if count <= 0:
        return members[:0]
    passes = -(-count // len(members))
    keys = rng.random((passes, len(members)))
    return members[np.argsort(keys, axis=1).reshape(-1)[:count]]


class ClassSampler(EpochSampler):
    """Base of the class-based samplers: ``class_members`` (per class, item ids) checked and
    kept; ``num_items`` is the largest id + 1. Classes without members are skipped."""

    def __init__(self, class_members: Sequence[Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.class_members = _as_members(class_members)
        self._classes = np.array([c for c, m in enumerate(self.class_members) if len(m)], dtype=np.int64)
        self.num_items = int(max(int(m[-1]) for m in self.class_members if len(m))) + 1
        self._distinct = distinct_count(np.concatenate([m for m in self.class_members if len(m)]), self.num_items)

    def _visit_share(self) -> np.ndarray:
        """float64 ``[num_items]``: expected picks of each item per class visit, summed over
        its classes (``sum_c 1 / |members_c|``)."""
        members = [self.class_members[c] for c in self._classes]
        sizes = np.array([len(m) for m in members], dtype=np.int64)
        # bincount adds in array order, i.e. class by class: the same sums as a loop over classes
        weights = np.repeat(1.0 / sizes, sizes)
        return np.bincount(np.concatenate(members), weights=weights, minlength=self.num_items)

    def _picks(self, rng: np.random.Generator, slots: np.ndarray, per_slot: int) -> np.ndarray:
        """int ``[len(slots), per_slot]``: for each slot, ``per_slot`` items of its class
        (``slots``: positions into the classes with members). A class's picks, over all its
        slots in order, are consecutive shuffled passes over its members."""
        out = np.empty((len(slots), per_slot), dtype=index_dtype(self.num_items))
        for j, where in enumerate(positions_by_group(slots, len(self._classes))):
            picks = _cycled_picks(rng, self.class_members[self._classes[j]], len(where) * per_slot)
            out[where] = picks.reshape(len(where), per_slot)
        return out


class ClassAwareSampler(ClassSampler):
    """Class-aware sampling: classes round-robin (a new random order each round), on each visit
    the next image of that class from its own shuffled list. Every class gets the same number
    of draws per epoch (+-1). ``class_members``: per class, the ids of the items that contain
    it (:meth:`from_index`, or :func:`members_from_labels` from one label per item);
    ``num_samples``: draws per epoch over all ranks (default: the number of distinct items).
    """

    def __init__(self, class_members: Sequence[Any], num_samples: int | None = None, *, seed: int = 0,
                 rank: int | None = None, world_size: int | None = None, drop_last: bool = False) -> None:
        super().__init__(class_members, seed=seed, rank=rank, world_size=world_size, drop_last=drop_last)
        if num_samples is None:
            num_samples = self._distinct
        self.num_samples = check_int("num_samples", num_samples, 1)

    @classmethod
    def from_index(cls, index: AnnotationIndex, by: ByKey = "class", **kwargs: Any) -> ClassAwareSampler:
        """Classes (groups) of ``index`` under key ``by`` (see :mod:`detloader.balance.weights`)."""
        return cls(class_members(index, by)[1], **kwargs)

    def _config(self) -> dict[str, Any]:
        return {**super()._config(), "num_samples": self.num_samples, "drop_last": self.drop_last}

    def global_indices(self) -> np.ndarray:
        """This epoch's indices over all ranks, before padding."""
        rng = epoch_generator(self.seed, self.epoch, STREAM_CLASS_AWARE)
        n, c = self.num_samples, len(self._classes)
        rounds = -(-n // c)
        seq = np.argsort(rng.random((rounds, c)), axis=1).reshape(-1)[:n]  # positions into classes
        return self._picks(rng, seq, 1).reshape(-1)

    def _rank_items(self) -> np.ndarray:
        return self._cached_share(self.global_indices)

    def expected_counts(self) -> np.ndarray:
        """float64 ``[num_items]``: expected draws of each item per epoch, all ranks: each
        class gets ``num_samples / C`` draws in expectation, shared equally by its members."""
        return self._visit_share() * (self.num_samples / len(self._classes))


class BalancedBatchSampler(ClassSampler):
    """A batch sampler: each batch holds ``classes_per_batch`` (P) distinct classes drawn
    uniformly, and ``samples_per_class`` (K) items of each, taken from the class's shuffled
    list (reshuffled when used up). Yields lists of ``P * K`` indices; pass it to a DataLoader
    as ``batch_sampler``. An item in two chosen classes, or a class with fewer than K
    members, can repeat an index within a batch.

    Args:
        class_members: as :class:`ClassAwareSampler`.
        classes_per_batch: P, at most the number of classes with members.
        samples_per_class: K.
        num_batches: batches per epoch over all ranks (default: distinct items // (P * K),
            at least 1). With ``world_size`` W, rank r gets batches r::W (wrapped or cut).
    """

    def __init__(self, class_members: Sequence[Any], classes_per_batch: int, samples_per_class: int,
                 num_batches: int | None = None, *, seed: int = 0, rank: int | None = None,
                 world_size: int | None = None, drop_last: bool = False) -> None:
        super().__init__(class_members, seed=seed, rank=rank, world_size=world_size, drop_last=drop_last)
        c = len(self._classes)
        self.classes_per_batch = check_int("classes_per_batch", classes_per_batch, 1)
        self.samples_per_class = check_int("samples_per_class", samples_per_class, 1)
        if classes_per_batch > c:
            raise DetloaderValueError(f"classes_per_batch={classes_per_batch} > {c} classes with members")
        if num_batches is None:
            num_batches = max(1, self._distinct // (self.classes_per_batch * self.samples_per_class))
        self.num_batches = check_int("num_batches", num_batches, 1)

    @classmethod
    def from_index(
        cls, index: AnnotationIndex, classes_per_batch: int, samples_per_class: int, by: ByKey = "class", **kwargs: Any
    ) -> BalancedBatchSampler:
        """Classes (groups) of ``index`` under key ``by`` (see :mod:`detloader.balance.weights`)."""
        return cls(class_members(index, by)[1], classes_per_batch, samples_per_class, **kwargs)

    @property
    def batch_size(self) -> int:
        return self.classes_per_batch * self.samples_per_class

    def _config(self) -> dict[str, Any]:
        return {**super()._config(), "classes_per_batch": self.classes_per_batch,
                "samples_per_class": self.samples_per_class, "num_batches": self.num_batches,
                "drop_last": self.drop_last}

    def global_batches(self) -> np.ndarray:
        """int ``[num_batches, P * K]``: this epoch's batches over all ranks, before padding."""
        rng = epoch_generator(self.seed, self.epoch, STREAM_BATCH)
        b, p, k = self.num_batches, self.classes_per_batch, self.samples_per_class
        c = len(self._classes)
        chosen = np.argpartition(rng.random((b, c)), p - 1, axis=1)[:, :p]  # uniform P-subsets
        return self._picks(rng, chosen.reshape(-1), k).reshape(b, p * k)

    def _rank_items(self) -> np.ndarray:
        return self._cached_share(self.global_batches)

    def expected_counts(self) -> np.ndarray:
        """float64 ``[num_items]``: expected draws of each item per epoch, all ranks."""
        c = len(self._classes)
        return self._visit_share() * (self.num_batches * self.classes_per_batch / c * self.samples_per_class)
