"""Reading the splits of a :class:`~uniclr_tf.data.spec.DatasetInfo`.

``pretrain_dataset`` (shuffled, ``drop_remainder`` batches, optionally augmented inside tf.data)
and ``eval_dataset`` (the split's order, last batch partial) are tf.data pipelines, whatever the
Keras backend, with no ``keras.ops``: they run unchanged under ``KERAS_BACKEND=jax``, whose ``fit``
converts the tf tensors. In-memory splits are gathered from their arrays by index; streamed splits
(:class:`~uniclr_tf.data.stream.Stream`) are shuffled as records (file names, serialized
examples) and decoded after the shuffle, in parallel. ``numpy_batches`` is ``pretrain_dataset``'s
stream of raw uint8 batches without tf.data (in-memory splits only; it needs no TensorFlow), and
``as_numpy`` returns a split, or its beginning, as arrays.
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple

import numpy as np

from uniclr_tf.data.lazy_tf import AUTOTUNE, tf
from uniclr_tf.data.spec import DataError, DatasetInfo
from uniclr_tf.data.stream import shuffled_indices

_STREAM_EVAL_PREFETCH = 2  # decoded batches in flight when evaluating on a streamed split


def _gather_fn(split, with_labels=True):
    """A tf.data map function: batch of indices -> uint8 images (and labels) of an in-memory split."""
    images = tf.constant(split.images)
    labels = tf.constant(split.labels)
    if with_labels:
        return lambda idx: (tf.gather(images, idx), tf.gather(labels, idx))
    return lambda idx: tf.gather(images, idx)


def pretrain_dataset(info: DatasetInfo, batch_size: int, augmenter: Optional[Callable] = None,
                     shuffle: bool = True, seed: int = 0, split: str = "train", repeat: bool = False,
                     with_labels: bool = False, skip_batches: int = 0,
                     augment_seed: Optional[int] = None) -> tf.data.Dataset:
    """Batches for self-supervised pretraining.

    Shuffles, optionally repeats, batches with
    ``drop_remainder=True`` (static shapes for XLA/TPU), then maps ``augmenter`` over each uint8
    batch ``[B, H, W, C]`` (it returns a tuple of float views), and prefetches. A streamed split
    is shuffled before its images are decoded: a folder's whole file list, TFRecord files and then
    their records through a buffer (see :mod:`uniclr_tf.data.stream`); the batches are not
    sharded here (tf.data / Keras auto-sharding does it per worker).

    Each pass over the split has a new order. For in-memory splits and folders it is a function of
    ``seed`` and the pass's number alone (:func:`~uniclr_tf.data.stream.shuffled_indices`), however
    many iterators of the dataset were made before; TFRecords and TFDS splits are reshuffled by
    tf.data, whose orders also depend on that (the train CLI reads its dataset with one iterator).

    Args:
      info: from :func:`load_dataset`.
      batch_size: global batch size ``B``.
      augmenter: a callable (e.g. a Keras layer built on ``self.backend``) applied to the batch
        inside tf.data; None yields the raw uint8 batch (augmentation on the device).
      shuffle: shuffle the examples (a new order on every pass over the split).
      seed: shuffle seed.
      split: which split to read.
      repeat: repeat forever (batches then run across epoch boundaries).
      with_labels: yield ``(x, labels)`` (labels int64 ``[B]``, ``-1`` when unlabelled) for the
        online linear probe, instead of ``x`` alone.
      skip_batches: start this many batches into the (deterministic) stream, e.g. at a resumed run's
        step; skipped before any image is gathered, decoded or augmented, so skipping costs little
        (a streamed split with bad images dropped while streaming resumes a few images off).
      augment_seed: with an augmenter that takes ``batch_key`` (``uniclr_tf.ViewAugmenter``), batch ``i`` of
        the stream (counting the skipped ones) is augmented with the key ``(augment_seed, i)``: its views
        are a function of the seed and the batch's place alone, whatever the parallel map ran first, so a
        stream started at ``skip_batches`` gives the views of the uninterrupted one. None: the
        augmenter's own random streams (views that differ from one iteration to the next).

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
        if shuffle:
            ds = shuffled_indices(n, seed, repeat)
        else:
            ds = tf.data.Dataset.range(n)
            ds = ds.repeat() if repeat else ds
        ds = ds.batch(batch_size, drop_remainder=True).skip(skip_batches)
        ds = ds.map(_gather_fn(data, with_labels), num_parallel_calls=AUTOTUNE)
    else:
        ds = data.stream.records(shuffle=shuffle, seed=seed, repeat=repeat)
        ds = data.stream.decode(ds.skip(skip_batches * batch_size))
        ds = ds.batch(batch_size, drop_remainder=True)
        if not with_labels:
            ds = ds.map(lambda x, y: x, num_parallel_calls=AUTOTUNE)
    if augmenter is not None:
        if not callable(augmenter):
            raise TypeError(f"augmenter must be callable or None; received {type(augmenter).__name__}")
        if augment_seed is not None:
            if isinstance(augment_seed, bool) or not isinstance(augment_seed, (int, np.integer)):
                raise TypeError(f"augment_seed must be an int or None; received {augment_seed!r}")
            from uniclr_tf.augment.views import takes_batch_key

            if not takes_batch_key(augmenter):
                raise TypeError(f"augment_seed needs an augmenter that takes batch_key= (uniclr_tf.ViewAugmenter); "
                                f"received {type(augmenter).__name__}")
            seed_ = tf.constant(int(augment_seed), tf.int64)

            def keyed(i, batch):
                x, y = batch if with_labels else (batch, None)
                views = augmenter(x, batch_key=tf.stack([seed_, i]))
                return (views, y) if with_labels else views

            ds = ds.enumerate(start=skip_batches).map(keyed, num_parallel_calls=AUTOTUNE)
        elif with_labels:
            ds = ds.map(lambda x, y: (augmenter(x), y), num_parallel_calls=AUTOTUNE)
        else:
            ds = ds.map(augmenter, num_parallel_calls=AUTOTUNE)
    return ds.prefetch(AUTOTUNE)


def eval_dataset(info: DatasetInfo, split: str, batch_size: int, preprocess: Optional[Callable] = None,
                 max_examples: Optional[int] = None) -> tf.data.Dataset:
    """Batches of ``(images, labels)`` in the split's order, the last one partial (no drop_remainder).

    Args:
      info: from :func:`load_dataset`.
      split: ``"train"`` or ``"test"``.
      batch_size: batch size.
      preprocess: optional callable applied to each uint8 batch ``[b, H, W, C]`` (e.g. scale and
        normalise); None yields the uint8 images.
      max_examples: read only the first ``max_examples`` (None: all).

    Returns:
      A ``tf.data.Dataset`` of ``(images, labels int64)``.
    """
    data = info.split(split)
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive; received {batch_size}")
    n = data.num_examples if max_examples is None else min(int(max_examples), data.num_examples)
    if data.in_memory:
        ds = tf.data.Dataset.range(n).batch(batch_size)
        ds = ds.map(_gather_fn(data), num_parallel_calls=AUTOTUNE)
    else:
        records = data.stream.records()
        ds = data.stream.decode(records if max_examples is None else records.take(n)).batch(batch_size)
    if preprocess is not None:
        ds = ds.map(lambda x, y: (preprocess(x), y), num_parallel_calls=AUTOTUNE)
    # A streamed split's batches are decoded as they are read: two in flight, not an autotuned
    # buffer that would hold many decoded batches while the reader (a kNN pass) is busy.
    return ds.prefetch(AUTOTUNE if data.in_memory else _STREAM_EVAL_PREFETCH)


def _shard_rows(batch_size, shard):
    index, count = shard
    if batch_size % count or not 0 <= index < count:
        raise ValueError(f"shard={shard}: the batch of {batch_size} must split evenly over {count} processes")
    per = batch_size // count
    return index * per, (index + 1) * per


def numpy_batches(info: DatasetInfo, batch_size: int, shuffle: bool = True, seed: int = 0,
                  split: str = "train", with_labels: bool = False, skip_batches: int = 0,
                  shard: Tuple[int, int] = (0, 1), across_passes: bool = False):
    """Endless uint8 batches of an in-memory split without tf.data (for augmentation on the device).

    Same contract as :func:`pretrain_dataset` with ``augmenter=None, repeat=True``: a new permutation
    every pass over the split (``numpy.random.default_rng(seed)``, deterministic), full batches, ``x``
    or ``(x, labels)``, the first ``skip_batches`` batches skipped. ``across_passes=False`` (the
    pretraining stream) cuts each pass into batches and drops its last partial one, so the split must
    hold a batch; ``True`` concatenates the passes before cutting (as tf.data's ``repeat().batch()``),
    so a batch may span two passes and a split smaller than a batch still works (linear evaluation on
    a labelled subset). ``shard=(index, count)``: this process's rows of every batch, ``batch_size /
    count`` contiguous rows, for a JAX multi-process job (every process runs the same stream; Keras
    assembles the global batch in process order). A ``tf.data`` dataset needs no such option: Keras's
    ``DataParallel`` shards it over the processes itself (rebatch + shard).
    """
    data = info.split(split)
    if not data.in_memory:
        raise DataError(f"{info.spec or info.name}: numpy_batches needs an in-memory split; "
                        "streamed data (tfds:, tfrecord:, a large folder:) needs tf.data (pretrain_dataset)")
    n = data.num_examples
    if n == 0 or (n < batch_size and not across_passes):
        raise DataError(f"{info.spec or info.name}: split {split!r} has {n} examples, fewer than "
                        f"batch_size={batch_size}")
    batches = _batch_indices(n, batch_size, np.random.default_rng(seed), shuffle, across_passes)
    for count, idx in enumerate(batches, 1):
        if count <= skip_batches:  # a resumed run: the same stream, from its step on
            continue
        if shard[1] > 1:
            lo, hi = _shard_rows(batch_size, shard)
            idx = idx[lo:hi]
        x = data.images[idx]
        yield (x, data.labels[idx]) if with_labels else x


def _batch_indices(n, batch_size, rng, shuffle, across_passes):
    """Endless index arrays of :func:`numpy_batches`'s batches: passes over ``range(n)`` (each a new
    permutation from ``rng`` when ``shuffle``), cut into ``batch_size`` rows per pass (the rest
    dropped) or, ``across_passes``, cut from the passes concatenated."""
    pending = np.zeros((0,), np.int64)
    while True:
        order = rng.permutation(n) if shuffle else np.arange(n)
        if across_passes:
            pending = np.concatenate([pending, order])
            while len(pending) >= batch_size:
                yield pending[:batch_size]
                pending = pending[batch_size:]
        else:
            for start in range(0, n - batch_size + 1, batch_size):
                yield order[start:start + batch_size]


def as_numpy(info: DatasetInfo, split: str, max_examples: Optional[int] = None
             ) -> Tuple[np.ndarray, np.ndarray]:
    """``(images uint8 [N, H, W, C], labels int64 [N])`` of a split, the first ``max_examples``.

    In-memory splits return read-only views (no copy); streamed splits are read and decoded (the
    first ``max_examples`` of their order), so keep that small for them (pictures, samples).
    """
    data = info.split(split)
    n = data.num_examples if max_examples is None else min(int(max_examples), data.num_examples)
    if data.in_memory:
        return data.images[:n], data.labels[:n]
    images, labels = [], []
    for x, y in eval_dataset(info, split, 1024, max_examples=n):
        images.append(x.numpy())
        labels.append(y.numpy())
    if not images:
        return np.zeros((0, *info.image_shape), np.uint8), np.zeros((0,), np.int64)
    return np.concatenate(images), np.concatenate(labels).astype(np.int64)
