"""The dataset stage, one sample at a time: :class:`DetectionDataset` (``detection.py``: an
index and a transform give a :class:`Sample`; the decode-failure policy and what stands in for an
image that does not decode), the :class:`Sample` it yields (``sample.py``), and the store of
decoded images that later epochs read instead of decoding (``store.py``; its files, locks and
lifetime in ``store_files.py``).
"""

from detloader.dataset.detection import DECODE_ERROR_CHOICES, DetectionDataset, OnDecodeError
from detloader.dataset.sample import Sample

__all__ = ["DECODE_ERROR_CHOICES", "DetectionDataset", "OnDecodeError", "Sample"]
