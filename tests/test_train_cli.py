"""The real entry point, end to end, on a slice of Fashion-MNIST (the embedded default).

Each of the module's subprocesses (a TensorFlow or JAX import, tracing: one core each) is started
by the ``cli`` fixture at the module's first test, three at a time, and awaited by its test; the
refused flags run in forks of one interpreter that has made the CLI's imports. The module took
140 s one after the other, 63 s with subprocesses three at a time, 32 s so on the 2-core machine.
"""

import concurrent.futures
import json
import os
import sys
import time

import pytest

from tests import warm
from tests.conftest import NO_TENSORFLOW, REPO_ROOT, run_cli_forks, run_python_snippet

from uniclr_tf.config.train_config import TrainConfig


def run_cli(*args, timeout=600):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO_ROOT))
    return warm.run([sys.executable, "-m", "uniclr_tf.train", *args], cwd=REPO_ROOT, env=env,
                    capture_output=True, text=True, timeout=timeout)


def run_help(module, flag):
    return warm.run([sys.executable, "-m", module, flag], cwd=REPO_ROOT, capture_output=True, text=True,
                    timeout=300)


BAD_VALUES = [
    (["--batch_size=1"], "--batch_size"),
    (["--method=simaffinity", "--ema_momentum=1.5"], "--ema_momentum"),
    (["--projector_dims=64,abc"], "--projector_dims"),
    (["--objective=nope"], "method"),
    (["--dataset=nope"], "nope"),
    (["--epochs=0"], "--epochs: expected an integer >= 1"),
    (["--image_size=3"], "--image_size"),
    (["--run_dir=/proc/uniclr-nope"], "--run_dir=/proc/uniclr-nope: cannot create"),
    (["--method=simtrace", "--projector_dims=64,512", "--batch_size=16"], "--batch_size=16: simtrace whitens"),
    (["--method=byol", "--gamma=0.1"], "--symmetric_loss_weight (alias --gamma) does not apply to --method=byol"),
    (["--method=simclr", "--queue_size=64"], "--queue_size does not apply to --method=simclr"),
    (["--method=byol", "--ema_momentum=0"], "--ema_momentum: byol needs an EMA target"),
    (["--method=wmse", "--whitening_size=64", "--batch_size=96"], "--whitening_size=64 must divide"),
]


class Item:
    """Item ``index`` of what a future returns, as a future."""

    def __init__(self, future, index):
        self.future, self.index = future, index

    def result(self):
        return self.future.result()[self.index]

    def cancel(self):
        return self.future.cancel()


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    """Every subprocess of the module, started now, three at a time (the longest first):
    ``(its folder, future)`` by name."""
    jobs = {}
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        def submit(name, task):  # task(folder)
            folder = tmp_path_factory.mktemp(name.replace("/", "_"))
            jobs[name] = folder, pool.submit(task, folder)

        def every_trick(d):  # timed from outside: the run's own wall clock must fit in it
            start = time.monotonic()
            proc = run_cli("--flagfile=configs/quickstart_full.flags", "--max_examples=512", "--epochs=2",
                           "--batch_size=64", "--steps_per_epoch=3", "--encoder_width=8", "--projector_dims=64,32",
                           "--tensorboard_every_steps=2", f"--run_dir={d}", "--run_name=cli")
            proc.elapsed = time.monotonic() - start
            return proc

        submit("every_trick", every_trick)
        submit("no_tensorflow", lambda d: run_python_snippet(NO_TF_RUN.format(run_dir=str(d)), backend="jax"))
        # The refused flags stop before any training: each in a fork of one interpreter that has made
        # the CLI's imports (TensorFlow: ~5 s of CPU each), as `python -m uniclr_tf.train` (80 s -> 9 s).
        refused = {f"bad/{i}": [*([] if any(f.startswith("--run_dir") for f in flags) else ["--run_dir={}"]), *flags]
                   for i, (flags, _) in enumerate(BAD_VALUES)}
        refused["steps_per_execution"] = ["--method=simclr", "--max_examples=512", "--steps_per_epoch=10",
                                          "--steps_per_execution=4", "--run_dir={}", "--run_name=spe"]
        folders = {name: tmp_path_factory.mktemp(name.replace("/", "_")) for name in refused}
        forks = pool.submit(run_cli_forks, "uniclr_tf.train", [
            ["--flagfile=configs/quickstart.flags", *(a.format(folders[name]) for a in args)]
            for name, args in refused.items()])
        for i, name in enumerate(refused):
            jobs[name] = folders[name], Item(forks, i)
        submit("help/train", lambda d: run_help("uniclr_tf.train", "--help"))
        submit("help/linear_eval", lambda d: run_help("uniclr_tf.linear_eval", "-h"))
        yield jobs
        for _, future in jobs.values():
            future.cancel()


def test_cli_trains_every_trick_and_reports_knn(cli):
    tmp_path, proc = cli["every_trick"]
    proc = proc.result()
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = tmp_path / "cli"
    # TensorBoard: per-epoch scalars, and per-step ones at steps 2, 4 and 6 (of 2 epochs x 3 steps).
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    steps, tags = {}, set()
    for path in (run / "tb").rglob("*tfevents*"):
        acc = EventAccumulator(str(path))
        acc.Reload()
        found = set(acc.Tags().get("scalars", [])) | set(acc.Tags().get("tensors", []))
        tags |= found
        if "step_loss" in found:
            events = acc.Tensors("step_loss") if "step_loss" in acc.Tags().get("tensors", []) else acc.Scalars("step_loss")
            steps.update({e.step: e for e in events})
    assert {"epoch_loss", "step_loss", "step_cross_entropy"} <= tags, tags
    assert sorted(steps) == [2, 4, 6], sorted(steps)
    for name in ("flags.txt", "config.json", "dataset.json", "metrics.json", "history.json", "curves.png",
                 "views.png", "neighbours.png", "embedding.png",
                 "encoder.keras", "model.weights.h5", "log.csv", "backup/state.json"):
        assert (run / name).exists(), name
    assert any((run / "tb").rglob("*tfevents*"))
    metrics = json.loads((run / "metrics.json").read_text())
    assert 0.0 < metrics["knn_top1"] <= 1.0 and 0.0 < metrics["raw_pixel_knn_top1"] <= 1.0
    seconds = metrics["seconds"]  # where the time went: training, the kNN monitor within it, the final kNN
    assert 0 < seconds["knn_monitor"] < seconds["this_invocation"] and seconds["final_knn"] > 0, seconds
    # ... and the whole process by phase: they add up to its wall clock, which the time taken to run it
    # (from outside) holds; imports and flags come first (here a fork of a warm interpreter: ~0 s), the
    # fit sits inside "training"
    phases = ("start_up", "set_up", "data", "model", "raw_pixel_knn", "training", "saving", "final_knn", "pictures")
    assert list(seconds)[2:] == [*phases, "wall"], seconds
    assert seconds["wall"] == pytest.approx(sum(seconds[k] for k in phases)) and min(seconds.values()) >= 0
    assert seconds["this_invocation"] <= seconds["training"], seconds
    assert seconds["wall"] <= proc.elapsed + 0.02, (seconds, proc.elapsed)  # /proc's clock ticks: 10 ms
    line = next(x for x in proc.stdout.splitlines() if x.startswith(f"wall clock {seconds['wall']:.1f} s: "))
    assert f"training {seconds['training']:.1f} (kNN monitor {seconds['knn_monitor']:.1f})" in line, line
    assert "kNN top-1" in proc.stdout and "raw-pixel kNN baseline" in proc.stdout
    assert "pictures: " in proc.stdout and "views.png" in proc.stdout  # where the pictures are
    assert "warning: SimAffinity with an EMA target" not in proc.stdout  # it has a predictor
    history = json.loads((run / "history.json").read_text())
    assert len(history) == 2
    for key in ("knn_top1", "effective_rank", "probe_accuracy", "ema_momentum", "objective_loss"):
        assert key in history[-1], key
    assert 1.0 <= history[-1]["effective_rank"] <= 32  # the tiny encoder's 4 x width features
    # The resolved flagfile replays: every TrainConfig field is there with the run's value.
    flags_txt = (run / "flags.txt").read_text()
    assert "--ema_momentum=0.99" in flags_txt and "--num_local_crops=2" in flags_txt and "--predictor\n" in flags_txt
    assert "--method=simaffinity" in flags_txt and "--temperature=0.5" in flags_txt  # the method's defaults, pinned
    replayed = TrainConfig.from_json((run / "config.json").read_text())
    assert replayed.views.num_local_crops == 2 and replayed.options["ema_momentum"] == 0.99


@pytest.mark.parametrize("case", range(len(BAD_VALUES)), ids=[" ".join(f) for f, _ in BAD_VALUES])
def test_cli_rejects_bad_values_with_a_clear_message(case, cli):
    fragment = BAD_VALUES[case][1]
    tmp_path, proc = cli[f"bad/{case}"]
    proc = proc.result()
    assert proc.returncode != 0
    tail = proc.stderr.strip().splitlines()[-2:]  # absl adds a "--helpshort" hint after its own errors
    assert any(fragment in line and ("error" in line.lower()) for line in tail), tail
    assert "Traceback" not in proc.stderr[-2000:]
    assert not any(tmp_path.iterdir()), list(tmp_path.iterdir())  # a refused run leaves no run folder


def test_every_config_field_has_a_flag_and_every_flagfile_parses():
    from absl import flags
    from uniclr_tf.training import cli as train
    fv = flags.FlagValues()
    train.define_flags(fv)
    names = os.listdir(REPO_ROOT / "configs")
    names += [f"{sub}/{n}" for sub in ("paper", "methods") for n in os.listdir(REPO_ROOT / "configs" / sub)]
    for name in names:
        if not name.endswith(".flags"):
            continue
        fv.unparse_flags()
        # A base file (shared by per-method files) names no method; the default one may not fit it.
        method = ["--method=simaffinity"] if name.endswith("_base.flags") else []
        fv(["train", f"--flagfile={REPO_ROOT / 'configs' / name}", *method])
        cfg = train.config_from_flags(fv)
        assert isinstance(cfg, TrainConfig), name
        if name == "paper/imagenet_simaffinity.flags":  # nested flagfile + overrides resolved
            assert (cfg.network.encoder, cfg.views.num_local_crops, cfg.method) == ("resnet50", 6, "simaffinity")
            assert cfg.options == {"predictor": True, "ema_momentum": 0.99, "temperature": 0.5, "symmetric_loss_weight": 0.01}
            assert cfg.network.projector_dims == (2048, 2048, 2048) and cfg.views.local_scale == (0.05, 0.4)


NO_TF_RUN = NO_TENSORFLOW + r"""
import json, sys
from uniclr_tf.config.train_config import TrainConfig
from uniclr_tf.training import cli as train
cfg = TrainConfig.make(encoder="tiny", encoder_width=8, projector_dims=(64, 32), method="simtrace",
                  batch_size=64, epochs=1, steps_per_epoch=3, warmup_epochs=0, max_examples=512,
                  knn_every=0, augment_on="device", run_dir={run_dir!r}, run_name="notf")
run_dir, metrics = train.run(cfg)
assert "tensorflow" not in sys.modules
print(json.dumps(metrics))
"""


def test_train_runs_under_jax_without_tensorflow(cli):
    """A machine with JAX but no TensorFlow: in-memory data + device augmentation still train."""
    tmp_path, metrics = cli["no_tensorflow"]
    metrics = metrics.result()
    assert 0.0 < metrics["knn_top1"] <= 1.0 and metrics["steps"] == 3
    assert (tmp_path / "notf" / "encoder.keras").exists()


def test_help_lists_every_flag_by_group_with_its_default(cli):
    """``--help`` (exit 0) groups every train flag (data, network, method, method options, views,
    optimisation, evaluation, system, this invocation) with its default; linear_eval lists its own."""
    import dataclasses

    from uniclr_tf import methods
    from uniclr_tf.evaluation.linear import LinearEvalConfig

    proc = cli["help/train"][1].result()
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    titles = ["\ndata:", "\nnetwork:", "\nmethod:", "\nmethod options", "\nviews", "\noptimisation:", "\nevaluation:",
              "\nsystem", "\nthis invocation"]
    positions = [out.find(t) for t in titles]
    assert all(p >= 0 for p in positions) and positions == sorted(positions), positions
    for name in TrainConfig.flat_names():
        if name != "method_options":
            assert f"  --{name}=" in out, name
    for name in methods.option_specs():
        assert f"  --{name}=unset" in out, name
    flat = " ".join(out.split())  # help text is wrapped
    assert "  --batch_size=512\n" in out and "Alias: --gamma" in flat and "Alias: --objective" in flat
    assert out.index("--knn_every=") > out.index("\nevaluation:") > out.index("--epochs=")
    proc = cli["help/linear_eval"][1].result()
    assert proc.returncode == 0
    for field in dataclasses.fields(LinearEvalConfig):
        assert f"  --{field.name}=" in proc.stdout, field.name


def test_steps_per_execution_must_divide_an_epoch(cli):
    """Keras runs whole blocks of --steps_per_execution steps, so 3 blocks of 4 for a 10-step epoch
    would train 12 steps an epoch (and the schedule and resume would count 10): refused, before any
    run folder exists."""
    tmp_path, proc = cli["steps_per_execution"]
    proc = proc.result()
    assert proc.returncode != 0
    assert "--steps_per_execution=4 must divide the 10 steps of an epoch" in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "spe").exists()
