"""What a self-supervised method is, in one small class.

A method declares, and the model (:class:`uniclr_tf.nets.model.UniCLR`) wires:

* ``pair_loss(online, target, state)``: its loss between the online embedding of one view and the
  target embedding of another (a function of :mod:`uniclr_tf.objectives`), with its terms;
  ``pairs_loss`` runs it over the compared pairs, and a method whose pairs share work overrides that
  (W-MSE whitens each view once for all of its pairs);
* ``terms``: the names of the terms it logs (progress bar, CSV, TensorBoard, ``history.json``);
* its heads: ``projector_last_bn`` (BN after the projector's last layer or not) and ``predictor``
  (``"never"``, ``"optional"`` through the ``predictor`` option, or ``"always"``);
* its target branch, ``target``: ``"same"`` (the online projector output, gradient flows),
  ``"stop_gradient"`` (the same, detached: SimSiam) or ``"ema"`` (a momentum copy of encoder and
  projector: BYOL, MoCo); a method with an ``ema_momentum`` option gets an EMA target when it is > 0;
* per-step state other than the EMA: ``uses_queue`` (MoCo's FIFO queue of past target embeddings),
  or its own ``build_state`` / ``update_state`` (DINO's centre; SwAV's prototypes, trainable
  weights of the model that the method owns); ``pair_loss`` also finds ``state["step"]`` (the
  optimizer steps done, 0 before compile) and ``state["steps_per_epoch"]`` (None when the model was
  not told) for schedules in epochs (SwAV's prototype freezing, DINO's teacher temperature);
* ``build_projector``: the projector head (default: the MLP of ``heads.projector``; DINO's ends
  with its weight-normalised prototype layer, so that the EMA teacher copies it);
* ``views``: the name of its augmentation recipe in :data:`uniclr_tf.augment.RECIPES`;
* ``defaults``: its options and their default values. Options shared by several methods
  (temperature, EMA momentum, ...) are described once in :data:`COMMON_OPTIONS`; an option new to
  one method is described in that method's ``option_specs``. Every option is a flag of the train
  CLI; a flag that the chosen method does not take is an error naming the flag.

Which view is compared with which:

* a symmetric method (no predictor, target ``"same"``): every unordered pair of global views;
* an asymmetric one (predictor, stop-gradient or EMA target): ordered pairs ``(i, j)``, ``i != j``;
* multi-crop: each local view against every global target;
* a method may choose its own pairs by overriding ``view_pairs`` (W-MSE's ``wmse_all_pairs``: every
  pair of views); the model then also gives the local views targets where a pair needs them.

The objective is the mean over these pairs, so its scale does not change with the number of crops
(the authors of BYOL and MoCo v3 sum the two directions instead: a factor 2 that LARS's trust ratio
absorbs).
"""

import dataclasses
import numbers
from typing import Any, Callable

import numpy as np

from keras import ops

from uniclr_tf import objectives
from uniclr_tf.nets import heads
from uniclr_tf.config.errors import UsageError


@dataclasses.dataclass(frozen=True)
class Option:
    """One method option: its type (``float``, ``int``, ``bool`` or ``str``), a help text for the
    flag, a check of its value (``check(value) -> bool``) and what the check expects (for the error)."""

    kind: type
    help: str
    check: Callable[[Any], bool] = lambda value: True
    expected: str = ""
    choices: tuple = ()


def _of_kind(value, kind):
    """Whether ``value`` is an option value of type ``kind`` (NumPy scalars and whole floats for ints too)."""
    if kind is bool or isinstance(value, (bool, np.bool_)):  # a bool is no number here, a number no bool
        return kind is bool and isinstance(value, (bool, np.bool_))
    if kind is str:
        return isinstance(value, str)
    if not isinstance(value, numbers.Real):
        return False
    return kind is not int or isinstance(value, numbers.Integral) or float(value).is_integer()


def _positive(v):
    return v > 0


def _non_negative(v):
    return v >= 0


COMMON_OPTIONS = {
    "temperature": Option(float, "Temperature τ of the affinity / logits (the method's default if unset).",
                          _positive, "a number > 0"),
    "symmetric_loss_weight": Option(
        float, "Weight γ of the symmetric loss ‖A − Aᵀ‖_F on the affinity A = n(z1) n(z2)ᵀ / τ "
               "(UniCLR Eq. 5); any affinity-based method takes it. Alias: --gamma.",
        _non_negative, "a number >= 0"),
    "symmetric_pairs": Option(
        str, "Which view pairs the symmetric loss is taken on: global (the two-view affinity the paper "
             "defines it on; default) or all (every compared pair, local crops too: collapsed the "
             "multi-crop recipe on some seeds, see docs).", choices=("global", "all")),
    "symmetric_reference_batch": Option(
        int, "The symmetric loss is scaled by R/N for a batch of N rows, so that γ means at every batch "
             "what it means at R rows (‖A − Aᵀ‖_F grows with N); 0 = the paper's unscaled term. "
             "Default 512, the paper's batch.", _non_negative, "an integer >= 0"),
    "eps": Option(float, "Ridge ε added to the covariance before the Cholesky factorisation (W-MSE: the "
                         "shrinkage (1 − ε)·Σ + ε·I, ε in [0, 1)).",
                  _positive, "a number > 0 (the ridge keeps Cholesky finite)"),
    "whitening_mode": Option(str, "SimWhitening: cholesky (paper) or one_sided (authors' code).",
                             choices=("cholesky", "one_sided")),
    "stop_gradient_cov": Option(bool, "Stop the gradient through the whitening statistics (authors' code)."),
    "l2_first": Option(bool, "SimWhitening / SimTrace: l2-normalise the embeddings before the whitening "
                             "statistics (authors' code; the paper whitens them as they are)."),
    "whitening_groups": Option(int, "Whiten G feature groups separately (block-diagonal covariance; cheap "
                                    "at large D); 1 is the paper's full whitening.", _positive,
                               "a positive divisor of the embedding size"),
    "symmetric_directions": Option(bool, "Average the cross-entropy over both directions L(z1,z2), "
                                         "L(z2,z1) (authors' code)."),
    "ema_momentum": Option(float, "Base momentum of the EMA target encoder (rises to 1 on BYOL's cosine "
                                  "unless the method keeps it constant); 0 disables it where optional.",
                           lambda v: 0 <= v < 1, "a number in [0, 1)"),
    "predictor": Option(bool, "Add the asymmetric predictor on the online branch."),
    "queue_size": Option(int, "Number of past target embeddings kept as negatives (MoCo's queue).",
                         _positive, "an integer > 0"),
    "num_prototypes": Option(int, "Number K of prototypes (SwAV) / outputs of the head's last layer (DINO).",
                             _positive, "an integer > 0"),
}


#: Options of every method that takes the symmetric loss, with their defaults.
SYMMETRIC_DEFAULTS = {"symmetric_pairs": "global", "symmetric_reference_batch": 512}


class Method:
    """Base class of the methods; a subclass sets the class attributes and ``pair_loss``."""

    name = ""
    family = ""
    paper = ""  # citation shown in the README's method table
    terms = ()
    target = "same"  # "same" | "stop_gradient" | "ema"
    predictor = "never"  # "never" | "optional" | "always"
    projector_last_bn = True
    views = "uniclr"
    defaults = {}
    option_specs = {}
    ema_schedule = "cosine"  # "cosine" (BYOL: base -> 1) | "constant" (MoCo v1/v2)
    uses_queue = False
    whitens = False  # Cholesky-whitens the 2N rows of both views jointly (needs 2N > D per group)

    def __init__(self, **options):
        given = {k: v for k, v in options.items() if v is not None}
        unknown = sorted(set(given) - set(self.defaults))
        if unknown:
            raise UsageError(self.not_applicable_message(unknown[0]))
        self.given = dict(given)
        self.options = {**self.defaults, **given}
        for key, value in self.options.items():
            spec = self.spec(key)
            if not _of_kind(value, spec.kind):
                expected = f"{spec.expected} (a {spec.kind.__name__})" if spec.expected else f"a {spec.kind.__name__}"
                raise UsageError(f"--{key}: expected {expected} for --method={self.name}; received {value!r} "
                                 f"({type(value).__name__})")
            if spec.kind is int and not isinstance(value, int):
                value = self.options[key] = int(value)  # a NumPy int or a whole float
            if spec.choices and value not in spec.choices:
                raise UsageError(f"--{key}: expected one of {spec.choices}; received {value!r}")
            if not spec.choices and not spec.check(value):
                raise UsageError(f"--{key}: expected {spec.expected} for --method={self.name}; received {value!r}")
        if self.target == "ema" and not self.options.get("ema_momentum"):
            raise UsageError(f"--ema_momentum: {self.name} needs an EMA target, so a number in (0, 1); "
                             f"received {self.options.get('ema_momentum')!r}")

    # --- declarations ------------------------------------------------------------------------
    @classmethod
    def spec(cls, option):
        return cls.option_specs.get(option) or COMMON_OPTIONS[option]

    @classmethod
    def not_applicable_message(cls, option):
        flag = "--symmetric_loss_weight (alias --gamma)" if option == "symmetric_loss_weight" else f"--{option}"
        takes = ", ".join(f"--{k}" for k in sorted(cls.defaults)) or "no options"
        return f"{flag} does not apply to --method={cls.name}; it takes {takes}"

    @property
    def target_kind(self):
        """``"ema"`` when the method has (or was given) an EMA target, else ``target``."""
        if self.target == "ema" or self.options.get("ema_momentum"):
            return "ema"
        return self.target

    @property
    def ema_momentum(self):
        return float(self.options["ema_momentum"]) if self.target_kind == "ema" else None

    @property
    def uses_predictor(self):
        return self.predictor == "always" or (self.predictor == "optional" and bool(self.options.get("predictor")))

    @property
    def asymmetric(self):
        return self.uses_predictor or self.target_kind != "same"

    def view_pairs(self, num_global, num_views):
        """(online index, target index) pairs compared by the loss; see the module docstring."""
        g = range(num_global)
        pairs = [(i, j) for i in g for j in g if (i != j if self.asymmetric else i < j)]
        pairs += [(l, j) for l in range(num_global, num_views) for j in g]
        return pairs

    @property
    def takes_symmetric_loss(self):
        return "symmetric_loss_weight" in self.defaults

    def symmetric_weight(self, global_pair, rows):
        """The weight γ' of the symmetric loss for one compared pair of ``rows`` rows: 0 where it does
        not apply (no γ, or a pair with a local crop under ``symmetric_pairs=global``), else γ scaled by
        ``symmetric_reference_batch / rows`` (γ itself when that option is 0, the paper's term)."""
        gamma = float(self.options.get("symmetric_loss_weight") or 0.0)
        if not gamma or (not global_pair and self.options.get("symmetric_pairs", "global") == "global"):
            return 0.0
        reference = int(self.options.get("symmetric_reference_batch") or 0)
        return gamma * reference / int(rows) if reference else gamma

    def check_setup(self, batch_size, embedding_dim):
        """Raises ValueError (naming the flags) for a batch or embedding size this method can't use.
        ``batch_size`` is the number of rows one loss call sees (global, or per replica)."""
        groups = self.options.get("whitening_groups")
        if groups and embedding_dim % groups:
            raise UsageError(f"--whitening_groups={groups}: expected a positive divisor of the embedding size "
                             f"{embedding_dim} (--projector_dims)")
        if self.whitens and self.options.get("whitening_mode", "cholesky") == "cholesky" and "eps" not in self.given:
            per_group = embedding_dim // (groups or 1)
            if 2 * batch_size <= per_group:
                raise UsageError(
                    f"--batch_size={batch_size}: {self.name} whitens the 2N = {2 * batch_size} rows of both views, "
                    f"fewer than the {per_group} features per whitening group (--projector_dims ending in "
                    f"{embedding_dim}, --whitening_groups={groups or 1}): the covariance is singular, the whitened "
                    "affinity is constant and the loss cannot learn. Use a batch with 2N > D/G, "
                    f"--whitening_groups=G with {embedding_dim}/G < {2 * batch_size}, or state --eps to accept a "
                    "ridge-regularised covariance")

    def setup_warnings(self):
        """Lines warning of a set-up that is valid but was measured not to learn (printed before
        training); empty for most."""
        return []

    # --- heads -------------------------------------------------------------------------------
    def build_projector(self, input_dim, dims, norm=None):
        """The projector head, features ``[B, input_dim]`` -> embeddings: the MLP of
        :func:`uniclr_tf.nets.heads.projector` with ``dims`` (BN after the last layer or not, as
        ``projector_last_bn`` says); a method with another head overrides this."""
        return heads.projector(input_dim, dims, norm=norm, last_bn=self.projector_last_bn)

    # --- per-step state ----------------------------------------------------------------------
    def build_state(self, model, embedding_dim):
        """Creates the method's non-trainable state on ``model``; returns it as a dict."""
        if not self.uses_queue:
            return {}
        queue = model.add_weight(shape=(int(self.options["queue_size"]), int(embedding_dim)),
                                 initializer="random_normal", trainable=False, name="queue",
                                 dtype="float32")
        return {"queue": queue}

    def update_state(self, state, targets):
        """After the loss of a training step: pushes this step's target embeddings (all global views,
        newest first) into the queue, dropping the oldest. Runs inside the step like BN statistics."""
        if "queue" not in state:
            return
        queue = state["queue"]
        keys = ops.cast(ops.stop_gradient(ops.concatenate(list(targets), axis=0)), "float32")
        size = queue.shape[0]
        new = ops.concatenate([keys, ops.convert_to_tensor(queue)], axis=0)[:size]
        queue.assign(new)

    # --- the loss ----------------------------------------------------------------------------
    def pair_loss(self, online, target, state):
        """``(loss, terms)`` between online view ``i`` and target view ``j`` (``[N, D]`` each).

        A method that takes the symmetric loss (``symmetric_loss_weight`` in its ``defaults``) gets a
        fourth argument, ``gamma``: the weight of that term for this pair (:meth:`symmetric_weight`)."""
        raise NotImplementedError

    def pairs_loss(self, online, target, pairs, state, weights):
        """``[(loss, terms), ...]``, one for each ``(i, j)`` of ``pairs``: :meth:`pair_loss` of
        ``online[i]`` and ``target[j]``, each with its pair's entry of ``weights`` (``(gamma,)`` for a
        method that takes the symmetric loss, else ``()``). A method whose pairs share work overrides it."""
        return [self.pair_loss(online[i], target[j], state, *weight) for (i, j), weight in zip(pairs, weights)]

    def with_symmetry(self, loss, terms, online, target, gamma):
        """Adds the UniCLR symmetric loss ``γ‖A − Aᵀ‖_F`` (Eq. 5) on ``A = n(online) n(target)ᵀ / τ``
        to an affinity-based loss, with ``gamma`` from :meth:`symmetric_weight`, and logs the unweighted
        ``symmetry`` as a diagnostic."""
        a = objectives.affinity_matrix(online, ops.stop_gradient(target) if self.target_kind != "same" else target,
                                       temperature=self.options["temperature"])
        symmetry = objectives.symmetry_loss(a)
        if not isinstance(gamma, (int, float)):  # a tensor: the weight of a batch of unknown size
            loss = loss + ops.cast(gamma, loss.dtype) * symmetry
        elif gamma:
            loss = loss + gamma * symmetry
        return loss, dict(terms, symmetry=symmetry)

    def __repr__(self):
        opts = ", ".join(f"{k}={v!r}" for k, v in sorted(self.options.items()))
        return f"{type(self).__name__}({opts})"
