"""Backbones: CIFAR-style ResNet-18, ResNet-50 (224 px), a small CPU encoder and a tiny one for tests.

Every builder returns a functional ``keras.Model`` mapping normalised float images
``[B, H, W, C]`` to pooled features ``[B, F]``. Spatial sizes are left free (``(None, None, C)``)
so one backbone serves the global and the smaller local crops of multi-crop; ``input_shape`` gives
the channels and checks that the nominal size is large enough. Functional models can be cloned
(``keras.models.clone_model``) for the EMA target and saved as ``.keras`` files.
"""

import keras
from keras import layers

ENCODERS = ("resnet18", "resnet50", "small", "tiny")


def batch_norm(synchronized=False, name=None, **kwargs):
    """BatchNormalization; ``synchronized`` makes MirroredStrategy match one device (docs/stack.md).

    Only the TF backend has (and needs) synchronized BN: under JAX ``DataParallel`` the arrays are
    global, so plain BN already normalises over the whole batch.
    """
    synchronized = bool(synchronized) and keras.backend.backend() == "tensorflow"
    return layers.BatchNormalization(momentum=0.9, epsilon=1e-5, synchronized=synchronized, name=name, **kwargs)


def _bn(synchronized, name):
    return batch_norm(synchronized, name)


def _basic_block(x, filters, stride, synchronized, name):
    shortcut = x
    y = layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False,
                      kernel_initializer="he_normal", name=f"{name}_conv1")(x)
    y = _bn(synchronized, f"{name}_bn1")(y)
    y = layers.ReLU(name=f"{name}_relu1")(y)
    y = layers.Conv2D(filters, 3, padding="same", use_bias=False,
                      kernel_initializer="he_normal", name=f"{name}_conv2")(y)
    y = _bn(synchronized, f"{name}_bn2")(y)
    if stride != 1 or shortcut.shape[-1] != filters:
        shortcut = layers.Conv2D(filters, 1, strides=stride, use_bias=False,
                                 kernel_initializer="he_normal", name=f"{name}_down_conv")(shortcut)
        shortcut = _bn(synchronized, f"{name}_down_bn")(shortcut)
    y = layers.Add(name=f"{name}_add")([y, shortcut])
    return layers.ReLU(name=f"{name}_out")(y)


def resnet18_cifar(input_shape=(32, 32, 3), width=64, synchronized_bn=False, name="resnet18"):
    """ResNet-18 with the CIFAR stem (3×3 conv, stride 1, no max-pool), as in the paper's §4.1.

    Works from 28×28×1 (Fashion-MNIST) to 32×32×3 (CIFAR) and larger; the feature size is
    ``8 * width`` (512 for the standard width 64).
    """
    inputs = keras.Input(shape=(None, None, input_shape[-1]), name="images")
    x = layers.Conv2D(width, 3, padding="same", use_bias=False, kernel_initializer="he_normal",
                      name="stem_conv")(inputs)
    x = _bn(synchronized_bn, "stem_bn")(x)
    x = layers.ReLU(name="stem_relu")(x)
    for stage, mult in enumerate((1, 2, 4, 8)):
        for block in range(2):
            stride = 2 if (stage > 0 and block == 0) else 1
            x = _basic_block(x, width * mult, stride, synchronized_bn, f"stage{stage + 1}_block{block + 1}")
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    return keras.Model(inputs, x, name=name)


def tiny_encoder(input_shape=(28, 28, 1), width=16, synchronized_bn=False, name="tiny", stages=None):
    """A three-convolution encoder (features ``4 * width``) for tests and CPU smoke runs.

    ``stages``: ``(width multiple, stride)`` per 3×3 convolution (default the three of ``tiny``)."""
    inputs = keras.Input(shape=(None, None, input_shape[-1]), name="images")
    x = inputs
    for i, (mult, stride) in enumerate(stages or ((1, 1), (2, 2), (4, 2))):
        x = layers.Conv2D(width * mult, 3, strides=stride, padding="same", use_bias=False,
                          kernel_initializer="he_normal", name=f"conv{i + 1}")(x)
        x = _bn(synchronized_bn, f"bn{i + 1}")(x)
        x = layers.ReLU(name=f"relu{i + 1}")(x)
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    return keras.Model(inputs, x, name=name)


def small_encoder(input_shape=(28, 28, 1), width=32, synchronized_bn=False, name="small"):
    """``tiny`` with a fourth stride-2 convolution (features ``8 * width``): a 4×4 last map at 28 px,
    a receptive field over most of the image, for the CPU quickstart (``make demo``; CPU trials in
    configs/quickstart.flags: kNN 0.791 against 0.779 for ``tiny`` of the same width)."""
    return tiny_encoder(input_shape, width, synchronized_bn, name, stages=((1, 1), (2, 2), (4, 2), (8, 2)))


def resnet50(input_shape=(224, 224, 3), synchronized_bn=False, name="resnet50"):
    """ResNet-50 from ``keras.applications`` (random init, ``weights=None``), pooled 2048-d features."""
    base = keras.applications.ResNet50(weights=None, include_top=False, pooling="avg",
                                       input_shape=(None, None, input_shape[-1]))
    if synchronized_bn:
        def clone_fn(layer):
            cfg = layer.get_config()
            if isinstance(layer, layers.BatchNormalization):
                cfg["synchronized"] = keras.backend.backend() == "tensorflow"
            return layer.__class__.from_config(cfg)
        base = keras.models.clone_model(base, clone_function=clone_fn)
    return keras.Model(base.inputs, base.outputs, name=name)


def build_encoder(name, input_shape, width=None, synchronized_bn=False):
    """Builds the encoder called ``name`` (one of ``ENCODERS``) for images of ``input_shape``."""
    input_shape = tuple(int(d) for d in input_shape)
    if len(input_shape) != 3 or input_shape[-1] not in (1, 3):
        raise ValueError(f"input_shape must be (H, W, C) with C in (1, 3); received {input_shape}")
    if min(input_shape[:2]) < 8:
        raise ValueError(f"images must be at least 8x8 pixels; received input_shape={input_shape}")
    if name == "resnet18":
        return resnet18_cifar(input_shape, width=width or 64, synchronized_bn=synchronized_bn)
    if name == "tiny":
        return tiny_encoder(input_shape, width=width or 16, synchronized_bn=synchronized_bn)
    if name == "small":
        return small_encoder(input_shape, width=width or 32, synchronized_bn=synchronized_bn)
    if name == "resnet50":
        if width not in (None, 64):
            raise ValueError(f"resnet50 has a fixed width; received width={width}")
        return resnet50(input_shape, synchronized_bn=synchronized_bn)
    raise ValueError(f"Unknown encoder {name!r}; expected one of {ENCODERS}")
