"""WarmupCosine and BYOL's momentum schedule: hand values, a NumPy reference, config, optimizers."""

import copy
import math

import keras
import numpy as np
import pytest

from uniclr_tf.training.schedules import WarmupCosine, momentum_schedule

# Paper defaults at CIFAR scale: base 0.05 (ImageNet) at batch 512 → peak 0.1.
BASE, BATCH, TOTAL, WARMUP = 0.05, 512, 110, 10
PEAK = BATCH / 256 * BASE


def reference_lr(step, base, batch, total, warmup, end=0.0, reference_batch=256):
    peak = batch / reference_batch * base
    if step < warmup:
        return peak * step / warmup
    if step > total:
        return end
    progress = (step - warmup) / max(total - warmup, 1)
    return end + (peak - end) * 0.5 * (1 + math.cos(math.pi * progress))


def values(schedule, steps):
    return keras.ops.convert_to_numpy(schedule(np.asarray(steps))).astype(np.float64)


def test_hand_values():
    schedule = WarmupCosine(BASE, BATCH, TOTAL, WARMUP)
    assert schedule.peak_learning_rate == pytest.approx(0.1)
    steps = [0, WARMUP // 2, WARMUP, WARMUP + (TOTAL - WARMUP) // 2, TOTAL, TOTAL + 50]
    expected = [0.0, PEAK / 2, PEAK, PEAK / 2, 0.0, 0.0]
    np.testing.assert_allclose([float(schedule(s)) for s in steps], expected, rtol=0, atol=1e-7)


def test_end_learning_rate_and_reference_batch():
    schedule = WarmupCosine(0.3, 1024, 100, 20, end_learning_rate=0.01, reference_batch=512)
    peak = 1024 / 512 * 0.3
    got = [float(schedule(s)) for s in (0, 10, 20, 60, 100, 1000)]
    np.testing.assert_allclose(got, [0, peak / 2, peak, (peak + 0.01) / 2, 0.01, 0.01],
                               rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("args", [(BASE, BATCH, TOTAL, WARMUP), (0.3, 64, 50, 0, 0.001),
                                  (0.1, 256, 7, 7), (1.0, 4096, 1, 1)])
def test_whole_curve_matches_reference_and_is_monotone(args):
    schedule = WarmupCosine(*args)
    total, warmup = args[2], args[3]
    steps = np.arange(total + 5)
    got = values(schedule, steps)  # one vectorised call: the step is a tensor
    np.testing.assert_allclose(got, [reference_lr(s, *args) for s in steps], rtol=1e-6, atol=1e-7)
    assert np.all(np.diff(got[: warmup + 1]) > 0)
    assert np.all(np.diff(got[warmup:]) <= 1e-9)
    assert got.max() == pytest.approx(schedule.peak_learning_rate, rel=1e-6)


@pytest.mark.parametrize("args", [(BASE, BATCH, TOTAL, WARMUP), (0.3, 64, 50, 0, 0.001), (0.1, 256, 7, 7)])
def test_host_value_is_the_schedule_in_numpy(args):
    """host_value (the TensorBoard callback's learning rate, no XLA compile on JAX) is __call__'s
    float32 formula: equal up to float32 rounding."""
    schedule = WarmupCosine(*args)
    steps = np.arange(args[2] + 5)
    host = [schedule.host_value(int(s)) for s in steps]
    assert all(isinstance(v, float) for v in host)
    np.testing.assert_allclose(host, values(schedule, steps), rtol=1e-6, atol=1e-9)


def test_integer_and_float_tensor_steps_agree():
    schedule = WarmupCosine(BASE, BATCH, TOTAL, WARMUP)
    steps = np.arange(0, TOTAL + 3)
    np.testing.assert_allclose(values(schedule, steps.astype("int64")),
                               values(schedule, steps.astype("float32")), rtol=0, atol=0)


@pytest.mark.parametrize("kwargs, quoted", [
    (dict(total_steps=0), "total_steps=0"), (dict(warmup_steps=-1), "warmup_steps=-1"),
    (dict(warmup_steps=200), "warmup_steps=200"), (dict(batch_size=0), "batch_size=0"),
    (dict(base_learning_rate=-0.1), "-0.1"), (dict(total_steps=10.5), "10.5"),
    (dict(end_learning_rate=-1.0), "-1.0"), (dict(reference_batch=0), "reference_batch=0"),
])
def test_invalid_arguments_raise(kwargs, quoted):
    args = dict(base_learning_rate=BASE, batch_size=BATCH, total_steps=TOTAL, warmup_steps=WARMUP)
    args.update(kwargs)
    with pytest.raises(ValueError) as err:
        WarmupCosine(**args)
    assert quoted in str(err.value)


def test_config_round_trip_and_serialization():
    schedule = WarmupCosine(BASE, BATCH, TOTAL, WARMUP, end_learning_rate=1e-4,
                            reference_batch=128)
    config = schedule.get_config()
    restored = WarmupCosine.from_config(copy.deepcopy(config))
    assert restored.get_config() == config
    serialized = keras.optimizers.schedules.serialize(schedule)
    assert serialized["registered_name"] == "uniclr_tf>WarmupCosine"
    again = keras.optimizers.schedules.deserialize(serialized)
    assert isinstance(again, WarmupCosine) and again.get_config() == config
    steps = np.arange(TOTAL + 2)
    np.testing.assert_array_equal(values(again, steps), values(schedule, steps))


def test_inside_a_compiled_optimizer():
    """optimizer.learning_rate reads the schedule at optimizer.iterations, also after fit()."""
    schedule = WarmupCosine(0.4, 8, 6, 2)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=schedule, momentum=0.9),
                  loss="mse")
    optimizer = model.optimizer
    assert float(optimizer.learning_rate) == 0.0
    model.fit(np.ones((24, 3), "float32"), np.zeros((24, 1), "float32"), batch_size=8, epochs=1,
              verbose=0)
    assert int(optimizer.iterations) == 3
    assert float(optimizer.learning_rate) == pytest.approx(reference_lr(3, 0.4, 8, 6, 2), rel=1e-6)
    for step in (1, 2, 4, 6, 9):
        optimizer.iterations.assign(step)
        assert float(optimizer.learning_rate) == pytest.approx(
            reference_lr(step, 0.4, 8, 6, 2), rel=1e-6, abs=1e-8)


def test_schedule_on_jax_under_jit(run_python):
    out = run_python("""
        import json
        import jax, keras, numpy as np
        from uniclr_tf.training.schedules import WarmupCosine, momentum_schedule
        schedule = WarmupCosine(0.05, 512, 110, 10)
        steps = jax.numpy.arange(120, dtype="int32")
        lr = jax.jit(schedule)(steps)
        tau = jax.jit(lambda s: momentum_schedule(s, 110, 0.996))(steps)
        print(json.dumps({"backend": keras.backend.backend(), "lr": np.asarray(lr).tolist(),
                          "tau": np.asarray(tau).tolist()}))
    """, backend="jax")
    assert out["backend"] == "jax"
    np.testing.assert_allclose(out["lr"], [reference_lr(s, 0.05, 512, 110, 10) for s in range(120)],
                               rtol=1e-6, atol=1e-7)
    tau_ref = [1 - 0.004 * (math.cos(math.pi * min(s, 110) / 110) + 1) / 2 for s in range(120)]
    np.testing.assert_allclose(out["tau"], tau_ref, rtol=0, atol=1e-7)


# --- momentum_schedule ---------------------------------------------------------------------

@pytest.mark.parametrize("base", [0.99, 0.996, 0.0])
def test_momentum_schedule_endpoints_and_monotone(base):
    total = 1000
    assert float(momentum_schedule(0, total, base)) == pytest.approx(base, abs=1e-7)
    assert float(momentum_schedule(total // 2, total, base)) == pytest.approx((1 + base) / 2,
                                                                                abs=1e-7)
    assert float(momentum_schedule(total, total, base)) == pytest.approx(1.0, abs=1e-7)
    assert float(momentum_schedule(3 * total // 2, total, base)) == pytest.approx(1.0, abs=1e-7)
    curve = keras.ops.convert_to_numpy(momentum_schedule(np.arange(total + 1), total, base))
    assert np.all(np.diff(curve) >= 0) and np.all(np.diff(curve[::50]) > 0)  # float32 near 1
    expected = 1 - (1 - base) * (np.cos(np.pi * np.arange(total + 1) / total) + 1) / 2
    np.testing.assert_allclose(curve, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("kwargs, quoted", [
    (dict(total_steps=0), "total_steps=0"), (dict(base=1.5), "base=1.5"),
    (dict(base=-0.1), "base=-0.1"),
])
def test_momentum_schedule_invalid_arguments(kwargs, quoted):
    args = dict(step=0, total_steps=10, base=0.99)
    args.update(kwargs)
    with pytest.raises(ValueError) as err:
        momentum_schedule(**args)
    assert quoted in str(err.value)
