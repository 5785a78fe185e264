"""The public Python API: its names, Keras' conventions on both backends, the train CLI as its client,
the CLI's first lines, and the API reference.

The two backends' checks run at once, one subprocess each (a TF and a JAX import, tracing: one core
each); the TF one saves a model that the JAX one loads in a process that imported uniclr_tf before
Keras.
"""

import contextlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import HANDOFF, REPO_ROOT, PythonJob, run_python_snippet, xla_flags

#: The public surface. A change here is a change of the API: deliberate, documented in docs/api.md.
PUBLIC_NAMES = [
    "BackupAndResume",
    "CollapseDetector",
    "EvalPreprocess",
    "KNNMonitor",
    "LARS",
    "RECIPES",
    "UniCLR",
    "ViewAugmenter",
    "ViewRecipe",
    "WarmupCosine",
    "build_encoder",
    "export_saved_model",
    "knn_eval",
    "linear_evaluation",
    "load_saved_model",
    "methods",
    "objectives",
]


def test_the_public_names_are_pinned():
    import uniclr_tf
    assert uniclr_tf.__all__ == PUBLIC_NAMES
    assert [name for name in dir(uniclr_tf) if not name.startswith("_")] == PUBLIC_NAMES


IMPORT = r"""
import json, sys
import uniclr_tf
heavy = sorted(m for m in ("tensorflow", "jax", "keras") if m in sys.modules)
undocumented = []
for name in uniclr_tf.__all__:
    value = getattr(uniclr_tf, name)
    doc = value.__doc__ if name != "RECIPES" else sys.modules["uniclr_tf.augment.views"].__doc__
    if not doc or ">>>" not in doc:
        undocumented.append(name)
print(json.dumps({"heavy_on_import": heavy, "undocumented": undocumented,
                  "version": uniclr_tf.__version__}))
"""


def test_import_is_cheap_and_every_public_name_shows_an_example():
    out = run_python_snippet(IMPORT)
    assert out["heavy_on_import"] == []  # TensorFlow, JAX and Keras come with the first name used
    assert out["undocumented"] == []
    assert out["version"]


def test_wrong_use_raises_one_error_naming_the_argument():
    import keras

    import uniclr_tf
    from uniclr_tf.nets import heads
    encoder = uniclr_tf.build_encoder("tiny", (16, 16, 1), width=4)
    unpooled = keras.Model(encoder.input, encoder.get_layer("relu3").output)
    cases = [
        (lambda: uniclr_tf.UniCLR(unpooled), ValueError, "encoder: expected pooled 2-D features"),
        (lambda: uniclr_tf.UniCLR(lambda x: x), TypeError, "encoder: expected a keras.Model"),
        (lambda: uniclr_tf.UniCLR(encoder, method="simclr", options={"queue_size": 8}), TypeError,
         "'simclr' does not take the option 'queue_size'"),
        (lambda: uniclr_tf.UniCLR(encoder, method="simclr", predictor=heads.predictor(256)),
         ValueError, "predictor: method 'simclr' takes no predictor"),
        (lambda: uniclr_tf.UniCLR(encoder, method="simclr", options={"temperature": -1.0}), ValueError,
         "temperature: expected a number > 0"),
        (lambda: uniclr_tf.UniCLR(encoder, method="nope"), ValueError, "method: expected one of"),
        (lambda: uniclr_tf.UniCLR(encoder, projector_dims=(0,)), ValueError, "projector_dims"),
        (lambda: uniclr_tf.UniCLR(encoder, augmenter=uniclr_tf.ViewAugmenter(16, num_global=3)), ValueError,
         "augmenter: it makes 3 global views"),
        (lambda: uniclr_tf.methods.get("byol", temperature=0.1), TypeError, "'byol' does not take the option"),
    ]
    for make, error, message in cases:
        with pytest.raises(error, match=message):
            make()


# Each backend: fit on uint8 arrays, a tf.data.Dataset and a PyDataset; save, reload, and the reloaded
# model continues exactly as the saved one would; the backbone is a plain Keras model; then the
# backend's data parallelism as a Keras user writes it (TF: MirroredStrategy over 2 logical CPUs;
# JAX: keras.distribution.DataParallel over 2 host devices).
KERAS_CONVENTIONS = HANDOFF + r"""
import json, os, sys
SAVED = {saved!r}
if os.environ["KERAS_BACKEND"] == "jax":  # uniclr_tf before Keras: load_model must still find its classes
    import uniclr_tf
    import keras
else:
    import keras
    import tensorflow as tf
    tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                               [tf.config.LogicalDeviceConfiguration()] * 2)
    import uniclr_tf
import numpy as np
import tensorflow as tf

backend = keras.backend.backend()
rng = np.random.default_rng(0)
images = rng.integers(0, 256, (48, 16, 16, 1), dtype="uint8")
labels = np.arange(48) % 3

def build(method="byol"):
    keras.utils.set_random_seed(0)
    augmenter = uniclr_tf.ViewAugmenter.from_recipe("uniclr", (16, 16, 1), seed=1)
    model = uniclr_tf.UniCLR(uniclr_tf.build_encoder("tiny", (16, 16, 1), width=4), method=method,
                             projector_dims=(32, 16), predictor_hidden=16, augmenter=augmenter, num_classes=3)
    model.compile(optimizer=uniclr_tf.LARS(uniclr_tf.WarmupCosine(0.3, 16, 12, 2)))
    return model

class Batches(keras.utils.PyDataset):
    def __len__(self):
        return 3
    def __getitem__(self, i):
        return images[16 * i:16 * (i + 1)], labels[16 * i:16 * (i + 1)]

out = {{"backend": backend}}
model = build()
out["numpy"] = model.fit(images, labels, batch_size=16, epochs=1, shuffle=False, verbose=0).history["loss"][-1]
out["tf.data"] = model.fit(tf.data.Dataset.from_tensor_slices((images, labels)).batch(16), epochs=2,
                           initial_epoch=1, verbose=0).history["loss"][-1]
out["pydataset"] = model.fit(Batches(), epochs=3, initial_epoch=2, verbose=0).history["loss"][-1]
out["encoder"] = [type(model.encoder).__name__, list(model.encoder.output_shape)]
out["ema_total_steps"] = model.ema_total_steps  # set by each fit: to its end, 3 steps more each time

path = os.path.join(SAVED, backend + ".keras")
model.save(path)
again = keras.saving.load_model(path)
out["reloaded"] = [type(again).__name__, again.method.name, again.predictor is not None]
ahead = [model.fit(images, labels, batch_size=16, epochs=1, shuffle=False, verbose=0).history["loss"][-1]
         for model in (model, again)]
out["continued_equal"] = ahead[0] == ahead[1]
out["continued"] = ahead

if backend == "tensorflow":
    with tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
        replicated = build("simaffinity")
    os.replace(path, os.path.join(SAVED, "tensorflow.done.keras"))  # (a rename: whole or absent)
else:
    import jax
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax.devices()))
    replicated = build("simaffinity")
    wait_for(os.path.join(SAVED, "tensorflow.done.keras"))
    from_tf = keras.saving.load_model(os.path.join(SAVED, "tensorflow.done.keras"))
    out["tf_model_on_jax"] = from_tf.fit(images, labels, batch_size=16, epochs=1, verbose=0).history["loss"][-1]
out["replicated"] = replicated.fit(images, labels, batch_size=16, epochs=1, verbose=0).history["loss"][-1]

keras.distribution.set_distribution(None) if backend == "jax" else None
again = build()  # a fit that fails in its first step (3-channel images, a 1-channel model), then a good one
try:
    again.fit(np.repeat(images, 3, -1), labels, batch_size=16, epochs=1, verbose=0)
    out["bad_fit"] = "trained"
except ValueError:
    out["bad_fit"] = "refused"
start = [np.array(w) for w in again.encoder.weights]
out["after_bad_fit"] = again.fit(images, labels, batch_size=16, epochs=1, verbose=0).history["loss"][-1]
out["after_bad_fit_moved"] = any(not np.array_equal(a, np.array(b)) for a, b in zip(start, again.encoder.weights))
print(json.dumps(out))
"""


def test_keras_conventions_on_both_backends(tmp_path):
    code = KERAS_CONVENTIONS.format(saved=str(tmp_path))
    jobs = [PythonJob(code, "tensorflow"),
            # cold: this one imports the package before Keras, which a warm interpreter has done already
            PythonJob(code, "jax", env={"XLA_FLAGS": xla_flags("--xla_force_host_platform_device_count=2"),
                                        "UNICLR_TESTS_COLD": "1"})]
    try:
        tf_out, jax_out = (job.result() for job in jobs)
    finally:
        for job in jobs:
            job.kill()
    for out in (tf_out, jax_out):
        for key in ("numpy", "tf.data", "pydataset", "replicated"):
            assert np.isfinite(out[key]), (out["backend"], key)
        assert out["encoder"] == ["Functional", [None, 16]]
        assert out["ema_total_steps"] == 9
        assert out["reloaded"] == ["UniCLR", "byol", True]
        assert out["continued_equal"], out  # weights, optimizer, EMA and the views' random state restored
        # a fit refused in its first step leaves the model as usable as a plain Keras model is
        assert out["bad_fit"] == "refused" and np.isfinite(out["after_bad_fit"]) and out["after_bad_fit_moved"], out
    assert np.isfinite(jax_out["tf_model_on_jax"])


def test_the_api_and_the_cli_take_the_same_first_step(tmp_path):
    """The recipe of configs/quickstart.flags, built once by the train CLI and once through the public
    names by hand: the same first batch (the CLI's stream) gives the same first loss."""
    import keras
    from absl import flags

    import uniclr_tf
    from uniclr_tf import data
    from uniclr_tf.training import cli as train
    fv = flags.FlagValues()
    train.define_flags(fv)
    fv(["train", f"--flagfile={REPO_ROOT / 'configs' / 'quickstart.flags'}", "--method=simtrace", "--encoder=tiny",
        "--encoder_width=8", "--projector_dims=64,32", "--batch_size=64", "--max_examples=512", "--knn_max_train=512",
        "--epochs=1", "--steps_per_epoch=1", "--knn_every=0", "--nopictures", "--augment_on=device", "--seed=3",
        f"--run_dir={tmp_path}", "--run_name=cli"])
    run_dir, _ = train.run(train.config_from_flags(fv))
    with open(os.path.join(run_dir, "history.json")) as f:
        cli = json.load(f)[0]

    info = data.load_dataset("fashion_mnist", max_examples=512)
    images, labels = next(iter(data.pretrain_dataset(info, 64, None, shuffle=True, seed=3, repeat=True,
                                                     with_labels=True)))
    keras.utils.set_random_seed(3)
    augmenter = uniclr_tf.ViewAugmenter.from_recipe("uniclr", info.image_shape, mean=info.mean, std=info.std, seed=3)
    model = uniclr_tf.UniCLR(uniclr_tf.build_encoder("tiny", info.image_shape, width=8), method="simtrace",
                             projector_dims=(64, 32), augmenter=augmenter, num_classes=10)
    model.compile(optimizer=keras.optimizers.SGD(0.1))
    api = model.fit(images.numpy(), labels.numpy(), batch_size=64, epochs=1, shuffle=False, verbose=0).history
    assert api["objective_loss"][0] == pytest.approx(cli["objective_loss"], rel=1e-6)
    assert api["loss"][0] == pytest.approx(cli["loss"], rel=1e-6)


def test_a_long_cpu_run_says_so_once_after_its_first_steps():
    from uniclr_tf.training.callbacks import LongRunNotice
    printed, now = [], [0.0]

    def run(notice, steps, seconds_a_step):
        notice.set_params({"steps": 100, "epochs": 200})
        notice.on_epoch_begin(0)
        for batch in range(steps):
            notice.on_train_batch_begin(batch)
            now[0] += seconds_a_step * (10 if batch == 0 else 1)  # the first step compiles

    slow = LongRunNotice(20000, hint="Try configs/quickstart.flags.", accelerated=False, clock=lambda: now[0],
                         print_fn=lambda line, flush: printed.append(line))
    slow._sync = lambda: None
    run(slow, 6, 2.0)
    assert printed == ["note: 2.00 s a step on this machine's CPU: the 19,998 steps left of this run will take "
                       "about 11.1 hours. Try configs/quickstart.flags."]
    quick = LongRunNotice(200, accelerated=False, clock=lambda: now[0], print_fn=printed.append)
    quick._sync = lambda: None
    run(quick, 6, 2.0)
    on_gpu = LongRunNotice(20000, accelerated=True, clock=lambda: now[0], print_fn=printed.append)
    run(on_gpu, 6, 2.0)
    assert len(printed) == 1 and quick.estimate_s == pytest.approx(2.0 * 198) and on_gpu.estimate_s is None


def test_native_import_notices_are_dropped_and_the_rest_kept(capfd):
    from uniclr_tf.training.cli import native_import_notices_dropped
    with native_import_notices_dropped():
        os.write(2, b"I0000 00:00:1 port.cc:153] oneDNN custom operations are on. You may see ...\n")
        os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n")
        os.write(2, b"something a user should read\n")
    assert capfd.readouterr().err == "something a user should read\n"
    with contextlib.suppress(RuntimeError), native_import_notices_dropped():
        os.write(2, b"the error's own line\n")
        raise RuntimeError
    assert capfd.readouterr().err == "the error's own line\n"


def test_the_api_reference_builds_with_no_broken_reference(tmp_path):
    """docs/api.md is generated from the docstrings (mkdocstrings): ``mkdocs build --strict`` fails on a
    public name that no longer exists and on a broken cross-reference."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    page = (tmp_path / "site" / "api" / "index.html").read_text()
    for name in PUBLIC_NAMES:
        assert f"uniclr_tf.{name}" in page, name
