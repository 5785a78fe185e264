"""uniclr_tf.evaluation.pictures: the views / neighbours / embedding PNGs a run writes, and their TensorBoard
copies. Small data (a few hundred Fashion-MNIST images), a tiny encoder, one JAX subprocess."""

import os
import sys

import numpy as np
import pytest
from PIL import Image

from uniclr_tf.evaluation import pictures

MEAN, STD = (0.2860406,), (0.3530242,)


def png_pixels(path, min_side=300, max_side=2500):
    """Opens ``path`` as a PNG, checks it has a sensible size and is not blank; its pixels."""
    assert os.path.isfile(path), path
    with Image.open(path) as image:
        assert image.format == "PNG"
        width, height = image.size
        pixels = np.asarray(image.convert("RGB"), np.float32)
    assert min_side <= width <= max_side and min_side <= height <= max_side, (width, height)
    assert pixels.std() > 0
    return pixels


@pytest.fixture(scope="module")
def fmnist():
    import keras

    (x_train, y_train), (x_test, y_test) = keras.datasets.fashion_mnist.load_data()
    return (x_train[:400, ..., None], y_train[:400]), (x_test[:120, ..., None], y_test[:120])


@pytest.fixture(scope="module")
def augmenter():
    from uniclr_tf.augment import ViewAugmenter

    return ViewAugmenter.from_recipe("uniclr", (28, 28, 1), num_local=2, mean=MEAN, std=STD,
                                     seed=0)


def test_views_grid_shows_originals_and_every_view(fmnist, augmenter, tmp_path):
    images = fmnist[1][0]
    path = pictures.views_grid(augmenter, images, tmp_path / "views.png", rows=4)
    pixels = png_pixels(path)
    # 4 rows of one original + 2 global + 2 local views: taller than wide, wider than 4 columns
    height, width = pixels.shape[:2]
    assert 500 <= width <= 900 and 500 <= height <= 900


def test_views_are_unnormalised_for_display(fmnist, augmenter):
    """A deterministic view of a 28-px image is the image itself: un-normalising the augmenter's
    output with its mean / std gives the pixels back in [0, 1]."""
    images = fmnist[1][0][:3]
    view = np.asarray(augmenter(images, training=False)[0])
    shown = pictures._unnormalise(view, augmenter)
    np.testing.assert_allclose(shown, images / 255.0, atol=1e-4)
    # defaults of Normalize when the augmenter has no stats: 0.5 / 0.5 for one channel
    class NoStats:
        mean = std = None
    np.testing.assert_allclose(pictures._unnormalise(np.zeros((1, 2, 2, 1)), NoStats()), 0.5)


def test_frame_colours_mark_other_classes():
    colours, fraction = pictures.frame_colours([0, 1], [[0, 2, 0], [1, 1, -1]])
    green, red, grey = pictures.SAME_COLOUR, pictures.OTHER_COLOUR, pictures.UNKNOWN_COLOUR
    assert colours.tolist() == [[green, red, green], [green, green, grey]]
    assert fraction == pytest.approx(4 / 5)  # unknown labels are left out
    assert pictures.frame_colours([-1], [[0, 1]])[1] is None


def hand_made_neighbours():
    """Training points at angles 1°…6° and 90° from a query at 0° (class 0): the 1°, 2°, 4° and
    90° points are of class 0, the 3° point of class 1, the 5° and 6° points of class 2."""
    angles = np.deg2rad([4.0, 2.0, 6.0, 1.0, 3.0, 5.0, 90.0])
    train_features = np.stack([np.cos(angles), np.sin(angles)], axis=1) * np.array(
        [[3.0], [0.5], [1.0], [2.0], [7.0], [1.0], [1.0]])  # norms do not matter (cosine)
    train_labels = np.array([0, 0, 2, 0, 1, 2, 0])
    return train_features, train_labels


def test_nearest_neighbours_by_cosine():
    train_features, _ = hand_made_neighbours()
    index, sims = pictures.nearest_neighbours(train_features, np.array([[5.0, 0.0]]), k=4)
    assert index.tolist() == [[3, 1, 4, 0]]  # 1°, 2°, 3°, 4°
    np.testing.assert_allclose(sims, np.cos(np.deg2rad([[1.0, 2.0, 3.0, 4.0]])), rtol=1e-6)


def test_neighbours_grid_marks_wrong_class_neighbours(tmp_path):
    train_features, train_labels = hand_made_neighbours()
    rng = np.random.default_rng(0)
    train_images = rng.integers(0, 256, (len(train_features), 20, 20, 1), dtype=np.uint8)
    test_images = rng.integers(0, 256, (1, 20, 20, 1), dtype=np.uint8)
    result = pictures.neighbours_grid(train_features, train_images, train_labels,
                                      np.array([[1.0, 0.0]]), test_images, np.array([0]),
                                      tmp_path / "nb.png", k=4, rows=8,
                                      class_names=["zero", "one", "two"])
    assert result.same_class_fraction == pytest.approx(3 / 4)  # 1°, 2°, 4° of class 0; 3° not
    png_pixels(result.path, min_side=150)
    # k=5 takes the 5° point, of class 2: 3 of 5
    result = pictures.neighbours_grid(train_features, train_images, train_labels,
                                      np.array([[1.0, 0.0]]), test_images, np.array([0]),
                                      tmp_path / "nb5.png", k=5, rows=1)
    assert result.same_class_fraction == pytest.approx(3 / 5)
    # no labels: no fraction, still a picture
    result = pictures.neighbours_grid(train_features, train_images, None, np.array([[1.0, 0.0]]),
                                      test_images, None, tmp_path / "nolabels.png", k=3)
    assert result.same_class_fraction is None and os.path.isfile(result.path)


def test_neighbours_grid_on_real_images(fmnist, tmp_path):
    (x_train, y_train), (x_test, y_test) = fmnist
    flat = lambda x: x.reshape(len(x), -1).astype(np.float32)  # noqa: E731 - raw pixels as features
    result = pictures.neighbours_grid(flat(x_train), x_train, y_train, flat(x_test), x_test, y_test,
                                      tmp_path / "nb.png", k=8, rows=8,
                                      class_names=pictures.FASHION_MNIST_CLASSES, seed=3)
    pixels = png_pixels(result.path)
    height, width = pixels.shape[:2]  # 1 + 8 columns of about 1 inch at 110 dpi, 8 rows + titles
    assert 1000 <= width <= 1400 and 1100 <= height <= 1700
    assert 0.3 < result.same_class_fraction <= 1.0  # raw-pixel kNN on Fashion-MNIST: ~75 %
    # the same seed picks the same queries
    again = pictures.neighbours_grid(flat(x_train), x_train, y_train, flat(x_test), x_test, y_test,
                                     tmp_path / "nb2.png", seed=3)
    assert again.same_class_fraction == result.same_class_fraction


def clustered_features(n=150, dims=24, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n)
    centres = rng.normal(size=(classes, dims)) * 3.0
    return centres[labels] + rng.normal(size=(n, dims)), labels


def test_embedding_map_tsne(tmp_path):
    pytest.importorskip("sklearn.manifold")
    features, labels = clustered_features()
    coords, method, note = pictures.project_2d(features, seed=0)
    assert method == "t-SNE" and coords.shape == (150, 2) and "t-SNE" in note
    path = pictures.embedding_map(features, labels, tmp_path / "emb.png",
                                  class_names=["a", "b", "c"], max_points=100)
    png_pixels(path)


def test_embedding_map_falls_back_to_pca_without_sklearn(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)  # `import sklearn...` now raises ImportError
    monkeypatch.setitem(sys.modules, "sklearn.manifold", None)
    features, labels = clustered_features(dims=8)
    coords, method, note = pictures.project_2d(features)
    assert method == "PCA" and coords.shape == (150, 2) and "principal components" in note
    # the first principal component separates the clusters better than noise would
    centred = pictures._l2_normalise(features)
    centred = centred - centred.mean(0)
    top = np.linalg.svd(centred, full_matrices=False)[2][0]
    np.testing.assert_allclose(np.abs(coords[:, 0]), np.abs(centred @ top), rtol=1e-5, atol=1e-6)
    png_pixels(pictures.embedding_map(features, labels, tmp_path / "pca.png"))
    png_pixels(pictures.embedding_map(features, None, tmp_path / "unlabelled.png"))


def test_fashion_mnist_class_names():
    assert len(pictures.FASHION_MNIST_CLASSES) == 10
    assert pictures.FASHION_MNIST_CLASSES[0] == "T-shirt/top"
    assert pictures.FASHION_MNIST_CLASSES[9] == "Ankle boot"


def test_write_run_pictures_png_tensorboard_and_projector(fmnist, augmenter, tmp_path):
    import keras

    from uniclr_tf.augment import EvalPreprocess
    from uniclr_tf.nets.encoders import build_encoder

    if keras.backend.backend() != "tensorflow":
        pytest.skip("TensorBoard part runs on the TF backend")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    encoder = build_encoder("tiny", (28, 28, 1), width=4)
    train, test = fmnist
    out = pictures.write_run_pictures(tmp_path, encoder, EvalPreprocess(28, MEAN, STD), augmenter,
                                      train, test, class_names=pictures.FASHION_MNIST_CLASSES,
                                      max_train=300, max_test=100, batch_size=128)
    for name in ("views", "neighbours", "embedding"):
        assert out[name] == str(tmp_path / f"{name}.png")
        png_pixels(out[name])
    logdir = tmp_path / "tb" / "pictures"
    assert out["tensorboard"] == out["projector"] == str(logdir)

    events = EventAccumulator(str(logdir), size_guidance={"tensors": 0})
    events.Reload()
    tags = set(events.Tags()["tensors"])
    assert tags == {"pictures/views", "pictures/neighbours", "pictures/embedding"}
    for tag in tags:
        assert events.SummaryMetadata(tag).plugin_data.plugin_name == "images"

    config = (logdir / "projector_config.pbtxt").read_text()
    assert 'tensor_path: "features.tsv"' in config and 'metadata_path: "metadata.tsv"' in config
    assert "sprite.png" in config
    features = np.loadtxt(logdir / "features.tsv", delimiter="\t", ndmin=2)
    assert features.shape[0] == 100 and np.isfinite(features).all()
    metadata = (logdir / "metadata.tsv").read_text().splitlines()
    assert metadata[0] == "class\tlabel" and len(metadata) == 101
    assert set(line.split("\t")[0] for line in metadata[1:]) <= set(pictures.FASHION_MNIST_CLASSES)
    with Image.open(logdir / "sprite.png") as sprite:
        assert sprite.size == (10 * 28, 10 * 28)


def test_write_run_pictures_never_fails_the_run(fmnist, augmenter, tmp_path, capsys):
    class Broken:
        def predict_on_batch(self, x):
            raise RuntimeError("no features today\nsecond line")

    out = pictures.write_run_pictures(tmp_path, Broken(), None, augmenter, *fmnist,
                                      tensorboard=False, max_train=50, max_test=20)
    assert set(out) == {"views"} and os.path.isfile(out["views"])
    assert not (tmp_path / "neighbours.png").exists() and not (tmp_path / "embedding.png").exists()
    warning = [line for line in capsys.readouterr().err.splitlines() if "pictures" in line]
    assert len(warning) == 1 and "no features today" in warning[0] and "RuntimeError" in warning[0]
    # nothing usable at all: still no exception
    assert pictures.write_run_pictures(tmp_path / "x", None, None, None, (None, None),
                                       (None, None)) == {}


NO_TF_PICTURES = r"""
import importlib.abc, json, os, sys

class NoTensorFlow(importlib.abc.MetaPathFinder):  # as on the JAX-only GPU machine
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tensorflow", "tensorflow_datasets", "tensorboard"):
            raise ModuleNotFoundError("No module named " + name)

sys.meta_path.insert(0, NoTensorFlow())
import numpy as np
from uniclr_tf.evaluation import pictures
from uniclr_tf.augment import EvalPreprocess, ViewAugmenter
from uniclr_tf.nets.encoders import build_encoder

rng = np.random.default_rng(0)
labels = rng.integers(0, 3, 160)
images = np.zeros((160, 28, 28, 1), np.uint8)
for i, y in enumerate(labels):  # a bright bar whose position is the class
    images[i, :, 4 + 8 * y:10 + 8 * y] = 200
images = np.clip(images + rng.integers(0, 40, images.shape), 0, 255).astype(np.uint8)
augmenter = ViewAugmenter.from_recipe("uniclr", (28, 28, 1), num_local=2, seed=0)
encoder = build_encoder("tiny", (28, 28, 1), width=4)
out = pictures.write_run_pictures({run_dir!r}, encoder, EvalPreprocess(28), augmenter,
                                  (images[:120], labels[:120]), (images[120:], labels[120:]))
assert "tensorflow" not in sys.modules and "tensorboard" not in sys.modules
assert not os.path.exists(os.path.join({run_dir!r}, "tb"))
print(json.dumps(out))
"""


@pytest.fixture(scope="module", autouse=True)
def jax_pictures(tmp_path_factory):
    """The JAX subprocess of the last test, started at the module's first test: its start-up and
    compiles (one core) overlap the in-process tests (~10 s saved on the 2-core machine)."""
    from tests.conftest import PythonJob
    run_dir = tmp_path_factory.mktemp("jax_pictures")
    job = PythonJob(NO_TF_PICTURES.format(run_dir=str(run_dir)), backend="jax")
    yield job
    job.kill()


def test_write_run_pictures_under_jax_without_tensorflow(jax_pictures):
    out = jax_pictures.result()
    assert sorted(out) == ["embedding", "neighbours", "views"]
    for name in out:
        png_pixels(out[name])
