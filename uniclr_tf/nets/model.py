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
import warnings

import keras
import numpy as np
from keras import layers, ops

from uniclr_tf import augment, methods, objectives  # noqa: F401 (augment: its layers load with a model)
from uniclr_tf.config.errors import UsageError
from uniclr_tf.config.train_config import VIEW_BATCH_NORMS
from uniclr_tf.nets import encoders, heads  # noqa: F401 (encoders: their layers load with a model)
from uniclr_tf.nets.variables import batched_initialisers, with_batched_initialisers
from uniclr_tf.training import whole_batches
from uniclr_tf.training.schedules import momentum_schedule
from uniclr_tf.training.steps import train_step_mixin

#: The projector of :class:`UniCLR` when none is given: the paper's CIFAR head (§4.1).
DEFAULT_PROJECTOR_DIMS = (2048, 2048, 256)
#: The hidden size of the predictor of :class:`UniCLR` when none is given.
DEFAULT_PREDICTOR_HIDDEN = 512


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
        x = data.get("views", data.get("images"))
        return x, _class_ids(data.get("labels"), x)
    if _is_views(data) and len(data) == 1:  # Keras' packing of ``x`` alone: ``(x,)``
        return unpack(data[0])
    if _is_views(data) and len(data) >= 2:
        first, second = data[0], data[1]
        if isinstance(first, dict):  # (Keras's packing of a dict x and its y)
            x, labels = unpack(first)
            return x, labels if second is None else _class_ids(second, x)
        if _is_views(first) or second is None or _rank(second) is None or _rank(second) < _rank(first):
            return first, _class_ids(second, first)
    return data, None


def _rank(x):
    """``x``'s number of axes; None where it is unknown (a TF function traced for several label forms)."""
    shape = x.shape
    return len(shape) if isinstance(shape, (tuple, list)) else getattr(shape, "rank", None)


def _class_ids(labels, x):
    """Labels as ``[B]`` class ids: ``[B]`` as they are, ``[B, 1]`` (``keras.datasets``' form) squeezed,
    one-hot ``[B, classes]`` by their argmax (``x``: the batch's images or views, for ``B``)."""
    rank = None if labels is None else _rank(labels)
    if labels is None or rank == 1:
        return labels
    if rank == 2:
        return ops.reshape(labels, (-1,)) if labels.shape[-1] == 1 else ops.argmax(labels, axis=-1)
    # rank unknown: a TF function traced again for another form of labels than its first
    flat = ops.reshape(labels, (ops.shape(x[0] if _is_views(x) else x)[0], -1))
    one_hot = ops.shape(flat)[1] > 1
    return ops.where(one_hot, ops.cast(ops.argmax(flat, axis=-1), "int32"), ops.cast(flat[:, 0], "int32"))


def _dims(dims, arg):
    """``dims`` as a tuple of positive ints (a ValueError naming ``arg`` otherwise)."""
    try:
        out = tuple(int(d) for d in dims)
    except (TypeError, ValueError):
        out = ()
    if not out or min(out) <= 0:
        raise ValueError(f"{arg}: expected a non-empty sequence of positive layer sizes; received {dims!r}")
    return out


def _shape(model, which):
    """``model.input_shape`` or ``model.output_shape`` (``which``), or None where Keras cannot tell it."""
    try:
        return getattr(model, which)
    except (AttributeError, ValueError, RuntimeError):
        return None


def _output_shape(model):
    return _shape(model, "output_shape")


def _check_encoder(encoder):
    """The feature size of a backbone mapping ``[B, H, W, C]`` images to pooled ``[B, F]`` features."""
    if not isinstance(encoder, keras.Model):
        raise TypeError(f"encoder: expected a keras.Model mapping images [batch, height, width, channels] to "
                        f"features [batch, features]; received {type(encoder).__name__}")
    inputs = _shape(encoder, "input_shape")
    if not isinstance(inputs, tuple) or len(inputs) != 4 or inputs[-1] is None:
        raise ValueError(f"encoder: expected one image input [batch, height, width, channels] with the channels "
                         f"known; received input shape {inputs}. Build it on keras.Input((height, width, "
                         "channels)) or (None, None, channels)")
    shape = _output_shape(encoder)
    if not isinstance(shape, tuple) or len(shape) != 2 or shape[-1] is None:
        raise ValueError(f"encoder: expected pooled 2-D features [batch, features]; received output shape {shape}. "
                         "Pool the backbone's feature map, e.g. keras.applications.ResNet50(include_top=False, "
                         "pooling=\"avg\") or keras.layers.GlobalAveragePooling2D() on its output")
    return int(shape[-1])


def _check_head(head, arg, input_dim):
    """The output size of a head ``[B, input_dim] -> [B, D]``."""
    if not isinstance(head, keras.Model):
        raise TypeError(f"{arg}: expected a keras.Model mapping [batch, {input_dim}] to [batch, size]; received "
                        f"{type(head).__name__}")
    inputs = _shape(head, "input_shape")
    if isinstance(inputs, tuple) and len(inputs) == 2 and inputs[-1] is not None and inputs[-1] != input_dim:
        raise ValueError(f"{arg}: its input size is {inputs[-1]}, and it receives {input_dim} "
                         f"({'the encoder' if arg == 'projector' else 'the projector'}'s outputs)")
    shape = _output_shape(head)
    if not isinstance(shape, tuple) or len(shape) != 2 or shape[-1] is None:
        raise ValueError(f"{arg}: expected 2-D outputs [batch, size]; received output shape {shape}")
    return int(shape[-1])


_NO_EVALUATE = "the model has a training objective, not a held-out loss or metric"


class _EMAScheduleFromFit(keras.callbacks.Callback):
    """Sets an EMA schedule left open (``ema_total_steps=None``) to end with the ``fit`` call's last
    step, before the train step is traced: ``epochs × steps`` for the first call, and for a later
    call (``fit(epochs=4, initial_epoch=2)`` after ``fit(epochs=2)``, or ``fit`` again) the steps
    done so far plus this call's, so that the target keeps moving; a changed schedule is traced
    again."""

    def __init__(self, initial_epoch=0):
        super().__init__()
        self.initial_epoch = int(initial_epoch or 0)

    def on_train_begin(self, logs=None):
        model, params = self.model, self.params or {}
        steps, epochs = params.get("steps"), params.get("epochs")
        if not steps or not epochs:
            return
        done = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
        # (a callback before this one may have moved the start: BackupAndResume restores, as Keras reads it)
        initial = int(getattr(model, "_initial_epoch", None) or self.initial_epoch)
        total = max(int(epochs) * int(steps), done + (int(epochs) - initial) * int(steps), 1)
        if total != model.ema_total_steps:
            traced = model.ema_total_steps is not None
            model.ema_total_steps = total
            if traced:
                model.make_train_function(force=True)


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


@keras.saving.register_keras_serializable(package="uniclr_tf")
class UniCLR(train_step_mixin(), keras.Model):
    """Self-supervised pretraining of any Keras backbone with any method of :mod:`uniclr_tf.methods`
    (UniCLR's SimAffinity, SimWhitening and SimTrace, arXiv 2211.14516, and the methods it unifies),
    on the TensorFlow and JAX backends.

    A ``keras.Model``: ``compile`` it with an optimizer (no loss: the method is the loss) and ``fit`` it
    on unlabelled images. What ``fit`` takes, batch by batch:

    * uint8 images ``[B, H, W, C]`` (a NumPy array, a ``tf.data.Dataset`` or a ``keras.utils.PyDataset``):
      the model's ``augmenter`` turns them into views inside the compiled step;
    * ``(images, labels)``: the same, plus labels for the online linear probe (``num_classes``): class
      ids ``[B]`` or ``[B, 1]``, or one-hot ``[B, classes]``;
    * a tuple of views (float batches made on the host, e.g. by ``ViewAugmenter`` in ``tf.data``), with
      or without labels.

    Arrays train in whole batches, reshuffled each epoch (a short last batch left out, as the train
    CLI does); datasets and generators as they are batched (see :meth:`fit`).

    The projector and the predictor default to the method's heads; a method with an EMA target
    (BYOL, MoCo, or ``options={"ema_momentum": 0.99}``) gets a momentum copy of encoder and
    projector, updated inside every train step (no callback needed), its momentum rising from the
    base to 1 on a cosine over ``ema_total_steps`` (BYOL's schedule; MoCo v2 and CO2 keep it constant).
    ``model.encoder`` is the backbone you passed, a plain Keras model to reuse; ``model.save("m.keras")``
    and ``keras.saving.load_model`` round-trip the whole model, and training continues with the same
    method, heads and optimizer state.

    Examples:
        >>> import keras, numpy as np, uniclr_tf
        >>> backbone = keras.applications.ResNet50(weights=None, include_top=False, pooling="avg",
        ...                                        input_shape=(32, 32, 3))
        >>> model = uniclr_tf.UniCLR(backbone, method="simtrace", projector_dims=(512, 128),
        ...                          augmenter=uniclr_tf.ViewAugmenter.from_recipe("uniclr", (32, 32, 3)))
        >>> model.compile(optimizer=uniclr_tf.LARS(0.3))
        >>> images = np.random.randint(0, 256, (256, 32, 32, 3), dtype="uint8")
        >>> history = model.fit(images, batch_size=128, epochs=2, verbose=0)
        >>> features = model.encoder.predict(uniclr_tf.EvalPreprocess(32)(images[:8]), verbose=0)  # [8, 2048]

    Args:
      encoder: the backbone: a ``keras.Model`` mapping images ``[B, H, W, C]`` (normalised floats, as
        the augmenter's views) to pooled features ``[B, F]``, e.g. ``uniclr_tf.build_encoder(...)``,
        ``keras.applications.ResNet50(weights=None, include_top=False, pooling="avg")`` or a Keras Hub
        backbone followed by ``keras.layers.GlobalAveragePooling2D``. An input size left free
        (``(None, None, C)``) lets multi-crop's smaller local views through.
      projector: head ``[B, F] -> [B, D]``; None builds the method's MLP with ``projector_dims``.
      predictor: head ``[B, D] -> [B, D]`` on the online branch. None builds one (hidden size
        ``predictor_hidden``) for methods that need it (BYOL, SimSiam, MoCo v3, and the UniCLR
        objectives with ``options={"predictor": True}``); giving one to a UniCLR objective turns its
        ``predictor`` option on; the other methods take none.
      method: a name of :func:`uniclr_tf.methods.names` or a method from :func:`uniclr_tf.methods.get`.
      options: the method's options when ``method`` is a name (``{"temperature": 0.2}``, ...); None
        values keep the method's defaults.
      augmenter: a layer mapping a uint8 batch to a tuple of views (``uniclr_tf.ViewAugmenter``), run
        inside the train step; None when the data already holds views.
      num_global: how many of the views are global crops (the rest are local crops).
      num_classes: if set, an online linear probe on stop-gradient features learns from the labels.
      gather_across_replicas: under a ``tf.distribute`` strategy, gather embeddings from every replica
        so negatives, covariance and cross-correlation are global (default); False keeps them per
        replica. Under JAX ``keras.distribution.DataParallel`` arrays are global anyway.
      ema_total_steps: steps over which the EMA momentum rises to 1; None: to the last step of each
        ``fit`` call (the first spans its epochs x steps per epoch, a later one the steps done plus
        its own); before any ``fit`` the momentum stays at its base.
      steps_per_epoch: the steps of an epoch, for methods with schedules in epochs (SwAV's prototype
        freezing, DINO's teacher temperature warm-up); None: those schedules are off.
      projector_dims: the layer sizes of the default projector (default ``(2048, 2048, 256)``).
      predictor_hidden: the hidden size of the default predictor (default 512).
      norm: the batch-norm factory of the default heads (:class:`uniclr_tf.nets.norm.BatchNorm`;
        default Keras' ``BatchNormalization``).
      view_batch_norm: ``"joint"`` (default): same-size views go through the network as one batch, so
        batch norm takes its statistics over them together (SimCLR's, SwAV's and DINO's code);
        ``"per_view"``: each view its own call and statistics (BYOL's, SimSiam's, Barlow Twins',
        VICReg's and MoCo v3's code); the moving statistics then update once a view.

    Raises:
      TypeError: an argument of the wrong kind (an encoder that is not a Keras model, an option the
        method does not take, options next to a method instance).
      ValueError: a backbone without pooled 2-D features, a predictor for a method that takes none,
        an unknown method or a bad option value, inconsistent sizes.
    """

    @with_batched_initialisers  # on JAX its heads' and target's initial values come from a few programs
    def __init__(self, encoder, projector=None, predictor=None, method="simtrace", options=None, augmenter=None,
                 num_global=2, num_classes=None, gather_across_replicas=True, ema_total_steps=None,
                 steps_per_epoch=None, projector_dims=None, predictor_hidden=None, norm=None, name="uniclr",
                 view_batch_norm="joint", **kwargs):
        super().__init__(name=name, **kwargs)
        if isinstance(num_global, bool) or not isinstance(num_global, (int, np.integer)) or num_global < 2:
            raise ValueError(f"num_global must be an integer >= 2; received {num_global!r}")
        feature_dim = _check_encoder(encoder)
        self.method = self._make_method(method, predictor, options)
        if self.method.predictor == "never" and predictor is not None:
            raise ValueError(f"predictor: method {self.method.name!r} takes no predictor; received {predictor!r} "
                             "(leave predictor=None)")
        self._check_augmenter(augmenter, num_global)
        if projector is None:
            dims = _dims(projector_dims if projector_dims is not None else DEFAULT_PROJECTOR_DIMS, "projector_dims")
            projector = self.method.build_projector(feature_dim, dims, norm=norm)
        elif projector_dims is not None:
            raise TypeError("projector_dims sizes the default projector; pass it or a projector, not both")
        embedding_dim = _check_head(projector, "projector", feature_dim)
        groups = self.method.options.get("whitening_groups")
        if groups and embedding_dim % int(groups):
            raise ValueError(f"options: whitening_groups={groups} must divide the embedding size {embedding_dim} "
                             "(the projector's last size)")
        if predictor is None and self.method.uses_predictor:
            hidden = int(predictor_hidden) if predictor_hidden is not None else DEFAULT_PREDICTOR_HIDDEN
            predictor = heads.predictor(embedding_dim, hidden, norm=norm)
        elif predictor is not None:
            if predictor_hidden is not None:
                raise TypeError("predictor_hidden sizes the default predictor; pass it or a predictor, not both")
            if _check_head(predictor, "predictor", embedding_dim) != embedding_dim:
                raise ValueError(f"predictor: expected outputs of the projector's size {embedding_dim}; received "
                                 f"{predictor.output_shape}")
        self.encoder = encoder
        self.projector = projector
        self.predictor = predictor
        self.ema_momentum = self.method.ema_momentum
        if ema_total_steps is not None and (isinstance(ema_total_steps, bool) or int(ema_total_steps) < 1):
            raise ValueError(f"ema_total_steps must be an integer >= 1 or None; received {ema_total_steps!r}")
        self.ema_total_steps = None if ema_total_steps is None else int(ema_total_steps)
        self._ema_steps_from_fit = ema_total_steps is None
        self.augmenter = augmenter
        self.num_global = int(num_global)
        self.num_classes = int(num_classes) if num_classes else None
        self.gather_across_replicas = bool(gather_across_replicas)
        if view_batch_norm not in VIEW_BATCH_NORMS:
            raise ValueError(f"view_batch_norm: expected one of {VIEW_BATCH_NORMS}; received {view_batch_norm!r}")
        self.view_batch_norm = view_batch_norm
        self.steps_per_epoch = int(steps_per_epoch) if steps_per_epoch else None
        self._checked_batches = set()
        self._whole_batches_seed = None  # (drawn from NumPy's generator at the first fit on arrays)

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
        self.method_state = self.method.build_state(self, embedding_dim)

        if num_classes:
            self.probe = layers.Dense(int(num_classes), name="linear_probe")
            self.probe.build((None, feature_dim))
        else:
            self.probe = None
        names = ["loss", "objective_loss", "embedding_std", *self.method.terms]
        if self.ema_momentum is not None:
            names.append("ema_momentum")
        if num_classes:
            names += ["probe_loss", "probe_accuracy"]
        self._trackers = {n: keras.metrics.Mean(name=n) for n in names}
        self.built = True

    @staticmethod
    def _check_augmenter(augmenter, num_global):
        if augmenter is None:
            return
        if not callable(augmenter):
            raise TypeError(f"augmenter: expected a layer mapping uint8 images to a tuple of views (e.g. "
                            f"uniclr_tf.ViewAugmenter); received {augmenter!r}")
        views = getattr(augmenter, "num_global", None)
        if views is not None and int(views) != int(num_global):
            raise ValueError(f"augmenter: it makes {views} global views, and the model compares num_global="
                             f"{num_global}; build the augmenter with num_global={num_global} or pass "
                             f"num_global={views}")

    def get_config(self):
        """The model's constructor arguments, its sub-models serialised: what ``model.save`` writes."""
        if methods.REGISTRY.get(self.method.name) is None or type(self.method) is not methods.get_class(
                self.method.name):
            raise NotImplementedError(f"method: {type(self.method).__name__} is not in uniclr_tf.methods.REGISTRY, "
                                      "so a saved model could not rebuild it; register it to save the model")
        serialize = keras.saving.serialize_keras_object
        return {
            "name": self.name,
            "encoder": serialize(self.encoder),
            "projector": serialize(self.projector),
            "predictor": serialize(self.predictor) if self.predictor is not None else None,
            "method": self.method.name,
            "options": dict(self.method.options),
            "augmenter": serialize(self.augmenter) if self.augmenter is not None else None,
            "num_global": self.num_global,
            "num_classes": self.num_classes,
            "gather_across_replicas": self.gather_across_replicas,
            # left open, it stays open: the next fit sets it from the steps done and its own
            "ema_total_steps": None if self._ema_steps_from_fit else self.ema_total_steps,
            "steps_per_epoch": self.steps_per_epoch,
            "view_batch_norm": self.view_batch_norm,
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        for key in ("encoder", "projector", "predictor", "augmenter"):
            if config.get(key) is not None:
                config[key] = keras.saving.deserialize_keras_object(config[key], custom_objects=custom_objects)
        return cls(**config)

    # --- the augmenter's random state in saved files -------------------------------------------
    _SEED_KEY, _TF_RNG_KEY = "augmenter_seed_", "augmenter_tf_rng_"

    def _augmenter_random_states(self):
        """``(Keras seed-generator states, TensorFlow generator states)`` of the augmenter's layers: the
        random state of the views made inside the step (the TF ones only on the TensorFlow backend,
        where the layers draw from a ``tf.random.Generator``)."""
        if self.augmenter is None or not hasattr(self.augmenter, "_flatten_layers"):
            return [], []
        layers_ = list(self.augmenter._flatten_layers(include_self=True, recursive=True))
        seeds = [g.state for layer in layers_ for g in getattr(layer, "_seed_generators", ())]
        rngs = []
        if keras.backend.backend() == "tensorflow":
            rngs = [layer._tf_generator().state for layer in layers_ if hasattr(layer, "_tf_generator")]
        return seeds, rngs

    def save_own_variables(self, store):
        """Keras' saving of the model's own variables, plus the augmenter's random state, so that a
        reloaded model draws the views the saved one would have drawn next."""
        super().save_own_variables(store)
        seeds, rngs = self._augmenter_random_states()
        for prefix, variables in ((self._SEED_KEY, seeds), (self._TF_RNG_KEY, rngs)):
            for i, v in enumerate(variables):
                store[f"{prefix}{i}"] = keras.ops.convert_to_numpy(v)

    def load_own_variables(self, store):
        own = {k: store[k] for k in store.keys() if not k.startswith((self._SEED_KEY, self._TF_RNG_KEY))}
        super().load_own_variables(own)
        seeds, rngs = self._augmenter_random_states()
        for prefix, variables in ((self._SEED_KEY, seeds), (self._TF_RNG_KEY, rngs)):
            saved = sorted((k for k in store.keys() if k.startswith(prefix)), key=lambda k: int(k[len(prefix):]))
            if len(saved) == len(variables):  # (a file of the other backend holds no TF generator states)
                for key, v in zip(saved, variables):
                    v.assign(np.asarray(store[key]))

    def fit(self, *args, drop_remainder=True, **kwargs):
        """Keras' ``fit``, with two differences.

        In-memory images (NumPy arrays or tensors; or a tuple of view arrays) train in whole batches,
        as the train CLI's pipeline does: the rows are reshuffled each epoch (unless
        ``shuffle=False``) and that epoch's last ``len % batch_size`` left out, so no step sees a short
        batch. Epoch ``e``'s order depends on ``e`` and a seed, the augmenter's (``ViewAugmenter(seed=)``)
        or else one the model draws from NumPy's generator at its first such fit, so a resumed or
        continued fit meets the batches the uninterrupted one would have (see
        :mod:`uniclr_tf.training.whole_batches`). ``drop_remainder=False`` gives Keras's batching, a
        partial batch last. Datasets and generators are batched as they come.
        ``sample_weight`` and ``class_weight`` are refused: no term of the loss is a sample's own.

        With ``ema_total_steps=None`` (and an EMA target), the EMA momentum reaches 1 at this call's
        last step: the first call's schedule spans its epochs x steps per epoch, a later call's
        (``fit(epochs=4, initial_epoch=2)``, or ``fit`` again) the steps done plus its own."""
        kwargs = whole_batches.bind(args, kwargs)
        x = kwargs.get("x")
        scale = getattr(self.augmenter, "input_scale", None)
        if (isinstance(x, np.ndarray) and x.dtype.kind == "f" and scale is not None and scale > 1 and x.size
                and float(np.max(x)) <= 1.0):
            raise ValueError(f"UniCLR.fit: the images are floats in [0, 1], and the augmenter divides them by its "
                             f"input_scale={scale:g} (for uint8 or 0-255 images): they would train as near-black. "
                             "Pass uint8 images, or build the augmenter with input_scale=1.0")
        for name in ("validation_data", "validation_split"):
            if kwargs.get(name):
                raise ValueError(f"UniCLR.fit: {name} is not supported ({_NO_EVALUATE}); drop it and pass "
                                 "callbacks=[uniclr_tf.KNNMonitor(...)] to follow the features on held-out images")
        for name in ("sample_weight", "class_weight"):
            if kwargs.get(name) is not None:
                raise ValueError(f"UniCLR.fit: {name} is not supported: the self-supervised loss is a statistic of "
                                 "the whole batch, with no per-sample term to weight; drop it")
        if self._ema_pairs and self._ema_steps_from_fit:
            kwargs = whole_batches.with_callback(kwargs, _EMAScheduleFromFit(kwargs.get("initial_epoch", 0)))
        if drop_remainder:
            if self._whole_batches_seed is None:  # one per model: epoch e's order is the same in every fit
                seed = getattr(self.augmenter, "seed", None)  # (a seeded augmenter's: resumes need no more)
                self._whole_batches_seed = int(np.random.randint(2**31 - 1)) if seed is None else int(seed) + 7
            kwargs = whole_batches.as_whole_batches(kwargs, self._whole_batches_seed)
        self._warn_of_batches_of_unknown_size(kwargs.get("x"))
        before = self._state_before_fit()
        try:
            return super().fit(**kwargs)
        except BaseException:
            self._recover_from_a_failed_fit(before)
            raise

    def _warn_of_batches_of_unknown_size(self, x):
        """On TensorFlow the step is traced once for batches of unknown size (a ``tf.data`` dataset
        batched without ``drop_remainder``), so :meth:`_check_rows` cannot see a short last batch; for
        a method that whitens the rows of a batch together, say so."""
        spec = getattr(x, "element_spec", None)
        if spec is None or not self.method.whitens or keras.backend.backend() != "tensorflow":
            return
        first = next(iter(keras.tree.flatten(spec)), None)
        shape = getattr(first, "shape", None)
        if shape is None or shape.rank is None or shape.rank == 0 or shape[0] is not None:
            return
        warnings.warn_explicit(
            f"{self.method.name} whitens the rows of a batch together, and this dataset's batches have no static "
            "size (batched without drop_remainder=True), so a short last batch, whose covariance can be "
            "singular, is not checked. Batch it with drop_remainder=True, as the train CLI does",
            UserWarning, filename="uniclr_tf.UniCLR", lineno=1, module="uniclr_tf.nets.model")

    def _state_before_fit(self):
        """What :meth:`_recover_from_a_failed_fit` needs: on JAX, each variable's value (arrays, not
        copies) and the state Keras's loop last kept."""
        if keras.backend.backend() != "jax":
            return None
        optimizer = getattr(self, "optimizer", None)
        if optimizer is not None and not optimizer.built:  # (Keras would build it in the loop, unsaved)
            with batched_initialisers():  # its zeros from a few programs, not a compile for each shape
                optimizer.build(self.trainable_variables)
        variables = self.variables + self.metrics_variables + (list(optimizer.variables) if optimizer else [])
        return [(v, getattr(v, "_value", None)) for v in variables], getattr(self, "_jax_state", None)

    def _recover_from_a_failed_fit(self, before):
        """Leaves the model usable after a ``fit`` that raised (bad data in the first step, say), as a
        plain Keras model is: Keras reads no trial batch of a model built at construction, so such an
        error comes from inside the loop, which on JAX has detached the variables' values and on
        TensorFlow keeps a half-traced step. The step is made again at the next ``fit``; on JAX the
        variables get back the state of the last step that ran, or their values from before."""
        self.train_function = None
        if before is None:
            return
        values, jax_state = before
        if getattr(self, "_jax_state", None) is not jax_state and not self._jax_state_synced:
            self.jax_state_sync()  # steps ran in this call: their last state
        for variable, value in values:
            if variable._value is None and value is not None:
                variable._value = value

    def evaluate(self, *args, **kwargs):
        """Refused: a self-supervised loss on held-out images says little of the features, and no
        test step is defined. Measure the encoder instead: :func:`uniclr_tf.knn_eval`, the
        :class:`uniclr_tf.KNNMonitor` callback, or ``python -m uniclr_tf.linear_eval`` on a run."""
        raise NotImplementedError(f"UniCLR.evaluate: not supported ({_NO_EVALUATE}); measure the encoder with "
                                  "uniclr_tf.knn_eval(model.encoder, ...), the uniclr_tf.KNNMonitor callback, or "
                                  "python -m uniclr_tf.linear_eval")

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
                raise TypeError(f"options: pass them to methods.get({method.name!r}, ...), not next to a method "
                                "instance")
            return method
        if options is not None and not isinstance(options, dict):
            raise TypeError(f"options: expected a dict of the method's options; received {options!r}")
        if not isinstance(method, str):
            raise TypeError(f"method: expected a name of uniclr_tf.methods.names() or a method from "
                            f"uniclr_tf.methods.get(); received {method!r}")
        opts = dict(options or {})
        cls = methods.get_class(method) if method in methods.REGISTRY else None
        if cls is not None and cls.predictor == "optional" and predictor is not None:
            opts["predictor"] = True
        return methods.get(method, **opts)

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
        """Inference: ``{"features": backbone features, "embedding": projector output}`` of preprocessed
        float images, as the encoder takes them (uint8 images are refused: preprocess them first, e.g.
        with ``uniclr_tf.EvalPreprocess(size, augmenter.mean, augmenter.std)``)."""
        if keras.backend.standardize_dtype(getattr(images, "dtype", "float32")) == "uint8":
            raise TypeError("UniCLR: model(images) and predict take preprocessed float images, as the encoder does; "
                            "received uint8 images. Preprocess them first, e.g. uniclr_tf.EvalPreprocess(size, "
                            "model.augmenter.mean, model.augmenter.std)(images), as fit's views are normalised")
        features = self.encoder(images, training=training)
        return {"features": features, "embedding": self.projector(features, training=training)}

    # --- the step's maths, shared by both backends -------------------------------------------
    def _embed(self, views, training):
        """Runs each group of same-size views through the network as one batch (one BN batch), or each
        view alone (``view_batch_norm="per_view"``).

        Returns per-view lists: backbone features, projector outputs ``z``, online embeddings (the
        predictor's output where there is one) and the target embeddings: of the global views, and of
        the local ones too where the method compares a view with a local crop's target.
        """
        groups = [views[: self.num_global]]
        if len(views) > self.num_global:
            groups.append(views[self.num_global:])
        local_targets = any(j >= self.num_global for _, j in self.view_pairs(len(views)))
        kind = self.method.target_kind
        features, projected, online, target = [], [], [], []
        for g, group in enumerate(groups):
            for chunk in ([group] if self.view_batch_norm == "joint" else [[view] for view in group]):
                x = _interleave(chunk)
                f = self.encoder(x, training=training)
                z = self.projector(f, training=training)
                p = self.predictor(z, training=training) if self.predictor is not None else z
                features += _deinterleave(f, len(chunk))
                projected += _deinterleave(z, len(chunk))
                online += _deinterleave(p, len(chunk))
                if g == 0 or local_targets:
                    if kind == "ema":
                        t = ops.stop_gradient(self.target_projector(self.target_encoder(x, training=training),
                                                                    training=training))
                    else:
                        t = ops.stop_gradient(z) if kind == "stop_gradient" else z
                    target += _deinterleave(t, len(chunk))
        return features, projected, online, target

    def _symmetric_weight(self, i, j, rows):
        """``(γ',)`` for a method that takes the symmetric loss (its weight on the pair of views ``i``,
        ``j`` of ``rows`` rows), ``()`` for the others."""
        if not self.method.takes_symmetric_loss:
            return ()
        global_pair = i < self.num_global and j < self.num_global
        if rows.shape[0] is not None:
            return (self.method.symmetric_weight(global_pair, int(rows.shape[0])),)
        # A batch of unknown size (the last, smaller batch of an array, a dataset without drop_remainder):
        # the weight is γ·R/N (or γ), a function of the rows N known only when the step runs.
        one, two = self.method.symmetric_weight(global_pair, 1), self.method.symmetric_weight(global_pair, 2)
        if one == two:
            return (one,)
        return (one / ops.cast(ops.shape(rows)[0], "float32"),)

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
            x = self.augmenter(x, training=True, **self._augment_key())
        views = list(x)
        if len(views) < self.num_global:
            raise ValueError(f"Expected at least {self.num_global} views; received {len(views)}")
        features, projected, online, target = self._embed(views, training)
        if self.gather_across_replicas:
            online = [self.all_gather(z) for z in online]
            target = [self.all_gather(t) for t in target]
        self._check_rows(online[0])
        state = dict(self.method_state, step=self._steps_done(), steps_per_epoch=self.steps_per_epoch)
        pairs = self.view_pairs(len(views))
        results = self.method.pairs_loss(online, target, pairs, state,
                                         [self._symmetric_weight(i, j, online[i]) for i, j in pairs])
        loss = ops.mean(ops.stack([r[0] for r in results]))
        logs = {"objective_loss": loss,
                "embedding_std": objectives.embedding_std(ops.cast(projected[0], "float32"))}
        for term in results[0][1]:
            if term not in self._trackers:
                raise UsageError(f"--method={self.method.name} returned the term {term!r}, which it does not "
                                 f"declare in `terms` {self.method.terms}")
            logs[term] = ops.mean(ops.stack([r[1][term] for r in results]))
        if training:
            self.method.update_state(self.method_state, target[: self.num_global])
        total = loss
        if self.probe is not None and labels is not None:
            logits = ops.cast(self.probe(ops.stop_gradient(features[0])), "float32")
            probe_loss = ops.mean(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
            logs["probe_loss"] = probe_loss
            logs["probe_accuracy"] = ops.mean(ops.cast(ops.equal(ops.argmax(logits, -1), ops.cast(labels, "int32")), "float32"))
            total = total + probe_loss
        logs["loss"] = total
        return total, logs

    def _check_rows(self, embeddings):
        """Warns once per batch size (when the step is traced) of a batch that a whitening method
        cannot learn from: fewer rows than the features it whitens together (a singular covariance)."""
        rows, dim = embeddings.shape[0], embeddings.shape[-1]
        if rows is None or dim is None or (rows, dim) in self._checked_batches:
            return
        self._checked_batches.add((rows, dim))
        if int(rows) < 2:
            warnings.warn_explicit(
                f"{self.method.name}: a batch of {rows} row teaches nothing (no other sample to tell it from, and "
                "batch norm maps one row to zeros): the loss is constant. Use a larger batch_size (fit drops a "
                "short last batch of arrays unless drop_remainder=False)", UserWarning, filename="uniclr_tf.UniCLR",
                lineno=1, module="uniclr_tf.nets.model")
        try:  # (the joint-whitening methods' singular covariance is the warning below, not an error)
            if not self.method.whitens:
                self.method.check_setup(int(rows), int(dim))
        except UsageError as e:
            raise ValueError(f"{e} (here: a batch of {rows} rows, embedding size {dim}; in Python, the batch size "
                             "given to fit, the last of projector_dims, or the method's options)") from None
        options = self.method.options
        if (not self.method.whitens or options.get("whitening_mode", "cholesky") != "cholesky"
                or "eps" in self.method.given):
            return
        per_group = int(dim) // int(options.get("whitening_groups") or 1)
        if 2 * int(rows) <= per_group:
            warnings.warn_explicit(
                f"{self.method.name} whitens the {2 * rows} rows of both views of a batch of {rows} together, fewer "
                f"than the {per_group} features it whitens at once: the covariance is singular and the loss cannot "
                f"learn. Use a batch of more than {per_group // 2} rows, a smaller last size in projector_dims, "
                "options={'whitening_groups': G}, or state options={'eps': ...} to accept a ridge-regularised "
                "covariance", UserWarning, filename="uniclr_tf.UniCLR", lineno=1, module="uniclr_tf.nets.model")

    def _augment_key(self):
        """``{"batch_key": ...}`` on the TensorFlow backend for an augmenter that takes one and has a seed
        (``uniclr_tf.ViewAugmenter(seed=...)``): the step's views drawn from (seed, step, replica) alone, so
        a resumed run draws the views the uninterrupted one would have (on JAX the augmenter's
        seed-generator states are model variables, saved with the backups). Otherwise ``{}``: the
        augmenter's own random streams."""
        seed = getattr(self.augmenter, "seed", None)
        if keras.backend.backend() != "tensorflow" or seed is None or not augment.views.takes_batch_key(self.augmenter):
            return {}
        import tensorflow as tf

        replica = tf.distribute.get_replica_context()
        replica = 0 if replica is None else replica.replica_id_in_sync_group
        key = tf.stack([tf.constant(int(seed), tf.int64), tf.cast(self._steps_done(), tf.int64)])
        return {"batch_key": tf.random.experimental.stateless_fold_in(key, tf.cast(replica, tf.int64))}

    def _steps_done(self):
        """Optimizer steps done before this one (0 before ``compile``), for the methods' schedules."""
        if getattr(self, "optimizer", None) is None:
            return ops.convert_to_tensor(0, dtype="int64")
        return ops.convert_to_tensor(self.optimizer.iterations)

    def _momentum(self, step):
        if self.method.ema_schedule == "constant" or self.ema_total_steps is None:
            return ops.cast(self.ema_momentum, "float32")
        return momentum_schedule(step, self.ema_total_steps, self.ema_momentum)

    def current_ema_momentum(self):
        """The EMA momentum of the next step: constant (MoCo v2) or BYOL's cosine from the base to 1
        (the base before ``compile``)."""
        return self._momentum(self._steps_done())

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
