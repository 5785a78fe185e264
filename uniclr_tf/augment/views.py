"""Multi-view augmentation: :class:`ViewAugmenter` and the per-method view recipes.

A :class:`ViewRecipe` is a method's augmentation policy (crop scales, flip, colour jitter,
grayscale, blur and solarisation probabilities, possibly different for the two global views as in
BYOL) independent of the image size; :data:`RECIPES` holds named presets.
:meth:`ViewAugmenter.from_recipe` turns a recipe plus an image shape into an augmenter, choosing
the view sizes from the image size (:meth:`ViewAugmenter.for_dataset` is the same with the
``"uniclr"`` recipe).

Examples:
    >>> from uniclr_tf.augment import RECIPES, ViewAugmenter
    >>> sorted(RECIPES)
    ['byol', 'mocov2', 'simclr', 'uniclr']
    >>> stronger = RECIPES["simclr"].replace(color_jitter=(0.8, 0.8, 0.8, 0.2))
    >>> augmenter = ViewAugmenter.from_recipe(stronger, (32, 32, 3), num_local=4, local_size=16)
"""

import dataclasses
import inspect
import math
from typing import Tuple

import keras

from uniclr_tf.augment.functional import (
    DATASET_STATS,
    _pair,
    _per_view,
    _probability,
    _range,
    _stats_arg,
)
from uniclr_tf.augment.layers import (
    _PACKAGE,
    Normalize,
    RandomColorJitter,
    RandomGaussianBlur,
    RandomGrayscale,
    RandomHorizontalFlip,
    RandomResizedCrop,
    RandomSolarize,
    _BatchLayer,
)

__all__ = ["RECIPES", "ViewAugmenter", "ViewRecipe", "get_recipe"]

#: Images whose smaller side is at most this many pixels get no Gaussian blur from
#: :meth:`ViewAugmenter.from_recipe` / :meth:`ViewAugmenter.for_dataset` (SimCLR leaves blur out on
#: CIFAR-10: at 32 px a 3-tap blur mostly destroys the little detail there is), unless the
#: recipe's ``blur_on_small_images`` is True.
SMALL_IMAGE_SIDE = 32
#: Images whose smaller side is at most this many pixels are augmented at their native resolution
#: (local views at half of it); larger ones get 224-px global and 96-px local views (ImageNet).
NATIVE_RESOLUTION_SIDE = 128


# --------------------------------------------------------------------------------------------
# View recipes
# --------------------------------------------------------------------------------------------


def _recipe_error(name, value, requirement):
    return ValueError(f"ViewRecipe.{name} must be {requirement}; received {name}={value!r}")


def _floats(value, name, requirement, length=None):
    """A sequence of numbers → tuple of floats (a ValueError naming the field otherwise)."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise _recipe_error(name, value, requirement)
    try:
        values = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        raise _recipe_error(name, value, requirement) from None
    if (length is not None and len(values) != length) or not all(map(math.isfinite, values)):
        raise _recipe_error(name, value, requirement)
    return values


def _recipe_probability(value, name):
    requirement = "a probability in [0, 1]"
    if isinstance(value, (str, bytes, bool)):
        raise _recipe_error(name, value, requirement)
    try:
        p = float(value)
    except (TypeError, ValueError):
        raise _recipe_error(name, value, requirement) from None
    if not 0.0 <= p <= 1.0:
        raise _recipe_error(name, value, requirement)
    return p


def _recipe_scale(value, name):
    requirement = "a pair (lo, hi) of crop area fractions with 0 < lo <= hi <= 1"
    lo, hi = _floats(value, name, requirement, length=2)
    if not 0.0 < lo <= hi <= 1.0:
        raise _recipe_error(name, value, requirement)
    return lo, hi


def _recipe_per_view(value, name):
    """A probability, or a tuple of 1 or 2 (one per global view) → a pair."""
    requirement = ("a probability in [0, 1] or a tuple of 1 or 2 of them (one per global view; "
                   "one value means both views)")
    if not isinstance(value, (str, bytes)) and not hasattr(value, "__len__"):
        value_tuple = (value,)
    else:
        value_tuple = value
    values = _floats(value_tuple, name, requirement)
    if len(values) not in (1, 2) or not all(0.0 <= p <= 1.0 for p in values):
        raise _recipe_error(name, value, requirement)
    return values * 2 if len(values) == 1 else values


@dataclasses.dataclass(frozen=True, kw_only=True)
class ViewRecipe:
    """A method's view augmentation, independent of the image size. Frozen; validated on
    construction (a bad value raises a ValueError naming the field and the value received).

    Chain per view (see :class:`ViewAugmenter`): random resized crop → horizontal flip → colour
    jitter → grayscale → Gaussian blur → solarise → normalise. Fields are keyword-only.

    Examples:
        >>> recipe = ViewRecipe(name="mine", global_scale=(0.3, 1.0), blur_prob=(1.0, 0.1), solarize_prob=(0.0, 0.2))
        >>> augmenter = ViewAugmenter.from_recipe(recipe, (64, 64, 3))

    Fields:
        name: the recipe's name (for logs), e.g. ``"byol"``.
        global_scale, local_scale: crop area ranges ``(lo, hi)``, ``0 < lo <= hi <= 1``, of the
            global views and of the local (multi-crop) views.
        flip_prob: probability of a horizontal flip.
        color_jitter: strengths ``(brightness, contrast, saturation, hue)``, all ``>= 0`` and
            ``hue <= 0.5`` (see :class:`~uniclr_tf.augment.layers.RandomColorJitter`).
        color_jitter_prob: probability of applying the colour jitter.
        grayscale_prob: probability of converting to grayscale.
        blur_prob, solarize_prob: probabilities PER GLOBAL VIEW, ``(view 1, view 2)``; a single
            value (or a 1-tuple) means both views and is stored as a pair. With more than two
            global views, global view ``i`` uses entry ``i % 2``. LOCAL views use the FIRST entry
            (view 1's setting; e.g. BYOL's recipe blurs local views always and never solarises
            them). For another split build :class:`ViewAugmenter` directly: its ``blur_rate`` and
            ``solarize_rate`` take one value per view.
        blur_sigma: range of the blur's σ in pixels, ``0 < lo <= hi``.
        blur_on_small_images: False (the presets): images of side <= 32 px get no blur whatever
            ``blur_prob`` says (SimCLR on CIFAR). :meth:`replace` sets it to True when it
            overrides ``blur_prob``, so an explicitly requested blur is honoured on small images
            too; pass ``blur_on_small_images=False`` along to keep the rule.
    """

    name: str = "custom"
    global_scale: Tuple[float, float] = (0.2, 1.0)
    local_scale: Tuple[float, float] = (0.05, 0.2)
    flip_prob: float = 0.5
    color_jitter: Tuple[float, float, float, float] = (0.4, 0.4, 0.2, 0.1)
    color_jitter_prob: float = 0.8
    grayscale_prob: float = 0.2
    blur_prob: Tuple[float, float] = (0.5, 0.5)
    solarize_prob: Tuple[float, float] = (0.0, 0.0)
    blur_sigma: Tuple[float, float] = (0.1, 2.0)
    blur_on_small_images: bool = False

    def __post_init__(self):
        def put(field, value):
            object.__setattr__(self, field, value)

        if not isinstance(self.name, str) or not self.name:
            raise _recipe_error("name", self.name, "a non-empty string")
        put("global_scale", _recipe_scale(self.global_scale, "global_scale"))
        put("local_scale", _recipe_scale(self.local_scale, "local_scale"))
        for field in ("flip_prob", "color_jitter_prob", "grayscale_prob"):
            put(field, _recipe_probability(getattr(self, field), field))
        requirement = ("4 strengths (brightness, contrast, saturation, hue), each >= 0, "
                       "with hue <= 0.5")
        jitter = _floats(self.color_jitter, "color_jitter", requirement, length=4)
        if min(jitter) < 0.0 or jitter[3] > 0.5:
            raise _recipe_error("color_jitter", self.color_jitter, requirement)
        put("color_jitter", jitter)
        put("blur_prob", _recipe_per_view(self.blur_prob, "blur_prob"))
        put("solarize_prob", _recipe_per_view(self.solarize_prob, "solarize_prob"))
        requirement = "a pair (lo, hi) of blur sigmas in pixels with 0 < lo <= hi"
        lo, hi = _floats(self.blur_sigma, "blur_sigma", requirement, length=2)
        if not 0.0 < lo <= hi:
            raise _recipe_error("blur_sigma", self.blur_sigma, requirement)
        put("blur_sigma", (lo, hi))
        if not isinstance(self.blur_on_small_images, bool):
            raise _recipe_error("blur_on_small_images", self.blur_on_small_images, "True or False")

    def replace(self, **overrides):
        """A copy with ``overrides`` applied and validated; overrides whose value is None are
        ignored (so CLI flags left at None keep the recipe's value). Overriding ``blur_prob`` also
        sets ``blur_on_small_images=True`` unless that is overridden too."""
        known = [f.name for f in dataclasses.fields(self)]
        unknown = sorted(set(overrides) - set(known))
        if unknown:
            raise ValueError(f"Unknown ViewRecipe field(s) {unknown}; fields: {known}")
        changes = {k: v for k, v in overrides.items() if v is not None}
        if "blur_prob" in changes:
            changes.setdefault("blur_on_small_images", True)
        return dataclasses.replace(self, **changes)

    def to_dict(self):
        """All fields as a JSON-friendly dict (tuples as lists); ``ViewRecipe(**d)`` rebuilds it."""
        return {f.name: list(v) if isinstance(v, tuple) else v
                for f in dataclasses.fields(self) for v in [getattr(self, f.name)]}


#: Named view recipes. Barlow Twins (Zbontar et al., 2021) and VICReg (Bardes et al., 2022) use
#: BYOL's augmentation: use ``"byol"`` for them. Any recipe's blur is off for images of side
#: <= 32 px (see :attr:`ViewRecipe.blur_on_small_images`).
RECIPES = {
    # UniCLR paper, §4.1: SimCLR-style views; crop area 0.2–1, flip 0.5, jitter (0.4, 0.4, 0.2,
    # 0.1) with p 0.8 (MoCo v2/v3's strengths: the authors' code is a MoCo-v3 fork and the paper
    # gives none), grayscale 0.2, blur 0.5 on both views, no solarisation. Exactly the defaults of
    # ViewAugmenter / ViewAugmenter.for_dataset.
    "uniclr": ViewRecipe(name="uniclr"),
    # SimCLR (Chen et al., 2020, "A Simple Framework for Contrastive Learning of Visual
    # Representations", Appendix A): crop area 0.08–1, flip 0.5, colour distortion of strength
    # s = 0.5 → (0.8s, 0.8s, 0.8s, 0.2s) = (0.4, 0.4, 0.4, 0.1) with p 0.8, grayscale 0.2, blur 0.5.
    # (SimCLR's ImageNet runs use s = 1: replace(color_jitter=(0.8, 0.8, 0.8, 0.2)).)
    "simclr": ViewRecipe(name="simclr", global_scale=(0.08, 1.0),
                         color_jitter=(0.4, 0.4, 0.4, 0.1)),
    # MoCo v2 (Chen, Fan, Girshick & He, 2020, "Improved Baselines with Momentum Contrastive
    # Learning"; its reference code's `augmentation`): crop area 0.2–1, jitter (0.4, 0.4, 0.4,
    # 0.1) with p 0.8, grayscale 0.2, blur σ 0.1–2 with p 0.5, flip 0.5.
    "mocov2": ViewRecipe(name="mocov2", global_scale=(0.2, 1.0),
                         color_jitter=(0.4, 0.4, 0.4, 0.1)),
    # BYOL (Grill et al., 2020, "Bootstrap Your Own Latent", Appendix B, Table 6): crop area
    # 0.08–1, flip 0.5, jitter (0.4, 0.4, 0.2, 0.1) with p 0.8, grayscale 0.2, and ASYMMETRIC
    # views: blur 1.0 / 0.1, solarisation 0.0 / 0.2. Also Barlow Twins' and VICReg's recipe.
    "byol": ViewRecipe(name="byol", global_scale=(0.08, 1.0), color_jitter=(0.4, 0.4, 0.2, 0.1),
                       blur_prob=(1.0, 0.1), solarize_prob=(0.0, 0.2)),
}


def get_recipe(recipe):
    """A :class:`ViewRecipe`, or the name of one of :data:`RECIPES` → the :class:`ViewRecipe`."""
    if isinstance(recipe, ViewRecipe):
        return recipe
    if isinstance(recipe, str) and recipe in RECIPES:
        return RECIPES[recipe]
    raise ValueError(f"Unknown view recipe {recipe!r}; known: {sorted(RECIPES)} "
                     f"(or pass a ViewRecipe)")


def _views_of(per_global, num_global, num_local):
    """A per-global-view pair → one value per view: global ``i`` gets entry ``i % 2``, locals the
    first entry."""
    return (tuple(per_global[i % 2] for i in range(max(num_global, 0)))
            + (per_global[0],) * max(num_local, 0))


# --------------------------------------------------------------------------------------------
# The multi-view augmenter
# --------------------------------------------------------------------------------------------


def takes_batch_key(augmenter):
    """Whether ``augmenter`` (a callable, or a Keras layer's ``call``) takes ``batch_key=`` as
    :meth:`ViewAugmenter.call` does: views drawn statelessly from a key."""
    call = getattr(augmenter, "call", augmenter)
    return callable(call) and "batch_key" in inspect.signature(call).parameters


# A keyed batch gives layer ``i`` of view ``v`` the key folded with ``_KEY_SLOTS * v + i``: room for a chain of
# up to this many layers (the constructor's is at most 7, Normalize included).
_KEY_SLOTS = 8


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
        flip_rate: probability of a horizontal flip (0.5).
        brightness, contrast, saturation, hue, jitter_rate: colour jitter. The defaults
            (0.4, 0.4, 0.2, 0.1, p 0.8) are MoCo v2/v3's (the authors' code is a MoCo-v3 fork;
            the paper gives no strengths); SimCLR's strength s is (0.8s, 0.8s, 0.8s, 0.2s).
        grayscale_rate, blur_rate, blur_sigma, blur_kernel_size, solarize_rate, solarize_threshold: as
            the layers. ``blur_rate`` and ``solarize_rate`` may be given per view (globals then
            locals), e.g. BYOL: ``blur_rate=(1.0, 0.1)``, ``solarize_rate=(0.0, 0.2)``.
        mean, std: normalisation stats in [0, 1] units (None: ImageNet for RGB, 0.5 for gray).
        antialias: crop resize kernel (see RandomResizedCrop).
        input_scale: inputs are divided by this first (255 for uint8 or 0–255 floats).
        seed: int or None.

    Call: ``[B, H, W, C]`` (uint8 or float 0–255; C = 1 or 3) → tuple of float32 views.
    ``training=False`` gives deterministic views (central-box resize, no photometric change).

    See :meth:`from_recipe` (a method's recipe, sizes chosen from the image shape) and
    :meth:`for_dataset` (the default recipe).

    Examples:
        >>> two_views = ViewAugmenter(global_size=32)  # two 32 px views with the default recipe
        >>> multi_crop = ViewAugmenter(global_size=32, local_size=16, num_local=4, global_scale=(0.3, 1.0),
        ...                            local_scale=(0.05, 0.3))
        >>> [tuple(v.shape) for v in multi_crop(np.zeros((8, 32, 32, 3), "uint8"))]
        [(8, 32, 32, 3), (8, 32, 32, 3), (8, 16, 16, 3), (8, 16, 16, 3), (8, 16, 16, 3), (8, 16, 16, 3)]
    """

    def __init__(self, global_size, local_size=None, num_global=2, num_local=0,
                 global_scale=(0.2, 1.0), local_scale=(0.05, 0.2), ratio=(3.0 / 4.0, 4.0 / 3.0),
                 brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1, jitter_rate=0.8,
                 grayscale_rate=0.2, blur_rate=0.5, blur_sigma=(0.1, 2.0), blur_kernel_size=None,
                 solarize_rate=0.0, solarize_threshold=0.5, mean=None, std=None, antialias=True,
                 input_scale=255.0, seed=None, flip_rate=0.5, **kwargs):
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
        self.flip_rate = _probability(flip_rate, "flip_rate")
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
                RandomHorizontalFlip(self.flip_rate, seed=_derive_seed(seed, view, 1)),
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
            assert len(chain) <= _KEY_SLOTS, "a longer chain would share batch keys with the next view"
            self.chains.append(chain)
        self._build_at_init()

    @staticmethod
    def _recipe_params(recipe, image_shape, num_local, num_global, dataset):
        """Constructor arguments for ``recipe`` on images of ``image_shape`` (sizes, per-view
        probabilities, dataset stats)."""
        if len(image_shape) != 3 or image_shape[-1] not in (1, 3):
            raise ValueError(f"image_shape must be (H, W, C) with C in (1, 3); received "
                             f"{tuple(image_shape)}")
        height, width = int(image_shape[0]), int(image_shape[1])
        side = min(height, width)
        if side <= NATIVE_RESOLUTION_SIDE:
            global_size = (height, width)
            local_size = (max(1, height // 2), max(1, width // 2))
        else:
            global_size, local_size = (224, 224), (96, 96)
        num_global, num_local = int(num_global), int(num_local)
        blur = recipe.blur_prob
        if side <= SMALL_IMAGE_SIDE and not recipe.blur_on_small_images:
            blur = (0.0, 0.0)
        brightness, contrast, saturation, hue = recipe.color_jitter
        params = dict(global_size=global_size, local_size=local_size if num_local else None,
                      num_global=num_global, num_local=num_local,
                      global_scale=recipe.global_scale, local_scale=recipe.local_scale,
                      flip_rate=recipe.flip_prob, brightness=brightness, contrast=contrast,
                      saturation=saturation, hue=hue, jitter_rate=recipe.color_jitter_prob,
                      grayscale_rate=recipe.grayscale_prob,
                      blur_rate=_views_of(blur, num_global, num_local),
                      blur_sigma=recipe.blur_sigma,
                      solarize_rate=_views_of(recipe.solarize_prob, num_global, num_local))
        if dataset is not None:
            if dataset not in DATASET_STATS:
                raise ValueError(f"Unknown dataset {dataset!r}; known: {sorted(DATASET_STATS)}")
            params["mean"], params["std"] = DATASET_STATS[dataset]
        return params

    @classmethod
    def from_recipe(cls, recipe, image_shape, num_local=0, num_global=2, local_size=None,
                    mean=None, std=None, seed=None, dataset=None):
        """The augmenter of ``recipe`` (a :class:`ViewRecipe` or a name in :data:`RECIPES`) for
        images of ``image_shape = (H, W, C)``.

        Sizes: small images (side <= 128) are augmented at native resolution, local views at half
        of it; large images get 224-px global and 96-px local views (ImageNet). ``local_size``
        (if not None) replaces the local size. Blur is off for side <= 32 (SimCLR on CIFAR) unless
        ``recipe.blur_on_small_images``. Per-view probabilities: global view ``i`` takes entry
        ``i % 2`` of ``blur_prob`` / ``solarize_prob``, local views the first entry.
        ``dataset``: a key of :data:`DATASET_STATS` for mean/std; explicit ``mean`` / ``std``
        win. None for ``local_size``, ``mean``, ``std``, ``seed`` keeps the default.
        """
        params = cls._recipe_params(get_recipe(recipe), image_shape, num_local, num_global,
                                    dataset)
        explicit = dict(local_size=local_size, mean=mean, std=std, seed=seed)
        params.update({k: v for k, v in explicit.items() if v is not None})
        return cls(**params)

    @classmethod
    def for_dataset(cls, image_shape, num_local=0, num_global=2, dataset=None, **overrides):
        """Sensible defaults for images of ``image_shape = (H, W, C)``: the ``"uniclr"`` recipe
        through :meth:`from_recipe`'s size rules.

        Small images (side <= 128): views at native resolution, local views half of it, blur off
        for side <= 32 (SimCLR on CIFAR). Large images: 224 global / 96 local (ImageNet recipe),
        blur 0.5. ``dataset``: a key of :data:`DATASET_STATS` for mean/std. ``overrides`` (any
        ViewAugmenter argument) win, except that an override of None keeps the default (so
        ``local_size=cfg.local_size or None`` works).
        """
        params = cls._recipe_params(RECIPES["uniclr"], image_shape, num_local, num_global, dataset)
        params.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**params)

    @property
    def view_sizes(self):
        """(h, w) of each output view, in output order."""
        return [self.global_size] * self.num_global + [self.local_size] * self.num_local

    def call(self, images, training=True, batch_key=None):
        """``batch_key`` (TensorFlow only: tf.data, or the TF backend): an int ``[2]`` tensor from which
        every random parameter of this batch is drawn, statelessly (each layer of each view folds in its
        own place): the same key gives the same views whatever ran before or alongside, e.g.
        ``(seed, batch index)`` in a ``tf.data`` map, so a stream resumed mid-way draws the views an
        uninterrupted one would have. None draws from the layers' own random streams."""
        images, _ = self._prepare(images)
        x = images * (1.0 / self.input_scale)
        if not training:
            batch_key = None  # the identity views: nothing to draw
        if batch_key is not None:
            if self.backend.name != "tensorflow":
                raise ValueError("ViewAugmenter: batch_key is a TensorFlow stateless key and needs the "
                                 "TensorFlow path (tf.data, or the TensorFlow backend); received it on "
                                 f"{self.backend.name}")
            import tensorflow as tf

            batch_key = tf.convert_to_tensor(batch_key)
            if batch_key.shape.rank != 1 or batch_key.shape[0] not in (2, None) or not batch_key.dtype.is_integer:
                raise ValueError(f"ViewAugmenter: batch_key must be 2 integers (a stateless key, e.g. (seed, "
                                 f"batch index)); received {batch_key.dtype.name} of shape {batch_key.shape}")
            batch_key = tf.cast(batch_key, tf.int64)
        views = []
        for v, chain in enumerate(self.chains):
            view = x
            for i, layer in enumerate(chain):
                if isinstance(layer, Normalize):
                    view = layer(view)
                elif batch_key is not None:  # each layer of each view: its own key
                    view = layer(view, training=training,
                                 seed=tf.random.experimental.stateless_fold_in(batch_key, _KEY_SLOTS * v + i))
                else:
                    view = layer(view, training=training)
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
            flip_rate=self.flip_rate,
            brightness=self.brightness, contrast=self.contrast, saturation=self.saturation,
            hue=self.hue, jitter_rate=self.jitter_rate, grayscale_rate=self.grayscale_rate,
            blur_rate=self.blur_rate, blur_sigma=self.blur_sigma,
            blur_kernel_size=self.blur_kernel_size, solarize_rate=self.solarize_rate,
            solarize_threshold=self.solarize_threshold, mean=self.mean, std=self.std,
            antialias=self.antialias, input_scale=self.input_scale)
        return config
