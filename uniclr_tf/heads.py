"""Projector and predictor heads: one generic MLP with per-paper presets.

Projector (UniCLR paper §4.1): ``Linear-BN-ReLU`` for every hidden layer and ``Linear-BN`` for the
last (2048-2048-256 on CIFAR, 2048-2048-2048 on ImageNet); methods whose papers end the head with a
plain linear layer use ``last_bn=False``. Predictor (the asymmetric trick of BYOL /
MoCo v3 that the paper stacks on top, Table 1): ``Linear-BN-ReLU`` then a plain ``Linear``.
"""

import keras
from keras import layers

from uniclr_tf.encoders import batch_norm


def mlp_head(input_dim, dims, last_bn=True, synchronized_bn=False, name="head"):
    """A functional MLP ``[B, input_dim] -> [B, dims[-1]]``.

    Hidden layers are Dense (no bias) + BN + ReLU; the last is Dense followed by BN when
    ``last_bn`` (with no affine shift/scale, as SimCLR/MoCo v3 do) or Dense with bias otherwise.
    """
    dims = tuple(int(d) for d in dims)
    if not dims or min(dims) <= 0:
        raise ValueError(f"{name}: dims must be a non-empty list of positive sizes; received {dims}")
    inputs = keras.Input(shape=(int(input_dim),), name=f"{name}_in")
    x = inputs
    for i, d in enumerate(dims[:-1]):
        x = layers.Dense(d, use_bias=False, name=f"{name}_dense{i + 1}")(x)
        x = batch_norm(synchronized_bn, name=f"{name}_bn{i + 1}")(x)
        x = layers.ReLU(name=f"{name}_relu{i + 1}")(x)
    last = len(dims)
    x = layers.Dense(dims[-1], use_bias=not last_bn, name=f"{name}_dense{last}")(x)
    if last_bn:
        x = batch_norm(synchronized_bn, name=f"{name}_bn{last}", center=False, scale=False)(x)
    return keras.Model(inputs, x, name=name)


def projector(input_dim, dims=(2048, 2048, 256), synchronized_bn=False, last_bn=True):
    """The projector: BN+ReLU after hidden layers; after the last, BN without affine (the UniCLR
    paper, SimSiam, MoCo v3) or, with ``last_bn=False``, a plain biased linear layer (SimCLR,
    MoCo v2, BYOL, Barlow Twins, VICReg, W-MSE). Each method declares which
    (``Method.projector_last_bn``)."""
    return mlp_head(input_dim, dims, last_bn=last_bn, synchronized_bn=synchronized_bn, name="projector")


def predictor(input_dim, hidden_dim=512, synchronized_bn=False):
    """Asymmetric predictor on the online branch: Linear-BN-ReLU-Linear back to ``input_dim``."""
    return mlp_head(input_dim, (hidden_dim, input_dim), last_bn=False,
                    synchronized_bn=synchronized_bn, name="predictor")
