"""Backbones: CIFAR-style ResNet-18, ResNet-50 (224 px), Keras Hub's ResNets and ViTs, a small CPU encoder
and a tiny one for tests.

Every builder returns a functional ``keras.Model`` mapping normalised float images
``[B, H, W, C]`` to pooled features ``[B, F]``. Spatial sizes are left free (``(None, None, C)``)
so one backbone serves the global and the smaller local crops of multi-crop; ``input_shape`` gives
the channels and checks that the nominal size is large enough. Functional models can be cloned
(``keras.models.clone_model``) for the EMA target and saved as ``.keras`` files.
"""

import contextlib
import contextvars

import keras
from keras import layers, ops

from uniclr_tf.config.errors import UsageError

ENCODERS = ("resnet18", "resnet50", "small", "tiny", "vit_tiny", "vit_small", "hub_resnet18", "hub_resnet50")
STEMS = ("auto", "cifar", "imagenet")
# Keras Hub ViTs (randomly initialised): (hidden size, layers, heads, MLP size), DeiT-Tiny / -Small.
VITS = {"vit_tiny": (192, 12, 3, 768), "vit_small": (384, 12, 6, 1536)}
# Keras Hub ResNets (ImageNet stem, randomly initialised): blocks per stage and block type, as its
# resnet_18 / resnet_50 presets (ResNet v1: no pre-activation).
HUB_RESNETS = {"hub_resnet18": ((2, 2, 2, 2), "basic_block"), "hub_resnet50": ((3, 4, 6, 3), "bottleneck_block")}

_BN_GROUPS = contextvars.ContextVar("uniclr_tf_bn_groups", default=(1, False))


@contextlib.contextmanager
def batch_norm_groups(groups, one_pass=False):
    """Within this block, :func:`batch_norm` builds :class:`GroupBatchNormalization` layers with
    ``groups`` groups (``train --batch_norm=per_device`` on JAX: one group per device) or, with
    ``one_pass``, one-pass statistics (``--batch_norm=global_one_pass``); 1 and False: plain BN."""
    token = _BN_GROUPS.set((int(groups), bool(one_pass)))
    try:
        yield
    finally:
        _BN_GROUPS.reset(token)


@keras.saving.register_keras_serializable(package="uniclr_tf")
class GroupBatchNormalization(layers.BatchNormalization):
    """Batch norm whose training statistics are those of ``groups`` equal, contiguous slices of the
    batch (each slice normalised by its own mean and variance: "ghost" batch norm).

    Under JAX ``keras.distribution.DataParallel`` over G devices with ``groups=G``, each slice is
    one device's shard of the batch, so no statistic crosses devices: per-device BN, as PyTorch DDP
    without SyncBN, instead of the global BN that a global array gives (two all-reduces per BN layer
    and step on the critical path, forward and backward). The moving statistics follow the mean of
    the groups' statistics. Inference (``training=False``) is plain batch norm with them, so a saved
    backbone evaluates the same on any number of devices. Channels must be the last axis; the batch
    must split into ``groups`` equal slices.

    ``one_pass=True`` takes the training statistics in one pass, E[x] and E[x²] as two independent
    reductions of the input (variance = E[x²] − E[x]², clipped at 0, in float32 as PyTorch's
    SyncBatchNorm does), instead of Keras's mean then the mean of squared deviations: with
    ``groups=1`` under ``DataParallel`` XLA combines their all-reduces, so one all-reduce per BN layer
    forward and one backward instead of two dependent ones each. Its backward is written out
    (:func:`_normalise`): Σg and Σg·x̂ as two independent reductions, x̂ recomputed from the input.
    """

    #: ``get_config`` keys beyond ``BatchNormalization``'s: how training takes the statistics; inference
    #: is plain batch norm (``tools.release`` drops them to make a portable copy).
    TRAINING_OPTIONS = ("groups", "one_pass")

    def __init__(self, groups=1, one_pass=False, **kwargs):
        super().__init__(**kwargs)
        if int(groups) < 1:
            raise ValueError(f"groups must be >= 1; received {groups!r}")
        self.groups = int(groups)
        self.one_pass = bool(one_pass)

    def call(self, inputs, training=None, mask=None):
        plain = self.groups == 1 and not self.one_pass
        if plain or not (training and self.trainable) or mask is not None or self.renorm:
            return super().call(inputs, training=training, mask=mask)
        if self.axis not in (-1, len(inputs.shape) - 1):
            raise ValueError(f"{self.name}: GroupBatchNormalization needs channels last; axis={self.axis}")
        batch = inputs.shape[0]
        if batch is not None and batch % self.groups:
            raise ValueError(f"{self.name}: a batch of {batch} does not split into {self.groups} groups")
        if self.one_pass:
            return self._one_pass(inputs)
        x = ops.cast(inputs, keras.backend.result_type(inputs.dtype, "float32"))
        grouped = ops.reshape(x, (self.groups, -1) + tuple(x.shape[1:]))
        axes = tuple(range(1, len(grouped.shape) - 1))
        mean, variance = ops.moments(grouped, axes=axes, keepdims=True)
        self._update_moving_statistics(mean, variance)
        out = (grouped - mean) * ops.rsqrt(variance + self.epsilon)
        if self.scale:
            out = out * ops.cast(self.gamma, x.dtype)
        if self.center:
            out = out + ops.cast(self.beta, x.dtype)
        return ops.cast(ops.reshape(out, ops.shape(x)), self.compute_dtype)

    def _update_moving_statistics(self, mean, variance):
        """The moving mean and variance follow the mean over groups of the batch's ``[G, 1, ..., C]``
        statistics, in the statistics' dtype."""
        channels = mean.shape[-1]
        for moving, batch in ((self.moving_mean, mean), (self.moving_variance, variance)):
            moving.assign(ops.cast(moving, batch.dtype) * self.momentum
                          + ops.mean(ops.reshape(batch, (self.groups, channels)), axis=0) * (1.0 - self.momentum))

    def _one_pass(self, inputs):
        """Training-mode ``one_pass`` batch norm: E[x] and E[x²] as two independent reductions, and a
        hand-written backward whose two sums, Σg and Σg·x̂ (g the output's gradient, x̂ the normalised
        input), are independent reductions too (autodiff of the statistics makes them dependent).

        With the batch sharded over devices each pair becomes one combined all-reduce; on one device each
        pair is one pass over the activation. The backward recomputes x̂ from the input in its own dtype
        (bfloat16 under mixed precision) rather than keeping a float32 copy."""
        grouped = ops.reshape(inputs, (self.groups, -1) + tuple(inputs.shape[1:]))
        axes = tuple(range(1, len(grouped.shape) - 1))
        channels = grouped.shape[-1]
        ftype = keras.backend.result_type(inputs.dtype, "float32")
        x = ops.cast(grouped, ftype)
        mean = ops.mean(x, axis=axes, keepdims=True)
        variance = ops.maximum(ops.mean(ops.square(x), axis=axes, keepdims=True) - ops.square(mean), 0.0)
        mean, variance = ops.stop_gradient(mean), ops.stop_gradient(variance)  # their gradient is in grad()
        self._update_moving_statistics(mean, variance)
        inv_std = ops.rsqrt(variance + self.epsilon)
        gamma = ops.cast(self.gamma, ftype) if self.scale else ops.ones((channels,), ftype)
        beta = ops.cast(self.beta, ftype) if self.center else ops.zeros((channels,), ftype)
        out = _normalise(grouped, gamma, beta, mean, inv_std, axes, self.compute_dtype)
        return ops.reshape(out, ops.shape(inputs))

    def get_config(self):
        return {**super().get_config(), **{key: getattr(self, key) for key in self.TRAINING_OPTIONS}}


def _normalise(x, gamma, beta, mean, inv_std, axes, dtype):
    """``(x - mean) · inv_std · gamma + beta`` in the statistics' dtype (float32 for bfloat16 x), cast to
    ``dtype``, with the batch-norm gradient written out: for g the output's gradient and x̂ the
    normalised x (n elements per channel over ``axes``), dx = gamma · inv_std · (g − Σg / n − x̂ · Σ(g·x̂)
    / n), dgamma = Σ(g·x̂), dbeta = Σg. That is the gradient through the batch's mean and variance too,
    so ``mean`` and ``inv_std`` (computed from x) get none of their own."""

    @ops.custom_gradient
    def normalise(x, gamma, beta, mean, inv_std):
        y = ops.cast((ops.cast(x, mean.dtype) - mean) * inv_std * gamma + beta, dtype)

        def grad(*args, upstream=None):
            g = ops.cast(args[0] if upstream is None else upstream, mean.dtype)
            x_hat = (ops.cast(x, mean.dtype) - mean) * inv_std
            mean_g = ops.mean(g, axis=axes, keepdims=True)
            mean_gx = ops.mean(g * x_hat, axis=axes, keepdims=True)
            dx = (gamma * inv_std) * (g - mean_g - x_hat * mean_gx)
            count = ops.cast(ops.size(g) // ops.size(mean_g), mean.dtype)  # elements per channel and group
            channels = ops.shape(gamma)[0]
            dgamma = ops.sum(ops.reshape(mean_gx, (-1, channels)), axis=0) * count
            dbeta = ops.sum(ops.reshape(mean_g, (-1, channels)), axis=0) * count
            return ops.cast(dx, x.dtype), dgamma, dbeta, ops.zeros_like(mean), ops.zeros_like(inv_std)

        return y, grad

    return normalise(x, gamma, beta, mean, inv_std)


def _plain_batch_norm(synchronized):
    """Whether :func:`batch_norm` here builds Keras' own unsynchronised ``BatchNormalization``."""
    groups, one_pass = _BN_GROUPS.get()
    return groups == 1 and not one_pass and not (bool(synchronized) and keras.backend.backend() == "tensorflow")


def batch_norm(synchronized=False, name=None, momentum=0.9, epsilon=1e-5, **kwargs):
    """BatchNormalization; ``synchronized`` makes MirroredStrategy match one device (docs/stack.md).

    Only the TF backend has (and needs) synchronized BN: under JAX ``DataParallel`` the arrays are
    global, so plain BN already normalises over the whole batch. Inside :func:`batch_norm_groups`
    (G > 1) it is a :class:`GroupBatchNormalization` with G groups instead (per-device statistics).
    """
    groups, one_pass = _BN_GROUPS.get()
    if groups > 1 or one_pass:
        return GroupBatchNormalization(groups=groups, one_pass=one_pass, momentum=momentum, epsilon=epsilon,
                                       name=name, **kwargs)
    synchronized = bool(synchronized) and keras.backend.backend() == "tensorflow"
    return layers.BatchNormalization(momentum=momentum, epsilon=epsilon, synchronized=synchronized, name=name,
                                     **kwargs)


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


def resnet18_cifar(input_shape=(32, 32, 3), width=64, synchronized_bn=False, name="resnet18", stem="cifar"):
    """ResNet-18 with the CIFAR stem (3×3 conv, stride 1, no max-pool), as in the paper's §4.1, or
    with ``stem="imagenet"`` the ImageNet one (7×7 conv stride 2, 3×3 max-pool stride 2: 4× less
    spatial work, the choice for ≥ 64 px).

    Works from 28×28×1 (Fashion-MNIST) to 32×32×3 (CIFAR) and larger; the feature size is
    ``8 * width`` (512 for the standard width 64).
    """
    inputs = keras.Input(shape=(None, None, input_shape[-1]), name="images")
    if stem == "imagenet":
        x = layers.Conv2D(width, 7, strides=2, padding="same", use_bias=False, kernel_initializer="he_normal",
                          name="stem_conv")(inputs)
    else:
        x = layers.Conv2D(width, 3, padding="same", use_bias=False, kernel_initializer="he_normal",
                          name="stem_conv")(inputs)
    x = _bn(synchronized_bn, "stem_bn")(x)
    x = layers.ReLU(name="stem_relu")(x)
    if stem == "imagenet":
        x = layers.MaxPooling2D(3, strides=2, padding="same", name="stem_pool")(x)
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
    return with_our_batch_norm(keras.Model(base.inputs, base.outputs, name=name), synchronized_bn)


def with_our_batch_norm(model, synchronized_bn=False):
    """``model`` (functional) with each ``BatchNormalization`` rebuilt by :func:`batch_norm`'s rules, its
    own momentum and epsilon kept: synchronised under TF ``MirroredStrategy`` with ``synchronized_bn``,
    a :class:`GroupBatchNormalization` inside :func:`batch_norm_groups` (``--batch_norm=per_device`` or
    ``global_one_pass``), so a backbone built by another library follows ``--batch_norm`` as ours do.
    Returns ``model`` itself when nothing changes."""
    if _plain_batch_norm(synchronized_bn):
        return model

    def clone_fn(layer):
        cfg = layer.get_config()
        if isinstance(layer, layers.BatchNormalization):
            for key in ("synchronized", *GroupBatchNormalization.TRAINING_OPTIONS):
                cfg.pop(key, None)
            return batch_norm(synchronized_bn, **cfg)
        return layer.__class__.from_config(cfg)

    return keras.models.clone_model(model, clone_function=clone_fn)


def hub_resnet(name, input_shape, synchronized_bn=False):
    """A Keras Hub ``ResNetBackbone`` (``HUB_RESNETS[name]``: ResNet-18 or -50 v1 with the ImageNet stem,
    7×7 conv stride 2 and max-pool, for images of 64 px and more), randomly initialised (no preset, no
    download), global-average pooled: 512 / 2048-d features. Its layers are Keras core layers, so the
    saved encoder loads without Keras Hub; batch norm follows ``--batch_norm`` (:func:`with_our_batch_norm`)."""
    keras_hub = _keras_hub(name)
    blocks, block_type = HUB_RESNETS[name]
    backbone = keras_hub.models.ResNetBackbone(
        input_conv_filters=[64], input_conv_kernel_sizes=[7], stackwise_num_filters=[64, 128, 256, 512],
        stackwise_num_blocks=list(blocks), stackwise_num_strides=[1, 2, 2, 2], block_type=block_type,
        use_pre_activation=False, image_shape=(None, None, input_shape[-1]))
    features = layers.GlobalAveragePooling2D(name="pool")(backbone.output)
    return with_our_batch_norm(keras.Model(backbone.inputs, features, name=name), synchronized_bn)


def resnet18_stem(stem, image_size):
    """``--encoder_stem``: ``auto`` is the CIFAR stem below 64 px, the ImageNet stem from 64 px."""
    if stem not in STEMS:
        raise UsageError(f"--encoder_stem: expected one of {STEMS}; received {stem!r}")
    if stem == "auto":
        return "cifar" if image_size < 64 else "imagenet"
    return stem


def vit_patch_size(image_size):
    """The ViT patch for an image size: 4 below 64 px (28 px: 7×7 patches), 8 below 128, 16 above."""
    patch = 4 if image_size < 64 else 8 if image_size < 128 else 16
    if image_size % patch:
        raise UsageError(f"--image_size={image_size}: a ViT needs a multiple of its patch size {patch} "
                         "(set --image_size)")
    return patch


@keras.saving.register_keras_serializable(package="uniclr_tf")
class ClassToken(layers.Layer):
    """The class token of a ViT's output sequence ``[B, T, D]`` -> ``[B, D]`` (its pooled features)."""

    def call(self, x):
        return x[:, 0]

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])


@keras.saving.register_keras_serializable(package="uniclr_tf")
class ViTPatchEmbedding(layers.Layer):
    """A ViT's input: non-overlapping ``patch × patch`` patches of ``[B, H, W, C]`` images, each
    linearly embedded (a strided convolution) to ``hidden_dim``, a learned class token in front and
    learned position embeddings added -> ``[B, 1 + H·W/patch², hidden_dim]``.

    The computation, initialisers and weight shapes of Keras Hub's ``ViTPatchingAndEmbedding``
    (keras-hub 0.32), whose ``get_config`` emits ``num_patches`` / ``num_positions`` that its
    ``__init__`` refuses: ``clone_model`` (an EMA target) and ``load_model`` fail on it. This one
    round-trips, and it loads without Keras Hub imported first (docs/stack.md).
    """

    def __init__(self, image_size, patch_size, hidden_dim, **kwargs):
        super().__init__(**kwargs)
        self.image_size = tuple(int(s) for s in image_size)
        self.patch_size = int(patch_size)
        self.hidden_dim = int(hidden_dim)
        if any(s % self.patch_size for s in self.image_size):
            raise ValueError(f"image size {self.image_size} is not a multiple of the patch size {self.patch_size}")
        self.num_positions = 1 + (self.image_size[0] // self.patch_size) * (self.image_size[1] // self.patch_size)
        self.patch_embedding = layers.Conv2D(self.hidden_dim, self.patch_size, strides=self.patch_size,
                                             padding="valid", dtype=self.dtype_policy, name="patch_embedding")
        self.position_embedding = layers.Embedding(
            self.num_positions, self.hidden_dim, dtype=self.dtype_policy,
            embeddings_initializer=keras.initializers.RandomNormal(stddev=0.02), name="position_embedding")

    def build(self, input_shape):
        self.class_token = self.add_weight(shape=(1, 1, self.hidden_dim), initializer="random_normal",
                                           name="class_token")
        self.patch_embedding.build(input_shape)
        self.position_embedding.build((1, self.num_positions))

    def call(self, images):
        x = self.patch_embedding(images)
        shape = ops.shape(x)
        x = ops.reshape(x, (shape[0], -1, self.hidden_dim))
        token = ops.tile(ops.cast(self.class_token, x.dtype), (shape[0], 1, 1))
        positions = self.position_embedding(ops.expand_dims(ops.arange(self.num_positions), 0))
        return ops.concatenate([token, x], axis=1) + positions

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.num_positions, self.hidden_dim)

    def get_config(self):
        return {**super().get_config(), "image_size": self.image_size, "patch_size": self.patch_size,
                "hidden_dim": self.hidden_dim}


def _keras_hub(encoder):
    """Keras Hub, a dependency of the ``vit_*`` and ``hub_*`` encoders only; a clear error without it."""
    try:
        import keras_hub
    except ImportError as error:
        raise UsageError(f"--encoder={encoder} needs Keras Hub, which is not installed ({error}): "
                         "pip install --no-deps keras-hub==0.32.0 regex tokenizers (docs/stack.md says why "
                         "--no-deps)") from error
    return keras_hub


def vit(name, input_shape, dims=None):
    """A ViT: :class:`ViTPatchEmbedding` (patch from :func:`vit_patch_size`) then Keras Hub's
    ``ViTEncoder`` (the transformer blocks and final layer norm of its ``ViTBackbone``, random init:
    no download), pooled as the class token. ``dims``: ``(hidden size, layers, heads, MLP size)``,
    default ``VITS[name]``. Its position embeddings fix the input size: global views only (no
    multi-crop)."""
    _keras_hub(name)  # keras-hub 0.32 does not export ViTEncoder in its API
    from keras_hub.src.models.vit.vit_layers import ViTEncoder

    hidden, depth, heads_, mlp = dims or VITS[name]
    size = int(input_shape[0])
    if int(input_shape[1]) != size:
        raise ValueError(f"{name}: square images only; received input_shape={tuple(input_shape)}")
    inputs = keras.Input(shape=tuple(input_shape), name="images")
    x = ViTPatchEmbedding((size, size), vit_patch_size(size), hidden, name="patch_embedding")(inputs)
    x = ViTEncoder(num_layers=depth, num_heads=heads_, hidden_dim=hidden, mlp_dim=mlp, layer_norm_epsilon=1e-6,
                   name="vit_encoder")(x)
    return keras.Model(inputs, ClassToken(name="class_token")(x), name=name)


def build_encoder(name, input_shape, width=None, synchronized_bn=False, stem="auto"):
    """Builds the encoder called ``name`` (one of ``ENCODERS``) for images of ``input_shape``;
    ``stem`` is resnet18's (:func:`resnet18_stem`)."""
    input_shape = tuple(int(d) for d in input_shape)
    if len(input_shape) != 3 or input_shape[-1] not in (1, 3):
        raise ValueError(f"input_shape must be (H, W, C) with C in (1, 3); received {input_shape}")
    if min(input_shape[:2]) < 8:
        raise ValueError(f"images must be at least 8x8 pixels; received input_shape={input_shape}")
    if name == "resnet18":
        return resnet18_cifar(input_shape, width=width or 64, synchronized_bn=synchronized_bn,
                              stem=resnet18_stem(stem, min(input_shape[:2])))
    if name in VITS:
        if width:
            raise UsageError(f"--encoder_width: {name} has a fixed width; received {width}")
        return vit(name, input_shape)
    if name in HUB_RESNETS:
        if width not in (None, 64):
            raise UsageError(f"--encoder_width: {name} has a fixed width; received {width}")
        return hub_resnet(name, input_shape, synchronized_bn=synchronized_bn)
    if name == "tiny":
        return tiny_encoder(input_shape, width=width or 16, synchronized_bn=synchronized_bn)
    if name == "small":
        return small_encoder(input_shape, width=width or 32, synchronized_bn=synchronized_bn)
    if name == "resnet50":
        if width not in (None, 64):
            raise ValueError(f"resnet50 has a fixed width; received width={width}")
        return resnet50(input_shape, synchronized_bn=synchronized_bn)
    raise ValueError(f"Unknown encoder {name!r}; expected one of {ENCODERS}")
