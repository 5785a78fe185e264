"""JAX ``steps_per_execution = K``: K train steps in one compiled call (``steps.jax_step.BlockedSteps``).

The blocked run must be the same training as K separate steps: same weights, EMA target, BN
statistics, augmentation random stream and optimizer step count, with exactly ``steps_per_epoch``
steps an epoch also when K does not divide it (Keras's own loop would round an epoch up to a
multiple of K), on one device and under ``keras.distribution.DataParallel`` on 2 CPU devices.
"""

import numpy as np
import pytest

BLOCKED = r"""
import json, os, numpy as np, keras, jax
from uniclr_tf import encoders, heads
from uniclr_tf.augment import ViewAugmenter
from uniclr_tf.model import UniCLR

images = np.random.default_rng(0).integers(0, 256, size=(40, 16, 16, 1)).astype("uint8")
labels = np.arange(40) % 3

def batches():
    rng = np.random.default_rng(5)
    while True:
        idx = rng.permutation(40)[:8]
        yield images[idx], labels[idx]

def train(steps_per_execution, devices=1, epochs=2, steps_per_epoch=5):
    keras.distribution.set_distribution(
        keras.distribution.DataParallel(devices=jax.devices()[:devices]) if devices > 1 else None)
    keras.utils.set_random_seed(1)
    aug = ViewAugmenter.for_dataset((16, 16, 1), seed=3)
    model = UniCLR(encoders.build_encoder("tiny", (16, 16, 1), width=4), heads.projector(16, (32, 8)),
                   heads.predictor(8, 16), objective="simaffinity", augmenter=aug, num_classes=3,
                   ema_momentum=0.9, ema_total_steps=10)
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), steps_per_execution=steps_per_execution)
    calls = []
    model.fit(batches(), epochs=epochs, steps_per_epoch=steps_per_epoch, verbose=0,
              callbacks=[keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: calls.append(b))])
    history = model.history.history
    return {"weights": [np.asarray(w).ravel().tolist() for w in model.weights],
            "iterations": int(model.optimizer.iterations), "loss": history["loss"],
            "probe": history["probe_accuracy"], "batch_ends": len(calls)}

print(json.dumps({"one": train(1), "three": train(3), "three_on_2_devices": train(3, devices=2)}))
"""


def test_blocked_steps_equal_single_steps(run_python):
    out = run_python(BLOCKED, backend="jax", env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
    one = out["one"]
    assert one["iterations"] == 10 and one["batch_ends"] == 10
    # K = 3 does not divide the 5 steps of an epoch: blocks of 3 + 2, exactly 10 steps in all
    # (Keras's Python loop would have run 12), on one device and on 2 (global arrays, one batch).
    for blocked in (out["three"], out["three_on_2_devices"]):
        assert blocked["iterations"] == 10 and blocked["batch_ends"] == 4
        assert len(blocked["weights"]) == len(one["weights"])  # weights, EMA target, BN stats, seeds
        for a, b in zip(one["weights"], blocked["weights"]):
            np.testing.assert_allclose(b, a, rtol=2e-5, atol=2e-6)
        np.testing.assert_allclose(blocked["loss"], one["loss"], rtol=2e-5)
        np.testing.assert_allclose(blocked["probe"], one["probe"], rtol=1e-6)
    # the run trained: the two epochs differ
    assert one["loss"][0] != one["loss"][1]
