"""Shared fixtures. Every test gets its own index cache folder (DETLOADER_CACHE_DIR)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# albumentations (a dev dependency) asks a package index for a newer version at import: not in tests
os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

SHARED_DATASETS = Path(__file__).resolve().parents[2] / "shared" / "datasets"


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Caches go to a temporary folder, never beside shared or user data; a test that unsets
    DETLOADER_CACHE_DIR (to cache beside a dataset) still records nothing in the user's cache."""
    folder = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("DETLOADER_CACHE_DIR", str(folder))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("user_cache")))
    return folder


@pytest.fixture(scope="session")
def synth_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default synthetic dataset (200 images), written once per test session. Read-only."""
    from detloader.synth import make_synthetic

    return make_synthetic(tmp_path_factory.mktemp("synth") / "faces", 200, seed=0)


@pytest.fixture(scope="session")
def small_synth_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small synthetic dataset (24 images) for fast tests. Read-only."""
    from detloader.synth import make_synthetic

    return make_synthetic(tmp_path_factory.mktemp("synth_small") / "faces", 24, seed=3)


def _shared(name: str) -> Path:
    path = SHARED_DATASETS / name
    if not path.is_dir():
        pytest.skip(f"real dataset {name} not available (../shared/datasets/{name} is absent)")
    return path


@pytest.fixture
def bccd_root() -> Path:
    """BCCD blood cells (VOC, 364 images). Skips when ../shared/datasets is absent."""
    return _shared("bccd")


@pytest.fixture
def dlib_faces_root() -> Path:
    """dlib imglab faces with 68 landmarks. Skips when ../shared/datasets is absent."""
    return _shared("dlib-faces")
