"""Fuzzing the decoder: random bytes, and mutated / truncated copies of small real JPEG, PNG,
GIF and BMP files, decoded with random options (reduced-size decode, EXIF policy, expected
size) must give RGB uint8 under the pixel cap or raise ImageDecodeError naming the source;
no other exception, and no allocation beyond what the pixel cap allows.

The suite runs ``DETLOADER_FUZZ_EXAMPLES`` examples per test (default 150, a few seconds);
``make fuzz`` runs the long pass. Counts and findings: docs/reliability.md.
"""

from __future__ import annotations

import io
import os
import resource
import tracemalloc
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from detloader.images import ImageDecodeError, decode_image

FUZZ = settings(
    max_examples=int(os.environ.get("DETLOADER_FUZZ_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    database=None,
)
#: The cap the fuzzer decodes under, and the most memory (traced by tracemalloc: Python and
#: numpy buffers) one decode may take: a few RGB copies of the largest allowed image.
MAX_PIXELS = 1_000_000
MAX_TRACED_BYTES = 8 * 3 * MAX_PIXELS
#: Growth of the process's peak RSS over the whole module (Pillow's own buffers included).
MAX_RSS_GROWTH_MIB = 512


def _image(mode: str = "RGB", size: tuple[int, int] = (24, 16)) -> Image.Image:
    rgb = Image.fromarray(np.arange(size[0] * size[1] * 3, dtype=np.uint8).reshape(size[1], size[0], 3))
    return rgb.convert(mode) if mode != "RGB" else rgb


def _save(img: Image.Image, fmt: str, **kwargs: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kwargs)
    return buf.getvalue()


def _exif_jpeg(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return _save(_image(size=(40, 24)), "JPEG", exif=exif.tobytes())


SEEDS = [
    _save(_image(), "JPEG"),
    _save(_image(size=(64, 48)), "JPEG", progressive=True, quality=70),
    _exif_jpeg(6),
    _save(_image("L"), "JPEG"),
    _save(_image(), "PNG"),
    _save(_image("P"), "PNG", transparency=0),
    _save(_image("I;16"), "PNG"),
    _save(_image(), "GIF"),
    _save(_image(), "BMP"),
]

OPTIONS = st.fixed_dictionaries(
    {
        "exif": st.sampled_from(["auto", "apply", "ignore"]),
        "expected_size": st.none() | st.tuples(st.integers(1, 100), st.integers(1, 100)),
        "min_size": st.none() | st.tuples(st.integers(1, 64), st.integers(1, 64)),
    }
)


@pytest.fixture(scope="module", autouse=True)
def _bounded_rss():  # type: ignore[no-untyped-def]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    yield
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < MAX_RSS_GROWTH_MIB, f"peak RSS grew {grown_mib:.0f} MiB while fuzzing the decoder"


def _check(data: bytes, options: dict | None = None) -> None:
    tracemalloc.start()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                out = decode_image(data, source="fuzz.img", max_pixels=MAX_PIXELS, **(options or {}))
            except ImageDecodeError as err:
                assert str(err).startswith("fuzz.img: ")
                out = None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= MAX_TRACED_BYTES, f"{peak} bytes traced for a decode under max_pixels={MAX_PIXELS}"
    if out is None:
        return
    image = out.image
    assert isinstance(image, np.ndarray) and image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
    assert image.flags.c_contiguous and 0 < image.shape[0] * image.shape[1] <= MAX_PIXELS
    assert 0 < out.scale <= 1 and 1 <= out.orientation <= 8


def test_seeds_decode() -> None:
    for data in SEEDS:
        out = decode_image(data, source="seed")
        assert out.image.dtype == np.uint8 and out.image.shape[2] == 3


@FUZZ
@given(st.binary(max_size=512))
def test_random_bytes(data: bytes) -> None:
    _check(data)


@FUZZ
@given(
    st.sampled_from(range(len(SEEDS))),
    st.lists(
        st.one_of(
            st.tuples(st.just("set"), st.integers(0, 10_000), st.binary(min_size=1, max_size=4)),
            st.tuples(st.just("insert"), st.integers(0, 10_000), st.binary(min_size=1, max_size=16)),
            st.tuples(st.just("delete"), st.integers(0, 10_000), st.integers(1, 64)),
        ),
        max_size=8,
    ),
    st.integers(0, 10_000),
    OPTIONS,
)
def test_mutated_real_files(which: int, edits: list[tuple], cut: int, options: dict) -> None:
    data = bytearray(SEEDS[which])
    for op, pos, arg in edits:
        pos %= len(data)
        if op == "set":
            data[pos : pos + len(arg)] = arg
        elif op == "insert":
            data[pos:pos] = arg
        elif len(data) > arg:
            del data[pos : pos + arg]
    _check(bytes(data[: max(1, len(data) - cut % len(data))]), options)


@FUZZ
@given(st.sampled_from(range(len(SEEDS))), st.integers(1, 2**31 - 1), st.integers(1, 2**31 - 1))
def test_declared_sizes(which: int, width: int, height: int) -> None:
    """The header's width and height rewritten to anything: refused by the cap, decoded, or
    ImageDecodeError; never an allocation the header alone asked for."""
    data = bytearray(SEEDS[which])
    if data[:2] == b"\xff\xd8":  # JPEG: the first SOF segment's height, width (16 bits each)
        sof = next(i for i in range(2, len(data) - 9) if data[i] == 0xFF and data[i + 1] in (0xC0, 0xC1, 0xC2))
        data[sof + 5 : sof + 9] = (height & 0xFFFF).to_bytes(2, "big") + (width & 0xFFFF).to_bytes(2, "big")
    elif data[:4] == b"\x89PNG":  # IHDR width, height (32 bits)
        data[16:24] = width.to_bytes(4, "big") + height.to_bytes(4, "big")
    elif data[:3] == b"GIF":  # logical screen, 16 bits little-endian
        data[6:10] = (width & 0xFFFF).to_bytes(2, "little") + (height & 0xFFFF).to_bytes(2, "little")
    else:  # BMP info header, 32 bits little-endian
        data[18:26] = (width & 0x7FFFFFFF).to_bytes(4, "little") + (height & 0x7FFFFFFF).to_bytes(4, "little")
    _check(bytes(data))
