"""Runs you can leave running: resume, kill -9, signals, divergence, a full disk, run-folder hygiene.

Every test drives the real train CLI in a subprocess on a slice of Fashion-MNIST with a tiny
encoder, and checks what a user would find in the run folder afterwards.
"""

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests import warm
from tests.conftest import REPO_ROOT, xla_flags

TINY = ["--flagfile=configs/quickstart.flags", "--encoder_width=8", "--projector_dims=64,32", "--batch_size=64",
        "--max_examples=512", "--knn_max_train=512", "--warmup_epochs=0", "--nopictures"]


def cli(*args, backend="tensorflow", env=None):
    return [sys.executable, "-m", "uniclr_tf.train", *args], {
        **os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(REPO_ROOT),
        "PYTHONUNBUFFERED": "1",
        **(env or {})}


def run_cli(*args, backend="tensorflow", timeout=600, env=None):
    cmd, full_env = cli(*args, backend=backend, env=env)
    return warm.run(cmd, cwd=REPO_ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)


def start_cli(*args, backend="tensorflow"):
    cmd, env = cli(*args, backend=backend)
    return warm.popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_line(proc, fragment, timeout=300):
    """Reads the child's stdout until a line containing ``fragment``; returns the lines read."""
    lines, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if fragment in line:
            return lines
    raise AssertionError(f"{fragment!r} not seen in {lines[-20:]}")


def h5_arrays(path):
    import h5py
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, np.array(obj)) if isinstance(obj, h5py.Dataset) else None)
    return out


def strict_json(path):
    return json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"{path} holds {c}"))


# The runs that need no timing (no signal or kill while they run), started together by the ``runs``
# fixture at the module's first test, two at a time (each is mostly one core: an import, tracing,
# compiling), and awaited by their tests: 95 s of runs in ~55 s on the 2-core machine.
INTERRUPTED = [*TINY, "--method=byol", "--augment_on=device", "--epochs=3", "--steps_per_epoch=3", "--knn_every=0"]


def interrupted_chain(run_dir):
    """The interrupted run: stopped at step 5, resumed, then rerun once finished."""
    args = [*INTERRUPTED, f"--run_dir={run_dir}", "--run_name=cut"]
    first = run_cli(*args, "--stop_after_steps=5", backend="jax")
    if first.returncode != 75:
        return first, None, None
    second = run_cli(*args, backend="jax")
    return first, second, run_cli(*args, backend="jax") if second.returncode == 0 else None


def diverging(run_dir, method):
    return run_cli(*TINY, f"--method={method}", "--base_learning_rate=1e6", "--epochs=3", "--steps_per_epoch=3",
                   "--knn_every=0", f"--run_dir={run_dir}", "--run_name=d")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``(run_dir, future)`` by name; the run folders are ``run_dir/<run_name>`` (the whole and the
    interrupted run share theirs)."""
    tasks = {  # name: (run_dir, task(run_dir))
        "interrupted_cut": ("interrupted", interrupted_chain),
        "interrupted_whole": ("interrupted", lambda d: run_cli(*INTERRUPTED, f"--run_dir={d}", "--run_name=whole",
                                                               backend="jax")),
        "diverged_simaffinity": ("simaffinity", lambda d: diverging(d, "simaffinity")),
        "diverged_simtrace": ("simtrace", lambda d: diverging(d, "simtrace")),
        "full_disk": ("full_disk", full_disk),
        "one_line_log": ("one_line_log", lambda d: run_cli(*TINY, "--method=vicreg", "--epochs=2",
                                                           "--steps_per_epoch=3", "--knn_every=1", f"--run_dir={d}",
                                                           "--run_name=v")),
    }
    root = tmp_path_factory.mktemp("resilience")
    jobs = {}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for name, (folder, task) in tasks.items():
            (root / folder).mkdir(exist_ok=True)
            jobs[name] = root / folder, pool.submit(task, root / folder)
        yield jobs
        for _, future in jobs.values():
            future.cancel()


def test_interrupted_and_resumed_run_ends_with_the_same_weights(runs):
    """JAX, device augmentation (its random state is a model variable): stopped mid-epoch 2 at step 5,
    resumed with the same command, the run ends with the uninterrupted run's weights."""
    tmp_path, whole = runs["interrupted_whole"]
    first, second, again = runs["interrupted_cut"][1].result()
    whole = whole.result()
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert first.returncode == 75, first.stderr[-3000:]
    assert "stopped at epoch 2, step 5" in first.stdout and "Rerun the same command to resume" in first.stdout
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resuming at epoch 2, step 5" in second.stdout
    assert "Epoch 2/3" in second.stdout and "Epoch 2/2" not in second.stdout  # the resumed epoch of 3
    a, b = h5_arrays(tmp_path / "whole" / "model.weights.h5"), h5_arrays(tmp_path / "cut" / "model.weights.h5")
    assert a.keys() == b.keys() and len(a) > 20
    for key in a:
        np.testing.assert_allclose(b[key], a[key], rtol=1e-5, atol=1e-6, err_msg=key)
    history_a = strict_json(tmp_path / "whole" / "history.json")
    history_b = strict_json(tmp_path / "cut" / "history.json")
    assert [e["epoch"] for e in history_b] == [1, 2, 3]
    np.testing.assert_allclose(history_b[0]["loss"], history_a[0]["loss"], rtol=1e-5)  # epoch 1: before the cut
    np.testing.assert_allclose(history_b[2]["loss"], history_a[2]["loss"], rtol=1e-4)  # epoch 3: all after it
    assert strict_json(tmp_path / "cut" / "metrics.json")["steps"] == 9
    # Rerunning a finished run trains nothing and exits 0.
    assert again.returncode == 0 and "already finished" in again.stdout


def test_kill_9_at_random_moments_then_the_same_command_finishes_the_run(tmp_path):
    args = [*TINY, "--method=simaffinity", "--epochs=5", "--steps_per_epoch=25", "--knn_every=2",
            "--backup_every_minutes=0.005", f"--run_dir={tmp_path}", "--run_name=k"]
    rng = np.random.default_rng(0)
    kills, finished = 0, False
    for attempt in range(10):
        proc = start_cli(*args)
        if kills < 3:
            try:
                wait_for_line(proc, "run folder:")
                time.sleep(float(rng.uniform(0.5, 5.0)))
            except AssertionError:  # it printed no "run folder:" line: the run had finished
                pass
            if proc.poll() is None:
                proc.kill()  # SIGKILL: no handler runs
                proc.communicate()
                kills += 1
                continue
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        finished = True
        break
    assert finished and kills >= 2, (finished, kills)
    run = tmp_path / "k"
    metrics = strict_json(run / "metrics.json")
    assert metrics["status"] == "finished" and metrics["steps"] == 125
    history = strict_json(run / "history.json")
    assert [e["epoch"] for e in history] == [1, 2, 3, 4, 5]  # one continuous history
    assert "knn_top1" in history[1] and "knn_top1" in history[3]
    state = strict_json(run / "backup" / "state.json")
    assert state["step"] == 125 and (run / "backup" / state["weights"]).exists()
    assert len(h5_arrays(run / "model.weights.h5")) > 20  # a valid checkpoint
    assert not [p for p in run.rglob("*") if ".tmp" in p.name]  # no temporary file left behind
    header = (run / "log.csv").read_text().splitlines()[0].split(",")
    assert not any(h.startswith("val_") for h in header) and "knn_top1" in header


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_saves_a_backup_and_the_folder_stays_usable(sig, code, tmp_path):
    args = [*TINY, "--method=simtrace", "--epochs=50", "--steps_per_epoch=4", "--knn_every=0", f"--run_dir={tmp_path}",
            "--run_name=s"]
    proc = start_cli(*args)
    wait_for_line(proc, "Epoch 2/")
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err[-3000:]
    assert "Traceback" not in err
    assert "Rerun the same command to resume" in out.splitlines()[-1]
    run = tmp_path / "s"
    state = strict_json(run / "backup" / "state.json")
    assert state["reason"] == signal.Signals(sig).name and state["step"] >= 4
    assert strict_json(run / "metrics.json")["status"] == "interrupted"
    # export and linear_eval can use the stopped run: its encoder is there.
    from uniclr_tf.training.runs import RunFolder
    encoder = RunFolder(str(run)).load_encoder()
    assert encoder.output_shape[-1] > 0
    if sig == signal.SIGTERM:  # and the same command continues it
        more = run_cli(*args, "--stop_after_steps=2")
        assert more.returncode == 75 and f"resuming at epoch {state['epoch'] + 1}, step {state['step']}" in more.stdout


@pytest.mark.parametrize("method", ["simaffinity", "simtrace"])
def test_divergence_stops_with_one_line_and_keeps_the_last_finite_backup(method, runs):
    tmp_path, proc = runs[f"diverged_{method}"]
    proc = proc.result()
    assert proc.returncode == 1, proc.stdout[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: training diverged at epoch ") and "non-finite" in last, last
    assert "--base_learning_rate" in last and "Traceback" not in proc.stderr
    run = tmp_path / "d"
    metrics = strict_json(run / "metrics.json")
    assert metrics["status"] == "diverged" and "non-finite" in metrics["reason"]
    assert not (run / "encoder.keras").exists()
    state_path = run / "backup" / "state.json"
    if state_path.exists():  # any backup kept is finite
        with np.load(run / "backup" / strict_json(state_path)["weights"]) as data:
            assert all(np.all(np.isfinite(data[k])) for k in data.files if data[k].dtype.kind == "f")


FULL_DISK = r"""
import errno, sys
import keras
from absl import app
from uniclr_tf.training import cli as train

def no_space(self, filepath, *args, **kwargs):
    with open(filepath, "wb") as f:
        f.write(b"partial")
    raise OSError(errno.ENOSPC, "No space left on device", str(filepath))

keras.Model.save_weights = no_space  # the disk fills up when the final weights are written
train.define_flags()
sys.argv = ["train", *sys.argv[1:]]
app.run(train.main)
"""


def full_disk(run_dir):
    args = [*TINY, "--method=simclr", "--epochs=2", "--steps_per_epoch=2", "--knn_every=0", f"--run_dir={run_dir}",
            "--run_name=f"]
    cmd, env = cli(*args)
    return warm.run([sys.executable, "-c", FULL_DISK, *args], cwd=REPO_ROOT, env=env, capture_output=True,
                    text=True, timeout=600)


def test_a_full_disk_ends_the_run_with_one_line_and_the_backup_intact(runs):
    tmp_path, proc = runs["full_disk"]
    proc = proc.result()
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: could not write") and "No space left on device" in last, last
    assert "Traceback" not in proc.stderr
    run = tmp_path / "f"
    state = strict_json(run / "backup" / "state.json")
    assert state["step"] == 4
    with np.load(run / "backup" / state["weights"]) as data:
        assert len(data.files) > 20
    assert not (run / "model.weights.h5").exists()  # the torn temporary file was removed, not renamed
    assert not [p for p in run.rglob("*") if ".tmp" in p.name]


def test_log_is_one_line_per_epoch_off_a_terminal(runs):
    tmp_path, proc = runs["one_line_log"]
    proc = proc.result()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "\x1b[" not in proc.stdout and "━" not in proc.stdout
    epochs = [l for l in proc.stdout.splitlines() if l.startswith("3/3 - ")]
    assert len(epochs) == 2, proc.stdout
    run = tmp_path / "v"
    assert (run / "curves.png").exists() and len(strict_json(run / "history.json")) == 2


def test_whitening_with_too_few_rows_is_refused_unless_made_well_posed():
    from uniclr_tf.config.train_config import TrainConfig
    with pytest.raises(ValueError, match=r"--batch_size=16: simtrace whitens the 2N = 32 rows"):
        TrainConfig.make(method="simtrace", projector_dims=(64, 512), batch_size=16)
    with pytest.raises(ValueError, match=r"--batch_size=16: simwhitening whitens"):
        TrainConfig.make(method="simwhitening", projector_dims=(64, 512), batch_size=16)
    TrainConfig.make(method="simtrace", projector_dims=(64, 512), batch_size=16, whitening_groups=32)
    TrainConfig.make(method="simtrace", projector_dims=(64, 512), batch_size=16, eps=0.1)  # a stated ridge
    TrainConfig.make(method="simaffinity", projector_dims=(64, 512), batch_size=16)  # no whitening


def test_history_files_are_written_in_the_background_and_before_the_epochs_backup(tmp_path, monkeypatch):
    """The epoch end does not wait for history.json / log.csv (fsync'd writes); the backup writer
    waits for them before it writes the epoch's backup, so history >= backup at any kill."""
    import threading

    from uniclr_tf.training import backup
    from uniclr_tf.training.callbacks import HistoryRecorder

    release, events = threading.Event(), []
    real = HistoryRecorder._write_files

    def slow_write(self, epochs):
        assert release.wait(timeout=30), "the training thread waited for the history write"
        real(self, epochs)
        events.append(("history", len(epochs)))

    monkeypatch.setattr(HistoryRecorder, "_write_files", slow_write)
    monkeypatch.setattr(backup, "write", lambda run_dir, values, epoch, step, reason: events.append(("backup", epoch))
                        or {"epoch": epoch, "step": step, "weights": "w.npz", "reason": reason})
    history = HistoryRecorder(str(tmp_path), plot_every_s=1e9)
    history.on_epoch_begin(0)
    history.on_epoch_end(0, {"loss": 1.0})  # returns although the write is blocked
    assert not (tmp_path / "history.json").exists() and events == []
    writer = backup.Writer(str(tmp_path))
    writer.submit([("w", np.zeros(2, np.float32))], 1, 10, "epoch", after=history.pending_write())
    time.sleep(0.2)
    assert events == []  # the backup waits for the history files
    release.set()
    writer.wait()
    assert events == [("history", 1), ("backup", 1)]
    assert json.loads((tmp_path / "history.json").read_text())[0]["loss"] == 1.0
    history.on_epoch_end(1, {"loss": 0.5})
    history.write(plot=False)  # drains the background writer, then writes everything now
    assert [e["loss"] for e in json.loads((tmp_path / "history.json").read_text())] == [1.0, 0.5]
    assert (tmp_path / "log.csv").read_text().splitlines()[0].startswith("epoch,loss")
    history.wait()


def test_a_failed_background_history_write_is_raised_at_the_next_epoch_end(tmp_path, monkeypatch):
    import errno

    from uniclr_tf.training.callbacks import HistoryRecorder

    def no_space(self, epochs):
        raise OSError(errno.ENOSPC, "No space left on device", "history.json")

    history = HistoryRecorder(str(tmp_path), plot_every_s=1e9)
    monkeypatch.setattr(HistoryRecorder, "_write_files", no_space)
    history.on_epoch_end(0, {"loss": 1.0})
    pending = history.pending_write()
    with pytest.raises(OSError, match="No space"):
        pending()  # what the backup writer runs first: the backup is not written either
    with pytest.raises(OSError, match="No space"):
        history.on_epoch_end(1, {"loss": 1.0})
    history.wait()


def test_curves_are_drawn_at_the_end_and_in_the_background_every_plot_every_s(tmp_path, monkeypatch):
    """A run shorter than ``plot_every_s`` draws its curves once, at the end, in the training process; with
    ``plot_every_s`` elapsed they are also drawn in the background (a child process) at an epoch end,
    skipped while the previous drawing is still going on."""
    from uniclr_tf.training import callbacks

    drawn, children = [], []

    class Child:  # a drawing child process that runs until the test lets it finish
        def __init__(self):
            self.done = False

        def poll(self):
            return 0 if self.done else None

        def wait(self):
            self.done = True
            return 0

    def start(epochs, path, title, reference):
        drawn.append((len(epochs), "background"))
        children.append(Child())
        return children[-1]

    monkeypatch.setattr(callbacks, "plot_curves", lambda epochs, *a: drawn.append((len(epochs), "end")))
    monkeypatch.setattr(callbacks, "start_drawing", start)
    short = callbacks.HistoryRecorder(str(tmp_path), plot_every_s=60.0)
    for epoch in range(3):
        short.on_epoch_end(epoch, {"loss": 1.0})
    short.on_train_end()
    assert drawn == [(3, "end")]
    drawn.clear()
    long = callbacks.HistoryRecorder(str(tmp_path), plot_every_s=0.0)
    long.on_epoch_end(0, {"loss": 1.0})  # drawing, until the child is done
    long.on_epoch_end(1, {"loss": 0.9})  # skipped: the first drawing is still going on
    assert long.drawing
    children[0].done = True
    assert not long.drawing
    long.on_epoch_end(2, {"loss": 0.8})
    long.on_train_end()  # waits for the second child, then draws the last curves itself
    assert drawn == [(1, "background"), (3, "background"), (3, "end")] and children[1].done


def test_a_child_process_draws_the_curves(tmp_path, capfd):
    """``start_drawing``: another process writes the PNG (atomically) and removes its job file; one that
    cannot write says so and still exits 0 (the curves never stop a run)."""
    import glob
    import tempfile

    from uniclr_tf.training import curves
    epochs = [{"epoch": i + 1, "loss": 2.0 - 0.1 * i, "knn_top1": np.float32(0.5 + 0.01 * i), "wall_seconds": i}
              for i in range(5)]
    jobs_before = set(glob.glob(os.path.join(tempfile.gettempdir(), "uniclr-curves-*.json")))
    child = curves.start_drawing(epochs, str(tmp_path / "curves.png"), "a run", {"raw-pixel kNN": 0.75})
    assert child.pid != os.getpid() and child.wait(timeout=120) == 0
    with open(tmp_path / "curves.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert sorted(os.listdir(tmp_path)) == ["curves.png"]
    (tmp_path / "file").write_text("not a folder")
    capfd.readouterr()
    child = curves.start_drawing(epochs, str(tmp_path / "file" / "curves.png"))
    assert child.wait(timeout=120) == 0
    assert "warning: could not draw the curves" in capfd.readouterr().out
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "uniclr-curves-*.json"))) <= jobs_before


def test_a_jax_snapshot_fetched_in_pieces_is_every_value_exactly():
    """JAX: the backup's device copy cut into pieces (as on a GPU, where one 130 MB transfer stalled
    the next epoch), fetched piece by piece with pauses, gives back every variable bit for bit: values
    of three dtypes, lengths not multiples of the piece, values spanning two pieces."""
    from tests.conftest import run_python_snippet
    out = run_python_snippet(r"""
        import json, time
        import jax, numpy as np
        from uniclr_tf.training import backup
        rng = np.random.default_rng(0)
        values = [jax.numpy.asarray(rng.normal(size=s).astype(np.float32)) for s in [(7, 5), (3,), (11, 2, 3)]]
        values += [jax.numpy.asarray(np.arange(9, dtype=np.int32)), jax.numpy.asarray(np.array([3, 1], np.uint32))]
        paths = [f"v{i}" for i in range(len(values))]
        packed = backup.Packed(paths, values, chunk_bytes=64)  # 16 float32 values a piece
        start = time.perf_counter()
        got = backup.to_host(packed, pause=0.01)
        pauses = time.perf_counter() - start
        exact = all(p == q and a.dtype == np.asarray(b).dtype and np.array_equal(a, np.asarray(b))
                    for (p, a), q, b in zip(got, paths, values))
        one = backup.Packed(paths, values)  # the default on a CPU: one piece per dtype
        again = backup.to_host(one)
        print(json.dumps({"exact": exact, "pieces": {d: len(p) for d, p in packed.pieces.items()},
                          "default_pieces": {d: len(p) for d, p in one.pieces.items()}, "pauses": pauses,
                          "exact_default": all(np.array_equal(a, np.asarray(b)) for (_, a), b in zip(again, values))}))
        """, backend="jax")
    assert out["exact"] and out["exact_default"]
    assert out["pieces"] == {"float32": 7, "int32": 1, "uint32": 1}  # 35 + 3 + 66 = 104 floats: 7 pieces of 16
    assert out["default_pieces"] == {"float32": 1, "int32": 1, "uint32": 1}
    assert out["pauses"] >= 0.01 * 8  # a pause before every piece but the first


def test_a_multi_process_snapshot_packs_this_process_copy_on_one_device():
    """JAX with several processes (``process_count`` 2, as seen by process 0 of a 2-process job): the
    backup's copy is packed from this process's own copy of each replicated value, on one device (no
    call on the job's arrays, which would need every process), and fetched in the background as in one
    process; it gives back every model and optimizer value exactly."""
    from tests.conftest import run_python_snippet
    out = run_python_snippet(r"""
        import json
        import jax, keras, numpy as np
        from uniclr_tf.training import backup
        keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax.devices()))
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.BatchNormalization()])
        model.compile(optimizer=keras.optimizers.SGD(momentum=0.9), loss="mse")
        model.fit(np.ones((8, 4), np.float32), np.ones((8, 3), np.float32), batch_size=8, epochs=1, verbose=0)
        variables = backup._variables(model)
        expected = [np.asarray(v.value) for v in variables]
        replicated = all(v.value.is_fully_replicated and len(v.value.devices()) == 2 for v in variables)
        jax.process_count = lambda: 2  # what process 0 of a 2-process job sees
        values = backup.snapshot(model)
        devices = {d for pieces in values.pieces.values() for p in pieces for d in p.devices()}
        got = backup.to_host(values, pause=0.001)
        print(json.dumps({"packed": isinstance(values, backup.Packed), "replicated": replicated,
                          "devices": len(devices), "n": len(got),
                          "exact": all(p == v.path and np.array_equal(a, e)
                                       for (p, a), v, e in zip(got, variables, expected))}))
        """, backend="jax", env={"XLA_FLAGS": xla_flags("--xla_force_host_platform_device_count=2")})
    assert out["replicated"]  # the job's arrays span both devices
    assert out["packed"] and out["devices"] == 1
    assert out["exact"] and out["n"] > 4


def test_a_backup_whose_compile_the_signal_killed_is_compiled_again(tmp_path, monkeypatch):
    """A scheduler's SIGTERM also kills the compiler the backup's first compile runs (ptxas on GPUs):
    with the signal pending, the failed snapshot is taken again and the backup the signal asks for is
    written; without a signal the same error is raised as it is."""
    import keras

    from uniclr_tf.training import backup

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    real, calls = backup.snapshot, []

    def snapshot_killed_once(m):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("INTERNAL: ptxas exited with non-zero error code 15, output: ")
        return real(m)

    monkeypatch.setattr(backup, "snapshot", snapshot_killed_once)

    class Pending:
        signal = signal.SIGTERM

    for interrupts in (Pending(), None):
        calls.clear()
        writer = backup.Writer(str(tmp_path / str(interrupts is None)))
        saver = backup.BackupCallback(writer, backup.Progress(4), interrupts=interrupts, stop_after_steps=2)
        saver.set_model(model)
        saver.on_epoch_begin(0)
        if interrupts is None:  # --stop_after_steps's backup: no signal, so the failure is the failure
            with pytest.raises(RuntimeError, match="ptxas"):
                saver.on_train_batch_begin(2)
            continue
        with pytest.raises(backup.StopTraining, match="SIGTERM"):
            saver.on_train_batch_begin(2)
        writer.wait()
        assert len(calls) == 2 and writer.last["step"] == 2 and writer.last["reason"] == "SIGTERM"


def test_curves_are_drawn_here_when_no_child_can_start(tmp_path, monkeypatch, capsys):
    """A child that cannot be started (no interpreter to run): the curves are drawn in this process, with a
    note, and the job file is removed."""
    import glob
    import tempfile

    from uniclr_tf.training import curves
    monkeypatch.setattr(curves.sys, "executable", str(tmp_path / "no-python"))
    jobs_before = set(glob.glob(os.path.join(tempfile.gettempdir(), "uniclr-curves-*.json")))
    assert curves.start_drawing([{"epoch": 1, "loss": 1.0}], str(tmp_path / "curves.png")) is None
    assert "drawing" in capsys.readouterr().out and (tmp_path / "curves.png").exists()
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "uniclr-curves-*.json"))) <= jobs_before
