"""Every problem kind written anywhere in src is described in KINDS."""

from __future__ import annotations

import ast
from pathlib import Path

import detloader
from detloader.annotations.problems import KINDS

SRC = Path(detloader.__file__).parent
#: Callables whose first argument (or ``kind=``) is a problem kind.
KIND_CALLS = {"Problem", "Finding", "problem", "capped"}


def _kinds_in_source() -> dict[str, list[str]]:
    """kind -> ``file:line`` of every literal kind passed to a KIND_CALLS call in src."""
    found: dict[str, list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            if name not in KIND_CALLS:
                continue
            args = [kw.value for kw in node.keywords if kw.arg == "kind"] or node.args[:1]
            for arg in args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found.setdefault(arg.value, []).append(f"{path.relative_to(SRC)}:{node.lineno}")
    return found


def test_every_kind_used_in_src_is_in_kinds() -> None:
    found = _kinds_in_source()
    # the collector sees the readers, the rules and the image checks
    assert {"empty_box", "missing_image", "unreadable_image", "too_many_pixels", "reader_error"} <= set(found)
    missing = {kind: where for kind, where in found.items() if kind not in KINDS}
    assert not missing, f"kinds used but not in KINDS: {missing}"


def test_every_kind_has_a_description() -> None:
    assert all(isinstance(text, str) and text.strip() for text in KINDS.values())
