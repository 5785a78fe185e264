"""Backbones: CIFAR-style ResNet-18, ResNet-50 (224 px), Keras Hub's ResNets and ViTs, a small CPU encoder
and a tiny one for tests.

Every builder returns a functional ``keras.Model`` mapping normalised float images
``[B, H, W, C]`` to pooled features ``[B, F]``. Spatial sizes are left free (``(None, None, C)``)
so one backbone serves the global and the smaller local crops of multi-crop; ``input_shape`` gives
the channels and checks that the nominal size is large enough. Functional models can be cloned
(``keras.models.clone_model``) for the EMA target and saved as ``.keras`` files.
"""

import keras
from keras import layers, ops

from uniclr_tf.config.errors import UsageError
from uniclr_tf.nets.norm import BatchNorm, GroupBatchNormalization, as_norm, batch_norm_relu  # noqa: F401
from uniclr_tf.nets.pooling import max_pooling_2d, with_gather_max_pool
from uniclr_tf.nets.variables import with_batched_initialisers

ENCODERS = ("resnet18", "resnet50", "small", "tiny", "vit_tiny", "vit_small", "hub_resnet18", "hub_resnet50")
STEMS = ("auto", "cifar", "imagenet")
# Keras Hub ViTs (randomly initialised): (hidden size, layers, heads, MLP size), DeiT-Tiny / -Small.
VITS = {"vit_tiny": (192, 12, 3, 768), "vit_small": (384, 12, 6, 1536)}
# Keras Hub ResNets (ImageNet stem, randomly initialised): blocks per stage and block type, as its
# resnet_18 / resnet_50 presets (ResNet v1: no pre-activation).
HUB_RESNETS = {"hub_resnet18": ((2, 2, 2, 2), "basic_block"), "hub_resnet50": ((3, 4, 6, 3), "bottleneck_block")}

def _basic_block(x, filters, stride, norm, name):
    shortcut = x
    y = layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False,
                      kernel_initializer="he_normal", name=f"{name}_conv1")(x)
    y = batch_norm_relu(norm, y, f"{name}_bn1", f"{name}_relu1")
    y = layers.Conv2D(filters, 3, padding="same", use_bias=False,
                      kernel_initializer="he_normal", name=f"{name}_conv2")(y)
    projected = stride != 1 or shortcut.shape[-1] != filters
    if projected:
        shortcut = layers.Conv2D(filters, 1, strides=stride, use_bias=False,
                                 kernel_initializer="he_normal", name=f"{name}_down_conv")(shortcut)
        if getattr(norm, "fuses_relu", False):  # the shortcut's batch norm takes in the sum: weights keep their order
            return batch_norm_relu(norm, shortcut, f"{name}_down_bn", f"{name}_out",
                                   residual=norm(name=f"{name}_bn2")(y), add_name=f"{name}_add")
        shortcut = norm(name=f"{name}_down_bn")(shortcut)
    return batch_norm_relu(norm, y, f"{name}_bn2", f"{name}_out", residual=shortcut, add_name=f"{name}_add")


def resnet18_cifar(input_shape=(32, 32, 3), width=64, norm=None, name="resnet18", stem="cifar"):
    """ResNet-18 with the CIFAR stem (3×3 conv, stride 1, no max-pool), as in the paper's §4.1, or
    with ``stem="imagenet"`` the ImageNet one (7×7 conv stride 2, 3×3 max-pool stride 2: 4× less
    spatial work, the choice for ≥ 64 px).

    Works from 28×28×1 (Fashion-MNIST) to 32×32×3 (CIFAR) and larger; the feature size is
    ``8 * width`` (512 for the standard width 64).
    """
    norm = as_norm(norm)
    inputs = keras.Input(shape=(None, None, input_shape[-1]), name="images")
    if stem == "imagenet":
        x = layers.Conv2D(width, 7, strides=2, padding="same", use_bias=False, kernel_initializer="he_normal",
                          name="stem_conv")(inputs)
    else:
        x = layers.Conv2D(width, 3, padding="same", use_bias=False, kernel_initializer="he_normal",
                          name="stem_conv")(inputs)
    x = batch_norm_relu(norm, x, "stem_bn", "stem_relu")
    if stem == "imagenet":
        x = max_pooling_2d(3, strides=2, padding="same", name="stem_pool")(x)
    for stage, mult in enumerate((1, 2, 4, 8)):
        for block in range(2):
            stride = 2 if (stage > 0 and block == 0) else 1
            x = _basic_block(x, width * mult, stride, norm, f"stage{stage + 1}_block{block + 1}")
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    return keras.Model(inputs, x, name=name)


def tiny_encoder(input_shape=(28, 28, 1), width=16, norm=None, name="tiny", stages=None):
    """A three-convolution encoder (features ``4 * width``) for tests and CPU smoke runs.

    ``stages``: ``(width multiple, stride)`` per 3×3 convolution (default the three of ``tiny``)."""
    norm = as_norm(norm)
    inputs = keras.Input(shape=(None, None, input_shape[-1]), name="images")
    x = inputs
    for i, (mult, stride) in enumerate(stages or ((1, 1), (2, 2), (4, 2))):
        x = layers.Conv2D(width * mult, 3, strides=stride, padding="same", use_bias=False,
                          kernel_initializer="he_normal", name=f"conv{i + 1}")(x)
        x = batch_norm_relu(norm, x, f"bn{i + 1}", f"relu{i + 1}")
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    return keras.Model(inputs, x, name=name)


def small_encoder(input_shape=(28, 28, 1), width=32, norm=None, name="small"):
    """``tiny`` with a fourth stride-2 convolution (features ``8 * width``): a 4×4 last map at 28 px,
    a receptive field over most of the image, for the CPU quickstart (``make demo``; CPU trials in
    configs/quickstart.flags: kNN 0.791 against 0.779 for ``tiny`` of the same width)."""
    return tiny_encoder(input_shape, width, norm, name, stages=((1, 1), (2, 2), (4, 2), (8, 2)))


def resnet50(input_shape=(224, 224, 3), norm=None, name="resnet50"):
    """ResNet-50 from ``keras.applications`` (random init, ``weights=None``), pooled 2048-d features,
    without the convolutions' biases (the batch norms cancel them: :func:`cancelled_biases`), so with
    torchvision's ResNet-50's weights."""
    base = keras.applications.ResNet50(weights=None, include_top=False, pooling="avg",
                                       input_shape=(None, None, input_shape[-1]))
    return with_our_layers(keras.Model(base.inputs, base.outputs, name=name), norm)


def with_our_layers(model, norm=None):
    """``model`` (functional) with each ``BatchNormalization`` rebuilt by the factory ``norm``
    (:class:`~uniclr_tf.nets.norm.BatchNorm`), its own momentum and epsilon kept, so a backbone built by
    another library follows ``--batch_norm`` as ours do (a batch norm and the ReLU after it as one layer
    where the factory fuses them, :func:`relus_after_batch_norms`); on JAX each Keras ``MaxPooling2D`` as
    :class:`~uniclr_tf.nets.pooling.MaxPooling2D` (the same pooling, a cheaper gradient); and each
    convolution whose bias the batch norm after it cancels (:func:`cancelled_biases`) without that bias,
    as torchvision's ResNets are. Returns ``model`` itself when nothing changes. The weights are new
    (the builders' backbones are randomly initialised)."""
    norm = as_norm(norm)
    pools = keras.backend.backend() == "jax" and any(type(layer) is layers.MaxPooling2D for layer in model.layers)
    unbiased = cancelled_biases(model)
    if norm.plain and not pools and not unbiased:
        return model
    fused = relus_after_batch_norms(model) if norm.fuses_relu else {}
    residual = residual_relus_after_batch_norms(model) if norm.fuses_relu else {}
    taken_in = set(fused.values()) | {relu for _, relu, _ in residual.values()}
    adds = {add: (bn, index) for bn, (add, _, index) in residual.items()}
    clones = {}

    def clone_fn(layer):
        cfg = layer.get_config()
        if isinstance(layer, layers.BatchNormalization) and not norm.plain:
            for key in ("synchronized", *GroupBatchNormalization.TRAINING_OPTIONS):
                cfg.pop(key, None)
            if cfg.pop("relu", False) or layer.name in fused or layer.name in residual:
                if not norm.fuses_relu:
                    raise ValueError(f"{layer.name}: a batch norm with its ReLU in one layer; {norm!r} makes "
                                     "batch norms without one")
                cfg["relu"] = True
            clones[layer.name] = norm(**cfg)
            return clones[layer.name]
        if layer.name in unbiased:
            return layer.__class__.from_config({**cfg, "use_bias": False})
        return (pools and with_gather_max_pool(layer)) or layer.__class__.from_config(cfg)

    def call_fn(layer, *args, **kwargs):
        # A ReLU taken into the batch norm before it is left out; a batch norm that takes in the residual
        # sum after it passes its input on, and is called where the sum was, with the sum's other operand.
        if layer.name in taken_in or layer.name in residual:
            return args[0]
        if layer.name in adds:
            bn, index = adds[layer.name]
            operands = list(args[0])
            x = operands.pop(index)
            return clones[bn](x, residual=operands[0])
        return layer(*args, **kwargs)

    return keras.models.clone_model(model, clone_function=clone_fn,
                                    call_function=call_fn if fused or residual else None)


def relus_after_batch_norms(model):
    """``{batch norm name: ReLU name}`` for each ``BatchNormalization`` of ``model`` (functional) whose output
    only a plain ReLU reads (a ``ReLU`` layer with its defaults or ``Activation("relu")``), called once each,
    the batch norm's output not one of the model's: the pairs :func:`with_our_layers` makes one layer
    (:func:`~uniclr_tf.nets.norm.batch_norm_relu`) when the factory fuses them."""
    outputs = {id(t) for t in keras.tree.flatten(model.outputs)}
    pairs = {}
    for layer in model.layers:
        reader = _sole_reader(layer, outputs) if isinstance(layer, layers.BatchNormalization) else None
        if reader is not None and _is_plain_relu(reader) and len(reader._inbound_nodes) == 1:
            pairs[layer.name] = reader.name
    return pairs


def residual_relus_after_batch_norms(model):
    """``{batch norm name: (Add name, ReLU name, the batch norm's place among the Add's operands)}`` for
    each residual block's end in ``model`` (functional): an ``Add`` of two tensors, called once, read only
    by a plain ReLU called once, one of its operands a ``BatchNormalization`` called once that only the
    ``Add`` reads, none of them the model's output. Where both operands are such batch norms (a block with
    a projected shortcut) the later operand's (keras.applications' and Keras Hub's main path) is taken:
    :func:`with_our_layers` makes the batch norm, the sum and the ReLU one layer
    (:func:`~uniclr_tf.nets.norm.batch_norm_relu` with ``residual=``) when the factory fuses them."""
    outputs = {id(t) for t in keras.tree.flatten(model.outputs)}
    ends = {}
    for add in model.layers:
        if type(add) is not layers.Add or len(add._inbound_nodes) != 1:
            continue
        relu = _sole_reader(add, outputs)
        operands = add._inbound_nodes[0].input_tensors
        if relu is None or not _is_plain_relu(relu) or len(relu._inbound_nodes) != 1 or len(operands) != 2:
            continue
        for index in (1, 0):
            bn = operands[index]._keras_history.operation
            if isinstance(bn, layers.BatchNormalization) and _sole_reader(bn, outputs) is add:
                ends[bn.name] = (add.name, relu.name, index)
                break
    return ends


def _sole_reader(layer, outputs):
    """The one layer that reads ``layer``'s output, when ``layer`` is called once, its output is not one of
    the model's (``outputs``: their ids) and one layer alone reads it; else None."""
    if len(layer._inbound_nodes) != 1 or any(id(t) in outputs for t in layer._inbound_nodes[0].outputs):
        return None
    readers = [node.operation for node in layer._outbound_nodes]
    return readers[0] if len(readers) == 1 else None


def _is_plain_relu(layer):
    if type(layer) is layers.ReLU:
        return (layer.max_value is None and float(layer.negative_slope) == 0.0
                and float(layer.threshold) == 0.0)
    return type(layer) is layers.Activation and layer.activation is keras.activations.relu


def cancelled_biases(model):
    """The names of ``model``'s biased ``Conv2D`` layers whose bias the batch norm after them cancels:
    no activation, called once, its output not one of the model's and consumed once, by a
    ``BatchNormalization`` over the convolution's channels. Batch norm subtracts the batch's mean in
    training and the moving mean in inference, the bias with it, so the bias changes nothing but costs a
    pass over the convolution's output gradient every step (keras.applications' ResNet-50 has 53 of them;
    ResNet-50 at 224 px, batch 128, on an H200: about 1 ms a step)."""
    names, outputs = set(), {id(t) for t in keras.tree.flatten(model.outputs)}
    for layer in model.layers:
        if not (type(layer) is layers.Conv2D and layer.use_bias and layer.activation is keras.activations.linear):
            continue
        reader = _sole_reader(layer, outputs)
        channels = -1 if layer.data_format == "channels_last" else 1
        if isinstance(reader, layers.BatchNormalization) and reader.axis in (channels, channels % 4):
            names.add(layer.name)
    return names


def hub_resnet(name, input_shape, norm=None):
    """A Keras Hub ``ResNetBackbone`` (``HUB_RESNETS[name]``: ResNet-18 or -50 v1 with the ImageNet stem,
    7×7 conv stride 2 and max-pool, for images of 64 px and more), randomly initialised (no preset, no
    download), global-average pooled: 512 / 2048-d features. Its layers are Keras core layers, so the
    saved encoder loads without Keras Hub; batch norm follows ``--batch_norm`` (:func:`with_our_layers`)."""
    keras_hub = _keras_hub(name)
    blocks, block_type = HUB_RESNETS[name]
    backbone = keras_hub.models.ResNetBackbone(
        input_conv_filters=[64], input_conv_kernel_sizes=[7], stackwise_num_filters=[64, 128, 256, 512],
        stackwise_num_blocks=list(blocks), stackwise_num_strides=[1, 2, 2, 2], block_type=block_type,
        use_pre_activation=False, image_shape=(None, None, input_shape[-1]))
    features = layers.GlobalAveragePooling2D(name="pool")(backbone.output)
    return with_our_layers(keras.Model(backbone.inputs, features, name=name), norm)


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


@with_batched_initialisers  # on JAX the initial values come from a few compiled programs
def build_encoder(name, input_shape, width=None, norm=None, stem="auto"):
    """Builds the encoder called ``name`` (one of ``ENCODERS``) for images of ``input_shape``;
    ``stem`` is resnet18's (:func:`resnet18_stem`); ``norm`` the batch-norm factory
    (:class:`~uniclr_tf.nets.norm.BatchNorm`, default plain Keras BN; ViTs have none).

    Returns a functional ``keras.Model`` from normalised float images to pooled features ``[B, F]``,
    its spatial size left free (except the ViTs') so that multi-crop's local views go through it.

    Examples:
        >>> encoder = build_encoder("resnet18", (32, 32, 3))  # CIFAR stem below 64 px
        >>> encoder.output_shape
        (None, 512)
        >>> build_encoder("small", (28, 28, 1), width=16).output_shape
        (None, 128)
    """
    input_shape = tuple(int(d) for d in input_shape)
    if len(input_shape) != 3 or input_shape[-1] not in (1, 3):
        raise ValueError(f"input_shape must be (H, W, C) with C in (1, 3); received {input_shape}")
    if min(input_shape[:2]) < 8:
        raise ValueError(f"images must be at least 8x8 pixels; received input_shape={input_shape}")
    if name == "resnet18":
        return resnet18_cifar(input_shape, width=width or 64, norm=norm,
                              stem=resnet18_stem(stem, min(input_shape[:2])))
    if name in VITS:
        if width:
            raise UsageError(f"--encoder_width: {name} has a fixed width; received {width}")
        return vit(name, input_shape)
    if name in HUB_RESNETS:
        if width not in (None, 64):
            raise UsageError(f"--encoder_width: {name} has a fixed width; received {width}")
        return hub_resnet(name, input_shape, norm=norm)
    if name == "tiny":
        return tiny_encoder(input_shape, width=width or 16, norm=norm)
    if name == "small":
        return small_encoder(input_shape, width=width or 32, norm=norm)
    if name == "resnet50":
        if width not in (None, 64):
            raise ValueError(f"resnet50 has a fixed width; received width={width}")
        return resnet50(input_shape, norm=norm)
    raise ValueError(f"Unknown encoder {name!r}; expected one of {ENCODERS}")
