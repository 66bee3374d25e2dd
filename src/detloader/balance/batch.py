"""BalancedBatchSampler: P x K batches (P distinct classes, K items of each).

Built on :class:`detloader.balance.class_aware.ClassSampler`; seeds, epochs, ranks and resume:
:mod:`detloader.balance.base` (its resume ``offset`` counts batches).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from detloader.annotations.index import AnnotationIndex
from detloader.balance.base import STREAM_BATCH, epoch_generator
from detloader.balance.checks import check_int
from detloader.balance.class_aware import ClassSampler
from detloader.balance.groups import ByKey, class_members
from detloader.errors import DetloaderValueError


class BalancedBatchSampler(ClassSampler):
    """A batch sampler: each batch holds ``classes_per_batch`` (P) distinct classes drawn
    uniformly, and ``samples_per_class`` (K) items of each, taken from the class's shuffled
    list (reshuffled when used up). Yields lists of ``P * K`` indices; pass it to a DataLoader
    as ``batch_sampler``. An item in two chosen classes, or a class with fewer than K
    members, can repeat an index within a batch.

    Args:
        class_members: as :class:`~detloader.balance.class_aware.ClassAwareSampler`.
        classes_per_batch: P, at most the number of classes with members.
        samples_per_class: K.
        num_batches: batches per epoch over all ranks (default: distinct items // (P * K),
            at least 1). With ``world_size`` W, rank r gets batches r::W (wrapped or cut).
    """

    def __init__(
        self,
        class_members: Sequence[Any],
        classes_per_batch: int,
        samples_per_class: int,
        num_batches: int | None = None,
        *, seed: int = 0, rank: int | None = None, world_size: int | None = None, drop_last: bool = False,
    ) -> None:
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
        cls,
        index: AnnotationIndex,
        classes_per_batch: int,
        samples_per_class: int,
        by: ByKey = "class",
        **kwargs: Any,
    ) -> BalancedBatchSampler:
        """Classes (groups) of ``index`` under key ``by`` (see :mod:`detloader.balance.weights`)."""
        return cls(class_members(index, by)[1], classes_per_batch, samples_per_class, **kwargs)

    @property
    def batch_size(self) -> int:
        return self.classes_per_batch * self.samples_per_class

    def _config(self) -> dict[str, Any]:
        return {
            **super()._config(),
            "classes_per_batch": self.classes_per_batch,
            "samples_per_class": self.samples_per_class,
            "num_batches": self.num_batches,
            "drop_last": self.drop_last,
        }

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
        return self._visit_share() * (
            self.num_batches * self.classes_per_batch / c * self.samples_per_class
        )

