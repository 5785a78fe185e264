"""``python -m uniclr_tf.export`` (and ``uniclr-export``): a run's encoder as a SavedModel, from
:mod:`uniclr_tf.serving.export`."""

from uniclr_tf.serving.export import entry_point

if __name__ == "__main__":
    entry_point()
