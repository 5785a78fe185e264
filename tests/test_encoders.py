"""Encoders: resnet18's stem choice, the Keras Hub ViT (build, pooled features, save/reload, clone for an
EMA target, training with an EMA target, SavedModel export of a ViT run folder)."""

import keras
import numpy as np
import pytest

from uniclr_tf.nets import encoders

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


@pytest.mark.parametrize("name", ["vit_tiny", "hub_resnet18"])
def test_keras_hub_encoders_train_with_an_ema_target(name):
    """BYOL (an EMA target: ``clone_model`` of the encoder, inside the model) trains a test-sized ViT at
    28 px and Keras Hub's ResNet-18 at 64 px for 2 steps; the target's weights move towards the online
    ones. The train CLI with ``--encoder=vit_tiny`` or ``hub_resnet18``, ``uniclr_tf.export`` and its
    ``--check`` pass too (80-95 s on 2 cores, run by hand); the export of a ViT run folder is tested below."""
    pytest.importorskip("keras_hub")
    from uniclr_tf import methods
    from uniclr_tf.nets import heads
    from uniclr_tf.nets.model import UniCLR

    keras.utils.set_random_seed(0)
    method = methods.get_class("byol")()
    if name == "vit_tiny":
        encoder, size, channels = encoders.vit(name, (28, 28, 1), dims=TINY_VIT), 28, 1
    else:
        encoder, size, channels = encoders.build_encoder(name, (64, 64, 3)), 64, 3
    projector = method.build_projector(encoder.output_shape[-1], (32, 16))
    model = UniCLR(encoder, projector, heads.predictor(16, 32), method=method, ema_total_steps=10)
    model.compile(optimizer=keras.optimizers.SGD(0.05))
    views = (_images(size, channels, batch=8), _images(size, channels, batch=8) + 0.1)
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
    from uniclr_tf.serving import export
    from uniclr_tf.nets import heads
    from uniclr_tf.config.train_config import TrainConfig
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


def test_config_lists_the_same_encoders():
    from uniclr_tf.config import train_config as config
    assert config.ENCODERS == encoders.ENCODERS


def _batch_norms(model):
    return [layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)]


def test_hub_resnet18_builds_saves_reloads_and_clones(tmp_path):
    """Keras Hub's ResNet-18 (ImageNet stem: 7x7 stride-2 conv, max-pool) pools 512-d features at any image
    size; its saved file holds Keras core layers only (it reloads without Keras Hub), and clone_model (an
    EMA target) gives the same outputs with the same weights."""
    pytest.importorskip("keras_hub")
    keras.utils.set_random_seed(0)
    model = encoders.build_encoder("hub_resnet18", (64, 64, 3))
    x = _images(64, 3)
    features = np.asarray(model(x, training=False))
    assert features.shape == (2, 512) and np.all(np.isfinite(features))
    assert model(_images(32, 3), training=False).shape == (2, 512)  # local crops: spatial size left free
    convs = [layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D)]
    assert convs[0].kernel_size == (7, 7) and convs[0].strides == (2, 2)
    assert any(isinstance(layer, keras.layers.MaxPooling2D) for layer in model.layers)
    assert len(_batch_norms(model)) == 20  # stem + 2 per basic block x 8 + 3 shortcut projections
    # torchvision's ResNet-18 without its classifier: 11,176,512 weights, + 2 x 4,800 BN moving statistics
    assert model.count_params() == 11_176_512 + 2 * 4_800

    model.save(tmp_path / "encoder.keras")
    import zipfile
    with zipfile.ZipFile(tmp_path / "encoder.keras") as archive:
        assert b"keras_hub" not in archive.read("config.json")
    reloaded = keras.saving.load_model(tmp_path / "encoder.keras", compile=False)
    np.testing.assert_allclose(np.asarray(reloaded(x, training=False)), features, rtol=1e-5, atol=1e-5)
    clone = keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    np.testing.assert_allclose(np.asarray(clone(x, training=False)), features, rtol=1e-5, atol=1e-5)

    with pytest.raises(ValueError, match="fixed width"):
        encoders.build_encoder("hub_resnet18", (64, 64, 3), width=32)


@pytest.mark.parametrize("name", ["hub_resnet50", "resnet50"])
def test_other_libraries_backbones_follow_the_batch_norm_option(name):
    """Keras Hub's and keras.applications' ResNet-50: built with a grouped or one-pass ``BatchNorm`` factory
    (``--batch_norm=per_device`` or ``global_one_pass`` on JAX) every batch norm becomes a
    GroupBatchNormalization with that setting, as in our own backbones; with the plain one, Keras' own. 2048-d features either way.
    One-pass batch norms take in the ReLU after them and compute the same features."""
    if name.startswith("hub_"):
        pytest.importorskip("keras_hub")
    plain = encoders.build_encoder(name, (64, 64, 3))
    assert plain.output_shape == (None, 2048)
    assert not any(isinstance(b, encoders.GroupBatchNormalization) for b in _batch_norms(plain))
    grouped = encoders.build_encoder(name, (64, 64, 3), norm=encoders.BatchNorm(groups=2))
    one_pass = encoders.build_encoder(name, (64, 64, 3), norm=encoders.BatchNorm(one_pass=True))
    assert len(_batch_norms(grouped)) == len(_batch_norms(one_pass)) == len(_batch_norms(plain)) == 53
    assert all(isinstance(b, encoders.GroupBatchNormalization) and b.groups == 2 and not b.one_pass
               for b in _batch_norms(grouped))
    assert all(b.groups == 1 and b.one_pass for b in _batch_norms(one_pass))
    assert [b.epsilon for b in _batch_norms(grouped)] == [b.epsilon for b in _batch_norms(plain)]
    assert grouped.count_params() == plain.count_params()
    # one-pass batch norm takes in the ReLU after it (the stem's and each bottleneck's first two: one layer
    # fewer each) and at each of the 16 blocks' ends the sum and the ReLU (two fewer): the same function
    # with the same weights, in the same order
    fused = [b.name for b in _batch_norms(one_pass) if b.relu]
    assert len(fused) == 33 + 16 and not any(getattr(b, "relu", False) for b in _batch_norms(grouped))
    assert len(plain.layers) - len(one_pass.layers) == 33 + 2 * 16
    plain.set_weights(one_pass.get_weights())
    images = _images(64, 3)
    np.testing.assert_allclose(np.asarray(one_pass(images, training=False)), np.asarray(plain(images, training=False)),
                               rtol=1e-5, atol=1e-5)


def test_convolution_biases_that_batch_norm_cancels_are_dropped():
    """keras.applications' ResNet-50 gives each of its 53 convolutions a bias, which the batch norm after it
    cancels: the encoder drops them (torchvision's 23,508,032 weights + 2 x 26,560 moving statistics). With
    the same kernels and batch-norm weights, the biased model computes the same features in training, and
    in inference when its moving means hold the bias. A bias before an activation, on an output that
    also feeds something else or that the model returns, or of a convolution called twice, stays."""
    base = keras.applications.ResNet50(weights=None, include_top=False, pooling="avg", input_shape=(None, None, 3))
    names = encoders.cancelled_biases(base)
    assert len(names) == 53 and "conv1_conv" in names and "conv5_block3_0_conv" not in names
    ours = encoders.build_encoder("resnet50", (64, 64, 3))
    assert not any(getattr(layer, "use_bias", False) for layer in ours.layers if isinstance(layer, keras.layers.Conv2D))
    assert ours.count_params() == 23_508_032 + 2 * 26_560

    rng = np.random.default_rng(0)
    for layer in (layer for layer in ours.layers if layer.weights):  # the base's weights, its biases random
        weights = base.get_layer(layer.name).get_weights()
        if layer.name in names:
            base.get_layer(layer.name).set_weights([weights[0], rng.normal(size=weights[1].shape).astype("float32")])
            weights = weights[:1]
        elif isinstance(layer, keras.layers.BatchNormalization):
            weights = [rng.normal(size=w.shape).astype("float32") for w in weights[:2]] + weights[2:]
            base.get_layer(layer.name).set_weights(weights)
        layer.set_weights(weights)
    x = _images(64, channels=3, batch=4)
    trained = np.asarray(ours(x, training=True))
    np.testing.assert_allclose(np.asarray(base(x, training=True)), trained, rtol=1e-4, atol=1e-4 * np.abs(trained).max())
    for name in names:  # the moving means as the biased model would hold them
        consumer = base.get_layer(name)._outbound_nodes[0].operation
        mean = ours.get_layer(consumer.name).moving_mean
        consumer.moving_mean.assign(np.asarray(mean) + base.get_layer(name).bias.numpy())
    served = np.asarray(ours(x, training=False))
    np.testing.assert_allclose(np.asarray(base(x, training=False)), served, rtol=1e-4, atol=1e-4 * np.abs(served).max())

    inputs = keras.Input((8, 8, 3))
    a = keras.layers.BatchNormalization()(keras.layers.Conv2D(4, 3, name="into_bn")(inputs))
    b = keras.layers.ReLU()(keras.layers.Conv2D(4, 3, name="into_relu")(inputs))
    c = keras.layers.Conv2D(4, 3, name="two_consumers")(inputs)
    d = keras.layers.Conv2D(4, 3, activation="relu", name="activated")(inputs)
    outputs = keras.layers.Add()([a, b, keras.layers.BatchNormalization()(c), c, keras.layers.BatchNormalization()(d)])
    assert encoders.cancelled_biases(keras.Model(inputs, outputs)) == {"into_bn"}
    returned, shared = keras.layers.Conv2D(4, 3, name="returned"), keras.layers.Conv2D(3, 1, name="shared")
    e, f = returned(inputs), shared(shared(inputs))
    model = keras.Model(inputs, [keras.layers.BatchNormalization()(e), e, keras.layers.BatchNormalization()(f)])
    assert encoders.cancelled_biases(model) == set()
    assert encoders.with_our_layers(model) is model


def test_keras_hub_encoders_say_what_is_missing(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "keras_hub", None)  # import keras_hub -> ImportError
    for name in ("hub_resnet18", "vit_tiny"):
        with pytest.raises(ValueError, match=f"--encoder={name} needs Keras Hub"):
            encoders.build_encoder(name, (64, 64, 3))
