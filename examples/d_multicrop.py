"""(d) Multi-crop: two global views and several small local views of each image.

`ViewAugmenter` is a Keras layer: uint8 images in, a tuple of normalised float views out. Each local
view is compared with every global view's target, so the backbone must take any input size (built
on `keras.Input((None, None, C))`, as `uniclr_tf.build_encoder`'s backbones are).
"""
import os

import numpy as np

import uniclr_tf

TINY = os.environ.get("UNICLR_EXAMPLES_TINY") == "1"
EPOCHS, BATCH = (1, 64) if TINY else (10, 256)

augmenter = uniclr_tf.ViewAugmenter(
    global_size=32, local_size=16, num_global=2, num_local=4,  # 2 x 32 px + 4 x 16 px views
    global_scale=(0.3, 1.0), local_scale=(0.05, 0.3),  # the fractions of the image each view covers
    seed=0)
# (The same sizes from a method's recipe: ViewAugmenter.from_recipe("uniclr", (32, 32, 3), num_local=4, local_size=16).)
images = np.random.default_rng(0).integers(0, 256, (4 * BATCH, 32, 32, 3), dtype="uint8")
print("views:", [tuple(v.shape) for v in augmenter(images[:8])])

encoder = uniclr_tf.build_encoder("small", (32, 32, 3), width=8 if TINY else 32)
model = uniclr_tf.UniCLR(encoder, method="simaffinity", projector_dims=(512, 128), augmenter=augmenter)
model.compile(optimizer=uniclr_tf.LARS(uniclr_tf.WarmupCosine(0.3, BATCH, EPOCHS * 4, 2)))
history = model.fit(images, batch_size=BATCH, epochs=EPOCHS, verbose=2)
print("view pairs compared:", model.view_pairs(augmenter.num_global + augmenter.num_local))
