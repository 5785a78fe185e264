r"""Pretrain an encoder with UniCLR.

    python -m uniclr_tf.train --flagfile=configs/simtrace.flags [--flag=value ...]

A run folder ``<run_dir>/<run_name>`` receives the resolved flagfile (``flags.txt``, replayable
with ``--flagfile``), ``config.json``, ``dataset.json``, TensorBoard logs (``tb/``), per-epoch
checkpoints, ``history.json`` + ``curves.png``, the backbone as ``encoder.keras``, the whole model's
weights, and ``metrics.json`` with the final kNN top-1 next to the raw-pixel kNN baseline.
"""

import dataclasses
import json
import os
import sys
import time

from absl import app, flags

from uniclr_tf import flagutil
from uniclr_tf.config import (AUGMENT_ON, ENCODERS, OBJECTIVES, OPTIMIZERS, PRECISIONS, STRATEGIES,
                              WHITENING_MODES, TrainConfig)

HELP = {
    "dataset": "fashion_mnist | tfds:NAME[:SPLIT] | folder:PATH",
    "data_dir": "TFDS data_dir (tfds: datasets only).",
    "image_size": "Resize images to this square size; 0 keeps the dataset's size.",
    "skip_bad_files": "folder: datasets: skip (and count) unreadable images instead of stopping.",
    "max_examples": "Use only the first N images of each split (0: all); for smoke tests.",
    "encoder": "Backbone architecture.",
    "encoder_width": "Base width of resnet18/tiny (0: 64 for resnet18, 16 for tiny).",
    "projector_dims": "Projector layer sizes, e.g. 2048,2048,256 (CIFAR) or 2048,2048,2048 (ImageNet).",
    "predictor": "Add the asymmetric predictor on the online branch.",
    "predictor_hidden": "Hidden size of the predictor.",
    "objective": "UniCLR objective (PAPER.md).",
    "temperature": "Temperature tau; 0 uses the objective's default (0.5 SimAffinity, 1.0 SimWhitening).",
    "gamma": "Weight of the symmetric loss ||A - A^T||_F.",
    "eps": "Ridge added to the covariance before Cholesky.",
    "whitening_mode": "SimWhitening: cholesky (paper) or one_sided (authors' code).",
    "stop_gradient_cov": "Stop the gradient through the whitening statistics (authors' code).",
    "whitening_groups": "Whiten G feature groups separately (block-diagonal covariance; cheap at large D); "
                        "1 is the paper's full whitening.",
    "symmetric_directions": "Average the loss over both directions L(z1,z2), L(z2,z1) (authors' code).",
    "ema_momentum": "Base momentum of an EMA target encoder (e.g. 0.99); 0 disables it.",
    "num_local_crops": "Number of multi-crop local views (0: two global views only).",
    "local_size": "Local crop size; 0: half the global size.",
    "global_scale": "RandomResizedCrop area range of global views.",
    "local_scale": "RandomResizedCrop area range of local views.",
    "optimizer": "lars (paper), sgd or adamw.",
    "base_learning_rate": "Base learning rate; the peak is batch_size/256 * base.",
    "weight_decay": "Weight decay (LARS/SGD add it to the gradient; biases and BN excluded for LARS).",
    "momentum": "Optimizer momentum.",
    "warmup_epochs": "Linear warm-up epochs before the cosine decay.",
    "epochs": "Training epochs.",
    "batch_size": "Global batch size (images per step, each giving num_views views).",
    "steps_per_epoch": "Steps per epoch; 0: one pass over the training split.",
    "knn_k": "k of the weighted kNN evaluation.",
    "knn_temperature": "Temperature of the weighted kNN evaluation.",
    "knn_every": "Run the kNN monitor every N epochs (0: only the final evaluation).",
    "knn_max_train": "Size of the kNN memory bank drawn from the training split (0: all).",
    "online_probe": "Train a linear probe on stop-gradient features when labels exist.",
    "augment_on": "host: augment in tf.data on the CPU; device: inside the compiled train step.",
    "precision": "Compute precision (linear algebra of the objectives always runs in float32).",
    "strategy": "default | mirrored (tf.distribute, TF) | tpu (TPUStrategy, TF) | data_parallel (JAX).",
    "gather_across_replicas": "Gather embeddings across replicas (global affinity/covariance); "
                              "--nogather_across_replicas keeps them per replica (authors' code).",
    "tpu": "TPU name or grpc:// address for --strategy=tpu.",
    "jit_compile": "Compile the train step with XLA on TF (JAX always jits).",
    "steps_per_execution": "Train steps per compiled call.",
    "seed": "Random seed.",
    "run_dir": "Parent folder of run folders.",
    "run_name": "Run folder name (empty: <objective>-<dataset>-<timestamp>).",
    "export": "Export a SavedModel of the encoder into <run>/export at the end (TF backend).",
}
ENUMS = {"objective": OBJECTIVES, "encoder": ENCODERS, "optimizer": OPTIMIZERS, "precision": PRECISIONS,
         "strategy": STRATEGIES, "augment_on": AUGMENT_ON, "whitening_mode": WHITENING_MODES}


def define_flags(flag_values=flags.FLAGS):
    """One flag per ``TrainConfig`` field, same name, same default."""
    flagutil.define_flags(TrainConfig, HELP, ENUMS, flag_values)


def config_from_flags(flag_values=flags.FLAGS):
    return flagutil.config_from_flags(TrainConfig, flag_values)


def build_augmenter(cfg, info):
    from uniclr_tf.augment import ViewAugmenter
    size = cfg.image_size or info.image_shape[0]
    shape = (size, size, info.image_shape[-1])
    return ViewAugmenter.for_dataset(shape, num_local=cfg.num_local_crops, local_size=cfg.local_size or None,
                                     global_scale=cfg.global_scale, local_scale=cfg.local_scale,
                                     mean=info.mean, std=info.std, seed=cfg.seed)


def build_model(cfg, info, augmenter=None, synchronized_bn=False):
    """Encoder + projector (+ predictor, EMA target, probe) wired into a ``UniCLR`` model."""
    from uniclr_tf import encoders, heads
    from uniclr_tf.model import UniCLR
    size = cfg.image_size or info.image_shape[0]
    encoder = encoders.build_encoder(cfg.encoder, (size, size, info.image_shape[-1]),
                                     width=cfg.encoder_width or None, synchronized_bn=synchronized_bn)
    feat = encoder.output_shape[-1]
    proj = heads.projector(feat, cfg.projector_dims, synchronized_bn=synchronized_bn)
    pred = heads.predictor(cfg.projector_dims[-1], cfg.predictor_hidden, synchronized_bn) if cfg.predictor else None
    options = {}
    if cfg.objective == "simwhitening" and cfg.whitening_mode != "cholesky":
        options["mode"] = cfg.whitening_mode
    if cfg.stop_gradient_cov and cfg.objective != "simaffinity":
        options["stop_gradient_cov"] = True
    if cfg.whitening_groups != 1 and cfg.objective != "simaffinity":
        options["groups"] = cfg.whitening_groups
    if cfg.symmetric_directions and cfg.objective != "simtrace":
        options["symmetric_directions"] = True
    return UniCLR(encoder, proj, pred, objective=cfg.objective, temperature=cfg.temperature or None,
                  gamma=cfg.gamma, eps=cfg.eps, objective_options=options,
                  ema_momentum=cfg.ema_momentum or None, ema_total_steps=cfg.epochs * max(cfg.steps_per_epoch, 1),
                  augmenter=augmenter, num_global=2, gather_across_replicas=cfg.gather_across_replicas,
                  num_classes=info.num_classes if cfg.online_probe and info.num_classes else None)


def build_optimizer(cfg, steps_per_epoch):
    """LARS (or SGD / AdamW) with the linear warm-up + cosine schedule, lr = batch/256 · base."""
    import keras
    from uniclr_tf.optimizers import LARS
    from uniclr_tf.schedules import WarmupCosine
    total = cfg.epochs * steps_per_epoch
    schedule = WarmupCosine(cfg.base_learning_rate, cfg.batch_size, total_steps=total,
                            warmup_steps=int(round(cfg.warmup_epochs * steps_per_epoch)))
    if cfg.optimizer == "lars":
        # The online probe is a plain linear classifier: no trust ratio, no decay (as solo-learn).
        return LARS(schedule, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                    exclude_from_adaptation=["linear_probe"], exclude_from_weight_decay=["linear_probe"])
    if cfg.optimizer == "sgd":
        return keras.optimizers.SGD(schedule, momentum=cfg.momentum, weight_decay=cfg.weight_decay or None)
    return keras.optimizers.AdamW(schedule, weight_decay=cfg.weight_decay)


def make_run_dir(cfg):
    name = cfg.run_name or f"{cfg.objective}-{cfg.dataset.replace(':', '_').replace('/', '_')}-{time.strftime('%Y%m%d-%H%M%S')}"
    path = os.path.join(cfg.run_dir, name)
    os.makedirs(os.path.join(path, "checkpoints"), exist_ok=True)
    return path


def run(cfg):
    """Runs one pretraining job described by ``cfg``; returns the final metrics dict."""
    import keras
    from uniclr_tf import data, distribute
    from uniclr_tf.augment import EvalPreprocess
    from uniclr_tf.callbacks import HistoryRecorder, KNNMonitor
    from uniclr_tf.evaluation import knn_eval, raw_pixel_knn

    if cfg.export and keras.backend.backend() != "tensorflow":
        raise ValueError("--export writes a TF SavedModel and needs KERAS_BACKEND=tensorflow; train under "
                         f"{keras.backend.backend()!r}, then run `python -m uniclr_tf.export` with the TF backend")
    keras.utils.set_random_seed(cfg.seed)
    run_dir = make_run_dir(cfg)
    with open(os.path.join(run_dir, "flags.txt"), "w") as f:
        f.write(cfg.to_flagfile())
    with open(os.path.join(run_dir, "config.json"), "w") as f:
        f.write(cfg.to_json())

    info = data.load_dataset(cfg.dataset, image_size=cfg.image_size or None, data_dir=cfg.data_dir or None,
                             skip_bad_files=cfg.skip_bad_files, max_examples=cfg.max_examples or None)
    size = cfg.image_size or info.image_shape[0]
    with open(os.path.join(run_dir, "dataset.json"), "w") as f:
        json.dump({"dataset": cfg.dataset, "image_shape": [size, size, info.image_shape[-1]],
                   "num_classes": info.num_classes, "mean": list(map(float, info.mean)),
                   "std": list(map(float, info.std)), "num_train": info.num_train}, f, indent=2)
    num_train = min(info.num_train, cfg.max_examples or info.num_train)
    steps_per_epoch = cfg.steps_per_epoch or max(num_train // cfg.batch_size, 1)
    cfg = dataclasses.replace(cfg, steps_per_epoch=steps_per_epoch)

    if cfg.precision != "float32":
        keras.mixed_precision.set_global_policy(f"mixed_{cfg.precision}")
    strategy = distribute.make_strategy(cfg.strategy, cfg.tpu)
    replicas = distribute.num_replicas(strategy)
    if cfg.batch_size % replicas:
        raise ValueError(f"--batch_size={cfg.batch_size} must be divisible by the {replicas} replicas")
    augmenter = build_augmenter(cfg, info)
    labelled = bool(info.num_classes) and cfg.online_probe
    if data.have_tensorflow():
        train_ds = data.pretrain_dataset(info, cfg.batch_size, augmenter if cfg.augment_on == "host" else None,
                                         shuffle=True, seed=cfg.seed, repeat=True, with_labels=labelled)
    elif cfg.augment_on == "device":  # e.g. the JAX-only GPU machine: in-memory uint8 batches
        train_ds = data.numpy_batches(info, cfg.batch_size, shuffle=True, seed=cfg.seed, with_labels=labelled)
    else:
        raise ValueError("--augment_on=host uses tf.data, and TensorFlow is not installed here; "
                         "use --augment_on=device")
    with distribute.scope(strategy):
        model = build_model(cfg, info, augmenter if cfg.augment_on == "device" else None,
                            synchronized_bn=replicas > 1)
        # JAX must jit ("auto"): with jit_compile=False Keras-on-JAX runs the step eagerly (~70x
        # slower on a GPU). TF runs a tf.function graph unless --jit_compile asks for XLA.
        jit = True if cfg.jit_compile else ("auto" if keras.backend.backend() == "jax" else False)
        model.compile(optimizer=build_optimizer(cfg, steps_per_epoch), jit_compile=jit,
                      steps_per_execution=cfg.steps_per_execution)

    preprocess = EvalPreprocess(size, info.mean, info.std)
    callbacks = []
    knn_train = knn_test = None
    if info.num_classes:
        knn_train = data.as_numpy(info, "train", max_examples=cfg.knn_max_train or None)
        knn_test = data.as_numpy(info, "test")
        callbacks.append(KNNMonitor(model.encoder, preprocess, knn_train, knn_test, info.num_classes,
                                    every=cfg.knn_every, k=cfg.knn_k, temperature=cfg.knn_temperature))
    history = HistoryRecorder(run_dir)
    callbacks += [history,
                  keras.callbacks.CSVLogger(os.path.join(run_dir, "log.csv")),
                  # One rolling checkpoint (a ResNet-18 run would otherwise keep ~100 MB per epoch).
                  keras.callbacks.ModelCheckpoint(os.path.join(run_dir, "checkpoints", "last.weights.h5"),
                                                  save_weights_only=True)]
    if data.have_tensorflow():  # Keras's TensorBoard callback writes through tf.summary
        callbacks.append(keras.callbacks.TensorBoard(os.path.join(run_dir, "tb"), update_freq="epoch"))
    print(f"run folder: {run_dir}\n{cfg.dataset}: {num_train} training images {tuple(info.image_shape)}, "
          f"{steps_per_epoch} steps/epoch of batch {cfg.batch_size}, backend {keras.backend.backend()}")
    model.fit(train_ds, epochs=cfg.epochs, steps_per_epoch=steps_per_epoch, callbacks=callbacks, verbose=1)

    model.encoder.save(os.path.join(run_dir, "encoder.keras"))
    model.projector.save(os.path.join(run_dir, "projector.keras"))
    model.save_weights(os.path.join(run_dir, "model.weights.h5"))
    metrics = {"epochs": cfg.epochs, "steps": cfg.epochs * steps_per_epoch,
               "final_loss": history.epochs[-1]["loss"] if history.epochs else None}
    if info.num_classes:
        ssl = knn_eval(model.encoder, preprocess, knn_train, knn_test, info.num_classes, cfg.knn_k, cfg.knn_temperature)
        raw = raw_pixel_knn(knn_train, knn_test, info.num_classes, cfg.knn_k, cfg.knn_temperature)
        metrics.update(knn_top1=ssl["top1"], knn_top5=ssl["top5"], raw_pixel_knn_top1=raw["top1"],
                       raw_pixel_knn_top5=raw["top5"], knn_memory_bank=len(knn_train[0]), knn_test=len(knn_test[0]))
        print(f"kNN top-1 (k={cfg.knn_k}, T={cfg.knn_temperature}) on the test split: {ssl['top1']:.4f} | "
              f"raw-pixel kNN baseline: {raw['top1']:.4f}")
    with open(os.path.join(run_dir, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=2)
    if cfg.export:
        from uniclr_tf.export import export_run
        export_run(run_dir, os.path.join(run_dir, "export"))
    return run_dir, metrics


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    from uniclr_tf.data import DataError
    try:
        cfg = config_from_flags()
        run(cfg)
    except DataError as e:  # bad data: one line naming the culprit, no traceback
        sys.exit(f"error: {e}")
    except ValueError as e:
        if "cfg" in locals() and not str(e).startswith("--"):
            raise  # a bug, not a bad flag: keep the traceback
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    define_flags()
    app.run(main)
