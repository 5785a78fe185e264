"""Datasets and the tf.data input pipelines.

``load_dataset(spec)`` turns a dataset spec into a :class:`DatasetInfo` (shapes, classes,
per-channel statistics and the splits); ``pretrain_dataset``, ``eval_dataset``, ``numpy_batches``
and ``as_numpy`` read the splits. Four spec forms are understood:

* ``fashion_mnist`` (the default): Keras' copy of Fashion-MNIST, loaded offline from
  ``~/.keras/datasets/fashion-mnist`` (or from ``data_dir``), held in memory.
* ``tfds:NAME[:SPLIT]``: any TensorFlow Datasets image dataset (``tfds:cifar10``,
  ``tfds:imagenette/160px:train[:10%]``, ``tfds:cifar10:3.0.2``), streamed from its TFRecords.
* ``folder:PATH``: image files, in class sub-folders or flat (unlabelled); up to
  ``max_in_memory_mb`` of decoded images (default 256 MB) decoded and checked once, eagerly, then
  held in memory; larger folders streamed from disk (decoded in the tf.data pipeline).
* ``tfrecord:TRAIN_GLOB[,TEST_GLOB]``: ``tf.train.Example`` records of encoded images (the
  feature spec is in :mod:`~uniclr_tf.data.sources.tfrecord`; ``python -m
  uniclr_tf.tools.folder_to_tfrecord`` writes a folder as such shards), streamed.

``eval_spec`` takes the test split from another spec; a dataset without a test split holds out
``holdout_fraction`` of its training data. Every element is a uint8 image ``[H, W, C]`` (``C`` in
{1, 3}) with an int64 label (``-1`` when unlabelled). Bad data stops at load time with a one-line
:class:`DataError` naming the culprit; what a streamed dataset checks at load and what it finds
only while streaming (an error naming the file, or a skip) is in :mod:`.sources.folder` and
:mod:`.stream`.

The pipelines are tf.data (whatever the Keras backend) but no ``keras.ops``: they run unchanged
under ``KERAS_BACKEND=jax``, whose ``fit`` converts the tf tensors. TensorFlow itself is imported on
first use, so in-memory data (``fashion_mnist`` at its own size, small folders) also loads where
TensorFlow is not installed (the JAX-only GPU machine), and :func:`numpy_batches` feeds it without
tf.data; streamed data needs TensorFlow.
``tensorflow_datasets`` is imported only when a ``tfds:`` spec is used.

Modules
-------
``spec``       the sources (:data:`SOURCES`: name, spec form, loader, help; :data:`SPEC_FORMS`),
               :class:`DataError`, :class:`Split`, :class:`DatasetInfo`; parsing of ``image_size``
               and of ``tfds:`` specs.
``sources``    :func:`load_dataset`, and one module per source: ``sources.fashion_mnist``
               (keras.datasets or IDX files), ``sources.tfds``, ``sources.folder`` (listing,
               hold-out, in memory or streamed, checking every file, bad-file skipping),
               ``sources.tfrecord`` (the feature spec, globs, hold-out by hash);
               ``sources.common`` has the load options, builds splits and infos.
``resize``     resizing of uint8 images (bilinear, antialiased), for the sources and the streams.
``decode``     :func:`decode_image` (TensorFlow's rule, and the same rule with Pillow),
               :func:`image_header` (the same answer from a file's header and end) and
               :class:`ImageDecodeError`.
``stream``     :class:`Stream` (a split's records, shuffled, then decoded in tf.data),
               ``decode_records`` (every image checked as it is decoded), :class:`BadFiles`,
               :func:`bad_file_message`.
``stats``      per-channel mean / std of uint8 images.
``pipelines``  :func:`pretrain_dataset`, :func:`eval_dataset` (tf.data), :func:`numpy_batches`
               (no tf.data), :func:`as_numpy`.
``lazy_tf``    ``tf`` (TensorFlow, imported on first attribute access), ``AUTOTUNE``,
               :func:`have_tensorflow`.

The public names are re-exported here: ``from uniclr_tf.data import load_dataset``. The names are bound
to the objects of the defining modules, so a test that patches a name must patch it there (e.g.
``uniclr_tf.data.sources.fashion_mnist._keras_cache_dir``), where the code looks it up.
"""

from uniclr_tf.data import decode, lazy_tf, pipelines, resize, sources, spec, stats, stream
from uniclr_tf.data.decode import ImageDecodeError, decode_image, image_header
from uniclr_tf.data.lazy_tf import AUTOTUNE, have_tensorflow, tf
from uniclr_tf.data.pipelines import as_numpy, eval_dataset, numpy_batches, pretrain_dataset
from uniclr_tf.data.sources import load_dataset
from uniclr_tf.data.sources.fashion_mnist import (FASHION_MNIST_CLASSES, FASHION_MNIST_MEAN,
                                                  FASHION_MNIST_STD)
from uniclr_tf.data.sources.folder import IMAGE_EXTENSIONS
from uniclr_tf.data.spec import SOURCES, SPEC_FORMS, DataError, DatasetInfo, Split, is_spec, spec_forms
from uniclr_tf.data.stream import BadFiles, Stream, bad_file_message

__all__ = [
    "AUTOTUNE",
    "BadFiles",
    "DataError",
    "DatasetInfo",
    "FASHION_MNIST_CLASSES",
    "FASHION_MNIST_MEAN",
    "FASHION_MNIST_STD",
    "IMAGE_EXTENSIONS",
    "ImageDecodeError",
    "SOURCES",
    "SPEC_FORMS",
    "Split",
    "Stream",
    "as_numpy",
    "bad_file_message",
    "decode",
    "decode_image",
    "eval_dataset",
    "have_tensorflow",
    "image_header",
    "is_spec",
    "lazy_tf",
    "load_dataset",
    "numpy_batches",
    "pipelines",
    "pretrain_dataset",
    "sources",
    "resize",
    "spec",
    "spec_forms",
    "stats",
    "stream",
    "tf",
]
