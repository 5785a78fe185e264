"""``fashion_mnist``: Keras' copy of Fashion-MNIST, loaded offline and held in memory.

Read from the four IDX ``*-ubyte.gz`` files of Keras' cache (``~/.keras/datasets/fashion-mnist``, where
``keras.datasets.fashion_mnist.load_data`` keeps them) or of a ``data_dir``; with ``max_examples`` only
the first images are decompressed. At the native 28x28 size the known statistics are used and
TensorFlow is not needed.
"""

from __future__ import annotations

import gzip
import os

import numpy as np

from uniclr_tf.data.resize import resize_array
from uniclr_tf.data.sources.common import _make_info, _memory_split
from uniclr_tf.data.spec import DataError
from uniclr_tf.data.stats import _array_stats

FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                         "Sneaker", "Bag", "Ankle boot")
# Per-pixel mean and standard deviation of the 60,000 training images, in [0, 1] units.
FASHION_MNIST_MEAN = (0.2860406,)
FASHION_MNIST_STD = (0.3530242,)
_FASHION_MNIST_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                        "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")


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


def _read_idx_gz(path, offset, count=None, record=1):
    """The bytes after the ``offset``-byte header of a gzipped IDX file: every record, or only the
    first ``count`` records of ``record`` bytes (only those are decompressed)."""
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read() if count is None else f.read(offset + count * record), np.uint8,
                             offset=offset)


def _load_fashion_mnist(spec, opts):
    """Fashion-MNIST from Keras' cache or from ``data_dir``'s gz files (``spec``: ``fashion_mnist``, the
    loaders' signature)."""
    size, data_dir, max_examples = opts.size, opts.data_dir, opts.max_examples
    folder = os.path.expanduser(data_dir) if data_dir else _keras_cache_dir()
    missing = [f for f in _FASHION_MNIST_FILES if not os.path.isfile(os.path.join(folder, f))]
    if missing:
        raise _fashion_mnist_missing_error(folder, missing)
    try:
        # The IDX files (keras.datasets.fashion_mnist.load_data reads the same ones from its cache); only
        # the images kept are decompressed: the first max_examples of each split asked for.
        path = lambda f: os.path.join(folder, f)  # noqa: E731
        count = max_examples or None
        y_train = _read_idx_gz(path(_FASHION_MNIST_FILES[1]), 8, 0 if opts.splits == "test" else count)
        x_train = _read_idx_gz(path(_FASHION_MNIST_FILES[0]), 16, len(y_train), 784)
        y_test = _read_idx_gz(path(_FASHION_MNIST_FILES[3]), 8, 0 if opts.splits == "train" else count)
        x_test = _read_idx_gz(path(_FASHION_MNIST_FILES[2]), 16, len(y_test), 784)
        x_train, x_test = x_train.reshape(len(y_train), 28, 28), x_test.reshape(len(y_test), 28, 28)
    except (OSError, EOFError, ValueError) as e:
        raise DataError(f"fashion_mnist: cannot read the files in {folder} ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''}); delete them and copy them again") from e
    x_train = resize_array(x_train[..., None], size)
    x_test = resize_array(x_test[..., None], size)
    if opts.channels == 3:  # the test split of RGB training data
        x_train, x_test = np.repeat(x_train, 3, axis=-1), np.repeat(x_test, 3, axis=-1)
    if size is None or opts.splits == "test":  # a test split only: the statistics are the training data's
        mean, std = FASHION_MNIST_MEAN, FASHION_MNIST_STD
    else:  # resampling changes the statistics slightly: measure them
        mean, std = _array_stats(x_train)
    return _make_info(name="fashion_mnist", spec="fashion_mnist",
                      train=_memory_split("train", x_train, y_train),
                      test=_memory_split("test", x_test, y_test),
                      num_classes=10, class_names=FASHION_MNIST_CLASSES, mean=mean, std=std)
