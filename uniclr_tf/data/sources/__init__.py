"""The dataset sources, and :func:`load_dataset`, which picks one by the spec's form:

* ``fashion_mnist`` (the default; :mod:`.fashion_mnist`): Keras' copy of Fashion-MNIST, loaded
  offline from ``~/.keras/datasets/fashion-mnist`` (or from ``data_dir``), held in memory.
* ``tfds:NAME[:SPLIT]`` (:mod:`.tfds`): any TensorFlow Datasets image dataset (``tfds:cifar10``,
  ``tfds:imagenette/160px:train[:10%]``, ``tfds:cifar10:3.0.2``), streamed from its TFRecords.
* ``folder:PATH`` (:mod:`.folder`): image files, in class sub-folders or flat (unlabelled); decoded
  and checked once, eagerly, then held in memory.

:mod:`.common` holds what the sources share.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence, Union

from absl import logging

from uniclr_tf.data.sources.fashion_mnist import _load_fashion_mnist
from uniclr_tf.data.sources.folder import _load_folder
from uniclr_tf.data.sources.tfds import _load_tfds
from uniclr_tf.data.spec import SPEC_FORMS, DatasetInfo, _normalize_image_size


def load_dataset(spec: str = "fashion_mnist", image_size: Union[int, Sequence[int], None] = None,
                 data_dir: Optional[str] = None, skip_bad_files: bool = False,
                 max_examples: Optional[int] = None) -> DatasetInfo:
    """Loads (and checks) the dataset named by ``spec``.

    Args:
      spec: ``fashion_mnist``, ``tfds:NAME[:SPLIT]`` or ``folder:PATH`` (see the module docstring).
      image_size: ``S`` or ``(H, W)``; images are resized to it (bilinear, antialiased). Required
        for datasets whose images vary in size; None keeps the native size.
      data_dir: for ``tfds:``, the TFDS data directory; for ``fashion_mnist``, a folder holding the
        four ``*-ubyte.gz`` files (default: Keras' cache, ``~/.keras/datasets/fashion-mnist``).
      skip_bad_files: ``folder:`` only: skip (and count, in ``num_skipped``) undecodable or
        mis-sized files instead of raising.
      max_examples: keep at most this many examples in EACH split (a deterministic subset).

    Returns:
      A :class:`DatasetInfo`.

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
    max_examples = int(max_examples) if max_examples is not None else None
    if spec in ("fashion_mnist", "fashion-mnist"):
        info = _load_fashion_mnist(size, data_dir, max_examples)
    elif spec.startswith("tfds:"):
        info = _load_tfds(spec, size, data_dir, max_examples)
    elif spec.startswith("folder:"):
        info = _load_folder(spec, size, skip_bad_files, max_examples)
    else:
        hint = f" (it is a folder: did you mean 'folder:{spec}'?)" if os.path.isdir(spec) else ""
        raise ValueError(f"unknown dataset spec {spec!r}{hint}; valid forms: {', '.join(SPEC_FORMS)}")
    logging.info("dataset %s: train %d, test %d, image %s, classes %s, mean %s, std %s", info.spec,
                 info.num_train, info.num_test, info.image_shape, info.num_classes,
                 _fmt(info.mean), _fmt(info.std))
    return info


def _fmt(values):
    return "(" + ", ".join(f"{v:.4f}" for v in values) + ")"
