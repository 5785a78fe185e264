r"""Fine-tuning of a pretrained encoder with a new linear head, on any dataset, with any share of labels.

    python -m uniclr_tf.finetune --run_dir=runs/demo [--dataset=SPEC] [--label_fraction=0.1] [--epochs=30]

The whole network — the run's encoder and a new linear layer on its features — is trained on the
labelled training images, then evaluated once on the whole test split: top-1 / top-5 after the
last epoch (nothing is selected on the test split). With ``--label_fraction=0.01`` or ``0.1`` this
is the semi-supervised protocol of SimCLR; with the default 1 it is full fine-tuning.

The recipe is SimCLR's fine-tuning (Chen et al. 2020, "A Simple Framework for Contrastive Learning
of Visual Representations", arXiv 2002.05709, Appendix B.5, "Semi-supervised learning via
fine-tuning"): Nesterov momentum 0.9, learning rate 0.05 × batch/256 (``--learning_rate`` is the
rate for a batch of 256), no warm-up, no weight decay or other regularisation, and only random
cropping with a horizontal flip as augmentation; SimCLR fine-tunes for 60 epochs on 1 % of the
ImageNet labels and 30 on 10 % (default here: 30). Choices of this project where the paper says
nothing or does not fit:

* the learning rate decays to 0 by a cosine over the run (``uniclr_tf.training.schedules.WarmupCosine``
  without warm-up, the schedule of pretraining and linear evaluation);
* the crop is a random resized crop of area 0.5–1 (aspect 3/4–4/3, resized back to the encoder's
  input size), lighter than SimCLR's Inception crop (area 0.08–1) because the images here are
  small (28–32 px); ``--crop_scale=0.08,1`` gives SimCLR's. ``--noaugment`` trains on the plain images;
* the head is a dense layer with N(0, 0.01²) weights and a zero bias (as linear evaluation);
* batch norm runs in training mode (batch statistics; its moving averages are updated and used
  for the test split).

The data and the labelled subset are those of :mod:`uniclr_tf.evaluation.linear`: ``--dataset`` (empty:
the pretraining dataset) is resized to the encoder's input size and normalised with the run's
pretraining mean/std; ``--label_fraction`` keeps the class-balanced subset of
:mod:`uniclr_tf.evaluation.protocols` drawn with ``--seed`` (per class ``c`` of ``n_c`` training images:
``numpy.random.default_rng([seed, c]).permutation(n_c)``, the first ``max(1, floor(f · n_c + 0.5))``).

What it writes, never touching the run's ``encoder.keras``:

* ``RUN/finetune/<protocol>/model.keras``: the fine-tuned network (normalised float images
  ``[B, H, W, C]`` -> logits ``[B, classes]``), e.g. ``RUN/finetune/fashion_mnist_labels=10pct_seed=0/``;
* the section ``finetune[<dataset>, labels=<P>%(, seed=<S>)]`` of ``RUN/finetune.json`` (or
  ``--out``; other sections kept): test top-1/top-5, the train loss and top-1 of every epoch, the
  settings and the labelled subset (size, SHA-256 of its indices, first indices).

A bad run folder or dataset stops with one ``error:`` line naming it. Library use::

    from uniclr_tf.evaluation.run import load_run, load_run_data
    run = load_run("runs/demo")
    model, result = finetune(run.encoder, load_run_data(run), epochs=30, label_fraction=0.1,
                             mean=run.mean, std=run.std)   # trains run.encoder in place
"""

import dataclasses
import os
import time

from uniclr_tf.training import runs
from uniclr_tf.config.train_config import flag
from uniclr_tf.evaluation import protocols
from uniclr_tf.evaluation.cli import (check_common_fields, data_dir_flag, dataset_flag, label_fraction_flag,
                                     max_examples_flag, run_main)
from uniclr_tf.evaluation.knn import topk_accuracy
from uniclr_tf.evaluation.run import RunError, check_labels, check_run_dir, load_run_data, split_source

#: RandomResizedCrop area range of the fine-tuning augmentation (SimCLR's Inception crop: 0.08-1).
CROP_SCALE = (0.5, 1.0)
RESULTS_FILE = "finetune.json"
FINETUNE_DIR = "finetune"
MODEL_FILE = "model.keras"


def finetune(encoder, info, epochs: int = 30, batch_size: int = 256, learning_rate: float = 0.05,
             momentum: float = 0.9, nesterov: bool = True, weight_decay: float = 0.0, augment: bool = True,
             crop_scale=CROP_SCALE, label_fraction: float = 1.0, mean=None, std=None, seed: int = 0,
             feature_batch_size: int = 512, verbose=1):
    """Fine-tunes ``encoder`` and a new linear head on ``info``; returns ``(model, result)``.

    Args:
      encoder: functional backbone, normalised images ``[B, H, W, C]`` -> ``[B, F]``. Its weights
        are trained IN PLACE (pass a freshly loaded copy).
      info: a labelled :class:`uniclr_tf.data.DatasetInfo` of the encoder's image shape.
      epochs, batch_size: training length (epochs over the labelled subset) and batch.
      learning_rate: the rate for a batch of 256; the peak is ``batch_size / 256 · learning_rate``,
        decayed to 0 by a cosine over ``epochs`` (no warm-up).
      momentum, nesterov, weight_decay: of the SGD optimizer (decay in the gradient, as PyTorch; 0: none).
      augment: random resized crop of area ``crop_scale`` + horizontal flip on the training images;
        False trains on the plain images.
      label_fraction: train on this class-balanced share of the training split
        (:func:`uniclr_tf.evaluation.protocols.labelled_subset`; 1: all of it).
      mean, std: the normalisation statistics of pretraining (default: ``info``'s).
      seed: seeds the labelled subset, the head's initialisation, the shuffling and the augmentation.
      feature_batch_size: batch of the test-split pass.
      verbose: Keras ``fit`` verbosity (1: progress bar, 2: one line per epoch).

    Returns:
      ``model`` (images -> logits ``[B, classes]``, the encoder inside it) and
      ``{"top1", "top5", "train_loss": [per epoch], "train_top1": [per epoch], "settings": {...}}``;
      accuracies are fractions in [0, 1] of the whole test split after the last epoch.
    """
    import keras

    from uniclr_tf.augment import EvalPreprocess

    if epochs < 1 or batch_size < 1:
        raise ValueError(f"epochs and batch_size must be >= 1; received {epochs}, {batch_size}")
    if not info.num_classes:
        raise RunError(f"{info.spec or info.name}: unlabelled dataset; fine-tuning needs labels")
    start = time.time()
    keras.utils.set_random_seed(seed)
    mean = tuple(info.mean if mean is None else mean)
    std = tuple(info.std if std is None else std)
    info, subset = protocols.labelled_subset(info, label_fraction, seed)
    num_classes = int(info.num_classes)
    preprocess = EvalPreprocess(tuple(info.image_shape[:2]), mean, std)
    if info.split("train").in_memory:  # streamed splits are checked by the loss instead
        check_labels(info.split("train").labels, num_classes, "train")

    train_ds = _training_data(info, batch_size, preprocess, augment, crop_scale, mean, std, seed)
    steps_per_epoch = max(info.num_train // batch_size, 1)
    model = _classifier(encoder, info.image_shape, num_classes, seed)
    model.compile(optimizer=_optimizer(learning_rate, batch_size, epochs * steps_per_epoch, momentum, weight_decay,
                                       nesterov),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=[keras.metrics.SparseCategoricalAccuracy(name="top1")])
    history = model.fit(train_ds, epochs=epochs, steps_per_epoch=steps_per_epoch, verbose=verbose).history

    acc, num_test = _test_accuracy(model, preprocess, info, feature_batch_size)
    settings = {
        "dataset": info.spec or info.name, "label_subset": subset, "mean": list(mean), "std": list(std),
        "epochs": int(epochs), "batch_size": int(batch_size), "optimizer": "sgd", "nesterov": bool(nesterov),
        "learning_rate": float(learning_rate), "peak_learning_rate": batch_size / 256 * float(learning_rate),
        "schedule": "cosine", "momentum": float(momentum), "weight_decay": float(weight_decay),
        "augment": bool(augment), "crop_scale": [float(s) for s in crop_scale] if augment else None,
        "seed": int(seed), "num_train": int(info.num_train), "num_test": num_test, "num_classes": num_classes,
        "steps": int(epochs * steps_per_epoch), "backend": keras.backend.backend(),
        "seconds": round(time.time() - start, 2)}
    return model, {"top1": acc["top1"], "top5": acc["top5"], "train_loss": [float(v) for v in history["loss"]],
                   "train_top1": [float(v) for v in history["top1"]], "settings": settings}


def _training_data(info, batch_size, preprocess, augment, crop_scale, mean, std, seed):
    """The labelled training batches, shuffled, repeated: a random resized crop of area ``crop_scale``
    + horizontal flip (then normalised) with ``augment``, else the plain images through ``preprocess``."""
    from uniclr_tf import data
    from uniclr_tf.augment import ViewAugmenter

    if augment:
        height, width = info.image_shape[:2]
        augmenter = ViewAugmenter(global_size=(height, width), num_global=1, global_scale=tuple(crop_scale),
                                  jitter_rate=0.0, grayscale_rate=0.0, blur_rate=0.0, solarize_rate=0.0,
                                  mean=mean, std=std, seed=seed)
        train_map = lambda x: augmenter(x)[0]  # noqa: E731
    else:
        train_map = preprocess
    return data.pretrain_dataset(info, batch_size, train_map, shuffle=True, seed=seed, repeat=True, with_labels=True)


def _classifier(encoder, image_shape, num_classes, seed):
    """The network fine-tuned: ``encoder`` (trainable) then a dense layer with N(0, 0.01²) weights."""
    import keras

    encoder.trainable = True
    inputs = keras.Input(tuple(image_shape), name="images")
    init = keras.initializers.RandomNormal(stddev=0.01, seed=seed)
    logits = keras.layers.Dense(num_classes, kernel_initializer=init, name="classifier")(encoder(inputs))
    return keras.Model(inputs, logits, name="finetuned")


def _optimizer(learning_rate, batch_size, total_steps, momentum, weight_decay, nesterov):
    """SGD with a cosine schedule from ``batch_size / 256 · learning_rate`` to 0, no warm-up."""
    from uniclr_tf.training.optimizers import build_optimizer
    from uniclr_tf.training.schedules import WarmupCosine

    schedule = WarmupCosine(learning_rate, batch_size, total_steps=total_steps, warmup_steps=0)
    return build_optimizer("sgd", schedule, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov)


def _test_accuracy(model, preprocess, info, batch_size):
    """``(top-1/top-5 of model on the whole test split, its size)``."""
    from uniclr_tf.evaluation.features import extract_features

    logits, labels = extract_features(model, preprocess, split_source(info, "test", batch_size), batch_size)
    if len(labels) == 0:
        raise RunError(f"{info.spec or info.name}: split 'test' is empty")
    check_labels(labels, int(info.num_classes), "test")
    return topk_accuracy(logits, labels, (1, 5)), int(len(labels))


# ---------------------------------------------------------------------------------------------
# The command line


@dataclasses.dataclass(frozen=True)
class FinetuneConfig:
    """Every setting of one ``finetune`` invocation. Each field is a flag of the same name, declared
    with its help (:func:`uniclr_tf.config.train_config.flag`); the order is ``--help``'s (:data:`HELP_GROUPS`)."""

    run_dir: str = flag("", "Run folder written by uniclr_tf.train (encoder.keras, dataset.json, config.json); "
                            "encoder.keras is only read.")
    dataset: str = dataset_flag()  # empty: the pretraining dataset
    data_dir: str = data_dir_flag()
    label_fraction: float = label_fraction_flag()
    max_examples: int = max_examples_flag()  # 0: as the pretraining run (another --dataset: all)
    seed: int = flag(0, "Random seed (labelled subset, head initialisation, shuffling, augmentation).")
    epochs: int = flag(30, "Epochs over the labelled training images (SimCLR: 60 with 1% of the labels, 30 with "
                           "10%).")
    batch_size: int = flag(256, "Batch size.")
    learning_rate: float = flag(0.05, "Learning rate for a batch of 256 (peak = batch_size/256 * this), cosine to 0, "
                                      "no warm-up (SimCLR: 0.05).")
    momentum: float = flag(0.9, "SGD momentum (SimCLR: 0.9).")
    nesterov: bool = flag(True, "Nesterov momentum (SimCLR: yes).")
    weight_decay: float = flag(0.0, "Weight decay (SimCLR: 0).")
    augment: bool = flag(True, "Random resized crop (--crop_scale) + horizontal flip on the training images; "
                               "--noaugment: the plain images.")
    crop_scale: tuple = flag(CROP_SCALE, "Area range lo,hi of the random resized crop (SimCLR's Inception crop: "
                                         "0.08,1).")
    out: str = flag("", "Results JSON (empty: <run_dir>/finetune.json); each protocol's section is merged in.")

    def __post_init__(self):
        check = check_common_fields(self)
        check(len(self.crop_scale) == 2 and 0 < self.crop_scale[0] <= self.crop_scale[1] <= 1, "crop_scale",
              "two numbers lo,hi with 0 < lo <= hi <= 1")

    @property
    def out_path(self):
        return self.out or os.path.join(self.run_dir, RESULTS_FILE)


def run(cfg: FinetuneConfig) -> dict:
    """Fine-tunes as ``cfg`` describes, saves the model, merges the results section, prints the
    result. The data is loaded (and checked) before the encoder; ``encoder.keras`` is only read."""
    folder = check_run_dir(cfg.run_dir)  # before the slow imports: a typo fails at once
    info = load_run_data(folder, cfg.max_examples or None, cfg.dataset, cfg.data_dir)
    encoder = folder.load_encoder()
    spec = info.spec or info.name
    key = protocols.section_key("finetune", spec, cfg.label_fraction, cfg.seed)
    model_path = os.path.join(cfg.run_dir, FINETUNE_DIR, protocols.folder_name(spec, cfg.label_fraction, cfg.seed),
                              MODEL_FILE)
    print(f"{key} of {cfg.run_dir}: {info.num_test} test images {tuple(info.image_shape)}, {cfg.epochs} epochs, "
          f"batch {cfg.batch_size}, {'augmented' if cfg.augment else 'plain images'}")
    model, result = finetune(encoder, info, epochs=cfg.epochs, batch_size=cfg.batch_size,
                             learning_rate=cfg.learning_rate, momentum=cfg.momentum, nesterov=cfg.nesterov,
                             weight_decay=cfg.weight_decay, augment=cfg.augment, crop_scale=cfg.crop_scale,
                             label_fraction=cfg.label_fraction, mean=folder.mean, std=folder.std, seed=cfg.seed,
                             verbose=2)
    runs.atomic_save(model_path, model.save)
    result["model"] = os.path.relpath(model_path, cfg.run_dir)
    protocols.merge_results(cfg.out_path, key, result,
                            {"run_dir": os.path.abspath(cfg.run_dir), "pretraining_dataset": folder.dataset_spec})
    subset = result["settings"]["label_subset"]
    print(f"{key}: {subset['size']} of {subset['of']} labelled training images; model {model_path}; "
          f"results -> {cfg.out_path}")
    print(f"finetune top-1 {result['top1']:.4f} top-5 {result['top5']:.4f}")
    return result


#: ``--help``'s groups: ``(title, first field)`` (:func:`uniclr_tf.config.flagutil.group_fields`).
HELP_GROUPS = [("protocol (what is evaluated)", "run_dir"), ("fine-tuning recipe", "epochs"), ("output", "out")]


def define_flags(flag_values=None):
    """One flag per ``FinetuneConfig`` field, same name, same default, the help next to the field."""
    from uniclr_tf.config import flagutil

    flagutil.define_flags(FinetuneConfig, flag_values=flag_values)


def config_from_flags(flag_values=None) -> FinetuneConfig:
    from uniclr_tf.config import flagutil

    return flagutil.config_from_flags(FinetuneConfig, flag_values)


def main(argv):
    run_main(argv, config_from_flags, run)


def entry_point():
    """The ``uniclr-finetune`` console script (pyproject.toml): what ``python -m uniclr_tf.finetune`` does."""
    from uniclr_tf.config import flagutil

    define_flags()
    flagutil.run_cli(__name__, __doc__, main, groups=flagutil.group_fields(FinetuneConfig, HELP_GROUPS))


if __name__ == "__main__":
    entry_point()
