"""Weighted kNN against a brute-force reference, and its edge cases."""

import numpy as np
import pytest

from uniclr_tf.evaluation import knn


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


def test_knn_on_device_tensors_matches_brute_force():
    """knn_predict_tensors (features already on the device; the whole vote in keras.ops) against the
    float64 brute force, with a padded last chunk; the same validation of its inputs."""
    from keras import ops
    rng = np.random.default_rng(4)
    train, test = rng.normal(size=(300, 8)), rng.normal(size=(50, 8))
    labels = rng.integers(0, 4, 300)
    got = knn.knn_predict_tensors(ops.convert_to_tensor(train.astype("float32")), labels,
                                  ops.convert_to_tensor(test.astype("float32")), 4, k=20, temperature=0.1,
                                  chunk_size=16)
    np.testing.assert_allclose(got * np.exp(1 / 0.1), brute_force_scores(train, labels, test, 4, 20, 0.1), rtol=1e-4)
    with pytest.raises(ValueError, match="rows"):
        knn.knn_predict_tensors(ops.ones((3, 2)), [0, 1], ops.ones((1, 2)), 2)
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        knn.knn_predict_tensors(ops.ones((2, 2)), [0, 5], ops.ones((1, 2)), 2)


def test_jax_knn_monitor_keeps_features_on_the_device(run_python):
    """On JAX, knn_eval's fast path (features computed and voted on the device) gives the accuracies
    of the host path (extract_features + NumPy kNN) for a real encoder, with a ragged last batch."""
    out = run_python("""
import numpy as np
from uniclr_tf.evaluation import features as evaluation, knn
from uniclr_tf.augment import EvalPreprocess
from uniclr_tf.nets.encoders import build_encoder
rng = np.random.default_rng(0)
x = rng.integers(0, 256, (300, 16, 16, 1), dtype=np.uint8); y = rng.integers(0, 3, 300)
x[y == 1, :8] = 255; x[y == 2, 8:] = 0
enc = build_encoder("tiny", (16, 16, 1), width=8)
pre = EvalPreprocess(16, [0.5], [0.25])
train, test = (x[:220], y[:220]), (x[220:], y[220:])
assert evaluation._features_stay_on_device(train)
fast = evaluation.knn_eval(enc, pre, train, test, 3, k=15, batch_size=64)
f_train, _ = evaluation.extract_features(enc, pre, train, 64)
f_test, _ = evaluation.extract_features(enc, pre, test, 64)
np.testing.assert_allclose(np.asarray(evaluation.device_features(enc, pre, train[0], 64)), f_train, rtol=1e-4, atol=1e-5)
slow = knn.knn_accuracy(f_train, train[1], f_test, test[1], 3, k=15, topk=(1, 5))
assert fast == slow, (fast, slow)
import json; print(json.dumps(fast))
""", backend="jax")
    assert 0.0 <= out["top1"] <= out["top5"] <= 1.0


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
