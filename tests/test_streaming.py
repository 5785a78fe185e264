"""Streamed data: folders read lazily through tf.data, ``tfrecord:`` datasets and the tool that
writes them, ``eval_spec`` / ``--eval_dataset``, ``holdout_fraction``, the kNN evaluations on
streamed splits, and peak memory that stays flat as a streamed folder grows.

Folders are written with PIL into ``tmp_path`` (helpers of ``tests/test_data.py``);
``max_in_memory_mb=0`` makes a small folder stream.
"""

import concurrent.futures
import io
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from tests import warm
from tests.conftest import REPO_ROOT
from tests.test_data import DECODE_CASES, coded_image, make_class_folder, one_line, write_image
from uniclr_tf import data
from uniclr_tf.config.train_config import TrainConfig
from uniclr_tf.data import DataError
from uniclr_tf.tools import folder_to_tfrecord

CLI_ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO_ROOT))
TINY = ["--encoder=tiny", "--encoder_width=8", "--projector_dims=64,32", "--batch_size=32", "--steps_per_epoch=2",
        "--epochs=1", "--warmup_epochs=0", "--method=simclr"]


def keyed(images, labels):
    """A split as a sorted list of (pixels, label): equal for the same examples in any order."""
    return sorted(zip((bytes(x) for x in np.asarray(images)), np.asarray(labels).tolist()))


def both_splits(info):
    return {s: keyed(*data.as_numpy(info, s)) for s in ("train", "test")}


def damage_middle(path):
    """Flips the bytes in the middle of a PNG's pixel data: its header and end stay intact."""
    raw = bytearray(open(path, "rb").read())
    for i in range(48, len(raw) - 20):
        raw[i] ^= 0x5A
    open(path, "wb").write(bytes(raw))


# --- image_header: decode_image's answer from the header and the end of a file ----------------


@pytest.mark.parametrize("name", sorted(DECODE_CASES))
def test_image_header_agrees_with_decode_image(name, tmp_path):
    """The load-time check of streamed folders gives decode_image's shape, and for a file cut
    short, decode_image's verdict (its error, or what it still decodes)."""
    raw = DECODE_CASES[name]
    path = tmp_path / "image"
    path.write_bytes(raw)
    assert data.image_header(str(path)).shape == data.decode_image(raw).shape
    cut = raw[: len(raw) * 2 // 3]
    path.write_bytes(cut)
    try:
        want = data.decode_image(cut).shape
    except data.ImageDecodeError as e:
        with pytest.raises(data.ImageDecodeError, match=str(e.args[0]).replace("(", r"\(").replace(")", r"\)")):
            data.image_header(str(path))
    else:
        assert data.image_header(str(path)).shape == want


# --- folder: streamed ---------------------------------------------------------------------------


def test_streamed_folder_equals_the_in_memory_one(tmp_path):
    """Above max_in_memory_mb a folder streams; its splits, statistics and pixels (mixed formats,
    grey/RGB/RGBA, resized) are the in-memory ones, its order a shuffle of every class."""
    root = make_class_folder(tmp_path / "pets", per_class=20)
    memory = data.load_dataset(f"folder:{root}")
    streamed = data.load_dataset(f"folder:{root}", max_in_memory_mb=0)
    assert memory.in_memory and not streamed.in_memory
    assert streamed.split("train").stream is not None and streamed.split("train").images is None
    assert any("streamed from disk" in n and "60 images" in n for n in streamed.notes), streamed.notes
    assert (streamed.num_train, streamed.num_test, streamed.class_names) == (54, 6, ("cat", "dog", "emu"))
    assert both_splits(streamed) == both_splits(memory)
    np.testing.assert_allclose(streamed.mean, memory.mean, rtol=1e-9)
    np.testing.assert_allclose(streamed.std, memory.std, rtol=1e-9)
    first = data.as_numpy(streamed, "train", max_examples=12)[1]
    assert set(first) == {0, 1, 2}  # a deterministic shuffle, not class by class
    np.testing.assert_array_equal(first, data.as_numpy(data.load_dataset(f"folder:{root}", max_in_memory_mb=0),
                                                       "train", max_examples=12)[1])
    ds = data.pretrain_dataset(streamed, 8, seed=3, repeat=True, with_labels=True, skip_batches=2)
    assert ds.element_spec[0].shape.as_list() == [8, 8, 8, 3]
    for x, y in ds.take(10):  # across epoch boundaries; labels follow their images
        np.testing.assert_array_equal(x.numpy()[:, 0, 0, 0] // 40, y.numpy())
    whole = [x.numpy() for x in data.pretrain_dataset(streamed, 8, seed=3, repeat=True).take(4)]
    resumed = [x.numpy() for x in data.pretrain_dataset(streamed, 8, seed=3, repeat=True, skip_batches=2).take(2)]
    np.testing.assert_array_equal(np.stack(whole[2:]), np.stack(resumed))  # a resumed run's stream

    mixed = tmp_path / "mixed"
    write_image(mixed / "c0" / "a_gray.png", coded_image(100, channels=1))
    write_image(mixed / "c0" / "b_rgb.png", np.arange(8 * 8 * 3).reshape(8, 8, 3))
    write_image(mixed / "c1" / "c_rgba.png", coded_image(7, channels=4))
    write_image(mixed / "c1" / "d_gray.jpg", coded_image(50, channels=1))
    write_image(mixed / "c1" / "e.bmp", coded_image(60))
    write_image(mixed / "c1" / "f.gif", coded_image(70))
    write_image(mixed / "c1" / "g.webp", coded_image(80, channels=4))
    for size in (None, (6, 9)):
        memory = data.load_dataset(f"folder:{mixed}", image_size=size)
        streamed = data.load_dataset(f"folder:{mixed}", image_size=size, max_in_memory_mb=0)
        assert streamed.image_shape == memory.image_shape == (*(size or (8, 8)), 3)
        assert both_splits(streamed) == both_splits(memory)

    grey = tmp_path / "grey"
    for i in range(4):
        write_image(grey / f"{i}.png", coded_image(i, channels=1))
    write_image(grey / "la.png", np.full((8, 8, 2), 9, np.uint8))  # grey + alpha stays grey
    assert data.load_dataset(f"folder:{grey}", max_in_memory_mb=0).image_shape == (8, 8, 1)


def test_streamed_folder_bad_files(tmp_path, monkeypatch):
    """At load, every file's header and end (a truncated file, another size: the in-memory
    messages); while streaming, a file damaged in the middle: an error naming it, or with
    skip_bad_files a skip, recorded once."""
    truncated = make_class_folder(tmp_path / "truncated", classes=("a",), per_class=3)
    png = os.path.join(truncated, "a", "01.png")
    payload = open(png, "rb").read()
    open(png, "wb").write(payload[: len(payload) // 2])
    with pytest.raises(DataError) as error:
        data.load_dataset(f"folder:{truncated}", max_in_memory_mb=0)
    assert one_line(error) == f"{png}: cannot decode image (truncated or not an image)"
    assert data.load_dataset(f"folder:{truncated}", max_in_memory_mb=0, skip_bad_files=True).num_skipped == 1

    sizes = tmp_path / "sizes"
    write_image(sizes / "a.png", coded_image(1))
    odd = write_image(sizes / "b.png", coded_image(2, (8, 9)))
    with pytest.raises(DataError) as error:
        data.load_dataset(f"folder:{sizes}", max_in_memory_mb=0)
    assert one_line(error).startswith(f"{odd}: image is 8x9") and "image_size" in str(error.value)

    root = make_class_folder(tmp_path / "damaged", classes=("a", "b"), per_class=10, size=(16, 16))
    bad = os.path.join(root, "b", "05.png")
    damage_middle(bad)
    assert data.image_header(bad).shape == (16, 16, 3)  # the cheap check cannot see it
    with pytest.raises(DataError) as error:  # the decoded sample (mean / std) can
        data.load_dataset(f"folder:{root}", max_in_memory_mb=0)
    assert one_line(error) == f"{bad}: cannot decode image (truncated or not an image)"

    monkeypatch.setattr("uniclr_tf.data.sources.folder.STREAM_STATS_SAMPLE", 1)  # beyond the sample now
    info = data.load_dataset(f"folder:{root}", max_in_memory_mb=0)
    assert info.num_train + info.num_test == 20 and info.num_skipped == 0
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        for _ in data.pretrain_dataset(info, 2, seed=0):
            pass
    assert data.bad_file_message(error.value) == f"{bad}: cannot decode image (truncated or not an image)"

    info = data.load_dataset(f"folder:{root}", max_in_memory_mb=0, skip_bad_files=True)
    for _ in range(2):  # every epoch meets it again
        assert sum(len(y) for s in ("train", "test") for _, y in data.eval_dataset(info, s, 4)) == 19
    assert info.skipped_while_streaming() == (bad,)


def test_holdout_fraction_and_eval_spec(tmp_path):
    """holdout_fraction sets what a folder without a test split holds out (and says so); an
    eval_spec gives the test split instead (the training spec then keeps every image)."""
    root = make_class_folder(tmp_path / "train", per_class=10)
    info = data.load_dataset(f"folder:{root}", holdout_fraction=0.2)
    assert (info.num_train, info.num_test) == (24, 6)
    assert f"folder:{root}: no test split; holding out 20% (6 images) per class as test" in info.notes
    with pytest.raises(ValueError, match="holdout_fraction"):
        data.load_dataset(f"folder:{root}", holdout_fraction=0.6)

    other = make_class_folder(tmp_path / "other", classes=("dog", "emu"), per_class=4)
    for limit in (256, 0):
        info = data.load_dataset(f"folder:{root}", eval_spec=f"folder:{other}", max_in_memory_mb=limit)
        assert (info.num_train, info.num_test, info.eval_spec) == (30, 8, f"folder:{other}")
        assert f"folder:{root}: test split from folder:{other} (8 images)" in info.notes
        images, labels = data.as_numpy(info, "test")
        assert sorted(labels) == [1] * 4 + [2] * 4  # the training classes' indices (dog = 1, emu = 2)
        np.testing.assert_array_equal(images[:, 0, 0, 0] // 40, labels - 1)  # pixels coded by the other's order

    split = tmp_path / "split"
    make_class_folder(split / "train", classes=("cat", "dog", "emu"), per_class=2)
    make_class_folder(split / "val", classes=("cat",), per_class=3)
    info = data.load_dataset(f"folder:{root}", eval_spec=f"folder:{split}")  # a folder's own test split
    assert info.num_test == 3 and set(data.as_numpy(info, "test")[1]) == {0}

    zebra = make_class_folder(tmp_path / "zebra", classes=("zebra",), per_class=2)
    with pytest.raises(DataError) as error:
        data.load_dataset(f"folder:{root}", eval_spec=f"folder:{zebra}")
    assert "zebra" in one_line(error)
    big = make_class_folder(tmp_path / "big", classes=("cat",), per_class=2, size=(9, 9))
    with pytest.raises(DataError) as error:
        data.load_dataset(f"folder:{root}", eval_spec=f"folder:{big}")
    assert one_line(error).startswith(f"folder:{big}: images are 9x9x3 but the training images")
    assert data.load_dataset(f"folder:{root}", eval_spec=f"folder:{big}", image_size=8).num_test == 2
    grey = make_class_folder(tmp_path / "grey", classes=("cat",), per_class=2, channels=1)
    for limit in (256, 0):  # grey test images take the training channels
        info = data.load_dataset(f"folder:{root}", eval_spec=f"folder:{grey}", max_in_memory_mb=limit)
        assert data.as_numpy(info, "test")[0].shape == (2, 8, 8, 3)


def test_train_config_validates_the_data_fields():
    assert TrainConfig.make(dataset="tfrecord:/data/x-train-*", eval_dataset="folder:/data/test").data.eval_dataset
    for fields, fragment in (({"holdout_fraction": 0.7}, "--holdout_fraction"),
                             ({"holdout_fraction": 0.0}, "--holdout_fraction"),
                             ({"eval_dataset": "nope"}, "--eval_dataset"),
                             ({"max_in_memory_mb": -1}, "--max_in_memory_mb"),
                             ({"dataset": "records:/x"}, "--dataset")):
        with pytest.raises(ValueError, match=fragment):
            TrainConfig.make(**fields)


def test_streamed_data_without_tensorflow_says_so(tmp_path, run_python):
    """The JAX-only GPU machine: small folders load into memory (Pillow), a streamed one says why
    it cannot stream there."""
    make_class_folder(tmp_path, classes=("a", "b"), per_class=4)
    result = run_python(f"""
        import importlib.abc, json, sys

        class NoTensorFlow(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("tensorflow", "tensorflow_datasets", "tensorboard"):
                    raise ModuleNotFoundError("No module named " + name)

        sys.meta_path.insert(0, NoTensorFlow())
        from uniclr_tf import data
        small = data.load_dataset("folder:{tmp_path}")
        try:
            data.load_dataset("folder:{tmp_path}", max_in_memory_mb=0)
            message = None
        except data.DataError as e:
            message = str(e)
        print(json.dumps({{"in_memory": small.in_memory, "message": message}}))
    """, backend="jax")
    assert result["in_memory"]
    assert "TensorFlow is not installed" in result["message"] and "--max_in_memory_mb" in result["message"]


def test_knn_on_streamed_splits_equals_in_memory(tmp_path):
    """The kNN evaluations read a streamed split batch by batch (features only) and give the
    in-memory results; the raw-pixel baseline's bank is capped by max_bank_mb."""
    import keras

    from uniclr_tf.evaluation import knn_eval, raw_pixel_knn

    rng = np.random.default_rng(0)
    for i in range(60):  # noise around a class colour: no ties between similarities
        write_image(tmp_path / f"c{i % 3}" / f"{i:02d}.png", rng.integers(0, 96, (8, 8, 3)) + 80 * (i % 3))
    root = str(tmp_path)
    memory = data.load_dataset(f"folder:{root}")
    streamed = data.load_dataset(f"folder:{root}", max_in_memory_mb=0)
    encoder = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Flatten(), keras.layers.Dense(16, name="f")])
    preprocess = lambda x: np.asarray(x, np.float32) / 255.0  # noqa: E731
    arrays = [data.as_numpy(memory, s) for s in ("train", "test")]
    batches = [data.eval_dataset(streamed, s, 7) for s in ("train", "test")]
    want = knn_eval(encoder, preprocess, *arrays, 3, k=5)
    assert knn_eval(encoder, preprocess, *batches, 3, k=5) == pytest.approx(want)
    want = raw_pixel_knn(*arrays, 3, k=5)
    assert raw_pixel_knn(*batches, 3, k=5) == pytest.approx(want)
    assert want["memory_bank"] == 54
    capped = raw_pixel_knn(*batches, 3, k=5, max_bank_mb=10 * 8 * 8 * 3 * 4 / 2 ** 20)
    assert capped["memory_bank"] == 10


# --- tfrecord: and the tool that writes it ------------------------------------------------------


def test_folder_to_tfrecord_round_trip(tmp_path):
    """The tool writes a folder's splits as shards + JSON; ``tfrecord:`` reads back the same images
    and labels, with the JSON's counts and classes, or counts them itself without the JSON."""
    root = make_class_folder(tmp_path / "pets", per_class=20)
    write_image(tmp_path / "pets" / "dog" / "x.jpg", coded_image(45))
    meta = folder_to_tfrecord.convert(root, str(tmp_path / "out" / "pets"), shards=3)
    assert meta["spec"] == f"tfrecord:{tmp_path}/out/pets-train-*.tfrecord,{tmp_path}/out/pets-test-*.tfrecord"
    assert meta["class_names"] == ["cat", "dog", "emu"] and meta["channels"] == 3
    assert len(meta["splits"]["train"]["files"]) == 3 and meta["splits"]["test"]["count"] == 6
    assert meta["splits"]["train"]["class_counts"] == {"cat": 18, "dog": 19, "emu": 18}
    assert json.loads((tmp_path / "out" / "pets.json").read_text()) == meta

    folder = data.load_dataset(f"folder:{root}")
    records = data.load_dataset(meta["spec"])
    assert (records.name, records.class_names, records.num_classes) == ("pets", ("cat", "dog", "emu"), 3)
    assert (records.num_train, records.num_test, records.image_shape) == (55, 6, (8, 8, 3))
    assert both_splits(records) == both_splits(folder)  # the same images and labels, as written
    np.testing.assert_allclose(records.mean, folder.mean, rtol=1e-9)
    x, y = next(iter(data.pretrain_dataset(records, 8, with_labels=True, seed=1)))
    assert x.shape == (8, 8, 8, 3) and x.dtype == tf.uint8

    limited = data.load_dataset(meta["spec"], max_examples=10)
    epochs = [sorted(x.numpy()[:, 0, 0, 0].tolist()) for x in data.pretrain_dataset(limited, 10, repeat=True).take(3)]
    assert limited.num_train == 10 and epochs[0] == epochs[1] == epochs[2]  # the same 10 every epoch

    train_glob = f"{tmp_path}/out/pets-train-*.tfrecord"
    held = data.load_dataset(f"tfrecord:{train_glob}", holdout_fraction=0.25)  # hold-out by a hash of each record
    assert held.num_train + held.num_test == 55 and 0 < held.num_test < 30
    assert any(f"holding out 25% ({held.num_test} images" in n for n in held.notes)
    assert sum(len(y) for _, y in data.eval_dataset(held, "test", 8)) == held.num_test
    assert sorted(both_splits(held)["train"] + both_splits(held)["test"]) == both_splits(records)["train"]
    evaluated = data.load_dataset(f"tfrecord:{train_glob}", eval_spec=f"tfrecord:{tmp_path}/out/pets-test-*.tfrecord")
    assert (evaluated.num_train, evaluated.num_test) == (55, 6)

    bare = tmp_path / "bare"  # the shards without their JSON: one counting pass, labels -> classes
    bare.mkdir()
    for name in meta["splits"]["train"]["files"] + meta["splits"]["test"]["files"]:
        shutil.copy(tmp_path / "out" / name, bare / name)
    counted = data.load_dataset(f"tfrecord:{bare}/pets-train-*,{bare}/pets-test-*")
    assert (counted.num_train, counted.num_test, counted.num_classes, counted.class_names) == (55, 6, 3, None)

    with pytest.raises(ValueError, match="--overwrite"):
        folder_to_tfrecord.convert(root, str(tmp_path / "out" / "pets"))
    with pytest.raises(DataError) as error:
        data.load_dataset(f"tfrecord:{tmp_path}/nothing-*.tfrecord")
    assert "no file matches" in one_line(error)


def test_tfrecord_bad_record_is_named(tmp_path, monkeypatch):
    """A record whose image cannot be decoded: named by its image/filename (else shard and index)
    when loading (the decoded sample) or streaming stops on it, or skipped and recorded with
    skip_bad_files."""
    from uniclr_tf.data.sources.tfrecord import encode_example

    good = io.BytesIO()
    Image.fromarray(coded_image(9)).save(good, "PNG")
    path = str(tmp_path / "x.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for i in range(4):
            writer.write(encode_example(good.getvalue(), i % 2, filename=f"img{i}.png"))
        writer.write(encode_example(good.getvalue()[:40], 1, filename="broken.png"))
        writer.write(encode_example(b"not an image", 0))
    with pytest.raises(DataError) as error:
        data.load_dataset(f"tfrecord:{path},{path}")
    assert one_line(error) == "broken.png: cannot decode image (truncated or not an image)"
    monkeypatch.setattr("uniclr_tf.data.sources.tfrecord.STATS_SAMPLE", 4)  # the sample: the good ones
    info = data.load_dataset(f"tfrecord:{path},{path}")
    assert (info.num_train, info.num_test, info.num_classes) == (6, 6, 2)
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        list(data.eval_dataset(info, "test", 8))
    assert data.bad_file_message(error.value) == "broken.png: cannot decode image (truncated or not an image)"
    info = data.load_dataset(f"tfrecord:{path},{path}", skip_bad_files=True)
    assert sum(len(y) for _, y in data.eval_dataset(info, "test", 8)) == 4
    assert info.skipped_while_streaming() == (f"{path} record 5", "broken.png")


def tfrecord_cli_runs(tmp_path):
    """folder_to_tfrecord's CLI on a folder, then the train CLI on its output (if it worked)."""
    root = make_class_folder(tmp_path / "pets", per_class=20, size=(16, 16))
    tool = warm.run([sys.executable, "-m", "uniclr_tf.tools.folder_to_tfrecord", f"--folder={root}",
                     f"--out={tmp_path}/records/pets", "--shards=2"], cwd=REPO_ROOT, env=CLI_ENV,
                    capture_output=True, text=True, timeout=300)
    if tool.returncode != 0:
        return tool, None
    spec = tool.stdout.strip().splitlines()[-1].split("--dataset=")[1]
    return tool, warm.run([sys.executable, "-m", "uniclr_tf.train", f"--dataset={spec}", *TINY, "--knn_every=0",
                           "--nopictures", f"--run_dir={tmp_path}/runs", "--run_name=tfr"], cwd=REPO_ROOT,
                          env=CLI_ENV, capture_output=True, text=True, timeout=600)


def streamed_cli_run(tmp_path):
    train = make_class_folder(tmp_path / "train", per_class=20, size=(16, 16))
    test = make_class_folder(tmp_path / "test", per_class=4, size=(16, 16))
    return warm.run([sys.executable, "-m", "uniclr_tf.train", f"--dataset=folder:{train}",
                     f"--eval_dataset=folder:{test}", "--max_in_memory_mb=0", *TINY, "--knn_every=1",
                     f"--run_dir={tmp_path}/runs", "--run_name=streamed"], cwd=REPO_ROOT, env=CLI_ENV,
                    capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory):
    """The two train CLI tests' subprocesses, at the same time (each mostly one core): ``(folder,
    future)`` by name (36 s -> 20 s on the 2-core machine)."""
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        jobs = {}
        for name, task in (("tfrecords", tfrecord_cli_runs), ("streamed", streamed_cli_run)):
            folder = tmp_path_factory.mktemp(name)
            jobs[name] = folder, pool.submit(task, folder)
        yield jobs
        for _, future in jobs.values():
            future.cancel()


def test_train_cli_on_tfrecords_end_to_end(cli_runs):
    """folder -> folder_to_tfrecord (its CLI) -> ``python -m uniclr_tf.train --dataset=tfrecord:...``."""
    tmp_path, runs = cli_runs["tfrecords"]
    tool, proc = runs.result()
    assert tool.returncode == 0, tool.stderr[-3000:]
    spec = tool.stdout.strip().splitlines()[-1].split("--dataset=")[1]
    assert spec == f"tfrecord:{tmp_path}/records/pets-train-*.tfrecord,{tmp_path}/records/pets-test-*.tfrecord"
    assert proc.returncode == 0, proc.stderr[-4000:]
    metrics = json.loads((tmp_path / "runs" / "tfr" / "metrics.json").read_text())
    assert metrics["status"] == "finished" and metrics["steps"] == 2
    assert 0.0 < metrics["knn_top1"] <= 1.0 and (metrics["knn_memory_bank"], metrics["knn_test"]) == (54, 6)
    dataset = json.loads((tmp_path / "runs" / "tfr" / "dataset.json").read_text())
    assert dataset["streamed"] and dataset["num_classes"] == 3 and dataset["image_shape"] == [16, 16, 3]


def test_train_cli_streams_a_folder_with_eval_dataset(cli_runs):
    """``folder:TRAIN --eval_dataset=folder:TEST``, streamed: the notes at start, the kNN monitor,
    the final kNN and the pictures read the streams."""
    tmp_path, proc = cli_runs["streamed"]
    proc = proc.result()
    train, test = tmp_path / "train", tmp_path / "test"
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"folder:{train}: 60 images, 0 MB decoded > 0 MB (max_in_memory_mb): streamed" in proc.stdout
    assert f"folder:{train}: test split from folder:{test} (12 images)" in proc.stdout
    assert "epoch 1: kNN top-1" in proc.stdout and "pictures: " in proc.stdout
    run = tmp_path / "runs" / "streamed"
    metrics = json.loads((run / "metrics.json").read_text())
    assert (metrics["knn_memory_bank"], metrics["knn_test"]) == (60, 12)
    assert all((run / name).exists() for name in ("views.png", "neighbours.png", "embedding.png"))
    assert "--eval_dataset=folder:" in (run / "flags.txt").read_text()


# --- memory ------------------------------------------------------------------------------------


def write_png_folder(root, count, size=64, classes=10):
    """``count`` RGB PNGs of ``size`` px in ``classes`` class folders (64 distinct images, written as bytes)."""
    blobs = []
    for i in range(64):
        ramp = (np.add.outer(np.arange(size), np.arange(size)) * (i + 1) % 256).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(np.stack([ramp, ramp[::-1], ramp.T], -1)).save(buffer, "PNG", compress_level=1)
        blobs.append(buffer.getvalue())
    for c in range(classes):
        os.makedirs(os.path.join(root, f"c{c}"), exist_ok=True)
    for i in range(count):
        with open(os.path.join(root, f"c{i % classes}", f"{i:05d}.png"), "wb") as f:
            f.write(blobs[i % len(blobs)])


def peak_rss_mb(args, cwd):
    """Runs ``python args`` and returns ``(peak RSS in MiB of that child alone, stdout)``."""
    # TensorFlow's default kernels (oneDNN), as users run it: without them (the tests' setting) the 20k
    # run's peak was 113 MiB above the 2k run's (1017 -> 1130 MiB), with them 24-30 (895 -> 919)
    env = {**CLI_ENV, "TF_ENABLE_ONEDNN_OPTS": "1"}
    proc = subprocess.Popen([sys.executable, *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0, out[-4000:]
    return usage.ru_maxrss / 1024, out  # KiB on Linux


MARGIN_MB = 60


@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss of one child (os.wait4) in KiB: Linux")
def test_peak_memory_flat_from_2k_to_20k_images(tmp_path):
    """The same short run (a few steps, the final kNN on a 512-image bank and the whole test
    split) on a streamed folder of 2k and of 20k 64x64 RGB PNGs: the 20k run's peak RSS is within
    MARGIN_MB of the 2k run's, while the 20k images decoded in memory would take ~4x that margin."""
    runs = {}
    for count in (2000, 20000):
        root = tmp_path / f"f{count}"
        write_png_folder(str(root), count)
        runs[count] = peak_rss_mb(["-m", "uniclr_tf.train", f"--dataset=folder:{root}", "--max_in_memory_mb=0", *TINY,
                                   "--knn_every=0", "--knn_max_train=512", "--nopictures", f"--run_dir={tmp_path}/runs",
                                   f"--run_name=f{count}", "--verbose=2"], REPO_ROOT)
    (small, _), (large, out) = runs[2000], runs[20000]
    assert "no test split; holding out 10% (2000 images) per class as test" in out
    assert "20000 images, 234 MB decoded > 0 MB (max_in_memory_mb): streamed from disk" in out
    in_memory_mb = 20000 * 64 * 64 * 3 / 2 ** 20
    assert in_memory_mb > 3 * MARGIN_MB  # so the comparison below can fail
    print(f"peak RSS: 2k images {small:.0f} MiB, 20k images {large:.0f} MiB; 20k decoded: {in_memory_mb:.0f} MiB")
    assert large - small < MARGIN_MB, (small, large)
