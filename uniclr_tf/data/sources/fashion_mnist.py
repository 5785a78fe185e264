"""``fashion_mnist``: Keras' copy of Fashion-MNIST, loaded offline and held in memory.

Read through ``keras.datasets`` from its cache (``~/.keras/datasets/fashion-mnist``), or straight
from the four IDX ``*-ubyte.gz`` files of a ``data_dir``. At the native 28x28 size the known
statistics are used and TensorFlow is not needed.
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


def _read_idx_gz(path, offset):
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)


def _load_fashion_mnist(spec, opts):
    """Fashion-MNIST through keras (offline from its cache), or from ``data_dir``'s gz files (``spec``:
    ``fashion_mnist``, the loaders' signature)."""
    size, data_dir, max_examples = opts.size, opts.data_dir, opts.max_examples
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
    if opts.splits == "train":
        x_test, y_test = x_test[:0], y_test[:0]
    elif opts.splits == "test":
        x_train, y_train = x_train[:0], y_train[:0]
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
