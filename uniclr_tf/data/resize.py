"""Resizing of uint8 images (bilinear, antialiased; TensorFlow, imported only when an image is
actually resized), shared by the sources and the streams. It imports nothing else of the package,
so ``stream`` can use it without importing the sources (and, through them, ``spec``)."""

from __future__ import annotations

import numpy as np

from uniclr_tf.data.lazy_tf import tf


def resize_uint8(images, size):
    """Resizes uint8 ``[H, W, C]`` or ``[N, H, W, C]`` (tf tensor or array) to ``size``; uint8 out."""
    out = tf.image.resize(tf.cast(images, tf.float32), size, method="bilinear", antialias=True)
    return tf.cast(tf.clip_by_value(tf.round(out), 0.0, 255.0), tf.uint8)


def resize_array(images, size, chunk=4096):
    """Resizes an in-memory uint8 batch ``[N, H, W, C]`` in chunks; a no-op at the same size."""
    if size is None or tuple(images.shape[1:3]) == tuple(size):
        return images
    parts = [resize_uint8(images[i:i + chunk], size).numpy() for i in range(0, len(images), chunk)]
    return np.concatenate(parts) if parts else np.zeros((0, *size, images.shape[-1]), np.uint8)
