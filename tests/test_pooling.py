"""Max pooling with a gather gradient (uniclr_tf/nets/pooling.py) against a float64 reference."""

import keras

from uniclr_tf.nets import pooling

# Runs under JAX (the layer's fast path) with float64 enabled; prints one JSON line.
POOLING_ON_JAX = r"""
import json
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import keras
import numpy as np
from uniclr_tf.nets import encoders, pooling
from uniclr_tf.serving.release import portable_backbone

def reference(x, k, s, padding):
    # float64 max pool and its gradient for the weights w: each window's w to its first largest input
    if padding == "same":
        pads = [max((-(-n // s) - 1) * s + k - n, 0) for n in x.shape[1:3]]
        x = np.pad(x, ((0, 0), (pads[0] // 2, pads[0] - pads[0] // 2), (pads[1] // 2, pads[1] - pads[1] // 2), (0, 0)),
                   constant_values=-np.inf)
    b, h, w, c = x.shape
    ho, wo = (h - k) // s + 1, (w - k) // s + 1
    y, positions = np.zeros((b, ho, wo, c)), np.zeros((b, ho, wo, c, 2), int)
    for i in range(ho):
        for j in range(wo):
            window = x[:, i * s:i * s + k, j * s:j * s + k, :].reshape(b, k * k, c)
            first = window.argmax(axis=1)
            y[:, i, j] = np.take_along_axis(window, first[:, None], 1)[:, 0]
            positions[:, i, j, :, 0], positions[:, i, j, :, 1] = i * s + first // k, j * s + first % k
    return y, positions, x.shape

def reference_grad(shape, positions, weights, crop):
    dx = np.zeros(shape)
    for (bi, i, j, ci), wt in np.ndenumerate(weights):
        pi, pj = positions[bi, i, j, ci]
        dx[bi, pi, pj, ci] += wt
    return dx[:, crop[0]:crop[0] + crop[2], crop[1]:crop[1] + crop[3]]

rng = np.random.default_rng(0)
out = {"cases": []}
for k, s, padding, h, w in [(3, 2, "valid", 11, 12), (3, 2, "same", 10, 9), (2, 2, "valid", 8, 8), (3, 1, "same", 5, 6)]:
    x = rng.normal(size=(2, h, w, 3))
    y_ref, positions, padded = reference(x, k, s, padding)
    weights = rng.normal(size=y_ref.shape)
    top = (padded[1] - h) // 2 if padding == "same" else 0
    left = (padded[2] - w) // 2 if padding == "same" else 0
    dx_ref = reference_grad(padded, positions, weights, (top, left, h, w))
    f = lambda x: jnp.sum(pooling.max_pool_2d(x, (k, k), (s, s), padding) * weights)
    y = np.asarray(pooling.max_pool_2d(jnp.asarray(x), (k, k), (s, s), padding))
    dx = np.asarray(jax.grad(f)(jnp.asarray(x)))
    out["cases"].append({"case": [k, s, padding, h, w], "dtype": str(dx.dtype),
                         "y": float(np.abs(y - y_ref).max()), "dx": float(np.abs(dx - dx_ref).max())})

# Ties (ReLU's zeros, repeated values): a window's gradient reaches one input, its first largest.
x = np.maximum(np.round(rng.normal(size=(2, 9, 9, 4)), 0), 0)
y_ref, positions, padded = reference(x, 3, 2, "valid")
weights = rng.normal(size=y_ref.shape)
dx = np.asarray(jax.grad(lambda x: jnp.sum(pooling.max_pool_2d(x, (3, 3), (2, 2)) * weights))(jnp.asarray(x)))
out["ties_dx"] = float(np.abs(dx - reference_grad(padded, positions, weights, (0, 0, 9, 9))).max())
out["ties_mass"] = [float(dx.sum()), float(weights.sum())]
# 144 window positions: a 32-bit index, each window's first largest (the forward pass)
x = rng.normal(size=(2, 26, 27, 3))
y, idx = pooling._pool_argmax(jnp.asarray(x), (12, 12), (3, 3), (5, 6))
y_ref, positions, _ = reference(x, 12, 3, "valid")
rows, cols = np.divmod(np.asarray(idx), 12)
out["index_dtype"] = str(idx.dtype)
out["large_window"] = [float(np.abs(np.asarray(y) - y_ref).max()),
                       bool((rows + 3 * np.arange(5)[None, :, None, None] == positions[..., 0]).all()
                            and (cols + 3 * np.arange(6)[None, None, :, None] == positions[..., 1]).all())]
# A NaN propagates to its windows' outputs, as in Keras' max pool
x = rng.normal(size=(1, 9, 9, 1))
x[0, 4, 4, 0] = np.nan
out["nan_windows"] = [int(np.isnan(np.asarray(pooling.max_pool_2d(jnp.asarray(x), (3, 3), (2, 2)))).sum()),
                      int(np.isnan(np.asarray(keras.ops.max_pool(x, 3, 2))).sum())]
# bfloat16 in, bfloat16 gradient out
xb = jnp.asarray(rng.normal(size=(2, 9, 9, 2)), jnp.bfloat16)
out["bf16_grad_dtype"] = str(jax.grad(lambda x: jnp.sum(pooling.max_pool_2d(x, (3, 3), (2, 2)).astype(jnp.float32)))(xb).dtype)

# A backbone of another library (as keras.applications' ResNet-50) takes the layer through
# with_our_layers; its release copy Keras' own, with the same features
jax.config.update("jax_enable_x64", False)
keras.utils.set_random_seed(0)
inputs = keras.Input((None, None, 3))
hidden = keras.layers.MaxPooling2D(3, strides=2, name="pool")(keras.layers.Conv2D(4, 3, name="conv")(inputs))
model = encoders.with_our_layers(keras.Model(inputs, keras.layers.GlobalAveragePooling2D()(hidden)))
pools = [type(layer).__module__ for layer in model.layers if isinstance(layer, keras.layers.MaxPooling2D)]
images = rng.normal(size=(2, 64, 64, 3)).astype("float32")
portable, replaced = portable_backbone(model)
out.update(pools=pools, portable_pools=[type(layer).__module__ for layer in portable.layers
                                        if isinstance(layer, keras.layers.MaxPooling2D)],
           replaced=replaced, features_diff=float(np.abs(np.asarray(model(images, training=False))
                                                         - np.asarray(portable(images, training=False))).max()))
print(json.dumps(out))
"""


def test_gather_max_pool_matches_the_float64_reference_and_releases_as_keras(run_python):
    """On JAX, values and gradients equal a float64 max pool whose windows send their gradient to their
    first largest input (valid and same padding, strides 1 and 2, ties; the winners of windows of 144 positions); a NaN
    propagates as in Keras; bfloat16 stays bfloat16; a
    backbone built by another library takes the layer (``with_our_layers``), and the release's portable
    copy turns it back into Keras' own with the same features."""
    out = run_python(POOLING_ON_JAX, backend="jax")
    for case in out["cases"]:
        assert case["dtype"] == "float64" and case["y"] == 0.0 and case["dx"] < 1e-12, case
    assert out["ties_dx"] < 1e-12
    assert abs(out["ties_mass"][0] - out["ties_mass"][1]) < 1e-9
    assert out["bf16_grad_dtype"] == "bfloat16"
    assert out["index_dtype"] == "int32" and out["large_window"] == [0.0, True]
    assert out["nan_windows"] == [4, 4]  # the centre of a 9x9 map lies in 4 windows of 3x3, stride 2
    assert out["pools"] == ["uniclr_tf.nets.pooling"]
    assert out["portable_pools"] == ["keras.src.layers.pooling.max_pooling2d"]
    assert out["replaced"] == 1 and out["features_diff"] < 1e-5


def test_max_pooling_layer_is_keras_own_off_jax():
    """Off JAX the builder gives Keras' ``MaxPooling2D``; our subclass computes Keras' max pool there."""
    import numpy as np
    layer = pooling.max_pooling_2d(3, strides=2, padding="same")
    assert (type(layer) is keras.layers.MaxPooling2D) == (keras.backend.backend() != "jax")
    x = np.random.default_rng(0).normal(size=(2, 7, 7, 3)).astype("float32")
    ours = pooling.MaxPooling2D(3, strides=2, padding="same")
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(ours(x)),
                                  keras.ops.convert_to_numpy(keras.layers.MaxPooling2D(3, 2, "same")(x)))
    assert pooling.with_gather_max_pool(keras.layers.Dense(2)) is None
    assert type(pooling.with_gather_max_pool(keras.layers.MaxPooling2D(2))) is pooling.MaxPooling2D
