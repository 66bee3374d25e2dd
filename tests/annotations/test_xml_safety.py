"""Untrusted XML: entity bombs, external references, size caps, arbitrary bytes."""

from __future__ import annotations

import time

import pytest
from helpers import voc_dataset, voc_object, voc_xml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from detloader import AnnotationError, read_annotations
from detloader.annotations.builder import ChunkBuilder
from detloader.annotations.checks import ReadOptions
from detloader.annotations.readers.voc import VocReader, VocSource

BILLION_LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol1 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol2 "&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
 <!ENTITY lol5 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
 <!ENTITY lol6 "&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;">
 <!ENTITY lol7 "&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;">
 <!ENTITY lol8 "&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;">
 <!ENTITY lol9 "&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;">
]>
<annotation><filename>a.jpg</filename><object><name>&lol9;</name>
<bndbox><xmin>1</xmin><ymin>1</ymin><xmax>5</xmax><ymax>5</ymax></bndbox></object></annotation>"""

EXTERNAL = b"""<?xml version="1.0"?>
<!DOCTYPE annotation [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>
<annotation><filename>&xxe;</filename></annotation>"""

EXTERNAL_DTD = b"""<!DOCTYPE annotation SYSTEM "http://example.invalid/voc.dtd"><annotation/>"""


def _dataset(tmp_path, data: bytes):
    root = voc_dataset(tmp_path, {"a": voc_xml("a.jpg")})
    (root / "Annotations" / "bad.xml").write_bytes(data)
    return root


@pytest.mark.parametrize(
    "data",
    [
        BILLION_LAUGHS,
        BILLION_LAUGHS.decode().encode("utf-16"),  # the same bomb, not ASCII-compatible
        b"<!-- <x> --><!DOCTYPE r [<!ENTITY a 'b'>]><annotation>&a;</annotation>",
        EXTERNAL,
        EXTERNAL_DTD,
    ],
    ids=["billion-laughs", "billion-laughs-utf16", "after-comment", "external-entity", "external-dtd"],
)
def test_entity_and_external_references_refused_fast(tmp_path, data):
    root = _dataset(tmp_path, data)
    start = time.perf_counter()
    with pytest.raises(AnnotationError) as err:
        read_annotations(root)
    assert time.perf_counter() - start < 1.0
    assert err.value.problem.kind == "unsafe_xml"
    assert "bad.xml" in str(err.value) and "refused" in str(err.value)
    index = read_annotations(root, on_error="skip")
    assert len(index) == 1  # the good file is still read


def test_plain_doctype_is_accepted(tmp_path):
    data = b"<!DOCTYPE annotation>" + voc_xml("a.jpg", [voc_object("k", (1, 1, 5, 5))]).encode()
    root = voc_dataset(tmp_path, {"a": "x"})
    (root / "Annotations" / "a.xml").write_bytes(data)
    assert read_annotations(root).num_objects == 1


def test_size_cap(tmp_path):
    big = voc_xml("a.jpg", [voc_object("k", (1, 1, 5, 5))] * 2000)
    root = voc_dataset(tmp_path, {"a": big})
    with pytest.raises(AnnotationError, match=r"a.xml: size=\d+ bytes exceeds max_file_bytes=10000"):
        read_annotations(root, max_file_bytes=10_000)
    assert read_annotations(root).num_objects == 2000


def _parse_bytes(tmp_path, data: bytes) -> ChunkBuilder:
    (tmp_path / "f.xml").write_bytes(data)
    source = VocSource(root=tmp_path, files=["f.xml"], annotation_dir=".", image_dir=".", split_files=[])
    builder = ChunkBuilder(ReadOptions(check_images=False))
    builder.begin_file("f.xml")
    VocReader().parse_file(source, "f.xml", builder)
    builder.finish()
    return builder


VALID = voc_xml("a.jpg", [voc_object("k", (1, 1, 5, 5), truncated="1"), voc_object("j", (2, 3, 40, 30))]).encode()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    cut=st.integers(0, len(VALID)),
    junk=st.binary(max_size=40),
    flips=st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), max_size=6),
)
def test_parser_never_crashes_on_mangled_input(tmp_path, cut, junk, flips):
    """Truncated, corrupted or garbage files give problems or data, never an exception."""
    data = bytearray(VALID[:cut] + junk + VALID[cut:])
    for pos, value in flips:
        if pos < len(data):
            data[pos] = value
    builder = _parse_bytes(tmp_path, bytes(data))
    for problem in builder.problems:
        assert problem.file == "f.xml" and problem.message


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    values=st.lists(
        st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6)), min_size=4, max_size=4
    )
)
def test_any_box_values_are_kept_valid_or_reported(tmp_path, values):
    from xml.sax.saxutils import escape

    obj = voc_object("k", [escape(str(v)) for v in values])
    builder = _parse_bytes(tmp_path, voc_xml("a.jpg", [obj]).encode("utf-8", "surrogatepass"))
    boxes = builder.finish().arrays["boxes"]
    if len(boxes):
        (x1, y1, x2, y2) = boxes[0]
        assert 0 <= x1 < x2 <= 64 and 0 <= y1 < y2 <= 48
    else:
        assert builder.problems
