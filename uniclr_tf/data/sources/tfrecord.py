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

Files: at load every file's record framing is walked (lengths and their checksums, the data
skipped): a file cut short or with a damaged length stops loading naming it and the byte, or with
``skip_bad_files`` only its records before the damage are read. Damage found later (a record's data
failing its checksum while streaming) names the file too (:func:`~uniclr_tf.data.stream.bad_file_message`),
or with ``skip_bad_files`` ends that file's records there.

Reading: the files in sorted order, interleaved (at most 16 open at once, deterministic);
``pretrain_dataset`` shuffles the file order every epoch, then the records through a buffer of at
most :data:`~uniclr_tf.data.stream.SHUFFLE_BUFFER` serialized records and at most
:data:`~uniclr_tf.data.stream.SHUFFLE_BUFFER_MB` MB of them (from the files' mean record size).
Per-worker sharding is tf.data's and Keras's (auto-sharding by file).
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
from uniclr_tf.data.sources.common import _empty_split, _make_info, _note, _percent, _with_fingerprints
from uniclr_tf.data.spec import DataError, Split
from uniclr_tf.data.stats import _channel_stats
from uniclr_tf.data.stream import (SHUFFLE_BUFFER, BadFiles, Stream, bad_file_message, check_tfrecord_file,
                                   decode_records, register_tfrecord_files, shuffle_buffer)

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


def _records(files, holdout=None, shuffle=False, seed=0, limit=None, intact=None, buffer=SHUFFLE_BUFFER,
             skip_damage=False):
    """``(serialized record, name)`` of ``files`` interleaved; ``holdout=(fraction, side)`` keeps
    the held-out side (``"test"``) or the rest (``"train"``); ``limit``: the first ``limit`` records
    in file order only (the same ones however shuffled); ``intact``: ``{file: records}`` of damaged
    files (only their records before the damage are read); ``buffer``: the shuffle buffer's records;
    ``skip_damage``: damage met while reading ends that file's records (else it is an error)."""
    intact = intact or {}

    def read(path, count):
        ds = tf.data.TFRecordDataset(path).take(count)
        if skip_damage:
            ds = ds.ignore_errors(log_warning=True)
        return ds.enumerate().map(
            lambda i, record: (record, tf.strings.join([path, " record ", tf.strings.as_string(i)])))

    ds = tf.data.Dataset.from_tensor_slices((tf.constant(files, tf.string),
                                             tf.constant([intact.get(f, -1) for f in files], tf.int64)))
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
        ds = ds.shuffle(min(limit or buffer, buffer), seed=seed, reshuffle_each_iteration=True)
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


def _damage_message(error):
    """``FILE: REASON (...)`` of a damaged TFRecord file met while reading at load, else None."""
    found = bad_file_message(error)
    return f"{found}; --skip_bad_files ends that file's records there" if found else None


def _check_files(files, opts):
    """``{file: intact records}`` of the damaged files (``skip_bad_files``: each named once, only its
    records before the damage read), after walking every file's record framing; without
    ``skip_bad_files`` a damaged file is a DataError naming it and the byte."""
    intact = {}
    for path in files:
        try:
            records, problem, _ = check_tfrecord_file(path)
        except OSError as e:
            raise DataError(f"{path}: cannot read the file ({e.strerror or e})") from None
        if problem is None:
            continue
        if not opts.skip_bad_files:
            raise DataError(f"{path}: {problem}; write the file again, or pass --skip_bad_files to read its "
                            f"{records} record(s) before the damage")
        logging.warning("%s: %s; reading its %d record(s) before the damage (--skip_bad_files)", path, problem,
                        records)
        intact[path] = records
    return intact


def _count(files, holdout, where, intact=None, skip_damage=False):
    """``({"train": n, "test": m}, (lowest label, highest label))`` of ``files``' records (all in
    ``"train"`` unless ``holdout``): one pass, no image decoded."""
    def fields(record, name):
        label = tf.io.parse_single_example(record, {"image/class/label": _features()["image/class/label"]})
        bucket = tf.strings.to_hash_bucket_fast(record, _HASH_BUCKETS)
        return label["image/class/label"], bucket

    counts, low, high = {"train": 0, "test": 0}, None, None
    threshold = int(round(holdout * _HASH_BUCKETS)) if holdout else -1
    try:
        records = _records(files, intact=intact, skip_damage=skip_damage)
        for labels, buckets in (records.map(fields, num_parallel_calls=AUTOTUNE).batch(8192)
                                .as_numpy_iterator()):
            test = buckets < threshold
            counts["test"] += int(test.sum())
            counts["train"] += int((~test).sum())
            low = labels.min() if low is None else min(low, labels.min())
            high = labels.max() if high is None else max(high, labels.max())
    except tf.errors.OpError as e:
        raise DataError(_damage_message(e)
                        or f"{where}: cannot read the records ({e.message.splitlines()[0]})") from None
    return counts, (low, high)


def _fingerprints(files, holdout, where, intact, limit, skip_damage=False):
    """``(train side, test side)``: uint64 hashes of the image bytes of ``files``' records as the
    splits read them (held out by ``holdout``, else all on the train side; the first ``limit`` of each)."""
    def fields(record, name):
        encoded = tf.io.parse_single_example(record, {"image/encoded": _features()["image/encoded"]})
        return encoded["image/encoded"], tf.strings.to_hash_bucket_fast(record, _HASH_BUCKETS)

    threshold = int(round(holdout * _HASH_BUCKETS)) if holdout else -1
    sides = {"train": [], "test": []}
    try:
        records = _records(files, intact=intact, skip_damage=skip_damage)
        batches = records.map(fields, num_parallel_calls=AUTOTUNE).batch(4096)
        for encoded, buckets in batches:
            prints = tf.bitcast(tf.fingerprint(encoded), tf.uint64).numpy()
            test = buckets.numpy() < threshold
            sides["test"].append(prints[test])
            sides["train"].append(prints[~test])
    except tf.errors.OpError as e:
        raise DataError(_damage_message(e)
                        or f"{where}: cannot read the records ({e.message.splitlines()[0]})") from None
    out = [np.concatenate(sides[side]) if sides[side] else np.zeros((0,), np.uint64) for side in ("train", "test")]
    return tuple(fp[:limit] if limit else fp for fp in out)


def _sample(files, opts, where, channels, intact=None):
    """Decodes the first :data:`STATS_SAMPLE` train records: ``(images uint8 [n, H, W, C], (H, W), C)``."""
    images, names = [], []
    try:
        records = _records(files, intact=intact, skip_damage=opts.skip_bad_files)
        for raw, _, name in records.take(STATS_SAMPLE).map(_load).as_numpy_iterator():
            name = name.decode("utf-8", "replace")
            try:
                image = decode_image(raw, "tensorflow", max_pixels=opts.max_image_pixels)
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
        raise DataError(_damage_message(e)
                        or f"{where}: cannot read the records ({e.message.splitlines()[0]})") from None
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
    all_files = sorted(set(train_files) | set(test_files or []))
    intact = _check_files(all_files, opts)
    register_tfrecord_files(all_files)
    total_bytes = sum(os.path.getsize(f) for f in all_files)

    counts, meta, labels_high = {}, None, None
    for side, files in (("train", train_files), ("test", test_files if holdout is None else None)):
        if not files:
            continue
        found, found_side = _sidecar(files)
        if found is not None and holdout is None:
            counts[side] = int(found["splits"][found_side]["count"])
        else:
            n, (_, high) = _count(files, holdout, spec, intact, opts.skip_bad_files)
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
    sample, size, channels = _sample(sample_files, opts, spec, channels, intact)
    image_shape = (*size, channels)
    mean, std = _channel_stats([sample], channels) if train_files else ((0.5,) * channels, (0.5,) * channels)
    bad_files = BadFiles() if opts.skip_bad_files else None
    buffer = shuffle_buffer(total_bytes / max(1, sum(counts.values())))

    def split(name, files, side):
        if not files:
            return _empty_split(name, image_shape)
        keep = (holdout, side) if holdout is not None else None

        def records(shuffle, seed, repeat=False):  # reshuffled each pass by tf.data (see Stream)
            ds = _records(files, keep, shuffle, seed, opts.max_examples, intact, buffer, opts.skip_bad_files)
            return ds.repeat() if repeat else ds

        return Split(name, counts.get(side, 0), stream=Stream(
            records, lambda ds: decode_records(ds, _load, _describe, image_shape, opts.size is not None, bad_files,
                                               max_pixels=opts.max_image_pixels)))

    if holdout is not None:
        train, test = split("train", train_files, "train"), split("test", train_files, "test")
    else:
        train, test = split("train", train_files, "train"), split("test", test_files, "test")
    name = (meta or {}).get("name") or os.path.basename(train_glob)
    info = _make_info(name=name, spec=spec, train=train, test=test, num_classes=num_classes,
                      class_names=class_names, mean=mean, std=std, image_shape=image_shape, notes=notes,
                      bad_files=bad_files)
    if not opts.check_duplicates or (opts.splits == "all" and not (test_files or holdout is not None)):
        return info
    if holdout is not None:
        train_fp, test_fp = _fingerprints(train_files, holdout, spec, intact, opts.max_examples, opts.skip_bad_files)
    else:
        skip = opts.skip_bad_files
        train_fp = _fingerprints(train_files, None, spec, intact, opts.max_examples, skip)[0] if train_files else None
        test_fp = _fingerprints(test_files, None, spec, intact, opts.max_examples, skip)[0] if test_files else None
    return _with_fingerprints(info, train=train_fp, test=test_fp)
