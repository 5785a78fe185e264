"""Nothing lost, nothing wiped. A locked run folder, a safe --overwrite, backups that
survive damage, an end of run ordered so that "finished" comes last, hostile folder datasets,
signals at the edges, divergence inside an epoch, and a stand-in server that answers every request.

Training runs are real CLI subprocesses (a tiny encoder, a few steps), two at a time, started by the
``cli_runs`` fixture at the module's first test; a signal, a kill -9 or a full disk is made to happen
at the exact moment by a patched function of the child process (a real signal sent to itself, a real
``SIGKILL``, TensorFlow's real out-of-space error). Refused starts run in forks of one interpreter.
"""

import concurrent.futures
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from tests import warm
from tests.conftest import REPO_ROOT, run_cli_forks, write_stripes_folder
from tests.test_resilience import TINY, cli, strict_json

# ---------------------------------------------------------------------------------------------
# Real CLI runs, each with one moment made to happen (PATCHES[mode] runs in the child first)

PATCHED_CLI = r"""
import os, signal, sys, time
import keras
from absl import app
from uniclr_tf.training import backup
from uniclr_tf.training import cli as train
mode, args = sys.argv[1], sys.argv[2:]

def once(fn):
    done = []
    def wrapped(*a, **k):
        if not done:
            done.append(1)
            fn()
    return wrapped

def partial_savedmodel(path):
    os.makedirs(os.path.join(path, "variables"), exist_ok=True)
    with open(os.path.join(path, "saved_model.pb"), "wb") as f:
        f.write(b"partial")

if mode == "sigterm_in_final_knn":  # a real SIGTERM while the final kNN runs
    import uniclr_tf.evaluation as evaluation
    real_knn = evaluation.knn_eval
    def knn(*a, **k):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(2)
        return real_knn(*a, **k)
    evaluation.knn_eval = knn
elif mode in ("kill_in_export", "full_disk_in_export"):
    import tensorflow as tf
    def write_out(self, path, **kwargs):
        partial_savedmodel(path)
        if mode == "kill_in_export":
            os.kill(os.getpid(), signal.SIGKILL)
        raise tf.errors.ResourceExhaustedError(None, None, "write failed: No space left on device\n\tframe 1\n\tframe 2")
    type(keras.export.ExportArchive()).write_out = write_out  # the backend's class, which ExportArchive() makes
elif mode == "sigint_twice":  # Ctrl-C twice, 0.2 s apart, at the end of epoch 2
    real_end = backup.BackupCallback.on_epoch_end
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 1:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(2)
        return real_end(self, epoch, logs)
    backup.BackupCallback.on_epoch_end = on_epoch_end
elif mode == "sigterm_before_step_1":
    real_fit = keras.Model.fit
    def fit(self, *a, **k):
        os.kill(os.getpid(), signal.SIGTERM)
        return real_fit(self, *a, **k)
    keras.Model.fit = fit
train.define_flags()
sys.argv = ["train", *args]
app.run(train.main)
"""

QUICK = [*TINY, "--method=simclr", "--knn_every=0"]


def patched_cli(mode, *args):
    _, env = cli()
    return warm.run([sys.executable, "-c", PATCHED_CLI, mode, *args], cwd=REPO_ROOT, env=env,
                    capture_output=True, text=True, timeout=600)


def end_of_run_chain(run_dir):
    """One run, its end interrupted three ways (SIGTERM in the final kNN, kill -9 in the export, a
    full disk in the export), then the same command once more."""
    args = [*QUICK, "--epochs=1", "--steps_per_epoch=2", "--export", f"--run_dir={run_dir}", "--run_name=e"]
    results = {}
    for mode in ("sigterm_in_final_knn", "kill_in_export", "full_disk_in_export", "plain"):
        results[mode] = patched_cli(mode, *args)
        results[mode + "_files"] = sorted(p.name for p in Path(run_dir, "e").iterdir())
        metrics = Path(run_dir, "e", "metrics.json")
        results[mode + "_status"] = strict_json(metrics)["status"] if metrics.exists() else None
    return results


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("safety")
    tasks = {
        "end": end_of_run_chain,
        "twice": lambda d: patched_cli("sigint_twice", *QUICK, "--epochs=3", "--steps_per_epoch=2",
                                       f"--run_dir={d}", "--run_name=t"),
        "before": lambda d: patched_cli("sigterm_before_step_1", *QUICK, "--epochs=1", "--steps_per_epoch=2",
                                        f"--run_dir={d}", "--run_name=b"),
        "diverge": lambda d: patched_cli("plain", *TINY, "--method=simaffinity", "--base_learning_rate=1e6",
                                         "--epochs=1", "--steps_per_epoch=60", "--knn_every=0", f"--run_dir={d}",
                                         "--run_name=d"),
    }
    jobs = {}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for name, task in tasks.items():
            (root / name).mkdir()
            jobs[name] = root / name, pool.submit(task, root / name)
        yield jobs
        for _, future in jobs.values():
            future.cancel()


def one_line_exit(proc, code):
    assert proc.returncode == code, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


# ---------------------------------------------------------------------------------------------
# 1, 2: the run folder: --overwrite never wipes what is not a run, one process at a time

def test_overwrite_never_leaves_run_dir_nor_deletes_a_folder_that_is_not_a_run(tmp_path):
    from uniclr_tf.training import runs
    from uniclr_tf.training import cli as train
    from uniclr_tf.config.train_config import TrainConfig
    parent = tmp_path / "parent"
    (parent / "runs").mkdir(parents=True)
    (parent / "precious").mkdir()
    (parent / "precious" / "thesis.txt").write_text("years of work")
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", parent / "runs" / "linked")
    for name in ("..", "../precious", str(parent / "precious"), "linked", "."):
        cfg = TrainConfig.make(run_dir=str(parent / "runs"), run_name=name, overwrite=True)
        with pytest.raises(runs.RunFolderError, match="--run_name="):
            train.run_path(cfg)
    # a folder inside --run_dir that holds no run of this tool: refused with or without --overwrite
    (parent / "runs" / "notes").mkdir()
    (parent / "runs" / "notes" / "todo.txt").write_text("keep me")
    for overwrite in (False, True):
        cfg = TrainConfig.make(run_dir=str(parent / "runs"), run_name="notes", overwrite=overwrite)
        with pytest.raises(ValueError, match="not a run of uniclr_tf.train") as e:
            train.prepare_run_folder(cfg, train.run_path(cfg))
        assert "--overwrite" not in str(e.value)  # the refusal gives no advice that would wipe it
    assert (parent / "precious" / "thesis.txt").read_text() == "years of work"
    assert (parent / "runs" / "notes" / "todo.txt").exists()
    # a real run folder (its marker) is emptied by --overwrite, its held lock file kept
    run = parent / "runs" / "mine"
    run.mkdir()
    runs.mark_run_folder(str(run))
    (run / "config.json").write_text("{}")
    with runs.RunLock(str(run)):
        cfg = TrainConfig.make(run_dir=str(parent / "runs"), run_name="mine", overwrite=True)
        assert train.prepare_run_folder(cfg, str(run)) == ("new", None)
    assert sorted(os.listdir(run)) == [runs.LOCK_FILE]


HOLD_LOCK = r"""
import sys, time
from uniclr_tf.training import runs
lock = runs.RunLock(sys.argv[1])
print("locked", flush=True)
time.sleep(600)
"""


def test_a_run_folder_is_locked_by_one_process_and_a_killed_holder_leaves_no_stuck_lock(tmp_path):
    from uniclr_tf.training import runs
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    holder = warm.popen([sys.executable, "-c", HOLD_LOCK, str(tmp_path / "r")], env=env,
                        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(runs.RunFolderError, match=rf"is in use by another process \(pid {holder.pid} "):
            runs.RunLock(str(tmp_path / "r"))
        # the train CLI, started while the folder is held, says who holds it in one line
        [refused] = run_cli_forks("uniclr_tf.train", [[*QUICK, "--epochs=1", "--steps_per_epoch=1",
                                                       f"--run_dir={tmp_path}", "--run_name=r"]])
        assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
        assert f"in use by another process (pid {holder.pid} " in refused.stderr.strip().splitlines()[-1]
        assert sorted(os.listdir(tmp_path / "r")) == [runs.LOCK_FILE]  # nothing else was written
    finally:
        holder.kill()  # SIGKILL: the kernel drops its lock
        holder.wait()
    with runs.RunLock(str(tmp_path / "r")) as lock:
        assert str(os.getpid()) in Path(lock.path).read_text()


def test_a_dataset_smaller_than_a_batch_is_refused_by_name(tmp_path):
    [proc] = run_cli_forks("uniclr_tf.train", [[*QUICK, "--max_examples=40", "--batch_size=64",
                                                f"--run_dir={tmp_path}", "--run_name=small"]])
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: --batch_size=64:") and "only 40 training images" in last, last


# ---------------------------------------------------------------------------------------------
# 3, 6: folder datasets: symbolic links, decompression bombs, the reference size

def test_symlink_loops_and_links_back_into_the_dataset_list_each_file_once(tmp_path):
    from uniclr_tf import data
    root = write_stripes_folder(tmp_path / "flat", 6, 0)
    shutil.rmtree(root / "test")  # no test split: a held-out one, per class
    classes = root / "train"
    os.symlink(".", classes / "class0" / "self")  # a loop
    os.symlink("..", classes / "class0" / "loop")  # every class again, under class0
    os.symlink("../class1/0000.png", classes / "class0" / "stolen.png")  # a class1 image labelled class0
    outside = write_stripes_folder(tmp_path / "outside", 3, 0) / "train" / "class2"
    os.symlink(outside, classes / "class2" / "more")  # a folder outside the dataset: followed, once
    os.symlink(outside, classes / "class2" / "again")
    info = data.load_dataset(f"folder:{classes}", holdout_fraction=0.2)
    assert info.num_train + info.num_test == 6 * 4 + 3
    y = np.concatenate([info.split("train").labels, info.split("test").labels])
    assert np.bincount(y).tolist() == [6, 6, 9, 6]


def bomb_png(path, side):
    """A real, valid single-colour grey PNG of side x side pixels (a few hundred KB on disk)."""
    def chunk(kind, body):
        return len(body).to_bytes(4, "big") + kind + body + zlib.crc32(kind + body).to_bytes(4, "big")
    compressor, parts, row = zlib.compressobj(9), [], b"\0" * (side + 1)
    for _ in range(side):
        parts.append(compressor.compress(row))
    parts.append(compressor.flush())
    header = side.to_bytes(4, "big") * 2 + bytes([8, 0, 0, 0, 0])
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", b"".join(parts))
                     + chunk(b"IEND", b""))
    return path


def test_a_decompression_bomb_is_refused_from_its_header_before_decoding(tmp_path):
    from uniclr_tf import data
    from uniclr_tf.data.decode import ImageDecodeError, decode_image
    root = write_stripes_folder(tmp_path / "d", 3, 2)
    bomb = bomb_png(root / "train" / "class1" / "bomb.png", 10_000)  # 100 M pixels
    assert bomb.stat().st_size < 200_000
    with pytest.raises(ImageDecodeError, match="more than the limit of 89,478,485"):
        decode_image(bomb.read_bytes())
    for mb in (256, 0):  # in memory and streamed
        with pytest.raises(data.DataError, match=rf"{bomb}: image is 10000x10000 = 100,000,000 pixels"):
            data.load_dataset(f"folder:{root}", image_size=28, max_in_memory_mb=mb)
        info = data.load_dataset(f"folder:{root}", image_size=28, max_in_memory_mb=mb, skip_bad_files=True)
        assert info.num_train == 12 and info.num_skipped == 1
    bomb.write_bytes(bomb.read_bytes()[:5000])  # a raised limit: decoded (here: found truncated)
    with pytest.raises(data.DataError, match=rf"{bomb}: cannot decode"):
        data.load_dataset(f"folder:{root}", image_size=28, max_image_pixels=200_000_000)


def test_the_reference_size_is_the_majority_not_the_first_file(tmp_path):
    from PIL import Image

    from uniclr_tf import data
    root = write_stripes_folder(tmp_path / "s", 4, 2)
    Image.new("L", (40, 24), 128).save(root / "train" / "class0" / "0000.png")  # the first file is the odd one
    for mb in (256, 0):
        info = data.load_dataset(f"folder:{root}", skip_bad_files=True, max_in_memory_mb=mb)
        assert info.image_shape[:2] == (32, 32) and info.num_train == 15 and info.num_skipped == 1
        with pytest.raises(data.DataError, match=r"0000.png: image is 24x40 but most images \(23 of 24\) are 32x32"):
            data.load_dataset(f"folder:{root}", max_in_memory_mb=mb)


# ---------------------------------------------------------------------------------------------
# 4: the end of a run: "finished" last, after the export; a kill or a full disk there is resumable

def test_finished_is_written_last_and_an_interrupted_export_is_finished_by_a_rerun(cli_runs):
    run_dir, future = cli_runs["end"]
    r = future.result()
    term = r["sigterm_in_final_knn"]
    one_line_exit(term, 143)
    assert "received SIGTERM: training is complete and backed up" in term.stdout.strip().splitlines()[-1]
    assert r["sigterm_in_final_knn_status"] is None  # not "finished"
    assert r["kill_in_export"].returncode == -9 and r["kill_in_export_status"] is None
    assert any(".export.tmp-" in name for name in r["kill_in_export_files"])  # what the kill left
    assert "resuming at the final stage" in r["kill_in_export"].stdout
    full = r["full_disk_in_export"]
    one_line_exit(full, 1)
    last = full.stderr.strip().splitlines()[-1]
    assert last.startswith("error: could not write") and "No space left on device" in last and "export" in last
    assert r["full_disk_in_export_status"] is None
    one_line_exit(r["plain"], 0)
    run = run_dir / "e"
    assert strict_json(run / "metrics.json")["status"] == "finished"
    assert (run / "export" / "saved_model.pb").exists() and (run / "export" / "export.json").exists()
    assert not [p for p in run.rglob("*") if ".tmp" in p.name]  # temporary folders cleaned too
    again = patched_cli("plain", *QUICK, "--epochs=1", "--steps_per_epoch=2", f"--run_dir={run_dir}",
                        "--run_name=e")
    assert again.returncode == 0 and "already finished" in again.stdout


def test_export_errors_are_one_line(tiny_run, tmp_path):
    from uniclr_tf.serving import export
    from uniclr_tf.training import runs
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "saved_model.pb").write_bytes(b"not a saved model")
    with pytest.raises(ValueError) as e:
        export.check_export(str(broken), str(tiny_run))
    assert "\n" not in str(e.value) and str(broken) in str(e.value)
    diverged = tmp_path / "diverged"
    diverged.mkdir()
    (diverged / "metrics.json").write_text(json.dumps({"status": "diverged", "reason": "non-finite loss"}))
    with pytest.raises(runs.RunFolderError, match="the run diverged") as e:
        export.check_run_dir(str(diverged))
    assert "rerun its training command" not in str(e.value) and "--overwrite" in str(e.value)


# ---------------------------------------------------------------------------------------------
# 5: backups: two kept, the latest checked, a damaged one falls back, unreadable state named

def fake_backup(run_dir, step):
    from uniclr_tf.training import backup
    values = [("dense/kernel", np.full((64, 64), step, np.float32)), ("step", np.array(step, np.int64))]
    return backup.write(str(run_dir), values, epoch=step // 3, step=step, reason="epoch")


@pytest.mark.parametrize("damage", ["truncated", "bit_flip", "zero_bytes", "missing"])
def test_a_damaged_latest_backup_falls_back_to_the_one_before(damage, tmp_path, capsys):
    from uniclr_tf.training import backup
    for step in (3, 6, 9):
        fake_backup(tmp_path, step)
    folder = tmp_path / backup.BACKUP_DIR
    assert sorted(p.name for p in folder.glob("weights-*.npz")) == ["weights-000000006.npz", "weights-000000009.npz"]
    latest = folder / "weights-000000009.npz"
    raw = bytearray(latest.read_bytes())
    if damage == "truncated":
        latest.write_bytes(bytes(raw[:len(raw) // 2]))
    elif damage == "bit_flip":
        raw[len(raw) // 3] ^= 0x10
        latest.write_bytes(bytes(raw))
    elif damage == "zero_bytes":
        latest.write_bytes(b"")
    else:
        latest.unlink()
    state = backup.latest(str(tmp_path))
    assert state["step"] == 6 and state["weights"] == "weights-000000006.npz"
    assert "resuming from the backup before it, weights-000000006.npz" in capsys.readouterr().out
    fake_backup(tmp_path, 12)  # the next backup replaces the damaged one, keeps the good one
    assert sorted(p.name for p in folder.glob("weights-*.npz")) == ["weights-000000006.npz", "weights-000000012.npz"]


def test_backup_state_that_cannot_be_read_is_named_or_recovered_never_a_silent_restart(tmp_path, capsys):
    from uniclr_tf.training import backup
    from uniclr_tf.training import runs
    fake_backup(tmp_path, 3)
    fake_backup(tmp_path, 6)
    state_file = tmp_path / backup.BACKUP_DIR / backup.STATE_FILE
    state_file.unlink()  # the weight files record their own state
    state = backup.latest(str(tmp_path))
    assert state["step"] == 6 and "state.json is missing; resuming from weights-000000006.npz" in capsys.readouterr().out
    state_file.write_text(json.dumps({"epoch": 2, "step": 6}))  # no "weights": recovered the same way
    assert backup.latest(str(tmp_path))["step"] == 6
    for path in (tmp_path / backup.BACKUP_DIR).glob("weights-*.npz"):
        path.write_bytes(b"")  # nothing intact: an error naming the file, not a fresh start
    with pytest.raises(runs.RunFolderError, match=r"backup/state.json is unreadable \(no 'weights' entry\)"):
        backup.latest(str(tmp_path))
    state_file.unlink()
    with pytest.raises(runs.RunFolderError, match=r"backup/state.json is missing and no weight file"):
        backup.latest(str(tmp_path))


def test_a_temporary_weight_file_is_never_taken_for_a_backup(tmp_path, capsys):
    """A write killed mid-way leaves ``weights-<step>.tmp-<pid>-<n>.npz``, complete or not: recovering
    without state.json takes the newest real backup, and the next backup's clean-up leaves the
    temporary file to the folder's own clean-up rather than counting it."""
    from uniclr_tf.training import backup
    fake_backup(tmp_path, 3)
    folder = tmp_path / backup.BACKUP_DIR
    (folder / "weights-000000003.npz").rename(folder / "weights-000000003.keep")
    fake_backup(tmp_path, 6)
    (folder / "weights-000000003.keep").rename(folder / "weights-000000009.tmp-1234-0.npz")  # intact, newer
    (folder / backup.STATE_FILE).unlink()
    state = backup.latest(str(tmp_path))
    assert state["weights"] == "weights-000000006.npz" and state["step"] == 6
    assert "resuming from weights-000000006.npz" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# 7, 8: signals at the edges, divergence inside an epoch

def test_a_signal_delivered_twice_at_once_is_one_signal_and_a_later_sigint_is_a_second():
    """``timeout -s INT`` sends its signal to the process and to its process group: the copy that
    arrives at once must not count as a second Ctrl-C (which stops without a backup)."""
    import signal
    import time

    from uniclr_tf.training import backup
    from uniclr_tf.training import stop_signals

    interrupts = backup.Interrupts()
    interrupts._handle(signal.SIGINT, None)
    interrupts._handle(signal.SIGINT, None)  # the same signal again, at once: still a stop at the boundary
    interrupts._handle(signal.SIGTERM, None)
    assert interrupts.signal == signal.SIGINT
    time.sleep(stop_signals.REPEAT_S + 0.05)
    interrupts._handle(signal.SIGTERM, None)  # a later SIGTERM changes nothing either
    with pytest.raises(backup.Interrupted) as e:
        interrupts._handle(signal.SIGINT, None)
    assert e.value.twice and e.value.exit_code == 130


def test_the_signal_notice_does_not_write_into_a_stdout_busy_writing(monkeypatch):
    """The handler runs between two bytecodes of the main thread, which may be inside a write to the
    buffered stdout (a progress bar): writing through the same stream from the handler raised
    "RuntimeError: reentrant call" and ended a run that a signal should have stopped cleanly. The
    notice goes to stdout's file descriptor instead."""
    import os
    import signal

    from uniclr_tf.training import backup

    read, write = os.pipe()

    class BusyStdout:   # a stream in the middle of a write, as the handler finds it
        encoding = "utf-8"

        def fileno(self):
            return write

        def write(self, text):
            raise RuntimeError("reentrant call inside <_io.BufferedWriter name='<stdout>'>")

        def flush(self):
            raise RuntimeError("reentrant call inside <_io.BufferedWriter name='<stdout>'>")

    monkeypatch.setattr("sys.stdout", BusyStdout())
    backup.Interrupts()._handle(signal.SIGTERM, None)
    os.close(write)
    with os.fdopen(read) as f:
        assert f.read() == ("\nreceived SIGTERM: saving a backup at the next step boundary "
                            "(Ctrl-C again to stop at once)\n")


def test_a_second_sigint_exits_130_with_one_true_line(cli_runs):
    run_dir, proc = cli_runs["twice"]
    proc = proc.result()
    one_line_exit(proc, 130)
    last = proc.stdout.strip().splitlines()[-1]
    assert last == ("received SIGINT twice: stopped at once, no backup of this step; the last backup is at epoch 2, "
                    "step 2: rerun the same command to resume from it"), last
    metrics = strict_json(run_dir / "t" / "metrics.json")
    assert metrics["status"] == "interrupted" and (metrics["epoch"], metrics["step"]) == (2, 2)
    assert strict_json(run_dir / "t" / "backup" / "state.json")["step"] == 2


def test_sigterm_before_the_first_step_says_no_backup_was_needed(cli_runs):
    run_dir, proc = cli_runs["before"]
    proc = proc.result()
    one_line_exit(proc, 143)
    last = proc.stdout.strip().splitlines()[-1]
    assert "stopped before the first step (SIGTERM); no backup was needed" in last and "backup saved" not in last
    assert not (run_dir / "b" / "backup").exists()


def test_divergence_is_caught_inside_the_epoch(cli_runs):
    run_dir, proc = cli_runs["diverge"]
    proc = proc.result()
    one_line_exit(proc, 1)
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: training diverged at epoch 1, step "), last
    step = int(last.split("step ")[1].split(":")[0])
    assert step < 60 and step % 10 == 0, last  # seen at a check inside the epoch, not at its end


def test_resume_notes_say_where_the_run_resumes():
    from uniclr_tf.training import cli as train
    from uniclr_tf.config.train_config import TrainConfig
    assert train._resume_note({"epoch": 6, "step": 60}, 6) == (" (all 6 epochs done, step 60: resuming at the "
                                                                "final stage)")
    assert train._resume_note({"epoch": 1, "step": 15}, 6) == " (resuming at epoch 2, step 15)"
    assert "-<timestamp>" not in TrainConfig.field_help("run_name")


# ---------------------------------------------------------------------------------------------
# 9: the stand-in server answers every request, under load and when it is bad

class FakeServable:
    """The server's model side without a SavedModel: predict checks its uint8 instances as the real one."""

    def __init__(self, standin):
        self.standin = standin

    def status(self, name, version):
        return {"model_version_status": [{"version": "1", "state": "AVAILABLE"}]}

    def metadata(self, name, version):
        return {}

    def predict(self, name, version, body):
        standin = self.standin
        spec = type("Spec", (), {"dtype": type("D", (), {"as_numpy_dtype": np.uint8})})()
        array = standin._to_array(body["instances"], spec, "'instances'")
        return {"predictions": array.reshape(len(array), -1).sum(axis=1).tolist()}


def _standin():
    import importlib.util
    spec = importlib.util.spec_from_file_location("standin_server", REPO_ROOT / "export" / "standin_server.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def server(request):
    standin = _standin()
    standin.READ_TIMEOUT_S = getattr(request, "param", 1.0)
    with standin.StandinServer(None, servable=FakeServable(standin), max_body_mb=1) as running:
        running.port = running.httpd.server_address[1]
        yield running


def raw_request(port, data, timeout=10):
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        reply = b""
        while b"\r\n\r\n" not in reply:
            more = s.recv(65536)
            if not more:
                break
            reply += more
        return reply.split(b" ", 2)[1].decode() if reply else None


def post(port, body, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    conn.request("POST", "/v1/models/uniclr:predict", body=body,
                 headers={"Content-Type": "application/json", **(headers or {})})
    response = conn.getresponse()
    out = response.status, json.loads(response.read() or b"null")
    conn.close()
    return out


def test_the_standin_server_answers_bad_requests_with_http_errors(server):
    port = server.port
    assert post(port, json.dumps({"instances": [[1, 2], [3, 4]]}))[1] == {"predictions": [3, 7]}
    status, reply = post(port, json.dumps({"instances": [[True, 2]]}))
    assert status == 400 and "is not of expected type: uint8" in reply["error"]
    assert post(port, "[" * 100_000 + "]" * 100_000)[0] == 400  # too deep for the JSON parser
    head = b"POST /v1/models/uniclr:predict HTTP/1.1\r\nHost: x\r\n"
    assert raw_request(port, head + b"Content-Length: 2097152\r\n\r\nxx") == "413"  # over --max_body_mb, unread
    assert raw_request(port, head + b"Content-Length: abc\r\n\r\n{}") == "400"
    assert raw_request(port, head + b"\r\n") == "411"
    # a half-sent request is dropped after the read timeout; new requests are served meanwhile
    stalled = [socket.create_connection(("127.0.0.1", port)) for _ in range(50)]
    for s in stalled:
        s.sendall(head + b"Content-Length: 100\r\n\r\n{\"inst")
    start = time.monotonic()
    assert post(port, json.dumps({"instances": [[1]]}))[0] == 200
    assert time.monotonic() - start < 1.0
    time.sleep(1.5)
    assert all(s.recv(100) == b"" for s in stalled)  # the server closed them
    for s in stalled:
        s.close()


@pytest.mark.parametrize("server", [30.0], indirect=True)  # clients wait at a barrier once connected
def test_the_standin_server_takes_hundreds_of_concurrent_connections(server):
    errors, barrier = [], threading.Barrier(300)

    def client():
        try:
            with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
                barrier.wait(timeout=30)
                body = b'{"instances": [[1, 2]]}'
                s.sendall(b"POST /v1/models/uniclr:predict HTTP/1.1\r\nHost: x\r\nContent-Length: "
                          + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
                reply = b""
                while True:
                    more = s.recv(65536)
                    if not more:
                        break
                    reply += more
                assert reply.startswith(b"HTTP/1.1 200"), reply[:100]
        except Exception as e:  # a reset connection, a timeout
            errors.append(repr(e))

    threads = [threading.Thread(target=client) for _ in range(300)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:5]
