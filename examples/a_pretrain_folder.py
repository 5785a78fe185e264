"""(a) Pretrain your own Keras backbone on your own image folder with `fit`, then kNN-evaluate it.

    python examples/a_pretrain_folder.py [FOLDER]   # FOLDER/train/<class>/*.png, FOLDER/test/<class>/*.png

Without FOLDER it writes a small folder of synthetic images (stripes, 4 classes) to try it on.
UNICLR_EXAMPLES_TINY=1 runs it in seconds (the test suite does).
"""
import os
import sys

import keras
import numpy as np

import uniclr_tf

TINY = os.environ.get("UNICLR_EXAMPLES_TINY") == "1"
SIZE, EPOCHS, BATCH = 32, (1 if TINY else 30), 64


def load(folder):  # every image resized to SIZE x SIZE: uint8 [N, SIZE, SIZE, 3], labels from sub-folders
    data = keras.utils.image_dataset_from_directory(folder, image_size=(SIZE, SIZE), batch_size=None, shuffle=False)
    images, labels = zip(*[(x.numpy(), y.numpy()) for x, y in data])
    return np.stack(images).astype("uint8"), np.array(labels), len(data.class_names)


def synthetic_folder(root, count, rng=np.random.default_rng(0)):  # 4 classes: stripes across or down, light or dark
    from PIL import Image
    stripes = np.tile(100 * ((np.arange(SIZE) // 2) % 2), (SIZE, 1))
    for split, c, i in np.ndindex(2, 4, count):
        image = rng.normal(170 if c < 2 else 70, 20, (SIZE, SIZE)) + (stripes if c % 2 else stripes.T)
        os.makedirs(path := os.path.join(root, ("train", "test")[split], f"class{c}"), exist_ok=True)
        Image.fromarray(np.clip(image, 0, 255).astype("uint8")).convert("RGB").save(os.path.join(path, f"{i}.png"))
    return root


folder = sys.argv[1] if len(sys.argv) > 1 else synthetic_folder("runs/examples/stripes", 32 if TINY else 200)
train_x, train_y, num_classes = load(os.path.join(folder, "train"))
test_x, test_y, _ = load(os.path.join(folder, "test"))

# Your backbone: any Keras model from images to pooled features (here a small CNN; free input size).
inputs = keras.Input((None, None, 3))
x = inputs
for filters in (32, 64, 128):
    x = keras.layers.Conv2D(filters, 3, strides=2, padding="same", use_bias=False)(x)
    x = keras.layers.ReLU()(keras.layers.BatchNormalization()(x))
backbone = keras.Model(inputs, keras.layers.GlobalAveragePooling2D()(x), name="my_backbone")

augmenter = uniclr_tf.ViewAugmenter.from_recipe("uniclr", (SIZE, SIZE, 3))
model = uniclr_tf.UniCLR(backbone, method="simaffinity", projector_dims=(512, 128), augmenter=augmenter)
steps = EPOCHS * max(len(train_x) // BATCH, 1)
model.compile(optimizer=uniclr_tf.LARS(uniclr_tf.WarmupCosine(0.3, BATCH, steps, steps // 10)))
model.fit(train_x, batch_size=BATCH, epochs=EPOCHS, verbose=2)

preprocess = uniclr_tf.EvalPreprocess(SIZE, augmenter.mean, augmenter.std)  # as the views are normalised
knn = uniclr_tf.knn_eval(model.encoder, preprocess, (train_x, train_y), (test_x, test_y), num_classes, k=20)
print(f"kNN top-1 of the pretrained backbone: {knn['top1']:.3f}")
