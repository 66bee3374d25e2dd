"""A generated corpus of hostile images: each decodes to RGB uint8 or raises ImageDecodeError
naming the file, never another exception, and never allocates past the pixel cap."""

from __future__ import annotations

import io
import tracemalloc

import numpy as np
import pytest
from PIL import Image

from detloader.images import ImageDecodeError, decode_image


def _save(img: Image.Image, fmt: str, **kw: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def _corpus() -> dict[str, tuple[bytes, str]]:
    rgb = Image.fromarray(np.arange(48 * 32 * 3, dtype=np.uint8).reshape(32, 48, 3))
    jpeg = _save(rgb, "JPEG", quality=90)
    png = _save(rgb, "PNG")
    bomb = bytearray(jpeg)
    i = bomb.find(b"\xff\xc0")
    bomb[i + 5 : i + 9] = (20000).to_bytes(2, "big") * 2
    png_bomb = bytearray(png)
    png_bomb[16:24] = (50000).to_bytes(4, "big") * 2
    out: dict[str, tuple[bytes, str]] = {
        "truncated.jpg": (jpeg[: len(jpeg) // 2], "decoded"),  # damaged JPEG decoded with a warning
        "header_only.jpg": (jpeg[:200], "error"),
        "truncated.png": (png[: len(png) // 2], "error"),
        "garbage.jpg": (b"\xff\xd8\xff" + bytes(range(256)) * 4, "error"),
        "zero.jpg": (b"", "error"),
        "text.jpg": (b"not an image at all", "error"),
        "bomb.jpg": (bytes(bomb), "error"),
        "bomb.png": (bytes(png_bomb), "error"),
        "png_named.jpg": (png, "decoded"),
        "cmyk.jpg": (_save(rgb.convert("CMYK"), "JPEG"), "decoded"),
        "16bit.png": (
            _save(Image.fromarray(np.arange(32 * 48, dtype=np.uint16).reshape(32, 48) * 40), "PNG"),
            "decoded",
        ),
        "palette.png": (_save(rgb.convert("P"), "PNG", transparency=0), "decoded"),
    }
    for o in range(2, 9):
        exif = Image.Exif()
        exif[0x0112] = o
        out[f"exif{o}.jpg"] = (_save(rgb, "JPEG", exif=exif.tobytes()), "decoded")
    return out


CORPUS = _corpus()


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_hostile_image_decodes_or_fails_cleanly_within_bounds(name: str) -> None:
    data, expected = CORPUS[name]
    tracemalloc.start()
    try:
        with pytest.warns() if name == "truncated.jpg" else _nothing():
            try:
                out = decode_image(data, source=name)
            except ImageDecodeError as err:
                assert expected == "error", err
                assert str(err).startswith(f"{name}: ")
                return
        assert expected == "decoded"
        assert out.image.dtype == np.uint8 and out.image.ndim == 3 and out.image.shape[2] == 3
        assert sorted(out.image.shape[:2]) == [32, 48]
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 8 * 2**20, peak  # a bomb never allocates its declared size


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
