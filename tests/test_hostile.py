"""Hostile inputs: decompression bombs in every decode path, damaged backups and state files, hard
links and special files in folder datasets, damaged TFRecord files, a stand-in server that bounds
the work of a request, an export killed between its steps, and the smaller edges of a run.

Most cases run in this process on tiny data; the few that need the train CLI run it once each on a
tiny encoder (or in forks of one interpreter, for those that stop before training).
"""

import io
import json
import os
import shutil
import socket
import sys
import threading
import time
import zlib

import numpy as np
import pytest

from tests import warm
from tests.conftest import REPO_ROOT, run_cli_forks

# ---------------------------------------------------------------------------------------------
# Images


def png(array):
    from PIL import Image
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, "PNG")
    return buffer.getvalue()


def png_declaring(width, height):
    """A small PNG whose header declares ``width`` x ``height`` grey pixels (its data is a few rows)."""
    def chunk(kind, data):
        return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")
    ihdr = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 0, 0, 0, 0])
    rows = zlib.compress(b"\0" * (width + 1) * 4)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")


def write_records(path, images, names=None):
    import tensorflow as tf

    from uniclr_tf.data.sources.tfrecord import encode_example
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i, raw in enumerate(images):
            writer.write(encode_example(raw, i % 2, filename=(names[i] if names else f"img{i}.png")))


def stream_error(split):
    """The one-line message of the first bad image met while reading ``split`` (None: none)."""
    from uniclr_tf import data
    try:
        for _ in split.dataset:
            pass
    except Exception as e:  # noqa: BLE001 - tf.data's error carries the image's name
        return data.bad_file_message(e) or f"UNNAMED: {str(e)[:300]}"
    return None


# ---------------------------------------------------------------------------------------------
# 1: bombs inside TFRecords (and TFDS), past the sample decoded at load


def test_a_bomb_inside_a_tfrecord_is_refused_from_its_header_while_streaming(tmp_path, monkeypatch):
    from uniclr_tf import data
    from uniclr_tf.data.sources import tfrecord
    monkeypatch.setattr(tfrecord, "STATS_SAMPLE", 4)  # the bombs lie past the sample decoded at load
    images = [png(np.full((8, 8), i, np.uint8)) for i in range(12)]
    images[9] = png(np.zeros((1200, 1200), np.uint8))  # 1.4 M pixels, a few KB
    images[10] = png_declaring(20000, 20000)  # 400 M pixels declared, 2 KB
    names = [f"img{i}.png" for i in range(12)]
    names[9], names[10] = "bomb9.png", "bomb10.png"
    write_records(tmp_path / "train.tfrecord", images, names)
    info = data.load_dataset(f"tfrecord:{tmp_path}/train.tfrecord", image_size=28, max_image_pixels=1_000_000,
                             holdout_fraction=0.01, check_duplicates=False)
    message = stream_error(info.split("train"))
    assert message.startswith("bomb9.png: image is 1200x1200 = 1,440,000 pixels, more than the limit of 1,000,000")
    assert "--max_image_pixels" in message
    info = data.load_dataset(f"tfrecord:{tmp_path}/train.tfrecord", image_size=28, holdout_fraction=0.01,
                             check_duplicates=False)  # the default limit
    message = stream_error(info.split("train"))
    assert message.startswith("bomb10.png: image is 20000x20000 = 400,000,000 pixels, more than the limit of "
                              "89,478,485") and "--max_image_pixels" in message
    skipping = data.load_dataset(f"tfrecord:{tmp_path}/train.tfrecord", image_size=28, max_image_pixels=1_000_000,
                                 holdout_fraction=0.01, skip_bad_files=True, check_duplicates=False)
    kept = sum(1 for _ in skipping.split("train").dataset) + sum(1 for _ in skipping.split("test").dataset)
    assert kept == 10 and skipping.skipped_while_streaming() == ("bomb10.png", "bomb9.png")


def test_a_bomb_in_a_tfds_dataset_is_refused_from_its_header(monkeypatch):
    tfds = pytest.importorskip("tensorflow_datasets")
    from uniclr_tf import data
    with tfds.testing.mock_data(num_examples=4):
        with pytest.raises(Exception) as error:  # the sample read at load meets it first
            data.load_dataset("tfds:cifar10", max_image_pixels=1000)  # cifar10's images are 32x32 = 1,024
    message = data.bad_file_message(error.value)
    assert message.startswith("tfds:cifar10:train example 0: image is 32x32 = 1,024 pixels, more than the limit")


def test_an_image_whose_header_does_not_tell_its_size_is_never_decoded():
    from uniclr_tf.data import decode
    from PIL import Image
    frames = [Image.fromarray(np.full((40, 50), i * 40, np.uint8)) for i in range(6)]
    gif = io.BytesIO()
    frames[0].save(gif, "GIF", save_all=True, append_images=frames[1:])
    size = decode.declared_size(gif.getvalue())
    assert (size.height, size.width, size.frames, size.pixels) == (40, 50, 6, 6 * 2000)  # every frame is read
    with pytest.raises(decode.ImageDecodeError, match="image is 40x50 in 6 frames = 12,000 pixels"):
        decode.decode_image(gif.getvalue(), max_pixels=10_000)
    assert decode.decode_image(gif.getvalue(), max_pixels=12_000).shape == (40, 50, 3)
    for raw in (b"\xff\x0a" + b"\0" * 64, b"GIF89a", b"\xff\xd8\xff\xd9", b"RIFF\0\0\0\0WEBPVP8 " + b"\0" * 4):
        with pytest.raises(decode.ImageDecodeError, match="cannot decode image"):
            decode.decode_image(raw)


def test_the_shuffle_buffer_of_large_records_is_bounded_in_bytes():
    from uniclr_tf.data import stream
    assert stream.shuffle_buffer(300) == stream.SHUFFLE_BUFFER
    assert stream.shuffle_buffer(176_000) * 176_000 <= stream.SHUFFLE_BUFFER_MB * 2 ** 20


# ---------------------------------------------------------------------------------------------
# 2: damaged backups and state files


def tiny_model():
    import keras
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="dense")])
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
    model.optimizer.build(model.trainable_variables)
    return model


def backup_at(model, run_dir, step, steps_per_epoch=3):
    from uniclr_tf.training import backup
    for v in model.trainable_variables:
        v.assign(np.full(v.shape, step, np.float32))
    return backup.write(str(run_dir), backup.to_host(backup.snapshot(model)), epoch=step // steps_per_epoch,
                        step=step, reason="epoch")


def rewrite_npz(path, change):
    """Rewrites a weight file with valid checksums, its arrays changed by ``change(key, array)``."""
    with np.load(path) as data:
        arrays = {k: change(k, data[k]) for k in data.files}
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def test_a_backup_with_arrays_of_other_shapes_falls_back_to_the_one_before(tmp_path, capsys):
    from uniclr_tf.training import backup, runs
    model = tiny_model()
    backup_at(model, tmp_path, 3)
    backup_at(model, tmp_path, 5)
    folder = tmp_path / backup.BACKUP_DIR
    rewrite_npz(folder / "weights-000000005.npz",
                lambda k, a: np.zeros((7, 7), a.dtype) if "kernel" in k else a)  # right names, wrong shapes
    state = backup.latest(str(tmp_path))
    assert state["step"] == 5  # the zip is intact: only the model can tell
    restored = backup.restore(model, str(tmp_path), state, steps_per_epoch=3, total_steps=9)
    out = capsys.readouterr().out
    assert restored["step"] == 3 and restored["weights"] == "weights-000000003.npz"
    assert "warning: backup/weights-000000005.npz does not fit the model" in out and "shape (7, 7)" in out
    assert "resuming from the backup before it, weights-000000003.npz" in out and "Traceback" not in out
    assert float(model.trainable_variables[0].numpy().ravel()[0]) == 3.0
    rewrite_npz(folder / "weights-000000003.npz", lambda k, a: a.astype(np.float64) * np.nan if "|" in k else a)
    with pytest.raises(runs.RunFolderError) as error:
        backup.restore(model, str(tmp_path), state, steps_per_epoch=3, total_steps=9)
    message = str(error.value)
    assert "\n" not in message and "no usable backup" in message and "weights-000000005.npz" in message
    assert "weights-000000003.npz" in message and "--overwrite" in message


@pytest.mark.parametrize("entries", [{"epoch": "1"}, {"epoch": -3, "step": 1e15}, {"epoch": True},
                                     {"step": 2**80}, {"epoch": 0, "step": 4}, {"weights": "../../x.npz"},
                                     {"previous": {"epoch": "x"}}, {"reason": ["x"]}])
def test_a_state_file_of_wrong_types_or_ranges_is_recovered_from_the_weight_file(entries, tmp_path, capsys):
    from uniclr_tf.training import backup
    model = tiny_model()
    backup_at(model, tmp_path, 3)
    backup_at(model, tmp_path, 5)
    state_file = tmp_path / backup.BACKUP_DIR / backup.STATE_FILE
    state = json.loads(state_file.read_text())
    state_file.write_text(json.dumps({**state, **entries}))
    state = backup.latest(str(tmp_path))
    assert (state["epoch"], state["step"], state["weights"]) == (1, 5, "weights-000000005.npz")
    assert "backup/state.json is unreadable" in capsys.readouterr().out


def test_a_state_outside_the_run_is_not_resumed():
    from uniclr_tf.training import backup
    state = {"epoch": 1, "step": 5, "weights": "weights-000000005.npz"}
    assert backup.check_progress(state, 3, 9) is None
    assert "this run's epochs are 2 steps" in backup.check_progress(state, 2, 9)
    assert "past this run's 4 steps" in backup.check_progress(state, 5, 4)


def test_a_damaged_metrics_or_history_file_resumes_from_the_backup(tmp_path, capsys):
    from uniclr_tf.training import cli
    (tmp_path / "metrics.json").write_text("[1, 2]")
    assert cli._read_metrics(str(tmp_path / "metrics.json")) is None
    (tmp_path / "metrics.json").write_text('{"status": 3}')
    assert cli._read_metrics(str(tmp_path / "metrics.json")) is None
    (tmp_path / "history.json").write_text('[{"epoch": 1, "loss": 2}, {"epoch": "2"}, 7, {"epoch": 3}]')
    assert cli._read_history(str(tmp_path), 2) == [{"epoch": 1, "loss": 2}]
    (tmp_path / "history.json").write_text("{not json")
    assert cli._read_history(str(tmp_path), 2) == []
    assert capsys.readouterr().out.count("warning:") == 3


# ---------------------------------------------------------------------------------------------
# 3, 7: hard links, duplicates across splits, special files


def write_images(folder, count, offset=0, size=8):
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (folder / f"{i:03d}.png").write_bytes(png(np.full((size, size), (i + offset) * 7 % 256, np.uint8)))


def test_hard_links_are_counted_once_and_copies_across_splits_are_reported(tmp_path):
    from uniclr_tf import data
    root = tmp_path / "ds"
    write_images(root / "train" / "a", 10)
    write_images(root / "train" / "b", 10, offset=10)
    write_images(root / "test" / "a", 3, offset=20)
    write_images(root / "test" / "b", 3, offset=23)
    for i in range(4):  # the same files under the other class, and in the test split
        os.link(root / "train" / "a" / f"{i:03d}.png", root / "train" / "b" / f"link{i}.png")
        os.link(root / "train" / "a" / f"{i:03d}.png", root / "test" / "b" / f"link{i}.png")
    shutil.copy(root / "train" / "b" / "005.png", root / "test" / "a" / "copy.png")  # a copy, not a link
    for limit in (256, 0):  # in memory, streamed
        info = data.load_dataset(f"folder:{root}", max_in_memory_mb=limit)
        assert (info.num_train, info.num_test) == (20, 7), limit
        assert any("8 path(s) are hard links to files already listed" in note for note in info.notes)
        assert info.test_duplicates == 1
        assert any("1 of the 7 test images are exact copies" in note and "--nocheck_duplicates" in note
                   for note in info.notes)
    assert data.load_dataset(f"folder:{root}", check_duplicates=False).test_duplicates is None
    flat = tmp_path / "flat"
    write_images(flat, 20)
    for i in range(20):
        os.link(flat / f"{i:03d}.png", flat / f"again{i}.png")
    info = data.load_dataset(f"folder:{flat}")  # held out by path: each file on one side only
    assert info.num_train + info.num_test == 20 and info.test_duplicates == 0


def test_special_files_are_skipped_by_type_before_anything_opens_them(tmp_path):
    from uniclr_tf import data
    root = tmp_path / "ds"
    write_images(root / "a", 6)
    write_images(root / "b", 6, offset=6)
    os.mkfifo(root / "a" / "fifo.png")  # opening it would block for ever
    os.symlink("/dev/zero", root / "b" / "zero.png")  # reading it would never end
    done = {}

    def load(skip):
        done[skip] = data.load_dataset(f"folder:{root}", skip_bad_files=skip)

    for skip in (False, True):
        thread = threading.Thread(target=load, args=(skip,), daemon=True)
        thread.start()
        thread.join(60)
        assert skip in done, "loading the folder hung"
        info = done[skip]
        assert info.num_train + info.num_test == 12
        assert any("skipped 2 path(s) that are not regular files" in note for note in info.notes)
    import importlib.util  # the serving client reads the files it sends the same way
    spec = importlib.util.spec_from_file_location("client_hostile", REPO_ROOT / "export" / "client.py")
    client = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(client)
    for special in ("a/fifo.png", "b/zero.png"):
        with pytest.raises(ValueError, match="not a regular file"):
            client.load_images([str(root / special)], 1)


# ---------------------------------------------------------------------------------------------
# 5: a damaged TFRecord file


def test_a_truncated_or_corrupted_tfrecord_file_is_named(tmp_path):
    from uniclr_tf import data
    write_records(tmp_path / "a.tfrecord", [png(np.full((8, 8), i, np.uint8)) for i in range(10)])
    write_records(tmp_path / "b.tfrecord", [png(np.full((8, 8), 100 + i, np.uint8)) for i in range(10)])
    (tmp_path / "meta.json").write_text(json.dumps({  # the converter's JSON: no count pass at load
        "format": "uniclr_tf.tfrecord/1", "channels": 1,
        "splits": {"train": {"files": ["a.tfrecord", "b.tfrecord"], "count": 20}}}))
    raw = (tmp_path / "b.tfrecord").read_bytes()
    (tmp_path / "b.tfrecord").write_bytes(raw[:len(raw) - 40])
    spec = f"tfrecord:{tmp_path}/*.tfrecord"
    with pytest.raises(data.DataError) as error:
        data.load_dataset(spec)
    message = str(error.value)
    assert message.startswith(f"{tmp_path}/b.tfrecord: truncated record at byte ") and "--skip_bad_files" in message
    info = data.load_dataset(spec, skip_bad_files=True, check_duplicates=False)
    assert sum(1 for _ in info.split("train").dataset) + sum(1 for _ in info.split("test").dataset) == 19
    # damage in a record's data (its checksum) is found only while streaming: the file is named then
    (tmp_path / "b.tfrecord").write_bytes(raw)
    info = data.load_dataset(spec, holdout_fraction=0.01, check_duplicates=False)
    flipped = bytearray(raw)
    flipped[len(raw) - 30] ^= 0xFF
    (tmp_path / "b.tfrecord").write_bytes(bytes(flipped))
    message = stream_error(info.split("train"))
    assert message.startswith(f"{tmp_path}/b.tfrecord: corrupted record at byte "), message


# ---------------------------------------------------------------------------------------------
# 4: the stand-in server bounds the work of a request


def _standin():
    import importlib.util
    spec = importlib.util.spec_from_file_location("standin_hostile", REPO_ROOT / "export" / "standin_server.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Signature:
    """A SavedModel signature's interface: keyword inputs, a dict of outputs."""

    def __init__(self, tf, calls):
        self.structured_input_signature = ((), {"images": tf.TensorSpec([None, None, None, 1], tf.uint8)})
        self.tf, self.calls = tf, calls

    def __call__(self, images):
        self.calls.append(tuple(images.shape))
        return {"features": self.tf.reduce_mean(self.tf.cast(images, self.tf.float32), axis=[1, 2])}


@pytest.fixture
def budget_server():
    import tensorflow as tf
    standin = _standin()
    standin.READ_TIMEOUT_S = 1.0
    servable = standin.Servable.__new__(standin.Servable)
    calls = []
    servable.tf, servable.name, servable.version = tf, "uniclr", 1
    servable.signatures, servable._metadata = {"serving_default": _Signature(tf, calls)}, None
    servable.limits = dict(max_batch_size=64, max_pixels=64 * 28 * 28, train_pixels=28 * 28)
    with standin.StandinServer(None, servable=servable, workers=4) as server:
        server.port, server.calls = server.httpd.server_address[1], calls
        yield server


def _post(port, body):
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    conn.request("POST", "/v1/models/uniclr:predict", body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    out = response.status, response.read()
    conn.close()
    return out


def test_the_server_answers_a_request_over_its_work_budget_with_413(budget_server):
    port = budget_server.port
    status, reply = _post(port, json.dumps({"instances": [[[[1]]]] * 8}))
    assert status == 200 and len(json.loads(reply)["predictions"]) == 8
    for body, flag in ((json.dumps({"instances": [[[[0]]]] * 20_000}), "--max_batch_size"),  # 20,000 1x1 images
                       (json.dumps({"inputs": {"images": np.zeros((65, 1, 1, 1), int).tolist()}}), "--max_batch_size"),
                       (json.dumps({"instances": np.zeros((2, 600, 600, 1), int).tolist()}), "--max_request_pixels")):
        status, reply = _post(port, body)
        assert status == 413 and reply.count(b"\n") == 0, (status, reply[:200])
        assert flag in json.loads(reply)["error"]
    assert budget_server.calls == [(8, 1, 1, 1)]  # the model never ran on an over-budget request


def test_slow_clients_hold_no_worker_and_are_dropped_at_the_timeout(budget_server):
    port = budget_server.port
    threads_before = threading.active_count()
    slow = [socket.create_connection(("127.0.0.1", port)) for _ in range(200)]
    head = b"POST /v1/models/uniclr:predict HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
    start = time.monotonic()
    closed = set()
    for step in range(12):  # a byte every 0.2 s, for longer than the 1 s a request may take
        for i, s in enumerate(slow):
            if i in closed:
                continue
            try:
                s.sendall(head[step:step + 1] if step < len(head) else b"0")
            except OSError:
                closed.add(i)
        if step == 2:  # meanwhile a whole request is answered at once
            t = time.monotonic()
            assert _post(port, json.dumps({"instances": [[[[1]]]]}))[0] == 200
            assert time.monotonic() - t < 1.0
            assert threading.active_count() - threads_before <= 5  # the 4 workers, not one per client
        time.sleep(0.2)
    time.sleep(0.5)
    for s in slow:
        s.settimeout(2)
        try:
            assert s.recv(100) == b""  # closed by the server, with no answer
        except OSError:
            pass
        s.close()
    assert time.monotonic() - start < 8


# ---------------------------------------------------------------------------------------------
# 6: an export killed after its version folder appeared


def test_an_export_killed_after_its_version_folder_appeared_is_finished_by_a_rerun(tiny_run, tmp_path, monkeypatch):
    from uniclr_tf.serving import export
    out = tmp_path / "serving"
    export.export_run(str(tiny_run), str(out), version=1)
    real_save = export.atomic_save

    def killed(path, save):
        with open(os.path.join(os.path.dirname(path), f"backbone.tmp-{2 ** 22 + 12345}-0.keras"), "wb"):
            pass  # the 0-byte temporary file a kill leaves
        raise KeyboardInterrupt  # killed there

    monkeypatch.setattr(export, "atomic_save", killed)
    with pytest.raises(KeyboardInterrupt):
        export.export_run(str(tiny_run), str(out), version=2)
    monkeypatch.setattr(export, "atomic_save", real_save)
    assert json.loads((out / "export.json").read_text())["version"] == 1  # stale: the kill came before it
    assert export.find_saved_model(str(out)) == str(out / "2")  # what the server serves, and --check checks
    meta = export.export_run(str(tiny_run), str(out), version=2)  # the same command again: finished
    assert meta.get("finished_interrupted") and meta["version"] == 2
    assert json.loads((out / "export.json").read_text())["version"] == 2
    assert sorted(os.listdir(out)) == ["1", "2", "backbone.keras", "export.json"]  # no temporary file left
    with pytest.raises(ValueError, match="pass --overwrite"):
        export.export_run(str(tiny_run), str(out), version=2)


def test_overwrite_replaces_only_what_the_tool_wrote(tiny_run, tmp_path):
    from uniclr_tf.serving import export, release
    for what, call in (("export folder", lambda out: export.export_run(str(tiny_run), str(out), overwrite=True)),
                       ("release folder", lambda out: release.release_run(str(tiny_run), str(out), overwrite=True,
                                                                          saved_model=False))):
        out = tmp_path / what.replace(" ", "_")
        out.mkdir()
        (out / "thesis.tex").write_text("not an export")
        with pytest.raises(ValueError) as error:
            call(out)
        assert f"holds files that are not a {what} of this tool; refusing to delete them" in str(error.value)
        assert os.listdir(out) == ["thesis.tex"]


def test_a_release_below_the_raw_pixel_baseline_says_so_in_its_model_card(tiny_run, tmp_path):
    from uniclr_tf.serving import release
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    metrics = json.loads((run / "metrics.json").read_text())
    metrics.update(knn_top1=0.30, raw_pixel_knn_top1=0.75, below_raw_pixel_baseline=True)
    (run / "metrics.json").write_text(json.dumps(metrics))
    lines = []
    release.release_run(str(run), str(tmp_path / "release"), saved_model=False, log=lines.append)
    card = (tmp_path / "release" / "MODEL_CARD.md").read_text()
    assert "> **Warning**: this encoder's kNN top-1 (0.3000) is below the raw-pixel kNN baseline (0.7500)" in card
    assert any(line.startswith("warning: this encoder's kNN top-1") for line in lines)


# ---------------------------------------------------------------------------------------------
# 8: the smaller edges of a run


def test_the_collapse_check_runs_at_the_end_of_a_one_epoch_run():
    from uniclr_tf.training.callbacks import CollapseDetector, TrainingCollapsed
    detector = CollapseDetector(embedding_dim=64)
    detector.set_params({"epochs": 3})
    detector.on_epoch_end(0, {"embedding_std": 1e-6})  # the first of three epochs: not judged yet
    detector.set_params({"epochs": 1})
    with pytest.raises(TrainingCollapsed, match="collapse at epoch 1: embedding std"):
        detector.on_epoch_end(0, {"embedding_std": 1e-6})


def test_a_permission_error_asks_for_access_not_for_room():
    import errno

    from uniclr_tf.training import cli
    line = cli.write_error_line(PermissionError(errno.EACCES, "Permission denied", "/runs/x/backup/state.json"))
    assert line.startswith("error: could not write /runs/x/backup/state.json (Permission denied)")
    assert "make room" not in line and "--run_dir" in line
    assert "make room" in cli.write_error_line(OSError(errno.ENOSPC, "No space left on device", "/runs/x/a"))
    assert cli.write_error_line(OSError(errno.ENOENT, "No such file", "/x")) is None


def test_a_refused_folder_gets_no_lock_file(tmp_path):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "thesis.tex").write_text("mine")
    (result,) = run_cli_forks("uniclr_tf.train", [["--flagfile=configs/quickstart.flags", "--encoder=tiny",
                                                   "--max_examples=256", f"--run_dir={tmp_path}", "--run_name=notes"]])
    assert result.returncode == 1 and result.stderr.strip().splitlines()[-1].startswith("error: --run_name:")
    assert os.listdir(folder) == ["thesis.tex"]


TINY_RUN = ["--flagfile=configs/quickstart.flags", "--method=simclr", "--encoder=tiny", "--encoder_width=8",
            "--projector_dims=64,32", "--batch_size=64", "--max_examples=256", "--knn_max_train=256", "--epochs=1",
            "--steps_per_epoch=2", "--knn_every=0", "--nopictures", "--warmup_epochs=0"]

SIGNALS_AT_THE_LAST_STEP = r"""
import os, runpy, signal, sys, time
from uniclr_tf.training import backup
real_end = backup.BackupCallback.on_epoch_end
def on_epoch_end(self, epoch, logs=None):  # SIGINT, then the scheduler's SIGTERM, after the last step
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.3)
    os.kill(os.getpid(), signal.SIGTERM)
    return real_end(self, epoch, logs)
backup.BackupCallback.on_epoch_end = on_epoch_end
sys.argv = ["-m", *sys.argv[1:]]
runpy.run_module("uniclr_tf.train", run_name="__main__", alter_sys=True)
"""


def _cli(*args, code=None):
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(REPO_ROOT)}
    command = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "uniclr_tf.train", *args]
    return warm.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_a_signal_acknowledged_at_the_last_step_stops_the_run_and_export_is_not_ignored(tmp_path):
    args = [*TINY_RUN, f"--run_dir={tmp_path}", "--run_name=run"]
    first = _cli(*args, code=SIGNALS_AT_THE_LAST_STEP)
    assert first.returncode == 130, first.stdout[-2000:] + first.stderr[-3000:]
    assert "Traceback" not in first.stderr and "stopped after the last step (2) of epoch 1" in first.stdout
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["status"] == "interrupted"
    second = _cli(*args)  # resumes at the final stage and finishes
    assert second.returncode == 0 and "resuming at the final stage" in second.stdout, second.stderr[-3000:]
    third = _cli(*args, "--export")  # a finished run, --export asked now: exported now
    assert third.returncode == 0, third.stderr[-3000:]
    assert "this run already finished" in third.stdout and "exported the finished run" in third.stdout
    assert os.path.isfile(tmp_path / "run" / "export" / "saved_model.pb")
