"""Decoding: image bytes -> uint8 ``[H, W, 3]`` RGB, with EXIF orientation handled.

JPEG goes through libjpeg-turbo (``simplejpeg``, with DCT-scaled reduced-size decoding);
CMYK/YCCK JPEGs and every other format go through Pillow (first frame, every mode to RGB).
The EXIF rule (``exif="auto"``): the orientation is applied when the annotation's size equals
the transposed image's size, or when there is no annotation size; 2, 3, 4 are always applied.
See docs/loader.md, "Decoding", and docs/reliability.md for the pixel and byte caps.
"""

from __future__ import annotations

import io
import os
import struct
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Literal, NamedTuple

import numpy as np

from detloader._system.files import read_capped
from detloader.errors import DetloaderRuntimeWarning, DetloaderValueError, FileTooLargeError, ImageDecodeError

if TYPE_CHECKING:
    from PIL import Image

ExifPolicy = Literal["auto", "apply", "ignore"]
EXIF_CHOICES: tuple[str, ...] = ("auto", "apply", "ignore")

#: ``min_size`` may be a fixed (width, height) or a function of the full (oriented) size.
MinSize = tuple[int, int] | Callable[[int, int], tuple[int, int] | None] | None

_ORIENTATION_TAG = 0x0112

#: Default cap on the pixels an image header may declare: Pillow's ``DecompressionBombError``
#: limit (about 537 MB as RGB). ``max_pixels=`` or the environment variable below change it.
MAX_PIXELS = 178_956_970
MAX_PIXELS_ENV = "DETLOADER_MAX_PIXELS"
#: Default cap on the size of one image file, checked before it is read (1 GiB).
MAX_IMAGE_BYTES = 1 << 30
MAX_IMAGE_BYTES_ENV = "DETLOADER_MAX_IMAGE_BYTES"


class Decoded(NamedTuple):
    """Result of :func:`decode_image`.

    Attributes:
        image: uint8 ``[H, W, 3]`` RGB (C-contiguous).
        scale: decoded pixels per full-size pixel (``M/8`` after DCT scaling, else 1.0); an
            annotation coordinate ``x`` of the full-size image is ``x * scale`` in ``image``.
        full_size: (width, height) of the full-size image in the frame of ``image`` (after
            the orientation was applied, if it was).
        orientation: the EXIF orientation tag found (1 when absent).
        exif_applied: whether the orientation was applied to the pixels.
        exif_ignored: orientation 5..8 found but not applied because the expected size is the
            raw one.
    """

    image: np.ndarray
    scale: float
    full_size: tuple[int, int]
    orientation: int
    exif_applied: bool
    exif_ignored: bool


def check_exif_policy(exif: str) -> None:
    if exif not in EXIF_CHOICES:
        raise DetloaderValueError(f"exif={exif!r} is not one of {', '.join(EXIF_CHOICES)}")


# -- EXIF -------------------------------------------------------------------------------------
def oriented_size(width: int, height: int, orientation: int) -> tuple[int, int]:
    """(width, height) after applying EXIF ``orientation`` to a ``width x height`` image."""
    return (height, width) if orientation in (5, 6, 7, 8) else (width, height)


def should_apply_orientation(
    orientation: int, raw_size: tuple[int, int], expected_size: tuple[int, int] | None, exif: ExifPolicy = "auto"
) -> bool:
    """The EXIF rule of this module (see its docstring) as a pure function."""
    if orientation not in range(2, 9) or exif == "ignore":
        return False
    if exif == "apply" or expected_size is None or orientation in (2, 3, 4):
        return True
    w, h = raw_size
    return tuple(expected_size) == (h, w)


def apply_orientation(image: np.ndarray, orientation: int) -> np.ndarray:
    """Pixels as ``PIL.ImageOps.exif_transpose`` shows them (a C-contiguous copy unless 1)."""
    if orientation in (1, 0) or orientation > 8:
        return image
    ops: dict[int, Callable[[np.ndarray], np.ndarray]] = {
        2: lambda a: a[:, ::-1],
        3: lambda a: a[::-1, ::-1],
        4: lambda a: a[::-1],
        5: lambda a: a.transpose(1, 0, 2),
        6: lambda a: a.transpose(1, 0, 2)[:, ::-1],
        7: lambda a: a[::-1, ::-1].transpose(1, 0, 2),
        8: lambda a: a.transpose(1, 0, 2)[::-1],
    }
    return np.ascontiguousarray(ops[orientation](image))


#: JPEG markers without a length (SOI, TEM, RST0-7)
_STANDALONE = frozenset([0xD8, 0x01, *range(0xD0, 0xD8)])


def _jpeg_segments(data: bytes) -> Iterator[tuple[int, int, int]]:
    """(marker, position, length) of each segment of JPEG ``data`` before the scan: fill bytes
    and standalone markers skipped, stops at a broken marker or the end of the metadata."""
    n, pos = len(data), 2  # after SOI
    while pos + 4 <= n and data[pos] == 0xFF:
        marker = data[pos + 1]
        if marker == 0xFF or marker in _STANDALONE:  # fill byte / standalone
            pos += 1 if marker == 0xFF else 2
            continue
        if marker in (0xD9, 0xDA):  # end of image / start of scan: no more metadata
            return
        length = data[pos + 2] << 8 | data[pos + 3]
        yield marker, pos, length
        pos += 2 + length


def jpeg_exif_orientation(data: bytes) -> int:
    """EXIF orientation (1..8) of JPEG ``data``, 1 when absent or unreadable; reads only the
    APP1 segment (a few microseconds per image)."""
    for marker, pos, length in _jpeg_segments(data):
        if marker == 0xE1 and data[pos + 4 : pos + 10] == b"Exif\x00\x00":
            return _tiff_orientation(data[pos + 10 : pos + 2 + length])
    return 1


def _tiff_orientation(tiff: bytes) -> int:
    if len(tiff) < 8:
        return 1
    order = {b"II": "<", b"MM": ">"}.get(tiff[:2])
    if order is None:
        return 1
    (ifd,) = struct.unpack(order + "I", tiff[4:8])
    if ifd + 2 > len(tiff):
        return 1
    (count,) = struct.unpack(order + "H", tiff[ifd : ifd + 2])
    for k in range(count):
        entry = ifd + 2 + 12 * k
        if entry + 12 > len(tiff):
            return 1
        tag, typ = struct.unpack(order + "HH", tiff[entry : entry + 4])
        if tag == _ORIENTATION_TAG and typ == 3:  # SHORT
            (value,) = struct.unpack(order + "H", tiff[entry + 8 : entry + 10])
            return int(value) if 1 <= value <= 8 else 1
    return 1


# -- header check (pixel cap) -----------------------------------------------------------------
def _cap(value: int | None | Literal["default"], env: str, default: int) -> int | None:
    """A cap as given, or for ``"default"`` the environment variable ``env`` or ``default``;
    None for no cap (0, None)."""
    if value == "default":
        text = os.environ.get(env)
        try:
            value = default if text is None or text == "" else int(text)
        except ValueError:
            raise DetloaderValueError(f"{env}={text!r} is not an integer") from None
    return value if value and value > 0 else None


def header_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) the header of ``data`` declares (JPEG SOF, PNG IHDR, or whatever Pillow
    reads without decoding pixels), None when no header can be read."""
    if data[:3] == b"\xff\xd8\xff":
        size = _jpeg_sof_size(data)
        if size is not None:
            return size
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24 and data[12:16] == b"IHDR":
        w, h = struct.unpack(">II", data[16:24])
        return int(w), int(h)
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(io.BytesIO(data)) as img:
                return int(img.size[0]), int(img.size[1])
    except Image.DecompressionBombError:
        raise  # Pillow's own cap (other formats); decode_image words it with the file name
    except Exception:  # noqa: BLE001 - any other failure here means "no readable header"
        return None


def _jpeg_sof_size(data: bytes) -> tuple[int, int] | None:
    for marker, pos, _ in _jpeg_segments(data):
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if pos + 9 > len(data):
                return None
            h, w = struct.unpack(">HH", data[pos + 5 : pos + 9])
            return int(w), int(h)
    return None


def check_pixels(
    data: bytes, source: str = "<bytes>", max_pixels: int | None | Literal["default"] = "default"
) -> tuple[int, int] | None:
    """Refuse ``data`` whose header declares more than ``max_pixels`` pixels, before any pixel
    is decoded; returns the declared (width, height), or None when no header is readable.

    Raises:
        ImageDecodeError: ``"<source>: header declares 20000x20000 = 400000000 pixels, over
            max_pixels=178956970"``.
    """
    size = header_size(data)
    if size is not None:
        _check_cap(size, source, max_pixels)
    return size


def _check_cap(size: tuple[int, int], source: str, max_pixels: int | None | Literal["default"]) -> None:
    limit = _cap(max_pixels, MAX_PIXELS_ENV, MAX_PIXELS)
    w, h = size
    if limit and w * h > limit:
        raise ImageDecodeError(
            f"{source}: header declares {w}x{h} = {w * h} pixels, over max_pixels={limit} "
            f"(raise it with max_pixels= or {MAX_PIXELS_ENV})"
        )


# -- decoding ---------------------------------------------------------------------------------
def _dct_scale(full: tuple[int, int], got: tuple[int, int]) -> float:
    """The ``M/8`` libjpeg used: its output size is ``ceil(size * M / 8)``."""
    w, h = full
    for m in range(1, 9):
        if -(-w * m // 8) == got[0] and -(-h * m // 8) == got[1]:
            return m / 8
    return got[0] / w  # a libjpeg with other factors: the nearest honest figure


def decode_image(
    data: bytes,
    *,
    expected_size: tuple[int, int] | None = None,
    exif: ExifPolicy = "auto",
    min_size: MinSize = None,
    source: str = "<bytes>",
    max_pixels: int | None | Literal["default"] = "default",
) -> Decoded:
    """Decode image bytes to uint8 ``[H, W, 3]`` RGB.

    Args:
        expected_size: (width, height) written in the annotation; decides the EXIF rule.
        min_size: the smallest (width, height) the caller needs, in the oriented frame, or a
            function of the full oriented size giving it. A JPEG is decoded at a reduced size
            only when that shrinks it at least 2x in both directions, never below ``min_size``.
        source: a name for error messages (the file path).
        max_pixels: refuse an image whose header declares more pixels (checked before
            decoding); ``"default"``: :data:`MAX_PIXELS` or ``$DETLOADER_MAX_PIXELS``;
            0 or None: no cap.

    Raises:
        ImageDecodeError: the bytes are not an image that can be decoded, or declare more
            than ``max_pixels`` pixels.
    """
    check_exif_policy(exif)
    if not data:
        raise ImageDecodeError(f"{source}: cannot decode image: an empty file (0 bytes)")
    if data[:3] == b"\xff\xd8\xff":
        import simplejpeg

        try:
            h, w, colorspace, _ = simplejpeg.decode_jpeg_header(data)  # libjpeg's own header parse
        except ValueError:
            colorspace = None  # let Pillow try, and word the error if it fails too
        if colorspace is not None and colorspace not in ("CMYK", "YCCK"):
            _check_cap((w, h), source, max_pixels)
            return _decode_jpeg(data, (w, h), expected_size, exif, min_size, source)
    from PIL import Image

    try:
        check_pixels(data, source, max_pixels)
    except Image.DecompressionBombError as err:
        raise ImageDecodeError(f"{source}: {err}") from err
    return _decode_pillow(data, expected_size, exif, source)


def image_bytes(path: str | os.PathLike[str], max_bytes: int | None | Literal["default"] = "default") -> bytes:
    """The bytes of the image file at ``path``, refused before reading when it is not a
    regular file (a FIFO would hang) or larger than ``max_bytes`` (``"default"``:
    :data:`MAX_IMAGE_BYTES` or ``$DETLOADER_MAX_IMAGE_BYTES``; 0 or None: no cap).

    Raises:
        ImageDecodeError: naming the file and why (``OSError`` and ``FileTooLargeError`` as
            its ``__cause__``).
    """
    try:
        return read_capped(path, _cap(max_bytes, MAX_IMAGE_BYTES_ENV, MAX_IMAGE_BYTES), "max_bytes")
    except (OSError, FileTooLargeError) as err:
        raise ImageDecodeError(
            f"{os.fspath(path)}: cannot read image: {getattr(err, 'strerror', None) or err}"
        ) from err


def read_image(
    path: str | os.PathLike[str],
    *,
    expected_size: tuple[int, int] | None = None,
    exif: ExifPolicy = "auto",
    min_size: MinSize = None,
    max_pixels: int | None | Literal["default"] = "default",
    max_bytes: int | None | Literal["default"] = "default",
) -> Decoded:
    """:func:`decode_image` of the file at ``path`` (read by :func:`image_bytes`); running
    out of memory on it is that file's :class:`ImageDecodeError`, not the process's."""
    try:
        return decode_image(
            image_bytes(path, max_bytes),
            expected_size=expected_size,
            exif=exif,
            min_size=min_size,
            source=os.fspath(path),
            max_pixels=max_pixels,
        )
    except MemoryError as err:
        raise ImageDecodeError(f"{os.fspath(path)}: out of memory reading or decoding the image") from err


#: Each thread's JPEG output buffer (``buffer``), taken again once nothing holds the image
#: decoded into it last; kept up to this many bytes (a 4k RGB image).
_DECODE_BUFFER_KEEP = 3840 * 2160 * 3
_decoded = threading.local()


def _decode_buffer(nbytes: int) -> np.ndarray:
    """Memory for a decode of up to ``nbytes``: this thread's buffer when no array over it is
    left (the image decoded into it last was resized, copied or dropped), else a new one. A
    fresh ``nbytes`` per image costs the allocator's pages again each time: about 7 % of a
    decode and resize of a 480x360 JPEG."""
    buffer = _decoded.__dict__.get("buffer")
    if buffer is not None and buffer.nbytes >= nbytes and sys.getrefcount(buffer) == _decoded.unheld:
        return buffer
    buffer = np.empty(nbytes, dtype=np.uint8)
    if nbytes <= _DECODE_BUFFER_KEEP:
        _decoded.buffer = buffer
        # its count with no array over it, told as the check above tells it (the thread's dict,
        # ``buffer`` here, the argument: how many of those count is the interpreter's business)
        _decoded.unheld = sys.getrefcount(buffer)
    return buffer


def _decode_jpeg(
    data: bytes,
    size: tuple[int, int],
    expected_size: tuple[int, int] | None,
    exif: ExifPolicy,
    min_size: MinSize,
    source: str,
) -> Decoded:
    """A JPEG whose header libjpeg read (``size``: its width and height), decoded by simplejpeg."""
    import simplejpeg

    w, h = size
    orientation = jpeg_exif_orientation(data)
    applied = should_apply_orientation(orientation, (w, h), expected_size, exif)
    full = oriented_size(w, h, orientation) if applied else (w, h)
    need = min_size(*full) if callable(min_size) else min_size  # a function of the oriented size
    kwargs = {}
    if need is not None:
        need_raw = (need[1], need[0]) if applied and orientation >= 5 else need
        if 0 < need_raw[0] * 2 <= w and 0 < need_raw[1] * 2 <= h:
            kwargs = {"min_width": int(need_raw[0]), "min_height": int(need_raw[1])}
    buffer = _decode_buffer(w * h * 3)
    try:
        image = simplejpeg.decode_jpeg(data, colorspace="RGB", buffer=buffer, **kwargs)
    except ValueError as err:
        try:  # a recoverable error (truncated data, bad Huffman code): decode what is there
            image = simplejpeg.decode_jpeg(data, colorspace="RGB", buffer=buffer, strict=False, **kwargs)
        except ValueError:
            raise ImageDecodeError(f"{source}: cannot decode JPEG: {err}") from err
        warnings.warn(f"{source}: damaged JPEG decoded anyway ({err})", DetloaderRuntimeWarning, stacklevel=4)
    scale = 1.0 if not kwargs else _dct_scale((w, h), (image.shape[1], image.shape[0]))
    if applied:
        image = apply_orientation(image, orientation)
    ignored = orientation >= 5 and not applied and exif == "auto"
    return Decoded(image, scale, full, orientation, applied, ignored)


def _to_rgb(img: Image.Image) -> np.ndarray:
    """Any Pillow mode -> uint8 ``[H, W, 3]``: alpha dropped, 16-bit scaled, ``F`` clipped."""
    mode = img.mode
    if mode == "RGB":
        return np.array(img)
    if mode.startswith("I;16") or mode == "I":
        a = np.asarray(img)
        if mode == "I":
            a = np.clip(a, 0, 65535)
        a = ((a.astype(np.uint32) * 255 + 32767) // 65535).astype(np.uint8)
        return np.repeat(a[..., None], 3, axis=2)
    if mode == "F":
        img = img.convert("L")
    if mode == "P" and "transparency" in img.info:
        # through RGBA, as Pillow advises (it warns on every such file otherwise); alpha dropped
        img = img.convert("RGBA")
    return np.array(img.convert("RGB"))


def _decode_pillow(data: bytes, expected_size: tuple[int, int] | None, exif: ExifPolicy, source: str) -> Decoded:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as img:
            orientation = int(img.getexif().get(_ORIENTATION_TAG, 1) or 1)
            if not 1 <= orientation <= 8:
                orientation = 1
            image = _to_rgb(img)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise ImageDecodeError(f"{source}: cannot decode image: {err}") from err
    h, w = image.shape[:2]
    applied = should_apply_orientation(orientation, (w, h), expected_size, exif)
    if applied:
        image = apply_orientation(image, orientation)
    image = np.ascontiguousarray(image)
    ignored = orientation >= 5 and not applied and exif == "auto"
    return Decoded(image, 1.0, (image.shape[1], image.shape[0]), orientation, applied, ignored)
