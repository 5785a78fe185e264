"""In-memory arrays as whole batches for ``UniCLR.fit``.

Keras's own batching of arrays ends each epoch with a partial batch (``len % batch_size`` rows). The
objectives here are statistics of the batch: W-MSE splits it into whitening sub-batches of a fixed
size, SimWhitening, SimTrace and Zero-CL whiten 2N rows that must exceed the embedding size, the
contrastive losses take their negatives from it. A short last batch is a noisy step, a rank-deficient
whitening, or, on TensorFlow (whose traced step then has no static batch size), an error for W-MSE.
:class:`WholeBatches` does what the train CLI's pipeline does (``drop_remainder``): each epoch a new
order of the rows, whose last ``len % batch_size`` are left out, a different few each epoch.

The order of epoch ``e`` is a function of ``(seed, e)`` alone, the absolute epoch that Keras passes to
the callbacks (``initial_epoch`` and a resumed fit's included), so a fit resumed by
``uniclr_tf.BackupAndResume`` or continued with ``initial_epoch`` meets the batches the uninterrupted
one would have. On TensorFlow the batches are a ``tf.data`` pipeline of those row indices, gathered
from the arrays (a Keras ``PyDataset`` reaches TensorFlow's step with no static batch size); the
indices come from this Python process (``from_generator``), so where the input pipeline runs on
another machine (a remote TPU node, not a TPU VM) pass a ``tf.data`` dataset, or ``drop_remainder=False``.
"""

import inspect

import keras
import numpy as np


class WholeBatches(keras.utils.PyDataset):
    """``(x,)`` or ``(x, y)`` batches of exactly ``batch_size`` rows.

    ``x`` is an array (images), a tuple / list of arrays (views) or a dict of them (``images`` or
    ``views``, ``labels``), ``y`` an array or ``None``, each with as many rows. With ``shuffle`` the
    rows of epoch ``epoch`` come in the order ``numpy.random.default_rng([seed, epoch]).permutation(rows)``;
    :class:`EpochOfBatches` (a callback) keeps ``epoch`` at Keras's epoch.
    """

    def __init__(self, x, y=None, *, batch_size, shuffle=True, seed=0, epoch=0):
        super().__init__()
        x = _lists_as_tuples(x)  # (a list of views: tf.data would stack it into one tensor)
        self._parts = keras.tree.map_structure(np.asarray, (x,) if y is None else (x, y))
        counts = {len(a) for a in keras.tree.flatten(self._parts)}
        if len(counts) != 1:
            raise ValueError(f"UniCLR.fit: x and y must have as many rows each; received {_rows_of(x, y)}")
        self.rows = counts.pop()
        self.batch_size = batch_size
        if self.rows < self.batch_size:
            raise ValueError(f"UniCLR.fit: {self.rows} images make no whole batch of batch_size="
                             f"{self.batch_size}: pass a smaller batch_size, or drop_remainder=False for one "
                             f"batch of {self.rows}")
        self.shuffle, self.seed, self.epoch = bool(shuffle), int(seed), int(epoch)
        self._order = (None, None)

    def order(self):
        """The rows of the current epoch, in their order (the first ``len(self) * batch_size`` are used)."""
        if self._order[0] != self.epoch:
            rows = (np.random.default_rng([self.seed, self.epoch]).permutation(self.rows) if self.shuffle
                    else np.arange(self.rows))
            self._order = (self.epoch, rows)
        return self._order[1]

    def __len__(self):
        return self.rows // self.batch_size

    def __getitem__(self, index):
        if not 0 <= index < len(self):
            raise IndexError(f"batch {index} of {len(self)}")
        rows = self.order()[index * self.batch_size:(index + 1) * self.batch_size]
        return keras.tree.map_structure(lambda a: a[rows], self._parts)

    def on_epoch_end(self):
        self.epoch += 1  # (EpochOfBatches sets the next epoch's number anyway)

    def as_tf_dataset(self):
        """The same batches as a ``tf.data.Dataset`` with a static batch size: each pass reads the
        current epoch's row order, batched, then gathers the rows from the arrays."""
        import tensorflow as tf

        parts = keras.tree.map_structure(tf.convert_to_tensor, self._parts)
        size, steps = self.batch_size, len(self)

        def batches_of_rows():
            order = self.order()
            for index in range(steps):
                yield order[index * size:(index + 1) * size]

        rows = tf.data.Dataset.from_generator(batches_of_rows, output_signature=tf.TensorSpec((size,), tf.int64))
        rows = rows.apply(tf.data.experimental.assert_cardinality(steps))  # (Keras then knows an epoch's steps)
        return rows.map(lambda index: keras.tree.map_structure(lambda a: tf.gather(a, index), parts),
                        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).prefetch(tf.data.AUTOTUNE)


class EpochOfBatches(keras.callbacks.Callback):
    """Sets a :class:`WholeBatches`' epoch to Keras's at each epoch's start (before its batches are read)."""

    def __init__(self, batches):
        super().__init__()
        self.batches = batches

    def on_epoch_begin(self, epoch, logs=None):
        self.batches.epoch = int(epoch)


def _lists_as_tuples(part):
    """``part`` with its lists (of views, at the top or in a dict) as tuples."""
    if isinstance(part, dict):
        return {key: _lists_as_tuples(value) for key, value in part.items()}
    return tuple(part) if isinstance(part, list) else part


def _rows_of(*parts):
    return ", ".join(f"{name} {[len(np.asarray(a)) for a in keras.tree.flatten(part)]}"
                     for name, part in zip(("x", "y"), parts) if part is not None)


def _in_memory(part):
    """Whether ``part`` is an array, or a tuple, list or dict of arrays (what Keras batches itself)."""
    leaves = keras.tree.flatten(part) if isinstance(part, (tuple, list, dict)) else [part]
    return bool(leaves) and all(hasattr(a, "__array__") and len(getattr(a, "shape", ())) >= 1 for a in leaves)


_FIT = inspect.signature(keras.Model.fit)


def bind(args, kwargs):
    """``keras.Model.fit``'s arguments (without ``self``), all by name."""
    bound = dict(_FIT.bind_partial(None, *args, **kwargs).arguments)
    bound.pop("self", None)
    return bound


def with_callback(bound, callback):
    """``bound`` (from :func:`bind`) with ``callback`` added to its callbacks."""
    callbacks = bound.get("callbacks")
    callbacks = list(callbacks) if isinstance(callbacks, (list, tuple)) else [] if callbacks is None else [callbacks]
    return {**bound, "callbacks": callbacks + [callback]}


def as_whole_batches(bound, seed):
    """``bound`` (from :func:`bind`) with in-memory ``x`` (and ``y``) replaced by :class:`WholeBatches`
    of row orders seeded by ``seed``, and its :class:`EpochOfBatches` callback; other data (a
    dataset, a generator) as it is. A ``y`` given as a list becomes an array."""
    x, y = bound.get("x"), bound.get("y")
    if isinstance(y, list) and y and not isinstance(y[0], (list, tuple, np.ndarray)) and _in_memory(x):
        y = np.asarray(y)
    if x is None or not _in_memory(x) or not (y is None or _in_memory(y)):
        return bound
    bound = dict(bound)
    size = bound.pop("batch_size", None)
    size = 32 if size is None else size
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise ValueError(f"UniCLR.fit: batch_size must be a whole number >= 1; received {size!r}")
    bound.pop("y", None)
    batches = WholeBatches(x, y, batch_size=int(size), shuffle=bool(bound.pop("shuffle", True)), seed=seed,
                           epoch=int(bound.get("initial_epoch") or 0))
    bound["x"] = batches.as_tf_dataset() if keras.backend.backend() == "tensorflow" else batches
    bound["shuffle"] = False  # (Keras would reorder the batches too)
    return with_callback(bound, EpochOfBatches(batches))
