"""End to end: a cache rebuilt by another process while spawn / forkserver DataLoader workers
use it. Every later epoch still loads, with the arrays the loader started with."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import voc_dataset, voc_object, voc_xml

import detloader
from detloader import DetectionDataset, make_loader, read_annotations


def _epoch(loader, dataset, epoch: int) -> list[tuple[int, list]]:  # type: ignore[no-untyped-def]
    dataset.set_epoch(epoch)
    return [(int(i), b.tolist()) for batch in loader for i, b in zip(batch.image_ids, batch.boxes)]


@pytest.mark.slow
@pytest.mark.parametrize(("context", "persistent"), [("spawn", True), ("spawn", False), ("forkserver", True)])
def test_workers_keep_their_arrays_when_another_process_rebuilds_the_cache(
    tmp_path: Path, context: str, persistent: bool
) -> None:
    files = {f"{i}": voc_xml(f"{i}.jpg", [voc_object("cat", (2, 2, 20 + i, 20))]) for i in range(6)}
    root = voc_dataset(tmp_path / "voc", files)
    index = read_annotations(root)
    cache_file = index._source_file
    assert cache_file is not None
    inode = os.stat(cache_file).st_ino
    dataset = DetectionDataset(index, seed=0)
    loader = make_loader(
        dataset, batch_size=2, num_workers=2, multiprocessing_context=context, persistent_workers=persistent
    )
    first = _epoch(loader, dataset, 0)
    assert len(first) == 6

    # another process changes an annotation and reads again: the cache is rebuilt (a new file)
    xml = root / "Annotations" / "0.xml"
    xml.write_text(voc_xml("0.jpg", [voc_object("cat", (1, 1, 9, 9))]), encoding="utf-8")
    os.utime(xml, ns=(10**9, 10**9))
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(Path(detloader.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]),
    )
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from detloader import read_annotations; read_annotations(sys.argv[1])",
            str(root),
        ],
        check=True,
        env=env,
        timeout=120,
    )
    assert os.stat(cache_file).st_ino != inode
    assert read_annotations(root).image(0).boxes.tolist() == [[1, 1, 9, 9]]

    # two more epochs: no "worker exited unexpectedly", the loader's own arrays throughout
    assert _epoch(loader, dataset, 1) == first
    assert _epoch(loader, dataset, 2) == first
    assert np.array_equal(index.boxes[0], [2, 2, 20, 20])
