"""View augmentations for contrastive pre-training, batched, per sample, on any backend.

The recipe is SimCLR's, as used by the UniCLR paper (§4.1): RandomResizedCrop (scale 0.2–1.0),
horizontal flip (p 0.5), colour jitter (p 0.8), grayscale (p 0.2), Gaussian blur (σ ∈ [0.1, 2],
p 0.5), plus BYOL's solarisation and multi-crop local views as options.

Design
------
Every layer takes a BATCH ``[B, H, W, C]`` (C = 1 or 3) and draws its random parameters PER
SAMPLE. The same layer object runs

1. in a ``tf.data`` pipeline on batched data (``ds.batch(b).map(augmenter)``) whatever
   ``KERAS_BACKEND`` is, and
2. inside a compiled train step: ``jax.jit`` (through ``layer.stateless_call`` / a Keras model)
   or ``tf.function`` (also ``jit_compile=True``).

How: every layer subclasses Keras's ``DataLayer`` and does all its maths with ``self.backend.*``
(a ``DynamicBackend``). When ``DataLayer.__call__`` sees a TF graph that is not a JAX trace (a
``tf.data`` map, or a ``tf.function``), it switches ``self.backend`` to TensorFlow for that call;
otherwise the layer runs on the Keras backend. Code written with ``keras.ops`` instead would break
in ``tf.data`` under JAX (STACK.md). Randomness: on the JAX (non-TF) path each layer draws from its
own Keras ``SeedGenerator``, whose state is a non-trainable variable, so ``stateless_call`` (and
a Keras model's JAX train step) threads it through ``jax.jit``. On the TensorFlow path it draws
from a per-layer ``tf.random.Generator`` instead of the ``SeedGenerator`` that
``self._get_seed_generator`` would give: a ``SeedGenerator``'s read-then-assign is not atomic, and
in a parallel ``tf.data`` map two batches got identical parameters (see ``_uniforms``). The
generator also works under ``tf.distribute.MirroredStrategy`` (replicas draw different numbers) and
``jit_compile=True``. Both are seeded from the layer's ``seed`` (or Python's ``random``, which
``keras.utils.set_random_seed`` seeds).

Following Keras's preprocessing layers, each random layer first draws all parameters for the batch
in ``get_random_transformation(batch_size, image_shape)`` (a dict of ``[B]`` tensors), then applies
them with ``transform_images(images, transformation)`` using masks and batched maths only: no
Python loop over samples, no ``map_fn``, static output shapes (XLA / TPU friendly). Separating the
two also lets tests compare the parameter distributions drawn on the host (TF) and on the device
(JAX).

Geometry (crop + resize, blur) is done with SEPARABLE per-sample matrices:
``out[b] = Ry[b] @ img[b] @ Rx[b]ᵀ`` per channel, two batched matmuls. The matrices are built
elementwise from the parameters (triangle / Gaussian kernels evaluated on an index grid), so there
is no gather, and the maths is identical on every backend.

Costs per image (C channels, multiply-adds): crop+resize H×W → h×w:
``C·min(h·H·W + h·W·w, H·W·w + h·H·w)`` (82 M for 256 → 224); blur of h×w: ``C·h·w·(h + w)``
(67 M at 224 px, 10× a direct separable 23-tap convolution, but dense matmuls; 0.2 M at 32 px);
colour jitter ≈ 40 elementwise ops per pixel (hue the larger part); flip, grayscale, solarise,
normalise: a few elementwise ops. A layer whose probability is 0 costs nothing (left out when the
graph is built). Measured on one H200 under ``jax.jit``, batch 256 at 224 px (ms per batch): crop
256→224 0.50, crop →96 0.24, jitter 0.31, blur 0.41, grayscale 0.14, flip / solarise / normalise
0.08–0.09; a whole ``ViewAugmenter`` of 2×224 views 3.3 ms, 2×224 + 6×96 5.8 ms; CIFAR (batch
512) 2×32 0.22 ms, 2×32 + 4×16 0.73 ms. In tf.data on 2 busy CPU cores: CIFAR 2×32 ≈ 150 ms per
batch of 512, but ≈ 12 ms per 224-px view of one image, so augment large images on the device.
XLA compile time was 4–14 s per augmenter on the H200 (on CPU the threefry RNG dominates it, about
0.3–0.7 s per random op; hence one random op per layer).
On GPUs float32 matmuls default to reduced precision (TF32-like): an identity crop was off by
2.4e-4 at JAX's default precision, exact at "highest". Irrelevant for augmentation (an 8-bit step
is 3.9e-3), but do not use these layers where bit-exactness matters.

All layers compute in float32 whatever the global mixed-precision policy (``dtype="float32"`` by
default).
"""

import math

import keras
import numpy as np
from keras.src.layers.preprocessing.data_layer import DataLayer
from keras.src.random.seed_generator import make_default_seed
from keras.src.utils import backend_utils
from keras.src.utils import tracking

__all__ = [
    "DATASET_STATS",
    "EvalPreprocess",
    "Normalize",
    "RandomColorJitter",
    "RandomFlip",
    "RandomGaussianBlur",
    "RandomGrayscale",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "RandomSolarize",
    "ViewAugmenter",
    "apply_separable",
    "default_blur_kernel_size",
    "eval_preprocess",
    "gaussian_blur_matrix",
    "resize_matrix",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# Per-channel mean / std of the training split, in [0, 1] units.
DATASET_STATS = {
    "imagenet": (IMAGENET_MEAN, IMAGENET_STD),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "mnist": ((0.1307,), (0.3081,)),
    "fashion_mnist": ((0.2860,), (0.3530,)),
}

# Luma weights used by torchvision's rgb_to_grayscale (ITU-R 601-2).
_GRAY_WEIGHTS = (0.2989, 0.587, 0.114)
# Attempts per sample in the RandomResizedCrop rejection sampler (torchvision uses 10).
_CROP_ATTEMPTS = 10
_PACKAGE = "uniclr_tf"


# --------------------------------------------------------------------------------------------
# Small helpers (pure functions of a backend module; `backend=None` means the Keras backend).
# --------------------------------------------------------------------------------------------


def _backend_or_default(backend):
    return backend_utils.DynamicBackend() if backend is None else backend


def _pair(value, name):
    """``int`` or ``(h, w)`` → ``(h, w)`` of positive ints."""
    if isinstance(value, (int, np.integer)):
        value = (int(value), int(value))
    try:
        h, w = (int(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"`{name}` must be an int or a pair of ints; received {name}={value!r}")
    if h <= 0 or w <= 0:
        raise ValueError(f"`{name}` must be positive; received {name}={value!r}")
    return h, w


def _range(value, name, low=None, high=None):
    """A ``(min, max)`` pair of floats with ``low <= min <= max <= high``."""
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"`{name}` must be a pair (min, max); received {name}={value!r}")
    if lo > hi or (low is not None and lo < low) or (high is not None and hi > high):
        raise ValueError(
            f"`{name}` must satisfy {low if low is not None else '-inf'} <= min <= max <= "
            f"{high if high is not None else 'inf'}; received {name}={value!r}")
    return lo, hi


def _probability(value, name):
    value = float(value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"`{name}` must be a probability in [0, 1]; received {name}={value!r}")
    return value


def _strength(value, name, high=None):
    value = float(value)
    if value < 0 or (high is not None and value > high):
        bound = f"[0, {high}]" if high is not None else ">= 0"
        raise ValueError(f"`{name}` must be {bound}; received {name}={value!r}")
    return value


def _check_images(shape, layer, channels=(1, 3)):
    """Validates a static batch shape ``[B, H, W, C]``; returns ``(H, W, C)``."""
    shape = tuple(shape)
    if len(shape) != 4:
        raise ValueError(
            f"{layer} expects a batch of images of rank 4 [B, H, W, C]; received shape {shape} "
            f"(rank {len(shape)}). Batch single images first, e.g. `ds.batch(b).map(layer)`.")
    h, w, c = shape[1:]
    if c not in channels:
        raise ValueError(
            f"{layer} expects {' or '.join(map(str, channels))} channels (channels_last); "
            f"received C={c} in shape {shape}.")
    if h is None or w is None:
        raise ValueError(f"{layer} needs static height and width; received shape {shape}.")
    return int(h), int(w), int(c)


def _resolve_stats(mean, std, channels):
    """Per-channel mean/std tuples (defaults: ImageNet for RGB, 0.5/0.5 for one channel)."""
    if mean is None:
        mean = IMAGENET_MEAN if channels == 3 else (0.5,)
    if std is None:
        std = IMAGENET_STD if channels == 3 else (0.5,)
    mean = np.atleast_1d(np.asarray(mean, dtype="float64"))
    std = np.atleast_1d(np.asarray(std, dtype="float64"))
    if mean.shape[0] == 1:
        mean = np.repeat(mean, channels)
    if std.shape[0] == 1:
        std = np.repeat(std, channels)
    if mean.shape != (channels,) or std.shape != (channels,):
        raise ValueError(f"mean/std must have 1 or {channels} values for {channels}-channel "
                         f"images; received mean={mean.tolist()}, std={std.tolist()}")
    if np.any(std <= 0):
        raise ValueError(f"std must be positive; received std={std.tolist()}")
    return mean.astype("float32"), std.astype("float32")


def _stats_arg(value):
    """mean/std constructor argument → a JSON-friendly tuple (or None)."""
    if value is None:
        return None
    return tuple(float(v) for v in np.atleast_1d(np.asarray(value, dtype="float64")))


def default_blur_kernel_size(size):
    """SimCLR's blur kernel: about 10% of the image side, odd, at least 3 (224 → 23, 32 → 3)."""
    k = int(round(0.1 * int(size)))
    k = k if k % 2 == 1 else k + 1
    return max(3, k)


def resize_matrix(start, length, in_size, out_size, antialias=False, backend=None):
    """Interpolation matrix that crops ``[start, start + length)`` of an axis and resizes it.

    Coordinates are continuous pixel units (pixel ``j`` covers ``[j, j + 1)``); output pixel
    ``i`` samples the input at ``start + (i + 0.5)·length/out_size − 0.5`` (half-pixel centres, as
    ``tf.image.resize`` and torch's ``align_corners=False``), clamped to the edge pixels. The
    kernel is the bilinear triangle; with ``antialias`` it is widened by the down-scaling factor
    (PIL / torchvision ``antialias=True``) and renormalised, so minification averages.

    Args:
        start, length: float tensors of any shape ``S`` (e.g. ``[B]``, or ``[]`` for a fixed box).
        in_size: int, or a scalar tensor (a dynamic size, as in the exported serving function).
        out_size: static int.
        antialias: widen the kernel when ``length > out_size``.
        backend: a Keras backend module / ``DynamicBackend`` (default: the Keras backend).

    Returns:
        float32 ``S + [out_size, in_size]``; each row sums to 1. Apply with :func:`apply_separable`.
    """
    b = _backend_or_default(backend)
    start = b.cast(b.convert_to_tensor(start), "float32")
    length = b.cast(b.convert_to_tensor(length), "float32")
    i = b.convert_to_tensor(np.arange(out_size, dtype="float32") + 0.5)
    j = b.cast(b.numpy.arange(in_size), "float32")  # in_size may be a dynamic scalar (export)
    step = length / float(out_size)
    centers = b.numpy.expand_dims(start, -1) + i * b.numpy.expand_dims(step, -1) - 0.5
    # Clamping to [-0.5, in - 0.5] keeps the nearest pixel within 0.5 (weight >= 0.5 before
    # normalising); for bilinear this is exactly clamp-to-edge interpolation.
    centers = b.numpy.clip(centers, -0.5, b.cast(in_size, "float32") - 0.5)
    dist = b.numpy.abs(b.numpy.expand_dims(centers, -1) - j)
    if antialias:
        support = b.numpy.maximum(step, 1.0)
        dist = dist / b.numpy.expand_dims(b.numpy.expand_dims(support, -1), -1)
    weights = b.numpy.maximum(1.0 - dist, 0.0)
    return weights / b.numpy.sum(weights, axis=-1, keepdims=True)


def gaussian_blur_matrix(sigma, size, kernel_size, backend=None):
    """Matrix of a 1-D Gaussian blur with reflect padding (``d c b | a b c d | c b a``).

    ``M[i, j] = G(j − i) + [j > 0]·G(i + j) + [j < n−1]·G(2(n−1) − i − j)`` where ``G`` is the
    Gaussian ``exp(−d²/2σ²)`` truncated to ``|d| <= kernel_size // 2`` and normalised over the taps
    (torchvision's ``GaussianBlur`` kernel), the two extra terms being the mirrored taps.
    Rows sum to 1.

    Args:
        sigma: float tensor of shape ``S`` (e.g. ``[B]``), positive.
        size: static int, the axis length ``n``; kernel_size: odd static int with
            ``kernel_size // 2 < n``.

    Returns:
        float32 ``S + [size, size]``.
    """
    b = _backend_or_default(backend)
    size, kernel_size = int(size), int(kernel_size)
    radius = kernel_size // 2
    if kernel_size < 1 or kernel_size % 2 == 0:
        raise ValueError(f"kernel_size must be a positive odd int; received {kernel_size}")
    if radius >= size:
        raise ValueError(f"Blur kernel_size={kernel_size} is too large for an axis of {size} "
                         f"pixels (reflect padding needs kernel_size // 2 < {size}).")
    sigma = b.cast(b.convert_to_tensor(sigma), "float32")
    n = size
    ii, jj = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    terms = [(jj - ii, np.ones_like(ii, dtype=bool)),
             (ii + jj, jj > 0),
             (2 * (n - 1) - ii - jj, jj < n - 1)]
    inv_two_var = b.numpy.expand_dims(b.numpy.expand_dims(0.5 / (sigma * sigma), -1), -1)
    matrix = 0.0
    for offset, valid in terms:
        mask = (valid & (np.abs(offset) <= radius)).astype("float32")
        if not mask.any():
            continue
        sq = b.convert_to_tensor((offset.astype("float32") ** 2))
        matrix = matrix + b.numpy.exp(-sq * inv_two_var) * b.convert_to_tensor(mask)
    taps = b.convert_to_tensor(np.arange(-radius, radius + 1, dtype="float32") ** 2)
    norm = b.numpy.sum(b.numpy.exp(-taps * b.numpy.expand_dims(0.5 / (sigma * sigma), -1)),
                       axis=-1)
    return matrix / b.numpy.expand_dims(b.numpy.expand_dims(norm, -1), -1)


def apply_separable(images, ry, rx, backend=None):
    """``out[b, :, :, c] = ry[b] @ images[b, :, :, c] @ rx[b]ᵀ`` as two batched matmuls.

    ``ry``: ``[B, h, H]`` or ``[h, H]`` (shared); ``rx``: ``[B, w, W]`` or ``[w, W]``. The
    contraction order with fewer multiply-adds is chosen from the static shapes.
    """
    b = _backend_or_default(backend)
    height, width = int(images.shape[1]), int(images.shape[2])
    out_h, out_w = int(ry.shape[-2]), int(rx.shape[-2])
    by = "b" if len(ry.shape) == 3 else ""
    bx = "b" if len(rx.shape) == 3 else ""
    if out_h * height * width + out_h * width * out_w <= height * width * out_w + out_h * height * out_w:
        tmp = b.numpy.einsum(f"{by}ih,bhwc->biwc", ry, images)
        return b.numpy.einsum(f"{bx}jw,biwc->bijc", rx, tmp)
    tmp = b.numpy.einsum(f"{bx}jw,bhwc->bhjc", rx, images)
    return b.numpy.einsum(f"{by}ih,bhjc->bijc", ry, tmp)


def _central_box(height, width, ratio):
    """torchvision's fallback: the largest central box with aspect ratio inside ``ratio``."""
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = float(width), width / ratio[0]
    elif in_ratio > ratio[1]:
        h, w = float(height), height * ratio[1]
    else:
        h, w = float(height), float(width)
    return (height - h) / 2.0, (width - w) / 2.0, h, w


def _as_column(b, values):
    """``[B]`` → ``[B, 1, 1, 1]`` for broadcasting against images."""
    return b.numpy.reshape(values, (-1, 1, 1, 1))


def _grayscale(b, images):
    """``[B, H, W, 3]`` → luma ``[B, H, W, 1]`` (torchvision weights); 1 channel unchanged."""
    if int(images.shape[-1]) == 1:
        return images
    r, g, bl = images[..., 0:1], images[..., 1:2], images[..., 2:3]
    return _GRAY_WEIGHTS[0] * r + _GRAY_WEIGHTS[1] * g + _GRAY_WEIGHTS[2] * bl


def _shift_hue(b, images, shift):
    """HSV hue rotation of RGB images in [0, 1] by ``shift[b]`` turns (torchvision adjust_hue).

    Written with the chroma formula instead of a full RGB→HSV→RGB round trip: the max ``v``
    and min ``m`` of (r, g, b) are kept (S and V unchanged), the hue ``h`` is moved to
    ``h' = (h + shift) mod 1`` and each channel is rebuilt as ``m + (v − m)·f_c(h')`` with the
    standard HSV piecewise-linear ``f_c``. Only elementwise ops: identical on every backend.
    """
    r, g, bl = images[..., 0], images[..., 1], images[..., 2]
    v = b.numpy.maximum(b.numpy.maximum(r, g), bl)
    m = b.numpy.minimum(b.numpy.minimum(r, g), bl)
    chroma = v - m
    safe = b.numpy.where(chroma > 0, chroma, 1.0)
    hue = b.numpy.where(
        v == r, (g - bl) / safe,
        b.numpy.where(v == g, 2.0 + (bl - r) / safe, 4.0 + (r - g) / safe)) / 6.0
    hue = b.numpy.mod(hue + b.numpy.reshape(shift, (-1, 1, 1)), 1.0) * 6.0
    fr = b.numpy.clip(b.numpy.abs(hue - 3.0) - 1.0, 0.0, 1.0)
    fg = b.numpy.clip(2.0 - b.numpy.abs(hue - 2.0), 0.0, 1.0)
    fb = b.numpy.clip(2.0 - b.numpy.abs(hue - 4.0), 0.0, 1.0)
    return b.numpy.stack([m + chroma * fr, m + chroma * fg, m + chroma * fb], axis=-1)


# --------------------------------------------------------------------------------------------
# Base class
# --------------------------------------------------------------------------------------------


class _BatchLayer(DataLayer):
    """Common plumbing: float32 compute, input validation, seed handling."""

    def __init__(self, seed=None, **kwargs):
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)
        if seed is not None and not isinstance(seed, (int, np.integer)):
            raise ValueError(f"`seed` must be an int or None; received seed={seed!r}")
        self.seed = None if seed is None else int(seed)
        # We convert (and cast uint8) ourselves; Keras's automatic conversion would be wrong for
        # tensors of the other backend inside tf.data.
        self._convert_input_args = False

    def _prepare(self, images):
        """Converts to a float32 tensor of the active backend and validates the shape."""
        images = self.backend.convert_to_tensor(images)
        shape = _check_images(images.shape, type(self).__name__)
        return self.backend.cast(images, "float32"), shape

    def _batch_size(self, images):
        return self.backend.core.shape(images)[0]

    def _seed(self, seed):
        return self._get_seed_generator(self.backend._backend) if seed is None else seed

    def _uniforms(self, batch_size, count, seed):
        """``count`` independent U[0, 1) per sample, ``[B, count]``, from ONE random op.

        One op per layer and batch: each random op costs a seed-state update and, under XLA on
        CPU, about 0.3 s of compile time (threefry), so the layers slice columns of one draw.

        ``seed=None`` draws from the layer's stream: on the TensorFlow path (tf.data, or the TF
        backend) from a ``tf.random.Generator``, whose stateful op reads and advances its state
        atomically; elsewhere from the Keras ``SeedGenerator`` (threaded by ``stateless_call``
        under ``jax.jit``). A Keras ``SeedGenerator`` is NOT safe in a parallel ``tf.data`` map:
        its read-then-assign races, and two batches drew identical parameters (6 of 4000 with
        ``num_parallel_calls=8`` on 2 cores). An explicit int seed gives a stateless draw.
        """
        shape = (batch_size, count)
        if seed is None and self.backend.name == "tensorflow":
            return self._tf_generator().uniform(shape, dtype="float32")
        return self.backend.random.uniform(shape, minval=0.0, maxval=1.0, dtype="float32",
                                           seed=self._seed(seed))

    @tracking.no_automatic_dependency_tracking
    def _tf_generator(self):
        """The layer's ``tf.random.Generator`` (created once, eagerly, outside any trace)."""
        if getattr(self, "_tf_rng", None) is None:
            import tensorflow as tf  # only reached on the TensorFlow path

            seed = self.seed if self.seed is not None else make_default_seed()
            with tf.init_scope():
                self._tf_rng = tf.random.Generator.from_seed(seed)
        return self._tf_rng

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config["seed"] = self.seed
        return config


class _RandomLayer(_BatchLayer):
    """A per-sample random augmentation: ``call = transform_images(get_random_transformation)``."""

    def __init__(self, seed=None, **kwargs):
        super().__init__(seed=seed, **kwargs)
        self.generator = keras.random.SeedGenerator(self.seed)

    def _is_noop(self, image_shape):
        """True when the layer is statically the identity (probability 0, C=1 grayscale...)."""
        return False

    def call(self, images, training=True):
        images, shape = self._prepare(images)
        if not training or self._is_noop(shape):
            return images
        transformation = self.get_random_transformation(self._batch_size(images), shape)
        return self.transform_images(images, transformation)


# --------------------------------------------------------------------------------------------
# Layers
# --------------------------------------------------------------------------------------------


@keras.saving.register_keras_serializable(package=_PACKAGE)
class RandomResizedCrop(_RandomLayer):
    """Per-sample random crop, resized (bilinearly) to ``(height, width)``.

    Box sampling follows torchvision: area fraction ``~ U(scale)``, ``log(aspect) ~ U(log ratio)``,
    up to 10 attempts per sample (vectorised: all drawn at once, the first that fits is kept),
    falling back to the largest central box with an aspect ratio inside ``ratio``. Boxes are in
    continuous pixel coordinates (no rounding) and the offset is uniform over the positions where
    the box fits. Crop + resize is ``Ry[b] @ img[b] @ Rx[b]ᵀ`` (see :func:`resize_matrix`).

    ``training=False`` gives the deterministic central fallback box, resized.

    Args:
        height, width: output size (may differ from the input, e.g. 16×16 local crops of 32×32).
        scale: range of the crop area as a fraction of the image area, in (0, 1].
        ratio: range of the crop aspect ratio (width / height).
        antialias: widen the kernel when down-scaling (as PIL / torchvision do). Default True.
        seed: int or None.

    Transformation: ``{"y0", "x0", "h", "w"}``, float32 ``[B]``, in input pixels.
    Input ``[B, H, W, C]`` float (1 or 3 channels) → float32 ``[B, height, width, C]``.
    """

    def __init__(self, height, width, scale=(0.2, 1.0), ratio=(3.0 / 4.0, 4.0 / 3.0),
                 antialias=True, seed=None, **kwargs):
        super().__init__(seed=seed, **kwargs)
        self.height, self.width = _pair((height, width), "(height, width)")
        self.scale = _range(scale, "scale", low=0.0, high=1.0)
        if self.scale[0] <= 0.0:
            raise ValueError(f"`scale` must be in (0, 1]; received scale={scale!r}")
        self.ratio = _range(ratio, "ratio", low=0.0)
        if self.ratio[0] <= 0.0:
            raise ValueError(f"`ratio` must be positive; received ratio={ratio!r}")
        self.antialias = bool(antialias)
        self._build_at_init()

    def get_random_transformation(self, batch_size, image_shape, seed=None):
        """Draws one crop box per sample for images of (static) ``image_shape = (H, W[, C])``."""
        height, width = int(image_shape[0]), int(image_shape[1])
        b = self.backend
        k = _CROP_ATTEMPTS
        u = self._uniforms(batch_size, 2 * k + 2, seed)
        lo, hi = self.scale
        target = (lo + (hi - lo) * u[:, :k]) * float(height * width)
        lo, hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        aspect = b.numpy.exp(lo + (hi - lo) * u[:, k:2 * k])
        w = b.numpy.sqrt(target * aspect)
        h = b.numpy.sqrt(target / aspect)
        valid = b.cast(b.numpy.logical_and(w <= width, h <= height), "float32")
        first = valid * b.cast(b.numpy.equal(b.numpy.cumsum(valid, axis=1), 1.0), "float32")
        found = b.numpy.sum(first, axis=1) > 0.5
        fy0, fx0, fh, fw = _central_box(height, width, self.ratio)
        h = b.numpy.where(found, b.numpy.sum(first * h, axis=1), fh)
        w = b.numpy.where(found, b.numpy.sum(first * w, axis=1), fw)
        y0 = b.numpy.where(found, u[:, 2 * k] * b.numpy.maximum(height - h, 0.0), fy0)
        x0 = b.numpy.where(found, u[:, 2 * k + 1] * b.numpy.maximum(width - w, 0.0), fx0)
        return {"y0": y0, "x0": x0, "h": h, "w": w}

    def transform_images(self, images, transformation):
        b = self.backend
        height, width = int(images.shape[1]), int(images.shape[2])
        ry = resize_matrix(transformation["y0"], transformation["h"], height, self.height,
                           self.antialias, backend=b)
        rx = resize_matrix(transformation["x0"], transformation["w"], width, self.width,
                           self.antialias, backend=b)
        return apply_separable(images, ry, rx, backend=b)

    def call(self, images, training=True):
        images, (height, width, _) = self._prepare(images)
        if training:
            transformation = self.get_random_transformation(self._batch_size(images),
                                                            (height, width))
            return self.transform_images(images, transformation)
        y0, x0, h, w = _central_box(height, width, self.ratio)
        ry = resize_matrix(y0, h, height, self.height, self.antialias, backend=self.backend)
        rx = resize_matrix(x0, w, width, self.width, self.antialias, backend=self.backend)
        return apply_separable(images, ry, rx, backend=self.backend)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.height, self.width, input_shape[-1])

    def get_config(self):
        config = super().get_config()
        config.update(height=self.height, width=self.width, scale=self.scale, ratio=self.ratio,
                      antialias=self.antialias)
        return config


@keras.saving.register_keras_serializable(package=_PACKAGE)
class RandomHorizontalFlip(_RandomLayer):
    """Flips each sample left-right with probability ``rate`` (default 0.5).

    Horizontal only (Keras's own ``RandomFlip`` defaults to horizontal AND vertical).
    Transformation: ``{"flip": bool [B]}``.
    """

    def __init__(self, rate=0.5, seed=None, **kwargs):
        super().__init__(seed=seed, **kwargs)
        self.rate = _probability(rate, "rate")
        self._build_at_init()

    def _is_noop(self, image_shape):
        return self.rate == 0.0

    def get_random_transformation(self, batch_size, image_shape=None, seed=None):
        return {"flip": self._uniforms(batch_size, 1, seed)[:, 0] < self.rate}

    def transform_images(self, images, transformation):
        b = self.backend
        return b.numpy.where(_as_column(b, transformation["flip"]), b.numpy.flip(images, axis=2),
                             images)

    def get_config(self):
        config = super().get_config()
        config.update(rate=self.rate)
        return config


RandomFlip = RandomHorizontalFlip  # the name used in the design notes; horizontal only.


@keras.saving.register_keras_serializable(package=_PACKAGE)
class RandomColorJitter(_RandomLayer):
    """SimCLR / torchvision colour jitter, applied to each sample with probability ``rate``.

    Factors per sample: brightness, contrast, saturation ``~ U[max(0, 1 − s), 1 + s]``, hue shift
    ``~ U[−h, h]`` (in turns). Applied in a FIXED order (torchvision shuffles it per call):

    1. brightness: ``x·f``;
    2. contrast: ``f·x + (1 − f)·mean(gray(x))`` (mean over the whole image);
    3. saturation: ``f·x + (1 − f)·gray(x)``;
    4. hue: HSV hue rotation (see ``_shift_hue``: chroma formula, elementwise ops only),

    each followed by clipping to [0, 1]. Saturation and hue are the identity for 1-channel
    images. A strength of 0 removes that step from the graph.

    Transformation: ``{"apply": bool, "brightness", "contrast", "saturation", "hue"}``, all [B].
    """

    def __init__(self, brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1, rate=0.8,
                 seed=None, **kwargs):
        super().__init__(seed=seed, **kwargs)
        self.brightness = _strength(brightness, "brightness")
        self.contrast = _strength(contrast, "contrast")
        self.saturation = _strength(saturation, "saturation")
        self.hue = _strength(hue, "hue", high=0.5)
        self.rate = _probability(rate, "rate")
        self._build_at_init()

    def _is_noop(self, image_shape):
        strengths = [self.brightness, self.contrast]
        if image_shape[-1] == 3:
            strengths += [self.saturation, self.hue]
        return self.rate == 0.0 or not any(strengths)

    def get_random_transformation(self, batch_size, image_shape=None, seed=None):
        u = self._uniforms(batch_size, 5, seed)

        def factor(column, s):
            lo = max(0.0, 1.0 - s)
            return lo + (1.0 + s - lo) * u[:, column]

        return {"apply": u[:, 0] < self.rate,
                "brightness": factor(1, self.brightness),
                "contrast": factor(2, self.contrast),
                "saturation": factor(3, self.saturation),
                "hue": self.hue * (2.0 * u[:, 4] - 1.0)}

    def transform_images(self, images, transformation):
        b = self.backend
        x = images
        if self.brightness > 0:
            x = b.numpy.clip(x * _as_column(b, transformation["brightness"]), 0.0, 1.0)
        if self.contrast > 0:
            f = _as_column(b, transformation["contrast"])
            mean = b.numpy.mean(_grayscale(b, x), axis=(1, 2, 3), keepdims=True)
            x = b.numpy.clip(f * x + (1.0 - f) * mean, 0.0, 1.0)
        if int(images.shape[-1]) == 3:
            if self.saturation > 0:
                f = _as_column(b, transformation["saturation"])
                x = b.numpy.clip(f * x + (1.0 - f) * _grayscale(b, x), 0.0, 1.0)
            if self.hue > 0:
                x = _shift_hue(b, x, transformation["hue"])
        return b.numpy.where(_as_column(b, transformation["apply"]), x, images)

    def get_config(self):
        config = super().get_config()
        config.update(brightness=self.brightness, contrast=self.contrast,
                      saturation=self.saturation, hue=self.hue, rate=self.rate)
        return config


@keras.saving.register_keras_serializable(package=_PACKAGE)
class RandomGrayscale(_RandomLayer):
    """Replaces each sample by its luma (torchvision weights) with probability ``rate``.

    The output keeps C channels (three equal channels); identity for C = 1.
    Transformation: ``{"apply": bool [B]}``.
    """

    def __init__(self, rate=0.2, seed=None, **kwargs):
        super().__init__(seed=seed, **kwargs)
        self.rate = _probability(rate, "rate")
        self._build_at_init()

    def _is_noop(self, image_shape):
        return self.rate == 0.0 or image_shape[-1] == 1

    def get_random_transformation(self, batch_size, image_shape=None, seed=None):
        return {"apply": self._uniforms(batch_size, 1, seed)[:, 0] < self.rate}

    def transform_images(self, images, transformation):
        b = self.backend
        if int(images.shape[-1]) == 1:
            return images
        return b.numpy.where(_as_column(b, transformation["apply"]), _grayscale(b, images), images)

    def get_config(self):
        config = super().get_config()
        config.update(rate=self.rate)
        return config


@keras.saving.register_keras_serializable(package=_PACKAGE)
class RandomGaussianBlur(_RandomLayer):
    """Per-sample Gaussian blur with probability ``rate``, ``σ ~ U(sigma)`` (SimCLR: 0.1–2.0).

    Separable, reflect padding, kernel truncated to ``kernel_size`` taps (default
    :func:`default_blur_kernel_size` of the smaller image side: 23 at 224 px, 3 at 32 px), applied
    as ``By[b] @ img[b] @ Bx[b]ᵀ`` with :func:`gaussian_blur_matrix`. Samples not blurred get
    identity matrices (no extra select over the image). Unlike Keras's ``RandomGaussianBlur``
    (one σ per batch; ``factor=0.5`` ≈ probability 0.25), σ and the coin are per sample.

    Transformation: ``{"apply": bool [B], "sigma": float32 [B]}``.
    """

    def __init__(self, sigma=(0.1, 2.0), kernel_size=None, rate=0.5, seed=None, **kwargs):
        super().__init__(seed=seed, **kwargs)
        self.sigma = _range(sigma, "sigma", low=0.0)
        if self.sigma[0] <= 0:
            raise ValueError(f"`sigma` must be positive; received sigma={sigma!r}")
        if kernel_size is not None:
            kernel_size = int(kernel_size)
            if kernel_size < 1 or kernel_size % 2 == 0:
                raise ValueError(f"`kernel_size` must be a positive odd int or None; received "
                                 f"kernel_size={kernel_size}")
        self.kernel_size = kernel_size
        self.rate = _probability(rate, "rate")
        self._build_at_init()

    def _is_noop(self, image_shape):
        return self.rate == 0.0

    def get_random_transformation(self, batch_size, image_shape=None, seed=None):
        u = self._uniforms(batch_size, 2, seed)
        lo, hi = self.sigma
        return {"apply": u[:, 0] < self.rate, "sigma": lo + (hi - lo) * u[:, 1]}

    def transform_images(self, images, transformation):
        b = self.backend
        height, width = int(images.shape[1]), int(images.shape[2])
        k = self.kernel_size or default_blur_kernel_size(min(height, width))
        apply = b.numpy.reshape(transformation["apply"], (-1, 1, 1))
        matrices = []
        for n in (height, width):
            blur = gaussian_blur_matrix(transformation["sigma"], n, k, backend=b)
            matrices.append(b.numpy.where(apply, blur, b.convert_to_tensor(np.eye(n, dtype="float32"))))
        return apply_separable(images, matrices[0], matrices[1], backend=b)

    def get_config(self):
        config = super().get_config()
        config.update(sigma=self.sigma, kernel_size=self.kernel_size, rate=self.rate)
        return config


@keras.saving.register_keras_serializable(package=_PACKAGE)
class RandomSolarize(_RandomLayer):
    """With probability ``rate`` per sample: ``x → 1 − x`` where ``x >= threshold`` (fixed).

    BYOL uses rate 0.2 on its second view; the default rate 0 makes the layer a no-op. Unlike
    Keras's ``Solarization``, the threshold is fixed, not random.
    Transformation: ``{"apply": bool [B]}``.
    """

    def __init__(self, threshold=0.5, rate=0.0, seed=None, **kwargs):
        super().__init__(seed=seed, **kwargs)
        self.threshold = float(threshold)
        self.rate = _probability(rate, "rate")
        self._build_at_init()

    def _is_noop(self, image_shape):
        return self.rate == 0.0

    def get_random_transformation(self, batch_size, image_shape=None, seed=None):
        return {"apply": self._uniforms(batch_size, 1, seed)[:, 0] < self.rate}

    def transform_images(self, images, transformation):
        b = self.backend
        flip = b.numpy.logical_and(_as_column(b, transformation["apply"]),
                                   images >= self.threshold)
        return b.numpy.where(flip, 1.0 - images, images)

    def get_config(self):
        config = super().get_config()
        config.update(threshold=self.threshold, rate=self.rate)
        return config


@keras.saving.register_keras_serializable(package=_PACKAGE)
class Normalize(_BatchLayer):
    """``(x − mean) / std`` per channel, float32 out. None → ImageNet stats (RGB) or 0.5/0.5."""

    def __init__(self, mean=None, std=None, **kwargs):
        super().__init__(**kwargs)
        self.mean, self.std = _stats_arg(mean), _stats_arg(std)
        self._build_at_init()

    def call(self, images):
        images, (_, _, channels) = self._prepare(images)
        mean, std = _resolve_stats(self.mean, self.std, channels)
        b = self.backend
        return (images - b.convert_to_tensor(mean)) * b.convert_to_tensor(1.0 / std)

    def get_config(self):
        config = super().get_config()
        config.pop("seed")
        config.update(mean=self.mean, std=self.std)
        return config


@keras.saving.register_keras_serializable(package=_PACKAGE)
class EvalPreprocess(_BatchLayer):
    """Deterministic evaluation / serving preprocessing: uint8 → [0, 1] → centre crop + resize →
    normalise.

    The crop is the largest central box with the output's aspect ratio, shrunk by
    ``crop_fraction`` per side (0.875 = ImageNet's "resize 256, crop 224"), resized with
    :func:`resize_matrix` (antialiased by default). When the input already has the output size
    and ``crop_fraction == 1`` no resampling happens (exact).

    Args:
        size: int or (height, width) of the output.
        mean, std: per-channel stats in [0, 1] units (None: ImageNet for RGB, 0.5/0.5 for gray).
        crop_fraction: in (0, 1].
        input_scale: divide the input by this first (255 for uint8 / 0–255 floats; 1 for [0, 1]).
    """

    def __init__(self, size, mean=None, std=None, crop_fraction=1.0, antialias=True,
                 input_scale=255.0, **kwargs):
        super().__init__(**kwargs)
        self.size = _pair(size, "size")
        self.mean, self.std = _stats_arg(mean), _stats_arg(std)
        self.crop_fraction = float(crop_fraction)
        if not 0.0 < self.crop_fraction <= 1.0:
            raise ValueError(f"`crop_fraction` must be in (0, 1]; received {crop_fraction!r}")
        self.antialias = bool(antialias)
        self.input_scale = float(input_scale)
        self._build_at_init()

    def call(self, images):
        images, (height, width, channels) = self._prepare(images)
        b = self.backend
        x = images * (1.0 / self.input_scale)
        out_h, out_w = self.size
        if (height, width) != (out_h, out_w) or self.crop_fraction != 1.0:
            y0, x0, h, w = _central_box(height, width, (out_w / out_h, out_w / out_h))
            f = self.crop_fraction
            y0, x0, h, w = y0 + h * (1 - f) / 2, x0 + w * (1 - f) / 2, h * f, w * f
            ry = resize_matrix(y0, h, height, out_h, self.antialias, backend=b)
            rx = resize_matrix(x0, w, width, out_w, self.antialias, backend=b)
            x = apply_separable(x, ry, rx, backend=b)
        mean, std = _resolve_stats(self.mean, self.std, channels)
        return (x - b.convert_to_tensor(mean)) * b.convert_to_tensor(1.0 / std)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.size[0], self.size[1], input_shape[-1])

    def get_config(self):
        config = super().get_config()
        config.pop("seed")
        config.update(size=self.size, mean=self.mean, std=self.std,
                      crop_fraction=self.crop_fraction, antialias=self.antialias,
                      input_scale=self.input_scale)
        return config


def eval_preprocess(images, size, mean=None, std=None, crop_fraction=1.0):
    """Functional form of :class:`EvalPreprocess` (uint8 ``[B, H, W, C]`` → float32, normalised)."""
    return EvalPreprocess(size, mean=mean, std=std, crop_fraction=crop_fraction)(images)


# --------------------------------------------------------------------------------------------
# The multi-view augmenter
# --------------------------------------------------------------------------------------------


def _per_view(value, name, num_views):
    """A probability, or one per view (globals first, then locals) → tuple of num_views floats."""
    if isinstance(value, (list, tuple)):
        if len(value) != num_views:
            raise ValueError(f"`{name}` given per view must have num_global + num_local = "
                             f"{num_views} values; received {name}={value!r}")
        return tuple(_probability(v, name) for v in value)
    return (_probability(value, name),) * num_views


def _derive_seed(seed, view, slot):
    return None if seed is None else (int(seed) * 7919 + 101 * view + slot) % (2 ** 31 - 1)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class ViewAugmenter(_BatchLayer):
    """Turns a uint8 batch into ``num_global + num_local`` independently augmented views.

    Chain per view: RandomResizedCrop → RandomHorizontalFlip → RandomColorJitter →
    RandomGrayscale → RandomGaussianBlur → RandomSolarize → Normalize. Each view has its own
    layer instances with distinct seeds, so every view (and every sample) draws its own
    parameters. Steps with probability 0 are left out.

    Args:
        global_size: int or (h, w) of the global views.
        local_size: int or (h, w) of the local (multi-crop) views; required if num_local > 0.
        num_global, num_local: number of views of each kind.
        global_scale, local_scale: crop area ranges; ratio: crop aspect range.
        brightness, contrast, saturation, hue, jitter_rate: colour jitter. The defaults
            (0.4, 0.4, 0.2, 0.1, p 0.8) are MoCo v2/v3's (the authors' code is a MoCo-v3 fork;
            the paper gives no strengths); SimCLR's strength s is (0.8s, 0.8s, 0.8s, 0.2s).
        grayscale_rate, blur_rate, blur_sigma, blur_kernel_size, solarize_rate,
        solarize_threshold: as the layers. ``blur_rate`` and ``solarize_rate`` may be given
            per view (globals then locals), e.g. BYOL: ``blur_rate=(1.0, 0.1)``,
            ``solarize_rate=(0.0, 0.2)``.
        mean, std: normalisation stats in [0, 1] units (None: ImageNet for RGB, 0.5 for gray).
        antialias: crop resize kernel (see RandomResizedCrop).
        input_scale: inputs are divided by this first (255 for uint8 or 0–255 floats).
        seed: int or None.

    Call: ``[B, H, W, C]`` (uint8 or float 0–255; C = 1 or 3) → tuple of float32 views.
    ``training=False`` gives deterministic views (central-box resize, no photometric change).
    """

    def __init__(self, global_size, local_size=None, num_global=2, num_local=0,
                 global_scale=(0.2, 1.0), local_scale=(0.05, 0.2), ratio=(3.0 / 4.0, 4.0 / 3.0),
                 brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1, jitter_rate=0.8,
                 grayscale_rate=0.2, blur_rate=0.5, blur_sigma=(0.1, 2.0), blur_kernel_size=None,
                 solarize_rate=0.0, solarize_threshold=0.5, mean=None, std=None, antialias=True,
                 input_scale=255.0, seed=None, **kwargs):
        super().__init__(seed=seed, **kwargs)
        self.global_size = _pair(global_size, "global_size")
        self.num_global, self.num_local = int(num_global), int(num_local)
        if self.num_global < 0 or self.num_local < 0 or self.num_global + self.num_local == 0:
            raise ValueError(f"Need at least one view; received num_global={num_global}, "
                             f"num_local={num_local}")
        if self.num_local > 0 and local_size is None:
            raise ValueError(f"num_local={num_local} needs `local_size`; received None")
        self.local_size = None if local_size is None else _pair(local_size, "local_size")
        num_views = self.num_global + self.num_local
        self.blur_rate = _per_view(blur_rate, "blur_rate", num_views)
        self.solarize_rate = _per_view(solarize_rate, "solarize_rate", num_views)
        self.global_scale = _range(global_scale, "global_scale", 0.0, 1.0)
        self.local_scale = _range(local_scale, "local_scale", 0.0, 1.0)
        self.ratio = tuple(float(r) for r in ratio)
        self.brightness, self.contrast = float(brightness), float(contrast)
        self.saturation, self.hue = float(saturation), float(hue)
        self.jitter_rate = float(jitter_rate)
        self.grayscale_rate = float(grayscale_rate)
        self.blur_sigma = tuple(float(s) for s in blur_sigma)
        self.blur_kernel_size = blur_kernel_size
        self.solarize_threshold = float(solarize_threshold)
        self.mean, self.std = _stats_arg(mean), _stats_arg(std)
        self.antialias = bool(antialias)
        self.input_scale = float(input_scale)

        self.chains = []
        for view in range(num_views):
            is_global = view < self.num_global
            size = self.global_size if is_global else self.local_size
            scale = self.global_scale if is_global else self.local_scale
            chain = [
                RandomResizedCrop(size[0], size[1], scale=scale, ratio=self.ratio,
                                  antialias=self.antialias, seed=_derive_seed(seed, view, 0)),
                RandomHorizontalFlip(0.5, seed=_derive_seed(seed, view, 1)),
                RandomColorJitter(self.brightness, self.contrast, self.saturation, self.hue,
                                  rate=self.jitter_rate, seed=_derive_seed(seed, view, 2)),
                RandomGrayscale(self.grayscale_rate, seed=_derive_seed(seed, view, 3)),
                RandomGaussianBlur(self.blur_sigma, self.blur_kernel_size,
                                   rate=self.blur_rate[view], seed=_derive_seed(seed, view, 4)),
                RandomSolarize(self.solarize_threshold, rate=self.solarize_rate[view],
                               seed=_derive_seed(seed, view, 5)),
            ]
            chain = [layer for layer in chain if getattr(layer, "rate", 1.0) > 0.0]
            chain.append(Normalize(self.mean, self.std))
            self.chains.append(chain)
        self._build_at_init()

    @classmethod
    def for_dataset(cls, image_shape, num_local=0, num_global=2, dataset=None, **overrides):
        """Sensible defaults for images of ``image_shape = (H, W, C)``.

        Small images (side <= 128): views at native resolution, local views half of it, blur off
        for side <= 32 (SimCLR on CIFAR). Large images: 224 global / 96 local (ImageNet recipe),
        blur 0.5. ``dataset``: a key of :data:`DATASET_STATS` for mean/std. ``overrides`` (any
        ViewAugmenter argument) win, except that an override of None keeps the default (so
        ``local_size=cfg.local_size or None`` works).
        """
        if len(image_shape) != 3 or image_shape[-1] not in (1, 3):
            raise ValueError(f"image_shape must be (H, W, C) with C in (1, 3); received "
                             f"{tuple(image_shape)}")
        height, width = int(image_shape[0]), int(image_shape[1])
        side = min(height, width)
        if side <= 128:
            global_size = (height, width)
            local_size = (max(1, height // 2), max(1, width // 2))
        else:
            global_size, local_size = (224, 224), (96, 96)
        params = dict(global_size=global_size, local_size=local_size if num_local else None,
                      num_global=num_global, num_local=num_local,
                      blur_rate=0.0 if side <= 32 else 0.5)
        if dataset is not None:
            if dataset not in DATASET_STATS:
                raise ValueError(f"Unknown dataset {dataset!r}; known: {sorted(DATASET_STATS)}")
            params["mean"], params["std"] = DATASET_STATS[dataset]
        params.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**params)

    @property
    def view_sizes(self):
        """(h, w) of each output view, in output order."""
        return [self.global_size] * self.num_global + [self.local_size] * self.num_local

    def call(self, images, training=True):
        images, _ = self._prepare(images)
        x = images * (1.0 / self.input_scale)
        views = []
        for chain in self.chains:
            view = x
            for layer in chain:
                view = layer(view) if isinstance(layer, Normalize) else layer(view, training=training)
            views.append(view)
        return tuple(views)

    def compute_output_shape(self, input_shape):
        return tuple((input_shape[0], h, w, input_shape[-1]) for h, w in self.view_sizes)

    def get_config(self):
        config = super().get_config()
        config.update(
            global_size=self.global_size, local_size=self.local_size,
            num_global=self.num_global, num_local=self.num_local,
            global_scale=self.global_scale, local_scale=self.local_scale, ratio=self.ratio,
            brightness=self.brightness, contrast=self.contrast, saturation=self.saturation,
            hue=self.hue, jitter_rate=self.jitter_rate, grayscale_rate=self.grayscale_rate,
            blur_rate=self.blur_rate, blur_sigma=self.blur_sigma,
            blur_kernel_size=self.blur_kernel_size, solarize_rate=self.solarize_rate,
            solarize_threshold=self.solarize_threshold, mean=self.mean, std=self.std,
            antialias=self.antialias, input_scale=self.input_scale)
        return config
