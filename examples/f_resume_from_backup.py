"""(f) Resume an interrupted `fit` from its backup.

`BackupAndResume(folder)` backs the whole training state up at every epoch end (weights, EMA target,
method state, optimizer state and step), off the training thread and atomically. When
`fit` starts again with it, on a model built and compiled the same way, it resumes after the last
backed-up epoch: here the first `fit` is interrupted by an error during epoch 3, as a kill or a time
limit would stop it, and a new model (as a new process would build) finishes the run.
"""
import os
import shutil

import keras
import numpy as np

import uniclr_tf

TINY = os.environ.get("UNICLR_EXAMPLES_TINY") == "1"
EPOCHS, BATCH, FOLDER = 5, 64, "runs/examples/resumable"
images = np.random.default_rng(0).integers(0, 256, ((4 if TINY else 16) * BATCH, 28, 28, 1), dtype="uint8")
shutil.rmtree(FOLDER, ignore_errors=True)  # a fresh start for this example


def build():
    model = uniclr_tf.UniCLR(uniclr_tf.build_encoder("tiny", (28, 28, 1), width=8 if TINY else 16), method="byol",
                             projector_dims=(256, 64), augmenter=uniclr_tf.ViewAugmenter.from_recipe("byol", (28, 28, 1)))
    steps = EPOCHS * len(images) // BATCH
    model.compile(optimizer=uniclr_tf.LARS(uniclr_tf.WarmupCosine(0.3, BATCH, steps, steps // 5)))
    return model


class Interruption(keras.callbacks.Callback):  # stands for a kill during epoch 3
    def on_train_batch_begin(self, batch, logs=None):
        if self.model.optimizer.iterations.numpy() >= 2.5 * len(images) // BATCH:
            raise KeyboardInterrupt("interrupted during epoch 3")


backup = uniclr_tf.BackupAndResume(FOLDER)
try:
    build().fit(images, batch_size=BATCH, epochs=EPOCHS, callbacks=[backup, Interruption()], verbose=2)
except KeyboardInterrupt as e:
    print(e)

history = build().fit(images, batch_size=BATCH, epochs=EPOCHS, callbacks=[backup], verbose=2)
print("resumed after", backup.resumed_from, "and trained epochs", [e + 1 for e in history.epoch])
