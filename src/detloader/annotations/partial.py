"""One chunk of a dataset as arrays (:class:`Partial`): what a :class:`~detloader.annotations.builder.ChunkBuilder`
produces and :func:`detloader.annotations.parse.merge` merges."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from detloader.annotations.problems import Problem


@dataclass
class Partial:
    """One chunk of a dataset as arrays, with chunk-local vocabularies (see ``merge``).

    ``arrays``: every field of ``FIELDS`` plus ``object_offsets``, with chunk-local ids;
    ``vocabs``: for each vocabulary a field refers to, the local names in id order (attribute
    tables: ``(attribute, values)`` pairs); ``missing_names``: the first images not found.
    """

    arrays: dict[str, np.ndarray]
    strings: dict[str, list[str]]
    vocabs: dict[str, Any]
    problems: list[Problem]
    stats: dict[str, int] = field(default_factory=dict)
    declared_classes: list[str] = field(default_factory=list)
    #: the id the files give each declared class (COCO category id), when they give one
    declared_class_ids: dict[str, int] = field(default_factory=dict)
    missing_names: list[str] = field(default_factory=list)
    #: class names in the files before ``class_map`` (only collected when there is one)
    file_classes: list[str] = field(default_factory=list)

    @property
    def landmark_names(self) -> list[str]:
        """Landmark names found in the chunk, in local slot order."""
        names: list[str] = self.vocabs["landmarks"]
        return names
