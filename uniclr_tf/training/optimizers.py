"""LARS (layer-wise adaptive rate scaling) as a Keras 3 optimizer, written in ``keras.ops``.

The rule is the one of SimCLR (google-research/simclr, ``tf2/lars_optimizer.py``) and BYOL, which
UniCLR trains with (paper §4.1: momentum 0.9, weight decay 1e-6, trust coefficient η = 0.001, biases
and batch-norm parameters excluded from decay and adaptation). For a parameter ``w`` with gradient
``g``, learning rate ``lr`` and momentum buffer ``v``::

    g ← g + wd·w                                  (only if w takes weight decay)
    trust = η·‖w‖ / (‖g‖ + ε)  if ‖w‖ > 0 and ‖g‖ > 0, else 1   (only if w is adapted)
    v ← momentum·v + lr·trust·g
    w ← w − v                                     (Nesterov: w ← w − (momentum·v + lr·trust·g))

With ``clip_lr`` (LARC's clipping) an adapted parameter's rate ``lr·trust`` becomes ``min(trust, lr)``.
The decay is added to the gradient once, *before* the trust ratio, so it also enters ``‖g‖``.
The Keras base optimizer would additionally apply its own decoupled decay (``w ← w − lr·wd·w``)
whenever its ``weight_decay`` attribute is set, so a LARS that handed it the coefficient would
decay every weight twice; LARS therefore keeps its coefficient in ``lars_weight_decay`` and hands
``weight_decay=None`` to the base class. (No ready-made LARS fits Keras 3: tensorflow-addons
never had one and no longer imports, and tf-models-official's is a Keras 2 legacy optimizer.)

:class:`SGD` is the same rule without the trust ratio (PyTorch's momentum SGD with L2 in the gradient).
:func:`build_optimizer` is the one factory of the optimizers this project trains with (LARS,
SGD, AdamW), used by pretraining, linear evaluation and fine-tuning.
"""

import numbers
import re

import keras
from keras import ops

#: LARS's trust coefficient η in the paper (and SimCLR's, BYOL's): the default of every way to build one.
LARS_ETA = 0.001


def _as_patterns(value, arg_name):
    """Normalises ``None`` / a string / a sequence of strings into a tuple of strings."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    try:
        patterns = tuple(value)
    except TypeError:
        raise ValueError(f"`{arg_name}` must be None, a string or a list of strings (name "
                         f"substrings or regular expressions). Received: {arg_name}={value!r}")
    for pattern in patterns:
        if not isinstance(pattern, str):
            raise ValueError(f"`{arg_name}` must contain only strings (name substrings or "
                             f"regular expressions). Received: {arg_name}={value!r}")
        try:
            re.compile(pattern)
        except re.error as err:
            raise ValueError(f"`{arg_name}` holds an invalid regular expression {pattern!r}: {err}")
    return patterns


def variable_name(variable):
    """The name exclusion patterns are matched against.

    ``variable.path`` (e.g. ``"encoder/conv1/kernel"``) for Keras variables; a raw ``tf.Variable``
    (what the TF backend hands to ``update_step``) has no ``.path``, so fall back to ``.name``
    without its ``":0"`` suffix (for a Keras variable's backing ``tf.Variable`` that is the path).
    """
    path = getattr(variable, "path", None)
    if path:
        return str(path)
    return re.sub(r":\d+$", "", str(getattr(variable, "name", "")))


@keras.saving.register_keras_serializable(package="uniclr_tf")
class LARS(keras.optimizers.Optimizer):
    """LARS with momentum, as in SimCLR and BYOL (decay folded into the gradient).

    Args:
        learning_rate: float, or a ``LearningRateSchedule`` (e.g.
            ``uniclr_tf.training.schedules.WarmupCosine``), or a callable.
        momentum: float in [0, 1]. 0 disables the momentum buffer (no slot variables).
        weight_decay: float >= 0, the L2 coefficient added to the gradient (``g + wd·w``) of every
            parameter not excluded. Not the Keras base optimizer's decoupled decay: that one stays
            off (``self.weight_decay is None``); the coefficient lives in ``lars_weight_decay``.
        eta: float > 0, the trust coefficient η.
        epsilon: float >= 0 added to ``‖g‖`` in the trust ratio (0, as SimCLR and BYOL).
        nesterov: bool, Nesterov momentum.
        clip_lr: bool, default False. LARC's clipping (NVIDIA apex's ``LARC(clip=True)``, solo-learn's
            ``clip_lars_lr``, which its CIFAR configs use with η = 0.02): an adapted parameter moves at
            ``min(η·‖w‖/‖g‖, lr)`` instead of ``lr·η·‖w‖/‖g‖``, so the trust ratio sets the rate and the
            schedule only caps it.
        exclude_from_adaptation: None, a string or a list of strings; parameters whose name
            matches one of them (``re.search`` on ``variable.path``, or on ``.name`` for raw
            ``tf.Variable``s) keep a trust ratio of 1. Plain substrings such as ``"bias"`` work.
        exclude_from_weight_decay: same form; matching parameters take no weight decay.
        exclude_vectors: bool, default True: parameters with at most one dimension (biases,
            batch-norm γ/β) are excluded from both decay and adaptation, as in BYOL and the paper.
        trust_ratio: bool, default True; False adapts no parameter (plain momentum SGD with the
            decay in the gradient: :class:`SGD`).
        name: optimizer name.
        **kwargs: the Keras base optimizer's keywords (``clipnorm``, ``global_clipnorm``,
            ``use_ema``, ``loss_scale_factor``, ``gradient_accumulation_steps``, ...).

    Exclusions are resolved once, in ``build()``, where the optimizer sees the model's Keras
    variables with their paths; ``update_step`` then looks the decision up by variable index, so it
    also holds on the TF backend, whose ``update_step`` receives raw ``tf.Variable``s.
    Sparse gradients (``tf.IndexedSlices``) are densified: the trust ratio needs the full norm.

    Examples:
        >>> schedule = uniclr_tf.WarmupCosine(0.3, batch_size=512, total_steps=10_000, warmup_steps=1_000)
        >>> model.compile(optimizer=uniclr_tf.LARS(schedule, momentum=0.9, weight_decay=1e-6))
    """

    def __init__(self, learning_rate, momentum=0.9, weight_decay=1e-6, eta=LARS_ETA,
                 epsilon=0.0, nesterov=False, exclude_from_adaptation=None,
                 exclude_from_weight_decay=None, exclude_vectors=True, trust_ratio=True, name="lars",
                 fixed_learning_rate=None, fixed_lr_patterns=None, clip_lr=False, **kwargs):
        # Never forward LARS's decay to the base class: it would apply a second, decoupled decay.
        super().__init__(learning_rate=learning_rate, weight_decay=None, name=name, **kwargs)
        self.momentum = self._check_float("momentum", momentum, 0.0, 1.0)
        self.lars_weight_decay = self._check_float("weight_decay", weight_decay, 0.0, None)
        self.eta = self._check_float("eta", eta, 0.0, None, strict_low=True)
        self.epsilon = self._check_float("epsilon", epsilon, 0.0, None)
        self.nesterov = self._check_bool("nesterov", nesterov)
        self.clip_lr = self._check_bool("clip_lr", clip_lr)
        self.exclude_vectors = self._check_bool("exclude_vectors", exclude_vectors)
        self.trust_ratio = self._check_bool("trust_ratio", trust_ratio)
        self.exclude_from_adaptation_patterns = _as_patterns(
            exclude_from_adaptation, "exclude_from_adaptation")
        self.exclude_from_weight_decay_patterns = _as_patterns(
            exclude_from_weight_decay, "exclude_from_weight_decay")
        self._excluded_from_decay_keys = set()  # from exclude_from_weight_decay(var_list=...)
        # SimSiam's "fixed lr for the predictor": matching parameters take this constant rate
        # (before any trust ratio) instead of the schedule's.
        self.fixed_lr_patterns = _as_patterns(fixed_lr_patterns, "fixed_lr_patterns")
        if self.fixed_lr_patterns and fixed_learning_rate is None:
            raise ValueError("`fixed_lr_patterns` needs `fixed_learning_rate`")
        self.fixed_learning_rate = (None if fixed_learning_rate is None else
                                    self._check_float("fixed_learning_rate", fixed_learning_rate, 0.0, None))
        self._decay_flags = []
        self._adapt_flags = []
        self._fixed_flags = []

    @staticmethod
    def _check_float(arg, value, low, high, strict_low=False):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"`{arg}` must be a float. Received: {arg}={value!r}")
        value = float(value)
        too_low = value <= low if strict_low else value < low
        if too_low or (high is not None and value > high) or value != value:
            bounds = f"{'>' if strict_low else '>='} {low}" + (
                f" and <= {high}" if high is not None else "")
            raise ValueError(f"`{arg}` must be {bounds}. Received: {arg}={value!r}")
        return value

    @staticmethod
    def _check_bool(arg, value):
        if not isinstance(value, bool):
            raise ValueError(f"`{arg}` must be a bool. Received: {arg}={value!r}")
        return value

    # --- exclusion rules -------------------------------------------------------------------

    def exclude_from_weight_decay(self, var_list=None, var_names=None):
        """Keras's API for exclusions, mapped onto LARS's own decay (call before ``build``)."""
        if self.built:
            raise ValueError("`exclude_from_weight_decay()` can only be configured before the "
                             "optimizer is built.")
        if var_list:
            self._excluded_from_decay_keys.update(self._var_key(v) for v in var_list)
        if var_names:
            self.exclude_from_weight_decay_patterns += _as_patterns(var_names, "var_names")

    def _matches(self, variable, patterns):
        name = variable_name(variable)
        return any(re.search(p, name) for p in patterns)

    def uses_weight_decay(self, variable):
        """Whether ``variable`` takes the ``g + wd·w`` term (static, per variable)."""
        if self.lars_weight_decay == 0.0:
            return False
        if self.exclude_vectors and len(variable.shape) <= 1:
            return False
        if self._var_key(variable) in self._excluded_from_decay_keys:
            return False
        return not self._matches(variable, self.exclude_from_weight_decay_patterns)

    def uses_adaptation(self, variable):
        """Whether ``variable``'s step is scaled by the trust ratio (static, per variable)."""
        if not self.trust_ratio:
            return False
        if self.exclude_vectors and len(variable.shape) <= 1:
            return False
        return not self._matches(variable, self.exclude_from_adaptation_patterns)

    # --- Keras optimizer protocol ----------------------------------------------------------

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        # Resolved here, while the variables still carry their Keras paths.
        self._decay_flags = [self.uses_weight_decay(v) for v in variables]
        self._adapt_flags = [self.uses_adaptation(v) for v in variables]
        self._fixed_flags = [self._matches(v, self.fixed_lr_patterns) for v in variables]
        self.momentums = []
        if self.momentum != 0.0:
            self.momentums = self.add_optimizer_variables(variables, "momentum")

    def update_step(self, gradient, variable, learning_rate):
        index = self._get_variable_index(variable)
        dtype = variable.dtype
        lr = ops.cast(self.fixed_learning_rate if self._fixed_flags[index] else learning_rate, dtype)
        grad = ops.cast(ops.convert_to_tensor(gradient), dtype)
        w = ops.convert_to_tensor(variable)

        if self._decay_flags[index]:
            grad = ops.add(grad, ops.multiply(ops.cast(self.lars_weight_decay, dtype), w))

        if self._adapt_flags[index]:
            w_norm = ops.sqrt(ops.sum(ops.square(w)))
            g_norm = ops.sqrt(ops.sum(ops.square(grad)))
            both_positive = ops.logical_and(ops.greater(w_norm, 0), ops.greater(g_norm, 0))
            safe_denominator = ops.where(both_positive, g_norm + ops.cast(self.epsilon, dtype),
                                         ops.ones_like(g_norm))
            trust = ops.where(
                both_positive,
                ops.cast(self.eta, dtype) * w_norm / safe_denominator,
                ops.ones_like(w_norm))
            if self.clip_lr:  # lr · min(trust / lr, 1) = min(trust, lr) (0 where lr is 0)
                lr = ops.where(both_positive, ops.minimum(trust, lr), lr)
            else:
                lr = lr * trust

        scaled_grad = ops.multiply(grad, lr)
        if self.momentum == 0.0:
            self.assign_sub(variable, scaled_grad)
            return
        v = self.momentums[index]
        momentum = ops.cast(self.momentum, dtype)
        new_v = ops.add(ops.multiply(v, momentum), scaled_grad)
        self.assign(v, new_v)
        if self.nesterov:
            self.assign_sub(variable, ops.add(ops.multiply(new_v, momentum), scaled_grad))
        else:
            self.assign_sub(variable, new_v)

    def get_config(self):
        config = super().get_config()
        config.update({
            "momentum": self.momentum,
            "weight_decay": self.lars_weight_decay,  # LARS's own; the base one is always None
            "eta": self.eta,
            "epsilon": self.epsilon,
            "nesterov": self.nesterov,
            "clip_lr": self.clip_lr,
            "exclude_from_adaptation": list(self.exclude_from_adaptation_patterns),
            "exclude_from_weight_decay": list(self.exclude_from_weight_decay_patterns),
            "exclude_vectors": self.exclude_vectors,
            "trust_ratio": self.trust_ratio,
            "fixed_learning_rate": self.fixed_learning_rate,
            "fixed_lr_patterns": list(self.fixed_lr_patterns),
        })
        return config


@keras.saving.register_keras_serializable(package="uniclr_tf")
class SGD(LARS):
    """Momentum SGD with the weight decay folded into the gradient, as ``torch.optim.SGD``.

    ``g ← g + wd·w; v ← momentum·v + lr·g; w ← w − v``: LARS without the trust ratio, every
    parameter decayed (biases and batch-norm γ/β too, as PyTorch does) unless excluded by name.
    This is the rule the SSL recipes written in PyTorch (SimCLR/MoCo/BYOL ports, solo-learn,
    lightly) calibrate their ``weight_decay`` for. Keras's own ``keras.optimizers.SGD`` decays
    *decoupled* (``w ← w − lr·wd·w`` after the step), which with momentum 0.9 is about ten times
    weaker for the same coefficient: a PyTorch recipe's 5e-4 there barely regularises.

    Args:
        learning_rate, momentum, nesterov, exclude_from_weight_decay: as :class:`LARS`.
        weight_decay: float >= 0 (default 0), the L2 coefficient added to the gradient.
        exclude_vectors: bool, default False: True spares 1-D parameters from decay.
        **kwargs: the Keras base optimizer's keywords.
    """

    def __init__(self, learning_rate, momentum=0.9, weight_decay=0.0, nesterov=False,
                 exclude_from_weight_decay=None, exclude_vectors=False, name="sgd", **kwargs):
        for key in ("trust_ratio", "eta", "epsilon", "clip_lr", "exclude_from_adaptation"):  # from get_config
            kwargs.pop(key, None)
        super().__init__(learning_rate, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov,
                         exclude_from_weight_decay=exclude_from_weight_decay,
                         exclude_vectors=exclude_vectors, trust_ratio=False, name=name, **kwargs)


#: The optimizers :func:`build_optimizer` builds.
OPTIMIZER_NAMES = ("lars", "sgd", "adamw")


def build_optimizer(name, learning_rate, momentum=0.9, weight_decay=0.0, exclude_from_adaptation=(),
                    exclude_from_weight_decay=(), nesterov=False, fixed_learning_rate=None, fixed_lr_patterns=(),
                    eta=LARS_ETA, clip_lr=False):
    """The optimizer called ``name``, built the one way the project builds it.

    Args:
      name: ``"lars"``, ``"sgd"`` or ``"adamw"``.
      learning_rate: a float, a ``LearningRateSchedule`` (e.g. ``schedules.WarmupCosine``) or a callable.
      momentum: momentum of LARS and SGD (AdamW has its own moment estimates and ignores it).
      weight_decay: LARS: added to the gradient (``g + wd·w``), 1-D parameters excluded;
        SGD: added to the gradient of every parameter, as PyTorch (0: none); AdamW: its decoupled decay.
      exclude_from_adaptation: LARS only: name patterns (substrings or regular expressions,
        ``re.search`` on the variable path) of parameters that keep a trust ratio of 1.
      exclude_from_weight_decay: LARS and SGD: name patterns of parameters that take no decay,
        e.g. ``["linear_probe"]`` for the online probe. AdamW takes none (Keras matches its own
        exclusions on variable names, not paths; refused rather than half-honoured).
      nesterov: Nesterov momentum (LARS and SGD; e.g. SimCLR's fine-tuning).
      fixed_learning_rate, fixed_lr_patterns: LARS and SGD: parameters matching the patterns take
        the constant ``fixed_learning_rate`` instead of the schedule (SimSiam's predictor).
      eta, clip_lr: LARS only: the trust coefficient and LARC's clipping (:class:`LARS`).

    Returns:
      ``LARS``, :class:`SGD` (this module's, PyTorch's rule) or ``keras.optimizers.AdamW``.

    Raises:
      ValueError: unknown ``name``, exclusions for SGD / AdamW, or LARS's ``eta`` / ``clip_lr`` changed
        for another optimizer.
    """
    if name not in OPTIMIZER_NAMES:
        raise ValueError(f"optimizer must be one of {OPTIMIZER_NAMES}; received {name!r}")
    adaptation = _as_patterns(exclude_from_adaptation, "exclude_from_adaptation")
    decay = _as_patterns(exclude_from_weight_decay, "exclude_from_weight_decay")
    fixed = dict(fixed_learning_rate=fixed_learning_rate, fixed_lr_patterns=list(fixed_lr_patterns) or None)
    if name != "lars" and (eta != LARS_ETA or clip_lr):
        raise ValueError(f"eta and clip_lr are LARS options; the {name} optimizer takes none "
                         f"(received eta={eta!r}, clip_lr={clip_lr!r})")
    if name == "lars":
        return LARS(learning_rate, momentum=momentum, weight_decay=weight_decay, nesterov=bool(nesterov),
                    eta=eta, clip_lr=clip_lr,
                    exclude_from_adaptation=list(adaptation) or None,
                    exclude_from_weight_decay=list(decay) or None, **fixed)
    if name == "sgd":
        if adaptation:
            raise ValueError(f"exclude_from_adaptation is a LARS option; SGD has no trust ratio "
                             f"(received {list(adaptation)})")
        return SGD(learning_rate, momentum=momentum, weight_decay=weight_decay, nesterov=bool(nesterov),
                   exclude_from_weight_decay=list(decay) or None, **fixed)
    if fixed_lr_patterns:
        raise ValueError(f"fixed_lr_patterns is a LARS and SGD option; the {name} optimizer takes none")
    if adaptation or decay:
        raise ValueError(f"exclude_from_adaptation / exclude_from_weight_decay are LARS and SGD options; the "
                         f"{name} optimizer takes none (received {list(adaptation)}, {list(decay)})")
    return keras.optimizers.AdamW(learning_rate, weight_decay=weight_decay)
