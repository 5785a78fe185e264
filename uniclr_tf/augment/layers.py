"""The batched random augmentation layers and their base classes.

Every layer takes a BATCH ``[B, H, W, C]`` (C = 1 or 3) of floats in [0, 1] (not uint8: colour
jitter clips to [0, 1] and solarisation flips about 0.5; ``ViewAugmenter`` scales uint8 images first
by its ``input_scale``), draws its random parameters PER SAMPLE, computes in float32 and does all
its maths with ``self.backend.*`` (see the package docstring of :mod:`uniclr_tf.augment` for why,
and how the randomness works on each backend).

Following Keras's preprocessing layers, each random layer first draws all parameters for the batch
in ``get_random_transformation(batch_size, image_shape)`` (a dict of ``[B]`` tensors), then applies
them with ``transform_images(images, transformation)`` using masks and batched maths only: no
Python loop over samples, no ``map_fn``, static output shapes (XLA / TPU friendly). Separating the
two also lets tests compare the parameter distributions drawn on the host (TF) and on the device
(JAX).

Layers are registered for ``.keras`` serialization under the package name ``"uniclr_tf"``
(registered names such as ``"uniclr_tf>RandomResizedCrop"``); keep the package and class names
so saved models still load.
"""

import math

import keras
import numpy as np

from uniclr_tf.augment._private import DataLayer, make_default_seed, no_automatic_dependency_tracking
from uniclr_tf.augment.functional import (
    _as_column,
    _central_box,
    _check_images,
    _grayscale,
    _pair,
    _probability,
    _range,
    _resolve_stats,
    _shift_hue,
    _stats_arg,
    _strength,
    apply_separable,
    default_blur_kernel_size,
    gaussian_blur_matrix,
    resize_matrix,
)

__all__ = [
    "EvalPreprocess",
    "Normalize",
    "RandomColorJitter",
    "RandomFlip",
    "RandomGaussianBlur",
    "RandomGrayscale",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "RandomSolarize",
    "eval_preprocess",
]

# Attempts per sample in the RandomResizedCrop rejection sampler (torchvision uses 10).
_CROP_ATTEMPTS = 10
_PACKAGE = "uniclr_tf"


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
        ``num_parallel_calls=8`` on 2 cores). An explicit int seed gives a stateless draw, a Keras
        ``SeedGenerator`` a draw from it, and a TensorFlow key ``[2]`` (what :meth:`ViewAugmenter.call`
        passes for a ``batch_key``) a stateless draw that is a function of the key alone.
        """
        shape = (batch_size, count)
        if seed is not None and not isinstance(seed, (int, np.integer, keras.random.SeedGenerator)):
            import tensorflow as tf  # a key tensor is TensorFlow's: only reached on that path

            return tf.random.stateless_uniform(shape, seed=seed, dtype=tf.float32)
        if seed is None and self.backend.name == "tensorflow":
            return self._tf_generator().uniform(shape, dtype="float32")
        return self.backend.random.uniform(shape, minval=0.0, maxval=1.0, dtype="float32",
                                           seed=self._seed(seed))

    @no_automatic_dependency_tracking
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

    def call(self, images, training=True, seed=None):
        """``seed``: None draws from the layer's stream; an int or a TensorFlow key ``[2]``, statelessly."""
        images, shape = self._prepare(images)
        if not training or self._is_noop(shape):
            return images
        transformation = self.get_random_transformation(self._batch_size(images), shape, seed=seed)
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

    def call(self, images, training=True, seed=None):
        images, (height, width, _) = self._prepare(images)
        if training:
            transformation = self.get_random_transformation(self._batch_size(images),
                                                            (height, width), seed=seed)
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
    """SimCLR / torchvision colour jitter, applied to each sample with probability ``rate``, on images
    in [0, 1] (its output is clipped to [0, 1]).

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
    """With probability ``rate`` per sample: ``x → 1 − x`` where ``x >= threshold`` (fixed), on images
    in [0, 1].

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

    Examples:
        >>> preprocess = EvalPreprocess(32, mean=augmenter.mean, std=augmenter.std)  # those of the views
        >>> features = model.encoder(preprocess(uint8_images), training=False)
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
