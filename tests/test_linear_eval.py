"""Linear evaluation and kNN of a real (tiny) pretraining run folder on a Fashion-MNIST slice, on
another dataset (transfer to a synthetic folder of PNGs) and on a labelled subset (semi-supervised),
the subset rule itself (:mod:`uniclr_tf.evaluation.protocols`) against a NumPy reference, and the training
augmentation on the device (``--augment_on=device``; also under JAX with TensorFlow unimportable)."""

import json
import os
import shutil
import sys

import keras
import numpy as np
import pytest

from tests import warm
from tests.conftest import NO_TENSORFLOW, REPO_ROOT, run_python_snippet, write_stripes_folder

from uniclr_tf.evaluation import linear as le
from uniclr_tf.evaluation import protocols

FULL_KEY = "linear[fashion_mnist, labels=100%]"


def run_module(module, *args, backend="tensorflow", timeout=300):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO_ROOT), KERAS_BACKEND=backend)
    return warm.run([sys.executable, "-m", module, *args], cwd=REPO_ROOT, env=env,
                    capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def run_dir(tiny_run):
    """The shared tiny SimCLR run (tests/conftest.py)."""
    return tiny_run


def last_line(text):
    return text.strip().splitlines()[-1]


# --- top-k helper -------------------------------------------------------------------------------


def test_topk_accuracy_matches_hand_computed_values():
    scores = np.array([[0.1, 0.5, 0.2, 0.9],    # ranking 3, 1, 2, 0
                       [0.8, 0.1, 0.3, 0.2],    # ranking 0, 2, 3, 1
                       [0.2, 0.3, 0.4, 0.1]])   # ranking 2, 1, 0, 3
    labels = np.array([1, 0, 3])
    # top-1: only row 1 (label 0 ranked first). top-2: rows 0 and 1. top-3: rows 0, 1. top-4: all.
    acc = le.topk_accuracy(scores, labels, ks=(1, 2, 3, 4, 5))
    assert acc == pytest.approx({"top1": 1 / 3, "top2": 2 / 3, "top3": 2 / 3, "top4": 1.0, "top5": 1.0})
    with pytest.raises(ValueError, match="labels must lie"):
        le.topk_accuracy(scores, np.array([0, 1, 4]))


# --- the CLI --------------------------------------------------------------------------------------


def parse_cli(*args):
    """The entry point's flags -> frozen config, as ``python -m uniclr_tf.linear_eval ARGS``."""
    from absl import flags
    fv = flags.FlagValues()
    le.define_flags(fv)
    fv(["linear_eval", *args])
    return le.config_from_flags(fv)


def test_linear_eval_then_knn_report_and_merge_into_one_json(run_dir, capsys):
    # In-process through the CLI's own flags -> config -> run() path (the JAX test below runs the
    # real entry point in a subprocess).
    cfg = parse_cli(f"--run_dir={run_dir}", "--noaugment", "--epochs=2", "--batch_size=64")
    assert cfg == le.LinearEvalConfig(run_dir=str(run_dir), augment=False, epochs=2, batch_size=64)
    le.run(cfg)
    line = last_line(capsys.readouterr().out)
    assert line.startswith("linear eval top-1 ") and " top-5 " in line, line
    results = json.loads((run_dir / "linear_eval.json").read_text())
    assert results["pretraining_dataset"] == "fashion_mnist" and results["run_dir"] == str(run_dir)
    linear = results[FULL_KEY]
    assert 0.0 <= linear["top1"] <= linear["top5"] <= 1.0
    assert float(line.split()[3]) == pytest.approx(linear["top1"], abs=1e-4)
    assert float(line.split()[5]) == pytest.approx(linear["top5"], abs=1e-4)
    settings = linear["settings"]
    assert settings["epochs"] == 2 and settings["augment"] is False and settings["optimizer"] == "sgd"
    assert settings["learning_rate"] == 30.0 and settings["peak_learning_rate"] == 7.5
    assert settings["momentum"] == 0.9 and settings["weight_decay"] == 0.0 and settings["steps"] == 16
    assert settings["num_train"] == 512 and settings["num_test"] == 512
    assert settings["dataset"] == "fashion_mnist"
    subset = settings["label_subset"]
    assert subset == {"fraction": 1.0, "seed": 0, "size": 512, "of": 512}  # nothing drawn
    assert settings["backend"] == keras.backend.backend()
    assert any((run_dir / le.TB_DIR).rglob("*tfevents*"))

    cfg = parse_cli(f"--run_dir={run_dir}", "--knn", "--knn_k=20")
    assert cfg.knn and cfg.knn_k == 20 and cfg.knn_temperature == 0.1
    le.run(cfg)
    line = last_line(capsys.readouterr().out)
    assert line.startswith("kNN top-1 ") and " top-5 " in line, line
    results = json.loads((run_dir / "linear_eval.json").read_text())
    assert results[FULL_KEY] == linear  # merged, not overwritten
    knn = results["knn[fashion_mnist, labels=100%]"]
    assert 0.1 < knn["top1"] <= knn["top5"] <= 1.0
    assert float(line.split()[2]) == pytest.approx(knn["top1"], abs=1e-4)
    assert knn["settings"]["k"] == 20 and knn["settings"]["memory_bank"] == 512


def test_cli_under_jax_with_augmentation(run_dir, tmp_path):
    out = tmp_path / "jax.json"
    proc = run_module("uniclr_tf.linear_eval", f"--run_dir={run_dir}", "--augment", "--epochs=1",
                      "--batch_size=128", f"--out={out}", backend="jax")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert last_line(proc.stdout).startswith("linear eval top-1 ")
    linear = json.loads(out.read_text())[FULL_KEY]
    assert linear["settings"]["backend"] == "jax" and linear["settings"]["augment"] is True
    assert linear["settings"]["steps"] == 4 and 0.0 <= linear["top1"] <= linear["top5"] <= 1.0


@pytest.mark.parametrize("what", ["no_folder", "no_encoder"])
def test_cli_bad_run_folder_exits_with_one_line(what, run_dir, tmp_path):
    target = tmp_path / "missing"
    if what == "no_encoder":
        target.mkdir()
        for name in ("dataset.json", "config.json"):
            shutil.copy(run_dir / name, target / name)
    proc = run_module("uniclr_tf.linear_eval", f"--run_dir={target}", timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    line = last_line(proc.stderr)
    assert line.startswith("error: ") and str(target) in line, proc.stderr[-2000:]
    assert ("does not exist" in line) if what == "no_folder" else ("missing encoder.keras" in line)


# --- the library ----------------------------------------------------------------------------------


def test_unlabelled_run_is_refused(run_dir, tmp_path):
    target = tmp_path / "unlabelled"
    shutil.copytree(run_dir, target, ignore=shutil.ignore_patterns("tb", "backup", "finetune", le.TB_DIR))
    meta = json.loads((target / "dataset.json").read_text())
    meta["num_classes"] = None
    (target / "dataset.json").write_text(json.dumps(meta))
    with pytest.raises(le.RunError, match="unlabelled"):
        le.load_run(str(target))


@pytest.fixture(scope="module")
def loaded(run_dir):
    return le.load_run(str(run_dir))


def test_linear_classifier_beats_chance_on_precomputed_features(loaded):
    # 2,048 images a split (more than pretraining saw). lr 30 at batch 64 (peak 7.5) needs a few hundred
    # steps (here 256, ~0.6 top-1 on both backends) on the barely trained backbone, whose features
    # are far from centred; 64 steps gave 0.40-0.55.
    info = le.load_run_data(loaded, max_examples=2048)
    assert info.num_train == 2048
    result = le.linear_eval(loaded.encoder, info, epochs=8, batch_size=64, augment=False,
                            mean=loaded.mean, std=loaded.std, verbose=0)
    assert result["top1"] > 0.4, result  # chance is 0.1
    assert result["top5"] > 0.85, result


def test_linear_evaluation_of_arrays_is_that_of_the_same_dataset(loaded):
    """``uniclr_tf.linear_evaluation`` on the arrays of a split (labels [N, 1], as keras.datasets gives
    them) gives the numbers of ``linear_eval`` on the loaded dataset itself; bad arrays are named."""
    import uniclr_tf
    info = le.load_run_data(loaded, max_examples=512)
    train, test = info.splits["train"], info.splits["test"]
    settings = dict(epochs=2, batch_size=64, augment=False, mean=loaded.mean, std=loaded.std, verbose=0)
    want = le.linear_eval(loaded.encoder, info, **settings)
    got = uniclr_tf.linear_evaluation(loaded.encoder, (train.images, train.labels[:, None]),
                                      (test.images, test.labels), num_classes=info.num_classes, **settings)
    assert (got["top1"], got["top5"], got["train_loss"]) == (want["top1"], want["top5"], want["train_loss"])
    with pytest.raises(ValueError, match=r"train: expected uint8 images \[N, H, W, C\]"):
        uniclr_tf.linear_evaluation(loaded.encoder, (train.images / 255.0, train.labels), (test.images, test.labels))
    with pytest.raises(ValueError, match=r"test: expected integer labels \[N\] \(N = 512 images\)"):
        uniclr_tf.linear_evaluation(loaded.encoder, (train.images, train.labels), (test.images, test.labels[:5]))
    with pytest.raises(ValueError, match=r"split 'train' has labels outside \[0, 3\)"):
        uniclr_tf.linear_evaluation(loaded.encoder, (train.images, train.labels), (test.images, test.labels),
                                    num_classes=3)


def test_backbone_is_frozen_during_augmented_linear_eval(loaded):
    info = le.load_run_data(loaded)
    encoder = loaded.encoder
    assert encoder.trainable
    before = [np.array(w) for w in encoder.weights]  # kernels and BN moving statistics
    result = le.linear_eval(encoder, info, epochs=1, batch_size=128, augment=True,
                            mean=loaded.mean, std=loaded.std, verbose=0)
    after = [np.array(w) for w in encoder.weights]
    assert len(before) == len(after) and all(np.array_equal(a, b) for a, b in zip(before, after))
    assert encoder.trainable  # restored
    assert result["settings"]["steps"] == 4 and np.isfinite(result["train_loss"])
    assert 0.0 <= result["top1"] <= result["top5"] <= 1.0


# --- augmentation on the device (--augment_on=device) --------------------------------------------

LN4 = float(np.log(4.0))  # the loss of a near-zero head (N(0, 0.01²) weights) on 4 classes


def check_device_result(result, backend, epochs, steps_per_epoch):
    """A trained device-augmented result: recorded as such, the host path's step count, and a head
    that learned (the last epoch's loss well under ln 4, its running top-1 above the chance 0.25)."""
    settings = result["settings"]
    assert settings["augment"] is True and settings["augment_on"] == "device", settings
    assert settings["crop_scale"] == list(le.CROP_SCALE) and settings["backend"] == backend
    assert settings["steps"] == epochs * steps_per_epoch, settings
    assert np.isfinite(result["train_loss"]) and result["train_loss"] < 0.8 * LN4, result
    assert result["train_top1"] > 0.4, result
    assert 0.0 <= result["top1"] <= result["top5"] <= 1.0


def test_device_augmentation_trains_with_the_host_paths_steps(run_dir, loaded, stripes_folder):
    cfg = parse_cli(f"--run_dir={run_dir}", "--augment_on=device")
    assert cfg.augment and cfg.augment_on == "device"
    assert parse_cli(f"--run_dir={run_dir}").augment_on == "host"  # the default
    with pytest.raises(ValueError, match="--augment_on"):
        le.LinearEvalConfig(run_dir=str(run_dir), augment_on="gpu")
    # 400 easy 4-class images (32x32 resized to the encoder's 28x28), batch 64: 6 steps an epoch by
    # the host rule (full batches, across epochs), not the 7 of Keras's own array batching.
    info = le.load_run_data(le.check_run_dir(str(run_dir)), dataset=f"folder:{stripes_folder}")
    encoder = loaded.encoder
    before = [np.array(w) for w in encoder.weights]
    result = le.linear_eval(encoder, info, epochs=3, batch_size=64, learning_rate=1.0, augment_on="device",
                            mean=loaded.mean, std=loaded.std, verbose=0)
    check_device_result(result, "tensorflow", epochs=3, steps_per_epoch=6)
    assert all(np.array_equal(a, np.array(b)) for a, b in zip(before, encoder.weights))  # frozen
    assert encoder.trainable
    plain = le.linear_eval(encoder, info, epochs=1, batch_size=64, augment=False, augment_on="device",
                           mean=loaded.mean, std=loaded.std, verbose=0)  # --noaugment ignores it
    assert plain["settings"]["augment_on"] is None and plain["settings"]["steps"] == 7  # ceil(400 / 64)


def test_device_augmentation_refuses_a_streamed_split(loaded, stripes_folder):
    from uniclr_tf import data
    info = data.load_dataset(f"folder:{stripes_folder}", max_in_memory_mb=0)
    assert not info.split("train").in_memory
    with pytest.raises(data.DataError, match="^--augment_on=device needs the training split in memory") as error:
        le.linear_eval(loaded.encoder, info, epochs=1, batch_size=64, augment_on="device", verbose=0)
    assert "--augment_on=host" in str(error.value) and "\n" not in str(error.value)


@pytest.fixture(scope="module")
def stripes28(tmp_path_factory):
    """Stripes at the encoder's own 28x28: a transfer that needs no resizing (which needs TensorFlow)."""
    return write_stripes_folder(tmp_path_factory.mktemp("stripes28"), 100, 50, size=28)


@pytest.fixture(scope="module")
def jax_without_tensorflow(run_dir, stripes28, tmp_path_factory):
    """ONE JAX subprocess in which TensorFlow cannot be imported (as on a machine with JAX only; starting
    JAX and loading the encoder there cost ~15 s): the device-augmented and the ``--noaugment``
    linear evaluations through ``run``, then :func:`repeated_batch_losses` and its control."""
    out = tmp_path_factory.mktemp("jax") / "out.json"
    code = NO_TENSORFLOW + f"""
import json
import numpy as np
from tests.test_linear_eval import repeated_batch_losses
from uniclr_tf.evaluation import linear as le
runs = {{}}
for name, extra in (("device", dict(augment_on="device")), ("noaugment", dict(augment=False))):
    cfg = le.LinearEvalConfig(run_dir={str(run_dir)!r}, dataset={f"folder:{stripes28}"!r}, epochs=3,
                              batch_size=64, learning_rate=1.0, out={str(out)!r}, **extra)
    runs[name] = le.run(cfg)
run = le.load_run({str(run_dir)!r})
train = le.load_run_data(run, dataset={f"folder:{stripes28}"!r}).split("train")
every = np.arange(64) * 6  # 64 of the 400, all 4 classes
args = (run.encoder, train.images[every], train.labels[every], run.mean, run.std)
losses, control = repeated_batch_losses(*args), repeated_batch_losses(*args, on_device=False)
assert "tensorflow" not in sys.modules
print(json.dumps(dict(runs=runs, losses=losses, control=control)))
"""
    return dict(run_python_snippet(code, backend="jax"), out=out)


def test_device_augmentation_under_jax_without_tensorflow(jax_without_tensorflow, stripes28):
    runs = jax_without_tensorflow["runs"]
    check_device_result(runs["device"], "jax", epochs=3, steps_per_epoch=6)
    plain = runs["noaugment"]  # --noaugment (default --augment_on=host) needs no TensorFlow either
    assert plain["settings"]["augment"] is False and plain["settings"]["backend"] == "jax"
    assert plain["top1"] > 0.9, plain  # precomputed features of the plain stripes: easy
    written = json.loads(jax_without_tensorflow["out"].read_text())[f"linear[folder:{stripes28}, labels=100%]"]
    assert written["settings"]["augment"] is False  # the last one run replaced the device section


def repeated_batch_losses(encoder, images, labels, mean, std, on_device=True):
    """The device model (``augmented_model`` + ``train_augmenter``, as ``linear_eval`` builds it) fed
    ONE batch again and again, with a learning rate of 0: only the augmentation can change the
    loss. Returns the running loss after each of 2 steps of 3 epochs, and each epoch's loss.
    ``on_device=False``: the control, the plain normalised batch and no augmenter."""
    head = keras.Sequential([keras.Input(encoder.output_shape[1:]),
                             keras.layers.Dense(4, kernel_initializer=keras.initializers.RandomNormal(1.0, seed=0))])
    if on_device:
        augmenter = le.train_augmenter(images.shape[1:3], mean, std, seed=0)
        model, x = le.augmented_model(encoder, head, images.shape[1:], augmenter), images
    else:
        model = le.augmented_model(encoder, head, images.shape[1:])
        x = ((images / 255.0 - np.asarray(mean)) / np.asarray(std)).astype("float32")
    model.compile(optimizer=keras.optimizers.SGD(0.0),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    steps = []
    record = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: steps.append(float(logs["loss"])))
    same_batch = ((x, labels) for _ in iter(int, 1))  # endless; a generator, as fit takes
    history = model.fit(same_batch, steps_per_epoch=2, epochs=3, verbose=0, callbacks=[record])
    return steps, [float(v) for v in history.history["loss"]]


def check_crops_change(losses, control):
    steps, epochs = losses
    assert len(steps) == 6 and len(epochs) == 3
    # A step's running loss equals the previous one only if it drew the same crops and flips.
    assert all(abs(a - b) > 1e-5 for a, b in zip(steps, steps[1:])), steps
    assert min(abs(a - b) for i, a in enumerate(epochs) for b in epochs[i + 1:]) > 1e-5, epochs
    assert max(control[0]) - min(control[0]) < 1e-5, control  # the harness: nothing random, no change


def test_device_augmenter_draws_new_crops_every_step(loaded, run_dir, stripes28, jax_without_tensorflow):
    """The augmenter's random state advances between compiled steps and epochs: the TF step's
    tf.random.Generator (here) and the Keras SeedGenerator threaded through the jitted JAX step
    (the subprocess without TensorFlow)."""
    train = le.load_run_data(le.check_run_dir(str(run_dir)), dataset=f"folder:{stripes28}").split("train")
    every = np.arange(64) * 6  # 64 of the 400, all 4 classes
    args = (loaded.encoder, train.images[every], train.labels[every], loaded.mean, loaded.std)
    check_crops_change(repeated_batch_losses(*args), repeated_batch_losses(*args, on_device=False))
    check_crops_change(jax_without_tensorflow["losses"], jax_without_tensorflow["control"])


def test_host_augmentation_without_tensorflow_is_one_line_naming_device(run_dir, tmp_path):
    out = tmp_path / "never.json"
    code = NO_TENSORFLOW + f"""
sys.argv = ["linear_eval", "--run_dir={run_dir}", "--epochs=1", "--out={out}"]
from uniclr_tf import linear_eval
linear_eval.entry_point()
"""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO_ROOT), KERAS_BACKEND="jax")
    proc = warm.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                    timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    line = last_line(proc.stderr)
    assert line.startswith("error: --augment_on=host ") and "TensorFlow is not installed" in line, line
    assert "use --augment_on=device" in line
    assert proc.stdout == "" and not out.exists()  # before any work: no data loaded, nothing written


# --- the labelled subset (semi-supervised protocol) --------------------------------------------


def reference_subset(labels, fraction, seed):
    """The rule as documented (uniclr_tf/evaluation/protocols.py, README): per class c in increasing order,
    default_rng([seed, c]).permutation(n_c), the first max(1, floor(f * n_c + 0.5)); sorted union."""
    keep = []
    for c in sorted(set(labels.tolist())):
        members = np.nonzero(labels == c)[0]
        k = max(1, int(np.floor(fraction * len(members) + 0.5)))
        keep.extend(members[np.random.default_rng([seed, c]).permutation(len(members))[:k]])
    return np.sort(np.array(keep, np.int64))


def test_label_subset_is_the_documented_class_balanced_rule():
    labels = np.random.default_rng(7).integers(0, 10, 3000)
    labels[labels == 9] = 8
    labels[17] = 9  # a class of one example keeps it
    for fraction in (0.01, 0.1, 0.25, 1.0):
        for seed in (0, 1, 5):
            got = protocols.label_subset(labels, fraction, seed)
            np.testing.assert_array_equal(got, reference_subset(labels, fraction, seed))
            assert got.dtype == np.int64 and np.all(np.diff(got) > 0)
            for c in range(10):  # class-balanced: the documented count of every class
                n_c = int(np.sum(labels == c))
                assert np.sum(labels[got] == c) == max(1, int(np.floor(fraction * n_c + 0.5))), (fraction, c)
    np.testing.assert_array_equal(protocols.label_subset(labels, 1.0, 3), np.arange(3000))
    a, b = protocols.label_subset(labels, 0.1, 0), protocols.label_subset(labels, 0.1, 1)
    np.testing.assert_array_equal(a, protocols.label_subset(labels.copy(), 0.1, 0))  # deterministic
    assert len(a) == len(b) and not np.array_equal(a, b)  # another seed, another subset of the same size
    # each class's draw depends only on its own members: more images of class 0 leave class 3's choice alone
    more = np.concatenate([labels, np.zeros(200, labels.dtype)])
    in_class = lambda idx, lab: idx[lab[idx] == 3]  # noqa: E731
    np.testing.assert_array_equal(in_class(protocols.label_subset(more, 0.1, 0), more), in_class(a, labels))
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="label_fraction"):
            protocols.label_subset(labels, bad, 0)
    with pytest.raises(ValueError, match="unlabelled"):
        protocols.label_subset(np.array([0, 1, -1]), 0.5, 0)
    assert protocols.section_key("linear", "tfds:cifar10", 0.01, 0) == "linear[tfds:cifar10, labels=1%, seed=0]"
    assert protocols.section_key("knn", "fashion_mnist", 1.0, 4) == "knn[fashion_mnist, labels=100%]"


def test_label_fraction_trains_and_records_exactly_the_subset(run_dir, loaded):
    info = le.load_run_data(loaded)
    labels = np.asarray(info.split("train").labels)
    expected = {seed: reference_subset(labels, 0.1, seed) for seed in (0, 1)}
    sub, record = protocols.labelled_subset(info, 0.1, 0)  # the split linear_eval trains on
    np.testing.assert_array_equal(sub.split("train").images, info.split("train").images[expected[0]])
    np.testing.assert_array_equal(sub.split("train").labels, labels[expected[0]])
    assert sub.split("test") is info.split("test") and sub.num_test == info.num_test  # the whole test split

    out = {}
    for seed in (0, 1):
        le.run(parse_cli(f"--run_dir={run_dir}", "--label_fraction=0.1", f"--seed={seed}", "--noaugment",
                         "--epochs=1", "--batch_size=16"))
        results = json.loads((run_dir / "linear_eval.json").read_text())
        section = results[f"linear[fashion_mnist, labels=10%, seed={seed}]"]
        subset = section["settings"]["label_subset"]
        assert subset["sha256"] == protocols.indices_sha256(expected[seed]), seed
        assert subset["first_indices"] == expected[seed][:10].tolist()
        assert subset["size"] == section["settings"]["num_train"] == len(expected[seed]) and subset["of"] == 512
        assert subset["min_per_class"] >= 1 and subset["classes"] == 10 and subset["seed"] == seed
        assert section["settings"]["steps"] == -(-len(expected[seed]) // 16)  # one epoch over the subset
        assert section["settings"]["num_test"] == 512
        out[seed] = subset
    assert out[0]["sha256"] != out[1]["sha256"]
    le.run(parse_cli(f"--run_dir={run_dir}", "--label_fraction=0.1", "--knn", "--knn_k=5"))
    knn = json.loads((run_dir / "linear_eval.json").read_text())["knn[fashion_mnist, labels=10%, seed=0]"]
    assert knn["settings"]["memory_bank"] == len(expected[0])
    assert knn["settings"]["label_subset"]["sha256"] == out[0]["sha256"]


def test_labelled_subset_of_a_streamed_tfds_split():
    tfds = pytest.importorskip("tensorflow_datasets")
    from uniclr_tf import data
    with tfds.testing.mock_data(num_examples=60):
        info = data.load_dataset("tfds:cifar10")
        assert not info.split("train").in_memory
        images, labels = data.as_numpy(info, "train")
        sub, record = protocols.labelled_subset(info, 0.2, 3)
        expected = reference_subset(labels, 0.2, 3)
        got_images, got_labels = data.as_numpy(sub, "train")
        assert sub.num_train == record["size"] == len(expected) == len(got_labels)
        np.testing.assert_array_equal(got_labels, labels[expected])
        np.testing.assert_array_equal(got_images, images[expected])
        assert record["sha256"] == protocols.indices_sha256(expected)


# --- transfer: another dataset ------------------------------------------------------------------


def test_transfer_to_a_folder_dataset_records_its_own_section(run_dir, stripes_folder, capsys):
    spec = f"folder:{stripes_folder}"
    info = le.load_run_data(le.check_run_dir(str(run_dir)), dataset=spec)
    assert info.image_shape == (28, 28, 1)  # 32x32 PNGs resized to the encoder's input size
    assert (info.num_train, info.num_test, info.num_classes) == (400, 200, 4)
    le.run(parse_cli(f"--run_dir={run_dir}", f"--dataset={spec}", "--noaugment", "--epochs=3", "--batch_size=64"))
    assert last_line(capsys.readouterr().out).startswith("linear eval top-1 ")
    results = json.loads((run_dir / "linear_eval.json").read_text())
    section = results[f"linear[{spec}, labels=100%]"]
    settings = section["settings"]
    assert settings["dataset"] == spec and settings["num_classes"] == 4
    assert settings["mean"] == pytest.approx(le.load_run(str(run_dir)).mean)  # pretraining's, not the folder's
    assert settings["mean"] != pytest.approx(info.mean, abs=0.05)
    assert (settings["num_train"], settings["num_test"]) == (400, 200)
    assert section["top1"] > 0.4, section  # chance: 0.25 (easy stripes, precomputed features)
    assert results["pretraining_dataset"] == "fashion_mnist"
    assert any((run_dir / le.TB_DIR / protocols.folder_name(spec, 1.0, 0)).rglob("*tfevents*"))


def test_transfer_errors_are_one_line_naming_the_dataset_flag(run_dir, tmp_path):
    from uniclr_tf.data import DataError
    folder = le.check_run_dir(str(run_dir))
    rgb = write_stripes_folder(tmp_path / "rgb", 2, 1, channels=3)
    flat = tmp_path / "flat"
    flat.mkdir()
    for png in (write_stripes_folder(tmp_path / "grey", 2, 1) / "train" / "class0").iterdir():
        shutil.copy(png, flat / png.name)
    cases = {f"folder:{rgb}": "channel", "nonsense": "unknown dataset spec", f"folder:{tmp_path / 'none'}":
             "no such folder", f"folder:{flat}": "unlabelled"}
    for spec, words in cases.items():
        with pytest.raises(DataError) as error:
            le.load_run_data(folder, dataset=spec)
        message = str(error.value)
        assert message.startswith(f"--dataset={spec}: ") and words in message and "\n" not in message, message


def test_linear_evaluation_reads_no_statistics_as_the_augmenter_does(loaded):
    """``mean=None, std=None`` (what ``model.augmenter.mean`` / ``.std`` are for an augmenter built without
    them) normalise as the augmenter and ``EvalPreprocess`` do: 0.5 / 0.5 for grey images, not the
    statistics of the training arrays, which pretraining never saw."""
    import uniclr_tf
    info = le.load_run_data(loaded, max_examples=256)
    train, test = info.splits["train"], info.splits["test"]
    settings = dict(epochs=1, batch_size=64, augment=False, verbose=0)
    arrays = (train.images, train.labels), (test.images, test.labels)
    got = uniclr_tf.linear_evaluation(loaded.encoder, *arrays, **settings)
    assert (got["settings"]["mean"], got["settings"]["std"]) == ([0.5], [0.5]), got["settings"]
    want = uniclr_tf.linear_evaluation(loaded.encoder, *arrays, mean=(0.5,), std=(0.5,), **settings)
    assert (got["top1"], got["train_loss"]) == (want["top1"], want["train_loss"])
    other = uniclr_tf.linear_evaluation(loaded.encoder, *arrays, mean=info.mean, std=info.std, **settings)
    assert other["settings"]["mean"] != [0.5]
