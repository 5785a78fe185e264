"""``python -m uniclr_tf.tools.release``: a finished run packed for others, from
:mod:`uniclr_tf.serving.release`."""

from uniclr_tf.serving.release import entry_point

if __name__ == "__main__":
    entry_point()
