"""Tests of uniclr_tf.data: the three spec forms, the one-line DataErrors, and the pipelines.

Folders are written with PIL into ``tmp_path``; TFDS datasets are mocked
(``tfds.testing.mock_data``), so nothing touches the network.
"""

import io
import logging
import os
import struct
import zlib

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from uniclr_tf import data
from uniclr_tf.data.sources import fashion_mnist as fashion_mnist_source
from uniclr_tf.data import DataError


# --- helpers ----------------------------------------------------------------------------------


def write_image(path, array, fmt=None):
    """Writes a uint8 ``[H, W]`` / ``[H, W, C]`` array with PIL (format from the extension)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    array = np.asarray(array, np.uint8)
    if array.ndim == 3 and array.shape[-1] == 1:
        array = array[..., 0]
    Image.fromarray(array).save(path, fmt)
    return str(path)


def coded_image(value, size=(8, 8), channels=3):
    """A constant image whose pixel value identifies it (labels can then be checked)."""
    return np.full((*size, channels), value, np.uint8)


def make_class_folder(root, classes=("cat", "dog", "emu"), per_class=10, size=(8, 8), channels=3):
    """``root/<class>/<i>.png`` with pixel value ``40 * class + i`` (decodes back to the label)."""
    for c, name in enumerate(classes):
        for i in range(per_class):
            write_image(os.path.join(root, name, f"{i:02d}.png"), coded_image(40 * c + i, size, channels))
    return str(root)


def fashion_mnist_present():
    return all(os.path.isfile(os.path.join(fashion_mnist_source._keras_cache_dir(), f)) for f in fashion_mnist_source._FASHION_MNIST_FILES)


def one_line(error):
    message = str(error.value)
    assert "\n" not in message, message
    return message


@pytest.fixture(scope="module")
def small_info(tmp_path_factory):
    """A labelled in-memory dataset: 3 classes x 10 images of 8x8x3 (27 train, 3 test)."""
    root = make_class_folder(tmp_path_factory.mktemp("classes"))
    return data.load_dataset(f"folder:{root}")


# --- fashion_mnist ----------------------------------------------------------------------------


def test_fashion_mnist_loads():
    if not fashion_mnist_present():
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but Fashion-MNIST is missing from {fashion_mnist_source._keras_cache_dir()}: run 'make data'")
        pytest.skip(f"Fashion-MNIST files not in {fashion_mnist_source._keras_cache_dir()} (apt-get install "
                    "dataset-fashion-mnist; make data)")
    info = data.load_dataset("fashion_mnist")
    assert (info.name, info.image_shape, info.num_classes) == ("fashion_mnist", (28, 28, 1), 10)
    assert (info.num_train, info.num_test, info.num_skipped) == (60000, 10000, 0)
    assert len(info.class_names) == 10
    images, labels = data.as_numpy(info, "train")
    assert images.shape == (60000, 28, 28, 1) and images.dtype == np.uint8
    assert labels.shape == (60000,) and labels.dtype == np.int64
    assert set(np.unique(labels)) == set(range(10))
    test_images, test_labels = data.as_numpy(info, "test")
    assert test_images.shape == (10000, 28, 28, 1) and test_labels.dtype == np.int64
    # The known constants are the statistics of the train split (exact, from the histogram).
    counts = np.bincount(images.ravel(), minlength=256)
    levels = np.arange(256) / 255.0
    mean = counts @ levels / counts.sum()
    std = np.sqrt(counts @ np.square(levels - mean) / counts.sum())
    np.testing.assert_allclose(info.mean, [mean], atol=1e-6)
    np.testing.assert_allclose(info.std, [std], atol=1e-6)
    with pytest.raises(ValueError):  # the shared arrays are read-only
        images[0, 0, 0, 0] = 1

    small = data.load_dataset("fashion_mnist", image_size=32, max_examples=64,
                              data_dir=fashion_mnist_source._keras_cache_dir())  # the gz reader path
    assert small.image_shape == (32, 32, 1) and (small.num_train, small.num_test) == (64, 64)
    np.testing.assert_array_equal(small.split("train").labels, labels[:64])
    assert abs(small.mean[0] - info.mean[0]) < 0.05  # measured after resizing


def test_fashion_mnist_missing_files_say_how_to_get_them(tmp_path):
    with pytest.raises(DataError) as error:
        data.load_dataset("fashion_mnist", data_dir=str(tmp_path))
    message = one_line(error)
    assert str(tmp_path) in message and "apt-get install dataset-fashion-mnist" in message
    assert "/usr/share/datasets/fashion-mnist" in message and "make data" in message


# --- tfds -------------------------------------------------------------------------------------


def test_tfds_cifar10_mocked():
    tfds = pytest.importorskip("tensorflow_datasets")
    with tfds.testing.mock_data(num_examples=12):
        info = data.load_dataset("tfds:cifar10")
        assert (info.name, info.image_shape, info.num_classes) == ("cifar10", (32, 32, 3), 10)
        assert (info.num_train, info.num_test) == (12, 12)
        assert len(info.class_names) == 10 and len(info.mean) == len(info.std) == 3
        assert all(0.0 < m < 1.0 for m in info.mean) and all(0.0 < s < 1.0 for s in info.std)
        images, labels = data.as_numpy(info, "test")
        assert images.shape == (12, 32, 32, 3) and images.dtype == np.uint8 and labels.dtype == np.int64
        assert labels.min() >= 0 and labels.max() < 10

        ds = data.pretrain_dataset(info, 5, seed=1, with_labels=True)
        batches = list(ds)
        assert len(batches) == 2  # 12 // 5, remainder dropped
        assert ds.element_spec[0].shape.as_list() == [5, 32, 32, 3]
        assert ds.element_spec[1].shape.as_list() == [5]
        again = [x.numpy() for x, _ in data.pretrain_dataset(info, 5, seed=1, with_labels=True)]
        np.testing.assert_array_equal(np.stack([x.numpy() for x, _ in batches]), np.stack(again))

        evals = [(x.numpy(), y.numpy()) for x, y in data.eval_dataset(info, "test", 5)]
        assert [len(y) for _, y in evals] == [5, 5, 2]
        np.testing.assert_array_equal(np.concatenate([x for x, _ in evals]), images)

        limited = data.load_dataset("tfds:cifar10", max_examples=5, image_size=16)
        assert (limited.num_train, limited.num_test, limited.image_shape) == (5, 5, (16, 16, 3))
        assert data.as_numpy(limited, "train")[0].shape == (5, 16, 16, 3)


def test_tfds_split_suffix_and_version():
    tfds = pytest.importorskip("tensorflow_datasets")
    assert data.spec._parse_tfds_spec("tfds:cifar10") == ("cifar10", None)
    assert data.spec._parse_tfds_spec("tfds:cifar10:train[:10%]") == ("cifar10", "train[:10%]")
    assert data.spec._parse_tfds_spec("tfds:cifar10:3.0.2") == ("cifar10:3.0.2", None)
    assert data.spec._parse_tfds_spec("tfds:cifar10:3.0.2:test") == ("cifar10:3.0.2", "test")
    assert data.spec._parse_tfds_spec("tfds:imagenette/160px:train") == ("imagenette/160px", "train")
    with tfds.testing.mock_data(num_examples=6):
        info = data.load_dataset("tfds:cifar10:train[:50%]")
        assert info.spec == "tfds:cifar10:train[:50%]" and info.num_train == 6  # the mock ignores slices
        assert info.num_test == 6
        assert data.load_dataset("tfds:cifar10:3.0.2:test").num_train == 6


def test_tfds_varying_sizes_need_image_size():
    tfds = pytest.importorskip("tensorflow_datasets")
    with tfds.testing.mock_data(num_examples=6):
        with pytest.raises(DataError) as error:
            data.load_dataset("tfds:imagenette/160px")
        assert "imagenette/160px" in one_line(error) and "image_size" in str(error.value)
        info = data.load_dataset("tfds:imagenette/160px", image_size=(12, 20))
        assert info.image_shape == (12, 20, 3)
        x = next(iter(data.pretrain_dataset(info, 4)))
        assert x.shape == (4, 12, 20, 3) and x.dtype == tf.uint8


def test_tfds_unknown_dataset():
    pytest.importorskip("tensorflow_datasets")
    with pytest.raises(DataError) as error:
        data.load_dataset("tfds:no_such_dataset_xyz")
    assert "tfds:no_such_dataset_xyz" in one_line(error)


# --- folder -----------------------------------------------------------------------------------


def test_folder_class_subfolders(tmp_path):
    root = make_class_folder(tmp_path / "pets")
    (tmp_path / "pets" / "dog" / "notes.txt").write_text("not an image, ignored by extension")
    info = data.load_dataset(f"folder:{root}")
    assert info.name == "pets" and info.class_names == ("cat", "dog", "emu") and info.num_classes == 3
    assert info.image_shape == (8, 8, 3)
    assert (info.num_train, info.num_test) == (27, 3)  # one held out per class of 10
    for split in ("train", "test"):
        images, labels = data.as_numpy(info, split)
        np.testing.assert_array_equal(images[:, 0, 0, 0] // 40, labels)  # label = class folder
    test_labels = data.as_numpy(info, "test")[1]
    assert sorted(test_labels) == [0, 1, 2]
    again = data.load_dataset(f"folder:{root}")  # the held-out files are deterministic
    np.testing.assert_array_equal(again.split("test").images, info.split("test").images)
    expected_mean = data.as_numpy(info, "train")[0].mean() / 255.0
    np.testing.assert_allclose(info.mean, [expected_mean] * 3, rtol=1e-6)


def test_folder_flat_unlabelled(tmp_path):
    for i in range(20):
        write_image(tmp_path / f"img{i:02d}.png", coded_image(i * 10, (6, 7), 1))
    info = data.load_dataset(f"folder:{tmp_path}")
    assert info.num_classes is None and info.class_names is None
    assert (info.num_train, info.num_test, info.image_shape) == (18, 2, (6, 7, 1))
    assert set(data.as_numpy(info, "train")[1]) == {-1}
    limited = data.load_dataset(f"folder:{tmp_path}", max_examples=5)
    assert (limited.num_train, limited.num_test) == (5, 2)


def test_folder_train_test_subfolders(tmp_path):
    make_class_folder(tmp_path / "train", classes=("a", "b"), per_class=4)
    make_class_folder(tmp_path / "test", classes=("a", "b"), per_class=2)
    make_class_folder(tmp_path / "val", classes=("a", "b"), per_class=3)  # "test" wins
    info = data.load_dataset(f"folder:{tmp_path}")
    assert info.class_names == ("a", "b")  # not train / test / val
    assert (info.num_train, info.num_test) == (8, 4)
    np.testing.assert_array_equal(data.as_numpy(info, "test")[1], [0, 0, 1, 1])

    make_class_folder(tmp_path / "test", classes=("zebra",), per_class=1)
    with pytest.raises(DataError) as error:
        data.load_dataset(f"folder:{tmp_path}")
    assert "zebra" in one_line(error)


def test_folder_val_subfolder(tmp_path):
    make_class_folder(tmp_path / "train", classes=("a", "b"), per_class=3)
    make_class_folder(tmp_path / "val", classes=("b",), per_class=2)
    info = data.load_dataset(f"folder:{tmp_path}")
    assert (info.num_train, info.num_test) == (6, 2)
    np.testing.assert_array_equal(data.as_numpy(info, "test")[1], [1, 1])


def test_folder_mixed_grayscale_rgb_rgba(tmp_path):
    write_image(tmp_path / "c0" / "a_gray.png", coded_image(100, channels=1))  # the first image
    write_image(tmp_path / "c0" / "b_rgb.png", np.arange(8 * 8 * 3).reshape(8, 8, 3))
    write_image(tmp_path / "c1" / "c_rgba.png", coded_image(7, channels=4))
    write_image(tmp_path / "c1" / "d_gray.jpg", coded_image(50, channels=1))
    write_image(tmp_path / "c1" / "e.bmp", coded_image(60))
    write_image(tmp_path / "c1" / "f.gif", coded_image(70))
    info = data.load_dataset(f"folder:{tmp_path}", max_examples=100)
    assert info.image_shape == (8, 8, 3)
    images = np.concatenate([data.as_numpy(info, s)[0] for s in ("train", "test")])
    assert len(images) == 6
    gray = [im for im in images if np.all(im == 100)]
    assert len(gray) == 1  # grey repeated over the three channels
    assert any(np.all(im == 7) for im in images)  # RGBA: alpha dropped

    gray_only = tmp_path / "gray"
    for i in range(3):
        write_image(gray_only / f"{i}.png", coded_image(i, channels=1))
    write_image(gray_only / "la.png", np.full((8, 8, 2), 9, np.uint8))  # grey + alpha
    assert data.load_dataset(f"folder:{gray_only}").image_shape == (8, 8, 1)


def test_folder_resize_to_image_size(tmp_path):
    write_image(tmp_path / "a.png", coded_image(200, (10, 12)))
    write_image(tmp_path / "b.png", coded_image(200, (30, 5)))
    write_image(tmp_path / "c.jpg", coded_image(200, (16, 16)))
    info = data.load_dataset(f"folder:{tmp_path}", image_size=(6, 9))
    assert info.image_shape == (6, 9, 3) and info.num_train + info.num_test == 3
    images = data.as_numpy(info, "train")[0]
    assert images.shape[1:] == (6, 9, 3)
    assert np.abs(images.astype(int) - 200).max() <= 2  # a constant stays constant


def test_folder_errors_name_the_culprit(tmp_path):
    empty = tmp_path / "empty"
    (empty / "class_a").mkdir(parents=True)
    (empty / "class_a" / "readme.txt").write_text("no images here")
    with pytest.raises(DataError) as error:
        data.load_dataset(f"folder:{empty}")
    assert f"no images found under {empty}" in one_line(error)

    with pytest.raises(DataError) as error:
        data.load_dataset(f"folder:{tmp_path / 'missing'}")
    assert "missing" in one_line(error)

    good = make_class_folder(tmp_path / "truncated", classes=("a",), per_class=3)
    png = os.path.join(good, "a", "01.png")
    payload = open(png, "rb").read()
    with open(png, "wb") as f:
        f.write(payload[: len(payload) // 2])
    with pytest.raises(DataError) as error:
        data.load_dataset(f"folder:{good}")
    assert one_line(error) == f"{png}: cannot decode image (truncated or not an image)"

    fake = make_class_folder(tmp_path / "fake", classes=("a",), per_class=3)
    fake_jpg = os.path.join(fake, "a", "fake.jpg")
    with open(fake_jpg, "w") as f:
        f.write("this is text, not a JPEG")
    with pytest.raises(DataError) as error:
        data.load_dataset(f"folder:{fake}")
    assert one_line(error).startswith(f"{fake_jpg}: cannot decode image")


def test_folder_skip_bad_files_counts_them(tmp_path, caplog):
    root = make_class_folder(tmp_path, classes=("a", "b"), per_class=10)
    bad_png = os.path.join(root, "a", "03.png")
    with open(bad_png, "wb") as f:
        f.write(open(bad_png, "rb").read()[:40])
    with open(os.path.join(root, "b", "zz.gif"), "w") as f:
        f.write("not a gif")
    write_image(os.path.join(root, "b", "zz_big.png"), coded_image(1, (9, 9)))  # wrong size
    with caplog.at_level(logging.WARNING):
        info = data.load_dataset(f"folder:{root}", skip_bad_files=True)
    assert info.num_skipped == 3
    assert info.num_train + info.num_test == 19
    assert any("skipped 3 bad image file" in r.getMessage() for r in caplog.records)
    images, labels = data.as_numpy(info, "train")
    np.testing.assert_array_equal(images[:, 0, 0, 0] // 40, labels)  # labels still aligned


def test_folder_mismatched_sizes_without_image_size(tmp_path):
    write_image(tmp_path / "a.png", coded_image(1, (8, 8)))
    write_image(tmp_path / "b.png", coded_image(2, (8, 8)))
    odd = write_image(tmp_path / "c.png", coded_image(3, (8, 9)))
    with pytest.raises(DataError) as error:
        data.load_dataset(f"folder:{tmp_path}")
    message = one_line(error)
    assert message.startswith(f"{odd}: image is 8x9") and "image_size" in message
    assert data.load_dataset(f"folder:{tmp_path}", image_size=8).image_shape == (8, 8, 3)


def test_unknown_spec_lists_forms(tmp_path):
    with pytest.raises(ValueError) as error:
        data.load_dataset("imagenet_please")
    message = one_line(error)
    assert "'imagenet_please'" in message
    assert all(form in message for form in data.SPEC_FORMS)
    with pytest.raises(ValueError) as error:
        data.load_dataset(str(tmp_path))  # a bare folder gets a hint
    assert f"folder:{tmp_path}" in str(error.value)
    with pytest.raises(ValueError):
        data.load_dataset("fashion_mnist", image_size=(0, 3))


# --- decode_image: the one decoding rule (folder: datasets and export/client.py) ---------------


def png_bytes(samples, bit_depth, color_type, palette=None, trns=None):
    """A PNG written by hand (any bit depth / colour type, filter 0): ``samples`` int ``[H, W, C]``
    with C = 1 (grey, palette index), 2 (grey + alpha), 3 (RGB) or 4 (RGBA)."""
    samples = np.asarray(samples)
    if samples.ndim == 2:
        samples = samples[..., None]
    h, w, c = samples.shape
    if bit_depth == 16:
        rows = samples.astype(">u2").reshape(h, w * c).view(np.uint8)
    elif bit_depth == 8:
        rows = samples.astype(np.uint8).reshape(h, w * c)
    else:  # 1, 2, 4 bits: grey or palette, several samples per byte, most significant first
        per = 8 // bit_depth
        values = np.pad(samples[..., 0].astype(np.int64), ((0, 0), (0, (-w) % per))).reshape(h, -1, per)
        rows = (values << (8 - bit_depth * (np.arange(per) + 1))).sum(-1).astype(np.uint8)

    def chunk(kind, payload):
        return (struct.pack(">I", len(payload)) + kind + payload
                + struct.pack(">I", zlib.crc32(kind + payload) & 0xFFFFFFFF))

    out = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, bit_depth, color_type, 0, 0, 0))
    if palette is not None:
        out += chunk(b"PLTE", np.asarray(palette, np.uint8).tobytes())
    if trns is not None:
        out += chunk(b"tRNS", trns)
    raw = b"".join(b"\x00" + row.tobytes() for row in rows)
    return out + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def pil_bytes(image, fmt, **options):
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def decode_cases():
    """``{name: file bytes}``: PNG of every colour type and bit depth, GIF, BMP, WebP."""
    rng = np.random.default_rng(0)
    h, w = 5, 11  # odd width: partial bytes at 1/2/4 bits
    u16 = lambda c: rng.integers(0, 65536, (h, w, c))  # noqa: E731
    u8 = lambda c: rng.integers(0, 256, (h, w, c))  # noqa: E731
    palette = rng.integers(0, 256, (16, 3))
    rgb = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    cases = {f"png_grey_{b}bit": png_bytes(rng.integers(0, 2 ** b, (h, w, 1)), b, 0) for b in (1, 2, 4, 8, 16)}
    cases.update({f"png_palette_{b}bit": png_bytes(rng.integers(0, 2 ** b, (h, w, 1)), b, 3, palette[:2 ** b])
                  for b in (1, 2, 4, 8)})
    cases.update({
        "png_grey_alpha_8bit": png_bytes(u8(2), 8, 4),
        "png_grey_alpha_16bit": png_bytes(u16(2), 16, 4),
        "png_rgb_8bit": png_bytes(u8(3), 8, 2),
        "png_rgb_16bit": png_bytes(u16(3), 16, 2),
        "png_rgba_8bit": png_bytes(u8(4), 8, 6),
        "png_rgba_16bit": png_bytes(u16(4), 16, 6),
        "png_grey_trns": png_bytes(u8(1), 8, 0, trns=struct.pack(">H", 7)),
        "png_grey16_trns": png_bytes(u16(1), 16, 0, trns=struct.pack(">H", 1000)),
        "png_rgb_trns": png_bytes(u8(3), 8, 2, trns=struct.pack(">HHH", 1, 2, 3)),
        "png_palette_trns": png_bytes(rng.integers(0, 16, (h, w, 1)), 8, 3, palette, trns=bytes([0, 128, 255])),
        "gif": pil_bytes(Image.fromarray(rgb).quantize(30), "GIF"),
        "gif_grey": pil_bytes(Image.fromarray(rgb[..., 0]), "GIF"),
        "gif_transparent": pil_bytes(Image.fromarray(rgb).quantize(30), "GIF", transparency=2),
        "gif_animated": pil_bytes(Image.fromarray(rgb).quantize(30), "GIF", save_all=True,
                                  append_images=[Image.fromarray(rgb[::-1]).quantize(30)]),
        "bmp_rgb": pil_bytes(Image.fromarray(rgb), "BMP"),
        "bmp_rgba": pil_bytes(Image.fromarray(np.dstack([rgb, rgb[..., :1]])), "BMP"),
        "bmp_grey": pil_bytes(Image.fromarray(rgb[..., 0]), "BMP"),
        "bmp_palette": pil_bytes(Image.fromarray(rgb).quantize(16), "BMP"),
        "webp_lossy": pil_bytes(Image.fromarray(rgb), "WEBP", quality=80),
        "webp_lossless": pil_bytes(Image.fromarray(rgb), "WEBP", lossless=True),
        "webp_alpha": pil_bytes(Image.fromarray(np.dstack([rgb, rgb[..., :1]])), "WEBP", lossless=True),
    })
    return cases


DECODE_CASES = decode_cases()


def test_decode_image_16bit_png_keeps_the_high_byte(tmp_path):
    """16-bit samples become ``v >> 8`` (TensorFlow's rule, not a clip: 10000 -> 39, not 255), in
    ``decode_image`` with either backend and in a ``folder:`` dataset."""
    grey = np.array([[0, 255, 256, 10000], [32767, 32768, 65280, 65535]])
    want = (grey >> 8).astype(np.uint8)[..., None]
    assert want[0, 3, 0] == 39
    rgb = np.stack([grey, grey[::-1], 65535 - grey], axis=-1)
    for backend in ("tensorflow", "pil"):
        np.testing.assert_array_equal(data.decode_image(png_bytes(grey, 16, 0), backend), want)
        np.testing.assert_array_equal(data.decode_image(png_bytes(rgb, 16, 2), backend), rgb >> 8)
    (tmp_path / "a.png").write_bytes(png_bytes(grey, 16, 0))
    (tmp_path / "b.png").write_bytes(png_bytes(grey[::-1], 16, 0))
    info = data.load_dataset(f"folder:{tmp_path}")
    images = np.concatenate([data.as_numpy(info, s)[0] for s in ("train", "test")])
    assert info.image_shape == (2, 4, 1)
    assert any(np.array_equal(im, want) for im in images), images[..., 0]


@pytest.mark.parametrize("name", sorted(DECODE_CASES))
def test_decode_image_pil_backend_matches_tensorflow(name):
    """The TensorFlow-free backend (what ``export/client.py`` uses without TensorFlow) decodes
    every PNG, GIF, BMP and WebP variant to the same uint8 pixels as training's TensorFlow one."""
    raw = DECODE_CASES[name]
    want = data.decode_image(raw, "tensorflow")
    got = data.decode_image(raw, "pil")
    assert want.dtype == got.dtype == np.uint8 and want.shape[-1] in (1, 3)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_decode_image_jpeg_backends_differ_by_a_few_levels():
    """TensorFlow decodes JPEG with libjpeg's fast integer IDCT, Pillow with the accurate one: same
    shape and channels, pixels a few levels apart (documented in ``decode_image``)."""
    rgb = np.random.default_rng(1).integers(0, 256, (16, 24, 3), dtype=np.uint8)
    for image in (Image.fromarray(rgb), Image.fromarray(rgb[..., 0])):
        raw = pil_bytes(image, "JPEG", quality=90)
        want, got = data.decode_image(raw, "tensorflow"), data.decode_image(raw, "pil")
        assert got.shape == want.shape == (16, 24, 3 if image.mode == "RGB" else 1)
        assert np.abs(got.astype(int) - want.astype(int)).max() <= 8


def test_decode_image_errors_are_the_same_with_both_backends():
    good = DECODE_CASES["png_rgb_8bit"]
    for raw, message in ((b"", "empty file"),
                         (good[: len(good) // 2], "cannot decode image (truncated or not an image)"),
                         (b"this is text, not an image", "cannot decode image (truncated or not an image)"),
                         (pil_bytes(Image.new("RGB", (4, 4)), "TIFF"), "cannot decode image (truncated or not an image)")):
        for backend in ("tensorflow", "pil"):
            with pytest.raises(data.ImageDecodeError) as error:
                data.decode_image(raw, backend)
            assert one_line(error) == message, backend
    with pytest.raises(ValueError, match="backend"):
        data.decode_image(good, "opencv")


# --- pipelines --------------------------------------------------------------------------------


def test_pretrain_dataset_static_shapes_and_epoch(small_info):
    ds = data.pretrain_dataset(small_info, 4, seed=0)
    assert ds.element_spec.shape.as_list() == [4, 8, 8, 3] and ds.element_spec.dtype == tf.uint8
    batches = [x.numpy() for x in ds]
    assert len(batches) == 27 // 4
    ids = np.concatenate(batches)[:, 0, 0, 0]
    assert len(set(ids)) == len(ids) == 24  # without replacement within an epoch

    ordered = np.concatenate([x.numpy() for x in data.pretrain_dataset(small_info, 4, shuffle=False)])
    np.testing.assert_array_equal(ordered, data.as_numpy(small_info, "train")[0][:24])

    repeated = data.pretrain_dataset(small_info, 4, seed=0, repeat=True)
    assert len([x for x in repeated.take(20)]) == 20  # runs across epoch boundaries

    with pytest.raises(DataError):
        data.pretrain_dataset(small_info, 64)  # would yield nothing
    with pytest.raises(DataError):
        data.pretrain_dataset(small_info, 4, split="validation")


@pytest.mark.parametrize("streamed", [False, True], ids=["in_memory", "streamed"])
def test_each_pass_order_depends_on_the_seed_and_pass_alone(tmp_path, streamed):
    """An iterator of the training dataset read two passes ahead and dropped leaves the next
    iterator's batches unchanged, pass after pass (in memory, and a streamed folder). Before, every
    iterator drew its passes' seeds from one generator of the dataset's shuffle, so the training
    order moved with how far an earlier iterator had run (Keras's first build under a strategy
    read one): a 2-worker TF job trained on other batches than its 1-process twin one time in a
    few on a loaded machine."""
    root = make_class_folder(tmp_path / "classes")
    info = data.load_dataset(f"folder:{root}", max_in_memory_mb=0 if streamed else 64)
    assert info.in_memory is not streamed and info.num_train == 27
    per_pass = 27 // 3

    def passes(ds, count):  # the image ids of the first `count` passes, one row per pass
        return np.concatenate([x.numpy()[:, 0, 0, 0] for x in ds.take(count * per_pass)]).reshape(count, 27)

    want = passes(data.pretrain_dataset(info, 3, seed=5, repeat=True), 3)
    ds = data.pretrain_dataset(info, 3, seed=5, repeat=True)
    ahead = iter(ds)
    for _ in range(2 * per_pass + 1):
        next(ahead)
    del ahead
    np.testing.assert_array_equal(passes(ds, 3), want)
    # A known count of batches: for an unknown one tf.distribute rebatches to (None, ...) per replica.
    assert ds.cardinality() == tf.data.INFINITE_CARDINALITY
    if not streamed:  # (a stream's decoding may drop bad images)
        assert data.pretrain_dataset(info, 3, seed=5).cardinality() == per_pass
    assert all(sorted(row) == sorted(want[0]) and len(set(row)) == 27 for row in want)  # each pass: every image once
    assert len({tuple(row) for row in want}) == 3  # each pass its own order
    assert not np.array_equal(passes(data.pretrain_dataset(info, 3, seed=6, repeat=True), 1)[0], want[0])


def test_pretrain_dataset_maps_augmenter_on_the_batch(small_info):
    calls = []

    def two_views(x):
        calls.append(x.shape.as_list())  # traced once, on the batch
        x = tf.cast(x, tf.float32) / 255.0
        return x, tf.image.flip_left_right(x)

    ds = data.pretrain_dataset(small_info, 8, augmenter=two_views, seed=3)
    assert calls == [[8, 8, 8, 3]]
    spec = ds.element_spec
    assert isinstance(spec, tuple) and len(spec) == 2
    assert all(s.shape.as_list() == [8, 8, 8, 3] and s.dtype == tf.float32 for s in spec)
    v1, v2 = next(iter(ds))
    assert float(tf.reduce_max(v1)) <= 1.0

    import keras
    rescale = keras.layers.Rescaling(1.0 / 255.0)  # a Keras layer works as an augmenter too
    x, labels = next(iter(data.pretrain_dataset(small_info, 8, augmenter=rescale, with_labels=True)))
    assert x.dtype == tf.float32 and x.shape == (8, 8, 8, 3) and labels.shape == (8,)
    np.testing.assert_array_equal(np.round(x.numpy()[:, 0, 0, 0] * 255) // 40, labels.numpy())


def test_keyed_views_are_a_function_of_the_batch_and_resume_exactly(small_info):
    """``augment_seed``: batch i's views come from the key (seed, i) alone: the same on every iteration
    (whatever the parallel map ran first), another seed gives others, and a stream started at
    ``skip_batches=2`` yields the views of the uninterrupted stream's batches 2, 3, ... (the resume)."""
    import uniclr_tf

    aug = uniclr_tf.ViewAugmenter.for_dataset((8, 8, 3), seed=1)

    def batches(skip=0, augment_seed=11, n=3):
        ds = data.pretrain_dataset(small_info, 8, augmenter=aug, seed=3, repeat=True, with_labels=True,
                                   skip_batches=skip, augment_seed=augment_seed)
        return [(np.stack([v.numpy() for v in views]), y.numpy()) for views, y in ds.take(n)]

    whole, again = batches(n=5), batches(n=5)
    for (a, ya), (b, yb) in zip(whole, again):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(ya, yb)
    for (a, ya), (b, yb) in zip(whole[2:], batches(skip=2)):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(ya, yb)
    other = batches(augment_seed=12, n=1)[0]
    np.testing.assert_array_equal(other[1], whole[0][1])  # the same images ...
    assert not np.allclose(other[0], whole[0][0])  # ... in other views
    assert not np.allclose(whole[0][0][0], whole[0][0][1])  # the two views of a batch differ
    unkeyed = data.pretrain_dataset(small_info, 8, augmenter=aug, seed=3, with_labels=True)
    first = [np.stack([v.numpy() for v in next(iter(unkeyed))[0]]) for _ in range(2)]
    assert not np.allclose(first[0], first[1])  # without a key: the layers' streams, new views each time
    with pytest.raises(TypeError, match="batch_key"):
        data.pretrain_dataset(small_info, 8, augmenter=lambda x: (x, x), augment_seed=1)
    with pytest.raises(TypeError, match="augment_seed must be an int"):
        data.pretrain_dataset(small_info, 8, augmenter=aug, augment_seed=1.5)
    with pytest.raises(ValueError, match="batch_key must be 2 integers"):
        aug(np.zeros((2, 8, 8, 3), "uint8"), batch_key=tf.constant([1.0, 2.0]))
    with pytest.raises(ValueError, match="batch_key must be 2 integers"):
        aug(np.zeros((2, 8, 8, 3), "uint8"), batch_key=tf.constant([1, 2, 3]))


def test_pretrain_dataset_with_labels(small_info):
    ds = data.pretrain_dataset(small_info, 9, with_labels=True, seed=5)
    assert ds.element_spec[1].dtype == tf.int64 and ds.element_spec[1].shape.as_list() == [9]
    for x, y in ds:
        np.testing.assert_array_equal(x.numpy()[:, 0, 0, 0] // 40, y.numpy())


def test_pretrain_dataset_is_deterministic_given_seed(small_info):
    def first_epochs(seed, epochs=2):
        ds = data.pretrain_dataset(small_info, 9, seed=seed, repeat=True)
        return np.stack([x.numpy()[:, 0, 0, 0] for x in ds.take(3 * epochs)])

    a, b, c = first_epochs(7), first_epochs(7), first_epochs(8)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert not np.array_equal(a[:3], a[3:])  # reshuffled every epoch


def test_eval_dataset_and_as_numpy(small_info):
    images, labels = data.as_numpy(small_info, "train")
    ds = data.eval_dataset(small_info, "train", 10, preprocess=lambda x: tf.cast(x, tf.float32) / 255.0)
    batches = [(x.numpy(), y.numpy()) for x, y in ds]
    assert [len(y) for _, y in batches] == [10, 10, 7]  # no drop_remainder
    np.testing.assert_allclose(np.concatenate([x for x, _ in batches]), images / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(np.concatenate([y for _, y in batches]), labels)
    raw = next(iter(data.eval_dataset(small_info, "test", 2)))[0]
    assert raw.dtype == tf.uint8

    few_images, few_labels = data.as_numpy(small_info, "train", max_examples=5)
    assert few_images.shape == (5, 8, 8, 3) and few_labels.dtype == np.int64
    assert not few_images.flags.writeable


def test_pipelines_under_jax_backend(run_python, tmp_path):
    """Keras fit on JAX consumes the tf.data pipelines; tensorflow_datasets is imported lazily."""
    make_class_folder(tmp_path, classes=("a", "b"), per_class=8)
    result = run_python(f"""
        import json, sys
        import numpy as np
        import keras
        import tensorflow as tf
        from uniclr_tf import data
        info = data.load_dataset("folder:{tmp_path}")
        lazy = "tensorflow_datasets" not in sys.modules
        rescale = keras.layers.Rescaling(1.0 / 255.0)
        x, y = next(iter(data.pretrain_dataset(info, 4, augmenter=lambda b: (rescale(b), rescale(b)),
                                               with_labels=True)))
        model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Flatten(), keras.layers.Dense(2)])
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        ds = data.eval_dataset(info, "train", 4, preprocess=lambda b: tf.cast(b, tf.float32) / 255.0)
        history = model.fit(ds, epochs=1, verbose=0)
        print(json.dumps({{"backend": keras.backend.backend(), "lazy": lazy,
                           "views": [list(v.shape) for v in x],
                           "loss": float(history.history["loss"][-1])}}))
    """, backend="jax")
    assert result["backend"] == "jax" and result["lazy"] and result["views"] == [[4, 8, 8, 3], [4, 8, 8, 3]]
    assert np.isfinite(result["loss"])


def test_view_augmenter_in_the_pipeline(small_info):
    augment = pytest.importorskip("uniclr_tf.augment")
    augmenter = augment.ViewAugmenter.for_dataset(small_info.image_shape, mean=small_info.mean,
                                                  std=small_info.std, seed=0)
    ds = data.pretrain_dataset(small_info, 8, augmenter=augmenter, with_labels=True)
    views, labels = next(iter(ds))
    assert len(views) == 2 and labels.shape == (8,)
    for view in views:
        assert view.shape == (8, 8, 8, 3) and view.dtype == tf.float32
        assert bool(tf.reduce_all(tf.math.is_finite(view)))
