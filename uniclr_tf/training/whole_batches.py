"""In-memory arrays as whole batches for ``UniCLR.fit``.

Keras's own batching of arrays ends each epoch with a partial batch (``len % batch_size`` rows). The
objectives here are statistics of the batch: W-MSE splits it into whitening sub-batches of a fixed
size, SimWhitening, SimTrace and Zero-CL whiten 2N rows that must exceed the embedding size, the
contrastive losses take their negatives from it. A short last batch is a noisy step, a rank-deficient
whitening, or, on TensorFlow (whose traced step then has no static batch size), an error for W-MSE.
:class:`WholeBatches` does what the train CLI's pipeline does (``drop_remainder``): it reshuffles
the rows each epoch and leaves out that epoch's last ``len % batch_size``, a different few each
epoch. On TensorFlow the same is a ``tf.data`` pipeline of shuffled row indices (a Keras
``PyDataset`` reaches TensorFlow's step with no static batch size).
"""

import inspect

import keras
import numpy as np


class WholeBatches(keras.utils.PyDataset):
    """``(x,)``, ``(x, y)`` or ``(x, y, sample_weight)`` batches of exactly ``batch_size`` rows.

    ``x`` is an array (images) or a tuple / list of arrays (views); ``y`` and ``sample_weight``
    arrays or ``None``; every array has the same number of rows. With ``shuffle`` the order is
    drawn again at each epoch's end from a NumPy generator seeded with ``seed``.
    """

    def __init__(self, x, y=None, sample_weight=None, *, batch_size, shuffle=True, seed=None):
        super().__init__()
        self._parts = tuple(part for part in (x, y, sample_weight) if part is not None)
        self._parts = keras.tree.map_structure(np.asarray, self._parts)
        counts = {len(a) for a in keras.tree.flatten(self._parts)}
        if len(counts) != 1:
            raise ValueError(f"UniCLR.fit: x, y and sample_weight must have as many rows each; received "
                             f"{_rows_of(x, y, sample_weight)}")
        self.rows = counts.pop()
        self.batch_size = int(batch_size)
        if self.rows < self.batch_size:
            raise ValueError(f"UniCLR.fit: {self.rows} images make no whole batch of batch_size="
                             f"{self.batch_size}: pass a smaller batch_size, or drop_remainder=False for one "
                             f"batch of {self.rows}")
        self._shuffle = bool(shuffle)
        self._rng = np.random.default_rng(seed)
        self._order = self._draw_order()

    def _draw_order(self):
        return self._rng.permutation(self.rows) if self._shuffle else np.arange(self.rows)

    def __len__(self):
        return self.rows // self.batch_size

    def __getitem__(self, index):
        if not 0 <= index < len(self):
            raise IndexError(f"batch {index} of {len(self)}")
        rows = self._order[index * self.batch_size:(index + 1) * self.batch_size]
        return keras.tree.map_structure(lambda a: a[rows], self._parts)

    def on_epoch_end(self):
        self._order = self._draw_order()

    def as_tf_dataset(self):
        """The same batches as a ``tf.data.Dataset`` with a static batch size: row indices reshuffled at
        each pass (seeded), batched with ``drop_remainder``, then gathered from the arrays."""
        import tensorflow as tf

        parts = keras.tree.map_structure(tf.convert_to_tensor, self._parts)
        rows = tf.data.Dataset.range(self.rows)
        if self._shuffle:
            rows = rows.shuffle(self.rows, seed=int(self._rng.integers(2**31 - 1)), reshuffle_each_iteration=True)
        rows = rows.batch(self.batch_size, drop_remainder=True)
        return rows.map(lambda index: keras.tree.map_structure(lambda a: tf.gather(a, index), parts),
                        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).prefetch(tf.data.AUTOTUNE)


def _rows_of(*parts):
    names = ("x", "y", "sample_weight")
    return ", ".join(f"{name} {[len(np.asarray(a)) for a in keras.tree.flatten(part)]}"
                     for name, part in zip(names, parts) if part is not None)


def _in_memory(part):
    """Whether ``part`` is an array or a tuple / list of arrays (what Keras batches itself)."""
    leaves = keras.tree.flatten(part) if isinstance(part, (tuple, list)) else [part]
    return bool(leaves) and all(hasattr(a, "__array__") and len(getattr(a, "shape", ())) >= 1 for a in leaves)


_FIT = inspect.signature(keras.Model.fit)


def bind(args, kwargs):
    """``keras.Model.fit``'s arguments (without ``self``), all by name."""
    bound = dict(_FIT.bind_partial(None, *args, **kwargs).arguments)
    bound.pop("self", None)
    return bound


def as_whole_batches(bound):
    """``bound`` (from :func:`bind`) with in-memory ``x`` (and ``y``, ``sample_weight``) replaced by a
    :class:`WholeBatches`; other data (a dataset, a generator) as it is. The order is seeded from
    NumPy's global generator (``keras.utils.set_random_seed`` sets it), as Keras's shuffling of
    arrays is."""
    x = bound.get("x")
    if x is None or not all(part is None or _in_memory(part)
                            for part in (x, bound.get("y"), bound.get("sample_weight"))):
        return bound
    bound = dict(bound)
    batches = WholeBatches(x, bound.pop("y", None), bound.pop("sample_weight", None),
                           batch_size=bound.pop("batch_size", None) or 32, shuffle=bool(bound.pop("shuffle", True)),
                           seed=int(np.random.randint(2**31 - 1)))
    bound["x"] = batches.as_tf_dataset() if keras.backend.backend() == "tensorflow" else batches
    bound["shuffle"] = False  # (Keras would reorder the batches too)
    return bound
