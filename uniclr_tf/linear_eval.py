"""``python -m uniclr_tf.linear_eval`` (and the ``uniclr-eval`` console script): the command line of
:mod:`uniclr_tf.evaluation.linear`, where the protocol, its flags and its library functions live."""

from uniclr_tf.evaluation.linear import entry_point

if __name__ == "__main__":
    entry_point()
