"""The CLI in a pipe: one line per table row, nothing wrapped or cut, a closed pipe ends quietly."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import voc_dataset, voc_object, voc_xml
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console
from rich.control import strip_control_codes
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from detloader.cli import main
from detloader.cli._common import PIPE_WIDTH, console, print_table, table_lines
from detloader.cli.parser import EXIT_CLOSED_PIPE

SRC = Path(__file__).resolve().parents[2] / "src"
#: longer than a terminal line on its own
LONG = "a_very_long_annotation_file_name_that_goes_well_past_eighty_columns_of_any_terminal"
RARE = "a_rare_class_whose_name_alone_is_longer_than_the_eighty_columns_rich_assumes_in_a_pipe"


def _dataset(root: Path, n: int) -> Path:
    """``n`` VOC files with names over 80 characters, each with a bad box (a problem) and a
    ``car``; the last image holds the only object of class RARE."""
    files = {}
    for i in range(n):
        objects = [voc_object("car", (10, 10, 5, 20)), voc_object(RARE if i == n - 1 else "car", (1, 1, 20, 20))]
        files[f"{LONG}_{i:04d}"] = voc_xml(f"{LONG}_{i:04d}.jpg", objects)
    return voc_dataset(root, files)


@pytest.fixture(scope="module")
def long_names(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _dataset(tmp_path_factory.mktemp("long") / "ds", 60)


def _cli(*args: str, **popen: object) -> subprocess.Popen:
    """``python -m detloader ARGS`` with stdout and stderr pipes (not a terminal)."""
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "COLUMNS")}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    return subprocess.Popen(
        [sys.executable, "-m", "detloader", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, **popen
    )


def test_validate_in_a_pipe_is_one_whole_problem_per_line(long_names: Path) -> None:
    proc = _cli("validate", str(long_names))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err.decode()
    lines = out.decode().splitlines()
    # what `detloader validate DS | grep 0042.xml` finds: the whole problem, on one line
    found = [line for line in lines if f"{LONG}_0042.xml" in line]
    assert found == [f"Annotations/{LONG}_0042.xml\tobject[1]/bndbox\tempty_box\txmax=5 <= xmin=10\tobject skipped"]
    assert lines[:2] == ["# 60 problems", "file\twhere\tkind\tproblem\taction"]
    assert sum(line.startswith("Annotations/") for line in lines) == 60
    assert not any(c in out.decode() for c in "│┃━")


def test_every_table_in_a_pipe_keeps_long_names_whole(long_names: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["index", str(long_names)], ["stats", str(long_names), "--balance", "sqrt"]):
        main(argv)
        lines = capsys.readouterr().out.splitlines()
        rows = [line.split("\t") for line in lines if line.startswith(RARE + "\t")]
        assert rows and all(len(row) >= 3 for row in rows), lines
        assert any(line.startswith(str(long_names)) for line in lines)  # the header line is not wrapped


def test_terminal_keeps_rich_tables(long_names: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich: the output is a terminal
    assert main(["validate", str(long_names), "--limit", "2"]) == 1
    out = capsys.readouterr().out
    assert "┏━" in out and "60 problems" in out and "\t" not in out


def test_names_that_look_like_markup_stay_whole(tmp_path: Path, capsys, monkeypatch) -> None:
    root = voc_dataset(tmp_path, {"odd[bold]": voc_xml("odd[bold].jpg", [voc_object("[car]", (9, 9, 2, 2))])})
    monkeypatch.setenv("COLUMNS", "200")  # a terminal wide enough for the name on one line
    for terminal in ("0", "1"):
        monkeypatch.setenv("TTY_COMPATIBLE", terminal)
        assert main(["validate", str(root)]) == 1
        assert "Annotations/odd[bold].xml" in capsys.readouterr().out


def test_table_lines_are_plain_and_one_per_row() -> None:
    table = Table("name", "count", title="[bold]some[/bold] things")
    table.add_row(Text("img[bad].xml"), "[red]3[/red]")
    table.add_row(escape("[b]old"), "5")
    table.add_row("two\nlines", "tab\there")
    expect = ["# some things", "name\tcount", "img[bad].xml\t3", "[b]old\t5", "two lines\ttab here"]
    assert table_lines(table) == expect
    untitled = Table("a")
    assert table_lines(untitled) == ["a"]


def test_print_table_draws_on_a_terminal_only() -> None:
    table = Table("name", title="t")
    table.add_row("x" * 120)
    for terminal, expect in ((True, "┏━"), (False, "# t\nname\n" + "x" * 120 + "\n")):
        buffer = io.StringIO()
        print_table(Console(file=buffer, force_terminal=terminal, width=80), table)
        assert expect in buffer.getvalue()


def test_console_in_a_pipe_never_wraps(capsys: pytest.CaptureFixture[str]) -> None:
    out = console()
    assert not out.is_terminal and out.width == PIPE_WIDTH
    out.print("word " * 100)
    assert capsys.readouterr().out == "word " * 100 + "\n"


@pytest.mark.parametrize(
    "argv",
    [("validate",), ("validate", "--json"), ("stats",), ("index",)],
    ids=lambda a: " ".join(a),
)
def test_a_closed_pipe_ends_quietly(long_names: Path, argv: tuple[str, ...]) -> None:
    proc = _cli(argv[0], str(long_names), *argv[1:])
    proc.stdout.close()  # the reader is gone before the first line: every write fails
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == EXIT_CLOSED_PIPE, err
    assert "Traceback" not in err and "Exception ignored" not in err, err


def test_head_one(tmp_path: Path) -> None:
    """``detloader validate DS | head -1``: more output than a pipe buffer holds, so the command is
    still writing when the reader leaves."""
    root = _dataset(tmp_path / "ds", 500)  # ~100 KiB of problems
    proc = _cli("validate", str(root), "--no-images")
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert first == b"# 500 problems\n"
    assert proc.wait(timeout=120) == EXIT_CLOSED_PIPE, err
    assert "Traceback" not in err, err


@given(st.lists(st.lists(st.text(max_size=30), min_size=2, max_size=2), max_size=4))
def test_table_lines_give_back_every_cell(rows: list[list[str]]) -> None:
    """Law: a cell comes back as written, tabs and line breaks turned into spaces (and
    without the control codes that rich drops from all text: bell, backspace, carriage return...)."""
    table = Table("a", "b")
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    lines = table_lines(table)
    assert len(lines) == 1 + len(rows)
    for line, row in zip(lines[1:], rows):
        expect = [" ".join(strip_control_codes(cell).replace("\t", " ").splitlines()) for cell in row]
        assert line.split("\t") == expect
