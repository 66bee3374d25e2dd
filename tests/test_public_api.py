"""The package face: a small set of names, all importable, listed for dir(); torch loads lazily."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import detloader
from detloader.errors import MissingExtraError


def test_every_listed_name_resolves_and_dir_lists_it() -> None:
    assert len(detloader.__all__) == len(set(detloader.__all__))
    for name in detloader.__all__:
        assert getattr(detloader, name) is not None, name
        assert name in dir(detloader)


def test_internals_stay_off_the_face() -> None:
    for name in ("check_options", "dataloader_kwargs", "choose", "worker_ladder", "grid_candidates",
                 "auto_loader_kwargs", "build_index"):
        assert name not in detloader.__all__
        assert not hasattr(detloader, name)


def test_import_does_not_load_torch() -> None:
    code = "import sys, detloader, detloader.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_all_is_the_public_face_and_only_there() -> None:
    """``__all__`` in the packages and the public modules (``errors``, ``lightning``), each name it
    lists importable; internal modules have none, so their helpers do not look public."""
    public = {"detloader.errors", "detloader.adapters.lightning", "detloader.adapters.ultralytics",
              "detloader.adapters.transformers"}
    for info in pkgutil.walk_packages(detloader.__path__, "detloader."):
        if info.name.endswith("__main__"):
            continue
        try:
            module = importlib.import_module(info.name)
        except MissingExtraError:  # its extra is not installed here (ultralytics: make test-ultralytics)
            assert info.name.endswith(".ultralytics"), f"{info.name} needs an extra that dev does not install"
            continue
        if info.ispkg or info.name in public:
            assert hasattr(module, "__all__"), f"{info.name} has no __all__"
            for name in module.__all__:
                assert hasattr(module, name), f"{info.name}.__all__ lists {name!r}, which it lacks"
        else:
            assert not hasattr(module, "__all__"), f"{info.name} is internal: no __all__"
