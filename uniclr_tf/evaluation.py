"""Feature extraction and the kNN / raw-pixel evaluations shared by training, monitor and CLIs."""

import numpy as np

from uniclr_tf import knn


def extract_features(encoder, images, preprocess, batch_size=512):
    """Backbone features of uint8 ``images`` ``[N, H, W, C]`` (inference mode), as float32 NumPy."""
    outputs = []
    for start in range(0, len(images), batch_size):
        x = preprocess(images[start:start + batch_size])
        outputs.append(np.asarray(encoder.predict_on_batch(x), dtype=np.float32))  # compiled, inference BN
    return np.concatenate(outputs, axis=0)


def knn_eval(encoder, preprocess, train, test, num_classes, k=200, temperature=0.1, batch_size=512):
    """Weighted kNN top-1/top-5 of ``encoder`` features; ``train``/``test`` are (images, labels)."""
    train_f = extract_features(encoder, train[0], preprocess, batch_size)
    test_f = extract_features(encoder, test[0], preprocess, batch_size)
    return knn.knn_accuracy(train_f, train[1], test_f, test[1], num_classes, k, temperature, topk=(1, 5))


def raw_pixel_knn(train, test, num_classes, k=200, temperature=0.1):
    """The same weighted kNN on raw pixels: the baseline any learned feature should beat."""
    as_float = lambda a: np.asarray(a, np.float32).reshape(len(a), -1) / 255.0  # noqa: E731
    return knn.knn_accuracy(as_float(train[0]), train[1], as_float(test[0]), test[1], num_classes, k,
                            temperature, topk=(1, 5))
