"""Configuration: :class:`~uniclr_tf.config.train_config.TrainConfig` (the train CLI's flags as small
frozen sub-configs), the field declaration every CLI shares (:mod:`~uniclr_tf.config.fields`), the absl
glue (:mod:`~uniclr_tf.config.flagutil`) and the one usage error (:mod:`~uniclr_tf.config.errors`).

This package imports nothing heavy itself: ``TrainConfig`` and the other names of
:mod:`~uniclr_tf.config.train_config` load on first use, so the light command lines (export) that need
only :mod:`~uniclr_tf.config.fields` stay free of TensorFlow.
"""

import importlib


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    module = importlib.import_module("uniclr_tf.config.train_config")
    try:
        return getattr(module, name)
    except AttributeError:
        raise AttributeError(f"module 'uniclr_tf.config' has no attribute {name!r}") from None
