"""The README's Python example, pasted into a plain script (no ``__main__`` guard), runs.

Over 600 annotation files the first read parses in worker processes, which is where a script
without a guard used to die in bootstrapping (``BrokenProcessPool``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from detloader.annotations.parse import PARALLEL_MIN_FILES

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    assert blocks, "README.md has no python example"
    return blocks[0]


def script_for(root: Path, start_method: str | None) -> str:
    code = readme_example()
    assert '"data/VOC2007"' in code and "range(10)" in code
    code = code.replace('"data/VOC2007"', repr(str(root))).replace("range(10)", "range(1)")
    head = (
        "" if start_method is None else f"import multiprocessing\nmultiprocessing.set_start_method({start_method!r})\n"
    )
    return head + code + '\nprint("images", len(index), "batches", loader.__len__())\n'


@pytest.mark.slow
@pytest.mark.parametrize("start_method", [None, "forkserver", "spawn"])
def test_readme_example_runs_as_a_plain_script(tmp_path: Path, synth_600: Path, start_method: str | None) -> None:
    script = tmp_path / "example.py"
    script.write_text(script_for(synth_600, start_method), encoding="utf-8")
    env = {**os.environ, "DETLOADER_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "bootstrapping" not in proc.stderr
    assert "images 600" in proc.stdout


@pytest.fixture(scope="module")
def synth_600(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from detloader.synth import make_synthetic

    root = tmp_path_factory.mktemp("readme") / "synth"
    make_synthetic(root, 600, seed=0, size=(160, 120))
    assert 600 >= PARALLEL_MIN_FILES  # the cold read goes through worker processes
    return root


def test_readme_example_runs_on_a_dataset_without_split_files(tmp_path: Path) -> None:
    """Most exports come without split files: the example makes them once, written beside the
    data, and a second run reads the same ones."""
    import shutil

    from detloader.synth import make_synthetic

    root = make_synthetic(tmp_path / "export", 40, seed=0, size=(96, 72))
    shutil.rmtree(root / "ImageSets")
    script = tmp_path / "example.py"
    script.write_text(script_for(root, None), encoding="utf-8")
    env = {**os.environ, "DETLOADER_CACHE_DIR": str(tmp_path / "cache")}
    runs = [subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=240) for _ in range(2)]
    for proc in runs:
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "images 40" in proc.stdout
    train = (root / "ImageSets" / "Main" / "train.txt").read_text().split()
    assert 28 <= len(train) <= 34 and runs[0].stdout == runs[1].stdout
