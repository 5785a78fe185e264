"""Weighted kNN against a brute-force reference, and its edge cases."""

import numpy as np
import pytest

from uniclr_tf import knn


def brute_force_scores(train, labels, test, num_classes, k, temperature):
    train = train / np.linalg.norm(train, axis=1, keepdims=True)
    test = test / np.linalg.norm(test, axis=1, keepdims=True)
    scores = np.zeros((len(test), num_classes))
    for i, q in enumerate(test):
        sim = train @ q
        for j in np.argsort(-sim)[:k]:
            scores[i, labels[j]] += np.exp(sim[j] / temperature)
    return scores


def test_knn_scores_match_brute_force_up_to_a_row_scale():
    rng = np.random.default_rng(3)
    train, test = rng.normal(size=(300, 8)), rng.normal(size=(50, 8))
    labels = rng.integers(0, 4, 300)
    got = knn.knn_predict(train, labels, test, 4, k=20, temperature=0.1, chunk_size=16)
    ref = brute_force_scores(train, labels, test, 4, 20, 0.1)
    # knn_predict shifts the exponent by the maximal cosine (1) for stability: a constant factor.
    np.testing.assert_allclose(got * np.exp(1 / 0.1), ref, rtol=1e-4)
    acc = knn.knn_accuracy(train, labels, test, labels[:50], 4, k=20, topk=(1, 4))
    assert acc["top4"] == 1.0 and acc["top1"] == np.mean(np.argmax(ref, 1) == labels[:50])
    # The same on the Keras backend's device (similarities and top-k in keras.ops).
    on_device = knn.knn_predict(train, labels, test, 4, k=20, temperature=0.1, chunk_size=16, device=True)
    np.testing.assert_allclose(on_device * np.exp(1 / 0.1), ref, rtol=1e-4)


def test_separable_clusters_are_classified_perfectly():
    rng = np.random.default_rng(0)
    centers = np.eye(3) * 10
    labels = np.repeat(np.arange(3), 40)
    train = centers[labels] + rng.normal(size=(120, 3))
    test = centers[labels[::4]] + rng.normal(size=(30, 3))
    assert knn.knn_accuracy(train, labels, test, labels[::4], 3, k=10)["top1"] == 1.0


def test_bad_inputs_name_the_problem():
    with pytest.raises(ValueError, match="rows"):
        knn.knn_predict(np.ones((3, 2)), np.zeros(4), np.ones((1, 2)), 2)
    with pytest.raises(ValueError, match="unlabelled"):
        knn.knn_predict(np.ones((3, 2)), -np.ones(3), np.ones((1, 2)), 2)
    with pytest.raises(ValueError, match="labels must lie"):
        knn.topk_accuracy(np.ones((2, 3)), np.array([0, 3]))
