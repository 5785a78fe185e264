"""Distribution parity: 2 logical CPU replicas (MirroredStrategy), XLA vs eager, JAX DataParallel.

Each run compares a distributed run with a single-device run of the same global batch from the same
initial weights: the losses and the weights after k steps must agree to 1e-5 (the gathered
affinity/covariance, the synchronized BN and the replica loss scaling must all be right).
"""

import sys

import numpy as np
import pytest

from tests import warm
from tests.conftest import PythonJob, run_python_snippets, xla_flags
from uniclr_tf import methods
from uniclr_tf.training.launch import free_port

COMMON = r"""
import json, os
import numpy as np
import keras
from uniclr_tf import methods
from uniclr_tf.nets import encoders
from uniclr_tf.nets import heads
from uniclr_tf.nets.model import UniCLR

STEPS = 3

def build(name, ema):
    # A tiny model of method `name` (its own heads), with an EMA target of momentum `ema` if given.
    keras.utils.set_random_seed(1)
    cls = methods.get_class(name)
    options = dict(queue_size=24) if "queue_size" in cls.defaults else dict()
    if name == "zero_cl":  # a well-conditioned whitening (see check())
        options["zca_eps"] = 1.0
    if ema is not None:
        options["ema_momentum"] = ema
    method = cls(**options)
    norm = encoders.BatchNorm(synchronized=True)
    enc = encoders.build_encoder("tiny", (16, 16, 1), width=4, norm=norm)
    proj = method.build_projector(16, (32, 8), norm=norm)
    pred = heads.predictor(8, 16, norm=norm) if method.uses_predictor else None
    return UniCLR(enc, proj, pred, method=method, ema_total_steps=10)

rng = np.random.default_rng(0)
v1 = rng.normal(size=(16, 16, 16, 1)).astype("float32")
VIEWS = (v1, (v1 + 0.3 * rng.normal(size=v1.shape)).astype("float32"))
def train(case, scope, make_data, **compile_kwargs):
    with scope:
        model = build(*case)
        model.set_weights(INIT[case])
        model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), **compile_kwargs)
    hist = model.fit(make_data(), epochs=STEPS, steps_per_epoch=1, verbose=0).history
    if keras.backend.backend() == "jax" and keras.distribution.distribution() is not None:
        # Under DataParallel the variables are replicated over both host devices.
        assert len(model.trainable_variables[0].value.sharding.device_set) == 2
    return hist["objective_loss"], [np.asarray(w) for w in model.get_weights()]

CASES = {cases!r}
INIT = {{case: build(*case).get_weights() for case in CASES}}
RESULTS = {{}}

def report(case, a, b):
    (la, wa), (lb, wb) = a, b
    diff = max(float(np.max(np.abs(x - y))) for x, y in zip(wa, wb))
    RESULTS["%s/%s" % case] = {{"loss_a": la, "loss_b": lb, "max_weight_diff": diff}}
"""

MIRRORED = r"""
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
""" + COMMON + r"""
data = lambda: tf.data.Dataset.from_tensor_slices(VIEWS).batch(16, drop_remainder=True).repeat()
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
assert strategy.num_replicas_in_sync == 2
for case in CASES:
    # The single-device reference runs eagerly (the same numbers as its graph, without a second trace per
    # case: XLA_CASES below checks eager against compiled); the two replicas run the traced step.
    report(case, train(case, tf.distribute.get_strategy().scope(), data, run_eagerly=True),
           train(case, strategy.scope(), data))
# Per-replica statistics (authors' code): each replica's loss sees only its half of the batch, so
# the first loss equals the mean of the two half-batch losses of a single-device model (whose BN,
# like the synchronized BN, normalises over the whole batch).
if {per_replica!r}:  # in one process of the test
    case = ("simtrace", None)
    INIT.setdefault(case, build(*case).get_weights())
    with strategy.scope():
        model = build(*case)
        model.set_weights(INIT[case])
        model.gather_across_replicas = False
        model.compile(optimizer=keras.optimizers.SGD(0.0))
    local = model.fit(data(), epochs=1, steps_per_epoch=1, verbose=0).history["objective_loss"][0]
    ref = build(*case)
    ref.set_weights(INIT[case])
    _, _, online, target = ref._embed(list(VIEWS), True)  # synchronized BN: statistics of all 16 rows
    halves = [float(ref.method.pair_loss(online[0][i:i + 8], target[1][i:i + 8], dict())[0]) for i in (0, 8)]
    RESULTS["per_replica"] = {{"local": local, "halves_mean": float(np.mean(halves)),
                              "global": float(ref.compute_objective(VIEWS)[0])}}
print(json.dumps(RESULTS))
"""

XLA = r"""
import contextlib
import tensorflow as tf
""" + COMMON + r"""
data = lambda: tf.data.Dataset.from_tensor_slices(VIEWS).batch(16, drop_remainder=True).repeat()
for case in CASES:
    report(case, train(case, contextlib.nullcontext(), data, run_eagerly=True),
           train(case, contextlib.nullcontext(), data, jit_compile=True))
print(json.dumps(RESULTS))
"""

JAX_DP = r"""
import contextlib
import jax
""" + COMMON + r"""
assert len(jax.devices()) == 2, jax.devices()
def data():
    for _ in range(STEPS):
        yield VIEWS
for case in CASES:
    keras.distribution.set_distribution(None)
    single = train(case, contextlib.nullcontext(), data)
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax.devices()))
    report(case, single, train(case, contextlib.nullcontext(), data))
print(json.dumps(RESULTS))
"""


# Every registered method with its defaults (global negatives, covariance, cross-correlation and
# MoCo's queue across replicas). Five of them train an EMA target (MoCo v2/v3, BYOL, CO2, DINO): the
# UniCLR objectives with the EMA trick take the same target path (and have cases of their own in
# XLA_CASES and JAX_DP_CASES below); each case here costs two replicas' tracing, ~5 s of CPU.
ALL_CASES = [(name, None) for name in methods.names()]


def check(results, cases):
    per_replica = results.pop("per_replica", None)
    if per_replica is not None:
        np.testing.assert_allclose(per_replica["local"], per_replica["halves_mean"], rtol=1e-4)
        assert abs(per_replica["local"] - per_replica["global"]) > 1e-3
    assert len(results) == len(cases)
    for case, out in results.items():
        np.testing.assert_allclose(out["loss_b"], out["loss_a"], rtol=1e-5, atol=1e-5, err_msg=case)
        # CO2's consistency softmax at temperature 0.04 multiplies float32 rounding (the gather's
        # summation order) by 25: its weights agree to 2e-5 after 3 steps, the others to 1e-5.
        # Zero-CL's instance-wise whitening: the 16 x 16 covariance of 16 rows standardised over 8
        # features has rank <= 7 (and always one of its two covariances is singular: rank <= D - 1
        # and <= N - 1), so its null space is scaled by 1/sqrt(zca_eps) and float32 rounding there is
        # magnified by an amount that depends on the CPU's kernels: with the default zca_eps = 0.01
        # the weights of 2 replicas and 1 device differed by 1.2e-4 on one CPU and 2.1e-3 on
        # another, with equal losses (float64: 2e-13, so rounding, not a wrong gather). With
        # zca_eps = 1.0 (build()) they agree to 2e-6, and a wrong gather still changes the loss.
        tolerance = 5e-5 if case.startswith("co2") else 1e-5
        assert out["max_weight_diff"] <= tolerance, (case, out)


def test_mirrored_two_replicas_match_one_device():
    """Every method: losses and weights after 3 steps of the traced two-replica step against the eager
    one-device step. Half of the cases in each of two processes running at the same time (tracing takes
    one core each)."""
    halves = ALL_CASES[::2], ALL_CASES[1::2]
    first, second = run_python_snippets(*((MIRRORED.format(cases=half, per_replica=i == 0), "tensorflow")
                                          for i, half in enumerate(halves)))
    assert "per_replica" in first and "per_replica" not in second
    check({**first, **second}, ALL_CASES)


XLA_CASES = [("simwhitening", 0.9), ("simtrace", None)]
JAX_DP_CASES = [("simtrace", 0.9), ("simaffinity", None)]


@pytest.fixture(scope="module")
def one_core_runs():
    """The XLA and the JAX DataParallel runs (one core each), started together: 31 s -> 23 s on the 2-core machine."""
    jobs = {"xla": PythonJob(XLA.format(cases=XLA_CASES)),
            "jax_dp": PythonJob(JAX_DP.format(cases=JAX_DP_CASES), backend="jax",
                                env={"XLA_FLAGS": xla_flags("--xla_force_host_platform_device_count=2")})}
    yield jobs
    for job in jobs.values():
        job.kill()


def test_xla_compiled_step_matches_eager(one_core_runs):
    check(one_core_runs["xla"].result(), XLA_CASES)


def test_jax_data_parallel_on_two_host_devices(one_core_runs):
    check(one_core_runs["jax_dp"].result(), JAX_DP_CASES)


def _assert_same_weights(path_a, path_b):
    """Every array of two ``.weights.h5`` files equal to float tolerance (and more than 20 of them)."""
    import h5py

    def arrays(path):
        found = {}
        with h5py.File(path, "r") as f:
            f.visititems(lambda k, v: found.__setitem__(k, np.array(v)) if isinstance(v, h5py.Dataset) else None)
        return found

    a, b = arrays(path_a), arrays(path_b)
    assert a.keys() == b.keys() and len(a) > 20
    for key in a:
        if "augmenter_seed_" in key or "augmenter_tf_rng_" in key:
            continue  # the augmenter's generators in the model: a process's own seeds, not the maths compared
        np.testing.assert_allclose(b[key], a[key], rtol=1e-5, atol=1e-6, err_msg=key)


def _signal_process_1_after_epoch_1(procs, run_dir):
    """A real SIGTERM to ``procs[1]`` alone of a 2-process job once ``run_dir``'s history holds an
    epoch: both processes must exit 143, and the backup be at the step they agreed on. Returns their
    outputs, the lines that announce the stop step, and that step."""
    import json
    import signal
    import time

    history = run_dir / "history.json"
    deadline = time.monotonic() + 300
    while not (history.exists() and history.read_text().strip()) and time.monotonic() < deadline:
        assert all(p.poll() is None for p in procs), [p.communicate()[1][-2000:] for p in procs]
        time.sleep(0.1)
    procs[1].send_signal(signal.SIGTERM)
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [143, 143], [o[1][-2000:] for o in outs]
    agreed = [line for o in outs for line in o[0].splitlines() if "the job stops at step" in line]
    assert agreed, [o[0][-2000:] for o in outs]
    step = int(agreed[0].split("stops at step ")[1].split()[0])
    state = json.loads((run_dir / "backup" / "state.json").read_text())
    assert state["step"] == step and state["reason"] == "SIGTERM"
    return outs, agreed, step


def test_jax_job_stops_at_one_step_when_one_process_is_signalled_resumes_and_equals_one_process(tmp_path):
    """The real train CLI as a JAX multi-controller job of 2 processes (1 CPU device each, gloo
    collectives, each process feeding its half of every batch). A real SIGTERM to process 1 alone: both
    processes stop at the step they agree on through the coordinator (process 1's step + the margin),
    neither waits for the other for ever, both exit 143 (process 0 saves the backup); the same command,
    through ``python -m uniclr_tf.launch`` (which starts the processes itself), resumes. The job ends with
    one continuous history, and with the same losses and weights (kNN to one test image) as 1 process with
    2 devices trained without a stop (run at the same time): the global gather, the sync BN, each process's half of the
    batch and the resume all agree. Without the agreement (or with a margin of 3 steps) process 0 went on
    stepping and the job hung until killed."""
    import json
    import os
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    args = ["--flagfile=configs/quickstart.flags", "--method=simclr", "--encoder_width=8", "--projector_dims=64,32",
            "--batch_size=32", "--max_examples=512", "--knn_max_train=256", "--warmup_epochs=0", "--epochs=7",
            "--steps_per_epoch=20", "--knn_every=3", "--on_collapse=warn", "--augment_on=device",
            "--strategy=data_parallel", "--nopictures", f"--run_dir={tmp_path}"]

    def env(devices):
        return {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(REPO_ROOT),
                "XLA_FLAGS": xla_flags(f"--xla_force_host_platform_device_count={devices}")}

    def start(devices, *extra):
        return warm.popen([sys.executable, "-m", "uniclr_tf.train", *args, *extra], cwd=REPO_ROOT, env=env(devices),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    port = free_port()
    job = [start(1, "--run_name=job", "--num_processes=2", f"--process_id={i}", f"--coordinator_address=127.0.0.1:{port}")
           for i in range(2)]
    single = start(2, "--run_name=one")
    outs, agreed, step = _signal_process_1_after_epoch_1(job, tmp_path / "job")
    assert len(agreed) == 1 and agreed[0].startswith("process 1:"), agreed  # process 1 published, 0 followed
    assert 20 < step < 140 and "process 0 saved the backup" in outs[1][0] + outs[1][1]

    launcher = warm.run([sys.executable, "-m", "uniclr_tf.launch", "--processes=2", f"--log_dir={tmp_path / 'logs'}",
                         "--", *args, "--run_name=job"], cwd=REPO_ROOT, env=env(1), capture_output=True, text=True,
                        timeout=300)
    assert launcher.returncode == 0, launcher.stdout[-2000:] + launcher.stderr[-3000:]
    assert "launch: 2 processes" in launcher.stdout
    stopped_in = step // 20 + 1
    assert f"resuming at epoch {stopped_in}, step {step}" in launcher.stdout  # process 0 writes here
    assert "resuming at" in (tmp_path / "logs" / "process-1.log").read_text()

    _, err = single.communicate(timeout=600)
    assert single.returncode == 0, err[-3000:]
    one, two = (json.loads((tmp_path / name / "history.json").read_text()) for name in ("one", "job"))
    assert [e["epoch"] for e in two] == [e["epoch"] for e in one] == [1, 2, 3, 4, 5, 6, 7]
    # The epoch the stop fell in averages only its steps after the resume; every other epoch is whole.
    whole = [i for i in range(7) if i + 1 != stopped_in or step % 20 == 0]
    np.testing.assert_allclose([two[i]["loss"] for i in whole], [one[i]["loss"] for i in whole], rtol=1e-5)
    # The weights, batch-norm statistics and losses are bit-identical, but the kNN monitor on XLA's CPU devices is
    # not bit-reproducible under load: the 1-process run's epoch-3 kNN read 0.4902 alone and 0.4980 beside the
    # job (whose own read 0.5000), so a near-tie may fall either way: at most one test image of the 512 apart.
    knn_two, knn_one = ([e.get("knn_top1") for e in h] for h in (two, one))
    assert [k is None for k in knn_two] == [k is None for k in knn_one] and sum(k is not None for k in knn_one) == 2
    assert all(abs(a - b) <= 1 / 512 + 1e-9 for a, b in zip(knn_two, knn_one) if a is not None), (knn_two, knn_one)
    _assert_same_weights(tmp_path / "one" / "model.weights.h5", tmp_path / "job" / "model.weights.h5")


def test_launch_builds_one_command_per_gpu_and_refuses_the_flags_it_sets():
    from uniclr_tf.training import launch

    jobs = launch.commands(["--flagfile=configs/simtrace.flags"], 2, ["3", "5"], 1234)
    assert [env for _, env in jobs] == [{"KERAS_BACKEND": "jax", "CUDA_VISIBLE_DEVICES": "3"},
                                        {"KERAS_BACKEND": "jax", "CUDA_VISIBLE_DEVICES": "5"}]
    assert jobs[1][0][-5:] == ["--flagfile=configs/simtrace.flags", "--strategy=data_parallel", "--num_processes=2",
                               "--process_id=1", "--coordinator_address=127.0.0.1:1234"]
    kept = launch.commands(["--strategy=mirrored"], 1, [], 1)[0][0]
    assert "--strategy=mirrored" in kept and "--strategy=data_parallel" not in kept
    with pytest.raises(SystemExit, match="--process_id is set by the launcher"):
        launch.commands(["--process_id=1"], 2, [], 1)
    with pytest.raises(SystemExit) as refused:  # before any process starts
        launch.main(["--processes=1", "--stop_timeout=-1", "--", "--flagfile=configs/simtrace.flags"])
    assert refused.value.code == 2


def test_launch_coordinator_port_is_free_on_every_interface_and_outside_the_ephemeral_range(tmp_path):
    import random
    import socket
    import unittest.mock

    from uniclr_tf.training import launch

    low, high = launch.ephemeral_ports()
    for _ in range(20):
        port = launch.free_port()
        assert not low <= port <= high and launch.port_is_free(port)
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("20000\t60999\n")
    assert launch.ephemeral_ports(str(ranges)) == (20000, 60999)
    assert launch.ephemeral_ports(str(tmp_path / "missing")) == (49152, 65535)
    # A port somebody listens on (on any interface) is not free, and free_port passes it over.
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        taken = held.getsockname()[1]
        assert not launch.port_is_free(taken)

        class Rigged(random.Random):  # offers the taken port first, then one it is told is free
            offers = [taken, 12345]

            def randint(self, a, b):
                return self.offers.pop(0) if self.offers else super().randint(a, b)

        with unittest.mock.patch.object(launch, "ephemeral_ports", return_value=(taken + 1, 65535)), \
                unittest.mock.patch.object(launch, "port_is_free", side_effect=lambda p: p != taken):
            assert launch.free_port(rng=Rigged(0)) == 12345


def test_launch_cpu_binding_gives_each_process_a_disjoint_share_of_its_gpus_cpus():
    from uniclr_tf.training import launch

    assert launch.parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert launch._cpulist([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8" and launch._cpulist(None) == "all"
    # Two NUMA nodes of 4 CPUs, two GPUs on each: each process gets half of its GPU's node.
    local = {"0": [0, 1, 2, 3], "1": [0, 1, 2, 3], "2": [4, 5, 6, 7], "3": [4, 5, 6, 7]}
    assert launch.cpu_sets(4, range(8), local, ["0", "1", "2", "3"]) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    # Only the CPUs this launcher may use count; without the GPUs' nodes, an equal share in order.
    assert launch.cpu_sets(2, [1, 2, 3, 5, 6, 7], local, ["0", "2"]) == [[1, 2, 3], [5, 6, 7]]
    assert launch.cpu_sets(3, [4, 0, 2, 6, 5, 1], {}, ()) == [[0, 1], [2, 4], [5, 6]]
    assert launch.cpu_sets(3, [0, 1], {}, ()) == [None, None, None]  # fewer CPUs than processes: no binding


@pytest.mark.skipif(not hasattr(__import__("os"), "sched_getaffinity"), reason="CPU affinity is Linux's")
def test_launch_binds_a_started_process_to_its_cpus():
    import os
    import subprocess

    from uniclr_tf.training import launch

    cpu = min(os.sched_getaffinity(0))
    p = launch.start([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"], cpus=[cpu],
                     stdout=subprocess.PIPE, text=True)
    assert p.communicate(timeout=60)[0].strip() == f"[{cpu}]"


def _stubborn_children(n):
    """n processes started as the launcher starts the job's, each ignoring SIGTERM (as a process hung in a
    collective never reaches its stop step), once each has said it is ready."""
    import subprocess
    import sys

    from uniclr_tf.training import launch

    code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
            "time.sleep(120)")
    procs = [launch.start([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(n)]
    assert [p.stdout.readline().strip() for p in procs] == ["ready"] * n
    return procs


def test_launch_kills_processes_that_do_not_stop_after_the_signal_or_at_a_second_ctrl_c(capsys):
    import signal
    import time

    from uniclr_tf.training import launch
    from uniclr_tf.training import stop_signals

    job = launch.Job(_stubborn_children(2), stop_timeout_s=1.0)
    started = time.monotonic()
    job.forward(signal.SIGTERM)
    assert job.wait() == 137 and 1.0 < time.monotonic() - started < 30
    out = capsys.readouterr().out
    assert out.count("not stopped 1 s after the signal") == 2 and "process 1 exited with 137" in out

    # 0: wait for ever. The same signal delivered twice (timeout sends it to the launcher and its process
    # group) changes nothing; a second Ctrl-C kills.
    job = launch.Job(_stubborn_children(1), stop_timeout_s=0)
    job.forward(signal.SIGTERM)
    job.forward(signal.SIGTERM)
    job.forward(signal.SIGINT)
    time.sleep(stop_signals.REPEAT_S + 0.2)
    assert job.procs[0].poll() is None
    job.forward(signal.SIGTERM)
    assert job.procs[0].poll() is None
    job.forward(signal.SIGINT)
    assert job.wait() == 137 and "killing process 0 (Ctrl-C a second time)" in capsys.readouterr().out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's parent-death signal is Linux's")
def test_launch_processes_die_with_a_killed_launcher(tmp_path):
    """A launcher killed with SIGKILL (``timeout --kill-after``, a scheduler) takes its processes with it:
    before, they ran on in their own sessions, holding their GPUs, when hung in a collective."""
    import os
    import signal
    import subprocess
    import time

    from tests.conftest import REPO_ROOT

    parent = warm.popen([sys.executable, "-c", "import sys, time; from uniclr_tf.training import launch; "
                         "p = launch.start([sys.executable, '-c', 'import time; time.sleep(120)']); "
                         "print(p.pid, flush=True); time.sleep(120)"],
                        cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, stdout=subprocess.PIPE,
                        text=True)
    child = int(parent.stdout.readline())

    def alive():
        try:
            with open(f"/proc/{child}/status") as f:
                return "\nState:\tZ" not in f.read()  # a zombie has ended
        except FileNotFoundError:
            return False

    assert alive()
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive():
        os.kill(child, signal.SIGKILL)
        pytest.fail("the launcher's process outlived it")


def test_tf_workers_stop_at_one_step_when_one_worker_is_signalled_resume_and_equal_one_worker(tmp_path):
    """The real train CLI under ``--strategy=multi_worker`` (tf.distribute.MultiWorkerMirroredStrategy,
    ``TF_CONFIG``, 2 worker processes on localhost with 1 CPU device each, tf.data auto-sharded, the views
    made in tf.data). A real SIGTERM to worker 1 alone: both workers stop at the step their all-reduce of
    the signals agrees on (a multiple of 16), both exit 143 with worker 0's backup at that step, and the
    same command resumes the job to one continuous history. It ends with the same losses, kNN and weights
    as 1 process with 2 logical CPU devices under MirroredStrategy trained without a stop (run at the
    same time): the global gather, sync BN, the sharded stream and the resumed views (keyed by batch) all
    agree. Before, worker 0 went on stepping and waited for worker 1 in the next step's collectives; the
    in-epoch divergence check failed reading the workers' trackers; and a resumed job drew other views."""
    import json
    import os
    import subprocess

    from tests.conftest import REPO_ROOT

    args = ["--flagfile=configs/quickstart.flags", "--method=simclr", "--encoder_width=8", "--projector_dims=64,32",
            "--batch_size=32", "--max_examples=512", "--knn_max_train=256", "--warmup_epochs=0", "--epochs=3",
            "--steps_per_epoch=60", "--knn_every=3", "--nopictures", f"--run_dir={tmp_path}"]
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(REPO_ROOT),
           "CUDA_VISIBLE_DEVICES": ""}
    env.pop("TF_CONFIG", None)

    def start(extra_env, *extra):
        return warm.popen([sys.executable, "-m", "uniclr_tf.train", *args, *extra], cwd=REPO_ROOT, text=True,
                          env={**env, **extra_env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def start_job():
        cluster = {"worker": [f"localhost:{free_port()}" for _ in range(2)]}
        return [start({"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})},
                      "--strategy=multi_worker", "--run_name=job") for i in range(2)]

    history = tmp_path / "job" / "history.json"
    job = start_job()
    single = start({"UNICLR_TF_CPU_DEVICES": "2"}, "--strategy=mirrored", "--run_name=one")
    outs, agreed, step = _signal_process_1_after_epoch_1(job, tmp_path / "job")
    assert len(agreed) == 2 and agreed[0].split(": ", 1)[1] == agreed[1].split(": ", 1)[1], agreed
    assert step % 16 == 0 and 60 <= step < 180 and "(SIGTERM)" in agreed[0]

    procs = start_job()
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    stopped_in = step // 60 + 1
    assert f"resuming at epoch {stopped_in}, step {step}" in outs[0][0]
    assert json.loads((tmp_path / "job" / "metrics.json").read_text())["status"] == "finished"
    assert (tmp_path / "job" / "tb").is_dir() and not (tmp_path / "job" / "backup" / "tmp").exists()

    _, err = single.communicate(timeout=600)
    assert single.returncode == 0, err[-3000:]
    one, two = json.loads((tmp_path / "one" / "history.json").read_text()), json.loads(history.read_text())
    assert [e["epoch"] for e in two] == [e["epoch"] for e in one] == [1, 2, 3]
    # The epoch the stop fell in averages only its steps after the resume; every other epoch is whole.
    whole = [i for i in range(3) if i + 1 != stopped_in or step % 60 == 0]
    np.testing.assert_allclose([two[i]["loss"] for i in whole], [one[i]["loss"] for i in whole], rtol=1e-5)
    assert [e.get("knn_top1") for e in two] == [e.get("knn_top1") for e in one] and "knn_top1" in one[2]
    _assert_same_weights(tmp_path / "one" / "model.weights.h5", tmp_path / "job" / "model.weights.h5")
