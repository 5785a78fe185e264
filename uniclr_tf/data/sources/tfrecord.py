"""``tfrecord:TRAIN_GLOB[,TEST_GLOB]``: ``tf.train.Example`` records of encoded images, streamed.

The feature spec (what ``python -m uniclr_tf.tools.folder_to_tfrecord`` writes):

=====================  =======  ===========================================================
``image/encoded``      bytes    the image file's bytes: PNG or JPEG (GIF, BMP and WebP too:
                                whatever :func:`~uniclr_tf.data.decode.decode_image` reads). Required.
``image/class/label``  int64    class index in ``[0, classes)``, ``-1`` when unlabelled (the
                                default when absent).
``image/height``       int64    optional, informational (the tool writes them).
``image/width``        int64    optional, informational.
``image/filename``     bytes    optional: the source file, named in bad-image messages (else
                                ``SHARD record I``).
``image/format``       bytes    optional, informational (``png``, ``jpeg``, ...).
=====================  =======  ===========================================================

Splits: the first glob gives the train split, the second (after a comma) the test split.
Without a test glob (and without ``eval_spec``), ``holdout_fraction`` of the train records are
held out for test, chosen by a hash of each record's bytes (deterministic, independent of the
record order and of sharding; duplicates fall on the same side).

Counts and class names come from the JSON the tool writes beside the shards (a ``*.json`` in the
shards' folder whose splits list exactly the matched files); without one, or when records are held
out, one pass at load reads every record (no image is decoded) to count them and find the labels.

Images: ``image_size``, else the first sample image's size (another size is then a bad image);
channels: the JSON's, else 3 if any sample image has colour, else 1 (a colour image met later
in a grey split is converted to grey). The sample: the first :data:`STATS_SAMPLE` train records in
file order, decoded in full at load (the per-channel mean / std are theirs; a bad one stops
loading naming it, or is left out with ``skip_bad_files``). While streaming, every record is
decoded and checked as it is read (:func:`~uniclr_tf.data.stream.decode_records`).

Reading: the files in sorted order, interleaved (at most 16 open at once, deterministic);
``pretrain_dataset`` shuffles the file order every epoch, then the records through a buffer of
:data:`~uniclr_tf.data.stream.SHUFFLE_BUFFER` serialized records. Per-worker sharding is
tf.data's and Keras's (auto-sharding by file).
"""

from __future__ import annotations

import glob
import json
import os

import numpy as np
from absl import logging

from uniclr_tf.data.decode import ImageDecodeError, decode_image
from uniclr_tf.data.lazy_tf import AUTOTUNE, have_tensorflow, tf
from uniclr_tf.data.resize import resize_uint8
from uniclr_tf.data.sources.common import _empty_split, _make_info, _note, _percent
from uniclr_tf.data.spec import DataError, Split
from uniclr_tf.data.stats import _channel_stats
from uniclr_tf.data.stream import SHUFFLE_BUFFER, BadFiles, Stream, decode_records

#: Train records decoded at load: the image shape and channels, the per-channel mean / std.
STATS_SAMPLE = 2_000
#: The ``format`` entry of the JSON written beside the shards.
JSON_FORMAT = "uniclr_tf.tfrecord/1"
_CYCLE = 16  # files read at once
_HASH_BUCKETS = 1_000_000  # hold-out resolution


def _features():
    return {"image/encoded": tf.io.FixedLenFeature([], tf.string),
            "image/class/label": tf.io.FixedLenFeature([], tf.int64, default_value=-1),
            "image/filename": tf.io.FixedLenFeature([], tf.string, default_value="")}


def encode_example(raw: bytes, label: int = -1, height: int = 0, width: int = 0, filename: str = "",
                   image_format: str = "") -> bytes:
    """One serialized ``tf.train.Example`` of the feature spec (see the module docstring)."""
    def b(value):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    def i(value):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(value)]))

    feature = {"image/encoded": b(raw), "image/class/label": i(label)}
    if height and width:
        feature.update({"image/height": i(height), "image/width": i(width)})
    if filename:
        feature["image/filename"] = b(filename.encode())
    if image_format:
        feature["image/format"] = b(image_format.encode())
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _parse_spec(spec):
    """``tfrecord:TRAIN_GLOB[,TEST_GLOB]`` -> ``(train glob, test glob or None)``."""
    globs = [g.strip() for g in spec[len("tfrecord:"):].split(",")]
    if not globs[0] or len(globs) > 2 or (len(globs) == 2 and not globs[1]):
        raise ValueError(f"dataset spec {spec!r}: expected tfrecord:TRAIN_GLOB or tfrecord:TRAIN_GLOB,TEST_GLOB")
    return globs[0], (globs[1] if len(globs) == 2 else None)


def _match(pattern, spec):
    files = sorted(glob.glob(os.path.expanduser(pattern)))
    if not files:
        raise DataError(f"{spec}: no file matches {pattern}")
    return [os.path.abspath(f) for f in files]


def _sidecar(files):
    """``(json dict, split name)`` of the tool's JSON beside ``files`` that lists exactly them, or
    ``(None, None)``."""
    names = sorted(os.path.basename(f) for f in files)
    for path in sorted(glob.glob(os.path.join(os.path.dirname(files[0]), "*.json"))):
        try:
            with open(path) as f:
                meta = json.load(f)
        except (OSError, ValueError):
            continue
        if not isinstance(meta, dict) or meta.get("format") != JSON_FORMAT:
            continue
        for split, entry in (meta.get("splits") or {}).items():
            if sorted(entry.get("files") or []) == names:
                return meta, split
    return None, None


def _records(files, holdout=None, shuffle=False, seed=0, limit=None):
    """``(serialized record, name)`` of ``files`` interleaved; ``holdout=(fraction, side)`` keeps
    the held-out side (``"test"``) or the rest (``"train"``); ``limit``: the first ``limit`` records
    in file order only (the same ones however shuffled)."""
    def read(path):
        return tf.data.TFRecordDataset(path).enumerate().map(
            lambda i, record: (record, tf.strings.join([path, " record ", tf.strings.as_string(i)])))

    ds = tf.data.Dataset.from_tensor_slices(files)
    if shuffle and not limit:
        ds = ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    ds = ds.interleave(read, cycle_length=min(len(files), _CYCLE), block_length=1, num_parallel_calls=AUTOTUNE,
                       deterministic=True)
    if holdout is not None:
        fraction, side = holdout
        threshold = int(round(fraction * _HASH_BUCKETS))

        def held_out(record, name):
            return tf.strings.to_hash_bucket_fast(record, _HASH_BUCKETS) < threshold
        ds = ds.filter(held_out if side == "test" else lambda record, name: tf.logical_not(held_out(record, name)))
    if limit:
        ds = ds.take(limit)
    if shuffle:
        ds = ds.shuffle(min(limit or SHUFFLE_BUFFER, SHUFFLE_BUFFER), seed=seed, reshuffle_each_iteration=True)
    return ds


def _parsed(record, name):
    example = tf.io.parse_single_example(record, _features())
    filename = example["image/filename"]
    return example, tf.where(tf.equal(filename, ""), name, filename)


def _load(record, name):
    example, name = _parsed(record, name)
    return example["image/encoded"], example["image/class/label"], name


def _describe(record, name):
    example, name = _parsed(record, name)
    return example["image/class/label"], name


def _count(files, holdout, where):
    """``({"train": n, "test": m}, (lowest label, highest label))`` of ``files``' records (all in
    ``"train"`` unless ``holdout``): one pass, no image decoded."""
    def fields(record, name):
        label = tf.io.parse_single_example(record, {"image/class/label": _features()["image/class/label"]})
        bucket = tf.strings.to_hash_bucket_fast(record, _HASH_BUCKETS)
        return label["image/class/label"], bucket

    counts, low, high = {"train": 0, "test": 0}, None, None
    threshold = int(round(holdout * _HASH_BUCKETS)) if holdout else -1
    try:
        for labels, buckets in _records(files).map(fields, num_parallel_calls=AUTOTUNE).batch(8192).as_numpy_iterator():
            test = buckets < threshold
            counts["test"] += int(test.sum())
            counts["train"] += int((~test).sum())
            low = labels.min() if low is None else min(low, labels.min())
            high = labels.max() if high is None else max(high, labels.max())
    except tf.errors.OpError as e:
        raise DataError(f"{where}: cannot read the records ({e.message.splitlines()[0]})") from None
    return counts, (low, high)


def _sample(files, opts, where, channels):
    """Decodes the first :data:`STATS_SAMPLE` train records: ``(images uint8 [n, H, W, C], (H, W), C)``."""
    images, names = [], []
    try:
        for raw, _, name in _records(files).take(STATS_SAMPLE).map(_load).as_numpy_iterator():
            name = name.decode("utf-8", "replace")
            try:
                image = decode_image(raw, "tensorflow")
                if opts.size is None and images and image.shape[:2] != images[0].shape[:2]:
                    h, w = images[0].shape[:2]
                    raise ImageDecodeError(f"image is {image.shape[0]}x{image.shape[1]} but the first image "
                                           f"({names[0]}) is {h}x{w}; pass image_size to resize")
            except ImageDecodeError as e:
                if not opts.skip_bad_files:
                    raise DataError(f"{name}: {e.args[0]}") from None
                logging.warning("%s: %s (left out of the statistics; skipped while streaming)", name, e.args[0])
                continue
            images.append(image)
            names.append(name)
    except tf.errors.OpError as e:
        raise DataError(f"{where}: cannot read the records ({e.message.splitlines()[0]})") from None
    if not images:
        raise DataError(f"{where}: no readable image in the first {STATS_SAMPLE} records")
    channels = channels or (1 if all(im.shape[-1] == 1 for im in images) else 3)
    size = opts.size or images[0].shape[:2]
    out = np.empty((len(images), *size, channels), np.uint8)
    for i, image in enumerate(images):
        if image.shape[-1] == 3 and channels == 1:
            image = tf.image.rgb_to_grayscale(image).numpy()
        if image.shape[:2] != tuple(size):
            image = resize_uint8(image, size).numpy()
        out[i] = image
    return out, tuple(size), channels


def _load_tfrecord(spec, opts):
    """TFRecord shards of ``tf.train.Example`` images (see the module docstring), streamed."""
    if not have_tensorflow():
        raise DataError(f"{spec}: reading TFRecord files needs TensorFlow (tf.data), which is not installed here")
    train_glob, test_glob = _parse_spec(spec)
    notes = []
    train_files = _match(train_glob, spec)
    test_files = _match(test_glob, spec) if test_glob else None
    if opts.splits == "test":  # the test split of another spec's training data: the test glob, else all
        train_files, test_files = [], test_files or train_files
    elif opts.splits == "train":
        test_files = []
    holdout = opts.holdout_fraction if test_files is None else None
    first = "train" if train_files else "test"  # the split whose labels and images set the classes and shape

    counts, meta, labels_high = {}, None, None
    for side, files in (("train", train_files), ("test", test_files if holdout is None else None)):
        if not files:
            continue
        found, found_side = _sidecar(files)
        if found is not None and holdout is None:
            counts[side] = int(found["splits"][found_side]["count"])
        else:
            n, (_, high) = _count(files, holdout, spec)
            counts.update(n if holdout is not None else {side: n["train"]})
            labels_high = high if side == first else labels_high
        meta = meta or (found if side == first else None)
    class_names = tuple(meta["class_names"]) if meta and meta.get("class_names") else None
    num_classes = len(class_names) if class_names else (
        int(labels_high) + 1 if labels_high is not None and labels_high >= 0 else None)
    if holdout is not None:
        _note(notes, f"{spec}: no test split; holding out {_percent(holdout)} ({counts['test']} images, by a hash "
                     "of each record) as test")
    if opts.max_examples:
        counts = {side: min(n, opts.max_examples) for side, n in counts.items()}

    sample_files = train_files or test_files
    channels = opts.channels or (int(meta["channels"]) if meta and meta.get("channels") else None)
    sample, size, channels = _sample(sample_files, opts, spec, channels)
    image_shape = (*size, channels)
    mean, std = _channel_stats([sample], channels) if train_files else ((0.5,) * channels, (0.5,) * channels)
    bad_files = BadFiles() if opts.skip_bad_files else None

    def split(name, files, side):
        if not files:
            return _empty_split(name, image_shape)
        keep = (holdout, side) if holdout is not None else None

        def records(shuffle, seed, repeat=False):  # reshuffled each pass by tf.data (see Stream)
            ds = _records(files, keep, shuffle, seed, opts.max_examples)
            return ds.repeat() if repeat else ds

        return Split(name, counts.get(side, 0), stream=Stream(
            records, lambda ds: decode_records(ds, _load, _describe, image_shape, opts.size is not None, bad_files)))

    if holdout is not None:
        train, test = split("train", train_files, "train"), split("test", train_files, "test")
    else:
        train, test = split("train", train_files, "train"), split("test", test_files, "test")
    name = (meta or {}).get("name") or os.path.basename(train_glob)
    return _make_info(name=name, spec=spec, train=train, test=test, num_classes=num_classes,
                      class_names=class_names, mean=mean, std=std, image_shape=image_shape, notes=notes,
                      bad_files=bad_files)
