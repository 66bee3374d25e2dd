"""Fuzzing the decoder: any bytes (and mutations of real JPEG/PNG files) decode to RGB uint8 or
raise ImageDecodeError naming the source, nothing else. A short run in the suite; the long run
is ``DETLOADER_FUZZ=long`` (the ``make fuzz`` target sets it)."""

from __future__ import annotations

import io
import os
import warnings

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from detloader.images import ImageDecodeError, decode_image

settings.register_profile("detloader-short", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("detloader-long", max_examples=20_000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PROFILE = "detloader-long" if os.environ.get("DETLOADER_FUZZ") == "long" else "detloader-short"


def _seed(fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.arange(24 * 16 * 3, dtype=np.uint8).reshape(16, 24, 3)).save(buf, fmt)
    return buf.getvalue()


SEEDS = [_seed("JPEG"), _seed("PNG"), _seed("GIF"), _seed("BMP")]


def _check(data: bytes) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            out = decode_image(data, source="fuzz.img", max_pixels=4_000_000)
        except ImageDecodeError as err:
            assert str(err).startswith("fuzz.img: ")
            return
    assert out.image.dtype == np.uint8 and out.image.ndim == 3 and out.image.shape[2] == 3
    assert out.image.shape[0] * out.image.shape[1] <= 4_000_000


@settings.get_profile(PROFILE)
@given(st.binary(max_size=512))
def test_random_bytes(data: bytes) -> None:
    _check(data)


@settings.get_profile(PROFILE)
@given(
    st.sampled_from(range(len(SEEDS))),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=8),
    st.integers(0, 10_000),
)
def test_mutated_real_files(which: int, flips: list[tuple[int, int]], cut: int) -> None:
    data = bytearray(SEEDS[which])
    for pos, value in flips:
        data[pos % len(data)] = value
    _check(bytes(data[: max(1, len(data) - cut % len(data))]))
