"""Tiny annotation files for tests, written into tmp_path."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from PIL import Image


def write_image(path: Path, size: tuple[int, int] = (64, 48), color: tuple[int, int, int] = (90, 120, 150)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)
    return path


def voc_object(
    name: str,
    box: Sequence[float | str],
    *,
    difficult: str | None = "0",
    truncated: str | None = None,
    occluded: str | None = None,
    pose: str | None = None,
    extra: str = "",
) -> str:
    parts = ["<object>", f"<name>{name}</name>"]
    if pose is not None:
        parts.append(f"<pose>{pose}</pose>")
    for tag, value in (("truncated", truncated), ("difficult", difficult), ("occluded", occluded)):
        if value is not None:
            parts.append(f"<{tag}>{value}</{tag}>")
    x1, y1, x2, y2 = box
    parts.append(f"<bndbox><xmin>{x1}</xmin><ymin>{y1}</ymin><xmax>{x2}</xmax><ymax>{y2}</ymax></bndbox>")
    parts.append(extra)
    parts.append("</object>")
    return "".join(parts)


def voc_xml(
    filename: str,
    objects: Iterable[str] = (),
    *,
    size: tuple[int, int] | None = (64, 48),
    extra: str = "",
    verified: bool = False,
) -> str:
    head = '<annotation verified="yes">' if verified else "<annotation>"
    size_xml = (
        f"<size><width>{size[0]}</width><height>{size[1]}</height><depth>3</depth></size>" if size else ""
    )
    return f"{head}<folder>x</folder><filename>{filename}</filename>{size_xml}{extra}{''.join(objects)}</annotation>"


def voc_dataset(
    root: Path,
    files: dict[str, str],
    *,
    images: Sequence[str] | None = None,
    image_size: tuple[int, int] = (64, 48),
    splits: dict[str, Sequence[str]] | None = None,
) -> Path:
    """A VOCdevkit-style folder: Annotations/<stem>.xml, JPEGImages/<image>, ImageSets/Main."""
    (root / "Annotations").mkdir(parents=True, exist_ok=True)
    for stem, xml in files.items():
        (root / "Annotations" / f"{stem}.xml").write_text(xml, encoding="utf-8")
    for image in images if images is not None else [f"{s}.jpg" for s in files]:
        write_image(root / "JPEGImages" / image, image_size)
    for name, ids in (splits or {}).items():
        main = root / "ImageSets" / "Main"
        main.mkdir(parents=True, exist_ok=True)
        (main / f"{name}.txt").write_text("".join(f"{i}\n" for i in ids))
    return root


def keypoints_xml(points: Sequence[tuple[str, float, float, int]]) -> str:
    inner = "".join(f'<keypoint name="{n}" x="{x}" y="{y}" visible="{v}"/>' for n, x, y, v in points)
    return f"<keypoints>{inner}</keypoints>"


def arrays_equal(a, b) -> bool:
    return all(np.array_equal(a.arrays()[k], b.arrays()[k]) for k in a.arrays())


def free_port() -> int:
    """A TCP port free on the loopback now (the rendezvous of a test's gloo processes)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def load_benchmark(name: str):
    """The module of ``benchmarks/NAME.py`` (the scripts are not a package), freshly executed."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
