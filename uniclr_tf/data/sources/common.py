"""What the sources share: the in-memory :class:`Split` and the :class:`DatasetInfo` they return,
resizing of uint8 images (bilinear, antialiased; TensorFlow, imported only when an image is
actually resized), and the fraction held out for test when a dataset has no test split."""

from __future__ import annotations

import types

import numpy as np

from uniclr_tf.data.lazy_tf import tf
from uniclr_tf.data.spec import DatasetInfo, Split

_HOLDOUT_FRACTION = 0.1  # of the train data, held out for test when a dataset has no test split


def _make_info(*, name, spec, train, test, num_classes, class_names=None, mean, std,
               num_skipped=0, image_shape=None):
    if image_shape is None:
        image_shape = tuple(int(d) for d in train.images.shape[1:])
    return DatasetInfo(name=name, image_shape=tuple(image_shape), num_classes=num_classes,
                       num_train=train.num_examples, num_test=test.num_examples,
                       mean=tuple(float(m) for m in mean), std=tuple(float(s) for s in std),
                       splits=types.MappingProxyType({"train": train, "test": test}), spec=spec,
                       class_names=class_names, num_skipped=num_skipped)


def _memory_split(name, images, labels):
    images = np.ascontiguousarray(images, dtype=np.uint8)
    labels = np.ascontiguousarray(labels, dtype=np.int64).reshape(-1)
    images.setflags(write=False)
    labels.setflags(write=False)
    return Split(name=name, num_examples=len(images), images=images, labels=labels)


def _resize_uint8(images, size):
    """Resizes uint8 ``[H, W, C]`` or ``[N, H, W, C]`` (tf tensor or array) to ``size``; uint8 out."""
    out = tf.image.resize(tf.cast(images, tf.float32), size, method="bilinear", antialias=True)
    return tf.cast(tf.clip_by_value(tf.round(out), 0.0, 255.0), tf.uint8)


def _resize_array(images, size, chunk=4096):
    """Resizes an in-memory uint8 batch ``[N, H, W, C]`` in chunks; a no-op at the same size."""
    if size is None or tuple(images.shape[1:3]) == tuple(size):
        return images
    parts = [_resize_uint8(images[i:i + chunk], size).numpy() for i in range(0, len(images), chunk)]
    return np.concatenate(parts) if parts else np.zeros((0, *size, images.shape[-1]), np.uint8)
