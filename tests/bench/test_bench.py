"""``detloader bench``: the report's structure and arithmetic (never timing thresholds)."""

from __future__ import annotations

import importlib.util
import json
import math
import multiprocessing
from pathlib import Path

import pytest

from detloader._system import usable_cpus
from detloader.bench import BenchReport, BenchSettings
from detloader.bench import loader_speed as bench_loader_module
from detloader.cli.parser import main


def _check_ratios(data: dict) -> dict[str, dict]:
    assert set(data) == {"settings", "machine", "figures", "ratios", "notes"}
    rows = {}
    for r in data["ratios"]:
        assert set(r) == {"section", "what", "a_label", "a", "b_label", "b", "unit", "ratio"}
        assert r["a"] > 0 and r["b"] > 0 and r["ratio"] > 0
        assert math.isclose(r["ratio"], r["a"] / r["b"], rel_tol=1e-12)
        rows[r["what"]] = r
    return rows


def _run(capsys, *argv: str) -> dict:
    assert main(["bench", "--quick", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_bench_quick_json_on_a_tiny_synthetic_set(small_synth_root, capsys):
    data = _run(capsys, str(small_synth_root), "--sampler-weights", "5000")
    rows = _check_ratios(data)
    cpus = usable_cpus()
    assert {r["section"] for r in data["ratios"]} == {"loader", "index", "sampler"}
    loader = data["figures"]["loader"]
    ceiling = rows[f"decode ceiling ({cpus} processes at once) / 1 core x {cpus}"]
    assert ceiling["a"] == loader["decode_ceiling"]
    assert math.isclose(ceiling["b"], loader["decode_single_core"] * cpus)
    for w in range(cpus + 1):  # every num_workers 0..CPUs, as a fraction of the ceiling
        row = rows[f"detloader num_workers={w} / decode ceiling"]
        assert row["b"] == loader["decode_ceiling"] and row["a"] == loader["detloader"][str(w)]
    best = loader["best_num_workers"]
    assert loader["detloader"][str(best)] == max(loader["detloader"].values())
    assert rows[f"num_workers={best}: detloader / tutorial"]["b"] == loader["tutorial"][str(best)]
    assert rows["num_workers=0: detloader / tutorial"]["a"] == loader["detloader"]["0"]
    assert rows["pickled bytes per batch of 4: tutorial / detloader"]["b"] == loader["batch_bytes"]
    index = data["figures"]["index"]
    assert index["files"] == 24
    assert rows["cold build, 24 VOC files: ElementTree loop / detloader"]["b"] == index["cold_s"]
    assert rows["cold build in 1 process, 24 VOC files: ElementTree loop / detloader"]["b"] == index["cold_1_process_s"]
    assert rows["warm reload, 24 VOC files: ElementTree loop / detloader"]["b"] == index["warm_s"]
    sampler = data["figures"]["sampler"]
    assert sampler["weights"] == 5000 and sampler["draws"] == 2000
    assert rows["5,000 weights, first 2,000 indices: torch / detloader"]["a"] == sampler["torch"]["first_s"]
    assert data["settings"]["data"] == "given" and data["settings"]["images"] == 24
    assert data["machine"]["usable_cpus"] == cpus
    every = {f"num_workers={w},decode_threads=0": r for w, r in loader["detloader"].items()}
    every |= loader["detloader_decode_threads"]
    assert loader["best_setting_rate"] == max(every.values()) == every[loader["best_setting"]]
    assert rows[f"best setting ({loader['best_setting']}) / decode ceiling"]["a"] == loader["best_setting_rate"]
    default = rows[f"untuned default (num_workers='auto' -> {loader['auto_setting']}) / best setting"]
    assert default["a"] == loader["auto"] and default["b"] == loader["best_setting_rate"]
    if loader["auto_setting"] == loader["best_setting"]:  # the best setting itself: one figure
        assert loader["auto"] == loader["best_setting_rate"] and any("timed on its own" in n for n in data["notes"])
    else:
        assert loader["auto"] == loader["auto_measured"]
    if importlib.util.find_spec("torchvision") is None:
        assert any("torchvision" in n and "not installed" in n for n in data["notes"])
    else:
        assert f"num_workers={best}: detloader / torchvision" in rows


def test_torchvision_from_its_recorded_run(tmp_path, monkeypatch):
    """Without torchvision, best / torchvision comes from the run `make bench-torchvision` recorded."""
    recorded = tmp_path / "tv.json"
    monkeypatch.setenv("DETLOADER_TORCHVISION_RESULT", str(recorded))
    report = BenchReport(settings={}, machine={})
    bench_loader_module._torchvision_ratio(report, {"best_setting_rate": 9.0})
    assert not report.ratios and "make bench-torchvision" in report.notes[0]
    run = {"settings": {"date": "2026-12-03"}, "figures": {"loader": {"best_setting_rate": 300.0,
                                                                      "torchvision": {"0": 100.0, "2": 120.0}}}}
    recorded.write_text(json.dumps(run))
    bench_loader_module._torchvision_ratio(report, {"best_setting_rate": 9.0})
    (ratio,) = report.ratios
    assert (ratio.a, ratio.b, ratio.ratio) == (300.0, 120.0, 2.5)
    assert "NOT measured in this run: recorded 2026-12-03 in tv.json on" in ratio.what
    assert "not this run's data or machine" in report.notes[-1]


def test_bench_quick_without_a_path_synthesises_its_data(capsys):
    data = _run(capsys, "--sampler-weights", "3000", "--index-files", "30")
    _check_ratios(data)
    assert data["settings"]["data"] == "synthetic"
    assert data["figures"]["index"]["files"] == 30


def test_decode_threads_are_measured(small_synth_root, tmp_path):
    """The section adds num_workers {0, best} x decode_threads {0, CPUs}, each against the
    ceiling."""
    import detloader

    report = BenchReport(settings={}, machine={})
    bench_loader_module.bench_loader(
        report, detloader.read_annotations(small_synth_root), small_synth_root,
        size=32, batch_size=4, batches=1, cpus=2, decode_images=4, workdir=tmp_path,
    )
    whats = {r.what for r in report.ratios}
    best = report.figures["loader"]["best_num_workers"]
    for w in sorted({0, best}):
        for t in (0, 2):
            assert f"detloader num_workers={w} decode_threads={t} / decode ceiling" in whats
    assert set(report.figures["loader"]["detloader_decode_threads"]) == {
        f"num_workers={w},decode_threads={t}" for w in sorted({0, best}) for t in (0, 2)
    }
    assert all(r > 0 for r in report.figures["loader"]["detloader_decode_threads"].values())


def test_median_of_takes_the_median_of_each_measure_round_robin():
    calls = []
    values = {"a": iter([1.0, 3.0, 9.0]), "b": iter([5.0, 2.0, 4.0])}
    measures = {k: (lambda k=k: calls.append(k) or next(values[k])) for k in values}
    assert bench_loader_module.median_of(measures, 3) == {"a": 3.0, "b": 4.0}
    assert calls == ["a", "b", "a", "b", "a", "b"]


def test_settings_and_report_refuse_what_they_cannot_compare():
    with pytest.raises(ValueError, match="batches=0"):
        BenchSettings.make(batches=0)
    with pytest.raises(ValueError, match="sections=\\['speed'\\]: choose from loader, index, sampler"):
        BenchSettings.make(sections=["speed"])
    assert BenchSettings.make(True, size=96).size == 96 and BenchSettings.make(True).batches == 2
    report = BenchReport(settings={}, machine={})
    report.add("s", "nothing measured", ("a", 1.0), ("b", 0.0), "s")
    assert not report.ratios and "not compared" in report.notes[0]
    report.add("s", "x", ("a", 3.0), ("b", 2.0), "s")
    assert report.ratios[0].ratio == 1.5 and "| s | x | a: 3.00 s | b: 2.00 s | 1.50 |" in report.table()


def test_bench_is_a_cli_command(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    out = capsys.readouterr().out
    for option in ("--size", "--batch-size", "--batches", "--json", "--quick"):
        assert option in out


def test_bench_runs_only_the_sections_asked_for(capsys):
    data = _run(capsys, "--sections", "sampler", "--sampler-weights", "4000")
    assert {r["section"] for r in data["ratios"]} == {"sampler"}
    assert set(data["figures"]) == {"sampler"} and data["settings"]["sections"] == ["sampler"]
    assert main(["bench", "--sections", "speed"]) == 2
    assert "choose from loader, index, sampler" in capsys.readouterr().err


@pytest.mark.skipif(multiprocessing.get_start_method() != "fork", reason="the children see the patch by fork")
def test_the_ceiling_sums_processes_started_together(monkeypatch, tmp_path):
    """The decode ceiling is the sum of one rate per process, each timed in its own process."""
    import os

    def rate(*args, **kwargs):
        (tmp_path / str(os.getpid())).touch()
        return 2.5

    monkeypatch.setattr(bench_loader_module, "decode_rate", rate)
    assert bench_loader_module.concurrent_decode_rate(None, 8, 2, 3) == 7.5  # type: ignore[arg-type]
    pids = {int(p.name) for p in tmp_path.iterdir()}
    assert len(pids) == 3 and os.getpid() not in pids


def test_the_ceiling_times_the_bare_library_calls_on_bytes_in_memory(small_synth_root, monkeypatch, tmp_path):
    """simplejpeg (DCT-scaled where the target allows) and torch's interpolate, no detloader
    decode and no file read while timed; an image they cannot decode is left out."""
    import shutil
    from pathlib import Path

    import detloader.images
    from detloader import read_annotations

    index = read_annotations(shutil.copytree(small_synth_root, tmp_path / "faces"), on_error="skip", cache=False)
    Path(index.image_path(1)).write_bytes(b"\xff\xd8\xff not a JPEG")
    monkeypatch.setattr(detloader.images, "decode_image", lambda *a, **k: pytest.fail("detloader's decode timed"))
    calls, reads = [], []
    real_decode, real_read = bench_loader_module.simplejpeg.decode_jpeg, Path.read_bytes
    sj = bench_loader_module.simplejpeg
    monkeypatch.setattr(sj, "decode_jpeg", lambda d, **k: calls.append(k) or real_decode(d, **k))
    monkeypatch.setattr(Path, "read_bytes", lambda self: reads.append(self) or real_read(self))
    assert bench_loader_module.decode_rate(index, 16, 6, repeats=2) > 0
    assert len(reads) == 6 and len(calls) == 5 * 3  # the bad one refused by its header; 5 untimed, then twice
    w, h = int(index.width[0]), int(index.height[0])
    scaled = {"min_width": 16, "min_height": 16} if w >= 32 and h >= 32 else {}
    assert calls[0] == {"colorspace": "RGB", **scaled} and w >= 32


def test_the_recorded_torchvision_run_is_looked_for_in_the_repository_benchmarks_folder():
    """Where `make bench-torchvision` writes its result (benchmarks/results/ at the top of the
    repository), not a folder beside the package."""
    from detloader.tune.bench.loader_speed import TORCHVISION_RESULT

    assert TORCHVISION_RESULT == Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "torchvision.json"
