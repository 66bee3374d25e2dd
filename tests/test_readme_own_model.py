"""The README's "Your own model" blocks, each run as written as a plain script in a folder
holding the synthetic dataset (``detloader synth data/VOC2007 --images 64``). A block that
imports torchvision or lightning skips where that import fails; the torchvision ones are
marked ``integration`` (``make test-integration`` runs them beside a torch they load with)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def own_model_blocks() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Your own model\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 4, "README's 'Your own model' has lost a block"
    return blocks


def _needs(code: str) -> str | None:
    for name in ("torchvision", "lightning"):
        if re.search(rf"^(import|from) {name}\b", code, flags=re.M):
            return name
    return None


def _params() -> list:
    out = []
    for i, code in enumerate(own_model_blocks()):
        needs = _needs(code)
        marks = [pytest.mark.slow] + ([pytest.mark.integration] if needs == "torchvision" else [])
        out.append(pytest.param(i, marks=marks, id=f"block{i}-{needs or 'plain'}"))
    return out


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from detloader.cli import main

    root = tmp_path_factory.mktemp("readme_own") / "VOC2007"
    assert main(["synth", str(root), "--images", "64"]) == 0
    return root


@pytest.mark.timeout(600)
@pytest.mark.parametrize("block", _params())
def test_block_runs_as_a_plain_script(block: int, synthetic: Path, tmp_path: Path) -> None:
    code = own_model_blocks()[block]
    needs = _needs(code)
    if needs:
        try:
            __import__("lightning.pytorch" if needs == "lightning" else needs)
        except Exception as err:  # torchvision beside a torch it was not built for fails to load its ops
            pytest.skip(f"{needs} does not import here ({type(err).__name__}: {err})"[:200])
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "VOC2007").symlink_to(synthetic)
    (tmp_path / "block.py").write_text(code, encoding="utf-8")
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, "block.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=580
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip(), "the block printed nothing"
    if "coco_json=" in code:
        assert (tmp_path / "detections.json").is_file()


def _install_lines() -> list[str]:
    """The install line each block of "Your own model" follows (the last ``pip install`` shown
    before it in the section; the plain ``pip install detloader`` where none is)."""
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Your own model\n", 1)[1].split("\n## ", 1)[0]
    out, last = [], "pip install detloader"
    for part in re.split(r"(```python\n.*?```)", section, flags=re.S):
        if part.startswith("```python"):
            out.append(last)
            last = "pip install detloader"  # each block's own line: none carries over
        else:
            found = re.findall(r"pip install '?(detloader(?:\[[a-z,]+\])?)'?", part)
            last = f"pip install {found[-1]}" if found else last
    return out


def _distributions(line: str) -> set[str]:
    """Every distribution that ``line`` installs by detloader's pyproject (names only)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    project = tomllib.loads((README.parent / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = re.search(r"\[([a-z,]+)\]", line)
    reqs = list(project["dependencies"])
    for extra in extras.group(1).split(",") if extras else ():
        reqs += project["optional-dependencies"][extra]
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in reqs}


def test_each_block_needs_only_what_its_install_line_installs() -> None:
    """What a block imports, and the mAP backend its scoring or training needs (pycocotools or
    faster-coco-eval), come with the install line shown for it: no MissingExtraError after
    minutes of training."""
    scoring = ("score_predictions", "evaluate_checkpoint", "train(", "evaluate_model")
    for code, line in zip(own_model_blocks(), _install_lines()):
        have = _distributions(line)
        imported = set(re.findall(r"^(?:import|from) ([a-z_]+)", code, flags=re.M)) - {"detloader", "__future__"}
        for name in imported:
            assert name in have, f"a block imports {name}, which {line!r} does not install"
        if any(s in code for s in scoring):
            assert have & {"pycocotools", "faster-coco-eval"}, f"{line!r} installs no mAP backend"
