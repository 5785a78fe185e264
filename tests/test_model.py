"""UniCLR model wiring: the objective it computes, EMA target, view pairs, TF/JAX parity."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import HANDOFF, run_python_snippets
from uniclr_tf import objectives
from uniclr_tf.nets import encoders
from uniclr_tf.nets import heads
from uniclr_tf.nets.model import UniCLR, unpack
from uniclr_tf.training.schedules import momentum_schedule


def small_model(objective="simtrace", predictor=False, ema=None, total=10, num_classes=None, **kw):
    keras.utils.set_random_seed(1)
    enc = encoders.build_encoder("tiny", (16, 16, 1), width=4)
    proj = heads.projector(16, (32, 8))
    pred = heads.predictor(8, 16) if predictor else None
    return UniCLR(enc, proj, pred, method=objective, options={"ema_momentum": ema, **kw}, ema_total_steps=total,
                  num_classes=num_classes)


def views(batch=16, seed=0, local=0):
    rng = np.random.default_rng(seed)
    v1 = rng.normal(size=(batch, 16, 16, 1)).astype("float32")
    out = [v1, (v1 + 0.3 * rng.normal(size=v1.shape)).astype("float32")]
    out += [rng.normal(size=(batch, 8, 8, 1)).astype("float32") for _ in range(local)]
    return tuple(out)


@pytest.mark.parametrize("objective", ["simaffinity", "simwhitening", "simtrace"])
def test_compute_objective_is_the_objective_of_the_two_views(objective):
    model = small_model(objective)
    v = views()
    loss, logs = model.compute_objective(v, training=False)
    z1 = model.projector(model.encoder(v[0]))
    z2 = model.projector(model.encoder(v[1]))
    gamma = 0.01 * 512 / 16  # the symmetric term scaled to the reference batch of 512 rows (16 here)
    kwargs = {"simaffinity": dict(temperature=0.5, gamma=gamma), "simwhitening": dict(temperature=1.0, gamma=gamma, eps=1e-4),
              "simtrace": dict(eps=1e-4)}[objective]
    loss_fn = {"simaffinity": objectives.sim_affinity_loss, "simwhitening": objectives.sim_whitening_loss,
               "simtrace": objectives.sim_trace_loss}[objective]
    expected, terms = loss_fn(z1, z2, return_terms=True, **kwargs)
    np.testing.assert_allclose(float(loss), float(expected), rtol=1e-5, atol=1e-6)
    assert set(terms) <= set(logs)
    for name, value in terms.items():
        np.testing.assert_allclose(float(logs[name]), float(value), rtol=1e-5, atol=1e-6)
    if objective != "simtrace":
        np.testing.assert_allclose(float(logs["cross_entropy"]) + gamma * float(logs["symmetry"]), float(loss), rtol=1e-5)
    assert float(logs["embedding_std"]) > 0


def test_multicrop_loss_is_mean_over_pairs():
    model = small_model("simaffinity", predictor=True)
    v = views(local=2)
    loss, _ = model.compute_objective(v, training=False)
    z = [model.predictor(model.projector(model.encoder(x))) for x in v]
    t = [model.projector(model.encoder(x)) for x in v[:2]]
    pairs = model.view_pairs(4)
    assert pairs == [(0, 1), (1, 0), (2, 0), (2, 1), (3, 0), (3, 1)]
    # the symmetric term on the global pairs only, scaled to the reference batch (512 / 16 rows)
    expected = np.mean([float(objectives.sim_affinity_loss(z[i], t[j], gamma=0.32 if i < 2 else 0.0))
                        for i, j in pairs])
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)


def test_wmse_all_pairs_compares_the_local_crops_with_each_other_too():
    """W-MSE's own code compares every pair of its d views; ``wmse_all_pairs`` does, local crops included,
    each local crop's own embedding its target; without it each local crop meets the global views only.
    Either way the loss is the mean of ``wmse_loss`` over the pairs, though each view is whitened once."""
    v = views(local=2)
    default = small_model("wmse")
    assert default.view_pairs(4) == [(0, 1), (2, 0), (2, 1), (3, 0), (3, 1)]
    z = [default.projector(default.encoder(x)) for x in v]
    np.testing.assert_allclose(float(default.compute_objective(v, training=False)[0]),
                               np.mean([float(objectives.wmse_loss(z[i], z[j], whitening_size=16))
                                        for i, j in default.view_pairs(4)]), rtol=1e-5)
    model = small_model("wmse", wmse_all_pairs=True)
    pairs = model.view_pairs(4)
    assert pairs == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    loss, _ = model.compute_objective(v, training=False)
    z = [model.projector(model.encoder(x)) for x in v]
    expected = [float(objectives.wmse_loss(z[i], z[j], eps=1e-4, whitening_size=16)) for i, j in pairs]
    np.testing.assert_allclose(float(loss), np.mean(expected), rtol=1e-5)
    assert abs(np.mean(expected) - np.mean(expected[:-1])) > 1e-6   # the local pair (2, 3) counts
    # and trains: the local pair's gradient reaches the weights through both of its views
    model.compile(optimizer=keras.optimizers.SGD(0.05))
    before = [np.array(w) for w in model.trainable_weights]
    logs = model.train_on_batch(v, return_dict=True)
    assert np.isfinite(logs["loss"])
    assert any(np.abs(np.array(w) - b).max() > 0 for w, b in zip(model.trainable_weights, before))


def test_view_pairs_without_predictor_or_ema_are_unordered():
    model = small_model()
    assert model.view_pairs(2) == [(0, 1)]
    assert model.view_pairs(3) == [(0, 1), (2, 0), (2, 1)]


def test_unpack_distinguishes_views_and_labels():
    v = views()
    labels = np.arange(16)
    assert unpack(v)[1] is None and len(unpack(v)[0]) == 2
    x, y = unpack((v, labels))
    assert y is labels and len(x) == 2
    x, y = unpack((v[0], labels))
    assert y is labels and x is v[0]
    # keras.datasets' [B, 1] labels and one-hot labels are class ids too, not a second view
    for given in (labels[:, None], np.eye(16, dtype="float32")[labels]):
        x, y = unpack((v[0], given))
        assert x is v[0] and np.array_equal(np.asarray(y), labels), given.shape
    x, y = unpack({"images": v[0], "labels": labels[:, None]})
    assert np.array_equal(np.asarray(y), labels)


def test_the_probe_learns_the_same_from_labels_in_any_of_their_forms():
    model = small_model("simtrace", num_classes=3)
    labels = np.arange(16) % 3
    losses = [float(model.compute_objective((views(), given), training=False)[1]["probe_loss"])
              for given in (labels, labels[:, None], np.eye(3, dtype="float32")[labels])]
    assert losses[0] == pytest.approx(losses[1], rel=1e-6) and losses[0] == pytest.approx(losses[2], rel=1e-6)
    # fit one form after another: the TF step traced again for a later form sees labels of unknown rank
    model.compile(optimizer=keras.optimizers.SGD(0.01))
    for given in (labels[:, None], np.eye(3, dtype="float32")[labels], labels):
        hist = model.fit(views(), given, batch_size=16, epochs=1, verbose=0).history
        assert np.isfinite(hist["probe_loss"][0]), given.shape


def test_ema_target_starts_as_exact_copy():
    model = small_model(ema=0.99)
    online = model.encoder.get_weights() + model.projector.get_weights()
    target = model.target_encoder.get_weights() + model.target_projector.get_weights()
    assert len(online) == len(target)
    for o, t in zip(online, target):
        np.testing.assert_array_equal(o, t)
    assert not any(v.trainable for v in model.target_encoder.weights)
    ids = {id(v) for v in model.trainable_variables}
    assert not any(id(v) in ids for v in model.target_encoder.weights)


@pytest.mark.parametrize("steps_per_execution", [1, 3])
def test_ema_updates_every_step_matches_closed_form(steps_per_execution):
    """With lr = 0 the online weights o stay fixed, so t_k = o + prod(m_i) (t_0 - o) exactly.
    A callback-based update would skip steps when steps_per_execution > 1 and fail this."""
    total, k = 20, 6
    model = small_model(ema=0.9, total=total)
    model.compile(optimizer=keras.optimizers.SGD(0.0), steps_per_execution=steps_per_execution)
    for t in model.target_encoder.weights + model.target_projector.weights:
        t.assign(t + 1.0)
    pairs = [(np.array(t), np.array(o)) for t, o in model._ema_pairs]
    ds = tf.data.Dataset.from_tensors(views()).repeat()
    model.fit(ds, epochs=1, steps_per_epoch=k, verbose=0)
    prod = np.prod([float(momentum_schedule(i, total, 0.9)) for i in range(k)])
    for (t0, o), (t, _) in zip(pairs, model._ema_pairs):
        np.testing.assert_allclose(np.array(t), o + prod * (t0 - o), rtol=1e-5, atol=1e-6)


def test_fit_reports_terms_and_probe():
    model = small_model("simwhitening", predictor=True, ema=0.99, num_classes=3)
    model.compile(optimizer=keras.optimizers.SGD(0.05))
    labels = np.arange(16) % 3
    ds = tf.data.Dataset.from_tensors((views(local=1), labels)).repeat()
    hist = model.fit(ds, epochs=2, steps_per_epoch=2, verbose=0).history
    for key in ("loss", "objective_loss", "cross_entropy", "symmetry", "embedding_std", "probe_loss",
                "probe_accuracy", "ema_momentum"):
        assert key in hist and np.all(np.isfinite(hist[key])), key
    assert hist["ema_momentum"][0] >= 0.99


def test_an_ema_schedule_left_open_ends_with_each_fit_so_the_target_keeps_moving():
    """``ema_total_steps=None``: the first fit's momentum rises to 1 at its last step; a second fit
    (``initial_epoch=1``, as docs/api.md continues) extends the schedule over its own steps, so its
    momentum is under 1 and the target moves, where a schedule kept from the first fit froze it."""
    model = small_model("simtrace", predictor=True, ema=0.9, total=None)
    model.compile(optimizer=keras.optimizers.SGD(0.05))
    ds = tf.data.Dataset.from_tensors(views()).repeat()
    first = model.fit(ds, epochs=1, steps_per_epoch=4, verbose=0).history["ema_momentum"]
    assert model.ema_total_steps == 4 and first[0] < 1.0
    target = [np.array(t) for t, _ in model._ema_pairs]
    second = model.fit(ds, epochs=2, initial_epoch=1, steps_per_epoch=4, verbose=0).history["ema_momentum"]
    assert model.ema_total_steps == 8
    # the mean logged momentum of steps 5..8 of BYOL's cosine over 8 steps
    want = np.mean([float(momentum_schedule(i, 8, 0.9)) for i in range(4, 8)])
    assert second[0] == pytest.approx(want, rel=1e-5) and second[0] < 1.0
    assert max(np.max(np.abs(np.array(t) - t0)) for (t, _), t0 in zip(model._ema_pairs, target)) > 1e-6
    assert model.get_config()["ema_total_steps"] is None  # a reloaded model sets it from its next fit


def test_evaluate_and_validation_are_refused_with_what_to_use_instead():
    model = small_model("byol", predictor=True, ema=0.99, total=None)
    assert float(model.current_ema_momentum()) == pytest.approx(0.99)  # before compile: the base
    model.compile(optimizer=keras.optimizers.SGD(0.05))
    before = [np.array(w) for w in model.weights]
    with pytest.raises(NotImplementedError, match=r"UniCLR.evaluate: .*uniclr_tf.knn_eval"):
        model.evaluate(views(), verbose=0)
    for kwargs in ({"validation_split": 0.25}, {"validation_data": (views(),)}):
        with pytest.raises(ValueError, match=rf"UniCLR.fit: {next(iter(kwargs))} is not supported.*KNNMonitor"):
            model.fit(views(), batch_size=8, epochs=1, verbose=0, **kwargs)
    assert all(np.array_equal(b, np.array(w)) for b, w in zip(before, model.weights))  # nothing trained


def test_a_wmse_batch_too_small_for_its_sub_batches_is_refused_by_the_api_as_by_the_cli():
    """W-MSE whitens sub-batches that must exceed the embedding size: 16 rows against 32 features is
    refused at the first step, naming what to change, instead of training on a singular covariance."""
    keras.utils.set_random_seed(1)
    model = UniCLR(encoders.build_encoder("tiny", (16, 16, 1), width=4), heads.projector(16, (32, 32)), method="wmse")
    model.compile(optimizer=keras.optimizers.SGD(0.05))
    with pytest.raises(ValueError, match=r"whitening_size=16.*exceed the embedding size 32.*batch size given to fit"):
        model.fit(views(), batch_size=16, epochs=1, verbose=0)


def test_uint8_images_and_unit_floats_are_refused_where_they_would_go_wrong_silently():
    """``model(uint8)``/``predict`` would give features of unnormalised pixels, floats in [0, 1] would be
    divided by 255 again by the augmenter, and a batch of one row has a constant loss: each is named."""
    from uniclr_tf.augment import ViewAugmenter
    images = np.random.default_rng(0).integers(0, 256, (16, 16, 16, 1), dtype="uint8")
    model = small_model("simclr")
    with pytest.raises(TypeError, match=r"received uint8 images.*EvalPreprocess"):
        model.predict(images, verbose=0)
    keras.utils.set_random_seed(1)
    model = UniCLR(encoders.build_encoder("tiny", (16, 16, 1), width=4), heads.projector(16, (32, 8)), method="simclr",
                   augmenter=ViewAugmenter.from_recipe("simclr", (16, 16, 1)))
    model.compile(optimizer=keras.optimizers.SGD(0.05))
    with pytest.raises(ValueError, match=r"floats in \[0, 1\].*input_scale=255.*input_scale=1.0"):
        model.fit(images / 255.0, batch_size=8, epochs=1, verbose=0)
    with pytest.warns(UserWarning, match="a batch of 1 row teaches nothing"):
        model.fit(images[:1], batch_size=1, epochs=1, verbose=0)
    assert np.isfinite(model.fit(images.astype("float32"), batch_size=8, epochs=1, verbose=0).history["loss"][0])


def test_fit_trains_arrays_in_whole_batches_reshuffled_each_epoch():
    """In-memory images train as the CLI's pipeline does: whole batches only, a new order each epoch
    (so the rows left out change), a function of the seed and the epoch alone; on TensorFlow with a
    static batch size, which W-MSE's sub-batches need (a partial last batch made its traced step
    fail). A fit continued at ``initial_epoch`` meets the batches of an uninterrupted one.
    ``drop_remainder=False`` gives Keras's batching back; too few images for one batch, rows that
    disagree, and sample weights (no term of the loss is a sample's own) are named."""
    from uniclr_tf.augment import ViewAugmenter
    from uniclr_tf.training.whole_batches import WholeBatches
    ids = np.arange(70)
    batches = WholeBatches(ids, ids % 3, batch_size=32, seed=5)
    epochs = []
    for _ in range(3):
        epoch = [batches[i] for i in range(len(batches))]
        assert len(epoch) == 2 and all(x.shape == (32,) and np.array_equal(y, x % 3) for x, y in epoch)
        rows = np.concatenate([x for x, _ in epoch])
        assert len(set(rows)) == 64
        epochs.append(rows)
        batches.on_epoch_end()
    assert len({frozenset(set(ids) - set(rows)) for rows in epochs}) == 3  # other rows left out each epoch
    later = WholeBatches(ids, ids % 3, batch_size=32, seed=5, epoch=2)  # epoch 2 alone: its order
    assert np.array_equal(np.concatenate([later[0][0], later[1][0]]), epochs[2])
    ordered = WholeBatches([ids, -ids], batch_size=32, shuffle=False)  # a list of views, in order
    assert isinstance(ordered[1][0], tuple) and np.array_equal(ordered[1][0][1], -ids[32:64])
    assert isinstance(WholeBatches({"views": [ids, -ids]}, batch_size=32)[0][0]["views"], tuple)
    batches = WholeBatches(ids, ids % 3, batch_size=32, seed=5)
    data = batches.as_tf_dataset()
    assert data.element_spec[0].shape.as_list() == [32]
    passes = []
    for epoch in range(2):
        batches.epoch = epoch
        passes.append(np.concatenate([x.numpy() for x, _ in data]))
    assert np.array_equal(passes[0], epochs[0]) and np.array_equal(passes[1], epochs[1])

    images = np.random.default_rng(0).integers(0, 256, (100, 16, 16, 1), dtype="uint8")
    keras.utils.set_random_seed(1)
    model = UniCLR(encoders.build_encoder("tiny", (16, 16, 1), width=4), heads.projector(16, (32, 8)), method="wmse",
                   augmenter=ViewAugmenter.from_recipe("simclr", (16, 16, 1)))
    model.compile(optimizer=keras.optimizers.SGD(0.01))
    steps = []
    counter = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: steps.append(batch))
    history = model.fit(images, batch_size=32, epochs=2, verbose=0, callbacks=[counter]).history
    assert steps == [0, 1, 2] * 2 and np.all(np.isfinite(history["loss"]))
    model.fit({"images": images}, batch_size=32, epochs=1, verbose=0)  # a dict of arrays too, with or without y
    model.fit({"images": images}, np.arange(100) % 3, batch_size=32, epochs=1, verbose=0)
    steps.clear()
    model = UniCLR(encoders.build_encoder("tiny", (16, 16, 1), width=4), heads.projector(16, (32, 8)),
                   method="simclr", augmenter=ViewAugmenter.from_recipe("simclr", (16, 16, 1)))
    model.compile(optimizer=keras.optimizers.SGD(0.01))
    model.fit(images, batch_size=32, epochs=1, verbose=0, callbacks=[counter], drop_remainder=False)
    assert steps == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="10 images make no whole batch of batch_size=32.*drop_remainder=False"):
        model.fit(images[:10], batch_size=32, epochs=1, verbose=0)
    with pytest.raises(ValueError, match=r"as many rows each; received x \[100\], y \[99\]"):
        model.fit(images, np.zeros(99, "int64"), batch_size=32, epochs=1, verbose=0)
    with pytest.raises(ValueError, match="sample_weight is not supported"):
        model.fit(images, sample_weight=np.ones(100), batch_size=32, epochs=1, verbose=0)
    losses = []  # two epochs in one fit, and the same as one fit and one continued at initial_epoch=1
    for fits in ([(0, 2)], [(0, 1), (1, 2)]):
        keras.utils.set_random_seed(2)
        model = UniCLR(encoders.build_encoder("tiny", (16, 16, 1), width=4), heads.projector(16, (32, 8)),
                       method="simclr", augmenter=ViewAugmenter.from_recipe("simclr", (16, 16, 1), seed=3))
        model.compile(optimizer=keras.optimizers.SGD(0.01))
        losses.append([loss for start, end in fits for loss in model.fit(
            images, batch_size=32, epochs=end, initial_epoch=start, verbose=0).history["loss"]])
    assert losses[0] == pytest.approx(losses[1], rel=1e-6, abs=0), losses
    # a dataset of batches of unknown size: a whitening method says what it cannot check (on JAX the short
    # last batch is a step of its own, and its singular covariance is named)
    model = UniCLR(encoders.build_encoder("tiny", (16, 16, 1), width=4), heads.projector(16, (32, 8)),
                   method="simtrace", augmenter=ViewAugmenter.from_recipe("uniclr", (16, 16, 1)))
    model.compile(optimizer=keras.optimizers.SGD(0.01))
    dataset = tf.data.Dataset.from_tensor_slices(images)
    with pytest.warns(UserWarning, match="no static size.*drop_remainder=True|batch of 4 .* singular"):
        model.fit(dataset.batch(32), epochs=1, verbose=0)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*no static size")
        model.fit(dataset.batch(32, drop_remainder=True), epochs=1, verbose=0)


def test_a_fit_resumed_from_its_backup_trains_as_the_uninterrupted_one(tmp_path):
    """BYOL (an EMA schedule left open) on arrays with a seeded augmenter, 3 epochs straight, and the same
    stopped during epoch 3 then resumed by a new model from ``BackupAndResume``'s backup: the same EMA
    schedule (it ends at the run's last step, not 2 epochs later) and the same last epoch."""
    import uniclr_tf
    from uniclr_tf.augment import ViewAugmenter
    images = np.random.default_rng(0).integers(0, 256, (100, 16, 16, 1), dtype="uint8")

    def build():
        keras.utils.set_random_seed(0)
        model = UniCLR(encoders.build_encoder("tiny", (16, 16, 1), width=4), heads.projector(16, (32, 8)),
                       method="byol", predictor_hidden=16,
                       augmenter=ViewAugmenter.from_recipe("byol", (16, 16, 1), seed=3))
        model.compile(optimizer=keras.optimizers.SGD(0.01))
        return model

    class Stop(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if int(self.model.optimizer.iterations.numpy()) == 7:  # (3 steps an epoch: during epoch 3)
                raise KeyboardInterrupt

    straight = build()
    loss = straight.fit(images, batch_size=32, epochs=3, verbose=0).history["loss"][-1]
    backup = uniclr_tf.BackupAndResume(str(tmp_path), verbose=False)
    with pytest.raises(KeyboardInterrupt):
        build().fit(images, batch_size=32, epochs=3, verbose=0, callbacks=[backup, Stop()])
    resumed = build()
    history = resumed.fit(images, batch_size=32, epochs=3, verbose=0, callbacks=[backup]).history
    assert backup.resumed_from == {"epoch": 2, "step": 6} and len(history["loss"]) == 1
    assert resumed.ema_total_steps == straight.ema_total_steps == 9
    assert history["loss"][-1] == pytest.approx(loss, rel=1e-6, abs=0)


def test_per_view_batch_norm_runs_each_view_alone():
    """``view_batch_norm="per_view"``: the loss is that of each view through the network on its own
    (batch statistics per view, as BYOL's code), and the joint default's differs (shared statistics)."""
    v = views()
    got = {}
    for mode in ("joint", "per_view"):
        keras.utils.set_random_seed(1)
        model = UniCLR(encoders.build_encoder("tiny", (16, 16, 1), width=4), heads.projector(16, (32, 8)),
                       method="simaffinity", view_batch_norm=mode)
        got[mode] = float(model.compute_objective(v, training=True)[1]["objective_loss"])
        z1, z2 = (model.projector(model.encoder(x, training=True), training=True) for x in v)
        alone = float(objectives.sim_affinity_loss(z1, z2, gamma=0.01 * 512 / 16))
    assert got["per_view"] == pytest.approx(alone, rel=1e-5)
    assert abs(got["joint"] - got["per_view"]) > 1e-4
    assert UniCLR.from_config(model.get_config()).view_batch_norm == "per_view"
    with pytest.raises(ValueError, match="view_batch_norm: expected one of"):
        UniCLR(encoders.build_encoder("tiny", (16, 16, 1), width=4), method="simclr", view_batch_norm="each")


def test_invalid_arguments_are_rejected():
    with pytest.raises(ValueError, match="method: expected one of"):
        small_model("nope")
    with pytest.raises(ValueError, match="predictor: method 'simclr' takes no predictor"):
        small_model("simclr", predictor=True)
    with pytest.raises(TypeError, match="'simtrace' does not take the option 'temperature'"):
        small_model("simtrace", temperature=0.5)
    with pytest.raises(ValueError, match="ema_momentum"):
        small_model(ema=1.5)
    with pytest.raises(ValueError, match="augmenter"):
        small_model().compute_objective(np.zeros((4, 16, 16, 1), "float32"))


def test_a_method_that_needs_a_predictor_gets_the_default_one():
    model = UniCLR(encoders.build_encoder("tiny", (16, 16, 1), width=4), heads.projector(16, (32, 8)), method="byol")
    assert model.predictor.output_shape == (None, 8) and model.target_encoder is not None


# One process per backend, both started at once: the TF one publishes each model's initial weights,
# which the JAX one loads (6 processes one after the other before: 75 s -> 25 s on 2 cores).
RUNS = r"""
import json, os, numpy as np, keras
from uniclr_tf.nets import encoders
from uniclr_tf.nets import heads
from uniclr_tf.augment import ViewAugmenter
from uniclr_tf.nets.model import UniCLR
""" + HANDOFF + r"""
def parity(objective, path):
    keras.utils.set_random_seed(1)
    enc = encoders.build_encoder("tiny", (16, 16, 1), width=4)
    model = UniCLR(enc, heads.projector(16, (32, 8)), heads.predictor(8, 16), method=objective,
                   options={"ema_momentum": 0.9}, ema_total_steps=10)
    if keras.backend.backend() == "tensorflow":
        publish(model.save_weights, path)
    else:
        wait_for(path)
        model.load_weights(path)
    rng = np.random.default_rng(0)
    v1 = rng.normal(size=(16, 16, 16, 1)).astype("float32")
    v = (v1, (v1 + 0.3 * rng.normal(size=v1.shape)).astype("float32"))
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9))
    losses = [float(model.train_on_batch(v, return_dict=True)["objective_loss"]) for _ in range(3)]
    return {"losses": losses, "target": float(np.sum(model.target_projector.get_weights()[0]))}

def device_augmentation():
    keras.utils.set_random_seed(1)
    aug = ViewAugmenter.for_dataset((16, 16, 1), num_local=1, seed=3)
    model = UniCLR(encoders.build_encoder("tiny", (16, 16, 1), width=4), heads.projector(16, (32, 8)),
                   method="simaffinity", augmenter=aug, num_classes=3)
    model.compile(optimizer=keras.optimizers.SGD(0.0))
    images = np.random.default_rng(0).integers(0, 256, size=(16, 16, 16, 1)).astype("uint8")
    labels = np.arange(16) % 3
    losses = [float(model.train_on_batch(images, labels, return_dict=True)["objective_loss"]) for _ in range(3)]
    # get_metrics_result (NumPy on JAX): Keras's Mean.result() exactly, also when nothing was counted
    for _ in range(2):
        ours = {k: float(v) for k, v in model.get_metrics_result().items()}
        assert ours == {m.name: float(m.result()) for m in model.metrics}, ours
        layout = [(v.path, str(v.dtype), tuple(v.shape)) for m in model.metrics for v in m.variables]
        model.reset_metrics()  # on JAX one compiled call of zeros (model._zeros_on_devices)
        assert [(v.path, str(v.dtype), tuple(v.shape)) for m in model.metrics for v in m.variables] == layout
        assert not any(np.any(np.asarray(v.value)) for m in model.metrics for v in m.variables)
    return losses

OUT = {"parity": {o: parity(o, os.path.join(__TMP__, o + ".weights.h5")) for o in ("simaffinity", "simtrace")},
       "device_augmentation": device_augmentation()}
print(json.dumps(OUT))
"""


@pytest.fixture(scope="module")
def backend_runs(tmp_path_factory):
    code = RUNS.replace("__TMP__", repr(str(tmp_path_factory.mktemp("model"))))
    tf_out, jax_out = run_python_snippets((code, "tensorflow"), (code, "jax"))
    return {"tensorflow": tf_out, "jax": jax_out}


@pytest.mark.parametrize("objective", ["simaffinity", "simtrace"])
def test_tf_and_jax_train_the_same(objective, backend_runs):
    tf_out, jax_out = (backend_runs[b]["parity"][objective] for b in ("tensorflow", "jax"))
    np.testing.assert_allclose(jax_out["losses"], tf_out["losses"], rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(jax_out["target"], tf_out["target"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_device_augmentation_inside_the_train_step(backend, backend_runs):
    """uint8 batch in, views made in the compiled step; with lr = 0 the loss still changes from step to
    step, because the augmenter's random state advances (it is carried through the JAX state)."""
    losses = backend_runs[backend]["device_augmentation"]
    assert np.all(np.isfinite(losses))
    assert len(set(np.round(losses, 6))) == 3, losses


def test_small_encoder_is_tiny_with_a_fourth_stride_2_convolution():
    small = encoders.build_encoder("small", (28, 28, 1), width=8)
    tiny = encoders.build_encoder("tiny", (28, 28, 1), width=8)
    convs = [layer for layer in small.layers if isinstance(layer, keras.layers.Conv2D)]
    assert [c.strides for c in convs] == [(1, 1), (2, 2), (2, 2), (2, 2)]
    assert [c.filters for c in convs] == [8, 16, 32, 64]
    x = np.zeros((2, 28, 28, 1), "float32")
    assert tuple(small(x).shape) == (2, 64) and tuple(tiny(x).shape) == (2, 32)
    assert tuple(keras.Model(small.inputs, small.get_layer("relu4").output)(x).shape) == (2, 4, 4, 64)


def test_a_built_model_reads_no_batch_for_its_symbolic_build_under_a_strategy():
    """Under a tf.distribute strategy Keras's ``fit`` first reads a batch through a throwaway iterator of
    the training data to build the model from its shapes; for TFRecords and TFDS, reshuffled by tf.data,
    that iterator's read-ahead could take the seed of a pass and so move the training order. A built
    UniCLR reads none; one that still has layers to build does."""
    class Iterator:  # Keras's epoch iterator: (begin, end, data iterator) tuples
        reads = 0

        def __iter__(self):
            Iterator.reads += 1
            return iter([(0, 1, iter([views()]))])

    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        model = small_model()
        model.compile(optimizer=keras.optimizers.SGD(0.05))
        model.optimizer.build(model.trainable_variables)
    assert not model._needs_a_batch_to_build()
    model._maybe_symbolic_build(iterator=Iterator())
    assert Iterator.reads == 0
    model.projector.built = False  # as if a layer were still to be built from a batch
    assert model._needs_a_batch_to_build()
    model._maybe_symbolic_build(iterator=Iterator())
    assert Iterator.reads == 1
