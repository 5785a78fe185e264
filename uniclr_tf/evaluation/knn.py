"""Weighted k-nearest-neighbour evaluation (Wu et al. 2018; the usual SSL monitor).

Features are ℓ2-normalised; each test sample votes with its ``k`` most similar training samples,
weighted by ``exp(similarity / T)``. The defaults k=200, T=0.1 are the common choice for a kNN
monitor of self-supervised features (Wu et al. 2018 and most re-implementations). NumPy, or
``keras.ops`` on the accelerator for the similarities and top-k (``device=True``), chunked over the
test set so 60k×10k similarities never sit in memory at once.
"""

import functools

import numpy as np


def l2_normalize(x, eps=1e-12):
    x = np.asarray(x, dtype=np.float32).reshape(len(x), -1)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), eps)


def _top_k_numpy(train):
    def top_k(test_chunk, k, chunk_size):
        sim = test_chunk @ train.T
        idx = np.argpartition(-sim, k - 1, axis=1)[:, :k]
        return np.take_along_axis(sim, idx, axis=1), idx
    return top_k


def _top_k_keras(train):
    """Similarities and their top-k on the Keras backend's device (GPU/TPU): only ``[chunk, k]``
    values and indices come back to the host, not the ``[chunk, N_train]`` similarities. On JAX
    the matmul and the top-k are one compiled program (:func:`_similarity_top_k`)."""
    from keras import ops

    from uniclr_tf.objectives.tensors import to_device
    bank = to_device(train)

    def top_k(test_chunk, k, chunk_size):
        n = len(test_chunk)
        if n < chunk_size:  # pad the last chunk: one shape, one compiled program
            test_chunk = np.concatenate([test_chunk, np.zeros((chunk_size - n, test_chunk.shape[1]), test_chunk.dtype)])
        values, idx = _similarity_top_k(int(k))(test_chunk, bank)
        return ops.convert_to_numpy(values)[:n], ops.convert_to_numpy(idx)[:n]
    return top_k


@functools.lru_cache(maxsize=None)
def _similarity_top_k(k):
    """``(chunk [C, F], bank [N, F]) -> top-k of chunk · bankᵀ`` (values, indices), compiled."""
    from keras import ops

    from uniclr_tf.objectives.tensors import compiled

    def similarity_top_k(chunk, bank):
        return ops.top_k(ops.matmul(chunk, ops.transpose(bank)), k)
    return compiled(similarity_top_k)


def _bank_labels(train_labels, n_train, num_classes):
    """A memory bank's labels as int64 ``[n_train]``, checked: as many as its rows, at least one,
    each in ``[0, num_classes)``."""
    train_labels = np.asarray(train_labels).astype(np.int64).reshape(-1)
    if n_train != len(train_labels):
        raise ValueError(f"train_features has {n_train} rows but train_labels has {len(train_labels)}")
    if n_train == 0:
        raise ValueError("kNN needs a non-empty memory bank; train_features has 0 rows")
    if train_labels.min() < 0:
        raise ValueError("kNN needs labelled training data; found labels < 0 (unlabelled)")
    if train_labels.max() >= num_classes:
        raise ValueError(f"train_labels must lie in [0, {num_classes}); found {train_labels.max()}")
    return train_labels


def knn_scorer(train_features, train_labels, num_classes, k=200, temperature=0.1, chunk_size=1024, device=False):
    """The weighted kNN classifier of a memory bank, as a function ``test_features -> scores
    [N_test, num_classes]``: the bank is checked, normalised (and moved to the device) once, so
    test features can come batch by batch (a streamed test split).

    ``device=True`` computes the similarities and their top-k with ``keras.ops`` on the active
    backend's device (the kNN monitor on a GPU); the votes are the same (ties aside).
    """
    train = l2_normalize(train_features)
    train_labels = _bank_labels(train_labels, len(train), num_classes)
    k = min(int(k), len(train))
    top_k = (_top_k_keras if device else _top_k_numpy)(train)

    def scores_of(test_features):
        test = l2_normalize(test_features)
        if train.shape[1] != test.shape[1]:
            raise ValueError(f"feature sizes differ: train {train.shape[1]}, test {test.shape[1]}")
        scores = np.zeros((len(test), num_classes), np.float32)
        for start in range(0, len(test), chunk_size):
            top_sim, idx = top_k(test[start:start + chunk_size], k, chunk_size)
            weights = np.exp((top_sim - 1.0) / temperature)  # shifted by the max cosine for stability
            votes = train_labels[idx]
            block = scores[start:start + chunk_size]
            np.add.at(block, (np.arange(len(block))[:, None], votes), weights)
        return scores
    return scores_of


def knn_predict(train_features, train_labels, test_features, num_classes, k=200, temperature=0.1,
                chunk_size=1024, device=False):
    """Returns class scores ``[N_test, num_classes]`` of the weighted kNN classifier.

    ``device=True`` computes the similarities and their top-k with ``keras.ops`` on the active
    backend's device (the kNN monitor on a GPU); the votes are the same (ties aside).
    """
    return knn_scorer(train_features, train_labels, num_classes, k, temperature, chunk_size, device)(test_features)


def knn_predict_tensors(train_features, train_labels, test_features, num_classes, k=200, temperature=0.1,
                        chunk_size=1024):
    """:func:`knn_predict` for features that are already on the device (backend tensors, e.g. the
    kNN monitor's): the normalisation, similarities, top-k and weighted votes all run in
    ``keras.ops`` (:func:`knn_scores`; on JAX one compiled program per shape) and only the
    ``[N_test, num_classes]`` scores come back to the host."""
    n_train, n_test = int(train_features.shape[0]), int(test_features.shape[0])
    train_labels = _bank_labels(train_labels, n_train, num_classes)
    width = lambda x: int(np.prod(x.shape[1:], dtype=np.int64))  # noqa: E731
    if width(train_features) != width(test_features):
        raise ValueError(f"feature sizes differ: train {width(train_features)}, test {width(test_features)}")
    if n_test == 0:
        return np.zeros((0, num_classes), np.float32)
    from keras import ops
    program = _knn_program(int(num_classes), min(int(k), n_train), float(temperature), int(chunk_size))
    scores = program(train_features, train_labels.astype(np.int32), test_features)
    return np.asarray(ops.convert_to_numpy(scores), np.float32)[:n_test]


@functools.lru_cache(maxsize=None)
def _knn_program(num_classes, k, temperature, chunk_size):
    from uniclr_tf.objectives.tensors import compiled

    def knn_votes(train, labels, test):
        return knn_scores(train, labels, test, num_classes, k, temperature, chunk_size)
    return compiled(knn_votes)


def knn_scores(train_features, train_labels, test_features, num_classes, k, temperature, chunk_size=1024):
    """The weighted kNN scores in ``keras.ops`` (traceable: no host round trip, static shapes), for
    use inside a compiled program. ``train_labels`` int32 ``[N_train]`` (checked by the caller),
    ``k <= N_train``. Returns ``[N_pad, num_classes]`` float32, ``N_pad`` the test rows padded up to
    a multiple of ``chunk_size`` (the padding rows score 0 similarity; drop them). The chunks, of
    ``[chunk_size, N_train]`` similarities each, run one after the other (``ops.map``)."""
    from keras import ops

    def normalize(x):
        x = ops.cast(ops.reshape(x, (int(x.shape[0]), -1)), "float32")
        return x / ops.maximum(ops.sqrt(ops.sum(x * x, axis=1, keepdims=True)), 1e-12)

    train, test = normalize(train_features), normalize(test_features)
    n_test, width = int(test.shape[0]), int(test.shape[1])
    chunks = -(-n_test // chunk_size)
    if chunks * chunk_size > n_test:  # zero rows: one shape for every chunk
        test = ops.pad(test, [[0, chunks * chunk_size - n_test], [0, 0]])
    bank_t = ops.transpose(train)
    labels = ops.convert_to_tensor(train_labels)

    def chunk_scores(chunk):
        sim, idx = ops.top_k(ops.matmul(chunk, bank_t), k)
        weights = ops.exp((sim - 1.0) / temperature)  # shifted by the max cosine for stability
        votes = ops.one_hot(ops.take(labels, idx), num_classes)  # [chunk, k, classes]
        return ops.sum(votes * weights[..., None], axis=1)

    scores = ops.map(chunk_scores, ops.reshape(test, (chunks, chunk_size, width)))
    return ops.reshape(scores, (chunks * chunk_size, num_classes))


def topk_accuracy(scores, labels, ks=(1, 5)) -> dict:
    """Fraction of rows whose label is among the ``k`` highest scores, for each ``k`` in ``ks``.

    Args:
      scores: ``[N, num_classes]`` logits or any scores (higher is better).
      labels: ``[N]`` integer labels in ``[0, num_classes)``.
      ks: the ``k`` values; a ``k`` above ``num_classes`` counts every row as correct.

    Returns:
      ``{"top1": float, "top5": float, ...}`` (fractions in [0, 1]). Ties are broken arbitrarily.
    """
    scores = np.asarray(scores)
    labels = np.asarray(labels).astype(np.int64).reshape(-1)
    if scores.ndim != 2 or len(scores) != len(labels):
        raise ValueError(f"expected scores [N, num_classes] and labels [N]; received shapes "
                         f"{scores.shape} and {labels.shape}")
    if len(labels) == 0:
        raise ValueError("cannot compute an accuracy over 0 examples")
    if labels.min() < 0 or labels.max() >= scores.shape[1]:
        raise ValueError(f"labels must lie in [0, {scores.shape[1]}); received range "
                         f"[{labels.min()}, {labels.max()}]")
    out = {}
    for k in ks:
        if int(k) < 1:
            raise ValueError(f"k must be >= 1; received {k!r}")
        kk = min(int(k), scores.shape[1])
        top = np.argpartition(-scores, kk - 1, axis=1)[:, :kk]
        out[f"top{int(k)}"] = float(np.mean(np.any(top == labels[:, None], axis=1)))
    return out


def knn_accuracy(train_features, train_labels, test_features, test_labels, num_classes, k=200,
                 temperature=0.1, topk=(1,), device=False):
    """Top-k accuracies (fractions in [0, 1]) of the weighted kNN classifier, as a dict."""
    scores = knn_predict(train_features, train_labels, test_features, num_classes, k, temperature, device=device)
    return topk_accuracy(scores, test_labels, topk)
