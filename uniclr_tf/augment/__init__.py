"""View augmentations for contrastive pre-training, batched, per sample, on any backend.

The default recipe is SimCLR's, as used by the UniCLR paper (§4.1): RandomResizedCrop (scale
0.2–1.0), horizontal flip (p 0.5), colour jitter (p 0.8), grayscale (p 0.2), Gaussian blur
(σ ∈ [0.1, 2], p 0.5), plus BYOL's solarisation and multi-crop local views as options. Other
methods' recipes (SimCLR, MoCo v2, BYOL — also Barlow Twins' and VICReg's) are presets of
:class:`ViewRecipe` in :data:`RECIPES`, turned into an augmenter by
:meth:`ViewAugmenter.from_recipe`.

Modules
-------
``functional``  pure helpers: interpolation / blur matrices, colour maths, argument validators,
                dataset statistics (:data:`DATASET_STATS`).
``layers``      the batched random layers (RandomResizedCrop, RandomHorizontalFlip,
                RandomColorJitter, RandomGrayscale, RandomGaussianBlur, RandomSolarize), Normalize,
                EvalPreprocess / eval_preprocess, and their base classes.
``views``       :class:`ViewAugmenter` (a chain of the layers per view), :class:`ViewRecipe`,
                :data:`RECIPES`.
``_private``    the only module importing Keras internals (``keras.src``); a test enforces it.

Everything is re-exported here: ``from uniclr_tf.augment import ViewAugmenter``.

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
in ``tf.data`` under JAX: ``keras.ops`` always dispatches to the configured Keras backend, so inside
a ``tf.data`` map (traced by TensorFlow) it would hand TF graph tensors to ``jax.numpy``. Keras's
public API has neither a base class for such layers nor a RandomResizedCrop or a per-sample
blur / random-apply, hence these layers (``DataLayer`` is private API; Keras is pinned in
``requirements.txt``). Randomness: on the JAX (non-TF) path each layer draws from its
own Keras ``SeedGenerator``, whose state is a non-trainable variable, so ``stateless_call`` (and
a Keras model's JAX train step) threads it through ``jax.jit``. On the TensorFlow path it draws
from a per-layer ``tf.random.Generator`` instead of the ``SeedGenerator`` that
``self._get_seed_generator`` would give: a ``SeedGenerator``'s read-then-assign is not atomic, and
in a parallel ``tf.data`` map two batches got identical parameters (see ``_uniforms`` in
``layers``). The generator also works under ``tf.distribute.MirroredStrategy`` (replicas draw
different numbers) and ``jit_compile=True``. Both are seeded from the layer's ``seed`` (or
Python's ``random``, which ``keras.utils.set_random_seed`` seeds). A batch key instead
(``ViewAugmenter(x, batch_key=...)``, TensorFlow path only) draws every parameter of the batch
statelessly from the key: the train CLI keys tf.data's batch ``i`` by ``(seed, i)`` and a TF train step
by ``(seed, step, replica)``, so its views depend on neither the map's parallelism nor a resume.

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
graph is built). On a GPU a whole augmenter takes a few milliseconds a batch even at 224 px; in
tf.data on a CPU a 224-px view costs far more, so augment large images on the device. One random op
per layer keeps the XLA compile short (on CPU the threefry RNG dominates it).
On GPUs float32 matmuls default to reduced precision (TF32-like): an identity crop was off by
2.4e-4 at JAX's default precision, exact at "highest". Irrelevant for augmentation (an 8-bit step
is 3.9e-3), but do not use these layers where bit-exactness matters.

All layers compute in float32 whatever the global mixed-precision policy (``dtype="float32"`` by
default).

Serialization: the layers are registered with
``keras.saving.register_keras_serializable(package="uniclr_tf")`` (e.g.
``"uniclr_tf>ViewAugmenter"``); importing this package registers them, so ``.keras`` files saved
before the split into modules still load.
"""

from uniclr_tf.augment import functional, layers, views
from uniclr_tf.augment.functional import (
    DATASET_STATS,
    IMAGENET_MEAN,
    IMAGENET_STD,
    apply_separable,
    default_blur_kernel_size,
    gaussian_blur_matrix,
    resize_matrix,
)
from uniclr_tf.augment.layers import (
    EvalPreprocess,
    Normalize,
    RandomColorJitter,
    RandomFlip,
    RandomGaussianBlur,
    RandomGrayscale,
    RandomHorizontalFlip,
    RandomResizedCrop,
    RandomSolarize,
    eval_preprocess,
)
from uniclr_tf.augment.views import RECIPES, ViewAugmenter, ViewRecipe, get_recipe

__all__ = [
    "DATASET_STATS",
    "EvalPreprocess",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "Normalize",
    "RECIPES",
    "RandomColorJitter",
    "RandomFlip",
    "RandomGaussianBlur",
    "RandomGrayscale",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "RandomSolarize",
    "ViewAugmenter",
    "ViewRecipe",
    "apply_separable",
    "default_blur_kernel_size",
    "eval_preprocess",
    "functional",
    "gaussian_blur_matrix",
    "get_recipe",
    "layers",
    "resize_matrix",
    "views",
]
