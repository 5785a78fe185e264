"""``tfds:NAME[:SPLIT]``: a TensorFlow Datasets image dataset, streamed from its TFRecords.

``tensorflow_datasets`` is imported only when such a spec is loaded. The test split is ``test``,
else ``validation``, else the last ``holdout_fraction`` of the train split. The examples stream,
shuffled through a buffer of :data:`~uniclr_tf.data.stream.SHUFFLE_BUFFER`. Images stored encoded
(an ``Image`` feature: PNG or JPEG) are decoded here, not by TFDS, through
:func:`~uniclr_tf.data.stream.decode_records`: the pixel budget (``max_image_pixels``) is checked
from each image's header before it is decoded, and a bad one is named (``tfds:NAME:SPLIT example
I``).
"""

from __future__ import annotations

import re

import numpy as np
from absl import logging

from uniclr_tf.data.lazy_tf import AUTOTUNE, tf
from uniclr_tf.data.resize import resize_uint8
from uniclr_tf.data.sources.common import _make_info, _note, _percent
from uniclr_tf.data.spec import DataError, Split, _parse_tfds_spec
from uniclr_tf.data.stats import _channel_stats
from uniclr_tf.data.stream import BadFiles, Stream, dataset_records, decode_records

_TFDS_STATS_SAMPLE = 2_000  # images read for the per-channel mean / std (streamed data must be read to be measured)


def _first_line(error):
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _load_tfds(spec, opts):
    """A TFDS image dataset, streamed; the test split is 'test', else 'validation', else held out."""
    import tensorflow_datasets as tfds  # lazy: importing it costs time and most runs don't need it

    size, max_examples = opts.size, opts.max_examples
    name, split = _parse_tfds_spec(spec)
    notes = []
    where = f"tfds:{name}"
    builder = _builder(tfds, name, opts.data_dir, where)
    features = builder.info.features
    shape = _image_shape(features, where)
    out_channels = opts.channels or (1 if shape[2] in (1, 2) else 3)
    if size is None and (shape[0] is None or shape[1] is None):
        raise DataError(f"{where}: images vary in size (feature shape {shape}); pass image_size "
                        "(--image_size) to resize them")
    out_shape = (*(size or (shape[0], shape[1])), out_channels)
    label_feature, num_classes, class_names = _label_feature(tfds, features, where)

    try:
        builder.download_and_prepare()
    except Exception as e:
        raise DataError(f"{where}: download/prepare failed: {_first_line(e)}") from e

    train_split, test_split = _choose_splits(builder, spec, split, opts, notes)
    to_pair = _example_to_pair(shape, size, out_shape, labelled=label_feature is not None)
    checked = None
    if isinstance(features["image"], tfds.features.Image):  # encoded: decoded here, within the pixel budget
        checked = _CheckedDecode(tfds, where, size, out_shape, label_feature is not None, opts)
    train = _make_split(builder, "train", train_split, to_pair, out_shape, max_examples, where, checked)
    test = _make_split(builder, "test", test_split, to_pair, out_shape, max_examples, where, checked)
    if (train if opts.splits != "test" else test).num_examples == 0:
        raise DataError(f"{where}: split {train_split or test_split!r} is empty")
    sample = train.dataset.take(_TFDS_STATS_SAMPLE).batch(256)
    mean, std = _channel_stats((x.numpy() for x, _ in sample), out_channels)
    return _make_info(name=name, spec=spec, train=train, test=test, num_classes=num_classes,
                      class_names=class_names, mean=mean, std=std, image_shape=out_shape, notes=notes,
                      bad_files=checked.bad_files if checked else None)


class _CheckedDecode:
    """How the encoded images of a TFDS dataset are read: undecoded by TFDS (``SkipDecoding``), then
    decoded by :func:`~uniclr_tf.data.stream.decode_records` (the pixel budget from the header, the
    dataset's channels, resized to ``size``)."""

    def __init__(self, tfds, where, size, out_shape, labelled, opts):
        self.decoders = {"image": tfds.decode.SkipDecoding()}
        self.where, self.size, self.out_shape, self.labelled = where, size, out_shape, labelled
        self.max_pixels = opts.max_image_pixels
        self.bad_files = BadFiles() if opts.skip_bad_files else None

    def records(self, ds, split):
        """``(encoded image, (label, index))`` of a dataset of TFDS examples."""
        labelled = self.labelled

        def record(index, example):
            label = tf.cast(example["label"], tf.int64) if labelled else tf.constant(-1, tf.int64)
            return example["image"], (label, index)
        prefix = f"{self.where}:{split} example "

        def load(raw, meta):
            return raw, meta[0], tf.strings.join([prefix, tf.strings.as_string(meta[1])])

        def describe(raw, meta):
            return meta[0], tf.strings.join([prefix, tf.strings.as_string(meta[1])])

        decode = lambda records: decode_records(records, load, describe, self.out_shape,  # noqa: E731
                                                self.size is not None, self.bad_files, self.max_pixels)
        return ds.enumerate().map(record), decode


def _builder(tfds, name, data_dir, where):
    """The TFDS builder of ``name``; a ``DataError`` naming the dataset when there is none."""
    try:
        return tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError as e:
        raise DataError(f"{where}: unknown TFDS dataset (catalog: https://www.tensorflow.org/datasets/catalog)") from e
    except Exception as e:  # bad version, bad config, ...
        raise DataError(f"{where}: cannot build the TFDS dataset: {_first_line(e)}") from e


def _label_feature(tfds, features, where):
    """``(label feature, number of classes, class names)``: all None when the dataset has no
    ``ClassLabel`` named ``label`` (its data is then unlabelled; another kind of label is warned of)."""
    label_feature = features["label"] if "label" in features.keys() else None
    if label_feature is not None and isinstance(label_feature, tfds.features.ClassLabel):
        return label_feature, label_feature.num_classes, tuple(label_feature.names)
    if label_feature is not None:
        logging.warning("%s: 'label' is not a ClassLabel; treating the data as unlabelled", where)
    return None, None, None


def _example_to_pair(shape, size, out_shape, labelled):
    """A tf.data map from a TFDS example to ``(uint8 image of out_shape, int64 label)``: the alpha
    channel dropped, grey tiled to RGB or RGB to grey as ``out_shape`` asks, resized to ``size``
    (when given and not the images' own); the label -1 when not ``labelled``."""
    channels, out_channels = shape[2], out_shape[2]

    def to_pair(example):
        image = example["image"]
        if channels in (2, 4):
            image = image[..., :3 if channels == 4 else 1]  # drop alpha
        if out_channels == 3 and channels in (1, 2):
            image = tf.tile(image, [1, 1, 3])
        elif out_channels == 1 and channels in (3, 4):
            image = tf.image.rgb_to_grayscale(image)
        if size is not None and tuple(shape[:2]) != tuple(size):
            image = resize_uint8(image, size)
        image = tf.ensure_shape(image, out_shape)
        label = tf.cast(example["label"], tf.int64) if labelled else tf.constant(-1, tf.int64)
        return image, label

    return to_pair


def _make_split(builder, kind, tfds_split, to_pair, out_shape, max_examples, where, checked=None):
    """The :class:`Split` ``kind`` streamed from the TFDS split ``tfds_split`` (None: an empty split),
    its first ``max_examples`` (0 / None: all), counted; ``checked``: a :class:`_CheckedDecode`
    decodes the images (else TFDS does, and ``to_pair`` makes the pairs)."""
    if tfds_split is None:
        empty = tf.data.Dataset.from_tensor_slices((np.zeros((0, *out_shape), np.uint8), np.zeros((0,), np.int64)))
        return Split(name=kind, num_examples=0, stream=Stream(dataset_records(empty, 0)))
    try:
        ds = builder.as_dataset(split=tfds_split, shuffle_files=False,
                                **({"decoders": checked.decoders} if checked else {}))
    except Exception as e:
        raise DataError(f"{where}: cannot read split {tfds_split!r}: {_first_line(e)}") from e
    count = int(ds.cardinality().numpy())
    if count < 0:
        try:
            count = int(builder.info.splits[tfds_split].num_examples)
        except Exception:  # noqa: BLE001 - unknown: count once
            count = int(ds.reduce(np.int64(0), lambda n, _: n + 1).numpy())
    if max_examples:
        ds, count = ds.take(max_examples), min(count, max_examples)
    if checked is not None:
        records, decode = checked.records(ds, tfds_split)
        return Split(name=kind, num_examples=count, stream=Stream(dataset_records(records, count), decode))
    ds = ds.map(to_pair, num_parallel_calls=AUTOTUNE)
    return Split(name=kind, num_examples=count, stream=Stream(dataset_records(ds, count)))


def _image_shape(features, where):
    """The shape of the dataset's uint8 ``image`` feature ``(height, width, channels)``, checked."""
    if "image" not in features.keys():
        raise DataError(f"{where}: has no 'image' feature; features: {sorted(features.keys())}")
    image_feature = features["image"]
    shape = tuple(image_feature.shape)
    dtype = tf.as_dtype(getattr(image_feature, "np_dtype", None) or image_feature.dtype)
    if dtype != tf.uint8:
        raise DataError(f"{where}: 'image' is {dtype.name}; expected uint8")
    if len(shape) != 3:
        raise DataError(f"{where}: 'image' has shape {shape}; expected (height, width, channels)")
    if shape[2] not in (1, 2, 3, 4):
        raise DataError(f"{where}: 'image' has {shape[2]} channels; expected 1 or 3 (or 2 / 4 with alpha)")
    return shape


def _choose_splits(builder, spec, split, opts, notes):
    """``(train split, test split)`` as TFDS split strings (None: none): the split named (default
    'train'), and 'test', else 'validation', else the last ``holdout_fraction`` of the train split."""
    where = f"tfds:{_parse_tfds_spec(spec)[0]}"
    known = set(builder.info.splits.keys())  # empty when TFDS is mocked (tfds.testing.mock_data)
    train_split = split or "train"
    base = re.split(r"[\[+]", train_split)[0]
    if known and base not in known:
        raise DataError(f"{where}: no split {base!r}; splits: {sorted(known)}")
    test_split = None
    if not known or "test" in known:
        test_split = "test"
    elif "validation" in known:
        test_split = "validation"
    elif re.fullmatch(r"[\w-]+", train_split) and opts.splits != "train":
        total = int(builder.info.splits[train_split].num_examples)
        held = max(1, int(round(opts.holdout_fraction * total)))
        test_split, train_split = f"{train_split}[{total - held}:]", f"{train_split}[:{total - held}]"
        _note(notes, f"{spec}: no test split; holding out {_percent(opts.holdout_fraction)} ({held} images, the "
                     f"last of the split) as test")
    elif opts.splits != "train":
        logging.warning("%s: no test or validation split; the test split is empty", where)
    if opts.splits == "train":
        return train_split, None
    if opts.splits == "test":  # the test split of another spec's training data: the split named, else the test
        return None, split or test_split or train_split
    return train_split, test_split
