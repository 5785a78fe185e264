"""What the evaluation command lines share (``linear_eval``, ``finetune``): the fields every
evaluation config has (declared with their help, as :mod:`uniclr_tf.config.train_config`'s), their checks with
errors naming the flag, and the body of ``main``.
"""

import sys

from uniclr_tf.config.train_config import flag
from uniclr_tf.data.spec import spec_forms
from uniclr_tf.config.errors import UsageError
from uniclr_tf.evaluation.run import check_run_dir
from uniclr_tf.training.runs import RunFolderError

# The flags every evaluation command has, with the same meaning and help: each config declares them
# as fields (``dataset: str = dataset_flag()``), the help next to the field as TrainConfig's.


def dataset_flag():
    """``--dataset``: the data evaluated on (empty: the pretraining dataset)."""
    return flag("", f"Dataset to evaluate on: {spec_forms(', ', ' or ')} (transfer; resized to the encoder's input "
                    "size, normalised with the run's pretraining mean/std). Empty: the pretraining dataset.")


def data_dir_flag():
    """``--data_dir``: the data directory of ``--dataset``."""
    return flag("", "Data directory of --dataset (TFDS data dir; fashion_mnist: folder of its IDX files). Empty: "
                    "the source's default (the pretraining dataset always uses the run's own).")


def label_fraction_flag():
    """``--label_fraction``: the share of labelled training images (semi-supervised protocol)."""
    return flag(1.0, "Share of the labelled training split to train on, in (0, 1] (semi-supervised protocol: "
                     "0.01, 0.1): per class c, a permutation seeded by (--seed, c), the first "
                     "max(1, floor(f*n_c + 0.5)). The test split stays whole.")


def max_examples_flag():
    """``--max_examples``: a cap on each split (0: the pretraining run's)."""
    return flag(0, "Use only the first N images of each split (0: as the pretraining run's --max_examples; all of "
                   "another --dataset).")


def check_common_fields(cfg):
    """Validates the fields every evaluation config shares (run folder, protocol, optimisation) with
    errors naming the flag; returns the ``check(ok, field, expected)`` used, for the config's own."""
    def check(ok, field, expected):
        if not ok:
            raise UsageError(f"--{field}: expected {expected}; received {getattr(cfg, field)!r}")

    check(bool(cfg.run_dir), "run_dir", "a run folder written by uniclr_tf.train")
    check(0 < cfg.label_fraction <= 1, "label_fraction", "a number in (0, 1]")
    check(cfg.max_examples >= 0, "max_examples", "an integer >= 0 (0: as the pretraining run)")
    check(cfg.seed >= 0, "seed", "an integer >= 0")
    check(cfg.epochs >= 1, "epochs", "an integer >= 1")
    check(cfg.batch_size >= 1, "batch_size", "an integer >= 1")
    check(cfg.learning_rate > 0, "learning_rate", "a number > 0")
    check(0 <= cfg.momentum < 1, "momentum", "a number in [0, 1)")
    check(cfg.weight_decay >= 0, "weight_decay", "a number >= 0")
    return check


def run_main(argv, read_config, run_fn):
    """The body of an evaluation CLI's ``main`` (``linear_eval``, ``finetune``): the config from the
    flags, the run folder checked, then ``run_fn(cfg)``; a bad flag, run folder or dataset stops with
    one ``error:`` line (words left after the flags are refused before, by ``flagutil.run_cli``)."""
    try:
        cfg = read_config()
        check_run_dir(cfg.run_dir)
    except ValueError as e:  # a bad flag, or RunFolderError
        sys.exit(f"error: {e}")
    from uniclr_tf.data import DataError
    try:
        run_fn(cfg)
    except (RunFolderError, DataError) as e:  # bad run folder (RunError included) or data: one line
        sys.exit(f"error: {e}")
