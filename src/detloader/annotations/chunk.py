"""What one chunk of files becomes: :class:`Partial` (arrays with chunk-local ids) and the
chunk-local vocabularies the builder fills while reading (:class:`LocalVocab`,
:class:`AttributeCells`). Chunks travel from worker processes to ``merge`` by pickle.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from detloader.annotations.fields import MISSING
from detloader.annotations.problems import Problem


@dataclass
class Partial:
    """One chunk of a dataset as arrays, with chunk-local vocabularies (see ``merge``).

    ``arrays``: every image/object field of ``FIELDS`` plus ``object_offsets``, ids local to
    the chunk; ``strings``: the string fields as lists; ``vocabs``: for each vocabulary a
    field refers to (``Field.vocab``), the local names in id order (for attribute tables, a
    list of ``(attribute, values)``); ``missing_names``: the first images not found, as named.
Fields read as attributes: ``part.boxes``.
    """

    arrays: dict[str, np.ndarray]
    strings: dict[str, list[str]]
    vocabs: dict[str, Any]
    problems: list[Problem]
    stats: dict[str, int] = field(default_factory=dict)
    declared_classes: list[str] = field(default_factory=list)
    missing_names: list[str] = field(default_factory=list)
    #: class names in the files before ``class_map`` (only collected when there is one)
    file_classes: list[str] = field(default_factory=list)

    def __getattr__(self, name: str) -> Any:
        arrays = self.__dict__.get("arrays")
        if arrays is not None and name in arrays:
            return arrays[name]
        raise AttributeError(name)

    @property
    def landmark_names(self) -> list[str]:
        """Landmark names found in the chunk, in local slot order."""
        names: list[str] = self.vocabs["landmarks"]
        return names


class LocalVocab:
    """Strings to local ids in order of first appearance."""

    __slots__ = ("ids", "names")

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.names: list[str] = []

    def id(self, name: str) -> int:
        i = self.ids.get(name)
        if i is None:
            i = self.ids[name] = len(self.names)
            self.names.append(name)
        return i


class AttributeCells:
    """Rows of name -> value dicts, kept as (row, name id, value id) triples."""

    def __init__(self) -> None:
        self.names = LocalVocab()
        self.values: list[LocalVocab] = []
        self.cells: list[tuple[int, int, int]] = []

    def add(self, row: int, attrs: Mapping[str, str]) -> None:
        for name, value in attrs.items():
            a = self.names.id(name)
            if a == len(self.values):
                self.values.append(LocalVocab())
            self.cells.append((row, a, self.values[a].id(value)))

    def finish(self, n_rows: int) -> tuple[np.ndarray, list[tuple[str, list[str]]]]:
        table = np.full((n_rows, len(self.names.names)), MISSING, dtype=np.int32)
        if self.cells:
            cells = np.asarray(self.cells, dtype=np.int64)
            table[cells[:, 0], cells[:, 1]] = cells[:, 2]
        return table, [(n, v.names) for n, v in zip(self.names.names, self.values)]
