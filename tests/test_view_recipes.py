"""Tests for the view recipes (uniclr_tf.augment.views.ViewRecipe / RECIPES /
ViewAugmenter.from_recipe) and for the layout of the uniclr_tf.augment package."""

import dataclasses
import json
import re
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # plain `pytest`, no install
    sys.path.insert(0, str(REPO_ROOT))

from uniclr_tf import augment as A  # noqa: E402
from uniclr_tf.augment import RECIPES, ViewAugmenter, ViewRecipe  # noqa: E402


def _uint8(batch, height, width, channels, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (batch, height, width, channels),
                                                dtype=np.uint8)


def _config(layer):
    config = layer.get_config()
    config.pop("name")  # auto-generated, unique per instance
    return config


# ---------------------------------------------------------------------------------------------
# ViewRecipe: presets, validation, replace, to_dict
# ---------------------------------------------------------------------------------------------


def test_presets():
    assert set(RECIPES) == {"uniclr", "simclr", "mocov2", "byol"}
    assert all(name == recipe.name for name, recipe in RECIPES.items())
    uniclr = RECIPES["uniclr"]
    assert uniclr == ViewRecipe(name="uniclr")  # the dataclass defaults ARE the uniclr recipe
    assert (uniclr.global_scale, uniclr.color_jitter, uniclr.blur_prob, uniclr.solarize_prob) == \
        ((0.2, 1.0), (0.4, 0.4, 0.2, 0.1), (0.5, 0.5), (0.0, 0.0))
    simclr, mocov2, byol = RECIPES["simclr"], RECIPES["mocov2"], RECIPES["byol"]
    assert simclr.global_scale == (0.08, 1.0) and simclr.color_jitter == (0.4, 0.4, 0.4, 0.1)
    assert mocov2.global_scale == (0.2, 1.0) and mocov2.color_jitter == (0.4, 0.4, 0.4, 0.1)
    assert byol.global_scale == (0.08, 1.0) and byol.color_jitter == (0.4, 0.4, 0.2, 0.1)
    assert byol.blur_prob == (1.0, 0.1) and byol.solarize_prob == (0.0, 0.2)
    for recipe in RECIPES.values():
        assert (recipe.flip_prob, recipe.color_jitter_prob, recipe.grayscale_prob) == (0.5, 0.8, 0.2)
        assert recipe.blur_sigma == (0.1, 2.0) and not recipe.blur_on_small_images
    with pytest.raises(dataclasses.FrozenInstanceError):
        byol.blur_prob = (0.5, 0.5)


@pytest.mark.parametrize("field, value", [
    ("global_scale", (0.5, 0.2)), ("global_scale", (0.0, 1.0)), ("local_scale", (0.1, 1.5)),
    ("local_scale", (0.1,)), ("flip_prob", 1.5), ("color_jitter_prob", -0.1),
    ("grayscale_prob", "0.2"), ("color_jitter", (0.4, 0.4, 0.2, 0.6)),
    ("color_jitter", (-0.1, 0.4, 0.2, 0.1)), ("color_jitter", (0.4, 0.4, 0.2)),
    ("blur_prob", (0.5, 0.5, 0.5)), ("blur_prob", (1.2,)), ("blur_prob", ()),
    ("solarize_prob", (0.0, -0.2)), ("solarize_prob", "0.2"), ("blur_sigma", (0.0, 2.0)),
    ("blur_sigma", (2.0, 0.1)), ("name", ""), ("blur_on_small_images", "yes"),
])
def test_recipe_validation_names_field_and_value(field, value):
    with pytest.raises(ValueError, match=re.escape(f"ViewRecipe.{field} ") + ".*" +
                       re.escape(f"received {field}={value!r}")):
        ViewRecipe(**{field: value})
    with pytest.raises(ValueError, match=re.escape(f"{field}={value!r}")):
        RECIPES["byol"].replace(**{field: value})  # replace re-validates


def test_per_view_values_are_pairs_and_lists_become_tuples():
    assert ViewRecipe(blur_prob=(0.3,)).blur_prob == (0.3, 0.3)
    assert ViewRecipe(blur_prob=0.3).blur_prob == (0.3, 0.3)
    recipe = ViewRecipe(solarize_prob=[0, 0.2], global_scale=[0.1, 1], color_jitter=[0, 0, 0, 0])
    assert recipe.solarize_prob == (0.0, 0.2) and recipe.global_scale == (0.1, 1.0)
    assert recipe.color_jitter == (0.0, 0.0, 0.0, 0.0)
    hash(recipe)  # frozen with tuples: hashable


def test_replace_ignores_none_and_marks_explicit_blur():
    byol = RECIPES["byol"]
    same = byol.replace(global_scale=None, blur_prob=None, flip_prob=None)
    assert same == byol
    changed = byol.replace(global_scale=(0.3, 1.0), flip_prob=0.0, color_jitter=None)
    assert changed.global_scale == (0.3, 1.0) and changed.flip_prob == 0.0
    assert changed.color_jitter == byol.color_jitter and changed.name == "byol"
    assert not changed.blur_on_small_images  # blur not overridden
    blurred = byol.replace(blur_prob=0.5)
    assert blurred.blur_prob == (0.5, 0.5) and blurred.blur_on_small_images
    assert not byol.replace(blur_prob=0.5, blur_on_small_images=False).blur_on_small_images
    assert byol.blur_prob == (1.0, 0.1)  # the preset is untouched
    with pytest.raises(ValueError, match="blur_rate"):
        byol.replace(blur_rate=0.5)  # ViewAugmenter's name, not a recipe field


def test_to_dict_is_json_and_round_trips():
    for recipe in list(RECIPES.values()) + [RECIPES["byol"].replace(blur_prob=0.2)]:
        d = recipe.to_dict()
        assert list(d) == ["name", "global_scale", "local_scale", "flip_prob", "color_jitter",
                           "color_jitter_prob", "grayscale_prob", "blur_prob", "solarize_prob",
                           "blur_sigma", "blur_on_small_images"]
        assert ViewRecipe(**json.loads(json.dumps(d))) == recipe


# ---------------------------------------------------------------------------------------------
# ViewAugmenter.from_recipe
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(28, 28, 1), (32, 32, 3), (224, 224, 3)])
def test_uniclr_recipe_equals_for_dataset(shape):
    assert _config(ViewAugmenter.from_recipe(RECIPES["uniclr"], shape)) == \
        _config(ViewAugmenter.for_dataset(shape))
    a = ViewAugmenter.from_recipe("uniclr", shape, num_local=2, seed=5, dataset="cifar10"
                                  if shape[-1] == 3 else "fashion_mnist")
    b = ViewAugmenter.for_dataset(shape, num_local=2, seed=5,
                                  dataset="cifar10" if shape[-1] == 3 else "fashion_mnist")
    assert _config(a) == _config(b)
    assert a.flip_rate == 0.5 and a.get_config()["flip_rate"] == 0.5


def test_byol_recipe_per_view_probabilities_and_small_image_blur_rule():
    big = ViewAugmenter.from_recipe("byol", (224, 224, 3))
    assert big.blur_rate == (1.0, 0.1) and big.solarize_rate == (0.0, 0.2)
    assert big.global_scale == (0.08, 1.0) and big.global_size == (224, 224)
    multi = ViewAugmenter.from_recipe("byol", (256, 320, 3), num_local=2, num_global=3)
    assert multi.blur_rate == (1.0, 0.1, 1.0, 1.0, 1.0)  # global i: entry i % 2; locals: first
    assert multi.solarize_rate == (0.0, 0.2, 0.0, 0.0, 0.0)
    assert multi.view_sizes == [(224, 224)] * 3 + [(96, 96)] * 2
    small = ViewAugmenter.from_recipe(RECIPES["byol"], (28, 28, 1))
    assert small.blur_rate == (0.0, 0.0) and small.solarize_rate == (0.0, 0.2)
    assert not any(isinstance(l, A.RandomGaussianBlur) for c in small.chains for l in c)
    forced = ViewAugmenter.from_recipe(RECIPES["byol"].replace(blur_prob=(1.0, 0.1)), (28, 28, 1))
    assert forced.blur_rate == (1.0, 0.1)
    assert all(any(isinstance(l, A.RandomGaussianBlur) for l in c) for c in forced.chains)
    noflip = ViewAugmenter.from_recipe(RECIPES["simclr"].replace(flip_prob=0.0), (32, 32, 3))
    assert noflip.flip_rate == 0.0
    assert not any(isinstance(l, A.RandomHorizontalFlip) for c in noflip.chains for l in c)


def test_from_recipe_arguments_and_errors():
    aug = ViewAugmenter.from_recipe("mocov2", (64, 48, 3), num_local=2, local_size=24,
                                    mean=(0.5, 0.5, 0.5), std=(0.25,) * 3, dataset="cifar10",
                                    seed=3)
    assert aug.global_size == (64, 48) and aug.local_size == (24, 24)
    assert aug.mean == (0.5, 0.5, 0.5) and aug.std == (0.25,) * 3  # explicit stats win
    assert aug.seed == 3 and aug.saturation == 0.4 and aug.blur_rate == (0.5,) * 4
    assert ViewAugmenter.from_recipe("simclr", (40, 40, 3), num_local=1).local_size == (20, 20)
    with pytest.raises(ValueError, match="Unknown view recipe 'swav'"):
        ViewAugmenter.from_recipe("swav", (32, 32, 3))
    with pytest.raises(ValueError, match="Unknown dataset"):
        ViewAugmenter.from_recipe("byol", (32, 32, 3), dataset="svhn")
    with pytest.raises(ValueError, match="image_shape"):
        ViewAugmenter.from_recipe("byol", (32, 32))
    with pytest.raises(ValueError, match="flip_rate=2"):
        ViewAugmenter(32, flip_rate=2)


def test_old_configs_still_deserialize():
    # Configs written before the split (module "uniclr_tf.augment", no flip_rate) still load.
    config = keras.saving.serialize_keras_object(ViewAugmenter(16, blur_rate=(1.0, 0.1), seed=1))
    config["module"] = "uniclr_tf.augment"
    config["config"].pop("flip_rate")
    revived = keras.saving.deserialize_keras_object(config)
    assert type(revived) is ViewAugmenter and revived.flip_rate == 0.5
    assert revived.blur_rate == (1.0, 0.1)


def test_recipe_augmenter_runs_on_tensorflow():
    assert keras.backend.backend() == "tensorflow"
    aug = ViewAugmenter.from_recipe("byol", (32, 32, 3), num_local=2, seed=0)
    views = aug(_uint8(4, 32, 32, 3))
    assert [tuple(v.shape) for v in views] == [(4, 32, 32, 3)] * 2 + [(4, 16, 16, 3)] * 2
    assert all(keras.backend.standardize_dtype(v.dtype) == "float32" for v in views)
    assert all(np.isfinite(np.asarray(v)).all() for v in views)


def test_recipe_augmenter_runs_on_jax(run_python):
    report = run_python("""
        import json, sys
        import jax, keras, numpy as np
        from uniclr_tf.augment import RECIPES, ViewAugmenter
        assert keras.backend.backend() == "jax"
        recipe = RECIPES["byol"].replace(blur_prob=(1.0, 0.1))  # blur forced on small images
        aug = ViewAugmenter.from_recipe(recipe, (12, 12, 3), num_local=1, seed=0)
        x = np.random.default_rng(0).integers(0, 256, (3, 12, 12, 3), dtype=np.uint8)
        state = [v.value for v in aug.non_trainable_variables]
        views, _ = jax.jit(lambda s, x: aug.stateless_call([], s, x))(state, x)
        print(json.dumps({"shapes": [list(v.shape) for v in views],
                          "dtypes": [str(v.dtype) for v in views],
                          "finite": bool(all(np.isfinite(np.asarray(v)).all() for v in views)),
                          "blur_rate": list(aug.blur_rate)}))
    """, backend="jax")
    assert report["shapes"] == [[3, 12, 12, 3]] * 2 + [[3, 6, 6, 3]]
    assert report["dtypes"] == ["float32"] * 3 and report["finite"]
    assert report["blur_rate"] == [1.0, 0.1, 1.0]


# ---------------------------------------------------------------------------------------------
# Package layout
# ---------------------------------------------------------------------------------------------

_KERAS_SRC_IMPORT = re.compile(r"^\s*(from\s+keras\.src[\s.]|import\s+keras\.src\b|"
                               r"from\s+keras\s+import\s+.*\bsrc\b)", re.MULTILINE)


def test_only_augment_private_imports_keras_internals():
    package = REPO_ROOT / "uniclr_tf"
    importers = sorted(str(path.relative_to(package)) for path in package.rglob("*.py")
                       if _KERAS_SRC_IMPORT.search(path.read_text(encoding="utf-8")))
    assert importers == ["augment/_private.py"], importers
    assert not (package / "augment.py").exists()  # the package replaced the module


def test_public_names_importable_from_the_package():
    for name in ["ViewAugmenter", "EvalPreprocess", "resize_matrix", "apply_separable",
                 "gaussian_blur_matrix", "default_blur_kernel_size", "DATASET_STATS", "Normalize",
                 "RandomResizedCrop", "RandomFlip", "RandomHorizontalFlip", "RandomColorJitter",
                 "RandomGrayscale", "RandomGaussianBlur", "RandomSolarize", "eval_preprocess",
                 "IMAGENET_MEAN", "IMAGENET_STD", "ViewRecipe", "RECIPES", "get_recipe"]:
        assert hasattr(A, name), name
    assert set(A.__all__) <= set(dir(A))
    assert keras.saving.get_registered_name(A.ViewAugmenter) == "uniclr_tf>ViewAugmenter"
    assert keras.saving.get_registered_name(A.RandomResizedCrop) == "uniclr_tf>RandomResizedCrop"
