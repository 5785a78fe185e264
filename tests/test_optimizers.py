"""LARS: golden values against a float64 NumPy re-implementation, on TF (eager and graph) and JAX.

The hyper-parameters of the golden cases are far from the paper's (η = 0.05, wd = 0.1, lr = 2)
so that decay, trust ratio and exclusions all move the weights well above the 1e-6 tolerance.
"""

import copy
import inspect
import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from uniclr_tf.training.optimizers import LARS
from uniclr_tf.training.schedules import WarmupCosine

ATOL = 1e-6
HYPER = dict(learning_rate=2.0, momentum=0.9, weight_decay=0.1, eta=0.05)


# --- float64 reference ---------------------------------------------------------------------

def lars_reference(weights, grads_per_step, learning_rate, momentum, weight_decay, eta,
                   epsilon=0.0, nesterov=False, clip_lr=False, decay=None, adapt=None, double_decay=False):
    """SimCLR/BYOL LARS in float64. ``decay`` / ``adapt``: per-variable flags (default: ndim > 1).

    ``clip_lr=True`` is LARC's clipping as NVIDIA apex and solo-learn write it: the adapted step
    ``lr · min(trust / lr, 1)``.
    ``double_decay=True`` adds what the Keras base optimizer would do if LARS also handed it its
    coefficient: a decoupled ``w ← w − lr·wd·w`` on every variable before the LARS step.
    """
    w = [np.array(x, np.float64) for x in weights]
    v = [np.zeros_like(x) for x in w]
    decay = [x.ndim > 1 for x in w] if decay is None else decay
    adapt = [x.ndim > 1 for x in w] if adapt is None else adapt
    for step, grads in enumerate(grads_per_step):
        lr = learning_rate(step) if callable(learning_rate) else learning_rate
        if double_decay:
            w = [x - lr * weight_decay * x for x in w]
        for i, g in enumerate(grads):
            g = np.array(g, np.float64)
            if decay[i]:
                g = g + weight_decay * w[i]
            rate = lr
            if adapt[i]:
                w_norm, g_norm = np.linalg.norm(w[i]), np.linalg.norm(g)
                if w_norm > 0 and g_norm > 0:
                    trust = eta * w_norm / (g_norm + epsilon)
                    if not clip_lr:
                        rate = lr * trust
                    elif lr > 0:  # apex / solo-learn: lr · min(trust / lr, 1); at lr 0, no step
                        rate = lr * min(trust / lr, 1.0)
            v[i] = momentum * v[i] + rate * g
            w[i] = w[i] - (momentum * v[i] + rate * g if nesterov else v[i])
    return w


def make_case(steps=4, seed=0):
    """A 2-D kernel, a 1-D bias, a 4-D conv kernel and a 1-D BN gamma, with fixed gradients."""
    rng = np.random.default_rng(seed)
    shapes = [(3, 4), (4,), (3, 3, 2, 4), (4,)]
    names = ["dense_kernel", "dense_bias", "conv_kernel", "bn_gamma"]
    weights = [rng.normal(size=s).astype(np.float32) for s in shapes]
    grads = [[(rng.normal(size=s) * (1.0 if len(s) > 1 else 0.05)).astype(np.float32)
              for s in shapes] for _ in range(steps)]
    return names, weights, grads


def run_tf(weights, grads_per_step, names=None, raw=False, graph=False, optimizer=None, **kwargs):
    """Applies ``grads_per_step`` with LARS on TF; returns the final weights as NumPy arrays."""
    names = names or [f"v{i}" for i in range(len(weights))]
    if raw:
        variables = [tf.Variable(w, name=n) for w, n in zip(weights, names)]
    else:
        variables = [keras.Variable(w, name=n) for w, n in zip(weights, names)]
    opt = optimizer or LARS(**kwargs)
    opt.build(variables)
    apply = tf.function(lambda grads: opt.apply(grads, variables)) if graph else (
        lambda grads: opt.apply(grads, variables))
    for grads in grads_per_step:
        apply([tf.constant(g) for g in grads])
    return [to_numpy(v) for v in variables], opt


def to_numpy(variable):
    return np.array(variable.numpy())  # np.asarray(keras.Variable) warns on NumPy 2


def assert_close(actual, expected, atol=ATOL):
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        np.testing.assert_allclose(a, e, rtol=0, atol=atol, err_msg=f"variable {i}")


# --- golden values -------------------------------------------------------------------------

@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf_function"])
@pytest.mark.parametrize("variant", [{}, {"nesterov": True}, {"epsilon": 0.5}, {"momentum": 0.0}],
                         ids=["default", "nesterov", "epsilon", "no_momentum"])
def test_golden_values_tf(variant, graph):
    names, weights, grads = make_case()
    hyper = {**HYPER, **variant}
    got, opt = run_tf(weights, grads, names, graph=graph, **hyper)
    assert_close(got, lars_reference(weights, grads, **hyper))
    assert int(opt.iterations) == len(grads)
    assert len(opt.variables) == 2 + (0 if hyper["momentum"] == 0 else len(weights))


class _PerStep(keras.optimizers.schedules.LearningRateSchedule):
    """The learning rate of each step from a list (lr 0 first, as a warm-up starts)."""

    def __init__(self, values):
        self.values = list(values)

    def __call__(self, step):
        return keras.ops.take(keras.ops.convert_to_tensor(self.values, "float32"), keras.ops.cast(step, "int32"))

    def get_config(self):
        return {"values": self.values}


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf_function"])
def test_clip_lr_caps_the_adapted_rate_at_the_schedule(graph):
    """LARC's clipping against the float64 reference over a schedule that is 0, below the trust ratio
    (the rate is the schedule's) and above it (the rate is the trust ratio's, not lr·trust)."""
    values = [0.0, 0.01, 0.5, 2.0]
    names, weights, grads = make_case(steps=len(values))
    hyper = {**HYPER, "learning_rate": None}
    got, _ = run_tf(weights, grads, names, graph=graph, **{**hyper, "learning_rate": _PerStep(values)},
                    clip_lr=True)
    expected = lars_reference(weights, grads, **{**hyper, "learning_rate": values.__getitem__}, clip_lr=True)
    assert_close(got, expected)
    unclipped = lars_reference(weights, grads, **{**hyper, "learning_rate": values.__getitem__})
    assert not np.allclose(expected[0], unclipped[0], atol=1e-3)  # the clip changes the kernels' steps
    np.testing.assert_allclose(expected[1], unclipped[1], atol=ATOL)  # and leaves vectors (rate lr) alone


def test_golden_values_jax(run_python):
    """The same numbers on the JAX backend, eagerly (also with LARC's clipping) and through
    jax.jit(stateless_apply); and one epoch of fit() (the JAX trainer's jitted stateless path)."""
    names, weights, grads = make_case()
    payload = json.dumps({"weights": [w.tolist() for w in weights],
                          "grads": [[g.tolist() for g in step] for step in grads],
                          "names": names, "hyper": HYPER})
    out = run_python(f"""
        import json
        import jax, keras, numpy as np
        from uniclr_tf.training.optimizers import LARS
        case = json.loads({payload!r})
        weights = [np.asarray(w, "float32") for w in case["weights"]]
        grads = [[np.asarray(g, "float32") for g in s] for s in case["grads"]]

        variables = [keras.Variable(w, name=n) for w, n in zip(weights, case["names"])]
        opt = LARS(**case["hyper"])
        for step in grads:
            opt.apply(step, variables)
        eager = [np.asarray(v).tolist() for v in variables]

        variables = [keras.Variable(w, name=n) for w, n in zip(weights, case["names"])]
        clipped = LARS(**{{**case["hyper"], "learning_rate": 0.01, "clip_lr": True}})
        for step in grads:
            clipped.apply(step, variables)
        clip = [np.asarray(v).tolist() for v in variables]

        variables = [keras.Variable(w, name=n) for w, n in zip(weights, case["names"])]
        opt = LARS(**case["hyper"])
        opt.build(variables)
        step_fn = jax.jit(opt.stateless_apply)
        opt_vars = [v.value for v in opt.variables]
        train_vars = [v.value for v in variables]
        for step in grads:
            train_vars, opt_vars = step_fn(opt_vars, step, train_vars)
        jitted = [np.asarray(v).tolist() for v in train_vars]

        model = keras.Sequential([keras.Input((4, 4, 2)), keras.layers.Conv2D(3, 3),
                                  keras.layers.BatchNormalization(), keras.layers.Flatten(),
                                  keras.layers.Dense(2)])
        model.compile(optimizer=LARS(0.5), loss="mse")
        rng = np.random.default_rng(0)
        x, y = rng.normal(size=(16, 4, 4, 2)), rng.normal(size=(16, 2))
        loss = model.fit(x, y, batch_size=4, epochs=1, verbose=0).history["loss"][0]
        print(json.dumps({{"backend": keras.backend.backend(), "eager": eager, "jit": jitted, "clip": clip,
                           "iterations": int(opt_vars[0]), "fit_loss": float(loss),
                           "fit_iterations": int(model.optimizer.iterations)}}))
    """, backend="jax")
    assert out["backend"] == "jax"
    expected = lars_reference(weights, grads, **HYPER)
    assert_close([np.asarray(w) for w in out["eager"]], expected)
    assert_close([np.asarray(w) for w in out["jit"]], expected)
    assert_close([np.asarray(w) for w in out["clip"]],
                 lars_reference(weights, grads, **{**HYPER, "learning_rate": 0.01}, clip_lr=True))
    assert out["iterations"] == len(grads)
    assert np.isfinite(out["fit_loss"]) and out["fit_iterations"] == 4


def test_vector_params_get_plain_momentum_sgd():
    """A 1-D parameter takes neither decay nor trust ratio: exactly Keras SGD with momentum."""
    names, weights, grads = make_case()
    got, _ = run_tf(weights, grads, names, **HYPER)
    sgd_var = keras.Variable(weights[1])
    sgd = keras.optimizers.SGD(learning_rate=HYPER["learning_rate"], momentum=HYPER["momentum"])
    for step in grads:
        sgd.apply([tf.constant(step[1])], [sgd_var])
    np.testing.assert_allclose(got[1], to_numpy(sgd_var), rtol=0, atol=ATOL)
    # ... and the reference that decays and adapts it is far away.
    adapted = lars_reference(weights, grads, **HYPER, decay=[True] * 4, adapt=[True] * 4)
    assert np.max(np.abs(adapted[1] - got[1])) > 1e-2


def test_exclude_vectors_false_adapts_everything():
    names, weights, grads = make_case()
    got, _ = run_tf(weights, grads, names, exclude_vectors=False, **HYPER)
    assert_close(got, lars_reference(weights, grads, **HYPER, decay=[True] * 4, adapt=[True] * 4))


def test_no_double_weight_decay():
    names, weights, grads = make_case()
    got, opt = run_tf(weights, grads, names, **HYPER)
    once = lars_reference(weights, grads, **HYPER)
    twice = lars_reference(weights, grads, **HYPER, double_decay=True)
    assert max(np.max(np.abs(a - b)) for a, b in zip(once, twice)) > 1e-2  # the test can tell
    assert_close(got, once)
    assert opt.weight_decay is None  # the base class's decoupled decay stays off
    assert opt.lars_weight_decay == HYPER["weight_decay"]
    assert opt.get_config()["weight_decay"] == HYPER["weight_decay"]


def test_zero_gradient_and_zero_weight_edges():
    """trust = 1 when ‖w‖ or ‖g‖ is 0; never NaN."""
    weights = [np.zeros((3, 4), np.float32),      # zero w, zero g
               np.zeros((3, 4), np.float32),      # zero w, non-zero g: plain momentum step
               np.ones((3, 4), np.float32),       # zero g: only the decay term, trust = η/wd
               np.full((2, 2), 0.5, np.float32)]  # zero g, excluded from decay: must not move
    grad = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    grads = [[np.zeros((3, 4), np.float32), grad, np.zeros((3, 4), np.float32),
              np.zeros((2, 2), np.float32)]] * 3
    got, _ = run_tf(weights, grads, names=["a", "b", "c", "frozen"],
                    exclude_from_weight_decay=["frozen"], **HYPER)
    assert all(np.all(np.isfinite(w)) for w in got)
    expected = lars_reference(weights, grads, **HYPER, decay=[True, True, True, False])
    assert_close(got, expected)
    np.testing.assert_array_equal(got[0], 0.0)
    np.testing.assert_array_equal(got[3], 0.5)
    assert not np.allclose(got[1], 0.0) and not np.allclose(got[2], 1.0)


def test_name_exclusion_on_raw_tf_variables():
    """Raw tf.Variables have no .path: patterns fall back to .name (without ':0')."""
    rng = np.random.default_rng(1)
    weights = [rng.normal(size=(3, 4)).astype(np.float32) for _ in range(3)]
    grads = [[rng.normal(size=(3, 4)).astype(np.float32) for _ in range(3)] for _ in range(3)]
    names = ["proj/kernel", "head/kernel", "pred/kernel"]
    kwargs = dict(exclude_from_weight_decay=["head"], exclude_from_adaptation=[r"^pred/kernel$"],
                  **HYPER)
    got, opt = run_tf(weights, grads, names, raw=True, **kwargs)
    assert not hasattr(opt._trainable_variables[0], "path")
    expected = lars_reference(weights, grads, **HYPER, decay=[True, False, True],
                              adapt=[True, True, False])
    assert_close(got, expected)
    plain = lars_reference(weights, grads, **HYPER)
    assert np.max(np.abs(plain[1] - got[1])) > 1e-3 and np.max(np.abs(plain[2] - got[2])) > 1e-3


def test_name_exclusion_matches_keras_paths():
    """In a model, patterns match ``variable.path`` (``.name`` is only "kernel") even though the
    TF backend hands raw tf.Variables to update_step."""
    inputs = keras.Input((3,))
    outputs = keras.layers.Dense(2, name="head")(keras.layers.Dense(4, name="proj")(inputs))
    model = keras.Model(inputs, outputs)
    variables = model.trainable_variables
    assert [v.path for v in variables] == ["proj/kernel", "proj/bias", "head/kernel", "head/bias"]
    weights = [to_numpy(v) for v in variables]
    grads = [[np.zeros_like(w) for w in weights]] * 2  # zero loss gradient: only decay moves w
    opt = LARS(exclude_from_weight_decay=["head/"], **HYPER)
    opt.build(variables)
    tf.function(lambda g: opt.apply(g, variables))([tf.constant(g) for g in grads[0]])
    opt.apply([tf.constant(g) for g in grads[1]], variables)
    np.testing.assert_array_equal(to_numpy(variables[2]), weights[2])  # excluded: unchanged
    assert not np.allclose(to_numpy(variables[0]), weights[0])         # decayed
    assert_close([to_numpy(v) for v in variables],
                 lars_reference(weights, grads, **HYPER, decay=[True, False, False, False]))


def test_keras_exclude_from_weight_decay_api():
    """Keras's own ``exclude_from_weight_decay(var_list=, var_names=)`` drives LARS's decay."""
    names, weights, grads = make_case()
    opt = LARS(**HYPER)
    opt.exclude_from_weight_decay(var_names=["conv"])
    got, _ = run_tf(weights, grads, names, optimizer=opt)
    assert_close(got, lars_reference(weights, grads, **HYPER, decay=[True, False, False, False]))

    variables = [keras.Variable(w, name=n) for w, n in zip(weights, names)]
    opt = LARS(**HYPER)
    opt.exclude_from_weight_decay(var_list=[variables[0]])
    for step in grads:
        opt.apply([tf.constant(g) for g in step], variables)
    assert_close([to_numpy(v) for v in variables],
                 lars_reference(weights, grads, **HYPER, decay=[False, False, True, False]))
    with pytest.raises(ValueError, match="before"):
        opt.exclude_from_weight_decay(var_names=["x"])


# --- arguments and configuration -----------------------------------------------------------

@pytest.mark.parametrize("kwargs, quoted", [
    ({"momentum": 1.5}, "1.5"), ({"momentum": -0.1}, "-0.1"), ({"weight_decay": -1e-6}, "-1e-06"),
    ({"eta": 0.0}, "0.0"), ({"epsilon": -1.0}, "-1.0"), ({"nesterov": "yes"}, "yes"),
    ({"clip_lr": 1}, "clip_lr=1"), ({"exclude_from_adaptation": [3]}, "[3]"), ({"exclude_from_weight_decay": ["("]}, "("),
])
def test_invalid_arguments_raise(kwargs, quoted):
    with pytest.raises(ValueError, match=None) as err:
        LARS(0.1, **kwargs)
    assert quoted in str(err.value)


def test_config_round_trip_and_serialization():
    opt = LARS(learning_rate=WarmupCosine(0.05, 512, 100, 10), momentum=0.8, weight_decay=1e-4,
               eta=0.002, epsilon=1e-9, nesterov=True, clip_lr=True, exclude_from_adaptation=["bn"],
               exclude_from_weight_decay="bias", exclude_vectors=False, clipnorm=1.0,
               name="my_lars")
    config = opt.get_config()
    assert config["weight_decay"] == 1e-4 and config["exclude_from_weight_decay"] == ["bias"]
    params = set(inspect.signature(LARS.__init__).parameters) - {"self", "kwargs"}
    assert params <= set(config), f"missing from get_config: {params - set(config)}"
    restored = LARS.from_config(copy.deepcopy(config))  # Keras's from_config edits its argument
    assert restored.get_config() == config
    assert (restored.momentum, restored.eta, restored.epsilon, restored.nesterov, restored.clip_lr) == (
        0.8, 0.002, 1e-9, True, True)
    assert restored.exclude_from_adaptation_patterns == ("bn",) and not restored.exclude_vectors
    assert restored.weight_decay is None and restored.lars_weight_decay == 1e-4

    serialized = keras.optimizers.serialize(opt)
    json.dumps(serialized)  # plain JSON
    assert serialized["registered_name"] == "uniclr_tf>LARS"
    again = keras.optimizers.deserialize(json.loads(json.dumps(serialized)))
    assert isinstance(again, LARS) and isinstance(again._learning_rate, WarmupCosine)
    assert again.get_config() == config


def _toy_model():
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(4, 3, name="conv")(inputs)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(2, name="head")(x))


def test_fit_and_keras_save_load(tmp_path):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(32, 8, 8, 3)).astype(np.float32)
    y = rng.normal(size=(32, 2)).astype(np.float32)
    keras.utils.set_random_seed(0)
    model = _toy_model()
    before = [to_numpy(v) for v in model.trainable_variables]
    model.compile(optimizer=LARS(WarmupCosine(0.5, 8, 8, 2), exclude_from_adaptation=["head"]),
                  loss="mse")
    history = model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert int(model.optimizer.iterations) == 4
    assert all(not np.array_equal(b, to_numpy(v))
               for b, v in zip(before, model.trainable_variables))

    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded.optimizer, LARS)
    assert loaded.optimizer.get_config() == model.optimizer.get_config()
    assert len(loaded.optimizer.variables) == len(model.optimizer.variables)
    for a, b in zip(loaded.optimizer.variables, model.optimizer.variables):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
    # Training resumes identically: momentum buffers and schedule position came back.
    model.train_on_batch(x[:8], y[:8])
    loaded.train_on_batch(x[:8], y[:8])
    assert_close([to_numpy(v) for v in loaded.trainable_variables],
                 [to_numpy(v) for v in model.trainable_variables])


# --- SGD: PyTorch's rule (decay in the gradient), not Keras's decoupled decay ----------------

def sgd_reference(weights, grads_per_step, learning_rate, momentum, weight_decay, decay=None, nesterov=False):
    """``torch.optim.SGD`` in float64 (dampening 0), in the ``v ← m·v + lr·g`` form (equal for a fixed lr)."""
    return lars_reference(weights, grads_per_step, learning_rate, momentum, weight_decay, eta=1.0,
                          nesterov=nesterov, decay=[True] * len(weights) if decay is None else decay,
                          adapt=[False] * len(weights))


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_decays_in_the_gradient_every_parameter(nesterov):
    from uniclr_tf.training.optimizers import SGD, build_optimizer
    names, weights, grads = make_case()
    hyper = dict(learning_rate=0.5, momentum=0.9, weight_decay=0.1)
    opt = build_optimizer("sgd", hyper["learning_rate"], momentum=0.9, weight_decay=0.1, nesterov=nesterov)
    assert type(opt) is SGD and opt.weight_decay is None  # no decoupled Keras decay on top
    got, _ = run_tf(weights, grads, names, optimizer=opt)
    assert_close(got, sgd_reference(weights, grads, **hyper, nesterov=nesterov))
    # Keras's own SGD with the same coefficient (decoupled) lands far away: the test can tell.
    keras_vars = [keras.Variable(w) for w in weights]
    keras_sgd = keras.optimizers.SGD(hyper["learning_rate"], momentum=0.9, weight_decay=0.1, nesterov=nesterov)
    for step in grads:
        keras_sgd.apply([tf.constant(g) for g in step], keras_vars)
    assert max(np.max(np.abs(a - to_numpy(b))) for a, b in zip(got, keras_vars)) > 1e-2


def test_sgd_exclusions_and_config_round_trip():
    from uniclr_tf.training.optimizers import SGD
    names, weights, grads = make_case()
    opt = SGD(0.5, momentum=0.9, weight_decay=0.1, exclude_from_weight_decay=["bn_"])
    got, _ = run_tf(weights, grads, names, optimizer=opt)
    assert_close(got, sgd_reference(weights, grads, 0.5, 0.9, 0.1, decay=[True, True, True, False]))
    vectors_spared = SGD(0.5, weight_decay=0.1, exclude_vectors=True)
    got, _ = run_tf(weights, grads, names, optimizer=vectors_spared)
    assert_close(got, sgd_reference(weights, grads, 0.5, 0.9, 0.1, decay=[True, False, True, False]))
    clone = SGD.from_config(opt.get_config())
    assert type(clone) is SGD and not clone.trust_ratio and clone.lars_weight_decay == 0.1
    assert clone.exclude_from_weight_decay_patterns == ("bn_",) and clone.name == "sgd"
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(opt))
    assert type(restored) is SGD
