"""The docs stay true to the tree: docs/architecture.md names every module, and every file path and
``detloader.*`` name the docs and the module docstrings give exists."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from detloader.errors import MissingExtraError

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "detloader"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]

#: A backticked file or folder path: ``annotations/cache.py``, ``tune/bench/``, ``tests/test_docs.py``.
_PATH = re.compile(r"`([\w.-]+(?:/[\w.-]+)*(?:\.py|\.md|/))`")
#: A backticked dotted name of the package: ``detloader.dataset.store_files``, ``detloader._system.files.atomic_write``.
_NAME = re.compile(r"`(detloader(?:\.\w+)+)")
#: A Sphinx role's target in a docstring: ``:mod:`~detloader.loader.workers```, ``:func:`.coco_eval.x```.
_ROLE = re.compile(r":(?:mod|func|class|meth|data|attr|exc):`~?(\.*[A-Za-z_][\w.]*)`")


def _exists(path: str) -> bool:
    """``path`` relative to src/detloader (package code) or to the repository root; for a
    placeholder (``cli/NAME.py``) its folder."""
    if "NAME" in Path(path).name:
        path = Path(path).parent.as_posix() + "/"
    return (PACKAGE / path).exists() or (ROOT / path).exists()


def _resolves(name: str) -> bool:
    """Whether ``name`` is a module of the package or an attribute of one (a module whose extra is
    not installed counts as found)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except MissingExtraError:
            return True
        except ImportError:
            continue
        for part in parts[i:]:
            if not hasattr(obj, part):
                return False
            obj = getattr(obj, part)
        return True
    return False


def _modules() -> list[str]:
    return sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py"))


def test_architecture_names_every_module() -> None:
    named = set(_PATH.findall(ARCHITECTURE.read_text(encoding="utf-8")))
    missing = [m for m in _modules() if m not in named]
    assert not missing, f"docs/architecture.md does not name {missing} (its path relative to src/detloader)"


def test_architecture_paths_exist() -> None:
    """In docs/architecture.md every path is written in full, so a bare ``store.py`` fails too."""
    paths = set(_PATH.findall(ARCHITECTURE.read_text(encoding="utf-8")))
    assert len(paths) > len(_modules())
    assert not [p for p in sorted(paths) if not _exists(p)]


def test_readme_table_paths_exist() -> None:
    """The ``where`` column of README.md's "What is in it" names files relative to src/detloader."""
    text = ROOT.joinpath("README.md").read_text(encoding="utf-8")
    table = text.split("## What is in it", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| stage")]
    wheres = [line.split(" | ")[1] for line in rows]
    paths = [p for where in wheres for p in _PATH.findall(where)]
    assert len(rows) >= 15 and len(paths) >= len(rows)
    assert not [p for p in paths if not (PACKAGE / p).exists()]


def test_doc_module_paths_exist() -> None:
    """In every doc, a Python file named with its folder (``train/loop.py``, ``tests/test_store.py``)
    exists (other paths in the docs are a dataset's: ``train/labels/``)."""
    stale = [
        f"{doc.name}: {p}"
        for doc in DOCS
        for p in _PATH.findall(doc.read_text(encoding="utf-8"))
        if "/" in p and p.endswith(".py") and not _exists(p)
    ]
    assert not stale


def test_doc_names_resolve() -> None:
    """Every ``detloader.x.y`` a doc names is a module or an attribute of one."""
    stale = [
        f"{doc.name}: {name}"
        for doc in DOCS
        for name in sorted(set(_NAME.findall(doc.read_text(encoding="utf-8"))))
        if not _resolves(name)
    ]
    assert not stale


@pytest.mark.parametrize("module", [m for m in _modules() if not m.endswith("__main__.py")])
def test_docstring_references_resolve(module: str) -> None:
    """The ``:mod:`` / ``:func:`` / ... targets of a module's docstrings and comments that name their
    module (``detloader.``, or relative: ``.stopping``) and the ``detloader.*`` names in double
    backticks exist."""
    dotted = "detloader." + module.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    package = dotted if module.endswith("__init__.py") else dotted.rpartition(".")[0]
    text = (PACKAGE / module).read_text(encoding="utf-8")
    names = set(re.findall(r"``(detloader(?:\.\w+)+)", text))
    for target in _ROLE.findall(text):
        if target.startswith("."):
            base = package
            for _ in range(len(target) - len(target.lstrip(".")) - 1):
                base = base.rpartition(".")[0]
            names.add(f"{base}.{target.lstrip('.')}")
        elif target.startswith("detloader."):
            names.add(target)
    assert not [n for n in sorted(names) if not _resolves(n)]
