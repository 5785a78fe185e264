"""uniclr-tf: UniCLR (arXiv 2211.14516) self-supervised contrastive learning in Keras 3.

Pretrain your own Keras backbone with SimAffinity, SimWhitening, SimTrace or one of the baselines
they unify, through ``compile`` and ``fit``, on the TensorFlow (default) and JAX backends::

    import keras, numpy as np, uniclr_tf

    encoder = uniclr_tf.build_encoder("resnet18", (32, 32, 3))   # or any Keras backbone
    model = uniclr_tf.UniCLR(encoder, method="simaffinity",
                             augmenter=uniclr_tf.ViewAugmenter.from_recipe("uniclr", (32, 32, 3)))
    model.compile(optimizer=uniclr_tf.LARS(uniclr_tf.WarmupCosine(0.3, 256, 1000, 100)))
    model.fit(images_uint8, batch_size=256, epochs=4)
    model.save("pretrained.keras")          # keras.saving.load_model("pretrained.keras") resumes it
    features = model.encoder.predict(...)   # model.encoder: a plain Keras model

The public names (``uniclr_tf.__all__``):

* the model: :class:`UniCLR`;
* the methods and their losses: the sub-modules :mod:`uniclr_tf.methods` (``get(name, **options)``,
  ``names()``) and :mod:`uniclr_tf.objectives` (every loss as a ``keras.ops`` function of embeddings);
* the views: :class:`ViewAugmenter` (two views or multi-crop, a Keras layer), :class:`ViewRecipe`,
  :data:`RECIPES`, :class:`EvalPreprocess`;
* the backbones: :func:`build_encoder`;
* optimisation: :class:`LARS`, :class:`WarmupCosine`;
* callbacks: :class:`KNNMonitor`, :class:`CollapseDetector`, :class:`BackupAndResume`;
* evaluation and export: :func:`knn_eval`, :func:`linear_evaluation`, :func:`export_saved_model`,
  :func:`load_saved_model`.

Importing the package is cheap: each name (and TensorFlow or JAX with it) is imported when first
used. Once Keras is imported, uniclr_tf's layers and models are registered with Keras' serialisation,
so ``keras.saving.load_model`` finds them.
"""

import importlib
import importlib.abc
import importlib.machinery
import sys
from typing import TYPE_CHECKING

__version__ = "0.1.0"

if TYPE_CHECKING:  # what __getattr__ imports on first use, spelled out for type checkers and the API reference
    from uniclr_tf import methods, objectives
    from uniclr_tf.augment import RECIPES, EvalPreprocess, ViewAugmenter, ViewRecipe
    from uniclr_tf.evaluation import knn_eval
    from uniclr_tf.evaluation.linear import linear_evaluation
    from uniclr_tf.nets.encoders import build_encoder
    from uniclr_tf.nets.model import UniCLR
    from uniclr_tf.serving.saved_model import export_saved_model, load_saved_model
    from uniclr_tf.training.callbacks import BackupAndResume, CollapseDetector, KNNMonitor
    from uniclr_tf.training.optimizers import LARS
    from uniclr_tf.training.schedules import WarmupCosine

#: Public name -> the module that defines it (imported on first use; a module name maps to itself).
_PUBLIC = {
    "UniCLR": "uniclr_tf.nets.model",
    "methods": "uniclr_tf.methods",
    "objectives": "uniclr_tf.objectives",
    "ViewAugmenter": "uniclr_tf.augment",
    "ViewRecipe": "uniclr_tf.augment",
    "RECIPES": "uniclr_tf.augment",
    "EvalPreprocess": "uniclr_tf.augment",
    "build_encoder": "uniclr_tf.nets.encoders",
    "LARS": "uniclr_tf.training.optimizers",
    "WarmupCosine": "uniclr_tf.training.schedules",
    "KNNMonitor": "uniclr_tf.training.callbacks",
    "CollapseDetector": "uniclr_tf.training.callbacks",
    "BackupAndResume": "uniclr_tf.training.callbacks",
    "knn_eval": "uniclr_tf.evaluation",
    "linear_evaluation": "uniclr_tf.evaluation.linear",
    "export_saved_model": "uniclr_tf.serving.saved_model",
    "load_saved_model": "uniclr_tf.serving.saved_model",
}

__all__ = sorted(_PUBLIC)

#: The modules whose import registers uniclr_tf's Keras-serialisable classes (models, layers,
#: optimizers, schedules), so that ``keras.saving.load_model`` can rebuild a saved model.
_SERIALISABLE = ("uniclr_tf.nets.model", "uniclr_tf.augment", "uniclr_tf.training.optimizers",
                 "uniclr_tf.training.schedules")
_registering = False


def _register_keras_objects():
    """Imports :data:`_SERIALISABLE` (once; never from inside one of this package's own imports)."""
    global _registering
    if _registering or all(name in sys.modules for name in _SERIALISABLE):
        return
    if any(getattr(getattr(module, "__spec__", None), "_initializing", False)
           for name, module in list(sys.modules.items()) if name.startswith("uniclr_tf.")):
        return  # one of ours is being imported (and imports Keras): its importer registers afterwards
    _registering = True
    try:
        for name in _SERIALISABLE:
            importlib.import_module(name)
    finally:
        _registering = False


def __getattr__(name):
    module_name = _PUBLIC.get(name)
    if module_name is None:
        raise AttributeError(f"module 'uniclr_tf' has no attribute {name!r}")
    module = importlib.import_module(module_name)
    value = module if module_name.endswith("." + name) else getattr(module, name)
    globals()[name] = value
    _register_keras_objects()
    return value


def __dir__():
    """The public names and the module's dunders (not the sub-packages imported along the way)."""
    return sorted(set(__all__) | {name for name in globals() if name.startswith("__")})


class _RegisterAfterKeras(importlib.abc.MetaPathFinder):
    """Registers uniclr_tf's classes with Keras as soon as Keras has been imported (by anyone), so that
    ``import uniclr_tf; import keras; keras.saving.load_model(...)`` works as in the other order."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "keras":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            try:
                _register_keras_objects()
            except Exception:  # noqa: BLE001 (best effort: a name's first use registers them too)
                pass

        spec.loader.exec_module = exec_module
        return spec


if "keras" in sys.modules:  # Keras (and its backend) already loaded: registering costs little
    _register_keras_objects()
elif not any(isinstance(finder, _RegisterAfterKeras) for finder in sys.meta_path):
    sys.meta_path.insert(0, _RegisterAfterKeras())
