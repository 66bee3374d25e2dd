"""The incremental refresh of a cached VOC index: files added, removed, edited or renamed are parsed
alone, and the refreshed index equals a build from scratch (arrays, vocabularies, splits, problems)."""

from __future__ import annotations

import gc
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import keypoints_xml, voc_dataset, voc_object, voc_xml, write_image
from hypothesis import given, settings
from hypothesis import strategies as st

from detloader import read_annotations
from detloader.annotations.readers import READERS, common
from detloader.annotations.refresh import StoredStamps, _load_stamps, _positions, stamps_file

ATTRS = "<attributes><attribute><name>color</name><value>{}</value></attribute></attributes>"


def _files() -> dict[str, str]:
    files = {
        f"{i}": voc_xml(f"{i}.jpg", [voc_object("cat" if i % 2 else "dog", (1, 1, 10 + i, 20))]) for i in range(8)
    }
    files["2"] = voc_xml("2.jpg", [voc_object("bird", (1, 1, 9, 9)), voc_object("dog", (2, 2, 90, 9))])  # clipped
    image_attrs = "<attributes><attribute><name>class</name><value>{}</value></attribute>{}</attributes>"
    files["3"] = voc_xml(
        "3.jpg",
        [voc_object("cat", (1, 1, 9, 9), extra=ATTRS.format("red"))],
        extra=image_attrs.format("indoor", "<attribute><name>time</name><value>dusk</value></attribute>"),
    )
    outdoor = image_attrs.format("outdoor", "")
    files["7"] = voc_xml("7.jpg", [voc_object("cat", (1, 1, 9, 9))], extra=outdoor, verified=True)
    files["4"] = voc_xml("nowhere.jpg", [voc_object("cat", (1, 1, 9, 9))])  # missing image
    files["6"] = voc_xml("5.jpg", [voc_object("dog", (3, 3, 9, 9))])  # 5.jpg again: a duplicate
    return files


def _dataset(tmp_path: Path) -> Path:
    images = [f"{i}.jpg" for i in range(10) if i != 4]  # 8.jpg, 9.jpg: not annotated yet
    return voc_dataset(tmp_path / "data", _files(), images=images, splits={"train": ["0", "1", "3"], "val": ["2"]})


def _write(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")


def _edit(root: Path) -> None:  # the only bird goes, a new class and an attribute value come
    zebra = voc_object("zebra", (1, 1, 5, 5), extra=ATTRS.format("blue"))
    _write(root / "Annotations" / "2.xml", voc_xml("2.jpg", [zebra]))


def _add(root: Path) -> None:
    objects = [voc_object("ant", (1, 1, 7, 7)), voc_object("cat", (0, 0, 3, 3))]
    _write(root / "Annotations" / "8.xml", voc_xml("8.jpg", objects))


def _remove(root: Path) -> None:
    (root / "Annotations" / "3.xml").unlink()  # the only image class "indoor" and attribute values go


def _rename(root: Path) -> None:
    os.rename(root / "Annotations" / "1.xml", root / "Annotations" / "1b.xml")


def _unduplicate(root: Path) -> None:  # 5.xml names another image: 6.xml's annotation of 5.jpg is kept now
    _write(root / "Annotations" / "5.xml", voc_xml("9.jpg", [voc_object("cat", (1, 1, 4, 4))]))


def _fix_missing(root: Path) -> None:
    _write(root / "Annotations" / "4.xml", voc_xml("9.jpg", [voc_object("cat", (1, 1, 9, 9))]))


#: each change and the files a refresh parses: the changed ones, and 6.xml while its image is a
#: duplicate (its rows were dropped from the old index)
CHANGES = {
    "edited": (_edit, ["2", "6"]),
    "added": (_add, ["6", "8"]),
    "removed": (_remove, ["6"]),
    "renamed": (_rename, ["1b", "6"]),
    "duplicate_freed": (_unduplicate, ["5", "6"]),
    "missing_image_fixed": (_fix_missing, ["4", "6"]),
}


#: ``RACY_NS``, ``RACY_COARSE_NS`` as the package sets them (the fixture below sets them to 0)
MARGINS = (common.RACY_NS, common.RACY_COARSE_NS)


@pytest.fixture(autouse=True)
def folders_vouch_at_once(monkeypatch):
    """A folder's identity vouches for its listing however shortly before the listing it
    changed (the tests change folders and read within milliseconds); the tests of that margin
    set it themselves."""
    monkeypatch.setattr(common, "RACY_NS", 0)
    monkeypatch.setattr(common, "RACY_COARSE_NS", 0)


@pytest.fixture
def parse_calls(monkeypatch):
    """The annotation files parsed, in order."""
    reader = type(READERS["voc"])
    calls: list[str] = []
    original = reader.parse_file

    def counted(self, source, rel, builder):
        calls.append(rel)
        return original(self, source, rel, builder)

    monkeypatch.setattr(reader, "parse_file", counted)
    return calls


def assert_same_index(got, want) -> None:
    """Every array, the vocabularies, the splits, the problems and the meta of a full build."""
    got_arrays, want_arrays = got.arrays(), want.arrays()
    assert list(got_arrays) == list(want_arrays)
    for name, arr in want_arrays.items():
        assert got_arrays[name].dtype == arr.dtype and np.array_equal(got_arrays[name], arr), name
    assert got.vocab.to_dict() == want.vocab.to_dict()
    assert {k: v.tolist() for k, v in got.splits.items()} == {k: v.tolist() for k, v in want.splits.items()}
    assert got.problems.to_list() == want.problems.to_list()
    skip = ("cache_key", "refreshed")
    assert {k: v for k, v in got.meta.items() if k not in skip} == {k: v for k, v in want.meta.items() if k not in skip}


def _differs(a, b) -> bool:
    arrays = any(not np.array_equal(x, b.arrays()[name]) for name, x in a.arrays().items())
    return arrays or a.problems.to_list() != b.problems.to_list() or a.vocab != b.vocab


@pytest.mark.parametrize("verify", ["stat", "content"])
@pytest.mark.parametrize("change", list(CHANGES))
def test_a_refresh_parses_only_the_changed_files_and_equals_a_full_build(tmp_path, parse_calls, change, verify):
    root = _dataset(tmp_path)
    before = read_annotations(root, on_error="skip", verify=verify)
    assert len(parse_calls) == len(_files())
    apply, parsed = CHANGES[change]
    apply(root)
    parse_calls.clear()
    refreshed = read_annotations(root, on_error="skip", verify=verify)
    assert parse_calls == [os.path.join("Annotations", f"{stem}.xml") for stem in parsed]
    assert refreshed.meta["refreshed"] == len(parsed)
    full = read_annotations(root, on_error="skip", verify=verify, cache=False)
    assert_same_index(refreshed, full)
    assert _differs(before, full)  # the old cache is stale: reusing it would fail the comparison
    parse_calls.clear()
    again = read_annotations(root, on_error="skip", verify=verify)  # the refreshed cache is current
    assert parse_calls == [] and again._source_file is not None
    assert_same_index(again, full)


def test_several_refreshes_in_a_row_stay_equal_to_a_full_build(tmp_path, parse_calls):
    root = _dataset(tmp_path)
    read_annotations(root, on_error="skip")
    for apply in (_edit, _add, _rename, _remove, _unduplicate):
        apply(root)
        parse_calls.clear()
        refreshed = read_annotations(root, on_error="skip")
        assert 0 < len(parse_calls) <= 2
        assert_same_index(refreshed, read_annotations(root, on_error="skip", cache=False))


def test_same_stamp_new_content_is_caught_with_verify_content(tmp_path, parse_calls):
    root = _dataset(tmp_path)
    read_annotations(root, on_error="skip", verify="content")
    path = root / "Annotations" / "0.xml"
    st = path.stat()
    _write(path, voc_xml("0.jpg", [voc_object("cat", (1, 1, 11, 20))]))  # same size as before
    assert path.stat().st_size == st.st_size
    parse_calls.clear()
    refreshed = read_annotations(root, on_error="skip", verify="content")
    assert parse_calls == [os.path.join("Annotations", name) for name in ("0.xml", "6.xml")]
    assert_same_index(refreshed, read_annotations(root, on_error="skip", cache=False))


def _change_split(root: Path) -> None:
    _write(root / "ImageSets" / "Main" / "val.txt", "2\n5\n")


def _add_image(root: Path) -> None:
    write_image(root / "JPEGImages" / "10.jpg")


@pytest.mark.parametrize("change", [_change_split, _add_image])
def test_anything_but_annotation_files_changed_builds_in_full(tmp_path, parse_calls, change):
    root = _dataset(tmp_path)
    read_annotations(root, on_error="skip")
    change(root)
    _edit(root)
    parse_calls.clear()
    index = read_annotations(root, on_error="skip")
    assert len(parse_calls) == len(_files()) and "refreshed" not in index.meta
    assert_same_index(index, read_annotations(root, on_error="skip", cache=False))


def test_options_or_rebuild_never_refresh(tmp_path, parse_calls):
    root = _dataset(tmp_path)
    read_annotations(root, on_error="skip")
    _edit(root)
    parse_calls.clear()
    read_annotations(root, on_error="skip", clip_boxes=False)  # another cache file: built in full
    assert len(parse_calls) == len(_files())
    parse_calls.clear()
    index = read_annotations(root, on_error="skip", cache="rebuild")
    assert len(parse_calls) == len(_files()) and "refreshed" not in index.meta


@pytest.mark.parametrize("damage", ["foreign", "flipped byte", "truncated"])
def test_damaged_or_foreign_stamps_build_in_full(tmp_path, parse_calls, damage):
    """A stamps file that is not one, or whose arrays fail their CRC-32 or end early: a full build."""
    root = _dataset(tmp_path)
    first = read_annotations(root, on_error="skip")
    stamps = stamps_file(Path(first._source_file))
    assert stamps.is_file()
    data = bytearray(stamps.read_bytes())
    if damage == "foreign":
        data = bytearray(b"PK\x03\x04 not a stamps file")
    elif damage == "flipped byte":
        data[-80] ^= 0x01  # in the last array (the folder listing's names), not its padding
    else:
        data = data[: len(data) // 2]
    stamps.write_bytes(bytes(data))
    _edit(root)
    parse_calls.clear()
    index = read_annotations(root, on_error="skip")
    assert len(parse_calls) == len(_files())
    assert_same_index(index, read_annotations(root, on_error="skip", cache=False))


def test_stamps_of_another_cache_file_build_in_full(tmp_path, parse_calls):
    root = _dataset(tmp_path)
    stamps = stamps_file(Path(read_annotations(root, on_error="skip")._source_file))
    old = stamps.read_bytes()
    _edit(root)
    read_annotations(root, on_error="skip")  # refreshed: new stamps for the new cache file
    stamps.write_bytes(old)  # left over from the cache file before
    _add(root)
    parse_calls.clear()
    index = read_annotations(root, on_error="skip")
    assert len(parse_calls) == len(_files()) + 1 and "refreshed" not in index.meta
    assert_same_index(index, read_annotations(root, on_error="skip", cache=False))


def test_landmarks_build_in_full(tmp_path, parse_calls):
    points = keypoints_xml([("nose", 4, 4, 2), ("left_eye", 2, 2, 2)])
    files = {f"{i}": voc_xml(f"{i}.jpg", [voc_object("face", (1, 1, 9, 9), extra=points)]) for i in range(3)}
    root = voc_dataset(tmp_path / "lm", files)
    assert read_annotations(root, on_error="skip").vocab.landmarks.names
    _write(root / "Annotations" / "1.xml", voc_xml("1.jpg", [voc_object("face", (1, 1, 8, 9), extra=points)]))
    parse_calls.clear()
    index = read_annotations(root, on_error="skip")
    assert len(parse_calls) == 3
    assert_same_index(index, read_annotations(root, on_error="skip", cache=False))


def test_many_changed_files_build_in_full(tmp_path, parse_calls, monkeypatch):
    from detloader.annotations import refresh

    monkeypatch.setattr(refresh, "MIN_CHANGED", 0)  # a quarter of 8 files: 2
    root = _dataset(tmp_path)
    read_annotations(root, on_error="skip")
    _edit(root)
    _add(root)
    parse_calls.clear()
    index = read_annotations(root, on_error="skip")  # 2.xml, 8.xml and the duplicate 6.xml: 3 > 2
    assert len(parse_calls) == len(_files()) + 1 and "refreshed" not in index.meta
    assert_same_index(index, read_annotations(root, on_error="skip", cache=False))


def test_a_refresh_lists_the_image_folder_again_only_when_a_folder_of_it_changed(tmp_path, monkeypatch):
    """The image folder's listing (for unannotated images) is kept with the stamps; a refresh
    uses it while none of the folders it listed changed, and lists again when one did (an
    image added to a sub-folder changes neither the image folder nor the cache key)."""
    from detloader.annotations.readers import voc as voc_module

    root = _dataset(tmp_path)
    (root / "JPEGImages" / "sub").mkdir()
    read_annotations(root, on_error="skip")
    listings = []
    real = voc_module.scan_files

    def scan(top, *args, **kwargs):
        listings.append(Path(top).name)
        return real(top, *args, **kwargs)

    monkeypatch.setattr(voc_module, "scan_files", scan)
    _edit(root)
    refreshed = read_annotations(root, on_error="skip")
    assert refreshed.meta["refreshed"] == 2 and "JPEGImages" not in listings
    assert_same_index(refreshed, read_annotations(root, on_error="skip", cache=False))
    write_image(root / "JPEGImages" / "sub" / "new.jpg")
    _add(root)
    listings.clear()
    refreshed = read_annotations(root, on_error="skip")
    assert refreshed.meta["refreshed"] == 2 and "JPEGImages" in listings
    unannotated = [p.file for p in refreshed.problems if p.kind == "unannotated_image"]
    assert os.path.join("JPEGImages", "sub", "new.jpg") in unannotated
    assert_same_index(refreshed, read_annotations(root, on_error="skip", cache=False))


@pytest.fixture
def restated(monkeypatch):
    """What each read's annotation scan did: True when it stated the known files again, False
    when it listed the folders (or had no listing to state)."""
    calls: list[bool] = []
    real = common._restated

    def spy(known, top, root):
        found = real(known, top, root)
        calls.append(found is not None)
        return found

    monkeypatch.setattr(common, "_restated", spy)
    return calls


@pytest.mark.parametrize("change", list(CHANGES))
def test_the_annotation_folder_is_listed_again_only_when_it_changed(tmp_path, parse_calls, restated, change):
    """A read states the files of the last listing (kept with the stamps) while no folder of it
    changed: an edit in place; a file added, removed or renamed is listed again. Either way the
    refreshed index equals a full build, and the next read of the unchanged folder states again."""
    root = _dataset(tmp_path)
    read_annotations(root, on_error="skip")
    assert restated == []  # no listing kept yet
    apply, parsed = CHANGES[change]
    apply(root)
    parse_calls.clear()
    refreshed = read_annotations(root, on_error="skip")
    assert restated == [change in ("edited", "duplicate_freed", "missing_image_fixed")]  # written in place
    assert parse_calls == [os.path.join("Annotations", f"{stem}.xml") for stem in parsed]
    assert_same_index(refreshed, read_annotations(root, on_error="skip", cache=False))
    restated.clear()
    again = read_annotations(root, on_error="skip")
    assert restated == [True] and again._source_file is not None
    assert_same_index(again, refreshed)


def test_a_file_added_to_a_sub_folder_is_found(tmp_path, restated):
    """The identity of every folder listed is kept: a file added below a sub-folder of
    Annotations/ (which leaves Annotations/ itself as it was) is listed and read."""
    root = _dataset(tmp_path)
    (root / "Annotations" / "more").mkdir()
    read_annotations(root, on_error="skip")
    _write(root / "Annotations" / "more" / "8.xml", voc_xml("8.jpg", [voc_object("ant", (1, 1, 7, 7))]))
    index = read_annotations(root, on_error="skip")
    assert restated == [False] and "ant" in index.vocab.classes
    assert_same_index(index, read_annotations(root, on_error="skip", cache=False))


def test_a_known_file_that_cannot_be_stated_lists_again(tmp_path, restated):
    """A known file that is a link whose target went (its folder unchanged) is listed again,
    and named as the listing names it (``unreadable_file``), as a full build does."""
    root = _dataset(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _write(elsewhere / "8.xml", voc_xml("8.jpg", [voc_object("ant", (1, 1, 7, 7))]))
    (root / "Annotations" / "8.xml").symlink_to(elsewhere / "8.xml")
    assert "ant" in read_annotations(root, on_error="skip").vocab.classes
    (elsewhere / "8.xml").unlink()
    index = read_annotations(root, on_error="skip")
    assert restated == [False] and "ant" not in index.vocab.classes
    assert [p.file for p in index.problems if p.kind == "unreadable_file"] == [os.path.join("Annotations", "8.xml")]
    assert_same_index(index, read_annotations(root, on_error="skip", cache=False))


def test_a_listing_that_named_a_problem_is_not_kept(tmp_path, restated):
    """A listing that named a problem (a FIFO among the files) is made again each read: the
    problem comes from the listing, which states no file it skipped."""
    root = _dataset(tmp_path)
    os.mkfifo(root / "Annotations" / "pipe.xml")
    first = read_annotations(root, on_error="skip")
    assert [p.kind for p in first.problems if p.file.endswith("pipe.xml")] == ["not_a_regular_file"]
    stored, _ = _load_stamps(stamps_file(Path(first._source_file)))
    assert stored is not None and stored.files_listing is None
    _edit(root)
    index = read_annotations(root, on_error="skip")
    assert restated == [] and index.meta["refreshed"] == 2
    assert_same_index(index, read_annotations(root, on_error="skip", cache=False))


@pytest.mark.parametrize("how", [{"verify": "content"}, {"cache": "rebuild"}])
def test_content_verify_and_rebuild_always_list(tmp_path, restated, how):
    """``verify="content"`` (a user who trusts no stamp) and ``cache="rebuild"`` list the folders."""
    root = _dataset(tmp_path)
    read_annotations(root, on_error="skip", **how)
    _edit(root)
    read_annotations(root, on_error="skip", **how)
    assert restated == []


def test_a_folder_that_changed_just_before_its_listing_does_not_vouch_for_it(tmp_path, restated, monkeypatch):
    """A folder changed within ``RACY_NS`` of its listing (a file could be added in the same
    tick of the file system's clock right after it, leaving the folder's times as they were) is
    kept as ``UNSURE``: the next read lists it again, and keeps the identity once it is older."""
    monkeypatch.setattr(common, "RACY_NS", 10**15)  # every change is recent
    root = _dataset(tmp_path)
    first = read_annotations(root, on_error="skip")
    stored, _ = _load_stamps(stamps_file(Path(first._source_file)))
    assert stored.files_listing.folders == {"Annotations": common.UNSURE}
    _edit(root)
    read_annotations(root, on_error="skip")
    assert restated == [False]
    monkeypatch.setattr(common, "RACY_NS", 0)
    _edit(root)
    read_annotations(root, on_error="skip")
    _edit(root)
    read_annotations(root, on_error="skip")
    assert restated == [False, False, True]


def test_the_stamps_file_is_read_once_per_read_and_again_when_it_changed(tmp_path):
    """``StoredStamps`` gives the reader's listing and the refresh's stamps from one read of
    the file, and reads it again when another read rewrote it meanwhile."""
    root = _dataset(tmp_path)
    cache_file = Path(read_annotations(root, on_error="skip")._source_file)
    stored = StoredStamps(lambda at: cache_file if at == root else None)
    first = stored.load(cache_file)
    assert stored.files_listing(root) is first.files_listing and stored.load(cache_file) is first
    assert stored.files_listing(tmp_path) is None  # no cache file there
    _add(root)
    read_annotations(root, on_error="skip")
    again = stored.load(cache_file)
    assert again is not first and os.path.join("Annotations", "8.xml") in again.stamps.names


@pytest.mark.parametrize(
    ("changed_ago", "whole_seconds", "vouches"),
    [(0.05, False, False), (0.2, False, True), (1.0, True, False), (2.5, True, True), (-1.0, False, False)],
)
def test_a_folder_vouches_once_its_last_change_is_older_than_the_clock_allows(
    monkeypatch, changed_ago, whole_seconds, vouches
):
    """The margin is ``RACY_NS`` for a file system that keeps nanoseconds and ``RACY_COARSE_NS``
    for one that keeps whole seconds (both times on a second); a change in the future never vouches."""
    monkeypatch.setattr(common, "RACY_NS", MARGINS[0])
    monkeypatch.setattr(common, "RACY_COARSE_NS", MARGINS[1])
    listed = 1_733_000_000_000_000_000 + (0 if whole_seconds else 123_456_789)
    changed = listed - int(changed_ago * 1e9)
    changed -= changed % 1_000_000_000 if whole_seconds else 0
    st = SimpleNamespace(st_mtime_ns=changed, st_ctime_ns=changed, st_ino=7)
    assert (common._vouching(st, listed) != common.UNSURE) is vouches


def test_a_read_pauses_the_garbage_collector_and_restores_it(tmp_path):
    """The cyclic collector is off during a read (tens of thousands of tuples, no cycle) and as
    it was after it: on again, still off when the caller had turned it off, on after an error."""
    root = voc_dataset(tmp_path / "d", {"a": voc_xml("a.jpg", [voc_object("x", (1, 1, 5, 5))])})
    seen = []
    read_annotations(root, cache=False, progress=lambda done, total: seen.append(gc.isenabled()))
    assert seen and not any(seen) and gc.isenabled()
    gc.disable()
    try:
        read_annotations(root, cache=False)
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(FileNotFoundError):
        read_annotations(tmp_path / "absent")
    assert gc.isenabled()


_NAMES = [a + b for a in "abcdefgh" for b in "xyz"]  # 24: a few names against many bisect each


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_NAMES), max_size=24), st.lists(st.sampled_from(_NAMES), max_size=24),
       st.booleans())
def test_positions_are_a_lookup_per_name(names, among, sort):
    """_positions (equal lists; in a sorted list a few names bisected; else lined up from both
    ends and a dict between) gives each name's position in ``among``, -1 when absent."""
    if sort:
        names, among = sorted(set(names)), sorted(set(among))
    else:  # each list's names distinct, as the files and stamps it is given are
        names, among = list(dict.fromkeys(names)), list(dict.fromkeys(among))
    expected = [among.index(name) if name in among else -1 for name in names]
    assert _positions(names, among).tolist() == expected


@pytest.mark.parametrize("mtime", [1_733_000_000_123_456_789, -5])  # -5: an mtime before 1970
def test_stamp_table_holds_every_number_as_the_stamps_give_it(tmp_path, mtime):
    """Source.stamp_table: the columns of the stamps, an inode past 2**63 kept bit for bit,
    ``files_first`` only when the files lead the stamps in their order."""
    from detloader.annotations.readers.common import Source

    stamp = [("b.xml", mtime, 10, 7, 2**64 - 1), ("a.xml", 3, 0, 4, 5), ("ImageSets/x.txt", 1, 2, 3, 4)]
    table = Source(root=tmp_path, files=["b.xml", "a.xml"], stamp=stamp).stamp_table()
    assert table.names == ["b.xml", "a.xml", "ImageSets/x.txt"] and table.files_first
    assert table.numbers.dtype == np.int64 and table.numbers[:, :3].tolist() == [[mtime, 10, 7], [3, 0, 4], [1, 2, 3]]
    assert table.numbers[:, 3].view(np.uint64).tolist() == [2**64 - 1, 5, 4]
    assert not Source(root=tmp_path, files=["a.xml", "b.xml"], stamp=stamp).stamp_table().files_first
    empty = Source(root=tmp_path, files=[]).stamp_table()
    assert empty.names == [] and empty.numbers.shape == (0, 4)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.sampled_from(["a", "bb", "é", "", "x.jpg", "\udcff"]), min_size=1, max_size=4)
                .map(lambda parts: os.sep.join(parts)).filter(bool), min_size=1, max_size=8),
       st.booleans())
def test_the_image_folders_of_the_cache_key_are_each_paths_dirname(paths, one_folder):
    """_folders_of (one folder found on the packed paths by numpy, else per path) gives
    ``{os.path.dirname(p)}``: one folder or several, paths at the top, doubled separators,
    names not UTF-8."""
    from detloader.annotations.fields import pack_strings
    from detloader.annotations.read import _folders_of

    if one_folder:
        paths = [os.path.join("JPEGImages", os.path.basename(p) or "z.jpg") for p in paths]

    class Packed:  # what _folders_of reads of an index
        def arrays(self):
            blob, offsets = pack_strings(paths)
            return {"image_paths_blob": blob, "image_paths_offsets": offsets}

        def image_paths(self):
            return list(paths)

    assert _folders_of(Packed()) == {os.path.dirname(p) for p in paths}


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 300), st.lists(st.integers(0, 400), max_size=6), st.lists(st.integers(0, 400), max_size=6),
       st.booleans())
def test_positions_of_nearly_equal_lists_line_up_from_both_ends(size, removed, added, shuffled):
    """Files added and removed here and there in a long list (a refresh's stamps against the
    files now): each name's position, as a dict gives it."""
    names = [f"f{k:04d}.xml" for k in range(size)]
    among = [name for k, name in enumerate(names) if k not in set(removed)]
    for k in added:
        among.insert(min(k, len(among)), f"new{k:04d}.xml")
    among = list(dict.fromkeys(among))
    if shuffled:
        names = names[::-1]
    where = {name: k for k, name in enumerate(among)}
    assert _positions(names, among).tolist() == [where.get(name, -1) for name in names]
    assert _positions(among, names).tolist() == [names.index(name) if name in names else -1 for name in among]
