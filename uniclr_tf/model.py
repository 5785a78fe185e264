"""The UniCLR model: wires encoder, heads, EMA target, objective and probe; holds no maths.

Data given to ``fit`` is either the views (a tuple of float batches from the host pipeline) or a
raw uint8 batch that the model's own ``augmenter`` turns into views on the accelerator, optionally
paired with integer labels for the online linear probe: ``views``, ``(views, labels)``,
``images`` or ``(images, labels)``.

Which view is compared with which (paper Table 1 tricks):

* no predictor and no EMA target: every unordered pair of global views, ``L(z_i, z_j)``;
* with a predictor or an EMA target: ordered pairs ``L(p_i, t_j)``, ``i != j``;
* multi-crop: each local view ``l`` against every global target, ``L(p_l, t_g)``.

The loss is the mean over pairs, so its scale does not change with the number of local crops.
"""

import keras
from keras import layers, ops

from uniclr_tf import objectives
from uniclr_tf.schedules import momentum_schedule
from uniclr_tf.steps import train_step_mixin

DEFAULT_TEMPERATURE = {"simaffinity": 0.5, "simwhitening": 1.0, "simtrace": None}


def _freeze_variables(model):
    # The target's layers stay ``trainable`` so its BN uses batch statistics in training mode, as
    # BYOL/MoCo v3 targets do; its variables are marked non-trainable so no gradient reaches them.
    for v in model.weights:
        v.trainable = False


def _copy_model(model, name):
    """An exact copy: ``clone_model`` makes new layers but copies no weights (PAPER.md)."""
    clone = keras.models.clone_model(model)
    clone.name = name
    clone.set_weights(model.get_weights())
    return clone


def _is_views(x):
    return isinstance(x, (tuple, list))


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


class UniCLR(train_step_mixin(), keras.Model):
    """UniCLR pretraining model (arXiv 2211.14516, Eq. 6) with the paper's optional tricks.

    Args:
      encoder: functional backbone, images -> features ``[B, F]``.
      projector: functional head, features -> embeddings ``[B, D]``.
      predictor: optional head on the online branch, ``[B, D] -> [B, D]``.
      objective: ``simaffinity``, ``simwhitening`` or ``simtrace``.
      temperature: τ (default 0.5 for SimAffinity, 1.0 for SimWhitening; unused by SimTrace).
      gamma: weight of the symmetric loss ``‖A − Aᵀ‖_F`` (SimAffinity / SimWhitening).
      eps: ridge ε added to the covariance before the Cholesky factorisation.
      objective_options: extra keyword options of the objective (authors'-code variants:
        ``mode="one_sided"``, ``stop_gradient_cov=True``, ``symmetric_directions=True``).
      ema_momentum: base momentum of an EMA target encoder+projector (e.g. 0.99), or None.
      ema_total_steps: steps over which the EMA momentum follows BYOL's cosine to 1.
      augmenter: optional layer mapping a uint8 batch to a tuple of views inside the train step.
      num_global: how many of the views are global crops (the rest are local crops).
      num_classes: if set, an online linear probe on stop-gradient features is trained.
      gather_across_replicas: under a tf.distribute strategy, gather embeddings from every replica
        so the affinity matrix and covariance are global (default, as simclr-tf2); False keeps them
        per replica, as the authors' code does. Under JAX ``DataParallel`` arrays are global anyway.
    """

    def __init__(self, encoder, projector, predictor=None, objective="simtrace", temperature=None,
                 gamma=0.01, eps=1e-4, objective_options=None, ema_momentum=None,
                 ema_total_steps=1, augmenter=None, num_global=2, num_classes=None,
                 gather_across_replicas=True, name="uniclr", **kwargs):
        super().__init__(name=name, **kwargs)
        if objective not in DEFAULT_TEMPERATURE:
            raise ValueError(f"Unknown objective {objective!r}; expected one of {sorted(DEFAULT_TEMPERATURE)}")
        if num_global < 2:
            raise ValueError(f"num_global must be at least 2; received {num_global}")
        if ema_momentum is not None and not 0.0 <= float(ema_momentum) < 1.0:
            raise ValueError(f"ema_momentum must be in [0, 1); received {ema_momentum}")
        self.encoder = encoder
        self.projector = projector
        self.predictor = predictor
        self.objective = objective
        self.temperature = DEFAULT_TEMPERATURE[objective] if temperature is None else float(temperature)
        self.gamma = float(gamma)
        self.eps = float(eps)
        self.objective_options = dict(objective_options or {})
        self.ema_momentum = None if ema_momentum is None else float(ema_momentum)
        self.ema_total_steps = max(int(ema_total_steps), 1)
        self.augmenter = augmenter
        self.num_global = int(num_global)
        self.num_classes = num_classes
        self.gather_across_replicas = bool(gather_across_replicas)
        self._loss_fn = objectives.get_objective(objective)

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

        if num_classes:
            self.probe = layers.Dense(int(num_classes), name="linear_probe")
            self.probe.build((None, encoder.output_shape[-1]))
        else:
            self.probe = None
        names = ["loss", "objective_loss", "embedding_std"]
        names += ["trace"] if objective == "simtrace" else ["cross_entropy", "symmetry"]
        if self.ema_momentum is not None:
            names.append("ema_momentum")
        if num_classes:
            names += ["probe_loss", "probe_accuracy"]
        self._trackers = {n: keras.metrics.Mean(name=n) for n in names}
        self.built = True

    @property
    def metrics(self):
        return list(self._trackers.values())

    def call(self, images, training=False):
        """Inference: ``{"features": backbone features, "embedding": projector output}``."""
        features = self.encoder(images, training=training)
        return {"features": features, "embedding": self.projector(features, training=training)}

    # --- the step's maths, shared by both backends -------------------------------------------
    def _embed(self, views, training):
        """Runs each group of same-size views through the network as one batch (one BN batch)."""
        groups = [views[: self.num_global]]
        if len(views) > self.num_global:
            groups.append(views[self.num_global:])
        features, online, target = [], [], []
        for group in groups:
            x = ops.concatenate(list(group), axis=0)
            f = self.encoder(x, training=training)
            z = self.projector(f, training=training)
            p = self.predictor(z, training=training) if self.predictor is not None else z
            features += ops.split(f, len(group), axis=0)
            online += ops.split(p, len(group), axis=0)
            if group is groups[0]:
                if self.target_encoder is not None:
                    t = self.target_projector(self.target_encoder(x, training=training), training=training)
                    target = ops.split(ops.stop_gradient(t), len(group), axis=0)
                else:
                    target = ops.split(z, len(group), axis=0)
        return features, online, target

    def view_pairs(self, num_views):
        """(online index, target index) pairs compared by the loss; see the module docstring."""
        g = range(self.num_global)
        asymmetric = self.predictor is not None or self.target_encoder is not None
        pairs = [(i, j) for i in g for j in g if (i != j if asymmetric else i < j)]
        pairs += [(l, j) for l in range(self.num_global, num_views) for j in g]
        return pairs

    def _objective_kwargs(self):
        kwargs = dict(self.objective_options)
        if self.objective != "simtrace":
            kwargs.update(temperature=self.temperature, gamma=self.gamma)
        if self.objective != "simaffinity":
            kwargs["eps"] = self.eps
        return kwargs

    def compute_objective(self, data, training=True):
        """Returns ``(total loss, logs)`` for one batch: the objective averaged over view pairs,
        plus the online probe's cross-entropy when labels are given. ``logs`` holds every term
        (``cross_entropy`` and the unweighted ``symmetry`` ‖A − Aᵀ‖_F, or ``trace``), the collapse
        diagnostic ``embedding_std`` (std of ℓ2-normalised online embeddings) and the probe's."""
        x, labels = unpack(data)
        if not _is_views(x):
            if self.augmenter is None:
                raise ValueError("The batch is a single image tensor but the model has no augmenter; "
                                 "pass views from the host pipeline or build the model with augmenter=...")
            x = self.augmenter(x, training=True)
        views = list(x)
        if len(views) < self.num_global:
            raise ValueError(f"Expected at least {self.num_global} views; received {len(views)}")
        features, online, target = self._embed(views, training)
        if self.gather_across_replicas:
            online = [self.all_gather(z) for z in online]
            target = [self.all_gather(t) for t in target]
        kwargs = self._objective_kwargs()
        pairs = self.view_pairs(len(views))
        results = [self._loss_fn(online[i], target[j], return_terms=True, **kwargs) for i, j in pairs]
        loss = ops.mean(ops.stack([r[0] for r in results]))
        logs = {"objective_loss": loss,
                "embedding_std": objectives.embedding_std(ops.cast(online[0], "float32"))}
        for term in results[0][1]:
            logs[term] = ops.mean(ops.stack([r[1][term] for r in results]))
        total = loss
        if self.probe is not None and labels is not None:
            logits = ops.cast(self.probe(ops.stop_gradient(features[0])), "float32")
            probe_loss = ops.mean(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
            logs["probe_loss"] = probe_loss
            logs["probe_accuracy"] = ops.mean(ops.cast(ops.equal(ops.argmax(logits, -1), ops.cast(labels, "int32")), "float32"))
            total = total + probe_loss
        logs["loss"] = total
        return total, logs

    def current_ema_momentum(self):
        """BYOL's cosine schedule of the EMA momentum, from ``ema_momentum`` to 1."""
        return momentum_schedule(self.optimizer.iterations, self.ema_total_steps, self.ema_momentum)

    def update_target(self):
        """One EMA step of the target, ``t ← m·t + (1 − m)·o``, after every optimizer step.

        It runs inside ``train_step`` so no step is skipped when ``steps_per_execution > 1``
        (callbacks fire once per block there; STACK.md). ``optimizer.iterations`` has already been
        incremented, so step k (1-based) uses the momentum of schedule step k − 1.
        """
        if not self._ema_pairs:
            return
        m = ops.cast(momentum_schedule(self.optimizer.iterations - 1, self.ema_total_steps, self.ema_momentum), "float32")
        for t, o in self._ema_pairs:
            t.assign(ops.cast(m * ops.cast(t, "float32") + (1.0 - m) * ops.cast(o, "float32"), t.dtype))

    def update_metrics(self, logs):
        if self._ema_pairs:
            logs = dict(logs, ema_momentum=momentum_schedule(self.optimizer.iterations - 1, self.ema_total_steps, self.ema_momentum))
        for name, value in logs.items():
            self._trackers[name].update_state(value)
        return {name: tracker.result() for name, tracker in self._trackers.items()}
