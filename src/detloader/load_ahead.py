"""The ``DataLoader`` that :func:`detloader.make_loader` returns (:class:`DetectionLoader`): with
no worker processes and a dataset with decode threads, it loads the next batch on those threads
while the loop uses the current one (docs/loader.md, "make_loader", **Load-ahead**); with worker
processes, a worker's failure is a named error and ends every worker (:mod:`detloader.worker_failures`).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from torch.utils.data import DataLoader
from torch.utils.data._utils.pin_memory import pin_memory as pin_batch
from torch.utils.data.dataloader import _BaseDataLoaderIter, _SingleProcessDataLoaderIter

from detloader.worker_failures import WorkerIterator


class DetectionLoader(DataLoader):  # type: ignore[type-arg]
    """The ``DataLoader`` :func:`make_loader` returns: the same class in every way but one.
    With ``num_workers=0`` and a dataset with decode threads (and ``submit``, as
    :class:`~detloader.dataset.DetectionDataset` has), the threads load the next batch while
    the loop uses the current one (the training step, the collate), as worker processes
    do. The batches are the same as without. With worker processes, an error a worker raises
    that is a :class:`~detloader.errors.DetloaderError` comes as itself, without the worker's
    traceback, and a worker that dies is a :class:`~detloader.errors.LoaderWorkerError`; either
    ends every worker first (the iteration is over; a new one starts new workers)."""

    def _get_iterator(self) -> _BaseDataLoaderIter:
        if (self.num_workers == 0 and self._auto_collation and getattr(self.dataset, "decode_threads", 0)
                and callable(getattr(self.dataset, "submit", None))):
            return _LoadAhead(self)
        if self.num_workers > 0:
            return WorkerIterator(self)
        return super()._get_iterator()

    def __iter__(self) -> _BaseDataLoaderIter:
        ended = getattr(self, "_iterator", None)
        if ended is not None and getattr(ended, "_shutdown", False):  # persistent workers a failure ended
            self._iterator = None
        return super().__iter__()


class _LoadAhead(_SingleProcessDataLoaderIter):
    """One batch ahead on the dataset's decode threads; the threads end with the epoch or
    when the iterator is dropped."""

    def __init__(self, loader: DetectionLoader) -> None:
        super().__init__(loader)
        self._pool = ThreadPoolExecutor(loader.dataset.decode_threads, thread_name_prefix="detloader-decode")  # type: ignore[attr-defined]
        self._ahead: tuple[int, list[int], Future[Any]] | None = None  # the next batch

    def _submit(self) -> tuple[int, list[int], Future[Any]] | None:
        """The next batch started on the threads, its collate too; None at the end of the epoch."""
        try:
            index = self._next_index()
        except StopIteration:
            return None
        return self._dataset.epoch, index, self._collated(self._dataset.submit(index, self._pool))

    def _collated(self, samples: list[Future[Any]]) -> Future[Any]:
        # queued after its samples, it starts once they all have: it waits only for running ones.
        # It holds the collate, not the iterator: the iterator's last reference never goes in a thread
        collate = self._collate_fn
        return self._pool.submit(lambda: collate([f.result() for f in samples]))

    def _next_data(self) -> Any:
        current = self._ahead or self._submit()
        if current is None:
            self._pool.shutdown(cancel_futures=True)
            raise StopIteration
        self._ahead = self._submit()
        epoch, index, batch = current
        if epoch != self._dataset.epoch:  # set_epoch between two batches: this epoch's samples
            batch = self._collated(self._dataset.submit(index, self._pool))
        data = batch.result()
        return pin_batch(data, self._pin_memory_device) if self._pin_memory else data

    def __del__(self) -> None:
        # waits for the sample being decoded (milliseconds): a thread still running when the
        # next loader forks its workers can leave a lock taken in them (workers aborted at exit)
        self._pool.shutdown(cancel_futures=True)
