"""(b) The SimAffinity objective and the symmetric loss in your own model's training step.

The objectives are plain `keras.ops` functions of two batches of embeddings `[N, D]`, so they go into
any training code on TensorFlow and JAX alike; here, a Keras model's `compute_loss`, which Keras'
own `train_step` calls on both backends (run it with KERAS_BACKEND=jax too).
"""
import os

import keras
import numpy as np

import uniclr_tf
from uniclr_tf import objectives

TINY = os.environ.get("UNICLR_EXAMPLES_TINY") == "1"


class TwoViews(keras.Model):
    """Two augmented views of each image through one backbone and projector."""

    def __init__(self, backbone, projector, augmenter, temperature=0.2, gamma=0.01, **kwargs):
        super().__init__(**kwargs)
        self.backbone, self.projector, self.augmenter = backbone, projector, augmenter
        self.temperature, self.gamma = temperature, gamma

    def call(self, images, training=False):
        v1, v2 = self.augmenter(images, training=training)
        z = self.projector(self.backbone(keras.ops.concatenate([v1, v2]), training=training), training=training)
        return keras.ops.split(z, 2)  # [z1, z2]

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        z1, z2 = y_pred
        a = objectives.affinity_matrix(z1, z2, temperature=self.temperature)  # A = n(z1) n(z2)^T / tau
        cross_entropy = objectives.sim_affinity_loss(z1, z2, temperature=self.temperature, gamma=0.0)
        return cross_entropy + self.gamma * objectives.symmetry_loss(a)  # + gamma ||A - A^T||_F (Eq. 5)


backbone = uniclr_tf.build_encoder("small", (28, 28, 1), width=8 if TINY else 32)
projector = keras.Sequential([keras.Input((backbone.output_shape[-1],)), keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(64)])
model = TwoViews(backbone, projector, uniclr_tf.ViewAugmenter.from_recipe("uniclr", (28, 28, 1)))
model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9))
images = np.random.default_rng(0).integers(0, 256, (128 if TINY else 2048, 28, 28, 1), dtype="uint8")
history = model.fit(images, batch_size=64, epochs=1 if TINY else 5, verbose=2)

# The same loss in one call (gamma inside), on any two embedding batches:
z1, z2 = model(images[:64], training=False)
print("SimAffinity + symmetric loss:", float(objectives.sim_affinity_loss(z1, z2, temperature=0.2, gamma=0.01)),
      "on", keras.backend.backend())
