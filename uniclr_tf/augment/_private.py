"""The only module of ``uniclr_tf`` that imports Keras internals (``keras.src``).

Keras's public API has no base class for preprocessing layers that must also run inside
``tf.data`` whatever the backend, so the augmentation layers subclass the private ``DataLayer``
(which switches ``self.backend`` to TensorFlow when it is called in a TF graph that is not a JAX
trace). Private APIs can move between Keras releases, which is why Keras is pinned (see
``requirements.txt``: ``keras==3.15.*``) and why every such import is gathered here: a Keras upgrade
has one file to check. ``tests/test_view_recipes.py`` fails if another module imports
``keras.src``.

Names:
    DataLayer: base class of every layer of this package (``keras.src.layers.preprocessing``).
    DynamicBackend: the backend object a ``DataLayer`` exposes as ``self.backend``; the pure
        helpers of :mod:`uniclr_tf.augment.functional` default to one (the Keras backend).
    make_default_seed: a fresh random int seed (seeds the per-layer ``tf.random.Generator``
        when the layer has no seed).
    no_automatic_dependency_tracking: decorator that keeps Keras from tracking the
        ``tf.random.Generator`` as layer state.
    jax_variables: (JAX backend only, imported when called) what :mod:`uniclr_tf.nets.variables`
        needs to defer variables' initialisers: Keras's JAX ``Variable`` class, whether a layout
        shards a variable as it is made, and whether code runs in a stateless scope or a JAX trace.
"""

from keras.src.layers.preprocessing.data_layer import DataLayer
from keras.src.random.seed_generator import make_default_seed
from keras.src.utils import backend_utils
from keras.src.utils import tracking

DynamicBackend = backend_utils.DynamicBackend
no_automatic_dependency_tracking = tracking.no_automatic_dependency_tracking


def jax_variables():
    """``(JaxVariable, should_shard_at_init(layout, shape), in_stateless_scope(), in_jax_trace())``."""
    from keras.src.backend.common.stateless_scope import in_stateless_scope
    from keras.src.backend.jax import core
    from keras.src.utils.jax_utils import is_in_jax_tracing_scope
    return core.JaxVariable, core.should_shard_at_init, in_stateless_scope, is_in_jax_tracing_scope


__all__ = ["DataLayer", "DynamicBackend", "jax_variables", "make_default_seed", "no_automatic_dependency_tracking"]
