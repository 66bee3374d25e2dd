"""`stats`, `stats --balance` and `index` on ~1,200 long-tail classes: short human tables (the
head, one line on the rest, the imbalance figures), every class with --top 0 and in --json."""

from __future__ import annotations

import json

import numpy as np
import pytest
from balance_helpers import long_tail_index

from detloader.cli import _common as common
from detloader.cli import data, main
from detloader.cli._class_rows import cap_rows
from detloader.cli._common import print_counts


@pytest.fixture(scope="module")
def index():
    return long_tail_index(3000, 1200, seed=4)


@pytest.fixture
def cli(index, monkeypatch, capsys):
    monkeypatch.setattr(common, "read_index", lambda *a, **k: index)
    monkeypatch.setattr(data, "read_index", lambda *a, **k: index)

    def run(*argv: str) -> list[str]:
        assert main(list(argv)) == 0
        return capsys.readouterr().out.splitlines()

    return run


def _references(index):
    k = len(index.classes)
    objects = np.bincount(index.labels, minlength=k)
    images = np.bincount(np.unique(index.object_image * k + index.labels) % k, minlength=k)
    return objects, images


def _rarest(index, how_many=3):
    objects, _ = _references(index)
    order = sorted((c for c in range(len(objects)) if objects[c] > 0), key=lambda c: objects[c])
    return objects, [index.classes[c] for c in order[:how_many]]


def _table(lines, title):
    """The rows of the pipe table whose title starts with ``title`` (after its header line)."""
    start = next(i for i, line in enumerate(lines) if line.startswith(f"# {title}"))
    end = next((i for i in range(start + 1, len(lines)) if "\t" not in lines[i]), len(lines))
    return lines[start + 2 : end], lines[end:]


@pytest.mark.parametrize("command", ["stats", "index"])
def test_human_class_table_is_short_and_names_head_and_rarest(index, cli, command):
    lines = cli(command, "ds")
    objects, rarest = _rarest(index)
    rows, after = _table(lines, "object classes")
    assert len(rows) == 20
    assert [row.split("\t")[0] for row in rows[:3]] == ["c0000", "c0001", "c0002"]  # largest first
    assert [int(row.split("\t")[1]) for row in rows] == sorted(objects, reverse=True)[:20]
    rest = after[0]
    assert rest.startswith("1,180 more classes: ")
    assert f"{int(((objects > 0) & (objects < 10)).sum()):,} under 10 objects" in rest
    assert f"{int((objects == 0).sum()):,} with none" in rest
    assert all(f"{name} (1)" in rest for name in rarest)
    assert after[1].startswith("imbalance ratio (largest / smallest class): objects 3435.0")
    assert "and 258 more" in after[1]  # the empty classes are named a few at a time
    assert len(lines) <= 40 if command == "index" else len(lines) <= 45


def test_balance_table_is_short_and_sums_up_the_rest(cli):
    lines = cli("stats", "ds", "--balance", "sqrt")
    rows, after = _table(lines, "balance sqrt")
    assert len(rows) == 20 and rows[0].startswith("c0000\t3435\t")
    assert after[0].startswith("1,180 more groups: ") and after[1].startswith("those 1,180 groups together: raw ")
    assert len(lines) < 70  # two tables and their lines, not 2,400


def test_top_sets_the_rows_and_zero_lists_every_class(index, cli):
    assert len(_table(cli("index", "ds", "--top", "5"), "object classes")[0]) == 5
    rows, after = _table(cli("stats", "ds", "--top", "0"), "object classes")
    objects, images = _references(index)
    assert len(rows) == 1200 and not after[0].startswith("1,180 more")
    got = {row.split("\t")[0]: (int(row.split("\t")[1]), int(row.split("\t")[3])) for row in rows}
    assert got == {name: (int(objects[c]), int(images[c])) for c, name in enumerate(index.classes)}


def test_json_keeps_every_class(index, cli):
    objects, images = _references(index)
    stats = json.loads("\n".join(cli("stats", "ds", "--json")))
    assert stats["raw"] == {name: int(objects[c]) for c, name in enumerate(index.classes)}
    assert stats["stats"]["classes"] == {
        name: {"objects": int(objects[c]), "images": int(images[c])} for c, name in enumerate(index.classes)
    }
    summary = json.loads("\n".join(cli("index", "ds", "--json")))
    assert summary["images_per_class"] == {name: int(images[c]) for c, name in enumerate(index.classes)}


def test_bad_top_is_refused(cli, capsys):
    with pytest.raises(SystemExit):
        main(["stats", "ds", "--top", "-1"])
    assert "--top" in capsys.readouterr().err


def test_cap_rows_keeps_small_tables_whole_and_sorted():
    capped = cap_rows([("a", 1), ("b", 5), ("c", 5)], [1, 5, 5], top=2)
    assert capped.rows == [("b", 5), ("c", 5), ("a", 1)] and capped.rest == ""  # one more row: shown, not summed
    capped = cap_rows([(str(i), i) for i in range(6)], list(range(6)), top=2, unit="images", noun="groups")
    assert [r[0] for r in capped.rows] == ["5", "4"]
    assert capped.rest == ("4 more groups: 3 under 10 images, 1 with none; rarest: 1 (1), 2 (2), 3 (3) "
                           "(--top 0 lists all)")


@pytest.mark.parametrize("top", [20, 0])
def test_image_classes_and_attribute_values_are_capped_too(capsys, top):
    """Thousands of image classes or attribute values (track ids) read like the class table."""
    out = common.console()
    print_counts(out, "image classes", ("image class", "images"), {f"s{i:03d}": 100 - i for i in range(60)}, top)
    values = {f"t{i}": i + 1 for i in range(50)}
    common.print_attribute_counts(out, {"object_attributes": {"track": values}, "image_attributes": {}}, top)
    lines = capsys.readouterr().out.splitlines()
    rows, after = _table(lines, "image classes")
    attribute = next(line for line in lines if line.startswith("object attribute track: "))
    if top:
        assert lines[0] == "# image classes: largest 20 of 60" and len(rows) == 20 and rows[0] == "s000\t100"
        assert after[0].startswith("40 more image classes: 0 under 10 images, 0 with none; rarest: s059 (41)")
        assert attribute == ("object attribute track: " + ", ".join(f"t{i} {i + 1}" for i in range(49, 29, -1))
                             + ", and 30 more values (--top 0 lists all)")
    else:
        assert len(rows) == 60 and attribute.count(",") == 49 and "more values" not in attribute
