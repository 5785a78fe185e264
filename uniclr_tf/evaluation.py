"""Feature extraction and the kNN / raw-pixel evaluations shared by training, monitor and CLIs.

:func:`extract_features` is the one way backbone features are computed for evaluation (the kNN
monitor of ``train``/``callbacks`` and ``linear_eval``). It imports no TensorFlow: in-memory
NumPy data works on a JAX-only machine; a ``tf.data`` dataset is only iterated, batch by batch,
and only its features are kept (a streamed split's images never sit in memory together).
"""

import numpy as np

from uniclr_tf import knn

#: Streamed data: the raw-pixel kNN baseline's memory bank holds at most this many MB of pixels.
RAW_PIXEL_BANK_MB = 256


def _is_in_memory(source):
    """``(images, labels)`` arrays, as opposed to an iterable of such batches."""
    return (isinstance(source, (tuple, list)) and len(source) == 2 and hasattr(source[0], "shape")
            and len(getattr(source[0], "shape", ())) >= 2)


def _to_numpy(x):
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "numpy"):  # eager TF tensors
        return x.numpy()
    return np.asarray(x)


def _batches(source, batch_size):
    """``(images, labels or None)`` NumPy batches of ``source`` (see :func:`extract_features`)."""
    if _is_in_memory(source):
        images, labels = source
        for start in range(0, len(images), batch_size):
            yield images[start:start + batch_size], (None if labels is None else labels[start:start + batch_size])
        return
    iterator = source.as_numpy_iterator() if hasattr(source, "as_numpy_iterator") else iter(source)
    for batch in iterator:
        if isinstance(batch, (tuple, list)):
            if len(batch) != 2:
                raise ValueError(f"expected batches of (images, labels); received a {type(batch).__name__} "
                                 f"of {len(batch)} items")
            x, y = batch
        else:
            x, y = batch, None
        yield _to_numpy(x), (None if y is None else _to_numpy(y))


def extract_features(encoder, preprocess, source, batch_size=512):
    """Backbone features of every image of ``source``, in inference mode.

    Args:
      encoder: a ``keras.Model`` mapping preprocessed images ``[B, H, W, C]`` to features ``[B, F]``.
        It runs through ``encoder.predict_on_batch``: Keras's compiled (``tf.function`` / jitted)
        predict function, cached on the model across calls, with inference-mode batch norm.
      preprocess: callable applied to each uint8 batch before the encoder (e.g.
        :class:`uniclr_tf.augment.EvalPreprocess`), or None when ``source`` yields model-ready inputs.
      source: either in-memory ``(images, labels)`` NumPy arrays (``labels`` may be None), read
        in slices of ``batch_size``; or an iterable of ``(images, labels)`` batches, e.g. a
        batched ``tf.data.Dataset`` (iterated with ``as_numpy_iterator``), used as batched.
      batch_size: slice size of the in-memory path.

    Returns:
      ``(features float32 [N, F], labels int64 [N] or None)``; ``N`` may be 0 (features ``[0, 0]``).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1; received {batch_size}")
    features, labels = [], []
    has_labels = None
    full = None  # the first batch's size: a smaller last batch is padded to it (one compiled shape)
    for x, y in _batches(source, int(batch_size)):
        n = len(x)
        if n == 0:
            continue
        full = full or n
        if n < full:
            x = np.concatenate([x, np.repeat(np.asarray(x[-1:]), full - n, axis=0)])
        if preprocess is not None:
            x = preprocess(x)
        out = np.asarray(encoder.predict_on_batch(x), dtype=np.float32)[:n]
        features.append(out.reshape(n, -1))
        if has_labels is None:
            has_labels = y is not None
        elif has_labels != (y is not None):
            raise ValueError("some batches have labels and others do not")
        if y is not None:
            labels.append(np.asarray(y).astype(np.int64).reshape(-1))
    if not features:
        return np.zeros((0, 0), np.float32), (np.zeros((0,), np.int64) if has_labels is not False else None)
    return np.concatenate(features), (np.concatenate(labels) if has_labels else None)


def _features_stay_on_device(source):
    """The JAX fast path: in-memory data, one process's devices, no ``keras.distribution`` set."""
    import keras
    return (keras.backend.backend() == "jax" and _is_in_memory(source) and source[1] is not None
            and keras.distribution.distribution() is None)


def device_features(encoder, preprocess, images, batch_size=512):
    """Backbone features of in-memory ``images`` as one float32 array left on the device (JAX):
    one compiled call per batch (``preprocess`` and the encoder in inference mode), no host round
    trip per batch; the last batch is padded to ``batch_size`` (one compiled shape)."""
    import jax
    import jax.numpy as jnp
    key = ("uniclr_features", id(preprocess))
    cache = encoder.__dict__.setdefault("_uniclr_compiled", {})
    if key not in cache:
        def features(trainable, non_trainable, x):
            x = preprocess(x) if preprocess is not None else x
            out, _ = encoder.stateless_call(trainable, non_trainable, x, training=False)
            return jnp.reshape(out, (out.shape[0], -1)).astype(jnp.float32)
        cache[key] = jax.jit(features)
    fn = cache[key]
    trainable = [v.value for v in encoder.trainable_variables]
    non_trainable = [v.value for v in encoder.non_trainable_variables]
    outs = []
    size = min(int(batch_size), len(images))
    for start in range(0, len(images), size):
        x = np.asarray(images[start:start + size])
        n = len(x)
        if n < size:
            x = np.concatenate([x, np.repeat(x[-1:], size - n, axis=0)])
        out = fn(trainable, non_trainable, x)
        outs.append(out if n == size else out[:n])
    return jnp.concatenate(outs, axis=0)


def effective_rank(features):
    """Effective rank (Roy & Vetterli, 2007) of ``features [N, F]``: ``exp(H(p))`` with ``p`` the
    singular values of the centred features divided by their sum, ``H`` the Shannon entropy. It
    runs from 1 (every feature on one line: a collapsed representation) to ``min(N, F)`` (all
    directions used equally). Computed with ``keras.ops`` from the ``F × F`` covariance's
    eigenvalues, in float32 on the backend's device (features may be a device array)."""
    from keras import ops

    x = ops.cast(ops.convert_to_tensor(features), "float32")
    x = x - ops.mean(x, axis=0, keepdims=True)
    gram = ops.matmul(ops.transpose(x), x)
    singular = ops.sqrt(ops.maximum(ops.eigh(gram)[0], 0.0))
    total = ops.sum(singular)
    p = singular / ops.maximum(total, 1e-30)
    entropy = -ops.sum(ops.where(p > 0, p * ops.log(ops.maximum(p, 1e-30)), 0.0))
    return float(ops.convert_to_numpy(ops.where(total > 0, ops.exp(entropy), 0.0)))


def knn_eval(encoder, preprocess, train, test, num_classes, k=200, temperature=0.1, batch_size=512,
             with_rank=False):
    """Weighted kNN top-1/top-5 of ``encoder`` features.

    ``train`` (the memory bank) and ``test`` are ``(images, labels)`` arrays or batched
    ``(images, labels)`` iterables (see :func:`extract_features`). Returns ``{"top1", "top5"}``,
    fractions in [0, 1], and with ``with_rank`` the :func:`effective_rank` of the test features
    (``"effective_rank"``). The similarities and top-k run on the backend's device (``keras.ops``); on
    JAX with in-memory data the features never leave the device (:func:`device_features`).
    """
    if _features_stay_on_device(train) and _features_stay_on_device(test):
        train_f = device_features(encoder, preprocess, train[0], batch_size)
        test_f = device_features(encoder, preprocess, test[0], batch_size)
        scores = knn.knn_predict_tensors(train_f, train[1], test_f, num_classes, k, temperature)
        acc = knn.topk_accuracy(scores, test[1], (1, 5))
    else:
        train_f, train_y = extract_features(encoder, preprocess, train, batch_size)
        test_f, test_y = extract_features(encoder, preprocess, test, batch_size)
        if train_y is None or test_y is None:
            raise ValueError("kNN evaluation needs labels for the train (memory bank) and test data")
        acc = knn.knn_accuracy(train_f, train_y, test_f, test_y, num_classes, k, temperature, topk=(1, 5),
                               device=True)
    if with_rank:
        acc["effective_rank"] = effective_rank(test_f)
    return acc


def raw_pixel_knn(train, test, num_classes, k=200, temperature=0.1, max_bank_mb=RAW_PIXEL_BANK_MB):
    """The same weighted kNN on raw pixels: the baseline any learned feature should beat (its
    similarities and top-k on the backend's device).

    ``train`` and ``test`` are ``(images, labels)`` arrays, or batched ``(images, labels)``
    iterables (a streamed split, see :func:`extract_features`): then the memory bank is the first
    images of ``train`` that fit in ``max_bank_mb`` MB of float32 pixels, and ``test`` is scored
    batch by batch, so memory does not grow with the test split. Returns ``{"top1", "top5",
    "memory_bank"}`` (the bank's size).
    """
    as_float = lambda a: np.asarray(a, np.float32).reshape(len(a), -1) / 255.0  # noqa: E731
    if _is_in_memory(train) and _is_in_memory(test):
        acc = knn.knn_accuracy(as_float(train[0]), train[1], as_float(test[0]), test[1], num_classes, k,
                               temperature, topk=(1, 5), device=True)
        return {**acc, "memory_bank": len(train[0])}
    bank, bank_labels, size, capacity = [], [], 0, None
    for x, y in _batches(train, 1024):
        capacity = capacity or max(1, int(max_bank_mb * 2 ** 20) // (4 * int(np.prod(x.shape[1:]))))
        take = min(len(x), capacity - size)
        bank.append(as_float(x[:take]))
        bank_labels.append(np.asarray(y[:take], np.int64))
        size += take
        if size >= capacity:
            break
    if not size:
        raise ValueError("raw-pixel kNN: the memory bank is empty")
    bank, bank_labels = np.concatenate(bank), np.concatenate(bank_labels)
    score = None
    hits, count = {"top1": 0.0, "top5": 0.0}, 0
    for x, y in _batches(test, 1024):
        # The first batch's size is the chunk: later batches are not padded beyond it.
        score = score or knn.knn_scorer(bank, bank_labels, num_classes, k, temperature, chunk_size=len(x),
                                        device=True)
        acc = knn.topk_accuracy(score(as_float(x)), y, (1, 5))
        for key in hits:
            hits[key] += acc[key] * len(y)
        count += len(y)
    if not count:
        raise ValueError("raw-pixel kNN: the test split is empty")
    return {key: value / count for key, value in hits.items()} | {"memory_bank": size}
