"""(e) Export a pretrained encoder as a TensorFlow SavedModel, then load it with `tf.saved_model.load`
and extract features: what a serving process or another project does, without uniclr_tf or Keras.

The export needs the TensorFlow backend (the default). Its `serving_default` signature takes uint8
images `[batch, height, width, C]` of any size and returns float32 `features` and `embedding`.
"""
import os

import numpy as np

import uniclr_tf

TINY = os.environ.get("UNICLR_EXAMPLES_TINY") == "1"
EXPORT = "runs/examples/exported_encoder"

images = np.random.default_rng(0).integers(0, 256, (512, 28, 28, 1), dtype="uint8")
model = uniclr_tf.UniCLR(uniclr_tf.build_encoder("tiny", (28, 28, 1)), method="simclr", projector_dims=(256, 64),
                         augmenter=uniclr_tf.ViewAugmenter.from_recipe("simclr", (28, 28, 1)))
model.compile(optimizer=uniclr_tf.LARS(0.3))
model.fit(images, batch_size=128, epochs=1 if TINY else 5, verbose=0)

info = uniclr_tf.export_saved_model(model, EXPORT, overwrite=True)  # preprocessing from the augmenter
print("exported:", sorted(os.listdir(EXPORT)), "| outputs:", info["outputs"])

# What a serving process does, with TensorFlow alone (it needs neither uniclr_tf nor Keras):
import tensorflow as tf  # noqa: E402

serving_default = tf.saved_model.load(EXPORT).signatures["serving_default"]
larger = np.random.default_rng(1).integers(0, 256, (8, 40, 40, 1), dtype="uint8")  # any size: resampled
print("features of 40 px images:", serving_default(images=tf.constant(larger))["features"].shape)

# Or from Python with uniclr_tf: a function from uint8 arrays to NumPy features and embeddings.
serve = uniclr_tf.load_saved_model(EXPORT)
features = serve(images[:8])["features"]
print("same features as the Keras encoder:", np.allclose(
    features, model.encoder.predict(uniclr_tf.EvalPreprocess(28)(images[:8]), verbose=0), atol=1e-4))
