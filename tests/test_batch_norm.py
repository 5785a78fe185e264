"""--batch_norm=per_device and global_one_pass: GroupBatchNormalization (per-group or one-pass
statistics) and what each removes from a data-parallel step (batch-norm all-reduces), against a
float64 reference."""

import concurrent.futures
import json
import sys

import keras
import numpy as np
import pytest

from tests import warm
from tests.conftest import REPO_ROOT
from uniclr_tf.nets import encoders
from uniclr_tf.nets.encoders import GroupBatchNormalization


def reference(x, groups, gamma, beta, eps=1e-5):
    """Each contiguous slice of the batch normalised by its own mean and (biased) variance, float64."""
    x = np.asarray(x, np.float64)
    out, means, variances = [], [], []
    for part in np.split(x, groups):
        axes = tuple(range(part.ndim - 1))
        mean, var = part.mean(axes), part.var(axes)
        out.append((part - mean) / np.sqrt(var + eps) * gamma + beta)
        means.append(mean)
        variances.append(var)
    return np.concatenate(out), np.mean(means, 0), np.mean(variances, 0)


@pytest.mark.parametrize("shape", [(12, 5, 5, 3), (12, 6)])
def test_group_batch_norm_matches_the_per_group_reference(shape):
    rng = np.random.default_rng(0)
    x = (rng.normal(size=shape) * np.arange(1, shape[-1] + 1) + 2.0).astype("float32")
    layer = GroupBatchNormalization(groups=3, momentum=0.9, epsilon=1e-5)
    layer.build(x.shape)
    gamma, beta = rng.normal(size=shape[-1]), rng.normal(size=shape[-1])
    layer.gamma.assign(gamma.astype("float32"))
    layer.beta.assign(beta.astype("float32"))
    y = keras.ops.convert_to_numpy(layer(x, training=True))
    expected, mean, var = reference(x, 3, gamma, beta)
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer.moving_mean), 0.1 * mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer.moving_variance), 0.9 + 0.1 * var, rtol=1e-5)
    # the whole-batch statistics differ (the test can tell the two apart)
    whole, _, _ = reference(x, 1, gamma, beta)
    assert np.abs(whole - expected).max() > 1e-2
    # inference: plain batch norm with the moving statistics, as keras's layer
    plain = keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5)
    plain.build(x.shape)
    plain.set_weights(layer.get_weights())
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer(x, training=False)),
                               keras.ops.convert_to_numpy(plain(x, training=False)), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("groups", [1, 3])
def test_one_pass_statistics_match_the_reference(groups):
    """``one_pass``: E[x] and E[x^2] from one pass give the same normalisation and moving statistics
    as the two-pass reference (float64), also with a mean far from 0 (variance from E[x^2] - E[x]^2)."""
    rng = np.random.default_rng(1)
    x = (rng.normal(size=(12, 4, 4, 5)) * np.arange(1, 6) + 3.0).astype("float32")
    layer = GroupBatchNormalization(groups=groups, one_pass=True, momentum=0.9, epsilon=1e-5)
    layer.build(x.shape)
    gamma, beta = rng.normal(size=5), rng.normal(size=5)
    layer.gamma.assign(gamma.astype("float32"))
    layer.beta.assign(beta.astype("float32"))
    y = keras.ops.convert_to_numpy(layer(x, training=True))
    expected, mean, var = reference(x, groups, gamma, beta)
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer.moving_mean), 0.1 * mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer.moving_variance), 0.9 + 0.1 * var, rtol=1e-4)
    constant = np.full((4, 3), 7.0, "float32")  # E[x^2] - E[x]^2 rounds to <= 0: clipped, finite output
    assert np.all(np.isfinite(keras.ops.convert_to_numpy(layer.__class__(one_pass=True)(constant, training=True))))
    built = encoders.BatchNorm(one_pass=True)(name="bn")
    assert type(built) is GroupBatchNormalization and built.one_pass and built.groups == 1
    assert GroupBatchNormalization.from_config(built.get_config()).one_pass


def _gradients(layer, x, weights, after=None, residual=None):
    """d sum(weights * out) / d(x, gamma, beta[, residual]), by the backend's own autodiff, as float64
    arrays, where out is ``after(layer(x))`` (``after`` default identity) or, given ``residual``,
    ``after(layer(x), residual)``, or without ``after`` ``layer(x, residual=residual)``: in training."""

    def output(call, x, r):
        if residual is None:
            return (after or (lambda y: y))(call(x))
        return call(x, residual=r) if after is None else after(call(x), r)

    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        def loss(x, gamma, beta, r):
            def call(v, **kwargs):
                return layer.stateless_call([gamma, beta], [v.value for v in layer.non_trainable_variables], v,
                                            training=True, **kwargs)[0]
            return (output(call, x, r).astype("float32") * weights.astype("float32")).sum()

        argnums = (0, 1, 2) if residual is None else (0, 1, 2, 3)
        grads = jax.grad(loss, argnums=argnums)(x, layer.gamma.value, layer.beta.value, residual)
        return tuple(np.asarray(g, np.float64) for g in grads)
    if backend != "tensorflow":
        pytest.skip(f"no gradient helper for the {backend} backend")
    import tensorflow as tf

    xt = tf.constant(x)
    rt = None if residual is None else tf.constant(residual)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        if rt is not None:
            tape.watch(rt)
        out = output(lambda v, **kwargs: layer(v, training=True, **kwargs), xt, rt)
        loss = tf.reduce_sum(tf.cast(out, tf.float64) * weights)
    sources = [xt, layer.gamma, layer.beta] + ([] if rt is None else [rt])
    return tuple(g.numpy().astype(np.float64) for g in tape.gradient(loss, sources))


def _central_differences(f, value, h=1e-5):
    """d f / d value by central differences in float64."""
    grad = np.zeros_like(value, np.float64)
    for i in np.ndindex(value.shape):
        up, down = value.astype(np.float64), value.astype(np.float64)
        up[i] += h
        down[i] -= h
        grad[i] = (f(up) - f(down)) / (2 * h)
    return grad


def _reference_loss(x, weights, groups, gamma, beta):
    return float(np.sum(reference(x, groups, gamma, beta)[0] * weights))


@pytest.mark.parametrize("groups", [1, 3])
def test_one_pass_gradient_matches_finite_differences_of_the_reference(groups):
    """The hand-written backward of ``one_pass`` (Σg and Σg·x̂ as independent sums) is the gradient of
    the two-pass float64 reference, through the batch's mean and variance: central differences of
    ``sum(w * BN(x))`` in x, gamma and beta."""
    rng = np.random.default_rng(2)
    x = (rng.normal(size=(6, 2, 2, 3)) * np.arange(1, 4) + 1.5).astype("float32")
    weights = rng.normal(size=x.shape)
    gamma, beta = rng.normal(size=3), rng.normal(size=3)
    layer = GroupBatchNormalization(groups=groups, one_pass=True, momentum=0.9, epsilon=1e-5)
    layer.build(x.shape)
    layer.gamma.assign(gamma.astype("float32"))
    layer.beta.assign(beta.astype("float32"))
    dx, dgamma, dbeta = _gradients(layer, x, weights)

    np.testing.assert_allclose(dx, _central_differences(lambda v: _reference_loss(v, weights, groups, gamma, beta), x),
                               rtol=2e-3, atol=2e-4)
    np.testing.assert_allclose(dgamma, _central_differences(lambda v: _reference_loss(x, weights, groups, v, beta), gamma),
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dbeta, _central_differences(lambda v: _reference_loss(x, weights, groups, gamma, v), beta),
                               rtol=1e-4, atol=1e-4)
    assert np.abs(dx).max() > 1e-2  # not a vanishing gradient that any tolerance would pass


def _relu_case(rng):
    """Inputs for the fused ReLU's tests: x (3 channels of different scales), the loss's weights, gamma, beta."""
    x = (rng.normal(size=(6, 2, 2, 3)) * np.arange(1, 4) + 1.5).astype("float32")
    weights = rng.normal(size=x.shape)
    gamma, beta = rng.normal(size=3).astype("float32"), rng.normal(size=3).astype("float32")
    return x, weights, gamma, beta


def _one_pass_layer(groups, shape, gamma, beta, relu, dtype="float32"):
    bn = GroupBatchNormalization(groups=groups, one_pass=True, relu=relu, epsilon=1e-5, dtype=dtype)
    bn.build(shape)
    bn.gamma.assign(gamma)
    bn.beta.assign(beta)
    return bn


@pytest.mark.parametrize("groups", [1, 3])
def test_batch_norm_with_its_relu_matches_the_reference_and_the_two_layers(groups):
    """``relu=True`` (one-pass batch norm and the ReLU after it as one layer, as the builders make them): the
    output is the ReLU of the float64 reference in training and of Keras' batch norm in inference; the
    hand-written gradient, which applies the ReLU's mask itself, is central differences of the reference
    and the backend's autodiff through the one-pass layer and a separate ReLU, in float32 and under
    mixed_bfloat16 (the mask rounded as the forward rounds it)."""
    rng = np.random.default_rng(3)
    x, weights, gamma, beta = _relu_case(rng)
    normalised = reference(x, groups, gamma, beta)[0]
    assert np.abs(normalised).min() > 1e-3 and 0.2 < (normalised > 0).mean() < 0.8  # both sides, none at the kink

    def layer(relu, dtype="float32"):
        return _one_pass_layer(groups, x.shape, gamma, beta, relu, dtype)

    fused = layer(True)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(fused(x, training=True)), np.maximum(normalised, 0),
                               rtol=1e-4, atol=1e-4)
    plain = keras.layers.BatchNormalization(epsilon=1e-5)
    plain.build(x.shape)
    plain.set_weights(fused.get_weights())
    np.testing.assert_allclose(keras.ops.convert_to_numpy(fused(x, training=False)),
                               keras.ops.convert_to_numpy(keras.ops.relu(plain(x, training=False))), atol=1e-6)
    assert GroupBatchNormalization.from_config(fused.get_config()).relu

    def reference_loss(v, g, b):
        return float(np.sum(np.maximum(reference(v, groups, g, b)[0], 0) * weights))

    dx, dgamma, dbeta = _gradients(fused, x, weights)
    np.testing.assert_allclose(dx, _central_differences(lambda v: reference_loss(v, gamma, beta), x), rtol=2e-3, atol=2e-4)
    np.testing.assert_allclose(dgamma, _central_differences(lambda v: reference_loss(x, v, beta), gamma), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dbeta, _central_differences(lambda v: reference_loss(x, gamma, v), beta), rtol=1e-4, atol=1e-4)
    assert np.abs(dx).max() > 1e-2 and (dx == 0).mean() < 0.5

    for dtype, tol in (("float32", 1e-6), ("mixed_bfloat16", 1e-6)):
        one, two = layer(True, dtype), layer(False, dtype)
        xd = keras.ops.cast(x, one.compute_dtype)
        ours = _gradients(one, xd, weights)
        separate = _gradients(two, xd, weights, after=keras.ops.relu)
        for a, b in zip(ours, separate):
            np.testing.assert_allclose(a, b, rtol=tol, atol=tol, err_msg=dtype)


@pytest.mark.parametrize("groups", [1, 3])
def test_batch_norm_with_a_residual_and_its_relu_matches_the_reference_and_the_three_layers(groups):
    """``relu=True`` called with ``residual=`` (a residual block's end, batch norm + sum + ReLU as one layer):
    the output is ReLU(reference + residual) in training and ReLU(Keras' batch norm + residual) in inference;
    the hand-written gradients of the input, gamma, beta and the residual are central differences of the
    float64 reference, and the backend's autodiff through one-pass batch norm, a sum and a ReLU, in float32
    and under mixed_bfloat16 (the sum and its mask rounded as the forward rounds them)."""
    rng = np.random.default_rng(5)
    x, weights, gamma, beta = _relu_case(rng)
    residual = rng.normal(size=x.shape).astype("float32")
    summed = reference(x, groups, gamma, beta)[0] + residual
    assert np.abs(summed).min() > 1e-3 and 0.2 < (summed > 0).mean() < 0.8  # both sides, none at the kink

    def layer(relu, dtype="float32"):
        return _one_pass_layer(groups, x.shape, gamma, beta, relu, dtype)

    fused = layer(True)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(fused(x, residual=residual, training=True)),
                               np.maximum(summed, 0), rtol=1e-4, atol=1e-4)
    plain = keras.layers.BatchNormalization(epsilon=1e-5)
    plain.build(x.shape)
    plain.set_weights(fused.get_weights())
    np.testing.assert_allclose(keras.ops.convert_to_numpy(fused(x, residual=residual, training=False)),
                               keras.ops.convert_to_numpy(keras.ops.relu(plain(x, training=False) + residual)),
                               atol=1e-6)

    def reference_loss(v, g, b, r):
        return float(np.sum(np.maximum(reference(v, groups, g, b)[0] + r, 0) * weights))

    dx, dgamma, dbeta, dr = _gradients(fused, x, weights, residual=residual)
    for got, wrt, at in ((dx, 0, x), (dgamma, 1, gamma), (dbeta, 2, beta), (dr, 3, residual)):
        def f(v, wrt=wrt):
            args = [x, gamma, beta, residual]
            args[wrt] = v
            return reference_loss(*args)
        np.testing.assert_allclose(got, _central_differences(f, at), rtol=2e-3, atol=2e-4, err_msg=str(wrt))
    assert np.abs(dx).max() > 1e-2 and 0 < (dr == 0).mean() < 0.8

    for dtype in ("float32", "mixed_bfloat16"):
        one, two = layer(True, dtype), layer(False, dtype)
        xd, rd = (keras.ops.cast(v, one.compute_dtype) for v in (x, residual))
        ours = _gradients(one, xd, weights, residual=rd)
        separate = _gradients(two, xd, weights, residual=rd, after=lambda y, r: keras.ops.relu(y + r))
        for a, b in zip(ours, separate):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6, err_msg=dtype)
    for training in (True, False):  # not broadcast in inference either
        with pytest.raises(ValueError, match="the residual's shape"):
            fused(x, residual=residual[:, :1], training=training)


def test_one_pass_builders_take_in_the_relu_after_a_batch_norm_with_the_same_weights(tmp_path):
    """With one-pass batch norm (the JAX default) the builders make each batch norm that a ReLU follows and
    that ReLU one layer (ResNet-18's stem and each block's first, the tiny encoder's, the projector's hidden
    ones), and each block's end: a batch norm, the shortcut's sum and the ReLU after it. The weights
    are the two-layer build's, in the same order and under the same names, so a weights file of either
    loads into the other; both give the same features, in training and inference, and the same gradients."""
    from uniclr_tf.nets import heads

    class TwoLayers(encoders.BatchNorm):
        fuses_relu = False

    def with_relu(model):
        return [layer.name for layer in model.layers if getattr(layer, "relu", False)]

    rng = np.random.default_rng(4)
    builds = {"resnet18": lambda norm: encoders.build_encoder("resnet18", (12, 12, 1), width=4, norm=norm),
              "tiny": lambda norm: encoders.build_encoder("tiny", (12, 12, 1), width=4, norm=norm),
              "projector": lambda norm: heads.projector(8, (16, 16, 4), norm=norm)}
    blocks = [f"stage{s}_block{b}" for s in range(1, 5) for b in (1, 2)]
    ends = [f"{block}_down_bn" if block.endswith("block1") and block != "stage1_block1" else f"{block}_bn2"
            for block in blocks]  # a projected shortcut's batch norm takes in the sum, keeping the weights' order
    expected = {"resnet18": {"stem_bn"} | {f"{block}_bn1" for block in blocks} | set(ends),
                "tiny": {"bn1", "bn2", "bn3"}, "projector": {"projector_bn1", "projector_bn2"}}
    for name, build in builds.items():
        fused, two = build(encoders.BatchNorm(one_pass=True)), build(TwoLayers(one_pass=True))
        relus = [layer for layer in two.layers if isinstance(layer, keras.layers.ReLU)]
        adds = [layer for layer in two.layers if isinstance(layer, keras.layers.Add)]
        assert set(with_relu(fused)) == expected[name] and not with_relu(two)
        assert len(two.layers) - len(fused.layers) == len(with_relu(fused)) + len(adds) == len(relus) + len(adds)
        assert [v.path for v in fused.weights] == [v.path for v in two.weights], name
        two.save_weights(tmp_path / f"{name}.weights.h5")
        fused.load_weights(tmp_path / f"{name}.weights.h5")
        shape = (8, 8) if name == "projector" else (8, 12, 12, 1)
        x = rng.normal(size=shape).astype("float32")
        for training in (False, True):
            np.testing.assert_allclose(keras.ops.convert_to_numpy(fused(x, training=training)),
                                       keras.ops.convert_to_numpy(two(x, training=training)),
                                       rtol=1e-5, atol=1e-5, err_msg=f"{name} training={training}")


def test_group_batch_norm_config_context_and_errors():
    grouped = encoders.BatchNorm(groups=4)(name="bn")
    plain = encoders.BatchNorm()(name="bn")
    assert type(grouped) is GroupBatchNormalization and grouped.groups == 4
    assert type(plain) is keras.layers.BatchNormalization
    clone = GroupBatchNormalization.from_config(grouped.get_config())
    assert clone.groups == 4 and clone.momentum == grouped.momentum
    with pytest.raises(ValueError, match="does not split into 4 groups"):
        grouped(np.zeros((6, 3), "float32"), training=True)
    with pytest.raises(ValueError, match="groups must be >= 1"):
        GroupBatchNormalization(groups=0)


def collectives(tmp_path, batch_norm):
    out = tmp_path / f"{batch_norm}.json"
    proc = warm.run(
        [sys.executable, "-m", "benchmarks.spmd_collectives", "--devices=2", f"--out={out}", "--",
         "--flagfile=configs/quickstart.flags", "--method=simaffinity", "--encoder=tiny", "--encoder_width=8",
         "--projector_dims=64,32", "--batch_size=32", "--max_examples=256", f"--batch_norm={batch_norm}",
         f"--run_dir={tmp_path / batch_norm}"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
        env={**__import__("os").environ, "PYTHONPATH": str(REPO_ROOT), "TF_CPP_MIN_LOG_LEVEL": "3",
             "KERAS_BACKEND": "jax"})   # the script's own backend, which it sets before importing Keras
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())["counts"]


def test_per_device_and_one_pass_batch_norm_remove_bn_all_reduces(tmp_path):
    """The real data-parallel train step (JAX, 2 devices), compiled: global BN all-reduces every BN
    layer's statistics forward and its sums backward (25 all-reduces here: tiny encoder 3 + projector
    2 BN layers), per-device BN none of them (the moving statistics' means ride in the gradient
    all-reduce: 5 here), one-pass global BN the same statistics with 2 fewer per BN layer; and in every
    mode no batch rows move between devices."""
    with concurrent.futures.ThreadPoolExecutor(3) as pool:  # at the same time: 3 compiles in ~30 s on 2 cores
        global_bn, per_device, one_pass = pool.map(lambda bn: collectives(tmp_path, bn),
                                                   ("global", "per_device", "global_one_pass"))
    assert global_bn["all-reduce"] >= per_device["all-reduce"] + 10, (global_bn, per_device)
    assert per_device["all-reduce"] <= 6, per_device
    assert per_device["all-reduce"] < one_pass["all-reduce"] <= global_bn["all-reduce"] - 2 * 5, (global_bn, one_pass)
    # Whatever the batch norm, no rows of the batch move between devices: the views are interleaved
    # (model._interleave), the positives read without a gather; what crosses is the second view's
    # embeddings (1 all-gather) and the affinity's blocks for A - A^T (all-to-alls, the symmetric loss).
    for counts in (global_bn, per_device, one_pass):
        assert counts.get("collective-permute", 0) == 0 and counts.get("all-gather", 0) <= 1, counts
        assert counts.get("all-to-all", 0) <= 2, counts
