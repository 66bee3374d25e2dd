"""Worker processes that a plain script, a notebook or an interactive session can start.

With ``spawn`` and ``forkserver`` every new process imports the caller's ``__main__`` again, so
a script without an ``if __name__ == "__main__":`` guard would run itself in each worker.
detloader's worker functions never need ``__main__``, so it forks when the start method is
``fork`` and no other Python thread runs (a fork then copies no lock held by a thread), and
otherwise starts workers by the method in force with ``__main__``'s file and spec hidden.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager, nullcontext
from typing import Any, TypeVar

T = TypeVar("T")


def start_method() -> str:
    """``"fork"`` when forking is safe here, else the start method in force."""
    method = multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_context().get_start_method()
    if method == "fork" and threading.active_count() == 1:
        return "fork"
    return "spawn" if method == "fork" else method


@contextmanager
def _main_hidden() -> Iterator[None]:
    """Without ``__main__.__file__`` and ``__spec__``, a new process does not import it."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved = {key: main.__dict__[key] for key in ("__file__", "__spec__") if key in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__dict__["__spec__"] = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


#: ``prctl``'s option that sends the calling process a signal when its parent ends (linux/prctl.h).
_PR_SET_PDEATHSIG = 1
#: Seconds between two looks at the parent where the kernel cannot be asked to signal its death.
PARENT_POLL_S = 0.5


def die_with_parent(parent: int) -> None:
    """In a worker process: end it (``SIGKILL``, no clean-up: it holds nothing but its task) as
    soon as the process ``parent`` that started it is gone, killed from outside (``SIGKILL``,
    ``SIGTERM``), whose workers would otherwise wait on their task queue for ever. On Linux, when
    ``parent`` is the worker's parent, the kernel sends the signal (``PR_SET_PDEATHSIG``; it
    fires when the thread that started the worker ends, the one that runs the pool here);
    elsewhere, or under a fork server, a daemon thread looks every :data:`PARENT_POLL_S`."""
    if sys.platform.startswith("linux") and os.getppid() == parent:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
                if os.getppid() != parent:  # it ended before the signal was asked for
                    os._exit(1)
                return
        except (OSError, AttributeError):
            pass

    def watch() -> None:
        while True:
            time.sleep(PARENT_POLL_S)
            try:
                os.kill(parent, 0)
            except ProcessLookupError:
                os._exit(1)
            except PermissionError:  # alive, another user's: only a reused pid could be
                pass

    threading.Thread(target=watch, name="detloader-parent-watch", daemon=True).start()


def run_in_processes(
    fn: Callable[..., T], calls: Sequence[tuple[Any, ...]], max_workers: int
) -> Iterator[tuple[int, T]]:
    """``fn(*calls[i])`` in ``max_workers`` worker processes; yields ``(i, result)`` as each
    finishes (not in order). ``fn`` must be importable from a module (not ``__main__``).
    A worker's exception is raised here, when its result is reached. The workers end with this
    process, however it ends (:func:`die_with_parent`)."""
    method = start_method()
    context = multiprocessing.get_context(method)
    with ProcessPoolExecutor(max_workers=max_workers, mp_context=context, initializer=die_with_parent,
                             initargs=(os.getpid(),)) as pool:
        # workers start on demand during the submits (all of them, given at least
        # max_workers calls): the window in which __main__ must stay hidden
        with _main_hidden() if method != "fork" else nullcontext():
            futures = {pool.submit(fn, *args): i for i, args in enumerate(calls)}
        for future in as_completed(futures):
            yield futures[future], future.result()


def worker_context() -> multiprocessing.context.BaseContext:
    """A multiprocessing context for DataLoader workers: ``fork`` when safe, else the method in
    force with ``__main__`` hidden, so that a loop over a loader needs no guard either."""
    method = start_method()
    return _HIDDEN_MAIN.get(method) or multiprocessing.get_context(method)


class _StartsWithMainHidden:
    """Mixin for a ``Process`` class: :meth:`start` runs with ``__main__`` hidden."""

    def start(self) -> None:
        with _main_hidden():
            super().start()  # type: ignore[misc]


# The process classes travel to the child by reference, so they live at module level.
class _SpawnProcess(_StartsWithMainHidden, multiprocessing.context.SpawnProcess):
    pass


class _SpawnContext(multiprocessing.context.SpawnContext):
    Process = _SpawnProcess


_HIDDEN_MAIN: dict[str, multiprocessing.context.BaseContext] = {"spawn": _SpawnContext()}

if sys.platform != "win32":

    class _ForkServerProcess(_StartsWithMainHidden, multiprocessing.context.ForkServerProcess):
        pass

    class _ForkServerContext(multiprocessing.context.ForkServerContext):
        Process = _ForkServerProcess

    _HIDDEN_MAIN["forkserver"] = _ForkServerContext()
