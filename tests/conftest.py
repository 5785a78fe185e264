"""Shared test set-up: TensorFlow backend by default, quiet logs, a subprocess runner, and what the
evaluation tests share: a tiny real pretraining run and a synthetic folder dataset.

Tests that need the JAX backend (or a fresh process, e.g. for export reloads) run a snippet in a
subprocess through the ``run_python`` fixture; Keras picks its backend once per process.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]


def run_python_snippet(code, backend="tensorflow", env=None, timeout=600):
    """Runs ``code`` in a fresh interpreter; returns the JSON object it prints on its last line."""
    full_env = dict(os.environ)
    full_env.update({"KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2",
                     "PYTHONPATH": str(REPO_ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")})
    full_env.update(env or {})
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO_ROOT,
                          env=full_env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"subprocess ({backend}) failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    lines = [l for l in proc.stdout.strip().splitlines() if l.strip()]
    return json.loads(lines[-1])


@pytest.fixture
def run_python():
    return run_python_snippet


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """One real ``uniclr_tf.train`` run (SimCLR, 2 steps of a width-8 tiny encoder, 512 Fashion-MNIST
    images a split), shared by the evaluation tests (linear_eval, finetune), which only add files.

    The train entry point's own flags -> config -> ``run`` path, in-process (a subprocess would
    spend more time starting TensorFlow than training).
    """
    from absl import flags
    from uniclr_tf import train
    parent = tmp_path_factory.mktemp("runs")
    fv = flags.FlagValues()
    train.define_flags(fv)
    fv(["train", f"--flagfile={REPO_ROOT / 'configs' / 'quickstart.flags'}", "--method=simclr", "--encoder=tiny",
        "--encoder_width=8", "--projector_dims=64,32", "--batch_size=64", "--max_examples=512",
        "--knn_max_train=512", "--epochs=1", "--steps_per_epoch=2", "--knn_every=0", "--nopictures",
        f"--run_dir={parent}", "--run_name=run"])
    path, _ = train.run(train.config_from_flags(fv))
    return Path(path)


def write_stripes_folder(root, per_class_train, per_class_test, size=32, channels=1, seed=0):
    """A ``folder:`` dataset of PNGs in ``root/{train,test}/classK/``: 4 easy classes, stripes
    (horizontal for classes 0 and 2, vertical for 1 and 3) on a bright (0, 1) or dark (2, 3)
    background, with noise; the orientation survives crops and horizontal flips. Returns ``root``."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    stripes = ((np.arange(size) // 2) % 2).astype(np.float32) - 0.5
    for split, count in (("train", per_class_train), ("test", per_class_test)):
        for c in range(4):
            folder = Path(root, split, f"class{c}")
            folder.mkdir(parents=True, exist_ok=True)
            pattern = stripes[:, None] if c % 2 == 0 else stripes[None, :]
            for i in range(count):
                image = rng.normal(170.0 if c < 2 else 70.0, 20.0, (size, size)) + 100.0 * pattern
                image = np.clip(image, 0, 255).astype(np.uint8)
                if channels == 3:
                    image = np.repeat(image[..., None], 3, axis=-1)
                Image.fromarray(image).save(folder / f"{i:04d}.png")
    return Path(root)


@pytest.fixture(scope="session")
def stripes_folder(tmp_path_factory):
    """:func:`write_stripes_folder`: 32x32 grey PNGs (the tiny run's encoder takes 28x28x1), 100
    training and 50 test images a class."""
    return write_stripes_folder(tmp_path_factory.mktemp("stripes"), 100, 50)
