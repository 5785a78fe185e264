"""``python -m uniclr_tf.finetune`` (and the ``uniclr-finetune`` console script): the command line of
:mod:`uniclr_tf.evaluation.finetune`, where the recipe, its flags and its library functions live."""

from uniclr_tf.evaluation.finetune import entry_point

if __name__ == "__main__":
    entry_point()
