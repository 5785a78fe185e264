"""What the sources share: the options of one load (:class:`LoadOptions`), the in-memory
:class:`Split` and the :class:`DatasetInfo` they return, and the default fraction held out for
test when a dataset has no test split. Resizing is :mod:`uniclr_tf.data.resize`."""

from __future__ import annotations

import dataclasses
import types
from typing import Optional, Tuple

import numpy as np
from absl import logging

from uniclr_tf.data.spec import DatasetInfo, Split

_HOLDOUT_FRACTION = 0.1  # of the train data, held out for test when a dataset has no test split
_MAX_IN_MEMORY_MB = 256  # folder: data decoded into memory up to this size, streamed above

#: ``LoadOptions.splits``: train and test (the dataset's own test split, else a held-out part of
#: train); train only (every example; the test split comes from another spec); test only (the
#: dataset's test split if it has one, else every example).
SPLITS = ("all", "train", "test")


@dataclasses.dataclass(frozen=True)
class LoadOptions:
    """How one spec is loaded (see :func:`~uniclr_tf.data.sources.load_dataset`).

    ``channels`` and ``class_names`` are set when the spec gives the test split of another
    (``eval_spec``): its images then take the training channels, its classes the training ones.
    """

    size: Optional[Tuple[int, int]] = None
    data_dir: Optional[str] = None
    skip_bad_files: bool = False
    max_examples: Optional[int] = None
    holdout_fraction: float = _HOLDOUT_FRACTION
    max_in_memory_mb: float = _MAX_IN_MEMORY_MB
    max_image_pixels: Optional[int] = None
    splits: str = "all"
    channels: Optional[int] = None
    class_names: Optional[Tuple[str, ...]] = None
    check_duplicates: bool = True


def _percent(fraction):
    """0.1 -> '10%', 0.125 -> '12.5%'."""
    return f"{100 * fraction:g}%"


def _note(notes, message):
    """Logs ``message`` and keeps it for the user (``DatasetInfo.notes``)."""
    logging.info("%s", message)
    notes.append(message)


def _make_info(*, name, spec, train, test, num_classes, class_names=None, mean, std,
               num_skipped=0, image_shape=None, notes=(), bad_files=None):
    if image_shape is None:
        image_shape = tuple(int(d) for d in train.images.shape[1:])
    return DatasetInfo(name=name, image_shape=tuple(image_shape), num_classes=num_classes,
                       num_train=train.num_examples, num_test=test.num_examples,
                       mean=tuple(float(m) for m in mean), std=tuple(float(s) for s in std),
                       splits=types.MappingProxyType({"train": train, "test": test}), spec=spec,
                       class_names=class_names, num_skipped=num_skipped, notes=tuple(notes),
                       bad_files=(bad_files,) if bad_files is not None else ())


def _with_fingerprints(info, **fingerprints):
    """``info`` with ``fingerprints`` (``train=..., test=...``: uint64 arrays, or None) on its splits."""
    splits = {name: dataclasses.replace(split, fingerprints=fingerprints.get(name, split.fingerprints))
              for name, split in info.splits.items()}
    return dataclasses.replace(info, splits=types.MappingProxyType(splits))


def _fingerprint(data):
    """A uint64 hash of some bytes (BLAKE2b, 8 bytes)."""
    import hashlib
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def _memory_split(name, images, labels):
    images = np.ascontiguousarray(images, dtype=np.uint8)
    labels = np.ascontiguousarray(labels, dtype=np.int64).reshape(-1)
    images.setflags(write=False)
    labels.setflags(write=False)
    return Split(name=name, num_examples=len(images), images=images, labels=labels)


def _empty_split(name, image_shape):
    """An in-memory split of no examples."""
    return _memory_split(name, np.zeros((0, *image_shape), np.uint8), np.zeros((0,), np.int64))
