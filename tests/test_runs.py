"""The run-folder reader (one set of errors), atomic writes, the one feature extractor and the one
optimizer factory."""

import json
import os

import keras
import numpy as np
import pytest

from uniclr_tf import evaluation
from uniclr_tf.training import optimizers
from uniclr_tf.training import runs
from uniclr_tf.training.runs import RunFolder, RunFolderError

IMAGE_SHAPE = (8, 8, 1)


def tiny_encoder(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((None, None, 1)), keras.layers.Conv2D(4, 3, name="conv"),
                             keras.layers.BatchNormalization(name="bn"), keras.layers.ReLU(),
                             keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(6, name="fc")],
                            name="encoder")


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    """A run folder with the files the readers use (a tiny encoder and projector)."""
    path = tmp_path_factory.mktemp("run")
    encoder = tiny_encoder()
    encoder.save(path / "encoder.keras")
    keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)], name="projector").save(path / "projector.keras")
    (path / "dataset.json").write_text(json.dumps({"dataset": "fashion_mnist", "image_shape": list(IMAGE_SHAPE),
                                                   "num_classes": 10, "mean": [0.3], "std": [0.35]}))
    (path / "config.json").write_text(json.dumps({"dataset": "fashion_mnist", "method": "simtrace"}))
    return path


def copy_run(src, dst, skip=()):
    dst.mkdir()
    for name in os.listdir(src):
        if name not in skip:
            (dst / name).write_bytes((src / name).read_bytes())
    return dst


# --- RunFolder -----------------------------------------------------------------------------------


def test_reads_a_complete_run_folder(run_folder):
    folder = RunFolder(run_folder, require=("config.json", "dataset.json", "encoder.keras", "projector.keras"))
    assert folder.config == {"dataset": "fashion_mnist", "method": "simtrace"}
    assert folder.objective == "simtrace"  # `method` or `objective`, whichever the run wrote
    assert folder.image_shape == IMAGE_SHAPE and folder.num_classes == 10
    assert folder.mean == (0.3,) and folder.std == (0.35,) and folder.dataset_spec == "fashion_mnist"
    encoder = folder.load_encoder()
    assert encoder.output_shape == (None, 6)
    assert folder.load_projector(feature_dim=6).output_shape == (None, 3)


def test_missing_folder_and_missing_files_name_them(run_folder, tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(RunFolderError, match="does not exist") as info:
        RunFolder(missing)
    assert str(missing) in str(info.value) and "uniclr_tf.train" in str(info.value)

    partial = copy_run(run_folder, tmp_path / "partial", skip=("config.json", "encoder.keras"))
    with pytest.raises(RunFolderError) as info:
        RunFolder(partial, require=("encoder.keras", "config.json", "dataset.json"))
    message = str(info.value)
    assert "missing encoder.keras, config.json" in message and str(partial) in message
    assert "uniclr_tf.train" in message and len(message.splitlines()) == 1
    folder = RunFolder(partial)  # nothing required up front: the access names the file
    for access, name in ((lambda: folder.config, "config.json"), (folder.load_encoder, "encoder.keras")):
        with pytest.raises(RunFolderError, match=f"missing {name}") as info:
            access()
        assert str(partial) in str(info.value)


def test_corrupt_config_json_and_encoder_keras_name_the_file(run_folder, tmp_path):
    bad = copy_run(run_folder, tmp_path / "corrupt")
    (bad / "config.json").write_text('{"dataset": "fashion_mnist", "epochs": ')  # truncated
    (bad / "encoder.keras").write_bytes(b"PK\x03\x04 not really a zip")
    folder = RunFolder(bad)
    with pytest.raises(RunFolderError, match=r"config\.json is unreadable or corrupt \(JSONDecodeError") as info:
        folder.config
    assert str(bad) in str(info.value) and "uniclr_tf.train writes it" in str(info.value)
    with pytest.raises(RunFolderError, match=r"encoder\.keras cannot be loaded as the encoder") as info:
        folder.load_encoder()
    assert str(bad) in str(info.value) and len(str(info.value).splitlines()) == 1
    (bad / "config.json").write_text("[1, 2]")
    with pytest.raises(RunFolderError, match="config.json is corrupt: expected a JSON object"):
        RunFolder(bad).config
    (bad / "dataset.json").write_text(json.dumps({"image_shape": [8, 8], "mean": [0.3], "std": [0.3]}))
    with pytest.raises(RunFolderError, match=r"dataset\.json is corrupt: image_shape"):
        RunFolder(bad).dataset


# --- atomic writes -------------------------------------------------------------------------------


def test_atomic_save_keeps_the_previous_file_when_the_writer_fails(tmp_path):
    target = tmp_path / "results.json"
    runs.atomic_write_json(target, {"old": 1})

    def partial_then_raise(tmp):
        with open(tmp, "w") as f:
            f.write('{"new": ')
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        runs.atomic_save(target, partial_then_raise)
    assert json.loads(target.read_text()) == {"old": 1}
    with pytest.raises(TypeError):  # not JSON-serialisable: fails before anything is written
        runs.atomic_write_json(target, {"new": object()})
    assert json.loads(target.read_text()) == {"old": 1}
    assert os.listdir(tmp_path) == ["results.json"]  # no temporary file left behind


def test_atomic_save_keeps_the_suffix_and_leaves_no_temp_file(tmp_path):
    seen = []
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    for name, save in (("m.keras", model.save), ("m.weights.h5", model.save_weights)):
        runs.atomic_save(tmp_path / name, lambda tmp, save=save: (seen.append(tmp), save(tmp)))
    assert seen[0].endswith(".keras") and ".tmp-" in seen[0] and seen[1].endswith(".weights.h5")
    assert all(os.path.dirname(p) == str(tmp_path) for p in seen)
    assert sorted(os.listdir(tmp_path)) == ["m.keras", "m.weights.h5"]
    assert keras.saving.load_model(tmp_path / "m.keras").count_params() == model.count_params()
    runs.atomic_write_text(tmp_path / "sub" / "a.txt", "hello")  # creates the folder
    assert (tmp_path / "sub" / "a.txt").read_text() == "hello" and os.listdir(tmp_path / "sub") == ["a.txt"]


def test_remove_temporaries_removes_what_a_killed_write_left_and_nothing_else(tmp_path):
    (tmp_path / "backup").mkdir()
    left = [runs._temp_path(str(tmp_path / "log.csv")), runs._temp_path(str(tmp_path / "model.weights.h5")),
            runs._temp_path(str(tmp_path / "backup" / "weights-000000125.npz"))]
    kept = [tmp_path / "log.csv", tmp_path / "history.json", tmp_path / "backup" / "state.json",
            tmp_path / "notes.tmp.txt"]
    for path in [*left, *kept]:
        with open(path, "w") as f:
            f.write("x")
    assert sorted(runs.remove_temporaries(str(tmp_path))) == sorted(left)
    assert not any(os.path.exists(p) for p in left) and all(p.exists() for p in kept)


def test_atomic_write_json_is_strict(tmp_path):
    target = tmp_path / "m.json"
    runs.atomic_write_json(target, {"loss": float("nan"), "x": [np.float32(np.inf), -np.inf, 1.5],
                                    "n": np.int64(3), "t": (1, 2), "a": np.array([0.5, np.nan])})

    def refuse(constant):
        raise ValueError(f"bare {constant} in the file")

    parsed = json.loads(target.read_text(), parse_constant=refuse)  # strict: no NaN / Infinity
    assert parsed == {"loss": None, "x": [None, None, 1.5], "n": 3, "t": [1, 2], "a": [0.5, None]}


# --- extract_features ---------------------------------------------------------------------------


def test_extract_features_in_memory_equals_tf_data_and_batch_iterables():
    import tensorflow as tf

    encoder = tiny_encoder(seed=1)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (23,) + IMAGE_SHAPE, dtype=np.uint8)
    labels = rng.integers(0, 10, 23)
    preprocess = lambda x: (np.asarray(x, np.float32) - 77.0) / 60.0  # noqa: E731
    features, got_labels = evaluation.extract_features(encoder, preprocess, (images, labels), batch_size=8)
    assert features.dtype == np.float32 and features.shape == (23, 6)
    assert got_labels.dtype == np.int64 and np.array_equal(got_labels, labels)

    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).batch(8)
    streamed, streamed_labels = evaluation.extract_features(encoder, preprocess, dataset, batch_size=8)
    np.testing.assert_array_equal(streamed, features)
    np.testing.assert_array_equal(streamed_labels, labels)
    batches = [(images[i:i + 8], labels[i:i + 8]) for i in range(0, 23, 8)]
    listed, _ = evaluation.extract_features(encoder, preprocess, batches)
    np.testing.assert_array_equal(listed, features)

    # Inference mode: BN uses its moving statistics, so an image's features do not depend on its batch.
    alone, _ = evaluation.extract_features(encoder, preprocess, (images[:1], labels[:1]))
    np.testing.assert_allclose(alone, features[:1], atol=1e-5)
    reference = keras.ops.convert_to_numpy(encoder(preprocess(images), training=False))
    np.testing.assert_allclose(features, reference, atol=1e-5)
    # Unlabelled in-memory data: labels None.
    assert evaluation.extract_features(encoder, preprocess, (images, None))[1] is None


def test_knn_eval_on_extracted_features_of_separable_images():
    # Class c lights up columns 2c..2c+1 (plus noise): the kNN on the flattened pixels is perfect.
    encoder = keras.Sequential([keras.Input(IMAGE_SHAPE), keras.layers.Flatten()])
    rng = np.random.default_rng(0)

    def make(n):
        y = rng.integers(0, 3, n)
        x = rng.integers(0, 20, (n,) + IMAGE_SHAPE)
        for i, c in enumerate(y):
            x[i, :, 2 * c:2 * c + 2] += 200
        return x.astype(np.uint8), y

    preprocess = lambda x: np.asarray(x, np.float32) / 255.0  # noqa: E731
    acc = evaluation.knn_eval(encoder, preprocess, make(60), make(20), 3, k=5, temperature=0.1)
    assert acc == {"top1": 1.0, "top5": 1.0}


# --- build_optimizer ----------------------------------------------------------------------------


def test_build_optimizer_classes_and_lars_exclusions():
    from uniclr_tf.training.optimizers import LARS, build_optimizer

    lars = build_optimizer("lars", 0.1, momentum=0.8, weight_decay=1e-6,
                           exclude_from_adaptation=["linear_probe"], exclude_from_weight_decay=("linear_probe",))
    assert type(lars) is LARS and lars.momentum == 0.8 and lars.lars_weight_decay == 1e-6
    assert lars.weight_decay is None  # no second, decoupled decay from the Keras base class
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(5, name="backbone")(inputs)
    model = keras.Model(inputs, [hidden, keras.layers.Dense(3, name="linear_probe")(hidden)])
    lars.build(model.trainable_variables)
    flags = {v.path: (lars.uses_adaptation(v), lars.uses_weight_decay(v)) for v in model.trainable_variables}
    assert flags == {"backbone/kernel": (True, True), "backbone/bias": (False, False),
                     "linear_probe/kernel": (False, False), "linear_probe/bias": (False, False)}
    assert build_optimizer("lars", 0.1).get_config()["exclude_from_adaptation"] == []

    sgd = build_optimizer("sgd", 0.1, momentum=0.9, exclude_from_weight_decay=["linear_probe"])
    assert type(sgd) is optimizers.SGD and sgd.momentum == 0.9 and sgd.weight_decay is None
    assert build_optimizer("sgd", 0.1, weight_decay=5e-4).lars_weight_decay == 5e-4
    sgd.build(model.trainable_variables)
    assert {v.path: (sgd.uses_adaptation(v), sgd.uses_weight_decay(v)) for v in model.trainable_variables} == {
        "backbone/kernel": (False, False), "backbone/bias": (False, False),
        "linear_probe/kernel": (False, False), "linear_probe/bias": (False, False)}  # wd 0: nothing decays
    decayed = build_optimizer("sgd", 0.1, weight_decay=5e-4, exclude_from_weight_decay=["linear_probe"])
    decayed.build(model.trainable_variables)
    assert [decayed.uses_weight_decay(v) for v in model.trainable_variables] == [True, True, False, False]
    assert not sgd.nesterov and not lars.nesterov
    assert build_optimizer("sgd", 0.1, nesterov=True).nesterov and build_optimizer("lars", 0.1, nesterov=True).nesterov
    adamw = build_optimizer("adamw", 1e-3, weight_decay=0.05)
    assert type(adamw) is keras.optimizers.AdamW and adamw.weight_decay == 0.05
    with pytest.raises(ValueError, match="LARS option"):
        build_optimizer("sgd", 0.1, exclude_from_adaptation=["linear_probe"])
    with pytest.raises(ValueError, match="LARS and SGD options"):
        build_optimizer("adamw", 0.1, exclude_from_weight_decay=["linear_probe"])
    with pytest.raises(ValueError, match=r"one of \('lars', 'sgd', 'adamw'\)"):
        build_optimizer("adam", 0.1)
    assert optimizers.OPTIMIZER_NAMES == ("lars", "sgd", "adamw")
    with pytest.raises(ValueError, match="eta and clip_lr are LARS options"):
        build_optimizer("sgd", 0.1, clip_lr=True)


def test_the_train_cli_hands_lars_its_trust_coefficient_and_clipping():
    """--lars_eta / --lars_clip_lr reach the LARS the train CLI builds; the defaults are the paper's."""
    from uniclr_tf.config.train_config import TrainConfig
    from uniclr_tf.training import cli

    lars = cli.build_optimizer(TrainConfig.make(optimizer="lars", lars_eta=0.02, lars_clip_lr=True), 10)
    assert (lars.eta, lars.clip_lr) == (0.02, True)
    default = cli.build_optimizer(TrainConfig.make(optimizer="lars"), 10)
    assert (default.eta, default.clip_lr) == (0.001, False)
    from uniclr_tf.config import train_config
    assert train_config.LARS_ETA == optimizers.LARS_ETA == 0.001  # the config's copy and the optimizer's
    assert type(cli.build_optimizer(TrainConfig.make(optimizer="sgd"), 10)) is optimizers.SGD


def test_knn_eval_on_a_labelled_subset_is_the_kNN_of_that_subset():
    """``label_fraction`` / ``seed``: the memory bank is the class-balanced subset the evaluation CLIs pick
    (``protocols.label_subset``), and a different seed draws a different one; a batched ``train`` or a
    fraction outside (0, 1] is refused by name."""
    from uniclr_tf.evaluation import protocols
    encoder = keras.Sequential([keras.Input(IMAGE_SHAPE), keras.layers.Flatten()])
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, (90,) + IMAGE_SHAPE).astype(np.uint8)
    y = rng.integers(0, 3, 90)
    test = (rng.integers(0, 256, (30,) + IMAGE_SHAPE).astype(np.uint8), rng.integers(0, 3, 30))
    preprocess = lambda a: np.asarray(a, np.float32) / 255.0  # noqa: E731
    keep = protocols.label_subset(y, 0.2, 3)
    assert 0 < len(keep) < len(y)
    want = evaluation.knn_eval(encoder, preprocess, (x[keep], y[keep]), test, 3, k=5)
    got = evaluation.knn_eval(encoder, preprocess, (x, y[:, None]), test, 3, k=5, label_fraction=0.2, seed=3)
    assert got == want
    assert not np.array_equal(keep, protocols.label_subset(y, 0.2, 4))
    batches = [(x[:45], y[:45]), (x[45:], y[45:])]
    with pytest.raises(ValueError, match=r"label_fraction: the labelled subset is drawn from in-memory"):
        evaluation.knn_eval(encoder, preprocess, batches, test, 3, k=5, label_fraction=0.2)
    with pytest.raises(ValueError, match=r"label_fraction"):
        evaluation.knn_eval(encoder, preprocess, (x, y), test, 3, k=5, label_fraction=1.5)
