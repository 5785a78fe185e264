"""Tests for uniclr_tf.augment: maths against NumPy / TF references, per-sample randomness,
tf.data and XLA on TF, and (in one cached JAX subprocess) tf.data, jax.jit, cross-backend parity
of the deterministic maths and of the parameter distributions."""

import colorsys
import concurrent.futures
import json
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

if str(Path(__file__).resolve().parents[1]) not in sys.path:  # plain `pytest`, no install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from uniclr_tf import augment as A  # noqa: E402


def _np(x):
    return keras.ops.convert_to_numpy(x)


def _images(batch, height, width, channels, seed=0):
    return np.random.default_rng(seed).random((batch, height, width, channels)).astype("float32")


def _uint8(batch, height, width, channels, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (batch, height, width, channels),
                                                dtype=np.uint8)


# ---------------------------------------------------------------------------------------------
# NumPy references
# ---------------------------------------------------------------------------------------------


def _np_crop_resize(image, y0, x0, h, w, out_h, out_w):
    """Bilinear, half-pixel centres, clamp to edge; float64; one [H, W, C] image."""
    height, width = image.shape[:2]
    out = np.zeros((out_h, out_w, image.shape[2]))
    for i in range(out_h):
        sy = np.clip(y0 + (i + 0.5) * h / out_h - 0.5, 0, height - 1)
        y_lo = int(np.floor(sy)); y_hi = min(y_lo + 1, height - 1); fy = sy - y_lo
        for j in range(out_w):
            sx = np.clip(x0 + (j + 0.5) * w / out_w - 0.5, 0, width - 1)
            x_lo = int(np.floor(sx)); x_hi = min(x_lo + 1, width - 1); fx = sx - x_lo
            top = (1 - fx) * image[y_lo, x_lo] + fx * image[y_lo, x_hi]
            bottom = (1 - fx) * image[y_hi, x_lo] + fx * image[y_hi, x_hi]
            out[i, j] = (1 - fy) * top + fy * bottom
    return out


def _np_blur(image, sigma, kernel_size):
    """Separable Gaussian blur, reflect padding, torchvision kernel; float64."""
    r = kernel_size // 2
    d = np.arange(-r, r + 1)
    g = np.exp(-0.5 * (d / sigma) ** 2)
    g /= g.sum()
    padded = np.pad(image.astype("float64"), ((r, r), (r, r), (0, 0)), mode="reflect")
    rows = sum(g[k] * padded[k:k + image.shape[0]] for k in range(kernel_size))
    return sum(g[k] * rows[:, k:k + image.shape[1]] for k in range(kernel_size))


# ---------------------------------------------------------------------------------------------
# Shapes, dtypes, ranges, multi-crop
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("channels", [1, 3])
def test_view_augmenter_shapes_dtypes_ranges(channels):
    aug = A.ViewAugmenter(32, local_size=(16, 12), num_global=2, num_local=3, blur_rate=0.5,
                          solarize_rate=0.5, mean=0.5, std=0.25, seed=0)
    views = aug(_uint8(6, 32, 40, channels))
    assert isinstance(views, tuple) and len(views) == 5
    expected = [(6, 32, 32, channels)] * 2 + [(6, 16, 12, channels)] * 3
    assert [tuple(v.shape) for v in views] == expected
    assert aug.compute_output_shape((6, 32, 40, channels)) == tuple(expected)
    for v in views:
        v = _np(v)
        assert v.dtype == np.float32 and np.isfinite(v).all()
        pixels = v * 0.25 + 0.5  # undo the normalisation: back in [0, 1]
        assert pixels.min() >= -1e-5 and pixels.max() <= 1 + 1e-5
        assert pixels.std() > 0.05  # not collapsed to a constant


def test_single_layers_keep_shape_and_float32():
    x = _images(4, 20, 24, 3)
    for layer in [A.RandomHorizontalFlip(), A.RandomColorJitter(), A.RandomGrayscale(),
                  A.RandomGaussianBlur(rate=1.0), A.RandomSolarize(rate=0.5), A.Normalize()]:
        out = layer(x)
        assert tuple(out.shape) == x.shape and _np(out).dtype == np.float32, layer.name
    out = A.RandomResizedCrop(8, 10)(x)
    assert tuple(out.shape) == (4, 8, 10, 3)


def test_symbolic_call_gives_view_shapes():
    aug = A.ViewAugmenter(32, 16, num_global=2, num_local=2)
    outs = aug(keras.Input((32, 32, 3), dtype="uint8"))
    assert [tuple(o.shape) for o in outs] == [(None, 32, 32, 3)] * 2 + [(None, 16, 16, 3)] * 2


# ---------------------------------------------------------------------------------------------
# RandomResizedCrop maths
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("antialias", [False, True])
def test_crop_full_image_same_size_is_identity(antialias):
    x = _images(5, 24, 24, 3)
    layer = A.RandomResizedCrop(24, 24, scale=(1.0, 1.0), ratio=(1.0, 1.0), antialias=antialias)
    np.testing.assert_allclose(_np(layer(x)), x, atol=1e-5, rtol=0)


def test_resize_matrix_matches_numpy_bilinear_on_known_box():
    x = _images(2, 20, 28, 3, seed=1)
    t = {"y0": np.array([3.25, 0.0], "float32"), "x0": np.array([1.0, 7.5], "float32"),
         "h": np.array([11.5, 20.0], "float32"), "w": np.array([20.7, 5.0], "float32")}
    layer = A.RandomResizedCrop(9, 13, antialias=False)
    out = _np(layer.transform_images(tf.constant(x), t))
    for b in range(2):
        ref = _np_crop_resize(x[b].astype("float64"), t["y0"][b], t["x0"][b], t["h"][b],
                              t["w"][b], 9, 13)
        np.testing.assert_allclose(out[b], ref, atol=1e-5, rtol=0)
    rows = _np(A.resize_matrix(t["y0"], t["h"], 20, 9))
    np.testing.assert_allclose(rows.sum(-1), 1.0, atol=1e-6)


@pytest.mark.parametrize("antialias", [False, True])
@pytest.mark.parametrize("out_size", [(20, 17), (64, 80), (10, 90)])
def test_full_box_resize_matches_tf_image_resize(out_size, antialias):
    x = _images(2, 37, 53, 3, seed=2)
    ry = A.resize_matrix(0.0, 37.0, 37, out_size[0], antialias)
    rx = A.resize_matrix(0.0, 53.0, 53, out_size[1], antialias)
    ref = tf.image.resize(x, out_size, method="bilinear", antialias=antialias).numpy()
    np.testing.assert_allclose(_np(A.apply_separable(tf.constant(x), ry, rx)), ref, atol=2e-5)


def _np_torchvision_boxes(n, height, width, scale, ratio, seed=0):
    """torchvision's RandomResizedCrop sampler (10 attempts, continuous sizes): area fraction and
    log aspect of the boxes that fit."""
    rng = np.random.default_rng(seed)
    area = rng.uniform(*scale, (n, 10)) * height * width
    aspect = np.exp(rng.uniform(np.log(ratio[0]), np.log(ratio[1]), (n, 10)))
    w, h = np.sqrt(area * aspect), np.sqrt(area / aspect)
    ok = (w <= width) & (h <= height)
    first = ok.argmax(axis=1)[ok.any(axis=1)]
    rows = np.nonzero(ok.any(axis=1))[0]
    return area[rows, first] / (height * width), np.log(aspect[rows, first])


def test_crop_boxes_are_per_sample_in_bounds_and_follow_scale_and_ratio():
    layer = A.RandomResizedCrop(16, 16, scale=(0.2, 1.0), ratio=(0.75, 4 / 3), seed=3)
    n = 2048
    t = {k: _np(v) for k, v in layer.get_random_transformation(n, (32, 48)).items()}
    assert (t["y0"] >= -1e-5).all() and (t["x0"] >= -1e-5).all()
    assert (t["y0"] + t["h"] <= 32 + 1e-4).all() and (t["x0"] + t["w"] <= 48 + 1e-4).all()
    area = t["h"] * t["w"] / (32 * 48)
    aspect = t["w"] / t["h"]
    central = np.isclose(t["h"], 32) & np.isclose(t["w"], 32 * 4 / 3)  # fallback box
    ok = central | ((area >= 0.2 - 1e-4) & (area <= 1 + 1e-4))
    assert ok.all() and central.mean() < 0.05
    assert (aspect >= 0.75 - 1e-4).all() and (aspect <= 4 / 3 + 1e-4).all()
    assert len(np.unique(np.round(area, 5))) > n * 0.95  # every sample its own box
    assert t["y0"].std() > 1.0 and t["x0"].std() > 1.0
    # Same distribution as torchvision's sampler (NumPy, 200k boxes): 5 standard errors.
    ref_area, ref_log_aspect = _np_torchvision_boxes(200_000, 32, 48, (0.2, 1.0), (0.75, 4 / 3))
    for ours, ref in [(area[~central], ref_area), (np.log(aspect[~central]), ref_log_aspect)]:
        assert abs(ours.mean() - ref.mean()) < 5 * ref.std() / np.sqrt(len(ours))
        assert abs(ours.std() - ref.std()) < 5 * ref.std() / np.sqrt(len(ours))


def test_crop_fallback_when_no_box_fits():
    # ratio (2, 3) on a 40x10 (H x W) image with scale 1: no attempt fits → central fallback box.
    layer = A.RandomResizedCrop(8, 8, scale=(1.0, 1.0), ratio=(2.0, 3.0), seed=0)
    t = {k: _np(v) for k, v in layer.get_random_transformation(16, (40, 10)).items()}
    np.testing.assert_allclose(t["w"], 10.0, atol=1e-5)
    np.testing.assert_allclose(t["h"], 5.0, atol=1e-5)
    np.testing.assert_allclose(t["y0"], 17.5, atol=1e-5)


def test_crops_differ_between_samples_of_one_batch():
    x = np.repeat(_images(1, 32, 32, 3, seed=4), 16, axis=0)
    out = _np(A.RandomResizedCrop(16, 16, seed=5)(x))
    distinct = {out[b].tobytes() for b in range(16)}
    assert len(distinct) == 16


def test_crop_inference_is_deterministic_central_resize():
    x = _images(2, 32, 32, 3)
    layer = A.RandomResizedCrop(16, 16)
    out1, out2 = _np(layer(x, training=False)), _np(layer(x, training=False))
    np.testing.assert_array_equal(out1, out2)
    ref = tf.image.resize(x, (16, 16), antialias=True).numpy()
    np.testing.assert_allclose(out1, ref, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# Flip, blur, solarize, grayscale, colour jitter
# ---------------------------------------------------------------------------------------------


def test_flip_is_per_sample_and_exact():
    x = np.repeat(_images(1, 8, 12, 3, seed=6), 256, axis=0)
    out = _np(A.RandomHorizontalFlip(seed=7)(x))
    same = np.all(out == x, axis=(1, 2, 3))
    flipped = np.all(out == x[:, :, ::-1], axis=(1, 2, 3))
    assert (same ^ flipped).all()
    assert 0.38 < flipped.mean() < 0.62


def test_blur_tiny_sigma_is_identity():
    x = _images(3, 32, 24, 3)
    out = A.RandomGaussianBlur(sigma=(1e-3, 1e-3), kernel_size=5, rate=1.0)(x)
    np.testing.assert_allclose(_np(out), x, atol=1e-6)


def test_blur_matches_numpy_reflect_reference_per_sample():
    x = _images(3, 20, 26, 3, seed=8)
    sigma = np.array([0.3, 1.0, 2.0], "float32")
    layer = A.RandomGaussianBlur(kernel_size=7, rate=1.0)
    out = _np(layer.transform_images(tf.constant(x), {"apply": np.array([True] * 3),
                                                      "sigma": sigma}))
    for b in range(3):
        np.testing.assert_allclose(out[b], _np_blur(x[b], sigma[b], 7), atol=1e-5)
    # Not applied → untouched.
    out = _np(layer.transform_images(tf.constant(x), {"apply": np.array([False, True, False]),
                                                      "sigma": sigma}))
    np.testing.assert_allclose(out[0], x[0], atol=1e-7)
    assert np.abs(out[1] - x[1]).max() > 0.05


def test_blur_smooths_and_roughly_preserves_mean():
    x = _images(4, 32, 32, 3, seed=9)
    out = _np(A.RandomGaussianBlur(sigma=(2.0, 2.0), rate=1.0)(x))  # default kernel 3 at 32 px
    np.testing.assert_allclose(out.mean(axis=(1, 2, 3)), x.mean(axis=(1, 2, 3)), atol=5e-3)
    assert out.std() < 0.7 * x.std()
    assert A.default_blur_kernel_size(224) == 23 and A.default_blur_kernel_size(32) == 3


def test_blur_kernel_too_large_is_a_clear_error():
    with pytest.raises(ValueError, match="kernel_size=11"):
        A.RandomGaussianBlur(kernel_size=11, rate=1.0)(_images(1, 4, 4, 3))


def test_solarize_exact_on_known_values():
    x = np.array([0.0, 0.25, 0.49, 0.5, 0.75, 1.0], "float32").reshape(1, 1, 6, 1)
    out = _np(A.RandomSolarize(threshold=0.5, rate=1.0)(x)).ravel()
    np.testing.assert_array_equal(out, np.array([0.0, 0.25, 0.49, 0.5, 0.25, 0.0], "float32"))
    np.testing.assert_array_equal(_np(A.RandomSolarize(rate=0.0)(x)), x)


def test_grayscale_equal_channels_and_luma():
    x = _images(4, 6, 5, 3)
    out = _np(A.RandomGrayscale(rate=1.0)(x))
    luma = x @ np.array([0.2989, 0.587, 0.114], "float32")
    for c in range(3):
        np.testing.assert_allclose(out[..., c], luma, atol=1e-6)
    x1 = _images(2, 6, 5, 1)
    np.testing.assert_array_equal(_np(A.RandomGrayscale(rate=1.0)(x1)), x1)
    mixed = _np(A.RandomGrayscale(rate=0.5, seed=1)(_images(200, 4, 4, 3)))
    gray = np.all(np.isclose(mixed[..., 0], mixed[..., 1]), axis=(1, 2))
    assert 0.3 < gray.mean() < 0.7


def _jitter_params(batch, **values):
    base = {"apply": np.ones(batch, bool), "brightness": np.ones(batch, "float32"),
            "contrast": np.ones(batch, "float32"), "saturation": np.ones(batch, "float32"),
            "hue": np.zeros(batch, "float32")}
    base.update({k: np.asarray(v, "float32") for k, v in values.items()})
    return base


def test_color_jitter_identity_cases():
    x = _images(4, 8, 8, 3)
    np.testing.assert_array_equal(_np(A.RandomColorJitter(rate=0.0)(x)), x)
    layer = A.RandomColorJitter(0.4, 0.4, 0.4, 0.1, rate=1.0)
    out = _np(layer.transform_images(tf.constant(x), _jitter_params(4)))
    np.testing.assert_allclose(out, x, atol=2e-6)  # includes the hue round trip


def test_color_jitter_known_values():
    x = _images(3, 6, 7, 3, seed=11)
    layer = A.RandomColorJitter(0.5, 0.5, 0.5, 0.5, rate=1.0)

    def run(**values):
        return _np(layer.transform_images(tf.constant(x), _jitter_params(3, **values)))

    np.testing.assert_allclose(run(brightness=[0.5] * 3), x * 0.5, atol=1e-6)
    luma = x @ np.array([0.2989, 0.587, 0.114], "float32")
    mean = luma.mean(axis=(1, 2))[:, None, None, None]
    np.testing.assert_allclose(run(contrast=[0.0] * 3), np.broadcast_to(mean, x.shape), atol=1e-6)
    np.testing.assert_allclose(run(saturation=[0.0] * 3),
                               np.repeat(luma[..., None], 3, axis=-1), atol=1e-6)
    # Hue against colorsys (HSV), a different shift per sample.
    shifts = np.array([0.1, -0.3, 0.45], "float32")
    out = run(hue=shifts)
    for b in range(3):
        for i, j in [(0, 0), (2, 3), (5, 6)]:
            h, s, v = colorsys.rgb_to_hsv(*x[b, i, j].astype("float64"))
            ref = colorsys.hsv_to_rgb((h + shifts[b]) % 1.0, s, v)
            np.testing.assert_allclose(out[b, i, j], ref, atol=1e-5)
    red = np.zeros((1, 1, 1, 3), "float32"); red[..., 0] = 1.0
    green = _np(layer.transform_images(tf.constant(red), _jitter_params(1, hue=[1 / 3])))
    np.testing.assert_allclose(green.ravel(), [0.0, 1.0, 0.0], atol=1e-5)


def test_color_jitter_per_sample_rate_and_one_channel():
    x = np.repeat(_images(1, 6, 6, 3, seed=12), 400, axis=0)
    out = _np(A.RandomColorJitter(rate=0.8, seed=13)(x))
    changed = np.abs(out - x).max(axis=(1, 2, 3)) > 1e-6
    assert 0.72 < changed.mean() < 0.88
    changed_outputs = out[changed].reshape(changed.sum(), -1)
    assert len(np.unique(changed_outputs.round(5), axis=0)) == changed.sum()
    x1 = _images(8, 6, 6, 1)
    out1 = _np(A.RandomColorJitter(rate=1.0, seed=0)(x1))
    assert out1.shape == x1.shape and 0 <= out1.min() and out1.max() <= 1
    assert np.abs(out1 - x1).max() > 1e-3


def test_normalize_and_eval_preprocess():
    x = _uint8(3, 16, 16, 3)
    mean, std = (0.4, 0.5, 0.6), (0.2, 0.25, 0.3)
    expected = (x / 255.0 - np.array(mean)) / np.array(std)
    np.testing.assert_allclose(_np(A.eval_preprocess(x, 16, mean, std)), expected, atol=1e-5)
    np.testing.assert_allclose(_np(A.Normalize(mean, std)(x / 255.0)), expected, atol=1e-5)
    const = np.full((2, 64, 48, 1), 200, np.uint8)  # centre crop of the 48x48 square + resize
    out = _np(A.EvalPreprocess(32, mean=0.5, std=0.5, crop_fraction=0.875)(const))
    assert out.shape == (2, 32, 32, 1)
    np.testing.assert_allclose(out, (200 / 255 - 0.5) / 0.5, atol=1e-5)
    layer = A.EvalPreprocess((24, 20), mean=mean, std=std)
    assert A.EvalPreprocess.from_config(layer.get_config()).get_config() == layer.get_config()
    assert layer.compute_output_shape((None, 64, 64, 3)) == (None, 24, 20, 3)


# ---------------------------------------------------------------------------------------------
# Views, seeds, factory, config, errors
# ---------------------------------------------------------------------------------------------


def test_views_are_independent_seeded_and_advance():
    x = _uint8(4, 32, 32, 3)
    a, b = A.ViewAugmenter(32, seed=3), A.ViewAugmenter(32, seed=3)
    va, vb = [_np(v) for v in a(x)], [_np(v) for v in b(x)]
    np.testing.assert_array_equal(va[0], vb[0])  # same seed → same views
    assert np.abs(va[0] - va[1]).max() > 0.1  # two views differ
    again = _np(a(x)[0])
    assert np.abs(again - va[0]).max() > 0.1  # the seed state advances
    frozen = [_np(v) for v in a(x, training=False)]  # deterministic: central resize + normalise
    np.testing.assert_array_equal(frozen[0], frozen[1])
    np.testing.assert_allclose(frozen[0], _np(A.eval_preprocess(x, 32)), atol=1e-5)


def test_for_dataset_defaults():
    small = A.ViewAugmenter.for_dataset((32, 32, 3), num_local=4, dataset="cifar10")
    assert small.global_size == (32, 32) and small.local_size == (16, 16)
    assert small.blur_rate == (0.0,) * 6 and small.mean == A.DATASET_STATS["cifar10"][0]
    assert not any(isinstance(l, A.RandomGaussianBlur) for chain in small.chains for l in chain)
    gray = A.ViewAugmenter.for_dataset((28, 28, 1))
    assert gray.global_size == (28, 28) and gray.num_local == 0 and gray.blur_rate == (0.0,) * 2
    big = A.ViewAugmenter.for_dataset((375, 500, 3), num_local=2, solarize_rate=(0, .2, 0, 0))
    assert big.global_size == (224, 224) and big.local_size == (96, 96)
    assert big.blur_rate == (0.5,) * 4 and big.solarize_rate == (0.0, 0.2, 0.0, 0.0)
    assert [tuple(v.shape) for v in big(_uint8(2, 375, 500, 3))] == \
        [(2, 224, 224, 3)] * 2 + [(2, 96, 96, 3)] * 2


def test_get_config_round_trips():
    layers = [A.RandomResizedCrop(16, 12, scale=(0.1, 0.9), ratio=(0.5, 2.0), seed=1),
              A.RandomHorizontalFlip(0.3, seed=2), A.RandomColorJitter(0.1, 0.2, 0.3, 0.05, 0.7),
              A.RandomGrayscale(0.1), A.RandomGaussianBlur((0.2, 1.0), 5, 0.4),
              A.RandomSolarize(0.6, 0.2), A.Normalize((0.1, 0.2, 0.3), (0.4, 0.5, 0.6)),
              A.EvalPreprocess(32, crop_fraction=0.875),
              A.ViewAugmenter(32, 16, num_local=2, blur_rate=(1, 0.1, 0.5, 0.5), seed=9)]
    for layer in layers:
        config = layer.get_config()
        json.dumps(config)
        clone = type(layer).from_config(config)
        assert clone.get_config() == config, type(layer).__name__
        revived = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
        assert type(revived) is type(layer)


def test_input_validation_errors_quote_what_was_received():
    with pytest.raises(ValueError, match=r"rank 4.*\(32, 32, 3\)"):
        A.RandomHorizontalFlip()(_images(1, 32, 32, 3)[0])
    with pytest.raises(ValueError, match="C=2"):
        A.ViewAugmenter(16)(np.zeros((2, 16, 16, 2), np.uint8))
    with pytest.raises(ValueError, match="C=4"):
        A.RandomResizedCrop(8, 8)(np.zeros((2, 16, 16, 4), np.float32))
    with pytest.raises(ValueError, match=r"scale=\(0.5, 0.2\)"):
        A.RandomResizedCrop(8, 8, scale=(0.5, 0.2))
    with pytest.raises(ValueError, match="rate=1.5"):
        A.RandomGrayscale(rate=1.5)
    with pytest.raises(ValueError, match="local_size"):
        A.ViewAugmenter(32, num_local=2)
    with pytest.raises(ValueError, match="blur_rate"):
        A.ViewAugmenter(32, blur_rate=(0.5, 0.5, 0.5))


# ---------------------------------------------------------------------------------------------
# tf.data and XLA on the TensorFlow backend
# ---------------------------------------------------------------------------------------------


def test_tf_data_batched_map_tf_backend():
    assert keras.backend.backend() == "tensorflow"
    aug = A.ViewAugmenter.for_dataset((32, 32, 3), num_local=2, seed=0)
    ds = tf.data.Dataset.from_tensor_slices(_uint8(20, 32, 32, 3)).batch(8).map(aug)
    shapes = [[tuple(v.shape) for v in views] for views in ds]
    assert shapes[-1] == [(4, 32, 32, 3)] * 2 + [(4, 16, 16, 3)] * 2  # partial last batch
    assert len(shapes) == 3
    crop = A.RandomResizedCrop(16, 16)
    spec = tf.data.Dataset.from_tensor_slices(_images(20, 32, 32, 1)).batch(8).map(crop)
    assert tuple(spec.element_spec.shape) == (None, 16, 16, 1)  # static H, W, C


def test_parallel_tf_data_map_never_repeats_random_parameters():
    # A Keras SeedGenerator's read-then-assign races across parallel map calls (duplicate draws
    # were seen); the TF path draws from a tf.random.Generator, whose update is atomic.
    layer = A.RandomGaussianBlur(rate=1.0, seed=0)
    ds = tf.data.Dataset.range(3000).map(
        lambda i: layer.get_random_transformation(4)["sigma"], num_parallel_calls=8)
    draws = np.stack([d.numpy() for d in ds])
    assert len(np.unique(draws, axis=0)) == len(draws)


def test_tf_function_jit_compile():
    aug = A.ViewAugmenter(16, num_global=1, blur_rate=1.0, solarize_rate=0.5)
    step = tf.function(lambda x: aug(x), jit_compile=True)
    x = tf.constant(_uint8(4, 16, 16, 3))
    first, second = step(x), step(x)
    assert [tuple(v.shape) for v in first] == [(4, 16, 16, 3)]
    assert np.abs(_np(first[0]) - _np(second[0])).max() > 0.1  # seeds advance under XLA


# ---------------------------------------------------------------------------------------------
# JAX backend, in one subprocess shared by the tests below
# ---------------------------------------------------------------------------------------------

DIST_BATCH = 4096
_PARITY_SIZE = (3, 20, 24)


def _parity_inputs():
    """Fixed inputs and explicit parameters for the deterministic cross-backend check."""
    rng = np.random.default_rng(99)
    n, h, w = _PARITY_SIZE
    return {
        "x": rng.random((n, h, w, 3)).astype("float32"),
        "y0": np.array([0.0, 2.5, 5.0], "float32"), "x0": np.array([1.0, 0.0, 3.3], "float32"),
        "h": np.array([15.0, 12.2, 8.0], "float32"), "w": np.array([20.0, 9.7, 18.0], "float32"),
        "on": np.array([True, False, True]), "sigma": np.array([0.5, 1.2, 2.0], "float32"),
        "factor": np.array([0.7, 1.3, 1.1], "float32"),
        "hue": np.array([0.08, -0.1, 0.3], "float32"),
        "factor_rev": np.array([1.1, 1.3, 0.7], "float32"),
    }


def _parity_tensors(p):
    """The deterministic maths on fixed params (a pure function: jax.jit-able)."""
    x = p["x"]
    jitter = {"apply": p["on"], "brightness": p["factor"], "contrast": p["factor_rev"],
              "saturation": p["factor"], "hue": p["hue"]}
    crop_t = {k: p[k] for k in ("y0", "x0", "h", "w")}
    return {
        "crop": A.RandomResizedCrop(12, 10).transform_images(x, crop_t),
        "blur": A.RandomGaussianBlur(kernel_size=5, rate=1.0).transform_images(
            x, {"apply": p["on"], "sigma": p["sigma"]}),
        "jitter": A.RandomColorJitter(rate=1.0).transform_images(x, jitter),
        "gray": A.RandomGrayscale(rate=1.0).transform_images(x, {"apply": p["on"]}),
        "flip": A.RandomHorizontalFlip().transform_images(x, {"flip": p["on"]}),
        "solarize": A.RandomSolarize(rate=1.0).transform_images(x, {"apply": p["on"]}),
        "eval": A.EvalPreprocess((16, 10), crop_fraction=0.9)(x * 255.0),
    }


def _draw_params(batch):
    """get_random_transformation of the default recipe with fixed int seeds (jax.jit-able)."""
    crop = A.RandomResizedCrop(32, 32).get_random_transformation(batch, (32, 32), seed=1)
    return {"crop": crop,
            "flip": A.RandomHorizontalFlip().get_random_transformation(batch, seed=2),
            "jitter": A.RandomColorJitter().get_random_transformation(batch, seed=3),
            "blur": A.RandomGaussianBlur().get_random_transformation(batch, seed=4),
            "gray": A.RandomGrayscale().get_random_transformation(batch, seed=5)}


def _param_stats(params):
    """(mean, std) of each drawn parameter."""
    p = {k: {kk: np.asarray(_np(vv), "float64") for kk, vv in v.items()} for k, v in params.items()}
    t = p["crop"]
    samples = {"area": t["h"] * t["w"] / 1024.0, "log_aspect": np.log(t["w"] / t["h"]),
               "y_center": (t["y0"] + t["h"] / 2) / 32.0, "flip": p["flip"]["flip"],
               "jitter_apply": p["jitter"]["apply"], "brightness": p["jitter"]["brightness"],
               "hue": p["jitter"]["hue"], "gray_apply": p["gray"]["apply"],
               "blur_apply": p["blur"]["apply"], "sigma": p["blur"]["sigma"]}
    return {k: [float(np.mean(v)), float(np.std(v))] for k, v in samples.items()}


_JAX_SNIPPET = """
import json, sys, time
import numpy as np
import jax, keras, tensorflow as tf
sys.path.insert(0, "tests")
import test_augment as T
from uniclr_tf import augment as A
assert keras.backend.backend() == "jax"
report = {}

# 1. tf.data on batched data under KERAS_BACKEND=jax (the layer switches itself to TF).
aug = A.ViewAugmenter(16, 8, num_global=1, num_local=1, blur_rate=0.5, solarize_rate=0.2, seed=0)
ds = tf.data.Dataset.from_tensor_slices(T._uint8(10, 16, 16, 3)).batch(4).map(aug)
report["tfdata_shapes"] = [[list(v.shape) for v in views] for views in ds]
report["tfdata_types"] = sorted({type(v).__name__ for views in ds for v in views})

# 2. inside jax.jit through stateless_call (seed state threaded explicitly).
aug = A.ViewAugmenter(16, 8, num_global=1, num_local=1, blur_rate=0.5, solarize_rate=0.2, seed=0)
state = [v.value for v in aug.non_trainable_variables]
step = jax.jit(lambda s, x: aug.stateless_call([], s, x))
x = T._uint8(4, 16, 16, 3)
t0 = time.time()
(v1, s1) = step(state, x)
(v2, s2) = step(s1, x)
report["jit_seconds"] = time.time() - t0
report["jit_shapes"] = [list(v.shape) for v in v1]
report["jit_dtypes"] = [str(v.dtype) for v in v1]
report["jit_state_advanced"] = bool(any((np.asarray(a) != np.asarray(b)).any() for a, b in zip(state, s1)))
report["jit_views_differ_between_steps"] = float(np.abs(np.asarray(v1[0]) - np.asarray(v2[0])).max())

# 3. the deterministic maths on fixed parameters, and 4. parameter draws (jitted: eager JAX
# compiles every primitive separately, which is slow on CPU).
parity = jax.jit(T._parity_tensors)(T._parity_inputs())
np.savez(OUT_PATH, **{k: np.asarray(v) for k, v in parity.items()})
report["stats"] = T._param_stats(jax.jit(lambda: T._draw_params(T.DIST_BATCH))())
print(json.dumps(report))
"""

_JAX = {}


@pytest.fixture(autouse=True)
def _jax_run_in_background(request, run_python, tmp_path_factory):
    """Starts the JAX-backend snippet (about 30 s of CPU) in a background thread at the first test
    of this module when any selected test needs it, so it overlaps the TF tests."""
    if "future" not in _JAX and any("jax_report" in getattr(item, "fixturenames", ())
                                    for item in request.session.items):
        out = tmp_path_factory.mktemp("jax") / "parity.npz"
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        _JAX["out"] = out
        _JAX["future"] = pool.submit(run_python, f"OUT_PATH = {str(out)!r}\n" + _JAX_SNIPPET,
                                     backend="jax")
        pool.shutdown(wait=False)
    yield


@pytest.fixture
def jax_report():
    """(report dict, parity arrays) of the JAX subprocess (run once per session)."""
    report = _JAX["future"].result()
    if "parity" not in _JAX:
        _JAX["parity"] = dict(np.load(_JAX["out"]))
    return report, _JAX["parity"]


def test_jax_backend_tf_data(jax_report):
    report, _ = jax_report
    assert report["tfdata_shapes"] == [[[4, 16, 16, 3], [4, 8, 8, 3]]] * 2 + \
        [[[2, 16, 16, 3], [2, 8, 8, 3]]]
    assert report["tfdata_types"] == ["EagerTensor"]


def test_jax_backend_inside_jit(jax_report):
    report, _ = jax_report
    assert report["jit_shapes"] == [[4, 16, 16, 3], [4, 8, 8, 3]]
    assert report["jit_dtypes"] == ["float32", "float32"]
    assert report["jit_state_advanced"]
    assert report["jit_views_differ_between_steps"] > 0.1


def test_deterministic_maths_identical_on_tf_and_jax(jax_report):
    _, jax_out = jax_report
    tf_out = {k: _np(v) for k, v in _parity_tensors(_parity_inputs()).items()}
    assert set(jax_out) == set(tf_out)
    for name, value in tf_out.items():
        np.testing.assert_allclose(jax_out[name], value, atol=2e-5, err_msg=name)


def test_parameter_distributions_match_between_tf_host_and_jax_device(jax_report):
    report, _ = jax_report
    tf_stats, jax_stats = _param_stats(_draw_params(DIST_BATCH)), report["stats"]
    assert set(tf_stats) == set(jax_stats)
    n = DIST_BATCH
    for name, (tf_mean, tf_std) in tf_stats.items():
        jax_mean, jax_std = jax_stats[name]
        std = max(tf_std, jax_std)
        # Difference of two independent means: 5 standard errors; of two stds: 5 · std/sqrt(n).
        assert abs(tf_mean - jax_mean) < 5 * std * np.sqrt(2 / n), (name, tf_mean, jax_mean)
        assert abs(tf_std - jax_std) < 5 * std / np.sqrt(n) + 1e-6, (name, tf_std, jax_std)
    # And both match the recipe.
    for stats in (tf_stats, jax_stats):
        assert abs(stats["flip"][0] - 0.5) < 0.04
        assert abs(stats["jitter_apply"][0] - 0.8) < 0.035
        assert abs(stats["gray_apply"][0] - 0.2) < 0.035
        assert abs(stats["blur_apply"][0] - 0.5) < 0.04
        assert abs(stats["sigma"][0] - 1.05) < 0.05
        assert abs(stats["brightness"][0] - 1.0) < 0.02
        assert abs(stats["hue"][0]) < 0.01
    # torchvision's sampler on 32x32 (NumPy reference, 200k boxes): mean 0.538, std 0.200.
    ref_area, _ = _np_torchvision_boxes(200_000, 32, 32, (0.2, 1.0), (0.75, 4 / 3))
    for stats in (tf_stats, jax_stats):
        assert abs(stats["area"][0] - ref_area.mean()) < 5 * ref_area.std() / np.sqrt(n)
        assert abs(stats["area"][1] - ref_area.std()) < 5 * ref_area.std() / np.sqrt(n)


def test_views_in_a_tf_step_are_keyed_by_the_step_so_a_resumed_model_draws_the_same():
    """TensorFlow backend, augmentation inside the step: the views come from (augmenter seed, step,
    replica) alone, so a model built again and set to step 2 (a resume) computes the loss the first
    model computed at its step 2, and each step draws new views."""
    import keras

    from uniclr_tf import UniCLR, ViewAugmenter
    from uniclr_tf.nets import encoders, heads

    images = np.random.default_rng(0).integers(0, 256, size=(16, 16, 16, 1)).astype("uint8")

    def model_at(step):
        keras.utils.set_random_seed(1)
        model = UniCLR(encoders.build_encoder("tiny", (16, 16, 1), width=4), heads.projector(16, (32, 8)),
                       method="simaffinity", augmenter=ViewAugmenter.for_dataset((16, 16, 1), seed=3))
        model.compile(optimizer=keras.optimizers.SGD(0.0))  # the weights stay: only the views change
        model.optimizer.build(model.trainable_variables)
        model.optimizer.iterations.assign(step)
        return model

    first = model_at(0)
    losses = [float(first.train_on_batch(images, return_dict=True)["objective_loss"]) for _ in range(3)]
    assert len(set(losses)) == 3, losses  # new views every step
    resumed = float(model_at(2).train_on_batch(images, return_dict=True)["objective_loss"])
    assert resumed == losses[2], (resumed, losses)


def test_a_seed_generator_passed_as_seed_draws_from_it():
    """``get_random_transformation(..., seed=)`` takes a Keras ``SeedGenerator`` as Keras's own layers do: a draw
    from it (reproducible from its seed, new on each call), not the path of a TensorFlow batch key."""
    import keras

    from uniclr_tf.augment.layers import RandomResizedCrop

    layer = RandomResizedCrop(8, 8, seed=0)

    def boxes(generator, n=2):
        return [np.stack([np.asarray(t) for t in layer.get_random_transformation(4, (16, 16), seed=generator).values()])
                for _ in range(n)]

    first, second = boxes(keras.random.SeedGenerator(5))
    again = boxes(keras.random.SeedGenerator(5))[0]
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, second)
