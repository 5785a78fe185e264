"""The pretraining model: wires encoder, heads, target branch, method and probe; holds no maths.

One ``keras.Model`` serves every method of :mod:`uniclr_tf.methods` (the UniCLR objectives and the
baselines the paper unifies): the method says which loss compares which views, whether the target
branch is the online network, a stop-gradient copy or an EMA encoder, whether there is a predictor
and what per-step state it keeps (MoCo's queue); this class runs it, on TensorFlow and on JAX.

Data given to ``fit`` is either the views (a tuple of float batches from the host pipeline) or a
raw uint8 batch that the model's own ``augmenter`` turns into views on the accelerator, optionally
paired with integer labels for the online linear probe: ``views``, ``(views, labels)``,
``images`` or ``(images, labels)``. Which view is compared with which is the method's
``view_pairs`` (see :mod:`uniclr_tf.methods.base`); the loss is the mean over those pairs.
"""

import functools

import keras
import numpy as np
from keras import layers, ops

from uniclr_tf import methods, objectives
from uniclr_tf.config.errors import UsageError
from uniclr_tf.training.schedules import momentum_schedule
from uniclr_tf.training.steps import train_step_mixin


def _freeze_variables(model):
    # The target's layers stay ``trainable`` so its BN uses batch statistics in training mode, as
    # BYOL/MoCo v3 targets do; its variables are marked non-trainable so no gradient reaches them.
    for v in model.weights:
        v.trainable = False


def _copy_model(model, name):
    """An exact copy: ``clone_model`` makes new layers but copies no weights, so set them."""
    clone = keras.models.clone_model(model)
    clone.name = name
    clone.set_weights(model.get_weights())
    return clone


def _is_views(x):
    return isinstance(x, (tuple, list))


def _interleave(views):
    """Same-size views ``[B, ...]`` as one encoder batch ``[V·B, ...]``, sample by sample (row ``V·i + k``
    is view ``k`` of sample ``i``), not view after view: under a batch sharded over devices each
    device's rows then hold both views of its own samples, so no rows move between devices before
    the encoder or after it (a concatenation view after view made XLA reshard the whole batch: 9
    all-to-alls per step on 4 devices). Batch norm sees the same rows, in another order."""
    views = list(views)
    if len(views) == 1:
        return views[0]
    stacked = ops.stack(views, axis=1)
    return ops.reshape(stacked, (-1,) + tuple(stacked.shape[2:]))


def _deinterleave(x, count):
    """The inverse of :func:`_interleave`: ``[V·B, ...]`` back to ``V`` tensors ``[B, ...]``."""
    if count == 1:
        return [x]
    grouped = ops.reshape(x, (-1, count) + tuple(x.shape[1:]))
    return [grouped[:, k] for k in range(count)]


def unpack(data):
    """Splits a batch into ``(x, labels or None)`` where ``x`` is a tuple of views or an image batch.

    Accepts what a dataset yields (``views``, ``(views, labels)``, ``images``, ``(images, labels)``
    or a dict with ``views``/``images`` and ``labels``) and Keras's ``(x, y, sample_weight)`` packing
    of ``train_on_batch``.
    """
    if isinstance(data, dict):
        return data.get("views", data.get("images")), data.get("labels")
    if _is_views(data) and len(data) >= 2:
        first, second = data[0], data[1]
        if _is_views(first) or second is None or len(second.shape) == 1:
            return first, second
    return data, None


@functools.lru_cache(maxsize=8)
def _zeros_on_devices(spec):
    """A compiled call returning zeros of each ``(shape, dtype, sharding)`` of ``spec``, placed so
    (``sharding`` None: uncommitted, on the default device)."""
    import jax
    import jax.numpy as jnp

    def zeros():
        return tuple(jnp.zeros(shape, dtype) for shape, dtype, _ in spec)

    shardings = tuple(sharding for _, _, sharding in spec)
    if None in shardings:  # values not committed to a device (no distribution): neither are the zeros,
        return jax.jit(zeros)  # or the train step would compile again for the changed placement
    return jax.jit(zeros, out_shardings=shardings)


class UniCLR(train_step_mixin(), keras.Model):
    """Self-supervised pretraining model for any registered method (UniCLR, arXiv 2211.14516, and the
    methods it unifies), with the paper's optional tricks.

    Args:
      encoder: functional backbone, images -> features ``[B, F]``.
      projector: functional head, features -> embeddings ``[B, D]``.
      predictor: head on the online branch, ``[B, D] -> [B, D]``: required by methods that always
        use one (BYOL, SimSiam, MoCo v3), optional for the UniCLR methods, refused by the others.
      method: a name in :data:`uniclr_tf.methods.REGISTRY` or a ``Method`` instance.
      options: the method's options (``temperature``, ``ema_momentum``, ``queue_size``, ...); None
        values keep the method's defaults.
      ema_total_steps: steps over which a cosine EMA momentum rises to 1 (BYOL's schedule).
      steps_per_epoch: the steps of an epoch, for methods with schedules in epochs (SwAV's prototype
        freezing, DINO's teacher temperature warm-up); None: those schedules are off.
      augmenter: optional layer mapping a uint8 batch to a tuple of views inside the train step.
      num_global: how many of the views are global crops (the rest are local crops).
      num_classes: if set, an online linear probe on stop-gradient features is trained.
      gather_across_replicas: under a tf.distribute strategy, gather embeddings from every replica
        so negatives, covariance and cross-correlation are global (default, as simclr-tf2); False
        keeps them per replica, as the UniCLR authors' code does. Under JAX ``DataParallel`` arrays
        are global anyway.
    """

    def __init__(self, encoder, projector, predictor=None, method=None, options=None, augmenter=None,
                 num_global=2, num_classes=None, gather_across_replicas=True, ema_total_steps=1,
                 steps_per_epoch=None, name="uniclr", **kwargs):
        super().__init__(name=name, **kwargs)
        if num_global < 2:
            raise ValueError(f"num_global must be at least 2; received {num_global}")
        self.method = self._make_method(method, predictor, options)
        if self.method.predictor == "never" and predictor is not None:
            raise UsageError(f"--method={self.method.name} uses no predictor; received one")
        if self.method.uses_predictor and predictor is None:
            raise UsageError(f"--method={self.method.name} needs a predictor head; received predictor=None")
        self.encoder = encoder
        self.projector = projector
        self.predictor = predictor
        self.ema_momentum = self.method.ema_momentum
        self.ema_total_steps = max(int(ema_total_steps), 1)
        self.augmenter = augmenter
        self.num_global = int(num_global)
        self.num_classes = num_classes
        self.gather_across_replicas = bool(gather_across_replicas)
        self.steps_per_epoch = int(steps_per_epoch) if steps_per_epoch else None

        if self.ema_momentum is not None:
            self.target_encoder = _copy_model(encoder, "target_encoder")
            self.target_projector = _copy_model(projector, "target_projector")
            _freeze_variables(self.target_encoder)
            _freeze_variables(self.target_projector)
            online = [v for m in (encoder, projector) for v in m.weights]
            target = [v for m in (self.target_encoder, self.target_projector) for v in m.weights]
            self._ema_pairs = [(t, o) for t, o in zip(target, online) if o.trainable]
        else:
            self.target_encoder = self.target_projector = None
            self._ema_pairs = []
        self.method_state = self.method.build_state(self, projector.output_shape[-1])

        if num_classes:
            self.probe = layers.Dense(int(num_classes), name="linear_probe")
            self.probe.build((None, encoder.output_shape[-1]))
        else:
            self.probe = None
        names = ["loss", "objective_loss", "embedding_std", *self.method.terms]
        if self.ema_momentum is not None:
            names.append("ema_momentum")
        if num_classes:
            names += ["probe_loss", "probe_accuracy"]
        self._trackers = {n: keras.metrics.Mean(name=n) for n in names}
        self.built = True

    def _needs_a_batch_to_build(self):
        """Whether Keras's symbolic build still has something to build from a batch's shapes."""
        compiled = (getattr(self, "_compile_metrics", None), getattr(self, "_compile_loss", None))
        return (not all(layer.built for layer in self._flatten_layers())
                or any(c is not None and not c.built for c in compiled))

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        """TF backend, under a tf.distribute strategy. A built model reads no batch: Keras reads one
        from a throwaway iterator of the training data, which cost a seed of tf.data's reshuffling
        (TFRecords, TFDS) and so moved the training order. Under ``MultiWorkerMirroredStrategy``,
        builds from this worker's first replica's batch: Keras 3 takes the mean of the first
        distributed batch across replicas to get a sample batch, an eager cross-worker reduction
        that fails under that strategy ("Attempt to convert a value (PerReplica...)",
        keras-team/keras#20585); only the batch's shapes matter here."""
        if iterator is not None and not self._needs_a_batch_to_build():
            iterator = None
        strategy = getattr(self, "_distribute_strategy", None)
        multi_worker = getattr(getattr(strategy, "extended", None), "_in_multi_worker_mode", lambda: False)()
        if iterator is None or not multi_worker:
            return super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)
        import tensorflow as tf

        def local(x):
            return strategy.experimental_local_results(x)[0] if isinstance(x, tf.distribute.DistributedValues) else x

        for _, _, it in iterator:
            data_batch = keras.tree.map_structure(local, next(it))
            break
        with strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    @staticmethod
    def _make_method(method, predictor, options):
        if isinstance(method, methods.Method):
            if options:
                raise ValueError("Pass options to the Method instance, not to the model")
            return method
        opts = dict(options or {})
        cls = methods.get(method or "simtrace")
        if cls.predictor == "optional" and predictor is not None:
            opts["predictor"] = True
        return cls(**{k: v for k, v in opts.items() if k in cls.defaults or v is not None})

    @property
    def metrics(self):
        return list(self._trackers.values())

    def get_metrics_result(self):
        """The trackers' means, as Keras's ``get_metrics_result`` (``total / count``, 0 when
        ``count`` is 0), computed in NumPy on JAX: Keras calls it outside the step at each epoch's
        end, where ``Mean.result()``'s ``keras.ops`` would each be an XLA compile of its own on
        the first epoch (equal, where, divide). The same float32 division, so the same numbers."""
        if keras.backend.backend() != "jax":
            return super().get_metrics_result()
        out = {}
        for name, tracker in self._trackers.items():
            total = np.asarray(tracker.total.value).astype(tracker.dtype)
            count = np.asarray(tracker.count.value).astype(tracker.dtype)
            safe = np.where(count == 0, 1, count).astype(tracker.dtype)
            out[name] = np.where(count == 0, 0, total / safe).astype(tracker.dtype)  # ops.divide_no_nan
        return out

    def reset_metrics(self):
        """Zeroes the trackers (Keras calls it before every epoch). On JAX, one compiled call makes
        every tracker's zeros on its variables' devices: Keras's ``reset_state`` assigns each tracker's
        total and count a value of its own (14 variables for 7 logged terms), each a transfer to the
        devices that in a job of several processes took ~3 ms (~40 ms an epoch on 2 CPU processes
        against ~9 ms in one; the epoch end of 4 processes x 1 GPU was ~47 ms). The same values (each
        ``Mean``'s total and count are zeros)."""
        if keras.backend.backend() != "jax":
            return super().reset_metrics()
        variables = [v for tracker in self._trackers.values() for v in tracker.variables]
        spec = tuple((tuple(v.shape), str(v.dtype), v.value.sharding if v.value.committed else None)
                     for v in variables)
        for variable, zero in zip(variables, _zeros_on_devices(spec)()):
            variable.assign(zero)

    def call(self, images, training=False):
        """Inference: ``{"features": backbone features, "embedding": projector output}``."""
        features = self.encoder(images, training=training)
        return {"features": features, "embedding": self.projector(features, training=training)}

    # --- the step's maths, shared by both backends -------------------------------------------
    def _embed(self, views, training):
        """Runs each group of same-size views through the network as one batch (one BN batch).

        Returns per-view lists: backbone features, projector outputs ``z``, online embeddings (the
        predictor's output where there is one) and, for the global views, the target embeddings.
        """
        groups = [views[: self.num_global]]
        if len(views) > self.num_global:
            groups.append(views[self.num_global:])
        kind = self.method.target_kind
        features, projected, online, target = [], [], [], []
        for group in groups:
            x = _interleave(group)
            f = self.encoder(x, training=training)
            z = self.projector(f, training=training)
            p = self.predictor(z, training=training) if self.predictor is not None else z
            features += _deinterleave(f, len(group))
            projected += _deinterleave(z, len(group))
            online += _deinterleave(p, len(group))
            if group is groups[0]:
                if kind == "ema":
                    t = ops.stop_gradient(self.target_projector(self.target_encoder(x, training=training),
                                                                training=training))
                else:
                    t = ops.stop_gradient(z) if kind == "stop_gradient" else z
                target = _deinterleave(t, len(group))
        return features, projected, online, target

    def _symmetric_weight(self, i, j, rows):
        """``(γ',)`` for a method that takes the symmetric loss (its weight on the pair of views ``i``,
        ``j`` of ``rows`` rows), ``()`` for the others."""
        if not self.method.takes_symmetric_loss:
            return ()
        global_pair = i < self.num_global and j < self.num_global
        return (self.method.symmetric_weight(global_pair, int(rows.shape[0])),)

    def view_pairs(self, num_views):
        """(online index, target index) pairs compared by the loss (the method's rule)."""
        return self.method.view_pairs(self.num_global, num_views)

    def compute_objective(self, data, training=True):
        """Returns ``(total loss, logs)`` for one batch: the method's loss averaged over view pairs,
        plus the online probe's cross-entropy when labels are given. ``logs`` holds every term the
        method declares, the collapse diagnostic ``embedding_std`` (std of the ℓ2-normalised
        projector outputs of the first view) and the probe's. In training, the method's per-step
        state (MoCo's queue) is updated afterwards, inside the step."""
        x, labels = unpack(data)
        if not _is_views(x):
            if self.augmenter is None:
                raise ValueError("The batch is a single image tensor but the model has no augmenter; "
                                 "pass views from the host pipeline or build the model with augmenter=...")
            x = self.augmenter(x, training=True)
        views = list(x)
        if len(views) < self.num_global:
            raise ValueError(f"Expected at least {self.num_global} views; received {len(views)}")
        features, projected, online, target = self._embed(views, training)
        if self.gather_across_replicas:
            online = [self.all_gather(z) for z in online]
            target = [self.all_gather(t) for t in target]
        state = dict(self.method_state, step=self._steps_done(), steps_per_epoch=self.steps_per_epoch)
        results = [self.method.pair_loss(online[i], target[j], state, *self._symmetric_weight(i, j, online[i]))
                   for i, j in self.view_pairs(len(views))]
        loss = ops.mean(ops.stack([r[0] for r in results]))
        logs = {"objective_loss": loss,
                "embedding_std": objectives.embedding_std(ops.cast(projected[0], "float32"))}
        for term in results[0][1]:
            if term not in self._trackers:
                raise UsageError(f"--method={self.method.name} returned the term {term!r}, which it does not "
                                 f"declare in `terms` {self.method.terms}")
            logs[term] = ops.mean(ops.stack([r[1][term] for r in results]))
        if training:
            self.method.update_state(self.method_state, target)
        total = loss
        if self.probe is not None and labels is not None:
            logits = ops.cast(self.probe(ops.stop_gradient(features[0])), "float32")
            probe_loss = ops.mean(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
            logs["probe_loss"] = probe_loss
            logs["probe_accuracy"] = ops.mean(ops.cast(ops.equal(ops.argmax(logits, -1), ops.cast(labels, "int32")), "float32"))
            total = total + probe_loss
        logs["loss"] = total
        return total, logs

    def _steps_done(self):
        """Optimizer steps done before this one (0 before ``compile``), for the methods' schedules."""
        if getattr(self, "optimizer", None) is None:
            return ops.convert_to_tensor(0, dtype="int64")
        return ops.convert_to_tensor(self.optimizer.iterations)

    def _momentum(self, step):
        if self.method.ema_schedule == "constant":
            return ops.cast(self.ema_momentum, "float32")
        return momentum_schedule(step, self.ema_total_steps, self.ema_momentum)

    def current_ema_momentum(self):
        """The EMA momentum of the next step: constant (MoCo v2) or BYOL's cosine from the base to 1."""
        return self._momentum(self.optimizer.iterations)

    def update_target(self):
        """One EMA step of the target, ``t ← m·t + (1 − m)·o``, after every optimizer step.

        It runs inside ``train_step`` so no step is skipped when ``steps_per_execution > 1``
        (Keras fires callbacks once per block of steps). ``optimizer.iterations`` has already been
        incremented, so step k (1-based) uses the momentum of schedule step k − 1.
        """
        if not self._ema_pairs:
            return
        m = ops.cast(self._momentum(self.optimizer.iterations - 1), "float32")
        for t, o in self._ema_pairs:
            t.assign(ops.cast(m * ops.cast(t, "float32") + (1.0 - m) * ops.cast(o, "float32"), t.dtype))

    def update_metrics(self, logs):
        if self._ema_pairs:
            logs = dict(logs, ema_momentum=self._momentum(self.optimizer.iterations - 1))
        for name, value in logs.items():
            self._trackers[name].update_state(value)
        return {name: tracker.result() for name, tracker in self._trackers.items()}
