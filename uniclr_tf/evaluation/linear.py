r"""Linear evaluation (and weighted kNN) of a pretrained backbone, on any dataset, with any share of labels.

    python -m uniclr_tf.linear_eval --run_dir=runs/demo [--noaugment] [--knn] [--flag=value ...]
    python -m uniclr_tf.linear_eval --run_dir=runs/demo --dataset=tfds:cifar10       # transfer
    python -m uniclr_tf.linear_eval --run_dir=runs/demo --label_fraction=0.01 --seed=0  # semi-supervised
    KERAS_BACKEND=jax python -m uniclr_tf.linear_eval --run_dir=runs/demo --augment_on=device  # no TensorFlow

The protocol is the UniCLR paper's (its §4.1, the usual SimCLR/MoCo protocol): the backbone is
frozen (inference-mode batch norm, no gradient reaches it) and a single linear layer is trained on
its features with SGD, learning rate 30 for a batch of 256 (scaled linearly with ``--batch_size``), momentum 0.9, no weight decay,
a cosine schedule (no warm-up) and 100 epochs (CIFAR, ImageNet-100). For ImageNet-1K the paper uses
LARS, base rate 0.02, batch 1024, 90 epochs: ``--optimizer=lars --learning_rate=0.02
--batch_size=1024 --epochs=90``. The classifier starts from N(0, 0.01²) weights and zero bias. The
training images are augmented with a random resized crop (area 0.08–1) and a horizontal flip;
``--noaugment`` trains on the plain images instead, whose features are then computed ONCE (much
faster, on a CPU by orders of magnitude). The test split is always read with ``EvalPreprocess``.
Top-1 and top-5 are those of the FINAL epoch (nothing is selected on the test split); per-epoch
test accuracies are only monitored (TensorBoard ``RUN/linear_eval_tb``, written where TensorFlow is
installed).

Where the augmentation runs: ``--augment_on=host`` (the default) augments in tf.data, which needs
TensorFlow; ``--augment_on=device`` (the JAX-only GPU machines, which have no TensorFlow) feeds the
training split's uint8 images and labels to ``fit`` from NumPy (:func:`uniclr_tf.data.numpy_batches`
with ``across_passes=True``) and runs the same augmenter (:func:`train_augmenter`, seeded by
``--seed``) inside the compiled step, before the frozen backbone (:func:`augmented_model`). Both take ``max(N // batch, 1)`` full batches an epoch
(the passes over the split concatenated), so the steps, schedule and initialisation are the same;
the augmenter's random state advances every step on both backends. ``device`` needs the training
split in memory (a streamed one stops with one ``error: --augment_on=device ...`` line); without
TensorFlow, ``host`` stops before any work with one line suggesting ``--augment_on=device``.
``--noaugment`` needs neither (and ignores ``--augment_on``).

``--knn`` runs the weighted kNN classifier instead (``uniclr_tf.evaluation.knn_eval``, the one the
training monitor uses; k=200, T=0.1: ℓ2-normalised backbone features, training split as the
memory bank).

The protocol: dataset and labels
--------------------------------
``--dataset`` (empty: the pretraining dataset, reloaded as pretraining saw it) evaluates on any
spec :func:`uniclr_tf.data.load_dataset` understands (``fashion_mnist``, ``tfds:NAME[:SPLIT]``,
``folder:PATH``; ``--data_dir`` for its data directory): a *transfer* evaluation. Its images are
resized to the encoder's input size (``dataset.json``'s ``image_shape``; bilinear, antialiased, the
aspect ratio not kept) and normalised with the run's PRETRAINING mean/std (not the new dataset's,
which the encoder never saw); their channel count must be the run's (else one error line naming
``--dataset``). ``--max_examples`` caps each of its splits (0: all).

``--label_fraction=f`` (0 < f ≤ 1; default 1) is the semi-supervised protocol: the classifier (or
the kNN memory bank) sees only a fixed, class-balanced subset of the labelled training split,
drawn per ``--seed`` by the rule of :mod:`uniclr_tf.evaluation.protocols` (per class ``c`` of ``n_c``
examples: ``numpy.random.default_rng([seed, c]).permutation(n_c)``, the first
``max(1, floor(f · n_c + 0.5))``); the test split is always whole. The results record the
subset (size, SHA-256 of its indices, first indices).

Each protocol merges its own section into ``RUN/linear_eval.json`` (or ``--out``), keeping the
others, under its name (:func:`uniclr_tf.evaluation.protocols.section_key`): ``linear[fashion_mnist,
labels=100%]``, ``knn[fashion_mnist, labels=100%]``, ``linear[tfds:cifar10, labels=1%, seed=0]``
(the seed is named when it picks the subset). TensorBoard logs go to ``RUN/linear_eval_tb/<protocol>``.

The run folder is one written by ``uniclr_tf.train``: ``encoder.keras`` (normalised float images
``[B, H, W, C]`` -> features ``[B, F]``), ``dataset.json`` (shape, classes, the normalisation
statistics used in pretraining) and ``config.json`` (how to reload the same data), read through
:class:`uniclr_tf.training.runs.RunFolder` (whose ``RunFolderError`` names a missing or corrupt file).
Features come from :func:`uniclr_tf.evaluation.extract_features` and the optimizer from
:func:`uniclr_tf.training.optimizers.build_optimizer`; the results JSON is written atomically.

Library use needs no flags::

    run = load_run("runs/demo")
    info = load_run_data(run)                     # or load_run_data(run, dataset="tfds:cifar10")
    result = linear_eval(run.encoder, info, epochs=100, mean=run.mean, std=run.std, label_fraction=0.1)
"""

import contextlib
import dataclasses
import math
import os
import time
from typing import Optional

import numpy as np

from uniclr_tf.config.train_config import AUGMENT_ON, flag
from uniclr_tf.config.errors import UsageError
from uniclr_tf.evaluation import protocols
from uniclr_tf.evaluation.cli import (check_common_fields, data_dir_flag, dataset_flag, label_fraction_flag,
                                     max_examples_flag, run_main)
from uniclr_tf.evaluation.features import extract_features
from uniclr_tf.evaluation.knn import topk_accuracy
from uniclr_tf.evaluation.run import RunError, check_labels, check_run_dir, load_run, load_run_data, split_source

OPTIMIZERS = ("sgd", "lars")
#: RandomResizedCrop area range of the linear-evaluation training augmentation (MoCo/SimCLR).
CROP_SCALE = (0.08, 1.0)
RESULTS_FILE = "linear_eval.json"
TB_DIR = "linear_eval_tb"


# ---------------------------------------------------------------------------------------------
# Features, linear classifier, kNN


def _split_features(encoder, preprocess, info, split, batch_size):
    """Frozen-backbone features of a whole split: ``(float32 [N, F], int64 labels [N])``."""
    features, labels = extract_features(encoder, preprocess, split_source(info, split, batch_size), batch_size)
    if len(features) == 0:
        raise RunError(f"{info.spec or info.name}: split {split!r} is empty")
    return features, labels


def _head_scores(head, features, chunk=8192):
    """Logits of the linear layer on NumPy features, in NumPy (no trace, any backend)."""
    kernel, bias = (np.asarray(w, np.float32) for w in head.get_weights())
    return np.concatenate([features[i:i + chunk] @ kernel + bias for i in range(0, len(features), chunk)])


def _make_optimizer(optimizer, learning_rate, batch_size, total_steps, momentum, weight_decay):
    """SGD (or LARS) with a cosine schedule from ``batch_size / 256 · learning_rate`` to 0."""
    from uniclr_tf.training.optimizers import build_optimizer
    from uniclr_tf.training.schedules import WarmupCosine

    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}; received {optimizer!r}")
    schedule = WarmupCosine(learning_rate, batch_size, total_steps=total_steps, warmup_steps=0)
    return build_optimizer(optimizer, schedule, momentum=momentum, weight_decay=weight_decay)


def _test_monitor(head, test_features, test_labels):
    import keras

    class TestMonitor(keras.callbacks.Callback):
        """Writes the test top-1/top-5 of the current head into the epoch logs (for TensorBoard)."""

        def on_epoch_end(self, epoch, logs=None):
            acc = topk_accuracy(_head_scores(head, test_features), test_labels)
            if logs is not None:
                logs["test_top1"], logs["test_top5"] = acc["top1"], acc["top5"]

    return TestMonitor()


def check_augment_on(augment: bool, augment_on: str, info=None):
    """Raises ``ValueError`` (one line naming ``--augment_on``) unless augmented training can run
    here: ``augment_on`` is one of :data:`AUGMENT_ON`; ``"host"`` (tf.data) needs TensorFlow; with
    ``info``, ``"device"`` needs the training split in memory (a ``DataError`` otherwise). Nothing
    is checked with ``augment=False`` (precomputed features need neither)."""
    from uniclr_tf import data

    if augment_on not in AUGMENT_ON:
        raise UsageError(f"--augment_on: expected one of {AUGMENT_ON}; received {augment_on!r}")
    if not augment:
        return
    if augment_on == "host" and not data.have_tensorflow():
        raise UsageError("--augment_on=host augments the training images in tf.data, and TensorFlow is not "
                         "installed here; use --augment_on=device (or --noaugment)")
    if augment_on == "device" and info is not None and not info.split("train").in_memory:
        raise data.DataError(f"--augment_on=device needs the training split in memory, and that of "
                             f"{info.spec or info.name} ({info.num_train} images) streams from disk (tfds:, "
                             f"tfrecord:, a folder: over max_in_memory_mb); use --augment_on=host (tf.data)")


def train_augmenter(image_shape, mean, std, seed):
    """The training augmentation of the protocol, the same layer on the host and on the device: one
    view, random resized crop (area :data:`CROP_SCALE`, at the input size) + horizontal flip, then
    normalisation with ``mean``/``std``; no photometric change."""
    from uniclr_tf.augment import ViewAugmenter

    height, width = int(image_shape[0]), int(image_shape[1])
    return ViewAugmenter(global_size=(height, width), num_global=1, global_scale=CROP_SCALE,
                         jitter_rate=0.0, grayscale_rate=0.0, blur_rate=0.0, solarize_rate=0.0,
                         mean=mean, std=std, seed=seed)


def augmented_model(encoder, head, image_shape, augmenter=None):
    """The model ``fit`` trains with augmentation: the frozen ``encoder`` (inference mode) then
    ``head``. With ``augmenter`` (``--augment_on=device``) it takes the raw uint8 batch and runs the
    augmenter first, inside the compiled step (its random state advances every step: a Keras
    ``SeedGenerator`` threaded through the JAX step, a ``tf.random.Generator`` on TensorFlow);
    without, it takes the batch augmented (and normalised) by tf.data."""
    import keras

    if augmenter is None:
        inputs = keras.Input(tuple(image_shape), name="images")
        x = inputs
    else:
        inputs = keras.Input(tuple(image_shape), dtype="uint8", name="images")
        x = augmenter(inputs)[0]
    return keras.Model(inputs, head(encoder(x, training=False)), name="linear_eval")


def linear_eval(encoder, info, epochs: int = 100, batch_size: int = 256, learning_rate: float = 30.0,
                momentum: float = 0.9, weight_decay: float = 0.0, optimizer: str = "sgd",
                augment: bool = True, mean=None, std=None, seed: int = 0, tb_dir: Optional[str] = None,
                feature_batch_size: int = 512, verbose=1, label_fraction: float = 1.0,
                augment_on: str = "host") -> dict:
    """Trains a linear classifier on the frozen ``encoder``; returns test top-1/top-5 and settings.

    Args:
      encoder: functional backbone, normalised images ``[B, H, W, C]`` -> ``[B, F]``. It is frozen
        (``trainable`` is set to False during the call and restored after; inference-mode BN).
      info: a labelled :class:`uniclr_tf.data.DatasetInfo` (train and test splits).
      epochs, batch_size: training length and batch.
      learning_rate: the rate for a batch of 256; the peak is ``batch_size / 256 · learning_rate``,
        decayed to 0 by a cosine over ``epochs`` (no warm-up).
      momentum, weight_decay, optimizer: ``"sgd"`` (paper; decay in the gradient, as PyTorch) or ``"lars"``
        (paper, ImageNet-1K; decay added to the gradient, bias excluded).
      augment: random resized crop (area 0.08–1) + horizontal flip on the training images, the
        backbone run every step; False trains on features of the plain images, computed once.
      mean, std: the normalisation statistics of pretraining (default: ``info``'s).
      seed: seeds the classifier's initialisation, the shuffling and the augmentation, and picks
        the labelled subset.
      tb_dir: TensorBoard log folder (None: none).
      feature_batch_size: batch of the feature extraction passes.
      verbose: Keras ``fit`` verbosity (1: progress bar).
      label_fraction: train on this class-balanced share of the training split
        (:func:`uniclr_tf.evaluation.protocols.labelled_subset`; 1: all of it).
      augment_on: where the augmentation runs. ``"host"``: in tf.data (needs TensorFlow).
        ``"device"``: inside the compiled train step, on uint8 batches of the in-memory training
        split fed to ``fit`` from NumPy (:func:`uniclr_tf.data.numpy_batches`; no TensorFlow needed,
        e.g. Keras on JAX); the same augmenter (:func:`train_augmenter`), steps, schedule and initialisation.
        Ignored with ``augment=False``.

    Returns:
      ``{"top1", "top5", "train_loss", "train_top1", "settings": {...}}``; accuracies are
      fractions in [0, 1] of the (whole) test split after the last epoch; ``settings`` names the
      ``dataset`` and describes the ``label_subset``.
    """
    import keras

    from uniclr_tf.augment import EvalPreprocess

    _check_arguments(epochs, batch_size, info, "linear evaluation")
    check_augment_on(augment, augment_on, info)  # before any work
    start = time.time()
    keras.utils.set_random_seed(seed)
    mean = tuple(info.mean if mean is None else mean)
    std = tuple(info.std if std is None else std)
    info, subset = protocols.labelled_subset(info, label_fraction, seed)
    preprocess = EvalPreprocess(tuple(info.image_shape[:2]), mean, std)

    with _frozen(encoder):
        test_x, test_y = _split_features(encoder, preprocess, info, "test", feature_batch_size)
        check_labels(test_y, int(info.num_classes), "test")
        head = _linear_head(test_x.shape[1], int(info.num_classes), seed)
        if augment:
            model, fit_args, steps_per_epoch = _augmented_training(encoder, head, info, batch_size, mean, std, seed,
                                                                   augment_on)
        else:
            model, fit_args, steps_per_epoch = _feature_training(encoder, head, preprocess, info, batch_size,
                                                                 feature_batch_size)
        optimizer_ = _make_optimizer(optimizer, learning_rate, batch_size, epochs * steps_per_epoch, momentum,
                                     weight_decay)
        logs = _fit_head(model, optimizer_, fit_args, _test_monitor(head, test_x, test_y), epochs, tb_dir, verbose)

    acc = topk_accuracy(_head_scores(head, test_x), test_y, (1, 5))
    settings = dict(epochs=int(epochs), batch_size=int(batch_size), optimizer=optimizer,
                    learning_rate=float(learning_rate), peak_learning_rate=batch_size / 256 * float(learning_rate),
                    schedule="cosine", momentum=float(momentum), weight_decay=float(weight_decay),
                    augment=bool(augment), crop_scale=list(CROP_SCALE) if augment else None,
                    augment_on=augment_on if augment else None, seed=int(seed))
    return {"top1": acc["top1"], "top5": acc["top5"],
            "train_loss": float(logs["loss"][-1]), "train_top1": float(logs["top1"][-1]),
            "settings": _result_settings(info, subset, mean, std, settings, test_x, len(test_y),
                                         epochs * steps_per_epoch, start)}


def linear_evaluation(encoder, train, test, num_classes: Optional[int] = None, mean=None, std=None,
                      **kwargs) -> dict:
    """:func:`linear_eval` on your own arrays: a linear classifier trained on the frozen ``encoder``.

    Args:
      encoder: functional backbone, normalised images ``[B, H, W, C]`` -> ``[B, F]`` (``model.encoder``).
      train, test: ``(images, labels)``: uint8 images ``[N, H, W, C]`` of one shape, integer class ids
        ``[N]`` (or ``[N, 1]``, as ``keras.datasets`` gives them) in ``[0, num_classes)``.
      num_classes: the number of classes (default: the largest label + 1).
      mean, std: the per-channel statistics in [0, 1] units the encoder was pretrained with
        (``model.augmenter.mean`` / ``.std``). ``None`` means what it means to the augmenter and to
        :class:`~uniclr_tf.EvalPreprocess`: ImageNet's statistics for RGB images, 0.5 / 0.5 for grey ones.
      **kwargs: the rest of :func:`linear_eval`'s arguments (``epochs``, ``batch_size``, ``augment``,
        ``learning_rate``, ``label_fraction``, ``seed``, ...).

    Returns:
      :func:`linear_eval`'s result: ``{"top1", "top5", "train_loss", "train_top1", "settings"}``.

    Examples:
        >>> result = uniclr_tf.linear_evaluation(model.encoder, (x_train, y_train), (x_test, y_test),
        ...                                      mean=augmenter.mean, std=augmenter.std, epochs=100)
        >>> result["top1"]
    """
    from uniclr_tf.augment.functional import _default_stats

    info = arrays_info(train, test, num_classes)
    # None as the augmenter reads it (linear_eval's own None, the dataset's statistics, suits the CLI, whose
    # runs are pretrained with them)
    mean, std = _default_stats(info.image_shape[-1], mean, std)
    return linear_eval(encoder, info, mean=mean, std=std, **kwargs)


def arrays_info(train, test, num_classes=None):
    """A labelled in-memory :class:`uniclr_tf.data.DatasetInfo` of ``train`` and ``test``
    ``(uint8 images [N, H, W, C], class ids [N] or [N, 1])``; each mistake is named."""
    from uniclr_tf.data.spec import DatasetInfo, Split
    from uniclr_tf.data.stats import _array_stats

    splits = {}
    for name, pair in (("train", train), ("test", test)):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ValueError(f"{name}: expected (images, labels); received {type(pair).__name__}")
        images, labels = np.asarray(pair[0]), np.asarray(pair[1])
        if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] not in (1, 3) or not len(images):
            raise ValueError(f"{name}: expected uint8 images [N, H, W, C] with C 1 or 3; received {images.dtype} "
                             f"of shape {images.shape}")
        if labels.ndim == 2 and labels.shape[1] == 1:
            labels = labels[:, 0]
        if labels.ndim != 1 or len(labels) != len(images) or not np.issubdtype(labels.dtype, np.integer):
            raise ValueError(f"{name}: expected integer labels [N] (N = {len(images)} images); received "
                             f"{labels.dtype} of shape {labels.shape}")
        splits[name] = Split(name, len(images), images, labels.astype(np.int64))
    shape = splits["train"].images.shape[1:]
    if splits["test"].images.shape[1:] != shape:
        raise ValueError(f"test: images of shape {splits['test'].images.shape[1:]}, and train's are {shape}")
    classes = int(num_classes) if num_classes is not None else 1 + int(
        max(split.labels.max() for split in splits.values()))
    for name, split in splits.items():
        check_labels(split.labels, classes, name)
    mean, std = _array_stats(splits["train"].images)
    return DatasetInfo("arrays", tuple(int(d) for d in shape), classes, splits["train"].num_examples,
                       splits["test"].num_examples, mean, std, splits)


def _check_arguments(epochs, batch_size, info, what):
    """Raises unless ``epochs`` and ``batch_size`` are >= 1 and ``info`` is labelled (``what`` needs labels)."""
    if epochs < 1 or batch_size < 1:
        raise ValueError(f"epochs and batch_size must be >= 1; received {epochs}, {batch_size}")
    if not info.num_classes:
        raise RunError(f"{info.spec or info.name}: unlabelled dataset; {what} needs labels")


@contextlib.contextmanager
def _frozen(encoder):
    """``encoder.trainable`` is False inside (no gradient reaches it, inference-mode BN), restored after."""
    was_trainable = encoder.trainable
    encoder.trainable = False
    try:
        yield encoder
    finally:
        encoder.trainable = was_trainable


def _linear_head(feature_dim, num_classes, seed):
    """The classifier trained: one dense layer, N(0, 0.01²) weights (as the authors' code), zero bias."""
    import keras

    init = keras.initializers.RandomNormal(stddev=0.01, seed=seed)
    return keras.Sequential([keras.Input((feature_dim,)),
                             keras.layers.Dense(num_classes, kernel_initializer=init, name="linear")],
                            name="linear_classifier")


def _fit_head(model, optimizer, fit_args, test_monitor, epochs, tb_dir, verbose):
    """Compiles ``model`` (cross-entropy, top-1) and fits it; returns the per-epoch logs. The test
    accuracy is only monitored (TensorBoard, where TensorFlow is installed)."""
    import keras

    from uniclr_tf import data

    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=[keras.metrics.SparseCategoricalAccuracy(name="top1")])
    callbacks = [test_monitor]
    if tb_dir and data.have_tensorflow():  # Keras's TensorBoard callback writes through tf.summary
        callbacks.append(keras.callbacks.TensorBoard(tb_dir, update_freq="epoch"))
    return model.fit(epochs=epochs, callbacks=callbacks, verbose=verbose, **fit_args).history


def _result_settings(info, subset, mean, std, settings, test_x, num_test, steps, start):
    """``settings`` of :func:`linear_eval`'s result: the data, the ``settings`` given, then the sizes."""
    import keras

    return {"dataset": info.spec or info.name, "label_subset": subset, "mean": list(mean), "std": list(std),
            **settings, "num_train": int(info.num_train), "num_test": int(num_test),
            "feature_dim": int(test_x.shape[1]), "num_classes": int(info.num_classes), "steps": int(steps),
            "backend": keras.backend.backend(), "seconds": round(time.time() - start, 2)}


def _feature_training(encoder, head, preprocess, info, batch_size, feature_batch_size):
    """``(model, fit arguments, steps per epoch)`` of training on precomputed features: the frozen
    backbone's features of the plain training images, computed once; the head alone is fitted."""
    train_x, train_y = _split_features(encoder, preprocess, info, "train", feature_batch_size)
    check_labels(train_y, int(info.num_classes), "train")
    steps_per_epoch = math.ceil(info.num_train / batch_size)
    return head, dict(x=train_x, y=train_y, batch_size=batch_size, shuffle=True), steps_per_epoch


def _augmented_training(encoder, head, info, batch_size, mean, std, seed, augment_on):
    """``(model, fit arguments, steps per epoch)`` of training on augmented images: the frozen
    backbone run every step, the augmentation in tf.data (``augment_on="host"``) or inside the
    compiled step on uint8 batches from NumPy (``"device"``). Both read the split in the same rule:
    a new permutation every pass, the passes concatenated, cut into full batches (so a labelled
    subset smaller than a batch still trains), ``max(N // batch, 1)`` of them an epoch."""
    from uniclr_tf import data

    height, width, channels = info.image_shape
    if info.split("train").in_memory:  # streamed splits are checked by the loss instead
        check_labels(info.split("train").labels, int(info.num_classes), "train")
    augmenter = train_augmenter((height, width), mean, std, seed)
    if augment_on == "device":  # uint8 batches from NumPy, augmented inside the compiled step
        model = augmented_model(encoder, head, (height, width, channels), augmenter)
        train_data = data.numpy_batches(info, batch_size, shuffle=True, seed=seed, with_labels=True,
                                        across_passes=True)
    else:  # augmented (and normalised) in tf.data
        model = augmented_model(encoder, head, (height, width, channels))
        train_data = data.pretrain_dataset(info, batch_size, lambda x: augmenter(x)[0], shuffle=True,
                                           seed=seed, repeat=True, with_labels=True)
    steps_per_epoch = max(info.num_train // batch_size, 1)
    return model, dict(x=train_data, steps_per_epoch=steps_per_epoch), steps_per_epoch


def knn_result(encoder, info, k: int = 200, temperature: float = 0.1, mean=None, std=None,
               batch_size: int = 512, label_fraction: float = 1.0, seed: int = 0) -> dict:
    """:func:`uniclr_tf.evaluation.knn_eval` of ``encoder`` on ``info`` (training split as the
    memory bank, test split as queries), with the settings, as ``linear_eval.json`` records it.
    ``label_fraction`` < 1 cuts the memory bank to the labelled subset drawn with ``seed``
    (:func:`uniclr_tf.evaluation.protocols.labelled_subset`)."""
    from uniclr_tf import evaluation
    from uniclr_tf.augment import EvalPreprocess

    if not info.num_classes:
        raise RunError(f"{info.spec or info.name}: unlabelled dataset; kNN evaluation needs labels")
    start = time.time()
    mean = tuple(info.mean if mean is None else mean)
    std = tuple(info.std if std is None else std)
    info, subset = protocols.labelled_subset(info, label_fraction, seed)
    preprocess = EvalPreprocess(tuple(info.image_shape[:2]), mean, std)
    if info.split("train").in_memory:
        check_labels(info.split("train").labels, int(info.num_classes), "train")
    acc = evaluation.knn_eval(encoder, preprocess, split_source(info, "train", batch_size),
                              split_source(info, "test", batch_size), int(info.num_classes), k, temperature,
                              batch_size)
    return {"top1": acc["top1"], "top5": acc["top5"],
            "settings": {"dataset": info.spec or info.name, "label_subset": subset, "mean": list(mean),
                         "std": list(std), "k": int(k),
                         "temperature": float(temperature), "memory_bank": int(info.num_train),
                         "num_test": int(info.num_test), "seconds": round(time.time() - start, 2)}}


# ---------------------------------------------------------------------------------------------
# The command line


@dataclasses.dataclass(frozen=True)
class LinearEvalConfig:
    """Every setting of one ``linear_eval`` invocation. Each field is a flag of the same name, declared
    with its help (:func:`uniclr_tf.config.train_config.flag`); the order is ``--help``'s (:data:`HELP_GROUPS`)."""

    run_dir: str = flag("", "Run folder written by uniclr_tf.train (encoder.keras, dataset.json, config.json).")
    dataset: str = dataset_flag()  # empty: the pretraining dataset
    data_dir: str = data_dir_flag()
    label_fraction: float = label_fraction_flag()
    max_examples: int = max_examples_flag()  # 0: as the pretraining run (another --dataset: all)
    seed: int = flag(0, "Random seed (labelled subset, classifier initialisation, shuffling, augmentation).")
    epochs: int = flag(100, "Epochs of linear-classifier training (paper: 100).")
    batch_size: int = flag(256, "Batch size (paper: 256).")
    learning_rate: float = flag(30.0, "Learning rate for a batch of 256 (peak = batch_size/256 * this), cosine to 0; "
                                      "paper: 30 with SGD, 0.02 with LARS (ImageNet-1K).")
    momentum: float = flag(0.9, "Optimizer momentum.")
    weight_decay: float = flag(0.0, "Weight decay (paper: 0).")
    optimizer: str = flag("sgd", "sgd (paper: CIFAR, ImageNet-100) or lars (paper: ImageNet-1K, with "
                                 "--learning_rate=0.02 --batch_size=1024 --epochs=90).", choices=OPTIMIZERS)
    augment: bool = flag(True, "Random resized crop (0.08-1) + flip on the training images; --noaugment precomputes "
                               "the features of the plain images once (much faster).")
    augment_on: str = flag("host", "Where the augmentation runs: host: in tf.data (needs TensorFlow); device: inside "
                                   "the compiled step, on uint8 batches of the in-memory training split (no TensorFlow "
                                   "needed: the JAX-only GPU machines). The same augmentation, steps and schedule "
                                   "either way.", choices=AUGMENT_ON)
    knn: bool = flag(False, "Run the weighted kNN evaluation instead of the linear classifier (memory bank: the "
                            "labelled training images).")
    knn_k: int = flag(200, "k of the weighted kNN.")
    knn_temperature: float = flag(0.1, "Temperature of the weighted kNN.")
    out: str = flag("", "Results JSON (empty: <run_dir>/linear_eval.json); each protocol's section is merged in.")

    def __post_init__(self):
        check = check_common_fields(self)
        check(self.optimizer in OPTIMIZERS, "optimizer", f"one of {OPTIMIZERS}")
        check(self.augment_on in AUGMENT_ON, "augment_on", f"one of {AUGMENT_ON}")
        check(self.knn_k >= 1, "knn_k", "an integer >= 1")
        check(self.knn_temperature > 0, "knn_temperature", "a number > 0")

    @property
    def out_path(self):
        return self.out or os.path.join(self.run_dir, RESULTS_FILE)


def run(cfg: LinearEvalConfig) -> dict:
    """Runs the evaluation ``cfg`` describes, merges its section into the results JSON, prints the
    one-line result. The data is loaded (and checked) before the encoder."""
    folder = check_run_dir(cfg.run_dir)  # before the slow imports: a typo fails at once
    linear = not cfg.knn
    check_augment_on(linear and cfg.augment, cfg.augment_on)  # TensorFlow for --augment_on=host
    info = load_run_data(folder, cfg.max_examples or None, cfg.dataset, cfg.data_dir)
    check_augment_on(linear and cfg.augment, cfg.augment_on, info)  # an in-memory split for device
    run_ = load_run(cfg.run_dir, require_labels=False)  # the labels that matter are the data's, checked above
    spec = info.spec or info.name
    key = protocols.section_key("knn" if cfg.knn else "linear", spec, cfg.label_fraction, cfg.seed)
    extra = {"run_dir": os.path.abspath(cfg.run_dir), "pretraining_dataset": folder.dataset_spec}
    if cfg.knn:
        result = knn_result(run_.encoder, info, cfg.knn_k, cfg.knn_temperature, run_.mean, run_.std,
                            label_fraction=cfg.label_fraction, seed=cfg.seed)
    else:
        print(f"{key} of {cfg.run_dir}: {info.num_train} training / {info.num_test} test images "
              f"{tuple(info.image_shape)}, {cfg.epochs} epochs, batch {cfg.batch_size}, "
              f"{f'augmented on the {cfg.augment_on}' if cfg.augment else 'precomputed features'}")
        result = linear_eval(run_.encoder, info, epochs=cfg.epochs, batch_size=cfg.batch_size,
                             learning_rate=cfg.learning_rate, momentum=cfg.momentum,
                             weight_decay=cfg.weight_decay, optimizer=cfg.optimizer, augment=cfg.augment,
                             augment_on=cfg.augment_on, mean=run_.mean, std=run_.std, seed=cfg.seed,
                             label_fraction=cfg.label_fraction,
                             tb_dir=os.path.join(cfg.run_dir, TB_DIR,
                                                 protocols.folder_name(spec, cfg.label_fraction, cfg.seed)))
    protocols.merge_results(cfg.out_path, key, result, extra)
    subset = result["settings"]["label_subset"]
    print(f"{key}: {subset['size']} of {subset['of']} labelled training images -> {cfg.out_path}")
    print(f"{'kNN' if cfg.knn else 'linear eval'} top-1 {result['top1']:.4f} top-5 {result['top5']:.4f}")
    return result


#: ``--help``'s groups: ``(title, first field)`` (:func:`uniclr_tf.config.flagutil.group_fields`).
HELP_GROUPS = [("protocol (what is evaluated)", "run_dir"), ("linear classifier", "epochs"), ("kNN", "knn"),
               ("output", "out")]


def define_flags(flag_values=None):
    """One flag per ``LinearEvalConfig`` field, same name, same default, the help next to the field."""
    from uniclr_tf.config import flagutil

    flagutil.define_flags(LinearEvalConfig, flag_values=flag_values)


def config_from_flags(flag_values=None) -> LinearEvalConfig:
    from uniclr_tf.config import flagutil

    return flagutil.config_from_flags(LinearEvalConfig, flag_values)


def _cli_config():
    """The flags' config, refused (one ``error:`` line) before any work if TensorFlow is missing
    for ``--augment_on=host``."""
    cfg = config_from_flags()
    check_augment_on(cfg.augment and not cfg.knn, cfg.augment_on)
    return cfg


def main(argv):
    run_main(argv, _cli_config, run)


def entry_point():
    """The ``uniclr-eval`` console script (pyproject.toml): what ``python -m uniclr_tf.linear_eval`` does."""
    from uniclr_tf.config import flagutil
    define_flags()
    flagutil.run_cli(__name__, __doc__, main, groups=flagutil.group_fields(LinearEvalConfig, HELP_GROUPS))


if __name__ == "__main__":
    entry_point()
