"""TensorFlow, imported on first use.

``tf`` stands in for the ``tensorflow`` module and imports it at its first attribute access, so the
data package imports where TensorFlow is not installed (the JAX-only GPU machine): there, in-memory
data still loads and :func:`~uniclr_tf.data.pipelines.numpy_batches` feeds it without tf.data.
:func:`have_tensorflow` says whether TensorFlow is there, without importing it.
"""

from __future__ import annotations

import importlib.util


class _LazyTensorFlow:
    """``tensorflow``, imported on first attribute access."""

    def __getattr__(self, name):
        import tensorflow

        return getattr(tensorflow, name)


tf = _LazyTensorFlow()
AUTOTUNE = -1  # tf.data.AUTOTUNE


def have_tensorflow() -> bool:
    """Whether TensorFlow is installed (tf.data pipelines need it; in-memory arrays do not)."""
    try:
        return importlib.util.find_spec("tensorflow") is not None
    except ImportError:
        return False
