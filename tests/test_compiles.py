"""What XLA compiles during a JAX training run, and when.

Outside a jitted function, every ``keras.ops`` call on JAX is an XLA compilation of its own the
first time it meets a shape (tens to hundreds of ms each on a GPU, all in a run's first epoch).
The kNN monitor (kNN votes, effective rank), Keras's metric results, its TensorBoard callback's
learning rate and the optimizer's build used to make ~80 such compiles during the fit of the
quickstart run, and the pictures ~70 after it; each is now one compiled program (or NumPy). This
test runs a tiny train run on JAX with every compilation logged against the phase of the run it
happened in.
"""

import pytest

from tests.conftest import COMPILE_LOG

# Every program the fit of this run may compile (each once, in epoch 1), by its function's name:
ALLOWED_IN_FIT = {
    "train_step",       # Keras's jitted train step (uniclr_tf.training.steps.jax_step)
    "features",         # the kNN monitor's encoder on a batch (evaluation._device_feature_batches)
    "knn_eval_device",  # the monitor's kNN votes + effective rank (evaluation._device_knn_program)
    "pack",             # the backup's device copy of the variables (backup.Packed)
    "zeros",            # the loss trackers' zeros before each epoch (UniCLR.reset_metrics)
}
# After fit: the final kNN reuses the monitor's programs; the pictures compile their augmentation.
ALLOWED_AFTER_FIT = {
    "augment_views",         # views.png's augmenter call (pictures._augment)
    "convert_element_type",  # Keras's save_weights makes a reference Optimizer(1.0): its learning rate, a
}                            # Python float made a float32 array (the build's initialisers run in one program)
# Not in this run: on the host path of the kNN (streamed data, keras.distribution set) the monitor
# compiles preprocess_batch, predict_step, similarity_top_k and effective_rank_tensor instead.

SNIPPET = COMPILE_LOG + r"""
import json
import keras
from absl import flags
from uniclr_tf.training import cli as train

fit, callbacks = keras.Model.fit, keras.callbacks.CallbackList
begin, end = callbacks.on_epoch_begin, callbacks.on_epoch_end

def logged_fit(self, *args, **kwargs):
    phase[0] = "fit"
    try:
        return fit(self, *args, **kwargs)
    finally:
        phase[0] = "after fit"

def on_epoch_begin(self, epoch, logs=None):
    phase[0] = f"epoch {epoch + 1}"
    return begin(self, epoch, logs)

def on_epoch_end(self, epoch, logs=None):
    phase[0] = f"epoch {epoch + 1} end"
    return end(self, epoch, logs)

keras.Model.fit = logged_fit
callbacks.on_epoch_begin, callbacks.on_epoch_end = on_epoch_begin, on_epoch_end

fv = flags.FlagValues()
train.define_flags(fv)
fv(["train", "--flagfile=configs/quickstart.flags", "--method=simaffinity", "--encoder_width=8",
    "--projector_dims=64,32", "--batch_size=64", "--max_examples=512", "--knn_max_train=512", "--epochs=3",
    "--steps_per_epoch=2", "--knn_every=1", "--augment_on=device", "--compilation_cache_dir=",
    "--run_dir=" + RUN_DIR, "--run_name=run"])
_, metrics = train.run(train.config_from_flags(fv))
print(json.dumps({"compiles": compiles, "status": metrics["status"]}))
"""


@pytest.fixture(scope="module")
def compiles(tmp_path_factory):
    """``[(phase, name)]`` of every XLA compilation of the run, in order; phases are ``build``
    (model, optimizer, raw-pixel kNN), ``fit`` (before epoch 1), ``epoch N``, ``epoch N end``
    (the callbacks) and ``after fit`` (the final kNN, the pictures)."""
    from tests.conftest import run_python_snippet
    run_dir = tmp_path_factory.mktemp("compiles")
    out = run_python_snippet(SNIPPET.replace("RUN_DIR", repr(str(run_dir))), backend="jax", timeout=300)
    assert out["status"] == "finished"
    return [tuple(c) for c in out["compiles"]]


def test_the_run_compiles_the_train_step_in_epoch_1(compiles):
    assert ("epoch 1", "train_step") in compiles, compiles  # the log is read at all


def test_nothing_compiles_after_the_first_epoch(compiles):
    """The steady state compiles nothing: epochs 2 and 3 (their kNN evaluations, TensorBoard
    scalars and backups too) reuse epoch 1's programs; after fit the final kNN and the pictures'
    features too."""
    late = [c for c in compiles if c[0] not in ("build", "fit", "epoch 1", "epoch 1 end")
            and not (c[0] == "after fit" and c[1] in ALLOWED_AFTER_FIT)]
    assert not late, late


def test_the_fit_compiles_whole_programs_only(compiles):
    """During fit, only the named programs compile, each once: no op-by-op compile of a single
    primitive (multiply, _reduce_sum, eigh, cos, ...) outside a jitted function."""
    in_fit = [name for phase, name in compiles if phase == "fit" or phase.startswith("epoch")]
    unexpected = sorted(set(in_fit) - ALLOWED_IN_FIT)
    assert not unexpected, f"op-by-op or unexpected compiles during fit: {unexpected} (all: {in_fit})"
    assert sorted(in_fit) == sorted(set(in_fit)), in_fit  # each once


STATE_LAYOUTS = r"""
import json
import numpy as np
import jax
import keras
from jax.experimental.layout import Format, Layout
from uniclr_tf import methods
from uniclr_tf.nets import encoders, heads
from uniclr_tf.nets.model import UniCLR
from uniclr_tf.training.steps import jax_step

def model(layout):
    keras.utils.set_random_seed(1)
    method = methods.create("byol")  # an EMA target and a predictor: every kind of state
    m = UniCLR(encoders.build_encoder("tiny", (16, 16, 1), width=4), method.build_projector(16, (32, 8)),
               heads.predictor(8, 16), method=method, ema_total_steps=8)
    m.state_layout = layout
    m.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9))
    return m

rng = np.random.default_rng(0)
v1 = rng.normal(size=(32, 16, 16, 1)).astype("float32")
VIEWS = (v1, (v1 + 0.3 * rng.normal(size=v1.shape)).astype("float32"))
out = {"auto_on_cpu": jax_step.lays_out_state("auto")}
runs = {}
for layout in ("default", "xla"):
    m = model(layout)
    loss = m.fit(VIEWS, batch_size=16, epochs=2, verbose=0, shuffle=False).history["objective_loss"]
    runs[layout] = (loss, [np.asarray(w) for w in m.get_weights()])
out["losses"] = [runs[k][0] for k in runs]
out["fit_diff"] = max(float(np.max(np.abs(a - b))) for a, b in zip(runs["default"][1], runs["xla"][1]))

# A state in other layouts (each kernel's axes reversed) is moved into the executable's, then kept there.
m = model("xla")
m.optimizer.build(m.trainable_variables)
state = tuple([v.value for v in vs] for vs in (m.trainable_variables, m.non_trainable_variables,
                                                m.optimizer.variables, m.metrics_variables))
def reversed_layout(x):
    if x.ndim < 2:
        return x
    return jax.device_put(x, Format(Layout(major_to_minor=tuple(reversed(range(x.ndim)))), x.sharding))
odd = jax.tree_util.tree_map(reversed_layout, state)
out["odd_layouts"] = sum(a.format.layout != b.format.layout for a, b in zip(jax.tree_util.tree_leaves(odd),
                                                                         jax.tree_util.tree_leaves(state)))
step = jax_step.LaidOutStep(m.train_step)
plain = jax.jit(m.train_step)
data = tuple(keras.ops.convert_to_tensor(v[:16]) for v in VIEWS)
logs_a, new_a = step(odd, data)
logs_b, new_b = plain(state, data)
_, formats = step.executables[next(iter(step.executables))]
out["kept_layouts"] = all(a.format.layout == f.layout for a, f in zip(jax.tree_util.tree_leaves(new_a),
                                                                        jax.tree_util.tree_leaves(formats)))
out["step_diff"] = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                       for a, b in zip(jax.tree_util.tree_leaves(new_a), jax.tree_util.tree_leaves(new_b)))
step(new_a, data)  # its own state back: already in its layouts, and no second compile
out["compiles"] = step.compiles
out["loss_diff"] = abs(float(logs_a["loss"]) - float(logs_b["loss"]))
try:
    jax_step.lays_out_state("sideways")
except ValueError as e:
    out["bad"] = str(e)
print(json.dumps(out))
"""


def test_the_state_in_xla_layouts_trains_as_in_keras_layouts(run_python):
    """--state_layout=xla (jax_step.LaidOutStep): fit gives the weights of Keras' own step; a state handed in
    other layouts (every kernel's axes reversed) is moved into the executable's and kept there from step to
    step, with the same update; one compile for one shape of data. (On the CPU XLA keeps row-major layouts,
    so auto leaves Keras' step in place; on a GPU it keeps convolution kernels as cuDNN reads them.)"""
    out = run_python(STATE_LAYOUTS, backend="jax")
    assert out["auto_on_cpu"] is False
    assert out["losses"][0] == out["losses"][1] and out["fit_diff"] == 0.0, out
    assert out["odd_layouts"] >= 4 and out["kept_layouts"], out
    assert out["step_diff"] < 1e-6 and out["loss_diff"] < 1e-6, out
    assert out["compiles"] == 1, out
    assert "state_layout" in out["bad"] and "sideways" in out["bad"]
