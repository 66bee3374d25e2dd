"""One error family: everything detloader raises on purpose is a DetloaderError, and keeps the
builtin base callers caught before."""

import ast
import inspect
import pathlib
import warnings

import pytest

import detloader
from detloader import errors


def _classes(base):
    return [c for c in vars(errors).values() if inspect.isclass(c) and issubclass(c, base)]


def test_every_error_class_is_in_the_family_and_keeps_a_builtin_base():
    for cls in _classes(BaseException):
        if issubclass(cls, Warning):
            assert issubclass(cls, detloader.DetloaderWarning), cls
            continue
        assert issubclass(cls, detloader.DetloaderError), cls
        if cls is not errors.DetloaderError:
            builtin = [
                b
                for b in cls.__mro__
                if b.__module__ == "builtins" and b not in (Exception, BaseException, object)
            ]
            assert builtin, f"{cls.__name__} keeps no builtin base (ValueError, OSError, ...)"


def test_the_source_raises_no_bare_builtin_error():
    """`raise ValueError(...)` and friends are DetloaderError subclasses everywhere in the source."""
    bare = {"ValueError", "TypeError", "KeyError", "IndexError", "RuntimeError", "OSError",
            "FileNotFoundError", "ImportError", "Exception"}
    src = pathlib.Path(detloader.__file__).parent
    found = []
    for path in src.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                name = getattr(node.exc.func, "id", None)
                if name in bare:
                    found.append(f"{path.relative_to(src)}:{node.lineno} raise {name}")
    assert not found, found


def test_library_errors_are_caught_by_the_family_and_by_their_old_base(tmp_path):
    with pytest.raises(detloader.DetloaderError) as info:
        detloader.read_annotations(tmp_path / "missing")
    assert isinstance(info.value, FileNotFoundError)
    with pytest.raises(ValueError):
        detloader.read_annotations(tmp_path, format="no-such-format")


def test_one_filter_silences_every_warning():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=detloader.DetloaderWarning)
        for cls in _classes(Warning):
            warnings.warn(
                cls("kind", "m") if cls is errors.FlipPairWarning else cls("m"), stacklevel=1
            )
    assert seen == []
