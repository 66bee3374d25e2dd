"""``detloader train``: the store of decoded images (``--cache``), and the loader settings it
chooses (a saved ``detloader tune`` result for this machine and dataset, else the untuned
default), said in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from detloader.cli import build_parser, main
from detloader.synth import make_synthetic

FAST = ["--size", "64", "--batch-size", "4", "--width", "4", "--epochs", "1", "--max-steps", "2", "--no-eval"]


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return make_synthetic(tmp_path / "faces", 16, seed=1, size=(96, 72))


def test_train_cache_disk_builds_the_store_and_reads_from_it(data: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from detloader.dataset.store_files import store_paths
    from detloader.store import ImageStore

    served = []
    real_get = ImageStore.get

    def get(self, i, path):  # noqa: ANN001, ANN202
        image = real_get(self, i, path)
        served.append(image is not None)
        return image

    monkeypatch.setattr(ImageStore, "get", get)
    out = tmp_path / "run"
    assert store_paths(data) == []
    assert main(["train", str(data), *FAST, "--num-workers", "0", "--cache", "disk", "--out", str(out)]) == 0
    stores = store_paths(data)
    assert len(stores) == 1 and stores[0].suffix == ".dlstore"
    assert served and all(served)  # every training image came from the store
    assert json.loads((out / "config.json").read_text())["cache"] == "disk"


def test_train_cache_refuses_another_kind() -> None:
    from detloader.errors import DetloaderValueError
    from detloader.train import TrainConfig

    with pytest.raises(DetloaderValueError, match="cache='ssd' must be None, 'disk' or 'ram'"):
        TrainConfig(cache="ssd")


def _save_result(data_hash: str, workers: int, batch_size: int = 4, created: str = "2026-12-01T10:00:00+00:00") -> None:
    """A tune result stored for this machine and the dataset ``data_hash``, recommending ``workers``
    at 612 img/s, measured with the CPUs free as they are now (no load change)."""
    from detloader.tune import saved
    from detloader.tune.measure import Trial, loader_kwargs
    from detloader.tune.probe import probe_machine
    from detloader.tune.result import TuneResult

    probe = probe_machine(busy_window_s=0)
    free, _ = saved.current_free_cpus()
    probe = type(probe)(**{**probe.to_dict(), "free_cpus": free})
    settings = loader_kwargs(workers, prefetch_factor=2, persistent_workers=True)
    trial = Trial(settings=settings, images_per_s=612.0, images=64, batches=16, seconds=0.1, startup_s=0.1,
                  latency_p50_ms=1.0, latency_p95_ms=2.0, main_cpu=0.5, workers_cpu=1.0, workers=workers,
                  worker_uss_mib=None, worker_pss_mib=None, main_rss_mib=100.0)
    result = TuneResult(
        recommended=settings, explanation="measured", summary=f"num_workers={workers}", machine=probe, data=None,
        trials=[trial], chosen=0, batch_size=batch_size, dataset_size=16, budget_s=1.0, spent_s=1.0, window_s=0.1,
        stop="budget", worker_cap=2, cap_reason="usable", tolerance=0.05,
        key={"machine": saved.machine_fingerprint(), "dataset": data_hash, "transform": "letterbox 64",
             "batch_size": batch_size},
        created=created,
    )
    saved.save_result(result)


def _data_hash(argv: list[str]) -> str:
    """What ``detloader train ARGV`` files its dataset under (as ``detloader tune`` does)."""
    from detloader.cli.train import _config
    from detloader.train.run_data import prepare_data

    return prepare_data(_config(build_parser().parse_args(argv))).data_hash


def test_train_uses_a_saved_tune_result_and_says_so(data: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["train", str(data), *FAST, "--out", str(tmp_path / "run")]
    _save_result(_data_hash(argv), workers=1)  # the untuned default on any machine is 0 or 2+, never 1
    assert main(argv) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("loader:")]
    assert len(lines) == 1, lines
    assert lines[0].startswith("loader: num_workers=1, pin_memory=False: the saved tune result of 2026-12-01 "
                               "for this machine and dataset (612 img/s at batch size 4)")
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["num_workers"] == 1 and metrics["loader"] == lines[0]


def test_train_without_a_tune_result_names_the_untuned_default(data: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from detloader import _system
    from detloader.tune.saved import untuned_loader_kwargs

    argv = ["train", str(data), *FAST, "--out", str(tmp_path / "run")]
    _save_result("another dataset", workers=1)  # not this run's
    assert main(argv) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("loader:")]
    workers = untuned_loader_kwargs()[0]["num_workers"]
    assert len(lines) == 1 and lines[0].startswith(f"loader: num_workers={workers}")
    assert lines[0].endswith(f"untuned default for {_system.usable_cpus()} usable CPUs "
                             f"(`detloader tune {data}` measures this machine)")
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["num_workers"] == workers


def test_train_with_num_workers_given_says_so(data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", str(data), *FAST, "--num-workers", "0", "--out", str(tmp_path / "run")]) == 0
    assert "loader: num_workers=0, pin_memory=False: set by num_workers=0" in capsys.readouterr().out.splitlines()


def test_a_resume_with_another_cache_is_refused_unless_allowed() -> None:
    from detloader.errors import ResumeSettingsError
    from detloader.train import TrainConfig
    from detloader.train.checkpoint import check_resume_settings, setting_changes

    saved = TrainConfig().to_dict()
    changes = setting_changes(saved, TrainConfig(cache="ram"), reference=True)
    assert changes == {"cache": (None, "ram")}
    with pytest.raises(ResumeSettingsError, match="cache None -> 'ram'"):
        check_resume_settings("run/last.pt", changes, False)
    check_resume_settings("run/last.pt", changes, True)
    assert setting_changes({k: v for k, v in saved.items() if k != "cache"}, TrainConfig(cache="ram"),
                           reference=True) == {}  # a checkpoint from before the setting: not compared


def test_find_result_prefers_the_batch_size_then_the_newest() -> None:
    from detloader.tune.saved import find_result

    _save_result("d", 1, batch_size=8, created="2026-12-01T10:00:00+00:00")
    _save_result("d", 2, batch_size=16, created="2026-12-03T10:00:00+00:00")
    _save_result("d", 3, batch_size=32, created="2026-12-02T10:00:00+00:00")
    _save_result("other", 4, batch_size=8)
    assert find_result("d", 8).recommended["num_workers"] == 1
    assert find_result("d", 4).recommended["num_workers"] == 2  # none at 4: the newest
    assert find_result("d").from_cache and find_result("nothing", 8) is None
