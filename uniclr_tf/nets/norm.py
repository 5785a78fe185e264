"""Normalisation layers and the one factory the network builders take for them.

``--batch_norm`` decides how a network's batch norms take their training statistics; the builders of
:mod:`~uniclr_tf.nets.encoders` and :mod:`~uniclr_tf.nets.heads` take a :class:`BatchNorm` factory
(``norm=``) and call it for every layer, so the choice reaches every layer by one route:

* ``BatchNorm()``: Keras' ``BatchNormalization`` (one device, or JAX's global arrays: whole batch);
* ``BatchNorm(synchronized=True)``: synchronised across replicas under TF ``MirroredStrategy``
  (ignored on JAX, whose global arrays need nothing);
* ``BatchNorm(groups=G)``: :class:`GroupBatchNormalization`, per-device statistics over G slices;
* ``BatchNorm(one_pass=True)``: :class:`GroupBatchNormalization` with one-pass statistics.

:meth:`BatchNorm.for_run` maps ``--batch_norm`` and the number of devices to one of these. The builders put
each batch norm that a ReLU follows through :func:`batch_norm_relu`, which makes the two one layer where the
factory's batch norm has a hand-written backward (one-pass statistics).
"""

import keras
from keras import layers, ops

from uniclr_tf.config.train_config import BATCH_NORMS


class BatchNorm:
    """A factory of batch-norm layers: ``norm(name=..., momentum=..., epsilon=..., **kwargs)`` returns a new
    layer. Pass one to the encoder and head builders (``norm=``) to choose how every batch norm of the
    network takes its statistics.

    >>> from uniclr_tf.nets.encoders import build_encoder
    >>> encoder = build_encoder("tiny", (28, 28, 1), norm=BatchNorm(one_pass=True))
    """

    def __init__(self, synchronized=False, groups=1, one_pass=False):
        if int(groups) < 1:
            raise ValueError(f"BatchNorm: groups must be >= 1; received {groups!r}")
        self.synchronized = bool(synchronized) and keras.backend.backend() == "tensorflow"
        self.groups = int(groups)
        self.one_pass = bool(one_pass)

    @classmethod
    def for_run(cls, mode="global", devices=1):
        """The factory for ``--batch_norm=mode`` over ``devices`` devices on this backend: ``global``
        synchronises BN on TF when the batch is split (JAX's global arrays need nothing);
        ``per_device`` keeps TF's per-replica BN and, on JAX, takes one group per device, its statistics
        in one pass; ``global_one_pass`` is global BN whose statistics take one pass (on JAX; on TF it is
        ``global``)."""
        if mode not in BATCH_NORMS:
            raise ValueError(f"batch_norm: expected one of {BATCH_NORMS}; received {mode!r}")
        on_jax = keras.backend.backend() == "jax"
        return cls(synchronized=devices > 1 and mode in ("global", "global_one_pass"),
                   groups=devices if mode == "per_device" and on_jax else 1,
                   one_pass=mode in ("global_one_pass", "per_device") and on_jax)

    @property
    def fuses_relu(self):
        """Whether :func:`batch_norm_relu` makes a batch norm and the ReLU after it one layer: with one-pass
        statistics, whose hand-written backward then takes the ReLU's gradient too."""
        return self.one_pass

    @property
    def plain(self):
        """Whether the layers are Keras' own unsynchronised ``BatchNormalization``."""
        return self.groups == 1 and not self.one_pass and not self.synchronized

    def __call__(self, name=None, momentum=0.9, epsilon=1e-5, **kwargs):
        if self.groups > 1 or self.one_pass:
            return GroupBatchNormalization(groups=self.groups, one_pass=self.one_pass, momentum=momentum,
                                           epsilon=epsilon, name=name, **kwargs)
        return layers.BatchNormalization(momentum=momentum, epsilon=epsilon, synchronized=self.synchronized,
                                         name=name, **kwargs)

    def __repr__(self):
        return f"BatchNorm(synchronized={self.synchronized}, groups={self.groups}, one_pass={self.one_pass})"


def as_norm(norm):
    """``norm`` itself, or the plain :class:`BatchNorm` for None."""
    return BatchNorm() if norm is None else norm


def batch_norm_relu(norm, x, name, relu_name, residual=None, add_name=None):
    """``ReLU(batch norm(x))`` in a functional model: the factory ``norm``'s layer named ``name``, then a
    ``ReLU`` named ``relu_name``; given ``residual``, ``ReLU(batch norm(x) + residual)``, the sum an ``Add``
    named ``add_name`` (a residual block's end). Where the factory fuses them
    (:attr:`BatchNorm.fuses_relu`), one :class:`GroupBatchNormalization` with ``relu=True`` named ``name``,
    called with ``residual=``. The same function and the same weights. Fused, training's backward reads
    the ReLU's 1-byte mask in batch norm's two passes and the residual's gradient instead of writing the
    ReLU's gradient out in a pass of its own (about 2 % of the 28 px ResNet-18 step on an NVIDIA H200 for
    the ReLUs after the blocks' first batch norms)."""
    if getattr(norm, "fuses_relu", False):
        layer = norm(name=name, relu=True)
        return layer(x) if residual is None else layer(x, residual=residual)
    y = norm(name=name)(x)
    if residual is not None:
        y = layers.Add(name=add_name)([y, residual])
    return layers.ReLU(name=relu_name)(y)


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

    ``relu=True`` applies a ReLU to the output, in training and inference: batch norm and the ReLU after
    it as one layer (:func:`batch_norm_relu`), whose one-pass backward takes the ReLU's gradient too.
    Called with ``residual=`` (a tensor of the input's shape), the layer adds it to the normalised output
    before the ReLU: a residual block's end (batch norm, the shortcut's sum, the ReLU) as one layer, whose
    one-pass backward gives the residual its gradient too.

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

    def __init__(self, groups=1, one_pass=False, relu=False, **kwargs):
        super().__init__(**kwargs)
        if int(groups) < 1:
            raise ValueError(f"groups must be >= 1; received {groups!r}")
        self.groups = int(groups)
        self.one_pass = bool(one_pass)
        self.relu = bool(relu)

    def call(self, inputs, training=None, mask=None, residual=None):
        if residual is not None and tuple(residual.shape) != tuple(inputs.shape):
            raise ValueError(f"{self.name}: the residual's shape {tuple(residual.shape)} is not the input's "
                             f"{tuple(inputs.shape)}")
        plain = self.groups == 1 and not self.one_pass
        if plain or not (training and self.trainable) or mask is not None or self.renorm:
            return self._activation(super().call(inputs, training=training, mask=mask), residual)
        if self.axis not in (-1, len(inputs.shape) - 1):
            raise ValueError(f"{self.name}: GroupBatchNormalization needs channels last; axis={self.axis}")
        batch = inputs.shape[0]
        if batch is not None and batch % self.groups:
            raise ValueError(f"{self.name}: a batch of {batch} does not split into {self.groups} groups")
        if self.one_pass:
            return self._one_pass(inputs, residual)
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
        return self._activation(ops.cast(ops.reshape(out, ops.shape(x)), self.compute_dtype), residual)

    def _activation(self, out, residual=None):
        if residual is not None:
            out = ops.add(out, ops.cast(residual, out.dtype))
        return ops.relu(out) if self.relu else out

    def _update_moving_statistics(self, mean, variance):
        """The moving mean and variance follow the mean over groups of the batch's ``[G, 1, ..., C]``
        statistics, in the statistics' dtype."""
        channels = mean.shape[-1]
        for moving, batch in ((self.moving_mean, mean), (self.moving_variance, variance)):
            moving.assign(ops.cast(moving, batch.dtype) * self.momentum
                          + ops.mean(ops.reshape(batch, (self.groups, channels)), axis=0) * (1.0 - self.momentum))

    def _one_pass(self, inputs, residual=None):
        """Training-mode ``one_pass`` batch norm: E[x] and E[x²] as two independent reductions, and a
        hand-written backward whose two sums, Σg and Σg·x̂ (g the output's gradient, x̂ the normalised
        input), are independent reductions too (autodiff of the statistics makes them dependent).

        With the batch sharded over devices each pair becomes one combined all-reduce; on one device each
        pair is one pass over the activation. The backward recomputes x̂ from the input in its own dtype
        (bfloat16 under mixed precision) rather than keeping a float32 copy; with ``relu`` it applies the
        ReLU and takes its gradient too."""
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
        if residual is not None:
            residual = ops.reshape(ops.cast(residual, self.compute_dtype), grouped.shape)
        out = _normalise(grouped, gamma, beta, mean, inv_std, axes, self.compute_dtype, relu=self.relu,
                         residual=residual)
        return ops.reshape(out, ops.shape(inputs))

    def get_config(self):
        return {**super().get_config(), **{key: getattr(self, key) for key in self.TRAINING_OPTIONS},
                "relu": self.relu}


def _normalise(x, gamma, beta, mean, inv_std, axes, dtype, relu=False, residual=None):
    """``(x - mean) · inv_std · gamma + beta`` in the statistics' dtype (float32 for bfloat16 x), cast to
    ``dtype`` (then, given ``residual``, plus it in ``dtype``; then, with ``relu``, the ReLU), with the
    batch-norm gradient written out: for g the output's gradient and x̂ the normalised x (n elements per
    channel over ``axes``), dx = gamma · inv_std · (g − Σg / n − x̂ · Σ(g·x̂) / n), dgamma = Σ(g·x̂),
    dbeta = Σg, and the residual's gradient g. That is the gradient through the batch's mean and variance
    too, so ``mean`` and ``inv_std`` (computed from x) get none of their own.

    With ``relu``, g is the ReLU's gradient: the output's where the value before the ReLU (rounded to
    ``dtype`` as the forward rounds it) is positive, else 0. It is formed for each reader, a product for the
    sums and a select for dx and the residual, from a 1-byte mask beside the forward's output, instead of
    writing g out (2 bytes an element) in a pass of its own, as XLA does for the gradient of a separate ReLU
    layer. Without a residual the backward recomputes the mask from x and XLA keeps it from the forward's
    fusion; with one the backward takes the forward's mask (recomputing it would read the residual again:
    ResNet-50's step was slower so)."""

    def normalised(x, mean, inv_std):
        return (ops.cast(x, mean.dtype) - mean) * inv_std

    def affine(x, gamma, beta, mean, inv_std):  # batch norm's output in ``dtype``, as the forward rounds it
        return ops.cast(normalised(x, mean, inv_std) * gamma + beta, dtype)

    def backward(x, gamma, mean, inv_std, live, upstream):  # each a custom_gradient function's own
        g = ops.cast(upstream, mean.dtype)
        x_hat = normalised(x, mean, inv_std)
        g_sums = g_dx = g
        if live is not None:
            g_sums = g * ops.cast(live, mean.dtype)
            g_dx = ops.where(live, g, ops.zeros((), mean.dtype))
        mean_g = ops.mean(g_sums, axis=axes, keepdims=True)
        mean_gx = ops.mean(g_sums * x_hat, axis=axes, keepdims=True)
        dx = (gamma * inv_std) * (g_dx - mean_g - x_hat * mean_gx)
        count = ops.cast(ops.size(g) // ops.size(mean_g), mean.dtype)  # elements per channel and group
        channels = ops.shape(gamma)[0]
        dgamma = ops.sum(ops.reshape(mean_gx, (-1, channels)), axis=0) * count
        dbeta = ops.sum(ops.reshape(mean_g, (-1, channels)), axis=0) * count
        return ops.cast(dx, x.dtype), dgamma, dbeta, ops.zeros_like(mean), ops.zeros_like(inv_std)

    def upstream_of(args, upstream):
        return args[0] if upstream is None else upstream

    if residual is None:
        @ops.custom_gradient
        def normalise(x, gamma, beta, mean, inv_std):
            y = affine(x, gamma, beta, mean, inv_std)
            if relu:
                y = ops.maximum(y, ops.zeros((), dtype))

            def grad(*args, upstream=None):
                live = affine(x, gamma, beta, mean, inv_std) > 0 if relu else None
                return backward(x, gamma, mean, inv_std, live, upstream_of(args, upstream))

            return y, grad

        return normalise(x, gamma, beta, mean, inv_std)

    @ops.custom_gradient
    def normalise_add(x, gamma, beta, mean, inv_std, residual):
        y = ops.add(affine(x, gamma, beta, mean, inv_std), residual)
        live = y > 0 if relu else None
        if relu:
            y = ops.where(live, y, ops.zeros((), dtype))

        def grad(*args, upstream=None):
            upstream = upstream_of(args, upstream)
            d_residual = upstream if live is None else ops.where(live, upstream, ops.zeros((), upstream.dtype))
            return (*backward(x, gamma, mean, inv_std, live, upstream), ops.cast(d_residual, residual.dtype))

        return y, grad

    return normalise_add(x, gamma, beta, mean, inv_std, residual)
