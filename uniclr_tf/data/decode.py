"""Image file bytes to uint8 arrays: :func:`decode_image`, the one decoding rule.

``folder:`` datasets decode their files with it, and ``export/client.py`` decodes the images it
sends for serving with it, so that served images get the pixels training saw. The rule is
TensorFlow's decoder; a Pillow path reproduces it where TensorFlow is not installed. The streamed
pipelines (:mod:`uniclr_tf.data.stream`) apply the same rule inside tf.data.

:func:`image_header` tells what :func:`decode_image` would return for a file (its height, width
and channels, or its error) from the file's header and end, without decoding the pixels: the
load-time check of streamed folders.

:func:`pixel_budget` is the one pixel budget of every decode path (folders, TFRecord and TFDS
records, the serving client): the size an image's header declares, read from its bytes without
decoding anything, against ``--max_image_pixels``. An image whose size its header does not tell
is never handed to a decoder.
"""

from __future__ import annotations

import collections
import io
import os
from typing import Optional

import numpy as np

from uniclr_tf.data.lazy_tf import have_tensorflow, tf


class ImageDecodeError(ValueError):
    """:func:`decode_image` cannot use these bytes; the message is one line (no path)."""


_UNDECODABLE = "cannot decode image (truncated or not an image)"
# The formats tf.io.decode_image reads, as Pillow names them (MPO: a camera JPEG with extra frames).
_PIL_FORMATS = ("PNG", "JPEG", "MPO", "GIF", "BMP", "WEBP")
_PIL_GREY_MODES = ("1", "L", "LA", "La", "I", "I;16", "I;16B", "I;16L", "I;16N")
_TAIL = 4096  # bytes read at a file's end to find the format's end marker

#: The most pixels (height x width) an image file may declare before it is decoded (Pillow's own
#: decompression-bomb limit): a 400 KB PNG can declare 20000 x 20000 pixels, 1.2 GB decoded.
MAX_PIXELS = 89_478_485

#: What :func:`image_header` found: ``shape`` ``(height, width, channels)`` as :func:`decode_image`
#: returns it, and the Pillow format name.
ImageHeader = collections.namedtuple("ImageHeader", ["shape", "format"])


def decode_image(raw: bytes, backend: Optional[str] = None, max_pixels: Optional[int] = None) -> np.ndarray:
    """Image file bytes → uint8 ``[H, W, C]``, ``C`` in {1, 3}: THE decoding rule of ``folder:``
    datasets, shared with ``export/client.py`` so that served images get the training pixels.

    The rule is ``tf.io.decode_image(raw, channels=0, dtype=tf.uint8, expand_animations=False)``:
    native channels (grey stays 1 channel, a palette becomes RGB), the first frame of an animation,
    16-bit PNG samples reduced to their high byte (``v >> 8``: 10000 → 39, 65535 → 255; libpng's
    strip-16), then alpha dropped (grey+alpha → 1 channel, RGBA → 3).

    Args:
      raw: the file's bytes (PNG, JPEG, GIF, BMP or WebP).
      backend: ``"tensorflow"`` (the rule itself), ``"pil"`` (Pillow + NumPy, no TensorFlow: the same
        values for PNG of any bit depth and colour type, GIF, 8/24/32-bit BMP and WebP; JPEG pixels
        differ by a few levels, because TensorFlow decodes JPEG with libjpeg's fast integer IDCT and
        Pillow offers only the accurate one), or None: ``"tensorflow"`` when installed, else ``"pil"``.

      max_pixels: refuse (before decoding) an image whose header declares more pixels than this
        (height x width); None: :data:`MAX_PIXELS`.

    Raises:
      ImageDecodeError: one line saying why (not an image, truncated, unexpected shape, too many pixels).
    """
    if backend is None:
        backend = "tensorflow" if have_tensorflow() else "pil"
    if not raw:
        raise ImageDecodeError("empty file")
    check_budget(raw, max_pixels)
    if backend == "tensorflow":
        try:
            image = tf.io.decode_image(raw, channels=0, dtype=tf.uint8, expand_animations=False).numpy()
        except (tf.errors.OpError, ValueError):
            raise ImageDecodeError(_UNDECODABLE) from None
    elif backend == "pil":
        image = _decode_image_pil(raw)
    else:
        raise ValueError(f"backend must be 'tensorflow', 'pil' or None; received {backend!r}")
    if image.ndim != 3 or image.shape[-1] not in (1, 2, 3, 4):
        raise ImageDecodeError(f"unexpected decoded shape {image.shape}; expected (height, width, 1 or 3 channels)")
    if min(image.shape[:2]) < 1:
        raise ImageDecodeError(f"empty image (shape {image.shape})")
    if image.shape[-1] == 2:  # grey + alpha
        image = image[..., :1]
    elif image.shape[-1] == 4:  # RGBA
        image = image[..., :3]
    return image


def _pil():
    """Pillow's ``Image`` module, its own decompression-bomb check off: :func:`check_pixels` applies
    the caller's limit (``--max_image_pixels``) from the header instead, before any decoding."""
    from PIL import Image

    Image.MAX_IMAGE_PIXELS = None
    return Image


def check_pixels(size, max_pixels=None, frames=1, pixels=None):
    """Raises :class:`ImageDecodeError` when ``size`` ``(width, height)`` (``pixels``: what decoding
    it costs, when more than ``width x height``) exceeds ``max_pixels`` pixels."""
    limit = max_pixels or MAX_PIXELS
    if size is None:
        return
    pixels = size[0] * size[1] if pixels is None else pixels
    if pixels > limit:
        what = f"{size[1]}x{size[0]}" + (f" in {frames:,} frames" if frames > 1 else "")
        raise ImageDecodeError(f"image is {what} = {pixels:,} pixels, more than the limit of {limit:,} (a "
                               f"decompression bomb?); raise --max_image_pixels to read it")


#: What :func:`declared_size` found: the image's ``height`` and ``width`` as its header declares
#: them, its ``format``, its ``frames`` (GIF), and ``pixels``: what decoding it costs (``height x
#: width``; for an animated GIF the canvas plus every further frame, which the decoder reads too).
DeclaredSize = collections.namedtuple("DeclaredSize", ["height", "width", "format", "frames", "pixels"])


def _u16be(raw, at):
    return int.from_bytes(raw[at:at + 2], "big")


def _u16le(raw, at):
    return int.from_bytes(raw[at:at + 2], "little")


def _jpeg_size(raw):
    """``(height, width)`` of a JPEG's first SOF marker, or None."""
    at, end = 2, len(raw)
    while at + 4 <= end:
        if raw[at] != 0xFF:
            return None
        marker = raw[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD9)):  # no length
            at += 2
            continue
        if marker in (0xD9, 0xDA):  # end of image, start of scan: no frame header before
            return None
        length = _u16be(raw, at + 2)
        if length < 2:
            return None
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if at + 9 > end:
                return None
            return _u16be(raw, at + 5), _u16be(raw, at + 7)
        at += 2 + length
    return None


def _gif_size(raw):
    """``(canvas height, canvas width, frames, pixels)`` of a GIF, walking its blocks (no decoding),
    or None. The canvas is the larger of the screen and of the largest frame (TensorFlow's)."""
    if len(raw) < 13:
        return None
    width, height, flags = _u16le(raw, 6), _u16le(raw, 8), raw[10]
    at = 13 + (3 * 2 ** ((flags & 7) + 1) if flags & 0x80 else 0)
    frames, later_pixels, end = 0, 0, len(raw)

    def skip_blocks(at):
        while at < end and raw[at]:
            at += raw[at] + 1
        return at + 1

    while at < end:
        kind = raw[at]
        if kind == 0x21:  # extension: a label, then data blocks
            at = skip_blocks(at + 2)
        elif kind == 0x2C:  # an image: its descriptor, a local colour table, LZW data blocks
            if at + 10 > end:
                break
            fw, fh, fflags = _u16le(raw, at + 5), _u16le(raw, at + 7), raw[at + 9]
            width, height = max(width, fw), max(height, fh)
            later_pixels += fw * fh if frames else 0
            frames += 1
            at += 10 + (3 * 2 ** ((fflags & 7) + 1) if fflags & 0x80 else 0)
            at = skip_blocks(at + 1)
        else:  # the trailer, or damage: the decoder stops there
            break
    return height, width, max(frames, 1), width * height + later_pixels


def _webp_size(raw):
    """``(height, width)`` of a WebP's canvas (VP8X) or its one frame (VP8, VP8L), or None."""
    chunk = raw[12:16]
    if chunk == b"VP8X" and len(raw) >= 30:
        return (int.from_bytes(raw[27:30], "little") + 1, int.from_bytes(raw[24:27], "little") + 1)
    if chunk == b"VP8L" and len(raw) >= 25 and raw[20] == 0x2F:
        bits = int.from_bytes(raw[21:25], "little")
        return ((bits >> 14) & 0x3FFF) + 1, (bits & 0x3FFF) + 1
    if chunk == b"VP8 " and len(raw) >= 30 and raw[23:26] == b"\x9d\x01\x2a":
        return _u16le(raw, 28) & 0x3FFF, _u16le(raw, 26) & 0x3FFF
    return None


def declared_size(raw: bytes) -> Optional[DeclaredSize]:
    """The size an image's header declares (PNG, JPEG, GIF, BMP, WebP: the formats decoded), read
    from its bytes without decoding anything; None when the bytes are none of these or their header
    does not say (such bytes are never decoded: :func:`check_budget`)."""
    raw = bytes(raw[:]) if not isinstance(raw, bytes) else raw
    size, image_format, frames, pixels = None, None, 1, None
    if raw[:8] == b"\x89PNG\r\n\x1a\n" and raw[12:16] == b"IHDR" and len(raw) >= 24:
        size, image_format = (int.from_bytes(raw[20:24], "big"), int.from_bytes(raw[16:20], "big")), "PNG"
    elif raw[:3] == b"\xff\xd8\xff":
        size, image_format = _jpeg_size(raw), "JPEG"
    elif raw[:6] in (b"GIF87a", b"GIF89a"):
        found, image_format = _gif_size(raw), "GIF"
        if found:
            size, frames, pixels = found[:2], found[2], found[3]
    elif raw[:2] == b"BM" and len(raw) >= 26:  # TensorFlow's reading: int32 width and height, any header
        width = int.from_bytes(raw[18:22], "little", signed=True)
        height = int.from_bytes(raw[22:26], "little", signed=True)
        size, image_format = (abs(height), abs(width)), "BMP"
    elif raw[:4] == b"RIFF" and raw[8:12] == b"WEBP":
        size, image_format = _webp_size(raw), "WEBP"
    if size is None or min(size) < 1:
        return None
    height, width = size
    return DeclaredSize(height, width, image_format, frames, height * width if pixels is None else pixels)


def check_budget(raw: bytes, max_pixels: Optional[int] = None) -> DeclaredSize:
    """THE pixel budget, checked before any decoding: the :func:`declared_size` of ``raw``, or
    :class:`ImageDecodeError` when it costs more than ``max_pixels`` (None: :data:`MAX_PIXELS`) or
    its header does not tell its size (such bytes are not decoded at all)."""
    size = declared_size(raw)
    if size is None:
        raise ImageDecodeError(_UNDECODABLE)
    check_pixels((size.width, size.height), max_pixels, size.frames, size.pixels)
    return size


def budget_status(raw, max_pixels=0):
    """:func:`check_budget` as ``(code, reason)`` for tf.data (``tf.numpy_function``): code 0 (within
    the budget, reason empty), 1 (not an image whose size its header tells) or 3 (over the budget)."""
    try:
        check_budget(raw if isinstance(raw, bytes) else bytes(raw), int(max_pixels) or None)
    except ImageDecodeError as e:
        return (np.int32(1 if e.args[0] == _UNDECODABLE else 3), e.args[0].encode())
    except Exception:  # noqa: BLE001 - whatever the bytes, an answer
        return np.int32(1), _UNDECODABLE.encode()
    return np.int32(0), b""


def _decode_image_pil(raw):
    """``decode_image``'s rule with Pillow: uint8 ``[H, W, 1 or 3]`` (see there for what matches)."""
    Image = _pil()

    try:
        with Image.open(io.BytesIO(raw)) as im:
            if im.format not in _PIL_FORMATS:
                raise ImageDecodeError(_UNDECODABLE)
            im.load()  # the first frame; truncated data raises here
            mode = im.mode
            # PNG colour type (IHDR byte 25): 0 grey, 4 grey+alpha. Pillow opens 16-bit grey+alpha as
            # RGBA (R = G = B = the grey's high byte); TensorFlow keeps it grey.
            grey_png = im.format == "PNG" and len(raw) > 25 and raw[25] in (0, 4)
            if mode.startswith("I"):  # 16-bit grey PNG ("I;16", or "I" in older Pillow): full values
                values = np.asarray(im).astype(np.int64)
                return (np.clip(values, 0, 65535) >> 8).astype(np.uint8)[..., None]
            if im.format == "GIF":  # always RGB in TensorFlow, even with a grey palette, and
                rgba = np.asarray(im.convert("RGBA"), dtype=np.uint8)  # transparent pixels black
                return np.where(rgba[..., 3:] == 0, np.uint8(0), rgba[..., :3])
            if im.format == "BMP":
                if mode == "1":  # TensorFlow refuses 1-bit BMPs
                    raise ImageDecodeError(_UNDECODABLE)
                if mode in ("P", "L"):  # TensorFlow returns an 8-bit BMP's palette indices, one channel
                    return np.asarray(im, dtype=np.uint8)[..., None]
            if mode in _PIL_GREY_MODES:
                return np.asarray(im.convert("L"), dtype=np.uint8)[..., None]
            if grey_png:
                return np.asarray(im.getchannel(0), dtype=np.uint8)[..., None]
            if mode in ("P", "PA"):  # via RGBA: Pillow warns converting a palette with alpha to RGB
                return np.asarray(im.convert("RGBA"), dtype=np.uint8)[..., :3]
            return np.asarray(im.convert("RGB"), dtype=np.uint8)
    except ImageDecodeError:
        raise
    except (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError):
        # UnidentifiedImageError is an OSError; truncated files raise OSError or SyntaxError.
        raise ImageDecodeError(_UNDECODABLE) from None


def _header_channels(image_format, mode, head):
    """Channels ``decode_image`` returns for a file of this Pillow format / mode / first bytes, or
    None when the header alone cannot tell (the file is then decoded in full)."""
    if image_format == "PNG":  # IHDR colour type: 0 grey, 4 grey + alpha; 2, 3, 6 colour
        return 1 if head[25] in (0, 4) else 3
    if image_format in ("JPEG", "MPO"):
        return 1 if mode == "L" else 3
    if image_format in ("GIF", "WEBP"):
        return 3
    if image_format == "BMP":  # TensorFlow reads 8 (palette indices, one channel), 24 and 32 bits
        info_size = int.from_bytes(head[14:18], "little")
        bits = int.from_bytes(head[24:26] if info_size == 12 else head[28:30], "little")
        return {8: 1, 24: 3, 32: 3}.get(bits)
    return None


def _complete(image_format, head, tail, size):
    """Whether the file's end looks whole: the format's end marker in its last bytes (PNG's IEND
    chunk, JPEG's EOI marker, GIF's trailer), or the length its header declares (BMP, WebP)."""
    if image_format == "PNG":
        return b"IEND" in tail[-64:]
    if image_format in ("JPEG", "MPO"):
        return b"\xff\xd9" in tail
    if image_format == "GIF":
        return b";" in tail[-16:]
    if image_format == "BMP":
        offset, compression = int.from_bytes(head[10:14], "little"), int.from_bytes(head[30:34], "little")
        width, height = (int.from_bytes(head[o:o + 4], "little", signed=True) for o in (18, 22))
        bits = int.from_bytes(head[28:30], "little")
        if compression not in (0, 3):  # compressed: no size to expect
            return True
        return size >= offset + abs(height) * ((bits * abs(width) + 31) // 32 * 4)
    if image_format == "WEBP":
        return size >= int.from_bytes(head[4:8], "little") + 8
    return False


#: Bytes an image file may hold per pixel of the budget (a 16-bit RGBA PNG stored uncompressed: 8),
#: plus 1 MB of headers: a larger file is refused before it is read.
BYTES_PER_PIXEL = 8


def read_image_file(path: str, max_pixels: Optional[int] = None) -> bytes:
    """The bytes of the image file ``path``: opened without blocking, and only when it is a regular
    file no larger than an image within the pixel budget can be (a FIFO would block for ever, a link
    to a device never end).

    Raises:
      ImageDecodeError: not a regular file, or too large (one line).
      OSError: the file cannot be read.
    """
    import stat

    with os.fdopen(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ImageDecodeError("not a regular file")
        limit = (max_pixels or MAX_PIXELS) * BYTES_PER_PIXEL + 2 ** 20
        if info.st_size > limit:
            raise ImageDecodeError(f"file is {info.st_size:,} bytes, more than an image within the pixel budget can "
                                   f"be ({limit:,}); raise --max_image_pixels to read it")
        return f.read(limit + 1)


def image_header(path: str, max_pixels: Optional[int] = None) -> ImageHeader:
    """What :func:`decode_image` would return for the file at ``path``, without decoding it.

    Reads the file's header with Pillow (format, size, colour type) and its last few KiB (the
    format's end marker: PNG ``IEND``, JPEG ``EOI``, GIF trailer; the declared length of BMP and
    WebP files). A file whose header or end does not look right (unknown format, a BMP depth
    TensorFlow does not read, a truncated end, ...) is decoded in full with :func:`decode_image`,
    which decides: so the result, and the error, are :func:`decode_image`'s. What the cheap path
    cannot see is damage in the middle of a file whose header and end are intact; the streamed
    pipelines catch that when they decode the file.

    Raises:
      ImageDecodeError: the file cannot be decoded (one line, as :func:`decode_image`), or declares
        more than ``max_pixels`` pixels.
      OSError: the file cannot be read.
    """
    Image = _pil()

    import stat

    with os.fdopen(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):  # a FIFO would block, a device never end
            raise ImageDecodeError("not a regular file")
        size = info.st_size
        head = f.read(64)
        if size == 0:
            raise ImageDecodeError("empty file")
        try:
            f.seek(0)
            with Image.open(f) as im:
                image_format, mode, (width, height) = im.format, im.mode, im.size
            f.seek(max(0, size - _TAIL))
            tail = f.read()
        except (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError):
            image_format = None
        if image_format == "GIF":  # its frames cost pixels too: the whole file's blocks are walked
            f.seek(0)
            check_budget(f.read(), max_pixels)
        elif image_format:
            check_pixels((width, height), max_pixels)  # before anything is decoded in full
        channels = _header_channels(image_format, mode, head) if image_format else None
        if channels and min(width, height) >= 1 and _complete(image_format, head, tail, size):
            return ImageHeader((height, width, channels), image_format)
        f.seek(0)
        raw = f.read()
    image = decode_image(raw, max_pixels=max_pixels)  # the header was not enough: decode_image decides
    return ImageHeader(tuple(int(d) for d in image.shape), image_format or "")
