"""Pure helpers of the augmentation layers: interpolation / blur matrices, colour maths,
argument validators, dataset statistics.

Every function that builds tensors takes a ``backend`` (a Keras backend module or the
``DynamicBackend`` a layer exposes as ``self.backend``; None means the Keras backend), so the same
code runs on TensorFlow inside ``tf.data`` and on JAX inside ``jax.jit``.

Geometry (crop + resize, blur) is done with SEPARABLE per-sample matrices:
``out[b] = Ry[b] @ img[b] @ Rx[b]ᵀ`` per channel, two batched matmuls (:func:`apply_separable`).
The matrices (:func:`resize_matrix`, :func:`gaussian_blur_matrix`) are built elementwise from the
parameters (triangle / Gaussian kernels evaluated on an index grid), so there is no gather, and the
maths is identical on every backend. Colour maths (:func:`_grayscale`, :func:`_shift_hue`) uses
elementwise ops only.
"""

import numpy as np

from uniclr_tf.augment._private import DynamicBackend

__all__ = [
    "DATASET_STATS",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "apply_separable",
    "default_blur_kernel_size",
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


# --------------------------------------------------------------------------------------------
# Small helpers (pure functions of a backend module; `backend=None` means the Keras backend).
# --------------------------------------------------------------------------------------------


def _backend_or_default(backend):
    return DynamicBackend() if backend is None else backend


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


def _default_stats(channels, mean=None, std=None):
    """``(mean, std)`` with a None replaced by what it stands for, per channel: ImageNet's statistics for RGB
    images, 0.5 / 0.5 otherwise."""
    default_mean, default_std = (IMAGENET_MEAN, IMAGENET_STD) if channels == 3 else ((0.5,) * channels,) * 2
    return default_mean if mean is None else mean, default_std if std is None else std


def _resolve_stats(mean, std, channels):
    """Per-channel mean/std tuples (defaults: :func:`_default_stats`)."""
    mean, std = _default_stats(channels, mean, std)
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


def _per_view(value, name, num_views):
    """A probability, or one per view (globals first, then locals) → tuple of num_views floats."""
    if isinstance(value, (list, tuple)):
        if len(value) != num_views:
            raise ValueError(f"`{name}` given per view must have num_global + num_local = "
                             f"{num_views} values; received {name}={value!r}")
        return tuple(_probability(v, name) for v in value)
    return (_probability(value, name),) * num_views

