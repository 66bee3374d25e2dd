""":class:`DetectionLoader`, the ``DataLoader`` :func:`~detloader.loader.make_loader` returns. With
workers, a worker's failure as its main process sees it: a named error and every worker of the
loader ended (docs/reliability.md, "Loader workers that fail"). Without workers, the next batch
is loaded on the dataset's decode threads while the step runs (``_LoadAhead``, at the end).

* A detloader error raised in a worker (an :class:`~detloader.errors.ImageDecodeError` under
  ``on_decode_error="raise"``) is raised again as the same class with the worker's own message,
  without the worker's traceback text that torch puts in it.
* A worker that could not allocate shared memory for a batch (``/dev/shm`` full: torch's
  "unable to allocate shared memory") is a :class:`~detloader.errors.LoaderWorkerError` saying
  what to do (:func:`shm_full`), the shared-memory files its workers left removed.
* A worker that died (torch: "DataLoader worker (pid 123) is killed by signal: Killed.", or
  "exited unexpectedly") is a :class:`~detloader.errors.LoaderWorkerError` naming the worker, its
  pid, the signal or exit code and what to try; :func:`loader_worker_error` also names torch's
  error when its SIGCHLD handler raised it outside the loader (in the training step).

A worker whose parent process is killed ends within a second (:func:`watch_parent`).

Before either is raised the loader's workers are ended, killed when they outlive torch's own
shutdown (workers that ignore SIGTERM, as the trainer's do), so the process can exit. Workers of
iterators still alive at interpreter exit are ended the same way: torch skips its shutdown then,
and ``multiprocessing`` would wait forever for workers that ignore its SIGTERM.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import re
import shutil
import signal
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from torch._utils import ExceptionWrapper
from torch.utils.data import DataLoader
from torch.utils.data._utils.pin_memory import pin_memory as pin_batch
from torch.utils.data.dataloader import (
    _BaseDataLoaderIter,
    _MultiProcessingDataLoaderIter,
    _SingleProcessDataLoaderIter,
)

from detloader.errors import DetloaderError, LoaderWorkerError
from detloader.loader.collate import forget_buffers

#: Seconds between a loader worker's checks that its parent process still lives.
PARENT_CHECK_S = 1.0
#: Seconds to wait for a worker after SIGKILL.
KILL_WAIT_S = 2.0
#: Seconds to wait, after a connection error on the worker queue, for a worker to be seen dead.
DEATH_WAIT_S = 1.0

_LIVE: weakref.WeakSet[WorkerIterator] = weakref.WeakSet()

# torch's messages (torch/csrc/DataLoader.cpp and _MultiProcessingDataLoaderIter._try_get_data)
_KILLED = re.compile(r"DataLoader worker \(pid (\d+)\) is killed by signal: ([^.\n]+)")
_EXITED = re.compile(r"DataLoader worker \(pid (\d+)\) exited unexpectedly with exit code (-?\d+)")
_GONE = re.compile(r"DataLoader worker \(pid\(s\) ([\d, ]+)\) exited unexpectedly")
# torch's words when a worker cannot allocate a shared-memory file (c10 and libshm)
_SHM_FULL = re.compile(r"unable to allocate shared memory|unable to write to file </torch_|"
                       r"No space left on device.*torch_|torch_.*No space left on device")
#: Where torch's shared-memory files live (``torch_PID_...``).
SHM_DIR = "/dev/shm"


class WorkerIterator(_MultiProcessingDataLoaderIter):
    """torch's iterator over worker processes, whose failures end every worker and raise a
    named error (the module's docstring)."""

    def __init__(self, loader: Any) -> None:
        super().__init__(loader)  # starts the workers; installs torch's SIGCHLD handler
        _LIVE.add(self)
        _name_deaths_in_sigchld()

    def _next_data(self) -> Any:
        self._raised_in_worker = False
        try:
            return super()._next_data()
        except Exception as err:
            if self._raised_in_worker or isinstance(err, (DetloaderError, StopIteration)):
                raise  # the worker's own error (as torch raises it again), or already named
            try:
                named = self.worker_error(err, look=True)
            except LoaderWorkerError as raised:  # torch's SIGCHLD handler (wrapped) came first
                named = raised
            if named is None:
                raise
        # outside the except clause: no context that keeps torch's error and its frames
        named.__context__, named.__suppress_context__ = None, True
        raise named

    def _process_data(self, data: Any, worker_idx: int) -> Any:
        if isinstance(data, ExceptionWrapper):
            self._raised_in_worker = True
            if isinstance(data.exc_type, type) and issubclass(data.exc_type, DetloaderError):
                self.end_workers()
                raise _rebuilt(data.exc_type, worker_message(data))
            if _SHM_FULL.search(str(data.exc_msg)):
                pid = self._workers[worker_idx].pid
                self.end_workers()
                _remove_shm_files([w.pid for w in self._workers])
                raise LoaderWorkerError(shm_full(worker_idx, pid), worker_idx, pid, None, None)
        return super()._process_data(data, worker_idx)

    def worker_error(self, err: BaseException, look: bool = False) -> LoaderWorkerError | None:
        """``err`` as a :class:`LoaderWorkerError` when it is torch's report of one of this
        iterator's workers dying, or with ``look``, a connection error (a worker dying while
        it hands over a batch) or a RuntimeError while one of them has died or dies within
        :data:`DEATH_WAIT_S`. Every worker is ended first. None when it is neither."""
        pids = [w.pid for w in self._workers]
        found = _parse(str(err))
        if found is not None and found[0] in pids:
            pid, signum, exitcode = found
        elif look and found is None and isinstance(err, (ConnectionError, EOFError, RuntimeError)):
            dead = self._dead_worker(DEATH_WAIT_S)
            if dead is None:
                return None
            pid, signum, exitcode = pids[dead], None, None
        else:
            return None
        worker_id = pids.index(pid)
        self.end_workers()
        code = self._workers[worker_id].exitcode  # the process's own word, once it is reaped
        if code is not None and code < 0:
            signum, exitcode = -code, None
        elif code is not None and signum is None:
            exitcode = code
        return LoaderWorkerError(describe(worker_id, pid, signum, exitcode), worker_id, pid, signum, exitcode)

    def _dead_worker(self, wait: float) -> int | None:
        """The id of a worker that ended with an error or a signal, waiting up to ``wait``
        seconds for one (a worker being killed can close its connection before it is dead)."""
        deadline = time.monotonic() + wait
        while True:
            for worker_id, w in enumerate(self._workers):
                if w.exitcode:  # None: alive; 0: ended as asked
                    return worker_id
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def _shutdown_workers(self) -> None:
        try:
            super()._shutdown_workers()
        finally:  # the workers' reused image buffers, kept mapped here while they ran (loader.collate)
            forget_buffers(w.pid for w in getattr(self, "_workers", []))

    def end_workers(self) -> None:
        """torch's shutdown (the done event, a None on each index queue, a join), then SIGKILL
        for any worker still alive; idempotent."""
        try:
            self._shutdown_workers()
        finally:
            for w in getattr(self, "_workers", []):
                if w.is_alive():
                    w.kill()
                    w.join(KILL_WAIT_S)
            _LIVE.discard(self)


def watch_parent(interval: float = PARENT_CHECK_S) -> None:
    """In a loader worker (``make_loader``'s ``worker_init_fn`` calls it): a daemon thread that
    ends the worker at once (``os._exit``) when its parent process is gone, killed from outside.
    torch's own check only ends the worker's loop, after which the worker waits for its queue's
    feeder thread, which blocks for good on a full pipe whose reader is the worker itself."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(interval)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="detloader-parent-watch", daemon=True).start()


def loader_worker_error(err: BaseException) -> LoaderWorkerError | None:
    """``err`` as a :class:`LoaderWorkerError` when it is torch's report of a loader worker that
    died (from the SIGCHLD handler torch installs, which raises it wherever the main thread is);
    the worker's loader has its workers ended when it is a detloader loader. None for any other
    error."""
    named = _named_by_live(err)
    if named is not None:
        return named
    found = _parse(str(err))
    if found is None:
        return None
    pid, signum, exitcode = found
    return LoaderWorkerError(describe(None, pid, signum, exitcode), None, pid, signum, exitcode)


def _named_by_live(err: BaseException) -> LoaderWorkerError | None:
    """:meth:`WorkerIterator.worker_error` of the live iterator whose worker ``err`` names."""
    for it in list(_LIVE):
        named = it.worker_error(err)
        if named is not None:
            return named
    return None


_SIGCHLD_WRAPPED = False
#: Seconds after which SIGCHLD is sent again when it came while a finalizer ran.
SIGNAL_AGAIN_S = 0.01


def _in_finalizer(frame: Any) -> bool:
    """Whether ``frame`` (where the main thread was when a signal came) lies in a finalizer: a
    ``weakref.finalize`` callback (a batch's memory let go) or a ``__del__`` (an iterator's end),
    where an error raised by the signal's handler would only be printed."""
    while frame is not None:
        code = frame.f_code
        if code is _FINALIZE_CALL or code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


_FINALIZE_CALL = weakref.finalize.__call__.__code__


def _name_deaths_in_sigchld() -> None:
    """Wrap torch's SIGCHLD handler (once per process, from the main thread) so that the error it
    raises wherever the main thread is when a worker of a detloader loader dies is a
    :class:`LoaderWorkerError` too (the workers ended first); other errors pass unchanged."""
    global _SIGCHLD_WRAPPED
    if _SIGCHLD_WRAPPED or threading.current_thread() is not threading.main_thread():
        return
    torch_handler = signal.getsignal(signal.SIGCHLD)
    if not callable(torch_handler):
        return
    signal.signal(signal.SIGCHLD, _naming(torch_handler))
    _SIGCHLD_WRAPPED = True


def _naming(torch_handler: Callable[[int, Any], Any]) -> Callable[[int, Any], None]:
    """torch's SIGCHLD handler, its error about a detloader loader's worker named; a signal that
    comes while a finalizer runs is sent again a moment later, not raised there."""

    def handler(signum: int, frame: Any) -> None:
        if _in_finalizer(frame):  # an error raised there is lost (unraisable): the signal again, in a moment
            threading.Timer(SIGNAL_AGAIN_S, os.kill, (os.getpid(), signal.SIGCHLD)).start()
            return
        try:
            torch_handler(signum, frame)
            return
        except RuntimeError as err:
            named = _named_by_live(err)
            if named is None:
                raise
        raise named

    return handler


@contextlib.contextmanager
def worker_deaths_held() -> Iterator[None]:
    """Within it, a loader worker's death is not raised wherever the main thread is (torch's
    SIGCHLD handler, above) but as the block ends, after it: a write that must not be cut halfway
    (a checkpoint: ``torch.save`` cut there fails with its own zip error, which hides the worker's)
    finishes first. An error of the block itself passes unchanged. Outside the main thread, or
    with no Python handler for SIGCHLD, it holds nothing."""
    handler = signal.getsignal(signal.SIGCHLD)
    if threading.current_thread() is not threading.main_thread() or not callable(handler):
        yield
        return
    came: list[int] = []
    signal.signal(signal.SIGCHLD, lambda signum, frame: came.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGCHLD, handler)
    if came:
        handler(came[-1], None)


def describe(worker_id: int | None, pid: int, signum: int | None, exitcode: int | None) -> str:
    """The message of a worker that died: which, how, and what to try."""
    who = f"loader worker {worker_id} (pid {pid})" if worker_id is not None else f"a loader worker (pid {pid})"
    fewer = "fewer workers (num_workers, detloader train --num-workers)"
    if signum is None:
        code = "" if exitcode is None else f" with exit code {exitcode}"
        return (f"{who} exited unexpectedly{code}; rerun with --num-workers 0 (num_workers=0) to load in the "
                "main process, where the error shows")
    name = _signal_name(signum)
    if signum == signal.SIGKILL:
        return (f"{who} was killed by signal {signum} ({name}); out of memory? try {fewer}, a smaller "
                "prefetch_factor or batch size")
    if signum == signal.SIGBUS:
        return (f"{who} was killed by signal {signum} ({name}); out of shared memory? give /dev/shm more room "
                f"(docker run --shm-size) or try {fewer}")
    if signum in (signal.SIGSEGV, signal.SIGILL, signal.SIGFPE, signal.SIGABRT):
        return (f"{who} crashed with signal {signum} ({name}) in native code (an image decoder, a transform); "
                "rerun with --num-workers 0 (num_workers=0) to see where")
    return f"{who} was killed by signal {signum} ({name}) from outside the process; run again"


def shm_full(worker_id: int, pid: int) -> str:
    """The message of a worker that could not allocate shared memory for a batch: the room in
    :data:`SHM_DIR` and what to do."""
    try:
        usage = shutil.disk_usage(SHM_DIR)
        room = f" ({usage.free / 2**20:.0f} MiB free of {usage.total / 2**20:.0f} MiB in {SHM_DIR})"
    except OSError:
        room = ""
    return (f"loader worker {worker_id} (pid {pid}) could not allocate shared memory for a batch{room}: workers "
            "hand batches over through it. Give it more room (docker run --shm-size=8g, or free "
            f"{SHM_DIR}), use fewer workers (--num-workers, num_workers) or a smaller batch, and --cache disk "
            "rather than ram (a ram store lives there too)")


def _remove_shm_files(pids: list[int]) -> list[str]:
    """Remove the shared-memory files torch made for the (ended) processes ``pids`` and left in
    :data:`SHM_DIR` (``torch_PID_*``, this user's only); their names."""
    removed = []
    uid = os.getuid()
    for pid in pids:
        for path in glob.glob(os.path.join(SHM_DIR, f"torch_{pid}_*")):
            try:
                if os.lstat(path).st_uid == uid:
                    os.unlink(path)
                    removed.append(path)
            except OSError:
                pass
    return removed


def worker_message(wrapper: ExceptionWrapper) -> str:
    """The message of the error a worker raised, from the traceback text torch sends: what
    follows the last ``module.Class: `` line."""
    cls = wrapper.exc_type
    name = cls.__qualname__ if cls.__module__ in ("builtins", "__main__") else f"{cls.__module__}.{cls.__qualname__}"
    text = str(wrapper.exc_msg).rstrip("\n")
    at = text.rfind(f"\n{name}: ")
    return text[at + len(name) + 3:] if at >= 0 else ""


def _rebuilt(cls: type[BaseException], message: str) -> BaseException:
    """An error of class ``cls`` whose text is ``message`` (``cls.__new__`` when its
    constructor takes other arguments: the text, not the attributes, survives)."""
    try:
        return cls(message)
    except Exception:
        return cls.__new__(cls, message)


def _parse(text: str) -> tuple[int, int | None, int | None] | None:
    """``(pid, signal, exit code)`` of torch's message of a dead worker (the first pid when it
    names several); None when ``text`` is not one."""
    if m := _KILLED.search(text):
        names = {signal.strsignal(s): int(s) for s in signal.Signals}
        return int(m[1]), names.get(m[2].strip(), 0) or None, None
    if m := _EXITED.search(text):
        code = int(m[2])
        return (int(m[1]), -code, None) if code < 0 else (int(m[1]), None, code)
    if m := _GONE.search(text):
        return int(m[1].split(",")[0]), None, None
    return None


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return "unknown signal"


@atexit.register  # registered after torch's exit flag (imported above): runs before it
def _end_at_exit() -> None:
    for it in list(_LIVE):
        it.end_workers()


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
