"""Decoding: formats and modes to RGB uint8, EXIF orientation rule, reduced-size JPEG decode."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
from PIL import Image, ImageOps

from detloader.images import (
    ImageDecodeError,
    apply_orientation,
    decode_image,
    jpeg_exif_orientation,
    oriented_size,
    read_image,
    should_apply_orientation,
)


def _pattern(w: int, h: int) -> np.ndarray:
    """A smooth, asymmetric RGB image (JPEG keeps it close)."""
    yy, xx = np.mgrid[0:h, 0:w]
    return np.stack([xx * 255 // max(w - 1, 1), yy * 255 // max(h - 1, 1), (xx + yy) % 256 // 2], -1).astype(np.uint8)


def _encode(img: Image.Image, fmt: str, **kw: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def _exif(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif.tobytes()


# -- formats and modes ------------------------------------------------------------------------
def test_jpeg_decodes_like_pillow() -> None:
    pixels = _pattern(64, 48)
    data = simplejpeg.encode_jpeg(pixels, quality=95, colorspace="RGB")
    out = decode_image(data)
    assert out.image.dtype == np.uint8 and out.image.shape == (48, 64, 3)
    assert out.image.flags.c_contiguous and out.scale == 1.0 and out.full_size == (64, 48)
    ref = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    assert np.abs(out.image.astype(int) - ref).mean() < 2.0


def test_grayscale_jpeg_becomes_rgb() -> None:
    gray = _pattern(32, 16)[..., :1].copy()
    out = decode_image(simplejpeg.encode_jpeg(gray, colorspace="GRAY")).image
    assert out.shape == (16, 32, 3)
    assert (out[..., 0] == out[..., 1]).all() and (out[..., 1] == out[..., 2]).all()


def test_cmyk_jpeg_goes_through_pillow() -> None:
    img = Image.fromarray(_pattern(32, 24)).convert("CMYK")
    data = _encode(img, "JPEG", quality=95)
    out = decode_image(data).image
    ref = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    assert out.shape == (24, 32, 3) and np.array_equal(out, ref)


@pytest.mark.parametrize(
    ("mode", "value", "expected"),
    [
        ("L", 77, (77, 77, 77)),
        ("LA", (77, 0), (77, 77, 77)),  # alpha dropped, colour kept
        ("RGBA", (10, 20, 30, 0), (10, 20, 30)),
        ("1", 1, (255, 255, 255)),
        ("P", 3, None),
        ("I;16", 65535, (255, 255, 255)),
        ("I;16", 257 * 100, (100, 100, 100)),
        ("I", 257 * 7, (7, 7, 7)),
    ],
)
def test_png_modes_become_rgb_uint8(mode: str, value: object, expected: tuple[int, int, int] | None) -> None:
    img = Image.new(mode, (5, 4), value)  # type: ignore[arg-type]
    if mode == "P":
        img.putpalette([0, 0, 0, 1, 1, 1, 2, 2, 2, 200, 100, 50] + [0] * (256 * 3 - 12))
        expected = (200, 100, 50)
    data = _encode(img, "TIFF" if mode == "I" else "PNG")  # Pillow writes mode I to TIFF only
    assert Image.open(io.BytesIO(data)).mode.startswith(mode[0])
    out = decode_image(data).image
    assert out.dtype == np.uint8 and out.shape == (4, 5, 3)
    assert tuple(int(v) for v in out[2, 3]) == expected


def test_float_tiff_is_clipped_like_pillow() -> None:
    img = Image.fromarray(np.array([[-5.0, 12.4, 300.0]], dtype=np.float32), "F")
    out = decode_image(_encode(img, "TIFF")).image
    assert out.shape == (1, 3, 3)
    assert out[0, :, 0].tolist() == [0, 12, 255]


def test_bmp_and_png_decode_exactly() -> None:
    pixels = _pattern(16, 8)
    for fmt in ("BMP", "PNG"):
        out = decode_image(_encode(Image.fromarray(pixels), fmt)).image
        assert np.array_equal(out, pixels)


def test_bad_bytes_raise_with_the_source_name(tmp_path: Path) -> None:
    with pytest.raises(ImageDecodeError, match="broken.jpg"):
        decode_image(b"not an image at all", source="broken.jpg")
    with pytest.raises(ImageDecodeError, match="missing.png"):
        read_image(tmp_path / "missing.png")
    assert issubclass(ImageDecodeError, ValueError)


def test_truncated_jpeg_decodes_with_a_warning() -> None:
    data = simplejpeg.encode_jpeg(_pattern(64, 64), quality=90, colorspace="RGB")
    cut = data[: len(data) * 2 // 3]
    with pytest.warns(RuntimeWarning, match="cut.jpg: damaged JPEG"):
        out = decode_image(cut, source="cut.jpg")
    assert out.image.shape == (64, 64, 3)


# -- EXIF -------------------------------------------------------------------------------------
@pytest.mark.parametrize("orientation", range(1, 9))
def test_orientation_matches_pillow_exif_transpose(orientation: int) -> None:
    pixels = _pattern(6, 4)
    pixels[0, 0] = (255, 0, 255)
    data = _encode(Image.fromarray(pixels), "PNG", exif=_exif(orientation))
    ref = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB"))
    out = decode_image(data)
    assert out.orientation == orientation and out.exif_applied == (orientation != 1)
    assert np.array_equal(out.image, ref)
    assert np.array_equal(apply_orientation(pixels, orientation), ref)
    assert out.full_size == oriented_size(6, 4, orientation)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_jpeg_orientation_parser(orientation: int) -> None:
    data = _encode(Image.fromarray(_pattern(8, 8)), "JPEG", exif=_exif(orientation))
    assert jpeg_exif_orientation(data) == orientation


def test_jpeg_orientation_parser_tolerates_junk() -> None:
    plain = simplejpeg.encode_jpeg(_pattern(8, 8), colorspace="RGB")
    assert jpeg_exif_orientation(plain) == 1
    assert jpeg_exif_orientation(b"\xff\xd8\xff\xe1\x00\x10Exif\x00\x00MM\x00") == 1
    assert jpeg_exif_orientation(b"\xff\xd8") == 1


@pytest.mark.parametrize(
    ("orientation", "expected", "policy", "apply"),
    [
        (1, (40, 20), "auto", False),
        (3, (40, 20), "auto", True),  # size unchanged: always applied
        (6, (20, 40), "auto", True),  # annotation drawn on the rotated image
        (6, (40, 20), "auto", False),  # annotation drawn on the raw pixels
        (8, None, "auto", True),  # no annotation size: as viewers do
        (6, (40, 20), "apply", True),
        (6, (20, 40), "ignore", False),
    ],
)
def test_orientation_rule(orientation: int, expected: tuple[int, int] | None, policy: str, apply: bool) -> None:
    assert should_apply_orientation(orientation, (40, 20), expected, policy) is apply  # type: ignore[arg-type]


def test_rotated_jpeg_follows_the_annotation_size() -> None:
    data = _encode(Image.fromarray(_pattern(40, 20)), "JPEG", quality=95, exif=_exif(6))
    rotated = decode_image(data, expected_size=(20, 40))
    assert rotated.image.shape == (40, 20, 3) and rotated.exif_applied and not rotated.exif_ignored
    raw = decode_image(data, expected_size=(40, 20))
    assert raw.image.shape == (20, 40, 3) and raw.exif_ignored and not raw.exif_applied
    with pytest.raises(ValueError, match="exif='sideways'"):
        decode_image(data, exif="sideways")  # type: ignore[arg-type]


# -- reduced-size decode ----------------------------------------------------------------------
def test_reduced_decode_picks_a_dct_scale_and_reports_it() -> None:
    data = simplejpeg.encode_jpeg(_pattern(640, 480), quality=90, colorspace="RGB")
    out = decode_image(data, min_size=(200, 150))
    h, w = out.image.shape[:2]
    assert (w, h) == (240, 180) and out.scale == 3 / 8
    assert out.full_size == (640, 480)
    # shrinking less than 2x: full size
    assert decode_image(data, min_size=(400, 300)).image.shape == (480, 640, 3)
    # a function of the full size
    calls = []

    def need(fw: int, fh: int) -> tuple[int, int]:
        calls.append((fw, fh))
        return fw // 8, fh // 8

    small = decode_image(data, min_size=need)
    assert calls == [(640, 480)] and small.image.shape == (60, 80, 3) and small.scale == 1 / 8


def test_reduced_decode_of_an_odd_size_uses_the_exact_factor() -> None:
    data = simplejpeg.encode_jpeg(_pattern(101, 67), quality=90, colorspace="RGB")
    out = decode_image(data, min_size=(30, 20))
    h, w = out.image.shape[:2]
    m = round(out.scale * 8)
    assert out.scale == m / 8 and w == -(-101 * m // 8) and h == -(-67 * m // 8)
    assert w >= 30 and h >= 20


def test_reduced_decode_of_a_rotated_jpeg_counts_in_the_rotated_frame() -> None:
    data = _encode(Image.fromarray(_pattern(64, 32)), "JPEG", quality=90, exif=_exif(6))
    out = decode_image(data, expected_size=(32, 64), min_size=(16, 32))
    assert out.exif_applied and out.image.shape == (32, 16, 3) and out.scale == 0.5


# -- pixel cap (checked from the header, before decoding) -------------------------------------
def _declaring(fmt: str, width: int, height: int) -> bytes:
    data = bytearray(_encode(Image.new("RGB", (16, 16)), fmt))
    if fmt == "JPEG":
        i = data.find(b"\xff\xc0")
        data[i + 5 : i + 9] = height.to_bytes(2, "big") + width.to_bytes(2, "big")
    else:
        data[16:24] = width.to_bytes(4, "big") + height.to_bytes(4, "big")
    return bytes(data)


@pytest.mark.parametrize("fmt,size", [("JPEG", (20000, 20000)), ("JPEG", (65000, 65000)), ("PNG", (50000, 50000))])
def test_a_header_over_the_pixel_cap_is_refused_with_the_file_and_size(fmt: str, size: tuple[int, int]) -> None:
    from detloader.images import header_size

    data = _declaring(fmt, *size)
    assert header_size(data) == size
    with pytest.raises(
        ImageDecodeError,
        match=rf"bomb\.img: header declares {size[0]}x{size[1]} = {size[0] * size[1]} pixels, "
        r"over max_pixels=178956970",
    ):
        decode_image(data, source="bomb.img")


def test_the_pixel_cap_is_a_parameter_and_an_environment_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from detloader.images import MAX_PIXELS_ENV

    data = _encode(Image.new("RGB", (40, 30)), "PNG")
    assert decode_image(data, max_pixels=1200).image.shape == (30, 40, 3)
    with pytest.raises(ImageDecodeError, match="40x30 = 1200 pixels, over max_pixels=1199"):
        decode_image(data, max_pixels=1199)
    path = tmp_path / "x.png"
    path.write_bytes(data)
    monkeypatch.setenv(MAX_PIXELS_ENV, "100")
    with pytest.raises(ImageDecodeError, match=r"x\.png: header declares 40x30"):
        read_image(path)
    monkeypatch.setenv(MAX_PIXELS_ENV, "0")  # no cap
    assert read_image(path).image.shape == (30, 40, 3)


def test_a_palette_png_with_transparency_decodes_without_a_warning() -> None:
    import warnings

    im = Image.new("P", (8, 8), 3)
    im.putpalette([0, 0, 0, 255, 0, 0, 0, 255, 0, 0, 0, 255] + [0] * 756)
    data = _encode(im, "PNG", transparency=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = decode_image(data)
    assert out.image.shape == (8, 8, 3) and tuple(out.image[0, 0]) == (0, 0, 255)


def test_a_palette_png_with_transparency_in_bytes_decodes_without_a_warning() -> None:
    import warnings

    im = Image.new("P", (8, 8), 1)
    im.putpalette([0, 0, 0, 255, 0, 0] + [0] * 762)
    data = _encode(im, "PNG", transparency=bytes([0, 128, 200]))  # a tRNS alpha per entry
    assert isinstance(Image.open(io.BytesIO(data)).info["transparency"], bytes)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = decode_image(data)
    assert out.image.shape == (8, 8, 3) and tuple(out.image[0, 0]) == (255, 0, 0)  # alpha dropped


@pytest.mark.parametrize("size", [0, 1, 50_000, 65_537, 200_000])
def test_image_bytes_reads_the_whole_file_and_refuses_one_over_the_cap(tmp_path, size):
    from detloader.images import image_bytes

    path = tmp_path / "a.jpg"
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    path.write_bytes(data)
    assert image_bytes(path, max_bytes=None) == data == image_bytes(path, max_bytes=size or 1)
    if size > 1:  # max_bytes=0: no cap
        with pytest.raises(ImageDecodeError, match=f"size={size} bytes exceeds max_bytes={size - 1}"):
            image_bytes(path, max_bytes=size - 1)


def test_image_bytes_refuses_a_file_that_grew_past_the_cap_after_its_size_was_taken(tmp_path, monkeypatch):
    import os

    from detloader.images import image_bytes

    path = tmp_path / "a.jpg"
    path.write_bytes(b"x" * 300_000)
    real = os.fstat
    monkeypatch.setattr(os, "fstat", lambda fd: os.stat_result((*real(fd)[:6], 1000, *real(fd)[7:])))
    assert len(image_bytes(path, max_bytes=None)) == 300_000  # read to its end, past the size taken
    with pytest.raises(ImageDecodeError, match="size>200000 bytes exceeds max_bytes=200000"):
        image_bytes(path, max_bytes=200_000)


def test_the_pixel_cap_holds_for_a_jpeg_read_by_libjpeg() -> None:
    data = _encode(Image.new("RGB", (40, 30)), "JPEG")
    assert decode_image(data, max_pixels=1200).image.shape == (30, 40, 3)
    with pytest.raises(ImageDecodeError, match=r"a\.jpg: header declares 40x30 = 1200 pixels, over max_pixels=1199"):
        decode_image(data, max_pixels=1199, source="a.jpg")


def test_a_jpeg_decodes_into_the_thread_buffer_only_when_nothing_holds_the_last_image() -> None:
    """Each decode equals a decode into fresh memory; the memory is taken again once the image
    decoded into it last is gone, never while an array over it lives (a loop that keeps its
    images keeps them intact), and another thread decodes into memory of its own."""
    import threading

    first, second = _pattern(64, 48), _pattern(64, 48)[::-1].copy()
    a, b = (simplejpeg.encode_jpeg(p, quality=95, colorspace="RGB") for p in (first, second))
    want_a, want_b = (simplejpeg.decode_jpeg(d, colorspace="RGB") for d in (a, b))
    kept = decode_image(a).image
    view = kept[1:, ::2]  # a view, not the image itself, may be all that is left
    del kept
    again = decode_image(b).image
    assert np.array_equal(view, want_a[1:, ::2]) and np.array_equal(again, want_b)
    assert not np.shares_memory(view, again)
    del view
    where = again.__array_interface__["data"][0]
    del again
    reused = decode_image(a).image
    assert reused.__array_interface__["data"][0] == where and np.array_equal(reused, want_a)
    other: list[np.ndarray] = []
    thread = threading.Thread(target=lambda: other.append(decode_image(b).image))
    thread.start()
    thread.join()
    assert not np.shares_memory(other[0], reused) and np.array_equal(other[0], want_b)
