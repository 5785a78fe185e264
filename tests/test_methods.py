"""Registry-driven tests: every registered method, with no per-method test code.

For each ``--method`` in :data:`uniclr_tf.methods.REGISTRY` (a new method is picked up as soon as
it is registered):

* declarations are complete (family, paper, terms, heads, target, views, flagfile, README row);
* options that the method does not take are refused, naming the flag;
* one subprocess per backend trains it two steps from the same saved weights: TF compiled with XLA
  and JAX give the same losses and terms (the eager / graph / XLA equality of the TF step is
  tested once, for the model, in ``tests/test_distribute.py``);
* its stop-gradient / EMA targets receive no gradient (and a "same" target does);
* its loss and gradients are finite on a collapsed batch (every image identical);
* the train CLI's ``run`` trains it on a slice of Fashion-MNIST, with its terms in the progress bar,
  ``history.json``, ``log.csv``, TensorBoard and ``curves.png``, and the run exports to a SavedModel
  that reproduces the Keras encoder + projector.

Two-replica parity of every method is in ``tests/test_distribute.py``.
"""

import json
import re

import numpy as np
import pytest

from tests.conftest import HANDOFF, REPO_ROOT, run_python_snippets
from uniclr_tf import methods
from uniclr_tf.config.train_config import TrainConfig

NAMES = methods.names()

# A tiny network per method, built the way train.build_model does (heads from the method).
BUILD = r"""
import json, os, numpy as np, keras
from uniclr_tf import methods
from uniclr_tf.nets import encoders
from uniclr_tf.nets import heads
from uniclr_tf.nets.model import UniCLR

def build(name):
    keras.utils.set_random_seed(1)
    cls = methods.get_class(name)
    options = dict(queue_size=24) if "queue_size" in cls.defaults else dict()
    method = cls(**options)
    enc = encoders.build_encoder("tiny", (16, 16, 1), width=4)
    proj = method.build_projector(16, (32, 8))
    pred = heads.predictor(8, 16) if method.uses_predictor else None
    return UniCLR(enc, proj, pred, method=method, ema_total_steps=10, num_classes=3)

rng = np.random.default_rng(0)
v1 = rng.normal(size=(16, 16, 16, 1)).astype("float32")
VIEWS = (v1, (v1 + 0.3 * rng.normal(size=v1.shape)).astype("float32"))
LABELS = np.arange(16) % 3

def two_steps(name, path, **compile_kwargs):
    model = build(name)
    model.load_weights(path)
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), **compile_kwargs)
    logs = [model.train_on_batch(VIEWS, LABELS, return_dict=True) for _ in range(2)]
    return [{k: float(v) for k, v in step.items()} for step in logs]
"""

TF_RUN = BUILD + HANDOFF + r"""
import tensorflow as tf
# The initial weights of every method (Keras's TF initialisers), for this run and the JAX one.
for name in __NAMES__:
    publish(build(name).save_weights, os.path.join(__TMP__, name + ".weights.h5"))
OUT = {}
for name in __NAMES__:
    path = os.path.join(__TMP__, name + ".weights.h5")
    xla = two_steps(name, path, jit_compile=True)
    model = build(name)
    # Targets: no gradient may flow into a stop-gradient or EMA target; a "same" target does carry one.
    with tf.GradientTape(persistent=True) as tape:
        _, _, online, target = model._embed(list(VIEWS), training=True)
        # A random projection: the projector's last BN makes plain sums (and sums of squares) constant.
        # (its width is the method's embedding: DINO's head ends with K outputs)
        weights = np.random.default_rng(1).normal(size=(16, int(target[0].shape[-1]))).astype("float32")
        target_sum = tf.add_n([tf.reduce_sum(tf.cast(t, "float32") * weights) for t in target])
    grads = tape.gradient(target_sum, model.trainable_variables)
    target_grad = sum(float(tf.reduce_sum(tf.abs(g))) for g in grads if g is not None)
    # A collapsed batch: every image identical.
    same = np.ones((16, 16, 16, 1), "float32")
    with tf.GradientTape() as tape:
        loss, logs = model.compute_objective((same, same), training=True)
    grads = tape.gradient(loss, model.trainable_variables)
    collapsed = {"loss": float(loss), "finite_grads": all(bool(np.all(np.isfinite(g))) for g in grads if g is not None),
                 "terms": {k: float(v) for k, v in logs.items()}}
    OUT[name] = {"xla": xla, "target_grad": target_grad, "target_kind": model.method.target_kind,
                 "collapsed": collapsed}
print(json.dumps(OUT))
"""

JAX_RUN = BUILD + HANDOFF + r"""
OUT = {}
for name in __NAMES__:
    path = os.path.join(__TMP__, name + ".weights.h5")
    wait_for(path)  # written by the TF run, which starts at the same time
    OUT[name] = two_steps(name, path)
print(json.dumps(OUT))
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The TF runs (half of the methods in each of two processes) and the JAX run, all at once: the
    TF side traces and compiles ~2 s a method more than the JAX side, so one TF process for every
    method ended 25 s after the JAX one (77 s in all on the 2-core machine; split: 64 s)."""
    tmp = str(tmp_path_factory.mktemp("methods"))
    fill = lambda code, names: code.replace("__NAMES__", repr(names)).replace("__TMP__", repr(tmp))
    tf_a, tf_b, jax_out = run_python_snippets((fill(TF_RUN, NAMES[::2]), "tensorflow"),
                                              (fill(TF_RUN, NAMES[1::2]), "tensorflow"),
                                              (fill(JAX_RUN, NAMES), "jax"))
    return {**tf_a, **tf_b}, jax_out


@pytest.mark.parametrize("name", NAMES)
def test_method_declares_everything(name):
    from uniclr_tf.augment import RECIPES
    cls = methods.get_class(name)
    assert cls.name == name
    assert cls.family in ("UniCLR", "contrastive", "asymmetric", "whitening", "consistency")
    assert re.search(r"arXiv \d{4}\.\d{4,5}", cls.paper), cls.paper
    assert cls.terms and len(set(cls.terms)) == len(cls.terms)
    assert cls.target in ("same", "stop_gradient", "ema") and cls.predictor in ("never", "optional", "always")
    assert cls.views in RECIPES
    for option in cls.defaults:
        assert cls.spec(option).help, option
    # Its flagfile trains this method, and the README's method table names it with the flagfile.
    from absl import flags
    from uniclr_tf.training import cli as train
    fv = flags.FlagValues()
    train.define_flags(fv)
    fv(["train", f"--flagfile={REPO_ROOT / 'configs' / 'methods' / (name + '.flags')}"])
    assert train.config_from_flags(fv).method == name
    readme = (REPO_ROOT / "README.md").read_text()
    assert re.search(rf"^\| `{name}` .*configs/methods/{name}\.flags", readme, re.M), name


@pytest.mark.parametrize("name", NAMES)
def test_options_the_method_does_not_take_are_refused(name):
    takes = methods.get(name).defaults
    foreign = sorted(set(methods.option_specs()) - set(takes))
    assert foreign
    for option in foreign:
        spec = methods.option_specs()[option]
        value = {bool: True, int: 3, float: 0.5, str: "cholesky"}[spec.kind]
        with pytest.raises(ValueError, match=f"--{option}.*does not apply to --method={name}"):
            TrainConfig.make(method=name, **{option: value})
    # The method's own options are accepted and resolved; unset ones take its defaults.
    resolved = TrainConfig.make(method=name).resolved()
    assert resolved.options == methods.create(name).options


def test_the_set_ups_measured_to_collapse_are_warned_of():
    """SimAffinity + EMA target, no predictor, γ on every pair, and SimCLR + γ collapsed in the study
    (docs/results/reproduction.md): they, and only they, are warned of."""
    warned = methods.create("simaffinity", ema_momentum=0.99, symmetric_pairs="all").setup_warnings()
    assert len(warned) == 1 and "--symmetric_pairs=all" in warned[0] and "--predictor" in warned[0]
    for options in ({}, {"ema_momentum": 0.99}, {"ema_momentum": 0.99, "predictor": True, "symmetric_pairs": "all"},
                    {"ema_momentum": 0.99, "symmetric_loss_weight": 0.0, "symmetric_pairs": "all"},
                    {"symmetric_loss_weight": 0.5}):
        assert methods.create("simaffinity", **options).setup_warnings() == [], options
    simclr = methods.create("simclr", symmetric_loss_weight=0.01).setup_warnings()
    assert len(simclr) == 1 and "collapse detector" in simclr[0]
    assert all(methods.create(n).setup_warnings() == [] for n in NAMES)  # each method's defaults


@pytest.mark.parametrize("name", NAMES)
def test_tf_with_xla_and_jax_train_the_same(name, trained):
    tf_out, jax_out = trained
    xla, jax = tf_out[name]["xla"], jax_out[name]
    terms = set(methods.get(name).terms)
    for step in range(2):
        assert terms <= set(xla[step]), (terms, xla[step])
        for key in sorted(terms | {"objective_loss", "loss", "embedding_std"}):
            assert np.isfinite(xla[step][key]), (key, xla[step])
            np.testing.assert_allclose(jax[step][key], xla[step][key], rtol=2e-4, atol=2e-5, err_msg=key)
    # The second step saw the first one's update: the losses differ (the step really trained).
    assert xla[0]["objective_loss"] != xla[1]["objective_loss"]


@pytest.mark.parametrize("name", NAMES)
def test_targets_get_no_gradient_unless_they_are_the_online_network(name, trained):
    out = trained[0][name]
    if out["target_kind"] == "same":
        assert out["target_grad"] > 0
    else:
        assert out["target_grad"] == 0.0


@pytest.mark.parametrize("name", NAMES)
def test_loss_is_finite_on_a_collapsed_batch(name, trained):
    collapsed = trained[0][name]["collapsed"]
    assert np.isfinite(collapsed["loss"]) and collapsed["finite_grads"], collapsed
    assert all(np.isfinite(v) for v in collapsed["terms"].values()), collapsed


CLI_RUN = r"""
import json, os, sys
from uniclr_tf.serving import export
from uniclr_tf.training import cli as train
REPORT = {}
from uniclr_tf.config.train_config import TrainConfig
for name in __NAMES__:
    cfg = TrainConfig.make(method=name, encoder="tiny", encoder_width=4, projector_dims=(32, 16), predictor_hidden=16,
                           batch_size=32, epochs=2, steps_per_epoch=2, warmup_epochs=0, max_examples=256,
                           knn_every=2, knn_max_train=256, run_dir=__TMP__, run_name=name, pictures=False,
                           **({"queue_size": 64} if name in ("moco_v2", "co2") else {}))
    run_dir, _ = train.run(cfg)
    # Export: the SavedModel (inference-mode BN) must reproduce the Keras encoder + projector.
    out = os.path.join(run_dir, "export")
    export.export_run(run_dir, out)
    check = export.check_export(out, run_dir)
    REPORT[name] = {"ok": check["ok"], "max_abs_diff": check["max_abs_diff"]}
print(json.dumps(REPORT))
"""


def test_cli_trains_and_exports_every_method(tmp_path):
    """The train CLI's ``run`` for every method, then ``export`` of each run folder, checked against
    the Keras models, on real Fashion-MNIST images: half of the methods in each of two processes
    running at the same time (each on one core): 73 s -> 40 s."""
    from tests.conftest import PythonJob
    halves = NAMES[::2], NAMES[1::2]
    jobs = [PythonJob(CLI_RUN.replace("__NAMES__", repr(half)).replace("__TMP__", repr(str(tmp_path))),
                      env={"TF_CPP_MIN_LOG_LEVEL": "3"}, timeout=900) for half in halves]
    try:
        exports = {**jobs[0].result(), **jobs[1].result()}
    finally:
        for job in jobs:
            job.kill()
    stdout = {name: job.stdout for half, job in zip(halves, jobs) for name in half}
    assert sorted(exports) == sorted(NAMES)
    for name in NAMES:
        assert exports[name]["ok"], (name, exports[name])
        run = tmp_path / name
        terms = methods.get(name).terms
        history = json.loads((run / "history.json").read_text())
        assert len(history) == 2
        for term in terms:
            assert all(np.isfinite(e[term]) for e in history), (name, term, history)
            assert re.search(rf"{term}: -?[\d.]+", stdout[name]), (name, term)  # the progress bar
        header = (run / "log.csv").read_text().splitlines()[0].split(",")
        assert set(terms) <= set(header), (name, header)
        assert (run / "curves.png").stat().st_size > 10_000
        config = json.loads((run / "config.json").read_text())
        assert config["method"] == name and config["method_options"] == methods.create(
            name, **({"queue_size": 64} if name in ("moco_v2", "co2") else {})).options
        tags = _tensorboard_tags(run / "tb")
        assert {f"epoch_{t}" for t in terms} <= tags, (name, tags)
        metrics = json.loads((run / "metrics.json").read_text())
        assert metrics["method"] == name and 0 < metrics["knn_top1"] <= 1


def _tensorboard_tags(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    tags = set()
    for path in folder.rglob("*tfevents*"):
        acc = EventAccumulator(str(path))
        acc.Reload()
        tags |= set(acc.Tags().get("scalars", [])) | set(acc.Tags().get("tensors", []))
    return tags


# ----------------------------------------------------------------------------------------------
# Method-specific schedules and state (SwAV, DINO): what the registry-driven tests cannot see
# ----------------------------------------------------------------------------------------------

def _tiny_model(name, steps_per_epoch, **options):
    import keras
    from uniclr_tf.nets import encoders
    from uniclr_tf.nets.model import UniCLR
    keras.utils.set_random_seed(3)
    method = methods.create(name, **options)
    enc = encoders.build_encoder("tiny", (16, 16, 1), width=4)
    model = UniCLR(enc, method.build_projector(16, (32, 8)), None, method=method, ema_total_steps=10,
                   steps_per_epoch=steps_per_epoch)
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9))
    rng = np.random.default_rng(0)
    v = rng.normal(size=(16, 16, 16, 1)).astype("float32")
    return model, (v, (v + 0.3 * rng.normal(size=v.shape)).astype("float32"), v[:, :8, :8])


def test_swav_prototypes_are_frozen_for_the_first_epoch_then_train():
    model, views = _tiny_model("swav", steps_per_epoch=2, freeze_prototypes_epochs=1.0)
    protos = model.method_state["prototypes"]
    assert protos.trainable and any(v is protos for v in model.trainable_variables)
    before = [np.array(protos.numpy())]
    for _ in range(3):
        model.train_on_batch(views)     # two global views and a local crop
        before.append(np.array(protos.numpy()))
    assert np.array_equal(before[0], before[1]) and np.array_equal(before[1], before[2])   # epoch 0: frozen
    assert np.abs(before[3] - before[2]).max() > 1e-6                                     # epoch 1: trained
    # the codes come from the global views only: 2 ordered global pairs + the local crop against each
    assert model.view_pairs(3) == [(0, 1), (1, 0), (2, 0), (2, 1)]


def test_dino_teacher_temperature_warm_up_and_centre():
    from uniclr_tf.methods.dino import teacher_temperature
    # DINO's linspace(0.04, 0.07, 4) per epoch, then 0.07; 5 steps an epoch
    want = list(np.linspace(0.04, 0.07, 4)) + [0.07, 0.07]
    got = [float(teacher_temperature(e * 5 + 3, 5, 0.04, 0.07, 4)) for e in range(6)]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert teacher_temperature(7, None, 0.04, 0.07, 4) == 0.07          # no steps_per_epoch: the final value
    model, views = _tiny_model("dino", steps_per_epoch=1, center_momentum=0.9, num_prototypes=12)
    assert model.projector.output_shape[-1] == 12 and model.target_projector is not None
    _, _, _, target = model._embed(list(views), training=True)
    model.train_on_batch(views)
    teacher_mean = np.mean(np.concatenate([np.asarray(t) for t in target]), axis=0)
    np.testing.assert_allclose(np.asarray(model.method_state["center"]), 0.1 * teacher_mean, rtol=1e-4, atol=1e-6)
    # the head's last layer is weight-normalised: every output unit's weight vector has norm 1
    layer = model.projector.get_layer("projector_prototypes")
    kernel = np.asarray(layer.kernel)
    x = np.random.default_rng(1).normal(size=(4, kernel.shape[0])).astype("float32")
    np.testing.assert_allclose(np.asarray(layer(x)), x @ (kernel / np.linalg.norm(kernel, axis=0)), rtol=1e-5, atol=1e-6)


def test_l2_first_reaches_simwhitening_and_simtrace_and_only_them():
    """``--l2_first`` (the authors' code) is the objective's ``l2_first``: the method's loss with it is
    the objective's with it, not the default's; methods without whitening refuse it."""
    from uniclr_tf import objectives
    rng = np.random.default_rng(0)
    z1 = (rng.normal(size=(32, 8)) * rng.uniform(0.5, 3, 8) + 0.3).astype("float32")
    z2 = (z1 + 0.5 * rng.normal(size=(32, 8))).astype("float32")
    simwhitening = lambda a, b, **kw: objectives.sim_whitening_loss(a, b, gamma=0.0, **kw)  # pair_loss's γ: 0
    for name, loss in (("simtrace", objectives.sim_trace_loss), ("simwhitening", simwhitening)):
        assert methods.create(name).options["l2_first"] is False  # the paper
        got = float(methods.create(name, l2_first=True).pair_loss(z1, z2, None)[0])
        assert got == pytest.approx(float(loss(z1, z2, l2_first=True)), rel=1e-6), name
        assert got != pytest.approx(float(loss(z1, z2)), rel=1e-4), name
    with pytest.raises(ValueError, match="--l2_first.*does not apply to --method=simaffinity"):
        TrainConfig.make(method="simaffinity", l2_first=True)


def test_an_option_of_the_wrong_type_is_named_with_the_type_it_needs():
    """A string for a number (a value read from a text file, say) is refused naming the option and the
    type, not with Python's comparison error; NumPy scalars and whole floats for ints are accepted."""
    with pytest.raises(ValueError, match=r"--temperature: expected a number > 0 \(a float\) for --method=simclr; "
                                         r"received '0.2' \(str\)"):
        methods.create("simclr", temperature="0.2")
    with pytest.raises(ValueError, match=r"--predictor: expected a bool for --method=simtrace; received 'yes'"):
        methods.create("simtrace", predictor="yes")
    assert methods.create("simclr", temperature=np.float32(0.5)).options["temperature"] == 0.5
    groups = methods.create("simtrace", whitening_groups=2.0).options["whitening_groups"]
    assert groups == 2 and type(groups) is int


def test_wmse_eps_is_a_shrinkage_in_0_1_where_the_other_whitenings_take_any_ridge():
    """--eps is one flag: the Cholesky ridge of SimWhitening / SimTrace (any ε > 0) and W-MSE's shrinkage
    (1 − ε)·Σ + ε·I, refused up front outside [0, 1) rather than when the loss is first traced."""
    with pytest.raises(ValueError, match=r"--eps: expected a number in \[0, 1\) \(W-MSE's shrinkage\) for "
                                         r"--method=wmse; received 1.5"):
        methods.create("wmse", eps=1.5)
    assert methods.create("wmse", eps=0.0).options["eps"] == 0.0
    assert methods.create("simtrace", eps=1.5).options["eps"] == 1.5
    with pytest.raises(ValueError, match=r"--eps: expected a number > 0"):
        methods.create("simtrace", eps=0.0)
