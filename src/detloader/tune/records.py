"""The tuner's records (probes, trials) as plain JSON-ready dicts and back."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

R = TypeVar("R", bound="Record")


class Record:
    """Mixin for a dataclass of JSON values: :meth:`to_dict`, and :meth:`from_dict`, which drops
    keys the class does not have (a file written by a later detloader stays readable)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[R], data: Mapping[str, Any]) -> R:
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        return cls(**{k: v for k, v in data.items() if k in names})
