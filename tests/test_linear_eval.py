"""Linear evaluation and kNN of a real (tiny) pretraining run folder on a Fashion-MNIST slice."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

from tests.conftest import REPO_ROOT

from uniclr_tf import linear_eval as le


def run_module(module, *args, backend="tensorflow", timeout=300):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO_ROOT), KERAS_BACKEND=backend)
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """One real ``uniclr_tf.train`` run (2 steps of a width-8 tiny encoder, 512 images a split).

    The train entry point's own flags -> config -> ``run`` path, in-process (a subprocess would
    spend more time starting TensorFlow than training).
    """
    from absl import flags
    from uniclr_tf import train
    parent = tmp_path_factory.mktemp("runs")
    fv = flags.FlagValues()
    train.define_flags(fv)
    fv(["train", f"--flagfile={REPO_ROOT / 'configs' / 'quickstart.flags'}", "--max_examples=512", "--epochs=1",
        "--steps_per_epoch=2", "--batch_size=64", "--encoder_width=8", "--projector_dims=64,32", "--knn_every=0",
        f"--run_dir={parent}", "--run_name=run"])
    path, _ = train.run(train.config_from_flags(fv))
    return Path(path)


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
    linear = results["linear"]
    assert 0.0 <= linear["top1"] <= linear["top5"] <= 1.0
    assert float(line.split()[3]) == pytest.approx(linear["top1"], abs=1e-4)
    assert float(line.split()[5]) == pytest.approx(linear["top5"], abs=1e-4)
    settings = linear["settings"]
    assert settings["epochs"] == 2 and settings["augment"] is False and settings["optimizer"] == "sgd"
    assert settings["learning_rate"] == 30.0 and settings["peak_learning_rate"] == 7.5
    assert settings["momentum"] == 0.9 and settings["weight_decay"] == 0.0 and settings["steps"] == 16
    assert settings["num_train"] == 512 and settings["num_test"] == 512
    assert settings["backend"] == keras.backend.backend()
    assert any((run_dir / le.TB_DIR).rglob("*tfevents*"))

    cfg = parse_cli(f"--run_dir={run_dir}", "--knn", "--knn_k=20")
    assert cfg.knn and cfg.knn_k == 20 and cfg.knn_temperature == 0.1
    le.run(cfg)
    line = last_line(capsys.readouterr().out)
    assert line.startswith("kNN top-1 ") and " top-5 " in line, line
    results = json.loads((run_dir / "linear_eval.json").read_text())
    assert results["linear"] == linear  # merged, not overwritten
    knn = results["knn"]
    assert 0.1 < knn["top1"] <= knn["top5"] <= 1.0
    assert float(line.split()[2]) == pytest.approx(knn["top1"], abs=1e-4)
    assert knn["settings"]["k"] == 20 and knn["settings"]["memory_bank"] == 512


def test_cli_under_jax_with_augmentation(run_dir, tmp_path):
    out = tmp_path / "jax.json"
    proc = run_module("uniclr_tf.linear_eval", f"--run_dir={run_dir}", "--augment", "--epochs=1",
                      "--batch_size=128", f"--out={out}", backend="jax")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert last_line(proc.stdout).startswith("linear eval top-1 ")
    linear = json.loads(out.read_text())["linear"]
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
    shutil.copytree(run_dir, target, ignore=shutil.ignore_patterns("tb", "checkpoints", le.TB_DIR))
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
