"""``python -m uniclr_tf.train`` (and the ``uniclr-train`` console script): the train CLI of
:mod:`uniclr_tf.training.cli`, where its flags and phases live."""

from uniclr_tf.training.cli import entry_point

if __name__ == "__main__":
    entry_point()
