"""Tests of the bench CLI (benchmarks.bench) and of the cheap (feature-group) whitening it measures."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from keras import ops

from uniclr_tf import objectives as obj
from uniclr_tf.training.launch import free_port
from uniclr_tf.objectives import whitening
from tests import warm
from tests.conftest import xla_flags

REPO_ROOT = Path(__file__).resolve().parents[1]


def _views(seed, n, d):
    rng = np.random.default_rng(seed)
    scale = rng.uniform(0.5, 2.0, size=d)
    z1 = rng.normal(size=(n, d)) * scale + 0.3
    z2 = z1 + 0.5 * rng.normal(size=(n, d)) * scale
    return z1.astype(np.float32), z2.astype(np.float32)


# ------------------------------------------------------------------------------------------------
# The CLI


def test_quick_bench_prints_the_table_and_writes_every_section(tmp_path):
    out = tmp_path / "bench.json"
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    start = time.perf_counter()
    proc = warm.run([sys.executable, "-m", "benchmarks.bench", "--quick", f"--out={out}"],
                    cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    seconds = time.perf_counter() - start
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    # Alone on 2 cores it takes ~17 s; in the suite it shares them with the other workers' tests (25-31 s on
    # three workers, once 86 s on four).
    assert seconds < 90, f"--quick took {seconds:.0f} s"
    text = proc.stdout
    assert "images/s" in text and "model step only" in text and "(d) objective" in text
    assert f"wrote {out}" in text

    result = json.loads(out.read_text())
    assert result["environment"]["backend"] == "tensorflow"
    assert result["environment"]["command"].startswith("python -m benchmarks.bench --quick")
    for key in ("a_model_only", "b_host_aug", "c_device_aug"):
        section = result[key]
        assert section["images_per_s"] > 0 and section["ms_per_step"] > 0, key
        assert section["reps"] == 3 and section["finite_loss"], key
    for key in ("b_host_aug", "c_device_aug"):
        assert 0 <= result[key]["input_wait_frac"] <= 1
    assert result["b_host_aug"]["pipeline"]["images_per_s"] > 0
    rows = result["d_objective"]
    assert {r["variant"] for r in rows} >= {"affinity", "full", "full+stop_gradient_cov", "groups=4"}
    assert {(r["n"], r["d"]) for r in rows if r["variant"] == "affinity"} == {(32, 32), (64, 32), (32, 64), (64, 64)}
    assert all(r["ms"] > 0 and r["finite"] for r in rows)
    assert result["memory"]["process_peak_rss_bytes"] > 0
    assert 0 < result["ratios"]["c_device_aug/a_model_only"]


@pytest.fixture(scope="module")
def jax_bench_runs(tmp_path_factory):
    """Section a of the --quick bench on JAX (float32, --peak_tflops=2), run at once: on one device
    (key 1), data-parallel over the 2 XLA CPU devices of one process with per-device BN (2pd), as a job
    of 2 processes x 1 device with global BN (2p: --num_processes=2, gloo collectives; process 0
    writes), and with --devices=3 (3: must fail). ``{key: (returncode, stdout, stderr, written JSON or
    None)}``. (The global-BN step of one process with 2 devices is the train CLI's, tested in
    test_distribute.py against one device.)"""
    tmp_path = tmp_path_factory.mktemp("bench")
    env = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="2",
               XLA_FLAGS=xla_flags("--xla_force_host_platform_device_count=2"),
               PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    common = [sys.executable, "-m", "benchmarks.bench", "--quick", "--sections=a", "--peak_tflops=2",
              "--precision=float32", "--reps=1"]
    runs = {1: (1, "global"), 3: (3, "global"), "2pd": (2, "per_device")}
    procs = {key: warm.popen(
        [*common, f"--devices={devices}", f"--batch_norm={bn}", f"--out={tmp_path / f'bench{key}.json'}",
         *([f"--hlo_out={tmp_path / 'step1.hlo'}"] if key == 1 else [])],
        cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for key, (devices, bn) in runs.items()}
    port = free_port()
    for pid in (0, 1):
        procs[f"2p-{pid}"] = warm.popen(
            [*common, "--devices=2", "--batch_norm=global", "--num_processes=2", f"--process_id={pid}",
             f"--profile_dir={tmp_path / 'trace'}",
             "--profile_steps=2", f"--coordinator_address=127.0.0.1:{port}", f"--out={tmp_path / 'bench2p.json'}"],
            cwd=REPO_ROOT, env={**env, "XLA_FLAGS": xla_flags("--xla_force_host_platform_device_count=1")},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = {}
    for key, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        path = tmp_path / f"bench{str(key).split('-')[0]}.json"
        out[key] = (proc.returncode, stdout, stderr, json.loads(path.read_text()) if path.exists() else None)
    out["hlo"] = tmp_path / "step1.hlo"
    return out


def test_jax_bench_data_parallel_step_is_the_one_device_step(jax_bench_runs):
    """``--devices=2`` as 2 processes x 1 device (``--num_processes=2``, Keras's DataParallel): the same
    global step as on one device (the same loss after the same steps, the same FLOPs an image), its MFU
    over both devices' peak; with ``--batch_norm=per_device`` (2 devices of one process) another loss
    (each device's statistics); and a clear error for more devices than there are."""
    code, _, stderr, _ = jax_bench_runs[3]
    assert code != 0 and "--devices=3: 2 devices here" in stderr, stderr[-2000:]
    sections = {}
    for key in (1, "2pd", "2p-0", "2p-1"):
        code, stdout, stderr, written = jax_bench_runs[key]
        assert code == 0, stdout[-3000:] + stderr[-5000:]
        sections[key] = written["a_model_only"]
    assert jax_bench_runs["2pd"][3]["config"]["batch_norm"] == "per_device"
    one, two, processes = sections[1], sections["2p-0"], jax_bench_runs["2p-0"][3]
    assert processes["config"]["processes"] == 2 and processes["config"]["devices"] == 2
    assert processes["config"]["batch_norm"] == "global"
    assert abs(sections["2pd"]["final_loss"] - one["final_loss"]) > 1e-3 * abs(one["final_loss"])
    assert two["final_loss"] == pytest.approx(one["final_loss"], rel=1e-4)
    assert two["flops_per_image"] == pytest.approx(one["flops_per_image"], rel=1e-6)
    assert two["mfu"] == pytest.approx(two["images_per_s"] * two["flops_per_image"] / (2 * 2e12))
    # --profile_dir: each process traced 2 more steps into its own folder, which the trace report reads
    from benchmarks import report
    for pid in (0, 1):
        folder = os.path.join(os.path.dirname(two["profile_dir"]), f"process-{pid}")
        assert any(e.get("ph") == "X" for e in report.load_trace(folder)), folder


def test_jax_bench_reports_the_steps_flops_and_mfu(jax_bench_runs):
    """Section a on JAX: the model's FLOPs a training step per image, exactly 3 forwards of the --quick
    model counted by hand (forward, and the backward's two products per layer); XLA's count of the
    step about that; and the MFU against ``--peak_tflops``."""
    code, stdout, stderr, written = jax_bench_runs[1]
    assert code == 0, stdout[-3000:] + stderr[-5000:]
    section = written["a_model_only"]
    # --quick: 16x16x3 views, the tiny encoder of width 8 (3x3 convolutions 3->8 at 16x16, 8->16 at 8x8,
    # 16->32 at 4x4), projector 32-64-64-32; 2 FLOPs a multiply-add, two views an image.
    convs = 9 * 3 * 8 * 16 * 16 + 9 * 8 * 16 * 8 * 8 + 9 * 16 * 32 * 4 * 4
    forward = 2 * 2 * (convs + 32 * 64 + 64 * 64 + 64 * 32)
    assert section["flops_per_image"] == 3 * forward
    assert 2 < section["xla_flops_per_image"] / forward < 4
    assert section["peak_tflops"] == 2
    assert section["mfu"] == pytest.approx(section["images_per_s"] * section["flops_per_image"] / 2e12)
    # --hlo_out: the compiled step's HLO, whose fusions the roofline report sizes (the views alone are
    # 2 x 32 x 16 x 16 x 3 float32 values, read by the step's first fusions)
    from benchmarks import report
    fusions = report.hlo_fusion_bytes(jax_bench_runs["hlo"].read_text())
    assert len(fusions) > 20 and sum(fusions.values()) > 2 * 32 * 16 * 16 * 3 * 4


def test_the_speed_report_tells_runs_apart_by_their_xla_compile_options(tmp_path):
    """A bench run records ``XLA_FLAGS``; the speed report gives runs compiled with other XLA options rows
    of their own, and leaves out the flags that only say where XLA keeps its files."""
    from benchmarks import report

    def run(name, flags, ms):
        env = {"backend": "jax", "device": "GPU X", "date": "2026-01-01T00:00:00Z"}
        if flags:
            env["xla_flags"] = flags
        cfg = {"encoder": "resnet18", "projector_dims": [8, 4], "objective": "simaffinity", "image_shape": [28, 28, 1],
               "batch_size": 4, "precision": "bfloat16"}
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"environment": env, "config": cfg,
                                    "a_model_only": {"images_per_s": 4000 / ms, "ms_per_step": ms}}))
        return str(path)

    cache, unroll = "--xla_gpu_per_fusion_autotune_cache_dir=/somewhere", "--xla_gpu_experimental_max_unroll_factor=8"
    dump = "--xla_dump_to=/elsewhere --xla_dump_hlo_as_text"
    paths = [run("plain", "", 10.0), run("tuned", f"{cache} {dump}", 12.0), run("unrolled", f"{cache} {unroll}", 9.0)]
    rows = next(t for t in report.speed(paths) if t["title"].startswith("The bench"))["rows"]
    models = sorted(row["model"] for row in rows)
    assert models == ["resnet18, 8-4, simaffinity", f"resnet18, 8-4, simaffinity, XLA_FLAGS={unroll}"]
    plain = next(row for row in rows if "XLA_FLAGS" not in row["model"])
    assert plain["n"] == 2 and plain["ms"]["mean"] == pytest.approx(11.0)


def test_epoch_gap_times_the_epoch_boundary_and_cli_vs_bench_summarises_the_run(tmp_path):
    """benchmarks.epoch_gap on a real (tiny, JAX) run: every piece of the epoch boundary is timed, the
    variant is applied and recorded, --cprofile keeps the profile; then cli_vs_bench --summarise reads the
    same run folder, and the speed report puts it in its table."""
    from tests.test_resilience import TINY  # the resilience tests' tiny run
    env = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(REPO_ROOT)}
    gap_json = tmp_path / "gap.json"
    proc = warm.run(
        [sys.executable, "-m", "benchmarks.epoch_gap", "--variant=one_piece", f"--out={gap_json}",
         f"--cprofile={tmp_path / 'run.prof'}", "--",
         *TINY, "--augment_on=device", "--epochs=5", "--steps_per_epoch=2", "--knn_every=0", f"--run_dir={tmp_path}", "--run_name=g", "--verbose=2"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "== epoch boundaries, variant one_piece" in proc.stdout
    report = json.loads(gap_json.read_text())
    assert report["variant"] == "one_piece"
    table, samples = report["table"], report["samples"]
    assert len(samples["gap between epochs (device idle)"]) == 4  # between 5 epochs
    assert all(0 < g < 60 for g in samples["gap between epochs (device idle)"])
    assert len(samples["BackupCallback.on_epoch_end"]) == 5 and len(samples["reset_metrics"]) >= 5
    assert table["writer thread: to_host"]["n"] >= 1 and table["steps of an epoch (step_seconds)"]["n"] >= 1
    assert (tmp_path / "run.prof").stat().st_size > 0 and "== epoch-end work and data stream" in proc.stdout

    summary_json = tmp_path / "summary.json"
    proc = warm.run([sys.executable, "-m", "benchmarks.cli_vs_bench", f"--summarise={tmp_path / 'g'}",
                     "--model_rate=1000", "--process_seconds=100", f"--out={summary_json}", "--label=tiny"],
                    cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(summary_json.read_text())
    assert result["epochs"] == 5 and result["steps_per_epoch"] == 2 and result["batch_size"] == 64
    assert 0 <= result["share_outside_training_steps_measured"] < 1
    assert result["cli_training_images_per_s"] > 0 and "ratio CLI / bench" in proc.stdout
    phases = result["process_phases_seconds"]  # the run's own clock by phase, the fit inside "training"
    assert phases["training"] >= result["cli_fit_wall_seconds"] - 0.01 and "CLI process by phase" in proc.stdout
    assert phases["wall"] == pytest.approx(sum(v for k, v in phases.items() if k != "wall"))
    from benchmarks import report
    tables = report.speed([str(summary_json)])
    row = tables[0]["rows"][0]
    assert row["run"] == "tiny" and row["bench"] == 1000 and row["ratio"] == result["ratio_cli_to_bench"]
    assert row["process_s"] == 100
    process = next(t for t in tables if "process by phase" in t["title"])["rows"][0]  # metrics.json's phases
    assert process["run"] == "tiny" and process["process"] == 100 and process["model"] == phases["model"]


def test_bad_sections_flag_is_a_usage_error():
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2")
    proc = warm.run([sys.executable, "-m", "benchmarks.bench", "--quick", "--sections=a,x"],
                    cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "--sections" in proc.stderr and "'x'" in proc.stderr


def test_zca_eigh_times_every_implementation_against_the_float64_whitening(capsys):
    from benchmarks import zca_eigh

    cov = zca_eigh.covariances(24, count=2)
    w = zca_eigh.whitening_reference(cov, 0.01)
    for c, m in zip(cov, w):  # W (Σ + εI) W = I: the ZCA whitening of Σ with ε
        np.testing.assert_allclose(m @ (c + 0.01 * np.eye(24)) @ m, np.eye(24), atol=1e-9)
        np.testing.assert_allclose(m, m.T, atol=1e-12)
    zca_eigh.main(["--n=24", "--repeats=1"])
    rows = {r.split("|")[1].strip(): r for r in capsys.readouterr().out.splitlines()[3:]}
    assert "default" in rows
    timed = [r for r in rows.values() if "not available" not in r]
    for row in timed:
        four, batched, error = (float(x) for x in row.split("|")[2:5])
        assert four > 0 and batched > 0 and error < 1e-4
    with pytest.raises(SystemExit):
        zca_eigh.main(["--n=1"])


def test_bn_sums_pallas_kernel_gives_batch_norms_sums(capsys):
    """benchmarks.bn_sums' Pallas kernel (in Pallas' interpreter): Σx and Σx² of a bfloat16 activation, and
    the backward pass's Σg and Σg·x̂ through the ReLU, against float64 NumPy, rows left over by the last
    program masked; the CLI prints a row a shape and writes them."""
    import jax.numpy as jnp
    from benchmarks import bn_sums

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(64 * 7, 16)), jnp.bfloat16)
    dy = jnp.asarray(rng.normal(size=(64 * 7, 16)), jnp.bfloat16)
    mean, inv, gamma, beta = (jnp.asarray(v, jnp.float32) for v in (0.1 * rng.normal(size=16),
                              1 + rng.random(16), rng.normal(size=16), 0.1 * rng.normal(size=16)))
    x64, dy64 = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    x_hat = (x64 - np.asarray(mean)) * np.asarray(inv)
    g = np.where(x_hat * np.asarray(gamma) + np.asarray(beta) > 0, dy64, 0.0)
    for programs in (1, 3):  # 7 row tiles: 7 a program, or 3 + 3 + 1 of 3 programs (2 masked)
        got = bn_sums.pallas_sums(x, jnp.float32(0), bm=64, bc=16, programs=programs, interpret=True)
        np.testing.assert_allclose(got, [x64.sum(0), (x64 ** 2).sum(0)], rtol=1e-5, atol=1e-3)
        got = bn_sums.pallas_sums(x, jnp.float32(0), (dy, mean, inv, gamma, beta), bm=64, bc=16,
                                  programs=programs, interpret=True)
        np.testing.assert_allclose(got, [g.sum(0), (g * x_hat).sum(0)], rtol=1e-5, atol=1e-3)
    with pytest.raises(ValueError, match="does not tile"):
        bn_sums.pallas_sums(x[:100], jnp.float32(0), interpret=True)
    rows = bn_sums.main(["--interpret"])
    assert len(capsys.readouterr().out.splitlines()) == 2 + len(rows) == 4
    assert all(r["pallas_forward_error"] < 1e-5 and r["pallas_backward_error"] < 1e-5 for r in rows)


def test_pool_grad_times_the_same_gradient_fenced_and_fused(tmp_path):
    """benchmarks.pool_grad at a tiny shape: the fenced and the fused gather give the same gradient (the
    barrier changes the schedule, not the maths); Keras' differs at most where ReLU zeros tie; the file has
    a row a variant."""
    import json

    from benchmarks import pool_grad

    result = pool_grad.main(["--images=2", "--size=8", f"--out={tmp_path / 'p.json'}"])
    rows = {r["variant"]: r for r in result["rows"]}
    assert list(rows) == list(pool_grad.VARIANTS) and rows["fused"]["max_error"] == 0.0
    assert all(r["ms"] > 0 and r["images"] == 2 for r in rows.values())
    assert json.loads((tmp_path / "p.json").read_text())["rows"] == result["rows"]


# ------------------------------------------------------------------------------------------------
# Cheap whitening: feature groups


def test_one_group_is_exactly_plain_whitening():
    z1, z2 = _views(0, 64, 16)
    for sg in (False, True):
        w = whitening.whiten(z1, z2, stop_gradient_cov=sg)
        g = whitening.group_whiten(z1, z2, groups=1, stop_gradient_cov=sg)
        for a, b in zip(w, g):
            np.testing.assert_array_equal(ops.convert_to_numpy(a), ops.convert_to_numpy(b))
    assert float(obj.sim_trace_loss(z1, z2, groups=1)) == float(obj.sim_trace_loss(z1, z2))
    assert float(obj.sim_whitening_loss(z1, z2, groups=1)) == float(obj.sim_whitening_loss(z1, z2))


@pytest.mark.parametrize("groups", [2, 4, 8])
def test_group_whitening_whitens_each_group_to_identity(groups):
    n, d = 128, 32
    z1, z2 = _views(1, n, d)
    w1, w2 = whitening.group_whiten(z1, z2, groups=groups, eps=1e-6)
    w = np.concatenate([ops.convert_to_numpy(w1), ops.convert_to_numpy(w2)]).astype(np.float64)
    assert w.shape == (2 * n, d)
    np.testing.assert_allclose(w.mean(0), 0.0, atol=1e-4)
    cov = w.T @ w / (2 * n)
    size = d // groups
    for g in range(groups):
        block = cov[g * size:(g + 1) * size, g * size:(g + 1) * size]
        np.testing.assert_allclose(block, np.eye(size), atol=2e-3)
    # Across groups the correlations are left in (block-diagonal whitening, not full).
    off = cov[:size, size:2 * size]
    assert np.abs(off).max() > 0.05


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_group_whitening_matches_whitening_each_group_alone(groups):
    """Each group's whitened features equal plain whitening of that group's columns."""
    z1, z2 = _views(2, 96, 24)
    w1, w2 = whitening.group_whiten(z1, z2, groups=groups)
    size = 24 // groups
    for g in range(groups):
        cols = slice(g * size, (g + 1) * size)
        r1, r2 = whitening.whiten(z1[:, cols], z2[:, cols])
        np.testing.assert_allclose(ops.convert_to_numpy(w1)[:, cols], ops.convert_to_numpy(r1), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(ops.convert_to_numpy(w2)[:, cols], ops.convert_to_numpy(r2), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("sg", [False, True])
def test_grouped_simtrace_is_the_sum_of_the_groups_simtrace_value_and_gradient(sg):
    import tensorflow as tf

    groups, n, d = 4, 64, 32
    z1, z2 = _views(3, n, d)
    size = d // groups
    a, b = tf.constant(z1), tf.constant(z2)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([a, b])
        grouped = obj.sim_trace_loss(a, b, groups=groups, stop_gradient_cov=sg)
        summed = sum(obj.sim_trace_loss(a[:, g * size:(g + 1) * size], b[:, g * size:(g + 1) * size],
                                        stop_gradient_cov=sg) for g in range(groups))
    np.testing.assert_allclose(float(grouped), float(summed), rtol=1e-5)
    for x in (a, b):
        np.testing.assert_allclose(tape.gradient(grouped, x).numpy(), tape.gradient(summed, x).numpy(),
                                   rtol=1e-4, atol=1e-5)
    # Stop-gradient changes the gradient, not the value (as for full whitening).
    assert float(obj.sim_trace_loss(a, b, groups=groups, stop_gradient_cov=True)) == pytest.approx(
        float(obj.sim_trace_loss(a, b, groups=groups)), rel=1e-6)


def test_grouped_simwhitening_runs_in_both_modes_and_low_precision():
    z1, z2 = _views(4, 64, 32)
    for mode in ("cholesky", "one_sided"):
        value = float(obj.sim_whitening_loss(z1, z2, groups=4, mode=mode))
        assert np.isfinite(value)
    low = float(obj.sim_trace_loss(ops.cast(z1, "bfloat16"), ops.cast(z2, "bfloat16"), groups=4))
    ref = float(obj.sim_trace_loss(ops.cast(ops.cast(z1, "bfloat16"), "float32"),
                                   ops.cast(ops.cast(z2, "bfloat16"), "float32"), groups=4))
    assert low == pytest.approx(ref, rel=1e-5)


@pytest.mark.parametrize("groups", [0, 3, 2.5, True])
def test_bad_groups_name_the_argument(groups):
    z1, z2 = _views(5, 16, 8)
    with pytest.raises(ValueError, match="groups"):
        obj.sim_trace_loss(z1, z2, groups=groups)


def test_channel_stats_read_at_most_10k_images_and_a_bounded_number_of_pixels():
    from benchmarks.bench import channel_stats

    rng = np.random.default_rng(0)
    small = rng.integers(0, 256, (10_050, 28, 28, 1), dtype=np.uint8)
    small[10_000:] = 255  # past the first 10,000: must not count
    ref = small[:10_000].astype(np.float64) / 255.0
    mean, std = channel_stats(small)
    np.testing.assert_allclose(mean, [ref.mean()], rtol=1e-12)
    np.testing.assert_allclose(std, [ref.std()], rtol=1e-12)
    big = rng.integers(0, 256, (5, 64, 64, 3), dtype=np.uint8)
    big[2:] = 0
    big[..., 2] = 7  # a constant channel: its std is floored at 1/255
    mean, std = channel_stats(big, max_pixels=2 * 64 * 64 + 100)  # room for 2 images only
    first = big[:2].reshape(-1, 3).astype(np.float64) / 255.0
    np.testing.assert_allclose(mean, first.mean(0), rtol=1e-12)
    np.testing.assert_allclose(std[:2], first.std(0)[:2], rtol=1e-12)
    assert std[2] == 1 / 255 and np.isclose(mean[2], 7 / 255, rtol=1e-12)
