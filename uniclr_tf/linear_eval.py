r"""Linear evaluation (and weighted kNN) of a pretrained backbone.

    python -m uniclr_tf.linear_eval --run_dir=runs/demo [--noaugment] [--knn] [--flag=value ...]

The protocol is the paper's (§4.1, PAPER.md): the backbone is frozen (inference-mode batch norm,
no gradient reaches it) and a single linear layer is trained on its features with SGD, learning
rate 30 for a batch of 256 (scaled linearly with ``--batch_size``), momentum 0.9, no weight decay,
a cosine schedule (no warm-up) and 100 epochs (CIFAR, ImageNet-100). For ImageNet-1K the paper uses
LARS, base rate 0.02, batch 1024, 90 epochs: ``--optimizer=lars --learning_rate=0.02
--batch_size=1024 --epochs=90``. The classifier starts from N(0, 0.01²) weights and zero bias. The
training images are augmented with a random resized crop (area 0.08–1) and a horizontal flip;
``--noaugment`` trains on the plain images instead, whose features are then computed ONCE (much
faster, on a CPU by orders of magnitude). The test split is always read with ``EvalPreprocess``.
Top-1 and top-5 are those of the FINAL epoch (nothing is selected on the test split); per-epoch
test accuracies are only monitored (TensorBoard ``RUN/linear_eval_tb``).

``--knn`` runs the weighted kNN classifier instead (k=200, T=0.1: ℓ2-normalised backbone features,
training split as the memory bank). Both modes merge their section (``"linear"`` or ``"knn"``)
into ``RUN/linear_eval.json`` (or ``--out``), keeping the other one.

The run folder is one written by ``uniclr_tf.train``: ``encoder.keras`` (normalised float images
``[B, H, W, C]`` -> features ``[B, F]``), ``dataset.json`` (shape, classes, the normalisation
statistics used in pretraining) and ``config.json`` (how to reload the same data).

Library use needs no flags::

    run = load_run("runs/demo")
    info = load_run_data(run)
    result = linear_eval(run.encoder, info, epochs=100, mean=run.mean, std=run.std)
"""

import dataclasses
import json
import math
import os
import sys
import time
from typing import Optional

import numpy as np

from uniclr_tf.knn import topk_accuracy

OPTIMIZERS = ("sgd", "lars")
#: RandomResizedCrop area range of the linear-evaluation training augmentation (MoCo/SimCLR).
CROP_SCALE = (0.08, 1.0)
RUN_FILES = ("encoder.keras", "dataset.json", "config.json")
RESULTS_FILE = "linear_eval.json"
TB_DIR = "linear_eval_tb"


class RunError(ValueError):
    """A run folder that cannot be evaluated; the message is one line naming the culprit."""


# ---------------------------------------------------------------------------------------------
# Top-k accuracy


# ---------------------------------------------------------------------------------------------
# The run folder


@dataclasses.dataclass(frozen=True, eq=False)
class Run:
    """What :func:`load_run` found in a run folder.

    Attributes:
      run_dir: the folder.
      encoder: the backbone (``keras.Model``), loaded without compiling.
      dataset: ``dataset.json`` as a dict.
      config: the pretraining ``TrainConfig``.
    """

    run_dir: str
    encoder: object = dataclasses.field(repr=False)
    dataset: dict = dataclasses.field(repr=False)
    config: object = dataclasses.field(repr=False)

    @property
    def image_shape(self):
        return tuple(int(d) for d in self.dataset["image_shape"])

    @property
    def num_classes(self):
        return self.dataset.get("num_classes")

    @property
    def mean(self):
        return tuple(float(m) for m in self.dataset["mean"])

    @property
    def std(self):
        return tuple(float(s) for s in self.dataset["std"])


def check_run_dir(run_dir: str) -> None:
    """Raises :class:`RunError` (one line) unless ``run_dir`` holds the files of a train run."""
    if not run_dir:
        raise RunError("--run_dir is required (a folder written by uniclr_tf.train)")
    if not os.path.isdir(run_dir):
        raise RunError(f"{run_dir}: no such run folder")
    missing = [f for f in RUN_FILES if not os.path.isfile(os.path.join(run_dir, f))]
    if missing:
        raise RunError(f"{run_dir}: missing {', '.join(missing)} (expected a run folder written by "
                       f"uniclr_tf.train)")


def _read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise RunError(f"{path}: cannot read JSON ({type(e).__name__}: {str(e).splitlines()[0]})") from None


def load_run(run_dir: str, require_labels: bool = True) -> Run:
    """Loads ``encoder.keras``, ``dataset.json`` and ``config.json`` of a ``uniclr_tf.train`` run.

    Raises:
      RunError: missing folder or file, unreadable file, unlabelled dataset (``require_labels``),
        or an encoder that does not map images to ``[B, F]`` features.
    """
    check_run_dir(run_dir)
    from uniclr_tf.config import TrainConfig

    dataset = _read_json(os.path.join(run_dir, "dataset.json"))
    for key in ("dataset", "image_shape", "mean", "std"):
        if key not in dataset:
            raise RunError(f"{os.path.join(run_dir, 'dataset.json')}: no {key!r} entry")
    if require_labels and not dataset.get("num_classes"):
        raise RunError(f"{run_dir}: dataset {dataset['dataset']!r} is unlabelled (num_classes "
                       f"{dataset.get('num_classes')!r} in dataset.json); linear and kNN evaluation need labels")
    config_path = os.path.join(run_dir, "config.json")
    try:
        with open(config_path) as f:
            config = TrainConfig.from_json(f.read())
    except (OSError, ValueError, TypeError) as e:
        raise RunError(f"{config_path}: not a TrainConfig ({type(e).__name__}: {str(e).splitlines()[0]})") from None

    import keras

    encoder_path = os.path.join(run_dir, "encoder.keras")
    try:
        encoder = keras.saving.load_model(encoder_path, compile=False)
    except Exception as e:  # a corrupt or foreign file: say which, in one line
        raise RunError(f"{encoder_path}: cannot load the encoder ({type(e).__name__}: "
                       f"{str(e).splitlines()[0] if str(e) else ''})") from None
    if len(encoder.output_shape) != 2:
        raise RunError(f"{encoder_path}: expected an encoder with features [B, F]; its output shape is "
                       f"{encoder.output_shape}")
    return Run(run_dir=run_dir, encoder=encoder, dataset=dataset, config=config)


def load_run_data(run: Run, max_examples: Optional[int] = None):
    """Reloads the run's dataset as pretraining saw it (same spec, data_dir, image_size).

    Args:
      run: from :func:`load_run`.
      max_examples: cap EACH split at this many examples; None uses the run's own
        ``--max_examples`` (0 there: all).

    Returns:
      A :class:`uniclr_tf.data.DatasetInfo`, checked against ``dataset.json`` and for labels.
    """
    from uniclr_tf import data

    cfg = run.config
    cap = max_examples if max_examples else (cfg.max_examples or None)
    info = data.load_dataset(cfg.dataset, image_size=cfg.image_size or None, data_dir=cfg.data_dir or None,
                             skip_bad_files=cfg.skip_bad_files, max_examples=cap)
    if tuple(info.image_shape) != run.image_shape:
        raise RunError(f"{run.run_dir}: {cfg.dataset} reloads as images {tuple(info.image_shape)} but "
                       f"dataset.json says {run.image_shape}")
    if not info.num_classes:
        raise RunError(f"{run.run_dir}: dataset {cfg.dataset!r} is unlabelled; linear and kNN evaluation "
                       f"need labels")
    if info.num_test == 0:
        raise RunError(f"{run.run_dir}: dataset {cfg.dataset!r} has an empty test split")
    return info


# ---------------------------------------------------------------------------------------------
# Features, linear classifier, kNN


def extract_features(encoder, info, split: str, preprocess, batch_size: int = 512):
    """Frozen-backbone features of a whole split: ``(float32 [N, F], int64 labels [N])``.

    Streams the split through ``uniclr_tf.data.eval_dataset`` (``preprocess`` runs in tf.data),
    so streamed (tfds) splits need not fit in memory as images.
    """
    from uniclr_tf import data

    features, labels = [], []
    for x, y in data.eval_dataset(info, split, batch_size, preprocess).as_numpy_iterator():
        features.append(np.asarray(encoder.predict_on_batch(x), np.float32))
        labels.append(np.asarray(y, np.int64))
    if not features:
        raise RunError(f"{info.spec or info.name}: split {split!r} is empty")
    return np.concatenate(features), np.concatenate(labels)


def _check_labels(labels, num_classes, split):
    if labels.min() < 0 or labels.max() >= num_classes:
        raise RunError(f"split {split!r} has labels outside [0, {num_classes}) (range [{labels.min()}, "
                       f"{labels.max()}]; -1 means unlabelled)")


def _head_scores(head, features, chunk=8192):
    """Logits of the linear layer on NumPy features, in NumPy (no trace, any backend)."""
    kernel, bias = (np.asarray(w, np.float32) for w in head.get_weights())
    return np.concatenate([features[i:i + chunk] @ kernel + bias for i in range(0, len(features), chunk)])


def _make_optimizer(optimizer, learning_rate, batch_size, total_steps, momentum, weight_decay):
    """SGD (or LARS) with a cosine schedule from ``batch_size / 256 · learning_rate`` to 0."""
    import keras

    from uniclr_tf.optimizers import LARS
    from uniclr_tf.schedules import WarmupCosine

    schedule = WarmupCosine(learning_rate, batch_size, total_steps=total_steps, warmup_steps=0)
    if optimizer == "lars":
        return LARS(schedule, momentum=momentum, weight_decay=weight_decay)
    if optimizer == "sgd":
        return keras.optimizers.SGD(schedule, momentum=momentum, weight_decay=weight_decay or None)
    raise ValueError(f"optimizer must be one of {OPTIMIZERS}; received {optimizer!r}")


def _test_monitor(head, test_features, test_labels):
    import keras

    class TestMonitor(keras.callbacks.Callback):
        """Writes the test top-1/top-5 of the current head into the epoch logs (for TensorBoard)."""

        def on_epoch_end(self, epoch, logs=None):
            acc = topk_accuracy(_head_scores(head, test_features), test_labels)
            if logs is not None:
                logs["test_top1"], logs["test_top5"] = acc["top1"], acc["top5"]

    return TestMonitor()


def linear_eval(encoder, info, epochs: int = 100, batch_size: int = 256, learning_rate: float = 30.0,
                momentum: float = 0.9, weight_decay: float = 0.0, optimizer: str = "sgd",
                augment: bool = True, mean=None, std=None, seed: int = 0, tb_dir: Optional[str] = None,
                feature_batch_size: int = 512, verbose=1) -> dict:
    """Trains a linear classifier on the frozen ``encoder``; returns test top-1/top-5 and settings.

    Args:
      encoder: functional backbone, normalised images ``[B, H, W, C]`` -> ``[B, F]``. It is frozen
        (``trainable`` is set to False during the call and restored after; inference-mode BN).
      info: a labelled :class:`uniclr_tf.data.DatasetInfo` (train and test splits).
      epochs, batch_size: training length and batch.
      learning_rate: the rate for a batch of 256; the peak is ``batch_size / 256 · learning_rate``,
        decayed to 0 by a cosine over ``epochs`` (no warm-up).
      momentum, weight_decay, optimizer: ``"sgd"`` (paper; Keras' decoupled decay) or ``"lars"``
        (paper, ImageNet-1K; decay added to the gradient, bias excluded).
      augment: random resized crop (area 0.08–1) + horizontal flip on the training images, the
        backbone run every step; False trains on features of the plain images, computed once.
      mean, std: the normalisation statistics of pretraining (default: ``info``'s).
      seed: seeds the classifier's initialisation, the shuffling and the augmentation.
      tb_dir: TensorBoard log folder (None: none).
      feature_batch_size: batch of the feature extraction passes.
      verbose: Keras ``fit`` verbosity (1: progress bar).

    Returns:
      ``{"top1", "top5", "train_loss", "train_top1", "settings": {...}}``; accuracies are
      fractions in [0, 1] of the test split after the last epoch.
    """
    import keras

    from uniclr_tf import data
    from uniclr_tf.augment import EvalPreprocess, ViewAugmenter

    if epochs < 1 or batch_size < 1:
        raise ValueError(f"epochs and batch_size must be >= 1; received {epochs}, {batch_size}")
    if not info.num_classes:
        raise RunError(f"{info.spec or info.name}: unlabelled dataset; linear evaluation needs labels")
    start = time.time()
    keras.utils.set_random_seed(seed)
    mean = tuple(info.mean if mean is None else mean)
    std = tuple(info.std if std is None else std)
    height, width, channels = info.image_shape
    preprocess = EvalPreprocess((height, width), mean, std)
    num_classes = int(info.num_classes)

    was_trainable = encoder.trainable
    encoder.trainable = False
    try:
        test_x, test_y = extract_features(encoder, info, "test", preprocess, feature_batch_size)
        _check_labels(test_y, num_classes, "test")
        feature_dim = test_x.shape[1]
        init = keras.initializers.RandomNormal(stddev=0.01, seed=seed)  # as the authors' code
        head = keras.Sequential([keras.Input((feature_dim,)),
                                 keras.layers.Dense(num_classes, kernel_initializer=init, name="linear")],
                                name="linear_classifier")
        num_train = info.num_train
        if augment:
            if info.split("train").in_memory:  # streamed splits are checked by the loss instead
                _check_labels(info.split("train").labels, num_classes, "train")
            steps_per_epoch = max(num_train // batch_size, 1)
            augmenter = ViewAugmenter(global_size=(height, width), num_global=1, global_scale=CROP_SCALE,
                                      jitter_rate=0.0, grayscale_rate=0.0, blur_rate=0.0, solarize_rate=0.0,
                                      mean=mean, std=std, seed=seed)
            train_ds = data.pretrain_dataset(info, batch_size, lambda x: augmenter(x)[0], shuffle=True, seed=seed,
                                             repeat=True, with_labels=True)
            inputs = keras.Input((height, width, channels), name="images")
            model = keras.Model(inputs, head(encoder(inputs, training=False)), name="linear_eval")
            fit_args = dict(x=train_ds, steps_per_epoch=steps_per_epoch)
        else:
            train_x, train_y = extract_features(encoder, info, "train", preprocess, feature_batch_size)
            _check_labels(train_y, num_classes, "train")
            steps_per_epoch = math.ceil(num_train / batch_size)
            model = head
            fit_args = dict(x=train_x, y=train_y, batch_size=batch_size, shuffle=True)
        model.compile(optimizer=_make_optimizer(optimizer, learning_rate, batch_size, epochs * steps_per_epoch,
                                                momentum, weight_decay),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=[keras.metrics.SparseCategoricalAccuracy(name="top1")])
        callbacks = [_test_monitor(head, test_x, test_y)]
        if tb_dir:
            callbacks.append(keras.callbacks.TensorBoard(tb_dir, update_freq="epoch"))
        history = model.fit(epochs=epochs, callbacks=callbacks, verbose=verbose, **fit_args)
    finally:
        encoder.trainable = was_trainable

    acc = topk_accuracy(_head_scores(head, test_x), test_y, (1, 5))
    logs = history.history
    return {
        "top1": acc["top1"], "top5": acc["top5"],
        "train_loss": float(logs["loss"][-1]), "train_top1": float(logs["top1"][-1]),
        "settings": {
            "epochs": int(epochs), "batch_size": int(batch_size), "optimizer": optimizer,
            "learning_rate": float(learning_rate),
            "peak_learning_rate": batch_size / 256 * float(learning_rate),
            "schedule": "cosine", "momentum": float(momentum), "weight_decay": float(weight_decay),
            "augment": bool(augment), "crop_scale": list(CROP_SCALE) if augment else None,
            "seed": int(seed), "num_train": int(num_train), "num_test": int(len(test_y)),
            "feature_dim": int(feature_dim), "num_classes": num_classes,
            "steps": int(epochs * steps_per_epoch), "backend": keras.backend.backend(),
            "seconds": round(time.time() - start, 2),
        },
    }


def knn_eval(encoder, info, k: int = 200, temperature: float = 0.1, mean=None, std=None,
             batch_size: int = 512) -> dict:
    """Weighted kNN (``uniclr_tf.evaluation.knn_eval``) of ``encoder`` features, train vs test."""
    from uniclr_tf import data, evaluation
    from uniclr_tf.augment import EvalPreprocess

    if not info.num_classes:
        raise RunError(f"{info.spec or info.name}: unlabelled dataset; kNN evaluation needs labels")
    start = time.time()
    mean = tuple(info.mean if mean is None else mean)
    std = tuple(info.std if std is None else std)
    preprocess = EvalPreprocess(tuple(info.image_shape[:2]), mean, std)
    train = data.as_numpy(info, "train")
    test = data.as_numpy(info, "test")
    _check_labels(train[1], info.num_classes, "train")
    acc = evaluation.knn_eval(encoder, preprocess, train, test, info.num_classes, k, temperature, batch_size)
    return {"top1": acc["top1"], "top5": acc["top5"],
            "settings": {"k": int(k), "temperature": float(temperature), "memory_bank": int(len(train[1])),
                         "num_test": int(len(test[1])), "seconds": round(time.time() - start, 2)}}


# ---------------------------------------------------------------------------------------------
# The command line


@dataclasses.dataclass(frozen=True)
class LinearEvalConfig:
    """Every setting of one ``linear_eval`` invocation. Field names equal the flag names."""

    run_dir: str = ""
    epochs: int = 100
    batch_size: int = 256
    learning_rate: float = 30.0
    momentum: float = 0.9
    weight_decay: float = 0.0
    optimizer: str = "sgd"
    augment: bool = True
    knn: bool = False
    knn_k: int = 200
    knn_temperature: float = 0.1
    max_examples: int = 0  # 0: as the pretraining run
    seed: int = 0
    out: str = ""  # empty: <run_dir>/linear_eval.json

    def __post_init__(self):
        def check(ok, field, expected):
            if not ok:
                raise ValueError(f"--{field}: expected {expected}; received {getattr(self, field)!r}")

        check(bool(self.run_dir), "run_dir", "a run folder written by uniclr_tf.train")
        check(self.epochs >= 1, "epochs", "an integer >= 1")
        check(self.batch_size >= 1, "batch_size", "an integer >= 1")
        check(self.learning_rate > 0, "learning_rate", "a number > 0")
        check(0 <= self.momentum < 1, "momentum", "a number in [0, 1)")
        check(self.weight_decay >= 0, "weight_decay", "a number >= 0")
        check(self.optimizer in OPTIMIZERS, "optimizer", f"one of {OPTIMIZERS}")
        check(self.knn_k >= 1, "knn_k", "an integer >= 1")
        check(self.knn_temperature > 0, "knn_temperature", "a number > 0")
        check(self.max_examples >= 0, "max_examples", "an integer >= 0 (0: as the pretraining run)")

    @property
    def out_path(self):
        return self.out or os.path.join(self.run_dir, RESULTS_FILE)


def _merge_json(path, section, value, extra):
    """Writes ``{section: value}`` (and ``extra``) into the JSON at ``path``, keeping other sections."""
    results = {}
    if os.path.isfile(path):
        try:
            with open(path) as f:
                results = json.load(f)
        except (OSError, ValueError):
            results = {}
        if not isinstance(results, dict):
            results = {}
    results.update(extra)
    results[section] = value
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=2)
    os.replace(tmp, path)
    return results


def run(cfg: LinearEvalConfig) -> dict:
    """Runs the evaluation ``cfg`` describes, writes the JSON, prints the one-line result."""
    check_run_dir(cfg.run_dir)  # before the slow imports: a typo fails at once
    run_ = load_run(cfg.run_dir)
    info = load_run_data(run_, cfg.max_examples or None)
    extra = {"run_dir": os.path.abspath(cfg.run_dir), "dataset": run_.dataset["dataset"]}
    if cfg.knn:
        result = knn_eval(run_.encoder, info, cfg.knn_k, cfg.knn_temperature, run_.mean, run_.std)
        _merge_json(cfg.out_path, "knn", result, extra)
        print(f"kNN top-1 {result['top1']:.4f} top-5 {result['top5']:.4f}")
    else:
        print(f"linear eval of {cfg.run_dir}: {info.num_train} training / {info.num_test} test images "
              f"{tuple(info.image_shape)}, {cfg.epochs} epochs, batch {cfg.batch_size}, "
              f"{'augmented' if cfg.augment else 'precomputed features'}")
        result = linear_eval(run_.encoder, info, epochs=cfg.epochs, batch_size=cfg.batch_size,
                             learning_rate=cfg.learning_rate, momentum=cfg.momentum,
                             weight_decay=cfg.weight_decay, optimizer=cfg.optimizer, augment=cfg.augment,
                             mean=run_.mean, std=run_.std, seed=cfg.seed,
                             tb_dir=os.path.join(cfg.run_dir, TB_DIR))
        _merge_json(cfg.out_path, "linear", result, extra)
        print(f"linear eval top-1 {result['top1']:.4f} top-5 {result['top5']:.4f}")
    return result


HELP = {
    "run_dir": "Run folder written by uniclr_tf.train (encoder.keras, dataset.json, config.json).",
    "epochs": "Epochs of linear-classifier training (paper: 100).",
    "batch_size": "Batch size (paper: 256).",
    "learning_rate": "Learning rate for a batch of 256 (peak = batch_size/256 * this), cosine to 0; paper: 30 "
                     "with SGD, 0.02 with LARS (ImageNet-1K).",
    "momentum": "Optimizer momentum.",
    "weight_decay": "Weight decay (paper: 0).",
    "optimizer": "sgd (paper: CIFAR, ImageNet-100) or lars (paper: ImageNet-1K, with --learning_rate=0.02 "
                 "--batch_size=1024 --epochs=90).",
    "augment": "Random resized crop (0.08-1) + flip on the training images; --noaugment precomputes "
               "the features of the plain images once (much faster).",
    "knn": "Run the weighted kNN evaluation instead of the linear classifier.",
    "knn_k": "k of the weighted kNN.",
    "knn_temperature": "Temperature of the weighted kNN.",
    "max_examples": "Use only the first N images of each split (0: as the pretraining run's --max_examples).",
    "seed": "Random seed (classifier initialisation, shuffling, augmentation).",
    "out": "Results JSON (empty: <run_dir>/linear_eval.json); sections are merged.",
}


def define_flags(flag_values=None):
    """One flag per ``LinearEvalConfig`` field, same name, same default."""
    from uniclr_tf import flagutil

    flagutil.define_flags(LinearEvalConfig, HELP, {"optimizer": OPTIMIZERS}, flag_values)


def config_from_flags(flag_values=None) -> LinearEvalConfig:
    from uniclr_tf import flagutil

    return flagutil.config_from_flags(LinearEvalConfig, flag_values)


def main(argv):
    from absl import app

    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    try:
        cfg = config_from_flags()
        check_run_dir(cfg.run_dir)
    except ValueError as e:  # RunError included
        sys.exit(f"error: {e}")
    from uniclr_tf.data import DataError
    try:
        run(cfg)
    except (RunError, DataError) as e:  # bad run folder or data: one line, no traceback
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    from absl import app

    define_flags()
    app.run(main)
