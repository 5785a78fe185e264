"""Fine-tuning (uniclr_tf.finetune) of the shared tiny pretraining run on a synthetic folder dataset:
the CLI's flags and --help, the model and results it writes (encoder.keras untouched), an accuracy
above chance, the labelled subset under JAX, and one-line errors."""

import concurrent.futures
import dataclasses
import hashlib
import json
import os
import sys

import numpy as np
import pytest

from tests import warm
from tests.conftest import REPO_ROOT, write_stripes_folder

from uniclr_tf.evaluation import finetune as ft
from uniclr_tf.evaluation import protocols


def run_module(*args, backend="tensorflow", timeout=300):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO_ROOT), KERAS_BACKEND=backend)
    return warm.run([sys.executable, "-m", "uniclr_tf.finetune", *args], cwd=REPO_ROOT, env=env,
                    capture_output=True, text=True, timeout=timeout)


def parse_cli(*args):
    """The entry point's flags -> frozen config, as ``python -m uniclr_tf.finetune ARGS``."""
    from absl import flags
    fv = flags.FlagValues()
    ft.define_flags(fv)
    fv(["finetune", *args])
    return ft.config_from_flags(fv)


def sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def subprocesses(tiny_run, stripes_folder, tmp_path_factory):
    """The module's CLI subprocesses, started at its first test, two at a time (each mostly one
    core), each awaited by its test: ``(what it needs, future)`` by name."""
    spec = f"folder:{stripes_folder}"
    out = tmp_path_factory.mktemp("label_fraction") / "ft.json"
    missing = tmp_path_factory.mktemp("no_folder") / "missing"
    rgb = f"--dataset=folder:{write_stripes_folder(tmp_path_factory.mktemp('rgb') / 'rgb', 2, 1, channels=3)}"
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        jobs = {
            "label_fraction": (out, pool.submit(run_module, f"--run_dir={tiny_run}", f"--dataset={spec}",
                                                "--label_fraction=0.25", "--seed=3", "--epochs=1", "--batch_size=50",
                                                "--noaugment", f"--out={out}", backend="jax")),
            "help": (None, pool.submit(run_module, "--help", timeout=120)),
            "no_folder": ((missing, []), pool.submit(run_module, f"--run_dir={missing}", timeout=120)),
            "rgb_dataset": ((tiny_run, [rgb]), pool.submit(run_module, f"--run_dir={tiny_run}", rgb, timeout=120)),
        }
        yield jobs
        for _, future in jobs.values():
            future.cancel()


def test_flags_defaults_and_grouped_help(subprocesses):
    cfg = parse_cli("--run_dir=r", "--label_fraction=0.01", "--crop_scale=0.08,1", "--nonesterov")
    assert cfg == ft.FinetuneConfig(run_dir="r", label_fraction=0.01, crop_scale=(0.08, 1.0), nesterov=False)
    default = ft.FinetuneConfig(run_dir="r")  # SimCLR's recipe
    assert (default.learning_rate, default.momentum, default.nesterov, default.weight_decay) == (0.05, 0.9, True, 0.0)
    assert default.crop_scale == (0.5, 1.0) and default.label_fraction == 1.0 and default.dataset == ""
    for bad, flag in ((dict(label_fraction=0.0), "--label_fraction"), (dict(label_fraction=1.5), "--label_fraction"),
                      (dict(crop_scale=(0.9, 0.5)), "--crop_scale"), (dict(seed=-1), "--seed"),
                      (dict(run_dir=""), "--run_dir")):
        with pytest.raises(ValueError, match=flag):
            ft.FinetuneConfig(**{"run_dir": "r", **bad})
    proc = subprocesses["help"][1].result()
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    positions = [out.find(t) for t in ("\nprotocol (what is evaluated):", "\nfine-tuning recipe:", "\noutput:")]
    assert all(p >= 0 for p in positions) and positions == sorted(positions), positions
    for field in dataclasses.fields(ft.FinetuneConfig):
        assert f"  --{field.name}=" in out, field.name
    assert "arXiv 2002.05709" in out and "  --learning_rate=0.05\n" in out


def test_finetune_writes_model_and_results_beats_chance_and_keeps_the_encoder(tiny_run, stripes_folder, capsys):
    encoder_file = tiny_run / "encoder.keras"
    before = sha256(encoder_file), encoder_file.stat().st_mtime_ns
    spec = f"folder:{stripes_folder}"
    cfg = parse_cli(f"--run_dir={tiny_run}", f"--dataset={spec}", "--epochs=1", "--batch_size=32",
                    "--learning_rate=1.0")
    result = ft.run(cfg)
    assert (sha256(encoder_file), encoder_file.stat().st_mtime_ns) == before  # never written

    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("finetune top-1 ") and " top-5 " in line, line
    results = json.loads((tiny_run / "finetune.json").read_text())
    key = f"finetune[{spec}, labels=100%]"
    assert results[key] == json.loads(json.dumps(result)) and results["pretraining_dataset"] == "fashion_mnist"
    settings = result["settings"]
    assert settings["dataset"] == spec and (settings["num_train"], settings["num_test"]) == (400, 200)
    assert settings["steps"] == 12 and settings["nesterov"] and settings["peak_learning_rate"] == 0.125
    assert settings["crop_scale"] == [0.5, 1.0] and settings["weight_decay"] == 0.0
    assert len(result["train_loss"]) == 1 and np.isfinite(result["train_loss"][0])
    # four easy classes (chance 0.25); these 12 steps reached 0.75-1.0 with seeds 0-4 on both backends
    assert result["top1"] > 0.5, result
    assert float(line.split()[2]) == pytest.approx(result["top1"], abs=1e-4)

    model_file = tiny_run / result["model"]
    assert model_file == tiny_run / "finetune" / protocols.folder_name(spec, 1.0, 0) / "model.keras"
    import keras
    model = keras.saving.load_model(model_file, compile=False)
    assert model.output_shape == (None, 4)
    images = np.random.default_rng(0).normal(size=(3, 28, 28, 1)).astype("float32")
    assert model.predict_on_batch(images).shape == (3, 4)


def test_label_fraction_under_jax_uses_the_documented_subset(tiny_run, stripes_folder, subprocesses):
    spec = f"folder:{stripes_folder}"
    out, proc = subprocesses["label_fraction"]
    proc = proc.result()
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip().splitlines()[-1].startswith("finetune top-1 ")
    section = json.loads(out.read_text())[f"finetune[{spec}, labels=25%, seed=3]"]
    labels = np.repeat(np.arange(4), 100)  # class sub-folders in order, files sorted: the split's labels
    expected = protocols.label_subset(labels, 0.25, 3)
    subset = section["settings"]["label_subset"]
    assert subset["size"] == 100 and subset["min_per_class"] == subset["max_per_class"] == 25
    assert subset["sha256"] == protocols.indices_sha256(expected) and subset["first_indices"] == expected[:10].tolist()
    assert section["settings"]["backend"] == "jax" and section["settings"]["steps"] == 2
    assert (tiny_run / section["model"]).is_file()


@pytest.mark.parametrize("what", ["no_folder", "rgb_dataset"])
def test_bad_run_folder_or_dataset_exits_with_one_line(what, subprocesses):
    (target, args), proc = subprocesses[what]
    proc = proc.result()
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("error: "), proc.stderr[-2000:]
    if what == "no_folder":
        assert str(target) in line and "does not exist" in line
    else:
        assert line.startswith(f"error: {args[0]}: ") and "channel" in line, line
