"""Trustworthy defaults: the symmetric loss on the global pair only, the collapse detector, a collapsed
run that stops and says so, SimSiam's fixed-rate predictor."""

import json
import math
import os
import sys

import numpy as np
import pytest
from tests import warm

from conftest import REPO_ROOT


# --- the symmetric loss: which pairs, what scale --------------------------------------------------

def test_symmetric_weight_is_on_global_pairs_and_scaled_to_the_reference_batch():
    from uniclr_tf import methods
    method = methods.get_class("simaffinity")()  # defaults: global pairs, reference batch 512, γ 0.01
    assert method.symmetric_weight(global_pair=True, rows=512) == pytest.approx(0.01)
    assert method.symmetric_weight(global_pair=True, rows=256) == pytest.approx(0.02)  # ‖A − Aᵀ‖_F grows with N
    assert method.symmetric_weight(global_pair=False, rows=512) == 0.0
    paper = methods.get_class("simaffinity")(symmetric_pairs="all", symmetric_reference_batch=0)
    assert paper.symmetric_weight(global_pair=False, rows=256) == pytest.approx(0.01)
    assert paper.symmetric_weight(global_pair=True, rows=4096) == pytest.approx(0.01)
    assert methods.get_class("simclr")().symmetric_weight(True, 512) == 0.0  # γ 0 by default
    with pytest.raises(ValueError, match="--symmetric_pairs"):
        methods.get_class("simaffinity")(symmetric_pairs="local")
    with pytest.raises(ValueError, match="does not apply to --method=byol"):
        methods.get_class("byol")(symmetric_pairs="all")


@pytest.mark.parametrize("pairs", ["global", "all"])
def test_the_model_adds_the_symmetric_term_only_where_the_method_says(pairs):
    """Two global views and two local crops: the objective is the mean over the method's 5 pairs of
    CE + γ'·‖A − Aᵀ‖_F, γ' = γ·512/N on the global pair (and, with ``all``, on the local pairs)."""
    import keras

    from uniclr_tf import objectives
    from uniclr_tf.nets import encoders
    from uniclr_tf.nets import heads
    from uniclr_tf.nets.model import UniCLR
    keras.utils.set_random_seed(0)
    encoder = encoders.build_encoder("tiny", (16, 16, 1), width=8)
    projector = heads.projector(encoder.output_shape[-1], (16, 8))
    model = UniCLR(encoder, projector, method="simaffinity",
                   options={"symmetric_loss_weight": 0.5, "symmetric_pairs": pairs, "temperature": 0.5})
    rng = np.random.default_rng(0)
    views = [rng.normal(size=(8, 16, 16, 1)).astype("float32") for _ in range(2)]
    views += [rng.normal(size=(8, 8, 8, 1)).astype("float32") for _ in range(2)]
    _, logs = model.compute_objective(tuple(views), training=False)
    _, _, online, target = model._embed(views, training=False)
    scaled = 0.5 * 512 / 8
    expected = []
    for i, j in model.view_pairs(4):
        a = objectives.affinity_matrix(online[i], target[j], temperature=0.5)
        ce = float(np.mean(keras.ops.logsumexp(a, axis=1) - np.diag(np.asarray(a))))
        weight = scaled if (i < 2 and j < 2) or pairs == "all" else 0.0
        expected.append(ce + weight * float(objectives.symmetry_loss(a)))
    assert len(expected) == 5
    assert float(logs["objective_loss"]) == pytest.approx(np.mean(expected), rel=1e-5)


# --- the detector ----------------------------------------------------------------------------------

def _replay(readings, raw=0.7881, warmup=10, dim=256):
    """Feeds (epoch, {logs}) to a detector; returns the epoch where it fired, or None."""
    from uniclr_tf.training.callbacks import CollapseDetector, TrainingCollapsed
    detector = CollapseDetector(dim, raw, warmup)
    for epoch, logs in readings:
        try:
            detector.on_epoch_end(epoch - 1, dict(logs))
        except TrainingCollapsed as e:
            assert e.epoch == epoch
            return epoch
    return None


@pytest.mark.parametrize("history, fires_at", [
    # the runs of the issue (4 x H100, the default recipe): kNN by epoch
    ([(5, {"knn_top1": 0.801}), (10, {"knn_top1": 0.567})], 10),             # seed 0, 200-epoch schedule
    ([(10, {"knn_top1": 0.810}), (15, {"knn_top1": 0.576})], 15),            # seed 3
    ([(25, {"knn_top1": 0.582}), (50, {"knn_top1": 0.40})], 25),             # seed 0, --knn_every=25
    ([(2, {"embedding_std": 0.009 / 16}), (3, {"embedding_std": 0.0005})], 2),  # SimCLR + γ (std/sqrt(D) 0.009)
    # healthy runs of the shipped recipes never fire
    ([(5, {"knn_top1": 0.699}), (10, {"knn_top1": 0.743}), (50, {"knn_top1": 0.728})], None),  # weakest Barlow Twins
    ([(e, {"embedding_std": 0.143 / 16, "knn_top1": 0.80}) for e in (10, 20, 30)], None),    # SimWhitening's low std
    ([(1, {"knn_top1": 0.30}), (2, {"knn_top1": 0.35})], None),  # an encoder that has not learned yet: no drop
])
def test_the_detector_fires_on_collapsed_runs_and_never_on_healthy_ones(history, fires_at):
    assert _replay(history) == fires_at


def test_a_warn_detector_prints_and_goes_on(capsys):
    from uniclr_tf.training.callbacks import CollapseDetector
    detector = CollapseDetector(256, 0.79, 0, on_collapse="warn")
    detector.on_epoch_end(0, {"knn_top1": 0.80})
    detector.on_epoch_end(1, {"knn_top1": 0.50})
    assert "warning: collapse at epoch 2: kNN top-1 0.5000, down from 0.8000" in capsys.readouterr().out


# --- a real collapse on the CPU, end to end ----------------------------------------------------------

# SimCLR with a huge symmetric weight on a 4-d embedding: right after the one-epoch lr warm-up the
# embedding std falls from about 0.5 to 0.06-0.12 of the 1/sqrt(D) of spread-out embeddings (TensorFlow's
# CPU reductions are not deterministic, and the fall varies from run to run), under the detector's
# threshold here (0.15; 0.02 by default, set for D = 128-2048).
COLLAPSING = ["--flagfile=configs/quickstart.flags", "--method=simclr", "--encoder=tiny", "--encoder_width=16",
              "--projector_dims=64,4", "--batch_size=64", "--max_examples=512", "--knn_max_train=512",
              "--epochs=4", "--steps_per_epoch=4", "--knn_every=1", "--warmup_epochs=1", "--base_learning_rate=1.0",
              "--gamma=30", "--collapse_std_fraction=0.15", "--nopictures", "--verbose=2"]


def _train(*flags, run_dir):
    return warm.run([sys.executable, "-m", "uniclr_tf.train", *flags, f"--run_dir={run_dir}"],
                    cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
                    env={**os.environ, "KERAS_BACKEND": "tensorflow"})


def test_a_collapse_stops_the_run_keeps_its_healthy_backup_and_is_refused_downstream(tmp_path):
    from uniclr_tf.serving import export
    from uniclr_tf.training.runs import RunFolderError
    from uniclr_tf.serving import release

    first = _train(*COLLAPSING, "--run_name=bad", run_dir=tmp_path)
    assert first.returncode == 3, first.stdout + first.stderr
    errors = [line for line in first.stderr.splitlines() if line.startswith("error: collapse at epoch")]
    assert len(errors) == 1 and "collapse at epoch 2: embedding std" in errors[0] and "--gamma" in errors[0], \
        first.stderr
    run = tmp_path / "bad"
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["status"] == "collapsed" and metrics["signal"].startswith("embedding std")
    healthy = metrics["healthy_epoch"]
    assert (healthy, metrics["epoch"]) == (1, 2)
    state = json.loads((run / "healthy" / "backup" / "state.json").read_text())
    assert state["epoch"] == healthy and (run / "healthy" / "backup" / state["weights"]).is_file()
    history = json.loads((run / "history.json").read_text())
    assert len(history) == metrics["epoch"]  # the collapse epoch is recorded

    # the same command again: refused, not resumed into the same collapse
    again = _train(*COLLAPSING, "--run_name=bad", run_dir=tmp_path)
    assert again.returncode == 3 and "this run collapsed" in again.stderr, again.stderr
    # export and release refuse it unless forced
    with pytest.raises(RunFolderError, match="collapsed.*--force"):
        export.check_run_dir(str(run))
    export.check_run_dir(str(run), force=True)
    with pytest.raises(RunFolderError, match="collapsed.*--force"):
        release.check_run(str(run), saved_model=False)

    # restart from before the collapse with other flags, for the first 3 epochs of the schedule (a 4-d
    # SimCLR embedding without γ reads 0.04 of 1/sqrt(D): the default threshold, 0.02, lets it go on)
    fixed = _train(*COLLAPSING, "--gamma=0", "--collapse_std_fraction=0.02", "--run_name=fixed",
                   f"--resume_from={run / 'healthy'}",
                   "--stop_at_epoch=3", run_dir=tmp_path)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert f"resuming at epoch {healthy + 1}" in fixed.stdout
    done = json.loads((tmp_path / "fixed" / "metrics.json").read_text())
    assert done["status"] == "finished" and done["epochs"] == 3 and "below_raw_pixel_baseline" in done


def test_on_collapse_warn_finishes_the_run_and_says_it_is_below_raw_pixels(tmp_path):
    result = _train(*COLLAPSING, "--on_collapse=warn", "--run_name=warned", run_dir=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "warning: collapse at epoch" in result.stdout
    last = result.stdout.rstrip().splitlines()[-1]
    assert last.startswith("note: ") and "is below the raw-pixel baseline" in last, last
    metrics = json.loads((tmp_path / "warned" / "metrics.json").read_text())
    assert metrics["status"] == "finished" and metrics["below_raw_pixel_baseline"] is True


# --- SimSiam's predictor at a fixed learning rate ----------------------------------------------------

@pytest.mark.parametrize("name", ["sgd", "lars"])
def test_fixed_lr_parameters_ignore_the_schedule(name):
    import keras

    from uniclr_tf.training.optimizers import build_optimizer
    schedule = keras.optimizers.schedules.PolynomialDecay(1.0, 10, end_learning_rate=0.0)
    opt = build_optimizer(name, schedule, momentum=0.0, weight_decay=0.0, fixed_learning_rate=0.5,
                          fixed_lr_patterns=["predictor"])
    fixed = keras.Variable(np.ones((3, 2), "float32"), name="predictor_dense1_kernel")
    scheduled = keras.Variable(np.ones((3, 2), "float32"), name="encoder_kernel")
    opt.build([fixed, scheduled])
    opt.iterations.assign(5)  # the schedule is at 0.5 of its peak here ...
    opt.apply([np.ones((3, 2), "float32")] * 2, [fixed, scheduled])
    trust = 1.0 if name == "sgd" else 0.001 * math.sqrt(6) / math.sqrt(6)  # LARS: eta * |w| / |g|
    np.testing.assert_allclose(fixed.numpy(), 1 - 0.5 * trust, rtol=1e-6)  # ... the fixed one takes 0.5
    np.testing.assert_allclose(scheduled.numpy(), 1 - 0.5 * trust, rtol=1e-6)
    opt.iterations.assign(8)
    opt.apply([np.ones((3, 2), "float32")] * 2, [fixed, scheduled])
    assert fixed.numpy()[0, 0] < scheduled.numpy()[0, 0]  # the schedule fell to 0.2; the fixed rate did not


def test_simsiam_learns_its_predictor_at_the_peak_rate():
    from uniclr_tf.training import cli as train
    from uniclr_tf.config.train_config import TrainConfig
    cfg = TrainConfig.make(method="simsiam", base_learning_rate=0.05, batch_size=512, epochs=10)
    opt = train.build_optimizer(cfg, steps_per_epoch=100)
    assert opt.fixed_lr_patterns == ("predictor",) or list(opt.fixed_lr_patterns) == ["predictor"]
    assert opt.fixed_learning_rate == pytest.approx(0.1)
    off = train.build_optimizer(TrainConfig.make(method="simsiam", predictor_fixed_lr=False), steps_per_epoch=10)
    assert not list(off.fixed_lr_patterns)
