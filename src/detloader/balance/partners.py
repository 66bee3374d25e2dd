"""PartnerSampler: each item a group ``[i, p1, ..., pk]`` of indices drawn by one sampler, for
mosaic and mixup (:mod:`detloader.transforms.mix`).

Seeds, epochs, ranks and resume: :mod:`detloader.balance.base` (its resume ``offset`` counts
groups).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from detloader.balance.base import EpochSampler, epoch_items, sampler_config
from detloader.balance.checks import check_int
from detloader.errors import DetloaderValueError

#: Partner ``j`` of epoch ``e`` is the wrapped sampler's draw of epoch ``e + j * PARTNER_EPOCHS``:
#: epochs no training reaches, so a partner stream never repeats an epoch's own draw.
PARTNER_EPOCHS = 1 << 32


class PartnerSampler(EpochSampler):
    """Groups of ``1 + partners`` indices from one sampler. Position ``k`` of epoch ``e`` is
    ``[d_0[k], d_1[k], ..., d_partners[k]]`` where ``d_0`` is the wrapped sampler's own draw of
    epoch ``e`` (the very indices the loader draws without partners) and ``d_j`` its draw of
    epoch ``e + j * PARTNER_EPOCHS`` (wrapped around to the same length when lengths differ).

    So every slot has the wrapped sampler's distribution (a balanced sampler balances the
    partners too, where a uniform partner would dilute a rare class three images in four), and
    its sharding across ranks; the number of items, the ranks and the resume offsets are the
    wrapped sampler's. The cost: ``1 + partners`` draws per item, made when the epoch starts
    (an ``int [L, 1 + partners]`` array), also for the items a ``p < 1`` leaves plain.

    The wrapped sampler should be a detloader sampler (or have ``set_epoch``): a sampler whose
    draws depend on how often it was iterated (torch's ``RandomSampler``) gives other groups
    after a restore.
    """

    def __init__(self, sampler: Any, partners: int = 3) -> None:
        super().__init__(seed=0, rank=0, world_size=1, drop_last=False)  # the wrapped one shards
        if not hasattr(sampler, "__iter__"):
            raise DetloaderValueError(f"sampler={sampler!r} is not iterable")
        self.sampler = sampler
        self.partners = check_int("partners", partners, 1)

    def _config(self) -> dict[str, Any]:
        return {**super()._config(), "partners": self.partners, "sampler": sampler_config(self.sampler)}

    def _rank_items(self) -> np.ndarray:
        def compute() -> np.ndarray:
            own = epoch_items(self.sampler, self.epoch)
            if own.ndim != 1:
                name = type(self.sampler).__name__
                raise DetloaderValueError(f"{name} yields batches or groups; PartnerSampler needs indices")
            slots = [own] + [
                np.resize(epoch_items(self.sampler, self.epoch + j * PARTNER_EPOCHS), len(own))
                for j in range(1, self.partners + 1)
            ]
            return np.stack(slots, axis=1)

        return self._cached(compute)
