"""Encoders: resnet18's stem choice, the Keras Hub ViT (build, pooled features, save/reload, clone for an
EMA target, training with an EMA target, SavedModel export of a ViT run folder)."""

import keras
import numpy as np
import pytest

from uniclr_tf import encoders

TINY_VIT = (32, 2, 2, 64)  # hidden size, layers, heads, MLP size: ViT-Tiny's structure, test-sized


def _images(size, channels=1, batch=2):
    return np.random.default_rng(0).normal(size=(batch, size, size, channels)).astype("float32")


@pytest.mark.parametrize("stem,size,expected", [("auto", 28, "cifar"), ("auto", 63, "cifar"), ("auto", 64, "imagenet"),
                                                ("auto", 224, "imagenet"), ("cifar", 224, "cifar"),
                                                ("imagenet", 32, "imagenet")])
def test_resnet18_stem_choice(stem, size, expected):
    assert encoders.resnet18_stem(stem, size) == expected


def test_resnet18_stems_build_with_the_same_features():
    """The ImageNet stem (7x7 stride 2 + max-pool) is 4x less spatial work; both pool to 8 * width."""
    cifar = encoders.build_encoder("resnet18", (32, 32, 3), width=4, stem="auto")
    imagenet = encoders.build_encoder("resnet18", (64, 64, 3), width=4, stem="auto")
    assert "stem_pool" not in [layer.name for layer in cifar.layers]
    assert "stem_pool" in [layer.name for layer in imagenet.layers]
    assert imagenet.get_layer("stem_conv").kernel_size == (7, 7)
    assert cifar(_images(32, 3)).shape == imagenet(_images(64, 3)).shape == (2, 32)
    with pytest.raises(ValueError, match="encoder_stem"):
        encoders.resnet18_stem("resnet", 32)


def test_vit_builds_saves_reloads_and_clones(tmp_path):
    """A 2-layer ViT at 28 px: pooled ``[B, hidden]`` features; the saved file reloads (in this process:
    the same outputs) and ``clone_model`` (the EMA target) works and, with the weights, gives the same
    outputs (keras-hub 0.32's own patch layer fails both: docs/stack.md)."""
    pytest.importorskip("keras_hub")
    vit = encoders.vit("vit_tiny", (28, 28, 1), dims=TINY_VIT)
    x = _images(28)
    features = np.asarray(vit(x))
    assert features.shape == (2, 32) and np.all(np.isfinite(features))
    assert vit.get_layer("patch_embedding").compute_output_shape((None, 28, 28, 1)) == (None, 50, 32)  # 7x7 + 1

    vit.save(tmp_path / "encoder.keras")
    reloaded = keras.saving.load_model(tmp_path / "encoder.keras", compile=False)
    np.testing.assert_allclose(np.asarray(reloaded(x)), features, atol=1e-6)

    clone = keras.models.clone_model(vit)
    assert not np.allclose(np.asarray(clone(x)), features)  # new layers: other random weights
    clone.set_weights(vit.get_weights())
    np.testing.assert_allclose(np.asarray(clone(x)), features, atol=1e-6)

    with pytest.raises(ValueError, match="multiple of its patch size"):
        encoders.build_encoder("vit_tiny", (30, 30, 1))
    with pytest.raises(ValueError, match="fixed width"):
        encoders.build_encoder("vit_tiny", (28, 28, 1), width=8)


def test_vit_trains_with_an_ema_target():
    """BYOL (an EMA target: ``clone_model`` of the ViT, inside the model) trains a test-sized ViT for 2
    steps; the target's weights move towards the online ones. The train CLI with ``--encoder=vit_tiny``,
    ``uniclr_tf.export`` and its ``--check`` pass too (95 s on 2 cores, run by hand); the export of a ViT
    run folder is tested below."""
    pytest.importorskip("keras_hub")
    from uniclr_tf import heads, methods
    from uniclr_tf.model import UniCLR

    keras.utils.set_random_seed(0)
    method = methods.get("byol")()
    vit = encoders.vit("vit_tiny", (28, 28, 1), dims=TINY_VIT)
    projector = method.build_projector(32, (32, 16))
    model = UniCLR(vit, projector, heads.predictor(16, 32), method=method, ema_total_steps=10)
    model.compile(optimizer=keras.optimizers.SGD(0.05))
    views = (_images(28, batch=8), _images(28, batch=8) + 0.1)
    assert model.target_encoder is not None
    before = [np.asarray(w) for w in model.target_encoder.weights]

    def data():
        while True:
            yield views

    history = model.fit(data(), epochs=1, steps_per_epoch=2, verbose=0).history
    assert np.all(np.isfinite(history["objective_loss"]))
    after = [np.asarray(w) for w in model.target_encoder.weights]
    assert any(not np.allclose(a, b) for a, b in zip(before, after))


def test_vit_run_exports_a_savedmodel_that_matches_keras(tmp_path):
    """A test-sized ViT run folder (as the train CLI leaves it) exports to a SavedModel whose features and
    embedding match the Keras models (``export.check_export``, which reloads it with
    ``tf.saved_model.load``); the patch embedding and class token survive the TF graph."""
    pytest.importorskip("keras_hub")
    if keras.backend.backend() != "tensorflow":
        pytest.skip("the SavedModel export needs the TensorFlow backend")
    import json
    import os
    from uniclr_tf import export, heads
    from uniclr_tf.config import TrainConfig
    run_dir, out_dir = str(tmp_path / "run"), str(tmp_path / "export")
    os.makedirs(run_dir)
    keras.utils.set_random_seed(0)
    vit = encoders.vit("vit_tiny", (28, 28, 1), dims=TINY_VIT)
    projector = heads.projector(vit.output_shape[-1], (32, 8))
    vit.save(os.path.join(run_dir, "encoder.keras"))
    projector.save(os.path.join(run_dir, "projector.keras"))
    with open(os.path.join(run_dir, "dataset.json"), "w") as f:
        json.dump({"dataset": "fashion_mnist", "image_shape": [28, 28, 1], "num_classes": 10, "mean": [0.286],
                   "std": [0.353], "num_train": 60000}, f)
    with open(os.path.join(run_dir, "config.json"), "w") as f:
        f.write(TrainConfig.make(encoder="vit_tiny", projector_dims=(32, 8)).to_json())
    export.export_run(run_dir, out_dir, version=1)
    result = export.check_export(out_dir, run_dir, num_images=4)
    assert result["ok"], result["checks"]
    assert {"train_size/features", "train_size/embedding", "backbone.keras/features"} <= set(result["checks"])
