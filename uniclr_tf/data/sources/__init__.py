"""The dataset sources, and :func:`load_dataset`, which picks one by the spec's form:

* ``fashion_mnist`` (the default; :mod:`.fashion_mnist`): Keras' copy of Fashion-MNIST, loaded
  offline from ``~/.keras/datasets/fashion-mnist`` (or from ``data_dir``), held in memory.
* ``tfds:NAME[:SPLIT]`` (:mod:`.tfds`): any TensorFlow Datasets image dataset (``tfds:cifar10``,
  ``tfds:imagenette/160px:train[:10%]``, ``tfds:cifar10:3.0.2``), streamed from its TFRecords.
* ``folder:PATH`` (:mod:`.folder`): image files, in class sub-folders or flat (unlabelled);
  decoded into memory up to ``max_in_memory_mb``, streamed from disk above it.
* ``tfrecord:TRAIN_GLOB[,TEST_GLOB]`` (:mod:`.tfrecord`): ``tf.train.Example`` records of encoded
  images (``uniclr_tf.tools.folder_to_tfrecord`` writes them), streamed.

:mod:`.common` holds what the sources share.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import types
from typing import Optional, Sequence, Union

from absl import logging

from uniclr_tf.data.sources.common import _HOLDOUT_FRACTION, _MAX_IN_MEMORY_MB, LoadOptions
from uniclr_tf.data.spec import SPEC_FORMS, DataError, DatasetInfo, _normalize_image_size, source_of


def load_dataset(spec: str = "fashion_mnist", image_size: Union[int, Sequence[int], None] = None,
                 data_dir: Optional[str] = None, skip_bad_files: bool = False,
                 max_examples: Optional[int] = None, eval_spec: Optional[str] = None,
                 holdout_fraction: float = _HOLDOUT_FRACTION,
                 max_in_memory_mb: float = _MAX_IN_MEMORY_MB,
                 max_image_pixels: Optional[int] = None, check_duplicates: bool = True) -> DatasetInfo:
    """Loads (and checks) the dataset named by ``spec``.

    Args:
      spec: ``fashion_mnist``, ``tfds:NAME[:SPLIT]``, ``folder:PATH`` or
        ``tfrecord:TRAIN_GLOB[,TEST_GLOB]`` (see the module docstring).
      image_size: ``S`` or ``(H, W)``; images are resized to it (bilinear, antialiased). Required
        for datasets whose images vary in size; None keeps the native size.
      data_dir: for ``tfds:``, the TFDS data directory; for ``fashion_mnist``, a folder holding the
        four ``*-ubyte.gz`` files (default: Keras' cache, ``~/.keras/datasets/fashion-mnist``).
      skip_bad_files: ``folder:`` and ``tfrecord:``: skip (and count, in ``num_skipped``, or in
        ``skipped_while_streaming()`` for those found while streaming) undecodable or mis-sized
        images instead of raising.
      max_examples: keep at most this many examples in EACH split (a deterministic subset).
      eval_spec: another spec whose test split (its own test split if it has one, else all of it)
        becomes the test split; ``spec`` then gives all its examples to training. Its images take
        the training channels and ``image_size``; its classes must be the training ones.
      holdout_fraction: the fraction of the training data held out for test when ``spec`` has no
        test split and no ``eval_spec`` is given (per class for folders), in (0, 0.5].
      max_in_memory_mb: ``folder:`` data whose decoded images (N x H x W x 3 bytes) fit in this
        many MB is decoded into memory at load; larger folders stream from disk (0: always).
      max_image_pixels: an image of more pixels (read from its header, before any decoding: files
        of ``folder:`` data, records of ``tfrecord:`` and ``tfds:`` data) is a bad image; None:
        :data:`~uniclr_tf.data.decode.MAX_PIXELS`.
      check_duplicates: ``folder:`` and ``tfrecord:`` data: hash every image's bytes and report (a
        note, and ``DatasetInfo.test_duplicates``) the test images that are exact copies of training
        images; False skips this read of every file (huge datasets).

    Returns:
      A :class:`DatasetInfo`; its ``notes`` say where the test split comes from and whether a
      folder streams.

    Raises:
      ValueError: unknown spec form or bad arguments.
      DataError: missing, unknown or bad data (one line naming the file or dataset).
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"dataset spec must be a non-empty string; received {spec!r}. "
                         f"Valid forms: {', '.join(SPEC_FORMS)}")
    spec = spec.strip()
    size = _normalize_image_size(image_size)
    if max_examples is not None and (int(max_examples) != max_examples or max_examples < 1):
        raise ValueError(f"max_examples must be a positive integer or None; received {max_examples!r}")
    if not 0 < holdout_fraction <= 0.5:
        raise ValueError(f"holdout_fraction must lie in (0, 0.5]; received {holdout_fraction!r}")
    if max_in_memory_mb < 0:
        raise ValueError(f"max_in_memory_mb must be >= 0; received {max_in_memory_mb!r}")
    opts = LoadOptions(size=size, data_dir=data_dir, skip_bad_files=skip_bad_files,
                       max_examples=int(max_examples) if max_examples is not None else None,
                       holdout_fraction=holdout_fraction, max_in_memory_mb=max_in_memory_mb,
                       max_image_pixels=max_image_pixels, check_duplicates=check_duplicates,
                       splits="train" if eval_spec else "all")
    info = _load(spec, opts)
    if eval_spec:
        eval_spec = eval_spec.strip()
        test = _load(eval_spec, dataclasses.replace(opts, splits="test", channels=info.image_shape[-1],
                                                    class_names=info.class_names))
        info = _with_test_split(info, test)
    info = _report_duplicates(info)
    logging.info("dataset %s: train %d, test %d, image %s, classes %s, mean %s, std %s", info.spec,
                 info.num_train, info.num_test, info.image_shape, info.num_classes,
                 _fmt(info.mean), _fmt(info.std))
    return info


def _load(spec, opts):
    source = source_of(spec)
    if source is not None:
        module, function = source.loader.split(":")
        return getattr(importlib.import_module(f"{__name__}.{module}"), function)(spec, opts)
    hint = f" (it is a folder: did you mean 'folder:{spec}'?)" if os.path.isdir(spec) else ""
    raise ValueError(f"unknown dataset spec {spec!r}{hint}; valid forms: {', '.join(SPEC_FORMS)}")


def _with_test_split(info, other):
    """``info`` (training data only) with the test split of ``other`` (loaded from ``eval_spec``)."""
    where = other.spec
    if tuple(other.image_shape) != tuple(info.image_shape):
        raise DataError(f"{where}: images are {'x'.join(map(str, other.image_shape))} but the training images "
                        f"({info.spec}) are {'x'.join(map(str, info.image_shape))}; pass image_size to resize both")
    if info.num_classes and other.class_names and info.class_names and other.class_names != info.class_names:
        raise DataError(f"{where}: classes {list(other.class_names)} differ from the training classes "
                        f"{list(info.class_names)}")
    if info.num_classes and other.num_classes and other.num_classes > info.num_classes:
        raise DataError(f"{where}: has {other.num_classes} classes but the training data ({info.spec}) has "
                        f"{info.num_classes}")
    test = other.split("test")
    note = f"{info.spec}: test split from {where} ({test.num_examples} images)"
    logging.info("%s", note)
    return dataclasses.replace(info, splits=types.MappingProxyType({"train": info.split("train"), "test": test}),
                               num_test=test.num_examples, eval_spec=where, num_skipped=info.num_skipped +
                               other.num_skipped, notes=info.notes + other.notes + (note,),
                               bad_files=info.bad_files + other.bad_files)


def _report_duplicates(info):
    """``info`` with ``test_duplicates`` (and a note) when both splits carry fingerprints: the test
    images whose bytes are a training image's, which a kNN or linear evaluation would measure by
    memory rather than by features."""
    import numpy as np
    train, test = info.splits["train"].fingerprints, info.splits["test"].fingerprints
    if train is None or test is None:
        return info
    copies = int(np.isin(test, train).sum())
    if not copies:
        return dataclasses.replace(info, test_duplicates=0)
    note = (f"warning: {info.eval_spec or info.spec}: {copies} of the {len(test)} test images are exact copies "
            f"(the same bytes) of training images: kNN and linear numbers on them measure memory, not features; "
            "remove them from one split (--nocheck_duplicates skips this check)")
    logging.warning("%s", note)
    return dataclasses.replace(info, test_duplicates=copies, notes=info.notes + (note,))


def _fmt(values):
    return "(" + ", ".join(f"{v:.4f}" for v in values) + ")"
