"""(c) A BYOL-style EMA target and predictor: BYOL itself, and the same two tricks on SimTrace.

A method with an EMA target keeps a momentum copy of the encoder and projector (`model.target_encoder`,
`model.target_projector`), updated inside every train step: t <- m t + (1 - m) o, with m rising from
its base to 1 on a cosine over the run. No callback is needed; the momentum is logged as `ema_momentum`.
"""
import os

import keras
import numpy as np

import uniclr_tf

TINY = os.environ.get("UNICLR_EXAMPLES_TINY") == "1"
EPOCHS, BATCH = (2, 64) if TINY else (10, 256)
images = np.random.default_rng(0).integers(0, 256, (4 * BATCH, 28, 28, 1), dtype="uint8")
augmenter = uniclr_tf.ViewAugmenter.from_recipe("byol", (28, 28, 1))  # BYOL's asymmetric views

# 1. BYOL: the method brings its predictor (Linear-BN-ReLU-Linear) and its EMA target (base 0.99).
byol = uniclr_tf.UniCLR(uniclr_tf.build_encoder("tiny", (28, 28, 1)), method="byol",
                        projector_dims=(256, 64), predictor_hidden=256, augmenter=augmenter)
byol.compile(optimizer=uniclr_tf.LARS(0.2))
history = byol.fit(images, batch_size=BATCH, epochs=EPOCHS, verbose=0)
print("BYOL distance", [round(v, 3) for v in history.history["distance"]],
      "EMA momentum", [round(v, 4) for v in history.history["ema_momentum"]])

# 2. SimTrace with the same tricks as options (UniCLR, Table 1), and a predictor of your own.
predictor = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"), keras.layers.Dense(64)])
simtrace = uniclr_tf.UniCLR(uniclr_tf.build_encoder("tiny", (28, 28, 1)), method="simtrace",
                            options={"ema_momentum": 0.996}, predictor=predictor, projector_dims=(256, 64),
                            augmenter=augmenter)
simtrace.compile(optimizer=uniclr_tf.LARS(0.2))
simtrace.fit(images, batch_size=BATCH, epochs=EPOCHS, verbose=0)
print(simtrace.method, "| predictor:", simtrace.predictor.name, "| target:", simtrace.target_encoder.name)

online, target = simtrace.encoder.get_weights()[0], simtrace.target_encoder.get_weights()[0]
print("the target trails the online encoder: mean |online - target| =", float(np.abs(online - target).mean()))
