"""``detloader validate`` counts what there is: every problem in ``--json`` with the true total
of each kind, and a human table that may shorten a long kind but says how many it holds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from detloader import read_annotations
from detloader.annotations.problems import Problem, ProblemReport
from detloader.cli import main

BOX = "<object><name>face</name><bndbox><xmin>2</xmin><ymin>2</ymin><xmax>20</xmax><ymax>18</ymax></bndbox></object>"


def _voc_with_unannotated(root: Path, annotated: int = 3, alone: int = 22) -> list[str]:
    """A VOC folder: ``annotated`` images with an XML file and ``alone`` without; the names of
    the latter, relative to ``root``."""
    (root / "JPEGImages").mkdir(parents=True)
    (root / "Annotations").mkdir()
    rng = np.random.default_rng(0)
    names = [f"img{i:02d}.jpg" for i in range(annotated + alone)]
    for i, name in enumerate(names):
        Image.fromarray(rng.integers(0, 255, (24, 32, 3), dtype=np.uint8)).save(root / "JPEGImages" / name)
        if i < annotated:
            (root / "Annotations" / f"{Path(name).stem}.xml").write_text(
                f"<annotation><filename>{name}</filename><size><width>32</width><height>24</height>"
                f"<depth>3</depth></size>{BOX}</annotation>"
            )
    return [f"JPEGImages/{name}" for name in names[annotated:]]


def test_json_carries_every_unannotated_image_and_the_total(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    alone = _voc_with_unannotated(tmp_path / "ds")
    assert main(["validate", str(tmp_path / "ds"), "--json", "--no-cache"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["images"] == 3 and report["problems"] == {"unannotated_image": 22} and report["total"] == 22
    items = [item for item in report["items"] if item["kind"] == "unannotated_image"]
    assert [item["file"] for item in items] == alone
    assert not any("more" in item["message"] for item in items)


def test_the_table_shortens_a_long_kind_but_states_its_total(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    alone = _voc_with_unannotated(tmp_path / "ds")
    assert main(["validate", str(tmp_path / "ds"), "--no-cache", "--per-kind", "5"]) == 0
    text = capsys.readouterr().out
    assert "22 problems" in text and "unannotated_image: 22" in text
    assert "... and 17 more" in text and "22 in all" in text
    assert all(name in text for name in alone[:5]) and alone[5] not in text
    assert main(["validate", str(tmp_path / "ds"), "--no-cache"]) == 0  # not a terminal: every one, for grep
    text = capsys.readouterr().out
    assert all(name in text for name in alone) and "in all" not in text and "unannotated_image: 22" in text


def test_a_cache_written_before_holds_the_same_count(tmp_path: Path):
    _voc_with_unannotated(tmp_path / "ds")
    first = read_annotations(tmp_path / "ds")
    again = read_annotations(tmp_path / "ds")  # from the cache
    assert again.source_file is not None
    assert first.problems.counts() == again.problems.counts() == {"unannotated_image": 22}


def test_summary_says_how_many_more_each_kind_holds():
    report = ProblemReport(Problem("empty_box", f"{i}.xml", "object[0]", "xmax <= xmin") for i in range(7))
    report.add(Problem("box_clipped", "a.xml", "", "clipped", severity="repaired"))
    text = report.summary(per_kind=3)
    assert text.splitlines()[0] == "8 problems (7 errors): empty_box: 7, box_clipped: 1"
    assert "    ... and 4 more (7 in all)" in text.splitlines()
    assert text.count("in all") == 1  # box_clipped shows its one problem and nothing more
