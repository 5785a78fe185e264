"""Variables' initial values from a few compiled programs (uniclr_tf/nets/variables.py)."""

import keras
import numpy as np
import pytest

from tests.conftest import COMPILE_LOG
from uniclr_tf.nets.variables import batched_initialisers

# Runs under JAX; prints one JSON line.
BATCHED_ON_JAX = COMPILE_LOG + r"""
import json
import keras
import numpy as np
import uniclr_tf
from uniclr_tf.nets import variables
from keras.src.backend.jax import core

def build(context):
    keras.utils.set_random_seed(7)
    before = len(compiles)
    with context:
        # BYOL: an EMA target copied from the online branch while the model is built, and a predictor
        model = uniclr_tf.UniCLR(uniclr_tf.build_encoder("tiny", (16, 16, 1), width=8), method="byol",
                                 num_global=2, projector_dims=(32, 16), predictor_hidden=24)
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9))
        model.optimizer.build(model.trainable_variables)
    return model, [name for _, name in compiles[before:]]

class NumpyOnes(keras.initializers.Initializer):  # cannot be traced: runs as Keras runs it
    def __call__(self, shape, dtype=None):
        return np.full(shape, 3.0, dtype="float32")

out = {}
class_dict = dict(vars(core.JaxVariable))
# no block: build_encoder and UniCLR batch theirs (first, so that no eager compile of theirs is cached)
_, builders = build(__import__("contextlib").nullcontext())
out["builders_batched"] = builders.count("initial_values")
plain, names = build(variables.batched_initialisers(0))  # Keras's own, the builders' too
out["plain_compiles"], out["plain_batched"] = len(names), names.count("initial_values")
for programs in (1, 3):
    batched, names = build(variables.batched_initialisers(programs))
    out[f"compiles_{programs}"] = len(names)
    out[f"max_diff_{programs}"] = max(float(np.max(np.abs(np.asarray(a, "float64") - np.asarray(b, "float64"))))
                                      for a, b in zip(plain.get_weights(), batched.get_weights()))
    out[f"count_{programs}"] = [len(plain.weights), len(batched.weights)]
    online, target = batched.encoder.get_weights(), batched.target_encoder.get_weights()
    out[f"target_is_online_{programs}"] = all(np.array_equal(a, b) for a, b in zip(online, target))
out["class_restored"] = dict(vars(core.JaxVariable)) == class_dict

with variables.batched_initialisers(2):
    dense = keras.layers.Dense(3, kernel_initializer=NumpyOnes(), bias_initializer="ones")
    dense.build((None, 4))
    out["deferred"] = dense.kernel._value is None and dense.bias._value is None
    dense.bias.assign(np.arange(3.0))  # assigned before the block ends: kept
    with variables.batched_initialisers(1):  # nested: the outer block computes
        other = keras.layers.Dense(2)
        other.build((None, 3))
    out["nested_deferred"] = other.kernel._value is None
    out["read_early"] = float(np.sum(other.kernel.numpy() ** 2)) > 0  # a read computes them
out["kernel"] = np.asarray(dense.kernel).tolist()
out["bias"] = np.asarray(dense.bias).tolist()
late = keras.Variable(initializer="ones", shape=(2,))
out["after_block_eager"] = late._value is not None

try:
    with variables.batched_initialisers():
        keras.layers.Dense(2).build((None, 2))
        raise RuntimeError("boom")
except RuntimeError:
    pass
out["restored_after_error"] = dict(vars(core.JaxVariable)) == class_dict
print(json.dumps(out))
"""


def test_batched_initialisers_match_keras_with_a_few_compiles(run_python):
    """On JAX, a BYOL model built in the block has Keras' own initial values (same seeds, same bits), in
    at most one compile per program and read of deferred variables where Keras compiles one per shape and
    distribution (``build_encoder`` and ``UniCLR`` batch theirs without being asked); its EMA target,
    copied while the model is built, equals the online branch; a variable
    assigned in the block keeps its value, one whose initialiser computes in NumPy gets it, a nested block
    defers to the outer one, a read computes early; the variable class is left as it was, after an
    error too, and a variable made after the block has its value at once."""
    out = run_python(BATCHED_ON_JAX, backend="jax")
    assert out["plain_compiles"] >= 10 and out["plain_batched"] == 0, out
    for programs in (1, 3):
        assert out[f"count_{programs}"][0] == out[f"count_{programs}"][1] > 40, out
        assert out[f"max_diff_{programs}"] < 1e-6, out
        assert out[f"target_is_online_{programs}"], out
    # the first read (the target's copy) computes what exists, the block's end the rest: 2 rounds
    assert out["compiles_1"] <= 2 + 2 and out["compiles_3"] <= 2 * 3 + 2, out
    assert out["compiles_1"] < out["plain_compiles"] / 3, out
    # the public builders batch their own: the encoder, then the heads and target (the optimizer's: Keras's)
    assert out["builders_batched"] >= 2, out
    assert out["deferred"] and out["nested_deferred"] and out["read_early"], out
    assert out["kernel"] == [[3.0] * 3] * 4 and out["bias"] == [0.0, 1.0, 2.0], out
    assert out["after_block_eager"] and out["class_restored"] and out["restored_after_error"], out


# A Python API user's fit on JAX, in a fresh process: the optimizer's variables, which UniCLR.fit builds
# before Keras's loop, come from a batched program too. Prints one JSON line.
FIT_ON_JAX = COMPILE_LOG + r"""
import json
import keras
import numpy as np
import uniclr_tf

keras.utils.set_random_seed(0)
model = uniclr_tf.UniCLR(uniclr_tf.build_encoder("tiny", (16, 16, 1), width=8), method="simaffinity",
                         projector_dims=(32, 16),
                         augmenter=uniclr_tf.ViewAugmenter.from_recipe("uniclr", (16, 16, 1), seed=1))
model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9))
phase[0] = "fit"
model.fit(np.random.default_rng(0).integers(0, 255, (64, 16, 16, 1), dtype="uint8"), batch_size=32, epochs=1,
          verbose=0)
print(json.dumps({"compiles": compiles, "optimizer_variables": len(model.optimizer.variables)}))
"""


def test_fit_builds_the_optimizer_from_batched_programs(run_python):
    """On JAX, ``UniCLR.fit``'s build of the optimizer (one momentum per weight) is a batched program,
    not an eager compile for each weight's shape; the builders before it batched theirs."""
    out = run_python(FIT_ON_JAX, backend="jax")
    in_fit = [name for phase, name in out["compiles"] if phase == "fit"]
    built = [name for phase, name in out["compiles"] if phase == "build"]
    assert out["optimizer_variables"] > 10, out
    assert "initial_values" in in_fit and "initial_values" in built, out
    assert "broadcast_in_dim" not in in_fit and "broadcast_in_dim" not in built, out


def test_batched_initialisers_do_nothing_off_jax():
    """Off JAX the block changes nothing: a variable has its value as it is made."""
    if keras.backend.backend() == "jax":
        pytest.skip("the suite's backend is JAX; the JAX behaviour is tested above")
    with batched_initialisers():
        layer = keras.layers.Dense(2, bias_initializer="ones")
        layer.build((None, 3))
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer.bias), np.ones(2))
