"""Weighted k-nearest-neighbour evaluation (Wu et al. 2018; the usual SSL monitor).

Features are ℓ2-normalised; each test sample votes with its ``k`` most similar training samples,
weighted by ``exp(similarity / T)``. Defaults k=200, T=0.1 (PAPER.md). NumPy only, chunked over
the test set so 60k×10k similarities never sit in memory at once.
"""

import numpy as np


def l2_normalize(x, eps=1e-12):
    x = np.asarray(x, dtype=np.float32).reshape(len(x), -1)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), eps)


def knn_predict(train_features, train_labels, test_features, num_classes, k=200, temperature=0.1,
                chunk_size=1024):
    """Returns class scores ``[N_test, num_classes]`` of the weighted kNN classifier."""
    train = l2_normalize(train_features)
    test = l2_normalize(test_features)
    train_labels = np.asarray(train_labels).astype(np.int64).reshape(-1)
    if len(train) != len(train_labels):
        raise ValueError(f"train_features has {len(train)} rows but train_labels has {len(train_labels)}")
    if train.shape[1] != test.shape[1]:
        raise ValueError(f"feature sizes differ: train {train.shape[1]}, test {test.shape[1]}")
    if train_labels.min() < 0:
        raise ValueError("kNN needs labelled training data; found labels < 0 (unlabelled)")
    k = min(int(k), len(train))
    scores = np.zeros((len(test), num_classes), np.float32)
    for start in range(0, len(test), chunk_size):
        sim = test[start:start + chunk_size] @ train.T
        idx = np.argpartition(-sim, k - 1, axis=1)[:, :k]
        top_sim = np.take_along_axis(sim, idx, axis=1)
        weights = np.exp((top_sim - 1.0) / temperature)  # shifted by the max cosine for stability
        votes = train_labels[idx]
        block = scores[start:start + chunk_size]
        np.add.at(block, (np.arange(len(block))[:, None], votes), weights)
    return scores


def knn_accuracy(train_features, train_labels, test_features, test_labels, num_classes, k=200,
                 temperature=0.1, topk=(1,)):
    """Top-k accuracies (fractions in [0, 1]) of the weighted kNN classifier, as a dict."""
    scores = knn_predict(train_features, train_labels, test_features, num_classes, k, temperature)
    test_labels = np.asarray(test_labels).astype(np.int64).reshape(-1)
    ranked = np.argsort(-scores, axis=1)
    return {f"top{t}": float(np.mean(np.any(ranked[:, :t] == test_labels[:, None], axis=1))) for t in topk}
