"""CLI: one exit status convention on every command (README "Exit status and problems"):
0 when nothing is an error (repairs do not fail), 1 when validate or index found errors,
2 for usage errors and for the first error under ``--on-error raise``; one ``--on-error``
default for every command that reads a dataset."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from detloader.cli import build_parser, main
from detloader.cli._common import ON_ERROR_DEFAULT, dataset_kwargs
from detloader.synth import make_synthetic

FIRST = "Annotations/synth_000000.xml"
EDITS = {  # dataset -> (text in the first file, replacement)
    "clean": ("", ""),
    "repaired": ("<xmax>42</xmax>", "<xmax>70</xmax>"),  # past the 64-pixel image: clipped
    "errors": ("<xmax>42</xmax>", "<xmax>1</xmax>"),  # xmax <= xmin: object dropped
}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    roots = {}
    for name, (old, new) in EDITS.items():
        root = make_synthetic(tmp_path_factory.mktemp(name) / "ds", 8, seed=0, size=(64, 48))
        xml = root / FIRST
        text = xml.read_text(encoding="utf-8")
        assert old in text
        xml.write_text(text.replace(old, new, 1), encoding="utf-8")
        roots[name] = root
    return roots


def _run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_validate_fails_on_errors_only(data, capsys) -> None:
    code, out, _ = _run(capsys, "validate", data["clean"])
    assert code == 0 and "no problems" in out
    code, out, _ = _run(capsys, "validate", data["repaired"])
    assert code == 0 and "no errors (1 repaired): box_clipped: 1" in out and "box_clipped" in out.splitlines()[2]
    code, out, _ = _run(capsys, "validate", data["errors"])
    assert code == 1 and "1 errors, 0 repaired: empty_box: 1" in out
    for name, expect in (("repaired", (0, 0, 1)), ("errors", (1, 1, 0))):
        code, out, _ = _run(capsys, "validate", data[name], "--json")
        report = json.loads(out)
        assert (code, report["errors"], report["repairs"]) == expect
    # every policy collects every problem: --on-error has no effect on validate
    assert _run(capsys, "validate", data["errors"], "--on-error", "raise")[0] == 1


def test_validate_fails_on_an_unreadable_image(tmp_path, capsys) -> None:
    root = make_synthetic(tmp_path / "ds", 4, seed=0, size=(64, 48))
    (root / "JPEGImages" / "synth_000001.jpg").write_bytes(b"")
    code, out, _ = _run(capsys, "validate", root, "--json")
    assert code == 1 and json.loads(out)["problems"] == {"unreadable_image": 1}


def test_index_fails_on_errors_only(data, capsys) -> None:
    for name, expect in (("clean", 0), ("repaired", 0), ("errors", 1)):
        assert _run(capsys, "index", data[name])[0] == expect, name
        assert _run(capsys, "index", data[name], "--json")[0] == expect, name
    out = _run(capsys, "index", data["errors"])[1]
    assert "empty_box" in out and "detloader validate" in out


def test_commands_that_produce_something_go_on_under_warn(data, tmp_path, capsys) -> None:
    code, out, _ = _run(capsys, "stats", data["errors"])
    assert code == 0 and "1 errors, 0 repaired: empty_box: 1" in out
    code, out, _ = _run(capsys, "convert", data["errors"], "--to", "coco", tmp_path / "coco")
    assert code == 0 and "source problems: 1 errors, 0 repaired" in out
    code, out, err = _run(capsys, "show", data["errors"], "--out", tmp_path / "grid.png", "--n", "2", "--tile", "32")
    assert code == 0 and (tmp_path / "grid.png").is_file()
    assert err.strip() == "detloader show: 1 errors, 0 repaired: empty_box: 1 (detloader validate lists them)"
    code, _, err = _run(capsys, "show", data["errors"], "--out", tmp_path / "quiet.png", "--n", "2", "--tile", "32",
                        "--on-error", "skip")
    assert code == 0 and err == ""


@pytest.mark.parametrize(
    "argv",
    [
        ["index"], ["stats"], ["show", "--out", "{tmp}/g.png"], ["tune"], ["convert", "--to", "voc", "{tmp}/voc"],
        ["bench", "--quick"],
    ],
)
def test_raise_stops_at_the_first_error_with_status_2(data, tmp_path, capsys, argv) -> None:
    args = [argv[0], data["errors"], *(a.format(tmp=tmp_path) for a in argv[1:]), "--on-error", "raise"]
    code, _, err = _run(capsys, *args)
    assert code == 2 and f"detloader {argv[0]}: error: {FIRST}: object[1]/bndbox: xmax=1 <= xmin=26.2" in err


def test_usage_errors_are_status_2(data, tmp_path, capsys) -> None:
    assert _run(capsys, "validate", tmp_path / "missing")[0] == 2
    assert _run(capsys, "index", data["clean"], "--format", "nonsense")[0] == 2
    with pytest.raises(SystemExit) as exit:
        main(["validate", str(data["clean"]), "--on-error", "ignore"])
    assert exit.value.code == 2


def test_every_reading_command_has_the_same_on_error_default() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    # no argparse default (a run's recorded --on-error must be told from one left out): dataset_kwargs gives it
    untold = {name: argparse.Namespace(**{a.dest: a.default for a in p._actions}) for name, p in sub.choices.items()}
    reading = {name for name, args in untold.items() if hasattr(args, "on_error")}
    assert reading >= {"index", "validate", "convert", "show", "tune", "stats", "bench", "train", "evaluate"}
    assert {untold[name].on_error for name in reading} == {None}
    assert {dataset_kwargs(untold[name])["on_error"] for name in reading} == {ON_ERROR_DEFAULT} == {"warn"}
