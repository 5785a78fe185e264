"""Max pooling with a gradient that gathers instead of scattering.

Keras' ``MaxPooling2D`` differentiates, on JAX, as XLA's reduce-window chooser: the forward pass keeps one
32-bit index array per spatial dimension and window corner, and the backward pass scatters the output's
gradient into the input (ResNet-50 at 224 px, batch 2 × 128 views on an H200: about 2 ms a step, 5 % of
it, for its one stem pool). :class:`MaxPooling2D` computes the same values and the same gradient from an
``int8`` index of the winning window position (``int32`` beyond 127 positions), and its backward is a
gather: each input position sums the gradients of the (at most ⌈k/s⌉²) windows it won, one fused
elementwise pass over the input, computed phase by phase of the strides (:func:`_scatter_back`), and
written out whole (an optimisation barrier) before the ReLU's gradient and batch norm's sums read it.

Ties go to the first position of the window in row-major order (``>`` keeps the earlier one), so the
gradient of a window reaches exactly one input. The fast path is taken on JAX for channels-last inputs;
elsewhere the layer is Keras' own.
"""

import functools

import keras
from keras import layers


def _windows(x, size, strides, out_hw):
    """The ``size[0] * size[1]`` strided views ``[B, Ho, Wo, C]`` of ``x``, one per window position."""
    from jax import lax

    (kh, kw), (sh, sw), (ho, wo) = size, strides, out_hw
    b, _, _, c = x.shape
    return [lax.slice(x, (0, di, dj, 0), (b, di + sh * (ho - 1) + 1, dj + sw * (wo - 1) + 1, c), (1, sh, sw, 1))
            for di in range(kh) for dj in range(kw)]


def _pool_argmax(x, size, strides, out_hw):
    import jax.numpy as jnp

    views = _windows(x, size, strides, out_hw)
    index = jnp.int8 if len(views) <= 127 else jnp.int32
    y, idx = views[0], jnp.zeros(views[0].shape, index)
    for k, v in enumerate(views[1:], 1):
        better = (v > y) | jnp.isnan(v)  # a NaN wins, as in Keras' max pool: it propagates
        y = jnp.where(better, v, y)
        idx = jnp.where(better, index(k), idx)
    return y, idx


@functools.cache
def _max_pool_fn(size, strides, in_hw, fence=True):
    """The valid max pool of ``[B, H, W, C]`` inputs with ``(H, W) = in_hw``, with its gather backward;
    ``fence=False`` lets XLA fuse that gradient into what consumes it (``benchmarks/pool_grad.py``)."""
    import jax
    from jax import lax

    (kh, kw), (sh, sw), (h, w) = size, strides, in_hw
    out_hw = ((h - kh) // sh + 1, (w - kw) // sw + 1)

    @jax.custom_vjp
    def pool(x):
        return _pool_argmax(x, size, strides, out_hw)[0]

    def forward(x):  # the output and, as the residual, the winners' positions
        return _pool_argmax(x, size, strides, out_hw)

    def backward(idx, g):
        dx = _scatter_back(idx, g, size, strides, (h, w))
        # Written out whole rather than fused into its consumers (the ReLU's gradient, batch norm's sums):
        # at 2 x 128 views of 224 px on an H200 that chain takes 1.39 ms, not 1.74 (benchmarks/pool_grad.py).
        return (lax.optimization_barrier(dx) if fence else dx,)

    pool.defvjp(forward, backward)
    return pool


def _scatter_back(idx, g, size, strides, in_hw):
    """The max pool's input gradient ``[B, H, W, C]``: each window's gradient ``g`` sent to the position
    ``idx`` names, as a gather. The input is split by the phase of its position against the strides:
    the inputs of one phase ``(p, q)`` are won by the windows ``(a - t, b - u)`` at window position
    ``(p + t·sh, q + u·sw)`` only, so each phase is a sum of ⌈k/s⌉² shifted, unstrided slices of ``g``,
    and the phases interleave into the input by a reshape. (A sum over all window positions of strided,
    interior-padded terms computes the same and runs at a fifth of the card's bandwidth.)"""
    import jax.numpy as jnp
    from jax import lax

    (kh, kw), (sh, sw), (h, w) = size, strides, in_hw
    acc = jnp.promote_types(g.dtype, jnp.float32)  # bfloat16 sums in float32
    g32, (ho, wo) = g.astype(acc), g.shape[1:3]
    rows, cols = -(-h // sh), -(-w // sw)  # each phase padded to the same extent, cropped after

    def shifted(term, t, u):  # term[:, a - t, b - u] at [:, a, b], zero outside, over rows x cols
        zero = jnp.zeros((), term.dtype)
        return lax.pad(term, zero, ((0, 0, 0), (t, rows - ho - t, 0), (u, cols - wo - u, 0), (0, 0, 0)))

    b, c = g.shape[0], g.shape[3]
    phase_rows = []  # for each row phase p, its rows [B, rows, cols * sw, C], the column phases interleaved
    for p in range(sh):
        phases = []
        for q in range(sw):
            total = jnp.zeros((b, rows, cols, c), acc)
            for di in range(p, kh, sh):
                for dj in range(q, kw, sw):
                    total = total + shifted(jnp.where(idx == di * kw + dj, g32, 0), (di - p) // sh, (dj - q) // sw)
            phases.append(total)
        phase_rows.append(jnp.stack(phases, axis=3).reshape(b, rows, cols * sw, c))
    full = jnp.stack(phase_rows, axis=2).reshape(b, rows * sh, cols * sw, c)
    return full[:, :h, :w].astype(g.dtype)


def max_pool_2d(x, pool_size, strides, padding="valid"):
    """Max pooling of channels-last ``x`` (a JAX array) as ``keras.ops.max_pool`` computes it, differentiated
    by :func:`_max_pool_fn`'s gather. ``padding="same"`` pads with -inf as TensorFlow does (more at the end)."""
    import jax.numpy as jnp

    size, strides = tuple(int(v) for v in pool_size), tuple(int(v) for v in strides)
    if padding == "same":
        pads = []
        for n, k, s in zip(x.shape[1:3], size, strides):
            total = max((-(-n // s) - 1) * s + k - n, 0)
            pads.append((total // 2, total - total // 2))
        x = jnp.pad(x, ((0, 0), *pads, (0, 0)), constant_values=-jnp.inf)
    return _max_pool_fn(size, strides, tuple(int(v) for v in x.shape[1:3]))(x)


@keras.saving.register_keras_serializable(package="uniclr_tf")
class MaxPooling2D(layers.MaxPooling2D):
    """``keras.layers.MaxPooling2D`` whose JAX gradient is a gather from an ``int8`` argmax (module
    docstring); the same outputs and the same gradient, the same config. ``tools.release`` saves it as
    Keras' own layer."""

    def call(self, inputs):
        if keras.backend.backend() != "jax" or self.data_format != "channels_last":
            return super().call(inputs)
        return max_pool_2d(inputs, self.pool_size, self.strides, self.padding)


def max_pooling_2d(*args, **kwargs):
    """A max-pooling layer: :class:`MaxPooling2D` on JAX, Keras' own elsewhere (the same computation)."""
    cls = MaxPooling2D if keras.backend.backend() == "jax" else layers.MaxPooling2D
    return cls(*args, **kwargs)


def with_gather_max_pool(layer):
    """``layer`` rebuilt as :class:`MaxPooling2D` when it is Keras' own ``MaxPooling2D`` (a clone function
    for ``keras.models.clone_model``); None otherwise."""
    if type(layer) is layers.MaxPooling2D:
        return MaxPooling2D.from_config(layer.get_config())
    return None
