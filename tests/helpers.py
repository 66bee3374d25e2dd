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


# -- Open Images ------------------------------------------------------------------------------
OI_BOXES_HEADER = (
    "ImageID,Source,LabelName,Confidence,XMin,XMax,YMin,YMax,IsOccluded,IsTruncated,IsGroupOf,IsDepiction,IsInside"
)
OI_LABELS_HEADER = "ImageID,Source,LabelName,Confidence"
OI_PREDICTIONS_HEADER = "ImageID,LabelName,Score,XMin,XMax,YMin,YMax"
OI_ROOT = "/m/0bl9f"


def write_rows(path: Path, header: str | None, rows: Iterable[Sequence[object]]) -> Path:
    """A CSV file as Open Images writes them: plain commas, one row a line, a final newline."""
    lines = ([header] if header else []) + [",".join(str(v) for v in row) for row in rows]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def oi_hierarchy(parents: dict[str, Sequence[str]], mids: Sequence[str]) -> dict:
    """The hierarchy JSON of Open Images for ``parents`` (MID -> its direct parents): a tree under
    the root ``Entity`` in which a class of several parents appears under each of them."""
    children: dict[str, list[str]] = {m: [] for m in mids}
    for child, ps in parents.items():
        for p in ps:
            children[p].append(child)

    def node(mid: str) -> dict:
        sub = [node(c) for c in children[mid]]
        return {"LabelName": mid, **({"Subcategory": sub} if sub else {})}

    return {"LabelName": OI_ROOT, "Subcategory": [node(m) for m in mids if not parents.get(m)]}


def oi_case(seed: int, images: int = 12) -> dict:
    """A random small Open Images evaluation case: 8 classes in a hierarchy where one class has
    two parents, boxes (some group-of), verified present / absent labels, and detections near
    the boxes (several inside the group-of ones), of their class or a relative, plus strays.
    Coordinates are normalised, at most 4 decimals; every score differs."""
    rng = np.random.default_rng(seed)
    mids = [f"/m/c{k}" for k in range(8)]
    names = ["Vehicle", "Car", "Bus", "Minibus", "Animal", "Dog", "Cat", "Toy"]
    parents = {"/m/c1": ["/m/c0", "/m/c7"], "/m/c2": ["/m/c0"], "/m/c3": ["/m/c2"], "/m/c5": ["/m/c4"],
               "/m/c6": ["/m/c4"]}
    sizes = {f"img{i:02d}": (int(rng.integers(200, 800)), int(rng.integers(200, 800))) for i in range(images)}
    box_rows, label_rows, pred_rows = [], [], []
    scores = iter(rng.permutation(np.arange(1, 20000)) / 20000.0)

    def jitter(box: np.ndarray, amount: float) -> np.ndarray:
        b = np.clip(box + rng.normal(0, amount, 4), 0, 1)
        return np.round(np.array([min(b[0], b[1]), max(b[0], b[1]), min(b[2], b[3]), max(b[2], b[3])]), 4)

    def predict(image: str, mid: str, b: np.ndarray) -> None:
        if b[0] < b[1] and b[2] < b[3]:
            pred_rows.append((image, mid, round(float(next(scores)), 5), *b.tolist()))

    for image in sizes:
        verified: dict[str, int] = {}
        for _ in range(int(rng.integers(0, 5))):
            mid = mids[int(rng.integers(0, 8))]
            x0, y0 = rng.uniform(0, 0.6, 2)
            w, h = rng.uniform(0.1, 0.4, 2)
            box = np.round(np.array([x0, min(x0 + w, 1), y0, min(y0 + h, 1)]), 4)
            group = int(rng.random() < 0.3)
            box_rows.append((image, "xclick", mid, 1, *box.tolist(), int(rng.integers(0, 2)), 0, group, 0, 0))
            verified[mid] = 1
            for _ in range(int(rng.integers(0, 4 if group else 3))):
                if group:  # a small box inside the group
                    cx, cy = rng.uniform(box[0], box[1]), rng.uniform(box[2], box[3])
                    d = np.round(np.array([cx - 0.03, cx + 0.03, cy - 0.03, cy + 0.03]).clip(0, 1), 4)
                else:
                    d = jitter(box, 0.03)
                other = mids[int(rng.integers(0, 8))] if rng.random() < 0.25 else mid
                predict(image, other, d)
        for mid in rng.choice(mids, size=int(rng.integers(0, 4)), replace=False).tolist():
            verified.setdefault(mid, int(rng.random() < 0.4))
        label_rows += [(image, "verification", mid, conf) for mid, conf in verified.items()]
        for _ in range(int(rng.integers(0, 4))):
            x0, y0 = rng.uniform(0, 0.7, 2)
            predict(image, mids[int(rng.integers(0, 8))], np.round(np.array([x0, x0 + 0.2, y0, y0 + 0.2]), 4))
    return {"mids": mids, "names": names, "parents": parents, "sizes": sizes, "boxes": box_rows,
            "labels": label_rows, "predictions": pred_rows}


def write_oi_case(folder: Path, case: dict) -> dict[str, Path]:
    """``case`` (:func:`oi_case`) as the challenge's files in ``folder``: V7 class descriptions
    (with their header), the hierarchy JSON, the boxes and image-level labels CSVs, the
    predictions CSV and the label map of the reference."""
    import json

    files = {
        "classes": write_rows(folder / "oidv7-class-descriptions-boxable.csv", "LabelName,DisplayName",
                              zip(case["mids"], case["names"])),
        "boxes": write_rows(folder / "validation-annotations-bbox.csv", OI_BOXES_HEADER, case["boxes"]),
        "labels": write_rows(folder / "validation-annotations-human-imagelabels-boxable.csv", OI_LABELS_HEADER,
                             case["labels"]),
        "predictions": write_rows(folder / "predictions.csv", OI_PREDICTIONS_HEADER, case["predictions"]),
        "hierarchy": folder / "bbox_labels_600_hierarchy.json",
        "labelmap": folder / "labelmap.pbtxt",
    }
    files["hierarchy"].write_text(json.dumps(oi_hierarchy(case["parents"], case["mids"])))
    files["labelmap"].write_text("".join(f'item {{ name: "{m}" id: {k + 1} display_name: "{n}" }}\n'
                                         for k, (m, n) in enumerate(zip(case["mids"], case["names"]))))
    return files
