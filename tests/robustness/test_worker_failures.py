"""Loader workers that fail (issue 31, cases 1 and 9): an undecodable image in a worker is the
dataset's own ImageDecodeError in the main process, without the worker's traceback; a worker
killed by a signal is a LoaderWorkerError naming it and what to try. Either ends every worker
within seconds (also workers that ignore SIGTERM, as the trainer's do), and ``detloader train``
exits with one line, its status, no process left and the last checkpoint as it was."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from detloader import DetectionDataset, ImageDecodeError, LoaderWorkerError, make_loader, read_annotations
from detloader.cli.parser import build_parser
from detloader.cli.train import _config
from detloader.synth import make_synthetic
from detloader.train import load_checkpoint
from detloader.train.run_data import _ignore_stop_signals
from detloader.worker_failures import describe, loader_worker_error, worker_deaths_held

EMPTY = 5  # the image written as 0 bytes
KILL_AT = 9  # the dataset index whose worker kills itself


@pytest.fixture(scope="module")
def faces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_synthetic(tmp_path_factory.mktemp("workers") / "faces", 16, seed=1, size=(96, 72))


@pytest.fixture(scope="module")
def longer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Epochs of 20+ steps at batch size 2: a worker killed from outside dies mid-epoch, not in
    the shutdown at an epoch's end (then it was ending anyway, and nothing is wrong)."""
    return make_synthetic(tmp_path_factory.mktemp("workers_longer") / "faces", 48, seed=1, size=(96, 72))


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = make_synthetic(tmp_path_factory.mktemp("workers_broken") / "faces", 16, seed=1, size=(96, 72))
    index = read_annotations(root, cache=False)
    index.image_path(EMPTY).write_bytes(b"")
    return root


class KillsItsWorker(DetectionDataset):
    """Kills the worker process that loads dataset index KILL_AT (SIGKILL, as the OOM killer does)."""

    def __getitems__(self, indices):  # type: ignore[no-untyped-def]
        from torch.utils.data import get_worker_info

        if KILL_AT in indices and get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitems__(indices)


def _new_children(before: set[int]) -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if p.pid not in before]


@pytest.mark.parametrize("ignore_sigterm", [False, True])
def test_a_decode_error_in_a_worker_is_the_named_error_and_ends_the_workers(broken: Path, ignore_sigterm: bool) -> None:
    index = read_annotations(broken, cache=False)
    init = _ignore_stop_signals if ignore_sigterm else None
    loader = make_loader(DetectionDataset(index, seed=0), batch_size=2, num_workers=2, worker_init_fn=init)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    began = time.monotonic()
    with pytest.raises(ImageDecodeError) as info:
        for _ in loader:
            pass
    assert time.monotonic() - began < 10
    message = str(info.value)
    assert message.startswith(f"{index.image_path(EMPTY)}: cannot decode image: an empty file (0 bytes)")
    assert f"(dataset index {EMPTY})" in message and "--on-decode-error skip" in message
    assert "Traceback" not in message and "\n" not in message
    assert _new_children(before) == []  # ended before the error was raised, not at garbage collection


@pytest.mark.parametrize("busy", [False, True], ids=["waiting", "in-the-step"])
def test_a_killed_worker_is_a_loader_worker_error_naming_it(faces: Path, busy: bool) -> None:
    # waiting: the main process learns it in next(); in-the-step: torch's SIGCHLD handler raises
    # it wherever the main thread is (here in the loop body)
    dataset = KillsItsWorker(read_annotations(faces, cache=False), seed=0)
    loader = make_loader(dataset, batch_size=1, num_workers=2, worker_init_fn=_ignore_stop_signals)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    began = time.monotonic()
    with pytest.raises(LoaderWorkerError) as info:
        for _ in loader:
            if busy:
                time.sleep(0.3)
    assert time.monotonic() - began < 15
    err = info.value
    assert isinstance(err, RuntimeError)
    assert (err.worker_id, err.signal, err.exitcode) == (KILL_AT % 2, 9, None)
    assert str(err) == (
        f"loader worker {KILL_AT % 2} (pid {err.pid}) was killed by signal 9 (SIGKILL); out of memory? try fewer "
        "workers (num_workers, detloader train --num-workers), a smaller prefetch_factor or batch size"
    )
    assert _new_children(before) == []


def test_a_worker_killed_from_outside_mid_epoch(faces: Path) -> None:
    loader = make_loader(DetectionDataset(read_annotations(faces, cache=False), seed=0), batch_size=1, num_workers=2)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(LoaderWorkerError, match=r"loader worker [01] \(pid \d+\) was killed by signal 9 \(SIGKILL\)"):
        for step, _ in enumerate(loader):
            if step == 2:
                os.kill(_new_children(before)[-1].pid, signal.SIGKILL)
    assert _new_children(before) == []
    assert len(list(loader)) == 16  # a new pass starts new workers


def test_torch_messages_of_a_dead_worker_are_named_and_others_pass() -> None:
    err = loader_worker_error(RuntimeError("DataLoader worker (pid 4242) is killed by signal: Bus error. It is..."))
    assert err is not None and (err.worker_id, err.pid, err.signal) == (None, 4242, signal.SIGBUS)
    assert "out of shared memory?" in str(err) and str(err).startswith("a loader worker (pid 4242) was killed")
    err = loader_worker_error(RuntimeError(
        "DataLoader worker (pid 7) exited unexpectedly with exit code 1. Details are lost due to multiprocessing."
    ))
    assert err is not None and (err.pid, err.signal, err.exitcode) == (7, None, 1)
    assert "--num-workers 0" in str(err)
    err = loader_worker_error(RuntimeError("DataLoader worker (pid(s) 8, 9) exited unexpectedly"))
    assert err is not None and err.pid == 8
    assert loader_worker_error(RuntimeError("CUDA out of memory")) is None
    assert "crashed with signal 11 (SIGSEGV)" in describe(0, 1, signal.SIGSEGV, None)


@pytest.fixture
def raising_sigchld():
    """A SIGCHLD handler that raises as torch's does for a dead worker."""
    def handler(signum: int, frame: object) -> None:
        raise RuntimeError("DataLoader worker (pid 4242) is killed by signal: Killed.")

    before = signal.signal(signal.SIGCHLD, handler)
    yield
    signal.signal(signal.SIGCHLD, before)


def _sigchld_now() -> None:
    os.kill(os.getpid(), signal.SIGCHLD)
    time.sleep(0.01)  # the handler runs at the next instruction


def test_a_worker_death_in_a_held_write_is_raised_after_the_write(raising_sigchld: None) -> None:
    with pytest.raises(RuntimeError, match="pid 4242"):
        _sigchld_now()  # unheld: it cuts in wherever the main thread is
    written = []
    with pytest.raises(RuntimeError, match="pid 4242"):
        with worker_deaths_held():
            _sigchld_now()
            written.append("whole")
    assert written == ["whole"]
    with pytest.raises(ValueError, match="its own"):  # the block's own error passes unchanged
        with worker_deaths_held():
            _sigchld_now()
            raise ValueError("its own")
    with worker_deaths_held():  # nothing came: nothing raised, and the handler is back
        pass
    with pytest.raises(RuntimeError, match="pid 4242"):
        _sigchld_now()


def test_train_takes_the_decode_error_policy_its_message_names(broken: Path, tmp_path: Path) -> None:
    def config(*extra: str):  # type: ignore[no-untyped-def]
        return _config(build_parser().parse_args(["train", str(broken), "--out", str(tmp_path / "run"), *extra]))

    assert config("--on-decode-error", "skip").on_decode_error == "skip"
    assert config().on_decode_error == "raise"
    with pytest.raises(SystemExit):
        config("--on-decode-error", "ignore")


@pytest.mark.slow
def test_live_workers_that_ignore_sigterm_do_not_hang_the_exit(faces: Path) -> None:
    script = (
        "import sys\n"
        "from detloader import DetectionDataset, make_loader, read_annotations\n"
        "from detloader.train.run_data import _ignore_stop_signals\n"
        "ds = DetectionDataset(read_annotations(sys.argv[1], cache=False), seed=0)\n"
        "it = iter(make_loader(ds, batch_size=2, num_workers=2, worker_init_fn=_ignore_stop_signals,"
        " persistent_workers=True))\n"
        "next(it)\n"
    )
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script, str(faces)], timeout=120, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - began < 60  # it hung for good before


def _train(data: Path, out: Path, *extra: str) -> subprocess.Popen[str]:
    args = [sys.executable, "-m", "detloader", "train", str(data), "--num-workers", "2", "--epochs", "3",
            "--size", "64", "--batch-size", "2", "--width", "4", "--device", "cpu", "--no-eval",
            "--out", str(out), *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")  # a SIGABRT prints every thread
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _workers_after_first_checkpoint(proc: subprocess.Popen[str], out: Path) -> list[psutil.Process]:
    """The 2 loader workers of a running ``train``, once ``out/last.pt`` exists; waited for: between
    two epochs (or on a loaded machine, right after the first checkpoint) a loader may have none for
    a moment."""
    deadline = time.monotonic() + 180
    while not (out / "last.pt").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.1)
    deadline = time.monotonic() + 60
    while True:
        workers = psutil.Process(proc.pid).children()
        if len(workers) == 2:
            return workers
        assert proc.poll() is None and time.monotonic() < deadline, (len(workers), proc.poll())
        time.sleep(0.1)


def _left_in_session(session: int) -> list[int]:
    left = []
    for p in psutil.process_iter(["status"]):
        try:
            if os.getsid(p.pid) == session and p.info["status"] != psutil.STATUS_ZOMBIE:
                left.append(p.pid)
        except (ProcessLookupError, PermissionError):
            pass
    return left


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_train_stops_at_an_undecodable_image_with_one_line_and_no_process_left(broken: Path, tmp_path: Path) -> None:
    proc = _train(broken, tmp_path / "run")
    try:
        _, err = proc.communicate(timeout=180)  # it never ended before
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 2, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("detloader train: error: ")
    assert f"synth_{EMPTY:06d}.jpg: cannot decode image: an empty file (0 bytes) (dataset index" in err
    assert _left_in_session(proc.pid) == []


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_train_with_a_killed_worker_exits_4_and_keeps_the_last_checkpoint(longer: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = _train(longer, out, "--checkpoint-every", "1", "--epochs", "20")
    try:
        workers = _workers_after_first_checkpoint(proc, out)
        os.kill(workers[1].pid, signal.SIGKILL)
        killed = time.monotonic()
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:  # say where it hangs: the threads of the run, as faulthandler prints them
            os.kill(proc.pid, signal.SIGABRT)
            _, err = proc.communicate(timeout=30)
            raise AssertionError(f"the run did not end within 60 s of the kill; its threads:\n{err[-8000:]}") from None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert time.monotonic() - killed < 20
    assert proc.returncode == 4, err
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"detloader train: error: loader worker 1 (pid {workers[1].pid}) was killed by signal 9 "
                           "(SIGKILL); out of memory? try fewer workers")
    assert f"{out / 'last.pt'} is as the run last saved it" in line
    assert _left_in_session(proc.pid) == []
    state = load_checkpoint(out / "last.pt")  # whole and loadable
    assert int(state["step"]) >= 1
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".") and p.suffix == ".tmp") == []


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_workers_of_a_training_killed_from_outside_end_within_seconds(longer: Path, tmp_path: Path) -> None:
    # a worker whose loop ended on its parent's death used to wait for good on its own full pipe
    out = tmp_path / "run"
    proc = _train(longer, out, "--checkpoint-every", "1", "--epochs", "20")
    try:
        assert len(_workers_after_first_checkpoint(proc, out)) == 2
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        while _left_in_session(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _left_in_session(proc.pid) == []
    finally:
        for pid in _left_in_session(proc.pid):
            os.kill(pid, signal.SIGKILL)


def test_a_worker_death_that_comes_in_a_finalizer_is_raised_after_it(raising_sigchld: None) -> None:
    """Raised inside a weakref finalizer (a batch's memory let go) or a ``__del__``, the error
    would only be printed as unraisable and lost: the signal comes again a moment later and is
    raised in the loop's own code."""
    import weakref

    from detloader.loader.workers import _naming

    signal.signal(signal.SIGCHLD, _naming(signal.getsignal(signal.SIGCHLD)))
    unraisable: list[object] = []
    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        class Held:
            pass

        held = Held()
        weakref.finalize(held, _sigchld_now)
        with pytest.raises(RuntimeError, match="pid 4242"):
            del held  # the finalizer runs, and the signal comes inside it
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                time.sleep(0.005)
    finally:
        sys.unraisablehook = hook
    assert unraisable == []
