"""Splits read lazily through tf.data, and the checked decoding of their images.

A streamed split is a :class:`Stream`: its *records* (file names, serialized ``tf.train.Example``
protos, or the examples of a TFDS split) in a fixed order, which
:func:`~uniclr_tf.data.pipelines.pretrain_dataset` shuffles before anything is decoded, and a
*decode* step that turns each record into ``(image uint8 [H, W, C], label int64)`` inside
tf.data, in parallel. Memory holds the list of records (file names), the shuffle buffer (of file
names, or of at most :data:`SHUFFLE_BUFFER` serialized records) and the batches being prefetched:
not the decoded split, whatever its size.

:func:`decode_records` checks every image as it decodes it: first the pixel budget from its header
(:func:`~uniclr_tf.data.decode.check_budget`: an image declaring more than ``max_image_pixels``, or
whose header does not tell its size, is bad and never decoded), then ``decode_image``'s rule (TensorFlow's
decoder, native channels, the first frame of an animation, alpha dropped), then the split's
channels (grey repeated to RGB; RGB averaged to grey only in a ``tfrecord:`` split whose sample was
grey) and its size (resized to ``image_size``, else an image of another size is bad). A record
that fails:

* by default stops the pipeline: the error raised from the iterator carries
  ``[uniclr_tf: bad image] NAME: REASON [/uniclr_tf]``, and :func:`bad_file_message` turns it
  into the one-line message ``NAME: REASON`` (the train CLI prints it);
* with ``skip_bad_files`` (a :class:`BadFiles` given) is dropped, named once on stderr, and
  recorded in the :class:`BadFiles` (``names()`` after the run).
"""

from __future__ import annotations

import re
import sys
from typing import Callable, Optional

from uniclr_tf.data.decode import budget_status
from uniclr_tf.data.lazy_tf import AUTOTUNE, tf
from uniclr_tf.data.resize import resize_uint8

#: Records held in the shuffle buffer of a stream that cannot shuffle its whole record list
#: (TFDS splits, TFRecord files: serialized records, not decoded images).
SHUFFLE_BUFFER = 10_000
#: ... and at most this many MB of them: large records get a shorter buffer (:func:`shuffle_buffer`).
SHUFFLE_BUFFER_MB = 256


def shuffle_buffer(mean_record_bytes):
    """Records in a shuffle buffer of records of ``mean_record_bytes`` on average: at most
    :data:`SHUFFLE_BUFFER`, and at most :data:`SHUFFLE_BUFFER_MB` of them (at least 64)."""
    if not mean_record_bytes or mean_record_bytes <= 0:
        return SHUFFLE_BUFFER
    return int(max(64, min(SHUFFLE_BUFFER, SHUFFLE_BUFFER_MB * 2 ** 20 // mean_record_bytes)))

_MARKER, _END = "[uniclr_tf: bad image] ", " [/uniclr_tf]"
_BAD_FILE_RE = re.compile(re.escape(_MARKER) + r"(.*?)" + re.escape(_END), re.S)
_OK, _UNDECODABLE, _WRONG_SIZE, _OVER_BUDGET = 0, 1, 2, 3
UNDECODABLE = "cannot decode image (truncated or not an image)"  # decode_image's reason


def shuffled_indices(n, seed, repeat=False):
    """``0 .. n-1`` (int64) in a new order each pass, one pass or endless passes (``repeat``).

    Pass ``p``'s order is a permutation of ``(seed, p)`` alone (stateless). tf.data's
    ``shuffle(reshuffle_each_iteration=True)`` draws each pass's seed from a generator that every
    iterator of the dataset shares, so an iterator made and read ahead before training (Keras's
    first build under a tf.distribute strategy reads a batch, and its prefetching runs on) moved the
    training order by how far it had run: a 2-worker TF job trained on other batches than its
    1-process twin one time in a few on a loaded machine."""
    def one_pass(index):
        return tf.random.experimental.stateless_shuffle(tf.range(n, dtype=tf.int64),
                                                        seed=tf.stack([tf.constant(seed, tf.int64), index]))
    # map + unbatch of [n] permutations keeps the count known (flat_map would not, and tf.distribute
    # then rebatches to per-replica batches of shape (None, ...), which static-shape steps refuse).
    passes = tf.data.Dataset.counter() if repeat else tf.data.Dataset.range(1)
    return passes.map(one_pass).unbatch()


class Stream:
    """How a streamed split is read: its records, then their decoding.

    Args:
      records: ``records(shuffle, seed, repeat)`` -> unbatched ``tf.data.Dataset`` of the split's
        records (2-tuples of tensors): one pass (endless passes when ``repeat``), in their fixed
        order, or shuffled when ``shuffle``, every pass in a new order determined by ``seed``.
      decode: ``decode(dataset of records)`` -> dataset of ``(image, label)``
        (:func:`decode_records`); None when the records are ``(image, label)`` already.
    """

    def __init__(self, records: Callable, decode: Optional[Callable] = None):
        self._records, self._decode = records, decode

    def records(self, shuffle: bool = False, seed: int = 0, repeat: bool = False) -> tf.data.Dataset:
        """The undecoded records, in the split's order or shuffled; one pass, or endless passes."""
        return self._records(shuffle, seed, repeat)

    def decode(self, records: tf.data.Dataset) -> tf.data.Dataset:
        """``(image uint8 [H, W, C], label int64)`` of each record (bad ones handled as set up)."""
        return records if self._decode is None else self._decode(records)

    def dataset(self) -> tf.data.Dataset:
        """The split's examples in its fixed order, decoded as they are read."""
        return self.decode(self.records())


def list_records(first, second):
    """``records(shuffle, seed, repeat)`` of a record list held as two parallel lists (file names
    and labels): a shuffle permutes the whole list (cheap: names, not images), each pass by a
    permutation of ``(seed, pass)`` alone (:func:`shuffled_indices`)."""
    count = len(first)

    def records(shuffle, seed, repeat=False):
        if not (shuffle and count):
            ds = tf.data.Dataset.from_tensor_slices((first, second))
            return ds.repeat() if repeat else ds
        names, labels = tf.constant(first), tf.constant(second)
        return shuffled_indices(count, seed, repeat).map(lambda i: (tf.gather(names, i), tf.gather(labels, i)))
    return records


def dataset_records(dataset, count):
    """``records(shuffle, seed, repeat)`` of a dataset (a TFDS split): shuffled through a buffer of
    at most :data:`SHUFFLE_BUFFER` records, a new order each pass (tf.data's reshuffling: the
    orders depend on how many iterators of the dataset were made before)."""
    def records(shuffle, seed, repeat=False):
        ds = dataset
        if shuffle and count:
            ds = ds.shuffle(min(count, SHUFFLE_BUFFER), seed=seed, reshuffle_each_iteration=True)
        return ds.repeat() if repeat else ds
    return records


class BadFiles:
    """The bad images met while streaming with ``skip_bad_files``: each is dropped from the
    stream, named on stderr the first time it is met, and recorded (a TensorFlow hash table, so
    tf.data can update it from its own threads)."""

    def __init__(self):
        self._seen = tf.lookup.experimental.MutableHashTable(tf.string, tf.int64, default_value=0)

    def keep(self, status, name, reason):
        """Inside tf.data: True for a good image; for a bad one, records it and returns False."""
        def drop():
            def announce():
                tf.print(tf.strings.join(["warning: skipping ", name, ": ", reason, " (found while streaming)"]),
                         output_stream=sys.stderr)
                return tf.constant(True)
            new = tf.equal(self._seen.lookup(name), 0)
            said = tf.cond(new, announce, lambda: tf.constant(False))
            with tf.control_dependencies([said, self._seen.insert(name, tf.constant(1, tf.int64))]):
                return tf.constant(False)
        return tf.cond(tf.equal(status, _OK), lambda: tf.constant(True), drop)

    def names(self):
        """The bad images found so far (file names, or TFRecord record names), sorted."""
        keys, _ = self._seen.export()
        return sorted(k.decode("utf-8", "replace") for k in keys.numpy())


def _to_channels(image, channels):
    """``decode_image``'s native channels (1 to 4) -> ``channels``: alpha dropped, grey repeated to
    RGB (or RGB averaged to grey, for a grey ``tfrecord:`` split)."""
    count = tf.shape(image)[-1]
    if channels == 1:
        image = tf.cond(count >= 3, lambda: tf.image.rgb_to_grayscale(image[..., :3]), lambda: image[..., :1])
    else:
        image = tf.cond(count >= 3, lambda: image[..., :3], lambda: tf.tile(image[..., :1], [1, 1, 3]))
    return tf.ensure_shape(image, (None, None, channels))


def header_check(raw, max_pixels=None):
    """Inside tf.data: ``(code, reason)`` of :func:`~uniclr_tf.data.decode.budget_status` for the
    encoded image ``raw`` (int32 0 within the budget, else the reason it is bad, as a string)."""
    code, why = tf.numpy_function(lambda r: budget_status(r, max_pixels or 0), [raw], [tf.int32, tf.string],
                                  stateful=False)
    return tf.ensure_shape(code, ()), tf.ensure_shape(why, ())


def decode_records(records, load, describe, image_shape, resize, bad_files=None, max_pixels=None):
    """Decodes a dataset of records into ``(image uint8 image_shape, label int64)``, checking each.

    Args:
      records: unbatched dataset of 2-tuples.
      load: ``load(a, b)`` -> ``(file bytes, label int64, name string)`` of a record (runs in tf.data).
      describe: ``describe(a, b)`` -> ``(label, name)`` without reading the image (for a bad one).
      image_shape: ``(H, W, C)`` of every output image.
      resize: resize each image to ``(H, W)`` (bilinear, antialiased, as in-memory data); False:
        an image of another size is bad.
      bad_files: None: a bad image stops the pipeline with an error naming it; a :class:`BadFiles`:
        bad images are dropped and recorded there.
      max_pixels: the pixel budget (``--max_image_pixels``; None: the default), checked from each
        image's header before it is decoded.

    Each record is decoded in its own small dataset (``ignore_errors`` then a fallback element), run
    in parallel by a deterministic ``interleave``: the result keeps the record order, and a failure
    is known with the record's name.
    """
    height, width, channels = image_shape

    def decode_checked(raw):
        image = _to_channels(tf.io.decode_image(raw, channels=0, dtype=tf.uint8, expand_animations=False),
                             channels)
        size = tf.shape(image)[:2]
        same = tf.reduce_all(tf.equal(size, [height, width]))
        if resize:
            image = tf.cond(same, lambda: image, lambda: resize_uint8(image, (height, width)))
            status = tf.constant(_OK)
        else:
            image = tf.cond(same, lambda: tf.reshape(image, image_shape),
                            lambda: tf.zeros(image_shape, tf.uint8))
            status = tf.where(same, _OK, _WRONG_SIZE)
        return tf.ensure_shape(image, image_shape), status, size

    def decode(a, b):
        raw, label, name = load(a, b)
        code, why = header_check(raw, max_pixels)  # the budget, from the header: nothing decoded yet
        image, status, size = tf.cond(
            tf.equal(code, _OK), lambda: decode_checked(raw),
            lambda: (tf.zeros(image_shape, tf.uint8), code, tf.zeros((2,), tf.int32)))
        return image, label, status, name, size, why

    def failed(a, b):
        label, name = describe(a, b)
        return (tf.zeros(image_shape, tf.uint8), label, tf.constant(_UNDECODABLE), name, tf.zeros((2,), tf.int32),
                tf.constant(""))

    def one(a, b):
        record = tf.data.Dataset.from_tensors((a, b))
        return record.map(decode).ignore_errors().concatenate(record.map(failed)).take(1)

    def reason(status, size, why):
        wrong_size = tf.strings.format("image is {}x{} but the dataset's images are {}x{}; pass image_size "
                                       "(--image_size) to resize", (size[0], size[1], height, width))
        return tf.where(tf.not_equal(why, ""), why,
                        tf.where(tf.equal(status, _WRONG_SIZE), wrong_size, tf.constant(UNDECODABLE)))

    ds = records.interleave(one, block_length=1, num_parallel_calls=AUTOTUNE, deterministic=True)
    if bad_files is None:
        def check(image, label, status, name, size, why):
            message = tf.strings.join([_MARKER, name, ": ", reason(status, size, why), _END])
            with tf.control_dependencies([tf.debugging.Assert(tf.equal(status, _OK), [message])]):
                return tf.identity(image), label
        return ds.map(check)
    ds = ds.filter(lambda image, label, status, name, size, why: bad_files.keep(status, name,
                                                                                reason(status, size, why)))
    return ds.map(lambda image, label, *_: (image, label))


def _crc32c_table():
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC32C = _crc32c_table()


def _masked_crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def check_tfrecord_file(path, stop_at=None):
    """Walks the record framing of a TFRecord file (each record's length and its checksum; the data
    is skipped, not read): ``(records, problem, offset)``, ``problem`` None for a whole file, else
    why the record at byte ``offset`` cannot be read (the file is cut short, or a length is damaged),
    ``records`` the intact records before it. ``stop_at``: stop at the first record at or after
    that byte offset (``problem`` None if one starts exactly there)."""
    import os
    import struct
    records, at = 0, 0
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        while at < size:
            if stop_at is not None and at >= stop_at:
                return records, (None if at == stop_at else "no record starts there"), at
            f.seek(at)
            head = f.read(12)
            if len(head) < 12:
                return records, f"truncated record at byte {at:,} (the file is cut short)", at
            (length,), crc = struct.unpack("<Q", head[:8]), struct.unpack("<I", head[8:])[0]
            if _masked_crc32c(head[:8]) != crc:
                return records, f"corrupted record at byte {at:,} (its length is damaged)", at
            if at + 16 + length > size:
                return records, f"truncated record at byte {at:,} (the file is cut short)", at
            at += 16 + length
            records += 1
    if stop_at is not None:
        return records, "no record starts there", at
    return records, None, at


#: TFRecord files being streamed (registered by the ``tfrecord:`` source): an error that names a
#: byte offset and no file is traced back to the file there (:func:`bad_file_message`).
_TFRECORD_FILES = set()
_DAMAGED_RECORD_RE = re.compile(r"(truncated|corrupted) record at (\d+)")


def register_tfrecord_files(files):
    _TFRECORD_FILES.update(files)


def _record_data_intact(path, start):
    """Whether the data of the record at byte ``start`` of a TFRecord file passes its checksum."""
    import struct
    try:
        with open(path, "rb") as f:
            f.seek(start)
            (length,) = struct.unpack("<Q", f.read(8))
            f.seek(start + 12)
            data, crc = f.read(length), f.read(4)
        return len(crc) == 4 and _masked_crc32c(data) == struct.unpack("<I", crc)[0]
    except (OSError, struct.error):
        return False


def _damaged_shard(kind, offset):
    """``SHARD: REASON`` of the registered TFRecord file whose record at byte ``offset`` is damaged."""
    candidates = []
    for path in sorted(_TFRECORD_FILES):
        for start in (offset, offset - 12):  # TensorFlow names a record's start, or its data's (12 bytes on)
            try:
                records, problem, at = check_tfrecord_file(path, stop_at=start)
            except OSError:
                break
            if at == start and start >= 0:
                intact = problem is None and _record_data_intact(path, start)
                candidates.append((0 if problem else 1 if not intact else 2, path, problem, records))
                break
    if not candidates:
        return (f"{kind} record at byte {offset:,} in one of the {len(_TFRECORD_FILES)} TFRecord files read; a "
                "file is damaged: write it again")
    _, path, problem, records = min(candidates)
    what = problem or f"{kind} record at byte {offset:,} (record {records}: its data fails its checksum)"
    return f"{path}: {what}; the file is damaged: write it again"


def bad_file_message(error: BaseException) -> Optional[str]:
    """``NAME: REASON`` when ``error`` comes from a bad image in a stream (its message carries the
    marker :func:`decode_records` puts there), or from a damaged TFRecord file (TensorFlow names
    the byte offset only: the file is found), else None."""
    text = str(error)
    match = _BAD_FILE_RE.search(text)
    if match:
        return match.group(1)
    damaged = _DAMAGED_RECORD_RE.search(text) if _TFRECORD_FILES else None
    if damaged:
        return _damaged_shard(damaged.group(1), int(damaged.group(2)))
    return None
