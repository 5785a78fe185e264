"""Projector and predictor heads: one generic MLP with per-paper presets.

Projector (UniCLR paper §4.1): ``Linear-BN-ReLU`` for every hidden layer and ``Linear-BN`` for the
last (2048-2048-256 on CIFAR, 2048-2048-2048 on ImageNet); methods whose papers end the head with a
plain linear layer use ``last_bn=False``. Predictor (the asymmetric trick of BYOL /
MoCo v3 that the paper stacks on top, Table 1): ``Linear-BN-ReLU`` then a plain ``Linear``.
DINO's head (:func:`dino_head`): an MLP to a bottleneck, ℓ2 normalisation, then a weight-normalised
linear layer to K outputs (:class:`WeightNormDense`).
"""

import keras
from keras import layers, ops

from uniclr_tf.nets.norm import as_norm, batch_norm_relu


def mlp_head(input_dim, dims, last_bn=True, norm=None, name="head"):
    """A functional MLP ``[B, input_dim] -> [B, dims[-1]]``.

    Hidden layers are Dense (no bias) + BN + ReLU; the last is Dense followed by BN when
    ``last_bn`` (with no affine shift/scale, as SimCLR/MoCo v3 do) or Dense with bias otherwise.
    ``norm``: the batch-norm factory (:class:`~uniclr_tf.nets.norm.BatchNorm`, default plain Keras BN).
    """
    norm = as_norm(norm)
    dims = tuple(int(d) for d in dims)
    if not dims or min(dims) <= 0:
        raise ValueError(f"{name}: dims must be a non-empty list of positive sizes; received {dims}")
    inputs = keras.Input(shape=(int(input_dim),), name=f"{name}_in")
    x = inputs
    for i, d in enumerate(dims[:-1]):
        x = layers.Dense(d, use_bias=False, name=f"{name}_dense{i + 1}")(x)
        x = batch_norm_relu(norm, x, f"{name}_bn{i + 1}", f"{name}_relu{i + 1}")
    last = len(dims)
    x = layers.Dense(dims[-1], use_bias=not last_bn, name=f"{name}_dense{last}")(x)
    if last_bn:
        x = norm(name=f"{name}_bn{last}", center=False, scale=False)(x)
    return keras.Model(inputs, x, name=name)


def projector(input_dim, dims=(2048, 2048, 256), norm=None, last_bn=True):
    """The projector: BN+ReLU after hidden layers; after the last, BN without affine (the UniCLR
    paper, SimSiam, MoCo v3) or, with ``last_bn=False``, a plain biased linear layer (SimCLR,
    MoCo v2, BYOL, Barlow Twins, VICReg, W-MSE). Each method declares which
    (``Method.projector_last_bn``)."""
    return mlp_head(input_dim, dims, last_bn=last_bn, norm=norm, name="projector")


def predictor(input_dim, hidden_dim=512, norm=None):
    """Asymmetric predictor on the online branch: Linear-BN-ReLU-Linear back to ``input_dim``."""
    return mlp_head(input_dim, (hidden_dim, input_dim), last_bn=False,
                    norm=norm, name="predictor")


@keras.saving.register_keras_serializable(package="uniclr_tf")
class WeightNormDense(layers.Layer):
    """A linear layer without bias whose weight vector of each output unit is ℓ2-normalised:
    ``y = x · (V / ‖V‖)`` column by column (PyTorch's ``weight_norm`` with the gain fixed at 1, DINO's
    ``norm_last_layer=True``). Computed in float32 whatever the policy (the softmax temperatures of
    DINO, 0.04, magnify rounding)."""

    def __init__(self, units, kernel_initializer=None, **kwargs):
        super().__init__(**kwargs)
        self.units = int(units)
        self.kernel_initializer = keras.initializers.get(
            kernel_initializer or keras.initializers.TruncatedNormal(stddev=0.02))

    def build(self, input_shape):
        self.kernel = self.add_weight(shape=(int(input_shape[-1]), self.units), initializer=self.kernel_initializer,
                                      name="kernel")

    def call(self, x):
        v = ops.cast(self.kernel, "float32")
        v = v / ops.sqrt(ops.maximum(ops.sum(ops.square(v), axis=0, keepdims=True), 1e-24))
        return ops.matmul(ops.cast(x, "float32"), v)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.units,)

    def get_config(self):
        return {**super().get_config(), "units": self.units,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer)}


def dino_head(input_dim, dims=(2048, 2048, 256), num_prototypes=4096, use_bn=True, norm=None,
              name="projector"):
    """DINO's projection head (Caron et al. 2021, §3.1 and ``DINOHead``): ``Linear(-BN)-GELU`` for each
    hidden size of ``dims``, a linear layer to the bottleneck ``dims[-1]`` (256 in DINO), ℓ2
    normalisation, then the weight-normalised ``Linear(bottleneck, K)`` without bias. Dense kernels
    start from a truncated normal of std 0.02, biases at 0 (DINO's init). ``use_bn``: BN after the
    hidden layers (DINO's ``use_bn_in_head``, its choice for ResNets; solo-learn's default)."""
    dims = tuple(int(d) for d in dims)
    if not dims or min(dims) <= 0 or int(num_prototypes) <= 0:
        raise ValueError(f"{name}: dims and num_prototypes must be positive; received {dims}, {num_prototypes}")
    init = keras.initializers.TruncatedNormal(stddev=0.02)
    norm = as_norm(norm)
    inputs = keras.Input(shape=(int(input_dim),), name=f"{name}_in")
    x = inputs
    for i, d in enumerate(dims[:-1]):
        x = layers.Dense(d, kernel_initializer=init, name=f"{name}_dense{i + 1}")(x)
        if use_bn:
            x = norm(name=f"{name}_bn{i + 1}")(x)
        x = layers.Activation("gelu", name=f"{name}_gelu{i + 1}")(x)
    x = layers.Dense(dims[-1], kernel_initializer=init, name=f"{name}_dense{len(dims)}")(x)
    x = layers.UnitNormalization(axis=-1, name=f"{name}_l2norm")(x)
    x = WeightNormDense(num_prototypes, name=f"{name}_prototypes")(x)
    return keras.Model(inputs, x, name=name)
