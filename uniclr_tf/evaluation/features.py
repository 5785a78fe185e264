"""Feature extraction and the kNN / raw-pixel evaluations shared by training, monitor and CLIs.

:func:`extract_features` is the one way backbone features are computed for evaluation (the kNN
monitor of ``train``/``callbacks`` and ``linear_eval``). It imports no TensorFlow: in-memory
NumPy data works on a JAX-only machine; a ``tf.data`` dataset is only iterated, batch by batch,
and only its features are kept (a streamed split's images never sit in memory together).
"""

import functools

import numpy as np

from uniclr_tf.evaluation import knn

#: Test rows scored per chunk by the kNN of device features (``[chunk, N_train]`` similarities at once).
KNN_CHUNK = 1024

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
    # A smaller (last) batch is padded to batch_size (in-memory data: the memory bank and the test
    # split then share one compiled shape, even when smaller than a batch) or to the first batch's size.
    full = int(batch_size) if _is_in_memory(source) else None
    for x, y in _batches(source, int(batch_size)):
        n = len(x)
        if n == 0:
            continue
        full = full or n
        if n < full:
            x = np.concatenate([x, np.repeat(np.asarray(x[-1:]), full - n, axis=0)])
        if preprocess is not None:
            x = _compiled_preprocess(preprocess)(x)
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


def _compiled_preprocess(preprocess):
    """A Keras layer ``preprocess`` as one compiled program (JAX; kept on the layer), else as it is."""
    import keras
    if not isinstance(preprocess, keras.layers.Layer):
        return preprocess
    cache = preprocess.__dict__.setdefault("_uniclr_compiled", {})
    if "call" not in cache:
        from uniclr_tf.objectives.tensors import compiled

        def preprocess_batch(x):
            return preprocess(x)
        cache["call"] = compiled(preprocess_batch)
    return cache["call"]


def _features_stay_on_device(source):
    """The JAX fast path: in-memory data, one process's devices, no ``keras.distribution`` set."""
    import keras
    return (keras.backend.backend() == "jax" and _is_in_memory(source) and source[1] is not None
            and keras.distribution.distribution() is None)


def _device_feature_batches(encoder, preprocess, images, batch_size=512):
    """:func:`device_features`' batches, left as they come: a list of ``[size, F]`` float32 device
    arrays, the last one padded (one shape), and the number of real rows."""
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
    size = int(batch_size)  # a split smaller than a batch is padded too: one shape for every split
    for start in range(0, len(images), size):
        x = np.asarray(images[start:start + size])
        n = len(x)
        if n < size:
            x = np.concatenate([x, np.repeat(x[-1:], size - n, axis=0)])
        outs.append(fn(trainable, non_trainable, x))
    return outs, len(images)


def features_on_host(encoder, preprocess, images, batch_size=512):
    """Backbone features of in-memory uint8 ``images`` as NumPy float32 ``[N, F]``. On JAX (one
    process's devices) through :func:`device_features`' compiled program, each batch fetched as it
    is: at the kNN monitor's batch size, nothing new to compile. Else :func:`extract_features`."""
    import keras
    if keras.backend.backend() == "jax" and keras.distribution.distribution() is None and len(images):
        batches, n = _device_feature_batches(encoder, preprocess, images, batch_size)
        return np.concatenate([np.asarray(b) for b in batches])[:n]
    return extract_features(encoder, preprocess, (images, None), batch_size)[0]


def _stack(batches, n):
    """The first ``n`` rows of the batches, concatenated (inside a compiled program)."""
    from keras import ops
    x = batches[0] if len(batches) == 1 else ops.concatenate(list(batches), axis=0)
    return x if int(x.shape[0]) == n else x[:n]


@functools.lru_cache(maxsize=None)
def _stack_program(n):
    from uniclr_tf.objectives.tensors import compiled

    def stack_features(batches):
        return _stack(batches, n)
    return compiled(stack_features)


def device_features(encoder, preprocess, images, batch_size=512):
    """Backbone features of in-memory ``images`` as one float32 array left on the device (JAX):
    one compiled call per batch (``preprocess`` and the encoder in inference mode), no host round
    trip per batch; the last batch is padded to ``batch_size`` (one compiled shape, whatever the
    number of images), and the batches are joined by one compiled call."""
    batches, n = _device_feature_batches(encoder, preprocess, images, batch_size)
    return _stack_program(n)(tuple(batches))


def effective_rank_tensor(features):
    """:func:`effective_rank` in ``keras.ops``, as a float32 scalar tensor (traceable, for use
    inside a compiled program)."""
    from keras import ops

    x = ops.cast(ops.convert_to_tensor(features), "float32")
    x = x - ops.mean(x, axis=0, keepdims=True)
    gram = ops.matmul(ops.transpose(x), x)
    singular = ops.sqrt(ops.maximum(ops.eigh(gram)[0], 0.0))
    total = ops.sum(singular)
    p = singular / ops.maximum(total, 1e-30)
    entropy = -ops.sum(ops.where(p > 0, p * ops.log(ops.maximum(p, 1e-30)), 0.0))
    return ops.where(total > 0, ops.exp(entropy), 0.0)


@functools.lru_cache(maxsize=None)
def _effective_rank_program():
    from uniclr_tf.objectives.tensors import compiled
    return compiled(effective_rank_tensor)


def effective_rank(features):
    """Effective rank (Roy & Vetterli, 2007) of ``features [N, F]``: ``exp(H(p))`` with ``p`` the
    singular values of the centred features divided by their sum, ``H`` the Shannon entropy. It
    runs from 1 (every feature on one line: a collapsed representation) to ``min(N, F)`` (all
    directions used equally). Computed with ``keras.ops`` from the ``F × F`` covariance's
    eigenvalues, in float32 on the backend's device (features may be a device array); on JAX one
    compiled program per shape."""
    from keras import ops
    return float(ops.convert_to_numpy(_effective_rank_program()(features)))


@functools.lru_cache(maxsize=None)
def _device_knn_program(n_train, n_test, num_classes, k, temperature, chunk_size, with_rank):
    """The kNN monitor's maths after the features, as one compiled program (JAX): the feature
    batches joined, the kNN scores (:func:`uniclr_tf.evaluation.knn.knn_scores`) and the effective rank."""
    from uniclr_tf.objectives.tensors import compiled

    def knn_eval_device(train_batches, train_labels, test_batches):
        train, test = _stack(train_batches, n_train), _stack(test_batches, n_test)
        scores = knn.knn_scores(train, train_labels, test, num_classes, k, temperature, chunk_size)
        return scores, (effective_rank_tensor(test) if with_rank else None)
    return compiled(knn_eval_device)


def knn_eval(encoder, preprocess, train, test, num_classes, k=200, temperature=0.1, batch_size=512,
             with_rank=False, label_fraction=1.0, seed=0):
    """Weighted kNN top-1/top-5 of ``encoder`` features.

    ``train`` (the memory bank) and ``test`` are ``(images, labels)`` arrays or batched
    ``(images, labels)`` iterables (see :func:`extract_features`). Returns ``{"top1", "top5"}``,
    fractions in [0, 1], and with ``with_rank`` the :func:`effective_rank` of the test features
    (``"effective_rank"``). ``label_fraction < 1`` keeps a class-balanced subset of an in-memory
    ``train`` as the memory bank, drawn by ``seed``: the subset the evaluation CLIs'
    ``--label_fraction`` and ``--seed`` pick (:func:`uniclr_tf.evaluation.protocols.label_subset`).
    The similarities and top-k run on the backend's device (``keras.ops``); on JAX with in-memory
    data the features never leave the device (:func:`device_features`) and everything after them is
    one compiled program (:func:`_device_knn_program`).

    Examples:
        >>> preprocess = uniclr_tf.EvalPreprocess(32, augmenter.mean, augmenter.std)
        >>> uniclr_tf.knn_eval(model.encoder, preprocess, (train_x, train_y), (test_x, test_y), num_classes=10, k=20)
        {'top1': 0.81, 'top5': 0.98}
    """
    if label_fraction != 1.0:
        from uniclr_tf.evaluation import protocols
        if not _is_in_memory(train) or train[1] is None:
            raise ValueError("label_fraction: the labelled subset is drawn from in-memory (images, labels) "
                             "arrays; received a batched iterable or no labels for train")
        keep = protocols.label_subset(np.asarray(train[1]).reshape(-1), label_fraction, seed)
        train = (np.asarray(train[0])[keep], np.asarray(train[1])[keep])
    if _features_stay_on_device(train) and _features_stay_on_device(test):
        from keras import ops
        train_b, n_train = _device_feature_batches(encoder, preprocess, train[0], batch_size)
        test_b, n_test = _device_feature_batches(encoder, preprocess, test[0], batch_size)
        labels = knn._bank_labels(train[1], n_train, num_classes).astype(np.int32)
        program = _device_knn_program(n_train, n_test, int(num_classes), min(int(k), n_train), float(temperature),
                                      KNN_CHUNK, bool(with_rank))
        scores, rank = program(tuple(train_b), labels, tuple(test_b))
        acc = knn.topk_accuracy(np.asarray(ops.convert_to_numpy(scores), np.float32)[:n_test], test[1], (1, 5))
        if with_rank:
            acc["effective_rank"] = float(ops.convert_to_numpy(rank))
        return acc
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
