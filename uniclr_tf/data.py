"""Datasets and the tf.data input pipelines.

``load_dataset(spec)`` turns a dataset spec into a :class:`DatasetInfo` (shapes, classes,
per-channel statistics and the splits); ``pretrain_dataset``, ``eval_dataset`` and ``as_numpy``
read the splits. Three spec forms are understood:

* ``fashion_mnist`` (the default): Keras' copy of Fashion-MNIST, loaded offline from
  ``~/.keras/datasets/fashion-mnist`` (or from ``data_dir``), held in memory.
* ``tfds:NAME[:SPLIT]``: any TensorFlow Datasets image dataset (``tfds:cifar10``,
  ``tfds:imagenette/160px:train[:10%]``, ``tfds:cifar10:3.0.2``), streamed from its TFRecords.
* ``folder:PATH``: image files, in class sub-folders or flat (unlabelled); decoded and checked
  once, eagerly, then held in memory.

Every element is a uint8 image ``[H, W, C]`` (``C`` in {1, 3}) with an int64 label (``-1`` when
unlabelled). Bad data stops at load time with a one-line :class:`DataError` naming the culprit,
never deep inside a running tf.data pipeline.

The pipelines are tf.data (whatever the Keras backend) but no ``keras.ops``: they run unchanged
under ``KERAS_BACKEND=jax``, whose ``fit`` converts the tf tensors. TensorFlow itself is imported on
first use, so in-memory data (``fashion_mnist`` at its own size) also loads where TensorFlow is not
installed (the JAX-only GPU machine), and :func:`numpy_batches` feeds it without tf.data.
``tensorflow_datasets`` is imported only when a ``tfds:`` spec is used.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import os
import re
import types
from typing import Callable, Mapping, Optional, Sequence, Tuple, Union

import importlib.util

import numpy as np
from absl import logging


class _LazyTensorFlow:
    """``tensorflow``, imported on first attribute access."""

    def __getattr__(self, name):
        import tensorflow

        return getattr(tensorflow, name)


tf = _LazyTensorFlow()
AUTOTUNE = -1  # tf.data.AUTOTUNE


def have_tensorflow() -> bool:
    """Whether TensorFlow is installed (tf.data pipelines need it; in-memory arrays do not)."""
    try:
        return importlib.util.find_spec("tensorflow") is not None
    except ImportError:
        return False

#: File name endings (lower case) that ``folder:`` specs read; other files are ignored.
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")

#: The spec forms, for error messages and ``--help`` strings.
SPEC_FORMS = ("fashion_mnist", "tfds:NAME[:SPLIT]", "folder:PATH")

FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                         "Sneaker", "Bag", "Ankle boot")
# Per-pixel mean and standard deviation of the 60,000 training images, in [0, 1] units.
FASHION_MNIST_MEAN = (0.2860406,)
FASHION_MNIST_STD = (0.3530242,)
_FASHION_MNIST_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                        "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")

_STATS_SAMPLE = 10_000       # images used for the per-channel mean / std of in-memory data
_TFDS_STATS_SAMPLE = 2_000   # ... and of streamed (tfds) data, which must be read to be measured
_TFDS_SHUFFLE_BUFFER = 10_000
_HOLDOUT_FRACTION = 0.1
_TEST_DIR_NAMES = ("test", "val", "validation")


class DataError(ValueError):
    """Bad or missing data; the message is one line naming the culprit (a path or a dataset)."""


class ImageDecodeError(ValueError):
    """:func:`decode_image` cannot use these bytes; the message is one line (no path)."""


class _BadImage(Exception):
    """Internal: one image file cannot be used; ``args[0]`` is the reason."""


@dataclasses.dataclass(frozen=True, eq=False)
class Split:
    """One split of a dataset: either in memory (``images``/``labels``) or streamed (``dataset``).

    Attributes:
      name: ``"train"`` or ``"test"``.
      num_examples: number of examples (after ``max_examples`` and skipped files).
      images: uint8 ``[N, H, W, C]`` (read-only) for in-memory splits, else None.
      labels: int64 ``[N]`` (``-1`` when unlabelled, read-only) for in-memory splits, else None.
      dataset: unbatched ``tf.data.Dataset`` of ``(image uint8 [H, W, C], label int64)`` for
        streamed splits, else None.
    """

    name: str
    num_examples: int
    images: Optional[np.ndarray] = dataclasses.field(default=None, repr=False)
    labels: Optional[np.ndarray] = dataclasses.field(default=None, repr=False)
    dataset: Optional[tf.data.Dataset] = dataclasses.field(default=None, repr=False)

    @property
    def in_memory(self) -> bool:
        """True when the split is held as NumPy arrays."""
        return self.images is not None


@dataclasses.dataclass(frozen=True, eq=False)
class DatasetInfo:
    """What ``load_dataset`` found: the shapes, classes and statistics, and the splits.

    Attributes:
      name: short name (``fashion_mnist``, the TFDS name, or the folder's base name).
      image_shape: ``(H, W, C)`` of every image after resizing, ``C`` in {1, 3}.
      num_classes: number of classes, or None when the data is unlabelled.
      num_train: examples in the train split.
      num_test: examples in the test split (may be 0).
      mean: per-channel mean in [0, 1] units (length ``C``).
      std: per-channel standard deviation in [0, 1] units (length ``C``).
      splits: ``{"train": Split, "test": Split}``.
      spec: the spec string that was loaded.
      class_names: class names in label order, or None.
      num_skipped: bad files skipped (``folder:`` with ``skip_bad_files=True``), else 0.
    """

    name: str
    image_shape: Tuple[int, int, int]
    num_classes: Optional[int]
    num_train: int
    num_test: int
    mean: Tuple[float, ...]
    std: Tuple[float, ...]
    splits: Mapping[str, Split] = dataclasses.field(repr=False)
    spec: str = ""
    class_names: Optional[Tuple[str, ...]] = None
    num_skipped: int = 0

    def split(self, name: str) -> Split:
        """Returns the split called ``name``; a DataError lists the splits there are."""
        if name not in self.splits:
            raise DataError(f"{self.spec or self.name}: no split {name!r}; splits: {sorted(self.splits)}")
        return self.splits[name]


# ---------------------------------------------------------------------------------------------
# load_dataset


def load_dataset(spec: str = "fashion_mnist", image_size: Union[int, Sequence[int], None] = None,
                 data_dir: Optional[str] = None, skip_bad_files: bool = False,
                 max_examples: Optional[int] = None) -> DatasetInfo:
    """Loads (and checks) the dataset named by ``spec``.

    Args:
      spec: ``fashion_mnist``, ``tfds:NAME[:SPLIT]`` or ``folder:PATH`` (see the module docstring).
      image_size: ``S`` or ``(H, W)``; images are resized to it (bilinear, antialiased). Required
        for datasets whose images vary in size; None keeps the native size.
      data_dir: for ``tfds:``, the TFDS data directory; for ``fashion_mnist``, a folder holding the
        four ``*-ubyte.gz`` files (default: Keras' cache, ``~/.keras/datasets/fashion-mnist``).
      skip_bad_files: ``folder:`` only: skip (and count, in ``num_skipped``) undecodable or
        mis-sized files instead of raising.
      max_examples: keep at most this many examples in EACH split (a deterministic subset).

    Returns:
      A :class:`DatasetInfo`.

    Raises:
      ValueError: unknown spec form or bad arguments.
      DataError: missing, unknown or bad data (one line naming the file or dataset).
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"dataset spec must be a non-empty string; received {spec!r}. "
                         f"Valid forms: {', '.join(SPEC_FORMS)}")
    spec = spec.strip()
    size = _normalize_image_size(image_size)
    if max_examples is not None and (int(max_examples) != max_examples or max_examples < 1):
        raise ValueError(f"max_examples must be a positive integer or None; received {max_examples!r}")
    max_examples = int(max_examples) if max_examples is not None else None
    if spec in ("fashion_mnist", "fashion-mnist"):
        info = _load_fashion_mnist(size, data_dir, max_examples)
    elif spec.startswith("tfds:"):
        info = _load_tfds(spec, size, data_dir, max_examples)
    elif spec.startswith("folder:"):
        info = _load_folder(spec, size, skip_bad_files, max_examples)
    else:
        hint = f" (it is a folder: did you mean 'folder:{spec}'?)" if os.path.isdir(spec) else ""
        raise ValueError(f"unknown dataset spec {spec!r}{hint}; valid forms: {', '.join(SPEC_FORMS)}")
    logging.info("dataset %s: train %d, test %d, image %s, classes %s, mean %s, std %s", info.spec,
                 info.num_train, info.num_test, info.image_shape, info.num_classes,
                 _fmt(info.mean), _fmt(info.std))
    return info


def _fmt(values):
    return "(" + ", ".join(f"{v:.4f}" for v in values) + ")"


def _normalize_image_size(image_size):
    """``None``, ``S`` or ``(H, W)`` -> ``None`` or ``(H, W)`` of positive ints."""
    if image_size is None:
        return None
    if isinstance(image_size, (int, np.integer)):
        size = (int(image_size), int(image_size))
    else:
        try:
            size = tuple(int(s) for s in image_size)
        except (TypeError, ValueError):
            size = ()
    if len(size) != 2 or min(size) < 1:
        raise ValueError(f"image_size must be a positive int or (height, width); received {image_size!r}")
    return size


def _make_info(*, name, spec, train, test, num_classes, class_names=None, mean, std,
               num_skipped=0, image_shape=None):
    if image_shape is None:
        image_shape = tuple(int(d) for d in train.images.shape[1:])
    return DatasetInfo(name=name, image_shape=tuple(image_shape), num_classes=num_classes,
                       num_train=train.num_examples, num_test=test.num_examples,
                       mean=tuple(float(m) for m in mean), std=tuple(float(s) for s in std),
                       splits=types.MappingProxyType({"train": train, "test": test}), spec=spec,
                       class_names=class_names, num_skipped=num_skipped)


def _memory_split(name, images, labels):
    images = np.ascontiguousarray(images, dtype=np.uint8)
    labels = np.ascontiguousarray(labels, dtype=np.int64).reshape(-1)
    images.setflags(write=False)
    labels.setflags(write=False)
    return Split(name=name, num_examples=len(images), images=images, labels=labels)


# --- resizing and statistics (host side) ------------------------------------------------------


def _resize_uint8(images, size):
    """Resizes uint8 ``[H, W, C]`` or ``[N, H, W, C]`` (tf tensor or array) to ``size``; uint8 out."""
    out = tf.image.resize(tf.cast(images, tf.float32), size, method="bilinear", antialias=True)
    return tf.cast(tf.clip_by_value(tf.round(out), 0.0, 255.0), tf.uint8)


def _resize_array(images, size, chunk=4096):
    """Resizes an in-memory uint8 batch ``[N, H, W, C]`` in chunks; a no-op at the same size."""
    if size is None or tuple(images.shape[1:3]) == tuple(size):
        return images
    parts = [_resize_uint8(images[i:i + chunk], size).numpy() for i in range(0, len(images), chunk)]
    return np.concatenate(parts) if parts else np.zeros((0, *size, images.shape[-1]), np.uint8)


def _channel_stats(batches, channels):
    """Per-channel mean and std (in [0, 1] units) over an iterable of uint8 ``[n, H, W, C]``."""
    total = np.zeros(channels, np.float64)
    total_sq = np.zeros(channels, np.float64)
    count = 0
    for batch in batches:
        x = np.asarray(batch, np.float64).reshape(-1, channels) / 255.0
        total += x.sum(0)
        total_sq += np.square(x).sum(0)
        count += len(x)
    if count == 0:
        return (0.5,) * channels, (0.5,) * channels
    mean = total / count
    std = np.sqrt(np.maximum(total_sq / count - np.square(mean), 0.0))
    # A constant channel would divide by zero when normalising; floor at one grey level.
    return tuple(mean), tuple(np.maximum(std, 1.0 / 255.0))


def _array_stats(images):
    """Statistics of a strided sample of at most ``_STATS_SAMPLE`` in-memory images."""
    stride = max(1, len(images) // _STATS_SAMPLE)
    sample = images[::stride][:_STATS_SAMPLE]
    return _channel_stats((sample[i:i + 256] for i in range(0, len(sample), 256)), images.shape[-1])


# --- fashion_mnist ----------------------------------------------------------------------------


def _keras_cache_dir():
    """Where ``keras.datasets.fashion_mnist.load_data()`` looks (mirrors keras' ``get_file``)."""
    if "KERAS_HOME" in os.environ:
        home = os.environ["KERAS_HOME"]
    else:
        base = os.path.expanduser("~")
        home = os.path.join(base if os.access(base, os.W_OK) else "/tmp", ".keras")
    home = os.path.expanduser(home)
    if not os.access(home, os.W_OK):
        home = os.path.join("/tmp", ".keras")
    return os.path.join(home, "datasets", "fashion-mnist")


def _fashion_mnist_missing_error(folder, missing):
    return DataError(
        f"fashion_mnist: {', '.join(missing)} not found in {folder}; get them offline with "
        f"'apt-get install dataset-fashion-mnist' and 'mkdir -p {folder} && cp "
        f"/usr/share/datasets/fashion-mnist/*.gz {folder}/' (or run 'make data')")


def _read_idx_gz(path, offset):
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)


def _load_fashion_mnist(size, data_dir, max_examples):
    """Fashion-MNIST through keras (offline from its cache), or from ``data_dir``'s gz files."""
    folder = os.path.expanduser(data_dir) if data_dir else _keras_cache_dir()
    missing = [f for f in _FASHION_MNIST_FILES if not os.path.isfile(os.path.join(folder, f))]
    if missing:
        raise _fashion_mnist_missing_error(folder, missing)
    try:
        if data_dir:
            path = lambda f: os.path.join(folder, f)  # noqa: E731
            y_train = _read_idx_gz(path(_FASHION_MNIST_FILES[1]), 8)
            x_train = _read_idx_gz(path(_FASHION_MNIST_FILES[0]), 16).reshape(len(y_train), 28, 28)
            y_test = _read_idx_gz(path(_FASHION_MNIST_FILES[3]), 8)
            x_test = _read_idx_gz(path(_FASHION_MNIST_FILES[2]), 16).reshape(len(y_test), 28, 28)
        else:
            import keras  # the keras loader: offline because the files are in its cache

            (x_train, y_train), (x_test, y_test) = keras.datasets.fashion_mnist.load_data()
    except (OSError, EOFError, ValueError) as e:
        raise DataError(f"fashion_mnist: cannot read the files in {folder} ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''}); delete them and copy them again") from e
    if max_examples:
        x_train, y_train = x_train[:max_examples], y_train[:max_examples]
        x_test, y_test = x_test[:max_examples], y_test[:max_examples]
    x_train = _resize_array(x_train[..., None], size)
    x_test = _resize_array(x_test[..., None], size)
    if size is None:
        mean, std = FASHION_MNIST_MEAN, FASHION_MNIST_STD
    else:  # resampling changes the statistics slightly: measure them
        mean, std = _array_stats(x_train)
    return _make_info(name="fashion_mnist", spec="fashion_mnist",
                      train=_memory_split("train", x_train, y_train),
                      test=_memory_split("test", x_test, y_test),
                      num_classes=10, class_names=FASHION_MNIST_CLASSES, mean=mean, std=std)


# --- tfds:NAME[:SPLIT] ------------------------------------------------------------------------

_VERSION_RE = re.compile(r"^(\d+\.\d+\.\d+|\d+\.\d+\.\*|\d+\.\*\.\*)(?::(.*))?$")


def _parse_tfds_spec(spec):
    """``tfds:NAME[:VERSION][:SPLIT]`` -> ``(name, split or None)``; the version stays on the name."""
    rest = spec[len("tfds:"):]
    name, _, split = rest.partition(":")
    match = _VERSION_RE.match(split)
    if split and match:
        name, split = f"{name}:{match.group(1)}", match.group(2) or ""
    if not name:
        raise ValueError(f"dataset spec {spec!r} names no TFDS dataset; expected tfds:NAME[:SPLIT], "
                         "e.g. tfds:cifar10 or tfds:imagenette/160px:train")
    return name, split or None


def _first_line(error):
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _load_tfds(spec, size, data_dir, max_examples):
    """A TFDS image dataset, streamed; the test split is 'test', else 'validation', else held out."""
    import tensorflow_datasets as tfds  # lazy: importing it costs time and most runs don't need it

    name, split = _parse_tfds_spec(spec)
    where = f"tfds:{name}"
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError as e:
        raise DataError(f"{where}: unknown TFDS dataset (catalog: https://www.tensorflow.org/datasets/catalog)") from e
    except Exception as e:  # bad version, bad config, ...
        raise DataError(f"{where}: cannot build the TFDS dataset: {_first_line(e)}") from e

    features = builder.info.features
    if "image" not in features.keys():
        raise DataError(f"{where}: has no 'image' feature; features: {sorted(features.keys())}")
    image_feature = features["image"]
    shape = tuple(image_feature.shape)
    dtype = tf.as_dtype(getattr(image_feature, "np_dtype", None) or image_feature.dtype)
    if dtype != tf.uint8:
        raise DataError(f"{where}: 'image' is {dtype.name}; expected uint8")
    if len(shape) != 3:
        raise DataError(f"{where}: 'image' has shape {shape}; expected (height, width, channels)")
    channels = shape[2]
    if channels not in (1, 2, 3, 4):
        raise DataError(f"{where}: 'image' has {channels} channels; expected 1 or 3 (or 2 / 4 with alpha)")
    out_channels = 1 if channels in (1, 2) else 3
    if size is None and (shape[0] is None or shape[1] is None):
        raise DataError(f"{where}: images vary in size (feature shape {shape}); pass image_size "
                        "(--image_size) to resize them")
    out_size = size or (shape[0], shape[1])

    label_feature = features["label"] if "label" in features.keys() else None
    if label_feature is not None and isinstance(label_feature, tfds.features.ClassLabel):
        num_classes, class_names = label_feature.num_classes, tuple(label_feature.names)
    else:
        if label_feature is not None:
            logging.warning("%s: 'label' is not a ClassLabel; treating the data as unlabelled", where)
        label_feature, num_classes, class_names = None, None, None

    try:
        builder.download_and_prepare()
    except Exception as e:
        raise DataError(f"{where}: download/prepare failed: {_first_line(e)}") from e

    known = set(builder.info.splits.keys())  # empty when TFDS is mocked (tfds.testing.mock_data)
    train_split = split or "train"
    base = re.split(r"[\[+]", train_split)[0]
    if known and base not in known:
        raise DataError(f"{where}: no split {base!r}; splits: {sorted(known)}")
    test_split = None
    if not known or "test" in known:
        test_split = "test"
    elif "validation" in known:
        test_split = "validation"
    elif re.fullmatch(r"[\w-]+", train_split):
        test_split = f"{train_split}[{100 - int(100 * _HOLDOUT_FRACTION)}%:]"
        train_split = f"{train_split}[:{100 - int(100 * _HOLDOUT_FRACTION)}%]"
        logging.warning("%s: no test or validation split; holding out %s for test", where, test_split)
    else:
        logging.warning("%s: no test or validation split; the test split is empty", where)

    def to_pair(example):
        image = example["image"]
        if channels in (2, 4):
            image = image[..., :out_channels]  # drop alpha
        if size is not None and tuple(shape[:2]) != tuple(size):
            image = _resize_uint8(image, size)
        image = tf.ensure_shape(image, (*out_size, out_channels))
        label = (tf.cast(example["label"], tf.int64) if label_feature is not None
                 else tf.constant(-1, tf.int64))
        return image, label

    def make_split(kind, tfds_split):
        if tfds_split is None:
            empty = tf.data.Dataset.from_tensor_slices(
                (np.zeros((0, *out_size, out_channels), np.uint8), np.zeros((0,), np.int64)))
            return Split(name=kind, num_examples=0, dataset=empty)
        try:
            ds = builder.as_dataset(split=tfds_split, shuffle_files=False)
        except Exception as e:
            raise DataError(f"{where}: cannot read split {tfds_split!r}: {_first_line(e)}") from e
        count = int(ds.cardinality().numpy())
        if count < 0:
            try:
                count = int(builder.info.splits[tfds_split].num_examples)
            except Exception:  # noqa: BLE001 - unknown: count once
                count = int(ds.reduce(np.int64(0), lambda n, _: n + 1).numpy())
        if max_examples:
            ds, count = ds.take(max_examples), min(count, max_examples)
        ds = ds.map(to_pair, num_parallel_calls=AUTOTUNE)
        return Split(name=kind, num_examples=count, dataset=ds)

    train = make_split("train", train_split)
    test = make_split("test", test_split)
    if train.num_examples == 0:
        raise DataError(f"{where}: split {train_split!r} is empty")
    sample = train.dataset.take(_TFDS_STATS_SAMPLE).batch(256)
    mean, std = _channel_stats((x.numpy() for x, _ in sample), out_channels)
    return _make_info(name=name, spec=spec, train=train, test=test, num_classes=num_classes,
                      class_names=class_names, mean=mean, std=std,
                      image_shape=(*out_size, out_channels))


# --- folder:PATH ------------------------------------------------------------------------------


def _is_hidden(name):
    return name.startswith(".") or name.startswith("__")


def _image_files(directory):
    """Sorted image files under ``directory`` (recursive) and the count of other files ignored."""
    found, ignored = [], 0
    for root, dirs, files in os.walk(directory, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not _is_hidden(d))
        for f in sorted(files):
            if _is_hidden(f):
                continue
            if f.lower().endswith(IMAGE_EXTENSIONS):
                found.append(os.path.join(root, f))
            else:
                ignored += 1
    return found, ignored


def _list_folder(directory, class_names=None, labelled=None):
    """``(files, labels, class_names)`` of one folder: class sub-folders, or flat (label -1).

    ``class_names``/``labelled`` come from the train folder when listing its test folder, whose
    layout and classes must agree with it.
    """
    entries = sorted(e for e in os.listdir(directory) if not _is_hidden(e))
    subdirs = [e for e in entries if os.path.isdir(os.path.join(directory, e))]
    has_classes = bool(subdirs)
    if labelled is not None and entries and has_classes != labelled:
        layout = "class sub-folders" if labelled else "flat (no sub-folders)"
        raise DataError(f"{directory}: layout differs from the train folder, which is {layout}")
    files, labels, ignored = [], [], 0
    if has_classes:
        if class_names is None:
            class_names = tuple(subdirs)
        index = {c: i for i, c in enumerate(class_names)}
        for name in subdirs:
            if name not in index:
                raise DataError(f"{os.path.join(directory, name)}: class {name!r} is not among the "
                                f"train classes {list(class_names)}")
            found, skipped = _image_files(os.path.join(directory, name))
            files += found
            labels += [index[name]] * len(found)
            ignored += skipped
        loose = [e for e in entries if e not in subdirs]
        if loose:
            logging.warning("%s: ignoring %d file(s) beside the class sub-folders (e.g. %s)",
                            directory, len(loose), loose[0])
    else:
        for name in entries:
            if name.lower().endswith(IMAGE_EXTENSIONS):
                files.append(os.path.join(directory, name))
            else:
                ignored += 1
        labels = [-1] * len(files)
    if ignored:
        logging.info("%s: ignored %d file(s) without an image extension %s", directory, ignored,
                     IMAGE_EXTENSIONS)
    return files, labels, (class_names if has_classes else None)


def _hash_order(paths, root):
    """Indices of ``paths`` ordered by a hash of their relative path: a deterministic shuffle."""
    key = lambda i: hashlib.md5(os.path.relpath(paths[i], root).encode()).hexdigest()  # noqa: E731
    return sorted(range(len(paths)), key=key)


def _holdout(files, labels, root):
    """Deterministic ~10% per class for test (at least one image of a class that has two)."""
    groups = {}
    for i, label in enumerate(labels):
        groups.setdefault(label, []).append(i)
    test_idx = set()
    for label in sorted(groups):
        members = groups[label]
        n = len(members)
        k = max(1, int(round(_HOLDOUT_FRACTION * n))) if n >= 2 else 0
        order = _hash_order([files[i] for i in members], root)
        test_idx.update(members[j] for j in order[:k])
    train = [i for i in range(len(files)) if i not in test_idx]
    test = sorted(test_idx)
    return ([files[i] for i in train], [labels[i] for i in train],
            [files[i] for i in test], [labels[i] for i in test])


def _subsample(files, labels, max_examples, root):
    """A deterministic subset of at most ``max_examples`` files, kept in file order."""
    if not max_examples or len(files) <= max_examples:
        return files, labels
    keep = sorted(_hash_order(files, root)[:max_examples])
    return [files[i] for i in keep], [labels[i] for i in keep]


_UNDECODABLE = "cannot decode image (truncated or not an image)"
# The formats tf.io.decode_image reads, as Pillow names them (MPO: a camera JPEG with extra frames).
_PIL_FORMATS = ("PNG", "JPEG", "MPO", "GIF", "BMP", "WEBP")
_PIL_GREY_MODES = ("1", "L", "LA", "La", "I", "I;16", "I;16B", "I;16L", "I;16N")


def decode_image(raw: bytes, backend: Optional[str] = None) -> np.ndarray:
    """Image file bytes → uint8 ``[H, W, C]``, ``C`` in {1, 3}: THE decoding rule of ``folder:``
    datasets, shared with ``export/client.py`` so that served images get the training pixels.

    The rule is ``tf.io.decode_image(raw, channels=0, dtype=tf.uint8, expand_animations=False)``:
    native channels (grey stays 1 channel, a palette becomes RGB), the first frame of an animation,
    16-bit PNG samples reduced to their high byte (``v >> 8``: 10000 → 39, 65535 → 255; libpng's
    strip-16), then alpha dropped (grey+alpha → 1 channel, RGBA → 3).

    Args:
      raw: the file's bytes (PNG, JPEG, GIF, BMP or WebP).
      backend: ``"tensorflow"`` (the rule itself), ``"pil"`` (Pillow + NumPy, no TensorFlow: the same
        values for PNG of any bit depth and colour type, GIF, 8/24/32-bit BMP and WebP; JPEG pixels
        differ by a few levels, because TensorFlow decodes JPEG with libjpeg's fast integer IDCT and
        Pillow offers only the accurate one), or None: ``"tensorflow"`` when installed, else ``"pil"``.

    Raises:
      ImageDecodeError: one line saying why (not an image, truncated, unexpected shape).
    """
    if backend is None:
        backend = "tensorflow" if have_tensorflow() else "pil"
    if not raw:
        raise ImageDecodeError("empty file")
    if backend == "tensorflow":
        try:
            image = tf.io.decode_image(raw, channels=0, dtype=tf.uint8, expand_animations=False).numpy()
        except (tf.errors.OpError, ValueError):
            raise ImageDecodeError(_UNDECODABLE) from None
    elif backend == "pil":
        image = _decode_image_pil(raw)
    else:
        raise ValueError(f"backend must be 'tensorflow', 'pil' or None; received {backend!r}")
    if image.ndim != 3 or image.shape[-1] not in (1, 2, 3, 4):
        raise ImageDecodeError(f"unexpected decoded shape {image.shape}; expected (height, width, 1 or 3 channels)")
    if min(image.shape[:2]) < 1:
        raise ImageDecodeError(f"empty image (shape {image.shape})")
    if image.shape[-1] == 2:  # grey + alpha
        image = image[..., :1]
    elif image.shape[-1] == 4:  # RGBA
        image = image[..., :3]
    return image


def _decode_image_pil(raw):
    """``decode_image``'s rule with Pillow: uint8 ``[H, W, 1 or 3]`` (see there for what matches)."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(raw)) as im:
            if im.format not in _PIL_FORMATS:
                raise ImageDecodeError(_UNDECODABLE)
            im.load()  # the first frame; truncated data raises here
            mode = im.mode
            # PNG colour type (IHDR byte 25): 0 grey, 4 grey+alpha. Pillow opens 16-bit grey+alpha as
            # RGBA (R = G = B = the grey's high byte); TensorFlow keeps it grey.
            grey_png = im.format == "PNG" and len(raw) > 25 and raw[25] in (0, 4)
            if mode.startswith("I"):  # 16-bit grey PNG ("I;16", or "I" in older Pillow): full values
                values = np.asarray(im).astype(np.int64)
                return (np.clip(values, 0, 65535) >> 8).astype(np.uint8)[..., None]
            if im.format == "GIF":  # always RGB in TensorFlow, even with a grey palette, and
                rgba = np.asarray(im.convert("RGBA"), dtype=np.uint8)  # transparent pixels black
                return np.where(rgba[..., 3:] == 0, np.uint8(0), rgba[..., :3])
            if im.format == "BMP":
                if mode == "1":  # TensorFlow refuses 1-bit BMPs
                    raise ImageDecodeError(_UNDECODABLE)
                if mode in ("P", "L"):  # TensorFlow returns an 8-bit BMP's palette indices, one channel
                    return np.asarray(im, dtype=np.uint8)[..., None]
            if mode in _PIL_GREY_MODES:
                return np.asarray(im.convert("L"), dtype=np.uint8)[..., None]
            if grey_png:
                return np.asarray(im.getchannel(0), dtype=np.uint8)[..., None]
            if mode in ("P", "PA"):  # via RGBA: Pillow warns converting a palette with alpha to RGB
                return np.asarray(im.convert("RGBA"), dtype=np.uint8)[..., :3]
            return np.asarray(im.convert("RGB"), dtype=np.uint8)
    except ImageDecodeError:
        raise
    except (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError):
        # UnidentifiedImageError is an OSError; truncated files raise OSError or SyntaxError.
        raise ImageDecodeError(_UNDECODABLE) from None


def _decode_file(path):
    """Decodes one file with :func:`decode_image` (uint8 ``[H, W, C]``, C in {1, 3}); raises _BadImage."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise _BadImage(f"cannot read file ({e.strerror or e})")
    try:
        return decode_image(raw)
    except ImageDecodeError as e:
        raise _BadImage(e.args[0]) from None


def _decode_files(files, size, skip_bad_files, reference):
    """Decodes and checks every file; returns ``(images, kept indices, skipped paths)``.

    ``reference`` is a one-element list holding ``(path, (H, W))`` of the first good image, shared
    between the splits so that both must match it when ``size`` is None.
    """
    images, kept, skipped = [], [], []
    for i, path in enumerate(files):
        try:
            image = _decode_file(path)
            if size is not None:
                if tuple(image.shape[:2]) != tuple(size):
                    image = _resize_uint8(image, size).numpy()
            elif not reference:
                reference.append((path, tuple(image.shape[:2])))
            elif tuple(image.shape[:2]) != reference[0][1]:
                (first, (h, w)) = reference[0]
                raise _BadImage(f"image is {image.shape[0]}x{image.shape[1]} but the first image "
                                f"({first}) is {h}x{w}; pass image_size to resize")
        except _BadImage as e:
            if not skip_bad_files:
                raise DataError(f"{path}: {e.args[0]}") from None
            skipped.append(path)
            if len(skipped) <= 10:
                logging.warning("skipping %s: %s", path, e.args[0])
            continue
        images.append(image)
        kept.append(i)
        if (i + 1) % 10_000 == 0:
            logging.info("decoded %d / %d images", i + 1, len(files))
    return images, kept, skipped


def _stack(images, channels):
    """Stacks decoded images into ``[N, H, W, channels]``; grey images are repeated to RGB."""
    if not images:
        return None
    out = np.empty((len(images), *images[0].shape[:2], channels), np.uint8)
    for i, image in enumerate(images):
        out[i] = image  # broadcasts [H, W, 1] over 3 channels
    return out


def _load_folder(spec, size, skip_bad_files, max_examples):
    """Image files in class sub-folders (labels = sorted names) or flat (unlabelled, -1)."""
    path = os.path.expanduser(spec[len("folder:"):])
    if not path:
        raise ValueError(f"dataset spec {spec!r} names no folder; expected folder:PATH")
    root = os.path.abspath(path)
    if not os.path.isdir(root):
        raise DataError(f"{root}: no such folder")

    train_dir = os.path.join(root, "train")
    test_dir = next((os.path.join(root, d) for d in _TEST_DIR_NAMES
                     if os.path.isdir(os.path.join(root, d))), None)
    if os.path.isdir(train_dir) and test_dir is not None:
        train_files, train_labels, class_names = _list_folder(train_dir)
        if not train_files:
            raise DataError(f"{train_dir}: no images found under {train_dir}")
        test_files, test_labels, _ = _list_folder(test_dir, class_names, labelled=class_names is not None)
        logging.info("%s: using %s and %s as the train and test splits", root, train_dir, test_dir)
    else:
        files, labels, class_names = _list_folder(root)
        if not files:
            raise DataError(f"{root}: no images found under {root} (extensions {', '.join(IMAGE_EXTENSIONS)})")
        train_files, train_labels, test_files, test_labels = _holdout(files, labels, root)
    train_files, train_labels = _subsample(train_files, train_labels, max_examples, root)
    test_files, test_labels = _subsample(test_files, test_labels, max_examples, root)

    reference = []
    train_images, train_kept, train_skipped = _decode_files(train_files, size, skip_bad_files, reference)
    test_images, test_kept, test_skipped = _decode_files(test_files, size, skip_bad_files, reference)
    skipped = train_skipped + test_skipped
    if skipped:
        logging.warning("%s: skipped %d bad image file(s) of %d (first: %s)", root, len(skipped),
                        len(train_files) + len(test_files), skipped[0])
    if not train_images:
        raise DataError(f"{root}: no readable images found under {root} ({len(skipped)} bad file(s) skipped)")
    # Grey everywhere stays grey; any colour image makes the whole dataset RGB.
    channels = 1 if all(im.shape[-1] == 1 for im in train_images + test_images) else 3
    height, width = train_images[0].shape[:2]
    x_train = _stack(train_images, channels)
    del train_images
    x_test = _stack(test_images, channels)
    if x_test is None:
        x_test = np.zeros((0, height, width, channels), np.uint8)
        logging.warning("%s: the test split is empty", root)
    y_train = np.asarray([train_labels[i] for i in train_kept], np.int64)
    y_test = np.asarray([test_labels[i] for i in test_kept], np.int64)
    mean, std = _array_stats(x_train)
    return _make_info(name=os.path.basename(root) or root, spec=spec,
                      train=_memory_split("train", x_train, y_train),
                      test=_memory_split("test", x_test, y_test),
                      num_classes=len(class_names) if class_names else None,
                      class_names=class_names, mean=mean, std=std, num_skipped=len(skipped))


# ---------------------------------------------------------------------------------------------
# Pipelines


def _gather_fn(split, with_labels=True):
    """A tf.data map function: batch of indices -> uint8 images (and labels) of an in-memory split."""
    images = tf.constant(split.images)
    labels = tf.constant(split.labels)
    if with_labels:
        return lambda idx: (tf.gather(images, idx), tf.gather(labels, idx))
    return lambda idx: tf.gather(images, idx)


def pretrain_dataset(info: DatasetInfo, batch_size: int, augmenter: Optional[Callable] = None,
                     shuffle: bool = True, seed: int = 0, split: str = "train", repeat: bool = False,
                     with_labels: bool = False, skip_batches: int = 0) -> tf.data.Dataset:
    """Batches for self-supervised pretraining.

    Shuffles (deterministically given ``seed``), optionally repeats, batches with
    ``drop_remainder=True`` (static shapes for XLA/TPU), then maps ``augmenter`` over each uint8
    batch ``[B, H, W, C]`` (it returns a tuple of float views), and prefetches.

    Args:
      info: from :func:`load_dataset`.
      batch_size: global batch size ``B``.
      augmenter: a callable (e.g. a Keras layer built on ``self.backend``) applied to the batch
        inside tf.data; None yields the raw uint8 batch (augmentation on the device).
      shuffle: shuffle the examples (reshuffled every epoch).
      seed: shuffle seed.
      split: which split to read.
      repeat: repeat forever (batches then run across epoch boundaries).
      with_labels: yield ``(x, labels)`` (labels int64 ``[B]``, ``-1`` when unlabelled) for the
        online linear probe, instead of ``x`` alone.
      skip_batches: start this many batches into the (deterministic) stream, e.g. at a resumed run's
        step; skipped before any image is gathered or augmented, so skipping costs little.

    Returns:
      A ``tf.data.Dataset`` yielding ``x`` (tuple of views, or a uint8 batch) or ``(x, labels)``.
    """
    data = info.split(split)
    n = data.num_examples
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive; received {batch_size}")
    if n == 0 or (n < batch_size and not repeat):
        raise DataError(f"{info.spec or info.name}: split {split!r} has {n} examples, fewer than "
                        f"batch_size={batch_size}; drop_remainder would yield nothing")
    if data.in_memory:
        ds = tf.data.Dataset.range(n)
        if shuffle:
            ds = ds.shuffle(n, seed=seed, reshuffle_each_iteration=True)
        if repeat:
            ds = ds.repeat()
        ds = ds.batch(batch_size, drop_remainder=True).skip(skip_batches)
        ds = ds.map(_gather_fn(data, with_labels), num_parallel_calls=AUTOTUNE)
    else:
        ds = data.dataset
        if shuffle:
            ds = ds.shuffle(min(n, _TFDS_SHUFFLE_BUFFER), seed=seed, reshuffle_each_iteration=True)
        if repeat:
            ds = ds.repeat()
        ds = ds.batch(batch_size, drop_remainder=True).skip(skip_batches)
        if not with_labels:
            ds = ds.map(lambda x, y: x, num_parallel_calls=AUTOTUNE)
    if augmenter is not None:
        if not callable(augmenter):
            raise TypeError(f"augmenter must be callable or None; received {type(augmenter).__name__}")
        if with_labels:
            ds = ds.map(lambda x, y: (augmenter(x), y), num_parallel_calls=AUTOTUNE)
        else:
            ds = ds.map(augmenter, num_parallel_calls=AUTOTUNE)
    return ds.prefetch(AUTOTUNE)


def eval_dataset(info: DatasetInfo, split: str, batch_size: int,
                 preprocess: Optional[Callable] = None) -> tf.data.Dataset:
    """Batches of ``(images, labels)`` in file order, the last one partial (no drop_remainder).

    Args:
      info: from :func:`load_dataset`.
      split: ``"train"`` or ``"test"``.
      batch_size: batch size.
      preprocess: optional callable applied to each uint8 batch ``[b, H, W, C]`` (e.g. scale and
        normalise); None yields the uint8 images.

    Returns:
      A ``tf.data.Dataset`` of ``(images, labels int64)``.
    """
    data = info.split(split)
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive; received {batch_size}")
    if data.in_memory:
        ds = tf.data.Dataset.range(data.num_examples).batch(batch_size)
        ds = ds.map(_gather_fn(data), num_parallel_calls=AUTOTUNE)
    else:
        ds = data.dataset.batch(batch_size)
    if preprocess is not None:
        ds = ds.map(lambda x, y: (preprocess(x), y), num_parallel_calls=AUTOTUNE)
    return ds.prefetch(AUTOTUNE)


def numpy_batches(info: DatasetInfo, batch_size: int, shuffle: bool = True, seed: int = 0,
                  split: str = "train", with_labels: bool = False, skip_batches: int = 0):
    """Endless uint8 batches of an in-memory split without tf.data (for augmentation on the device).

    Same contract as :func:`pretrain_dataset` with ``augmenter=None, repeat=True``: a new permutation
    every epoch (deterministic given ``seed``), ``drop_remainder``, ``x`` or ``(x, labels)``, the
    first ``skip_batches`` batches skipped.
    """
    data = info.split(split)
    if not data.in_memory:
        raise DataError(f"{info.spec or info.name}: numpy_batches needs an in-memory split; "
                        "streamed (tfds:) data needs tf.data (pretrain_dataset)")
    n = data.num_examples
    if n < batch_size:
        raise DataError(f"{info.spec or info.name}: split {split!r} has {n} examples, fewer than "
                        f"batch_size={batch_size}")
    rng = np.random.default_rng(seed)
    count = 0
    while True:
        order = rng.permutation(n) if shuffle else np.arange(n)
        for start in range(0, n - batch_size + 1, batch_size):
            count += 1
            if count <= skip_batches:  # a resumed run: the same stream, from its step on
                continue
            idx = order[start:start + batch_size]
            x = data.images[idx]
            yield (x, data.labels[idx]) if with_labels else x


def as_numpy(info: DatasetInfo, split: str, max_examples: Optional[int] = None
             ) -> Tuple[np.ndarray, np.ndarray]:
    """``(images uint8 [N, H, W, C], labels int64 [N])`` of a split, the first ``max_examples``.

    In-memory splits return read-only views (no copy); streamed (tfds) splits are read whole, so
    keep this to small data (kNN monitors, raw-pixel baselines).
    """
    data = info.split(split)
    n = data.num_examples if max_examples is None else min(int(max_examples), data.num_examples)
    if data.in_memory:
        return data.images[:n], data.labels[:n]
    images, labels = [], []
    for x, y in data.dataset.take(n).batch(1024):
        images.append(x.numpy())
        labels.append(y.numpy())
    if not images:
        return np.zeros((0, *info.image_shape), np.uint8), np.zeros((0,), np.int64)
    return np.concatenate(images), np.concatenate(labels).astype(np.int64)
