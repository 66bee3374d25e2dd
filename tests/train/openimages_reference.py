"""The Open Images Challenge evaluation of the TensorFlow Object Detection API, run as its own
two command-line tools on the challenge's files; the reference that
tests/train/test_openimages_eval.py compares detloader's evaluator to.

Run by the side environment's Python (``make reference`` builds ``.venv-reference``:
numpy 1.23, pandas, protobuf, absl, six, pycocotools and ``object-detection-by-ovi``, a copy of
the API's ``research/object_detection`` on PyPI), never by the project's own::

    python openimages_reference.py --hierarchy JSON --boxes CSV --labels CSV --predictions CSV \
        --labelmap PBTXT --out CSV [--expand-predictions]

(the challenge's files: the hierarchy JSON, the boxes and image-level labels CSVs, a predictions
CSV ``ImageID,LabelName,Score,XMin,XMax,YMin,YMax`` and the label map). What runs, unmodified:
``object_detection.dataset_tools.oid_hierarchical_labels_expansion`` expands the boxes and the
image-level labels (and, with ``--expand-predictions``, the predictions: the same tool on a file
whose ``LabelName`` column is the second), then ``object_detection.metrics.oid_challenge_evaluation``
scores them (``OpenImagesChallengeEvaluator``) and writes the metrics CSV ``--out`` (the expanded
files beside it).

The evaluation's modules import TensorFlow at the top (``tensorflow.compat.v1``:
``object_detection_evaluation``, ``label_map_util``) and never call it on this path (it serves
their Estimator glue and label-map file reading); TensorFlow is not installed, an empty module
stands in for it, and any use of it would raise. The expansion tool runs in its own process.
"""

from __future__ import annotations

import argparse
import runpy
import subprocess
import sys
import types
from pathlib import Path


class _NoTensorFlow(types.ModuleType):
    def __getattr__(self, name: str) -> None:
        raise AttributeError(f"the reference reached tensorflow.{name}, which this environment does not have")


def _stand_in_for_tensorflow() -> None:
    for name in ("tensorflow", "tensorflow.compat", "tensorflow.compat.v1"):
        sys.modules[name] = _NoTensorFlow(name)


def _expand(hierarchy: str, source: str, out: Path, kind: int) -> Path:
    """``python -m ...oid_hierarchical_labels_expansion``: ``kind`` 1 boxes, 2 image-level labels."""
    subprocess.run([sys.executable, "-m", "object_detection.dataset_tools.oid_hierarchical_labels_expansion",
                    f"--json_hierarchy_file={hierarchy}", f"--input_annotations={source}",
                    f"--output_annotations={out}", f"--annotation_type={kind}"], check=True)
    return out


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    for name in ("hierarchy", "boxes", "labels", "predictions", "labelmap", "out"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--expand-predictions", action="store_true")
    args = parser.parse_args(argv)
    work = Path(args.out).parent
    boxes = _expand(args.hierarchy, args.boxes, work / "expanded_boxes.csv", 1)
    labels = _expand(args.hierarchy, args.labels, work / "expanded_labels.csv", 2)
    predictions = args.predictions
    if args.expand_predictions:
        predictions = _expand(args.hierarchy, args.predictions, work / "expanded_predictions.csv", 1)
    _stand_in_for_tensorflow()
    sys.argv = ["oid_challenge_evaluation", f"--input_annotations_boxes={boxes}",
                f"--input_annotations_labels={labels}", f"--input_predictions={predictions}",
                f"--input_class_labelmap={args.labelmap}", f"--output_metrics={args.out}"]
    try:  # python -m object_detection.metrics.oid_challenge_evaluation, in this process (the stand-in)
        runpy.run_module("object_detection.metrics.oid_challenge_evaluation", run_name="__main__", alter_sys=True)
    except SystemExit as stop:  # absl's app.run exits
        if stop.code not in (None, 0):
            raise


if __name__ == "__main__":
    main(sys.argv[1:])
