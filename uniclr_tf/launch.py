"""``python -m uniclr_tf.launch`` (and ``uniclr-launch``): one training process per local GPU, from
:mod:`uniclr_tf.training.launch`."""

from uniclr_tf.training.launch import entry_point

if __name__ == "__main__":
    entry_point()
