"""The UniCLR objectives (arXiv 2211.14516): SimAffinity, SimWhitening, SimTrace.

Symmetric when used plain; the paper's tricks (Table 1) are options: an EMA target
(``--ema_momentum``), a predictor (``--predictor``) and multi-crop (any method). The symmetric loss
``γ‖A − Aᵀ‖_F`` is part of SimAffinity's and SimWhitening's definition (Eq. 6), with γ the option
``symmetric_loss_weight`` (alias ``--gamma``). By default it is taken on the global-view pairs only
and scaled to the paper's batch of 512 (``symmetric_pairs``, ``symmetric_reference_batch``: see
:meth:`uniclr_tf.methods.base.Method.symmetric_weight`); ``--symmetric_pairs=all
--symmetric_reference_batch=0`` is the paper's plain term on every compared pair.
"""

from uniclr_tf import objectives
from uniclr_tf.methods.base import SYMMETRIC_DEFAULTS, Method

PAPER = "Li et al. 2022, arXiv 2211.14516"
_TRICKS = {"ema_momentum": 0.0, "predictor": False}
_WHITENING = {"eps": 1e-4, "stop_gradient_cov": False, "whitening_groups": 1, "l2_first": False}


class SimAffinity(Method):
    """Cross-entropy over the rows of the affinity ``A = n(z1) n(z2)ᵀ / τ`` plus ``γ‖A − Aᵀ‖_F``."""

    name, family, paper = "simaffinity", "UniCLR", PAPER
    terms = ("cross_entropy", "symmetry")
    predictor = "optional"
    defaults = {"temperature": 0.5, "symmetric_loss_weight": 0.01, "symmetric_directions": False,
                **SYMMETRIC_DEFAULTS, **_TRICKS}

    def pair_loss(self, online, target, state, gamma=0.0):
        o = self.options
        return objectives.sim_affinity_loss(online, target, temperature=o["temperature"], gamma=gamma,
                                            symmetric_directions=o["symmetric_directions"], return_terms=True)

    def setup_warnings(self):
        if (self.target_kind == "ema" and not self.uses_predictor and self.options["symmetric_loss_weight"] > 0
                and self.options["symmetric_pairs"] == "all"):
            return ["warning: SimAffinity with an EMA target (--ema_momentum), no --predictor and the symmetric loss "
                    "on every pair (--symmetric_pairs=all) collapsed in this project's Fashion-MNIST study; on the "
                    "global pair only (the default) it learns: see docs/results/reproduction.md"]
        return []


class SimWhitening(Method):
    """SimAffinity on Cholesky-whitened (then ℓ2-normalised) embeddings (Eq. 2)."""

    name, family, paper = "simwhitening", "UniCLR", PAPER
    terms = ("cross_entropy", "symmetry")
    predictor = "optional"
    whitens = True
    defaults = {"temperature": 1.0, "symmetric_loss_weight": 0.01, "symmetric_directions": False,
                "whitening_mode": "cholesky", **SYMMETRIC_DEFAULTS, **_WHITENING, **_TRICKS}

    def pair_loss(self, online, target, state, gamma=0.0):
        o = self.options
        return objectives.sim_whitening_loss(
            online, target, temperature=o["temperature"], gamma=gamma, eps=o["eps"],
            mode=o["whitening_mode"], stop_gradient_cov=o["stop_gradient_cov"],
            symmetric_directions=o["symmetric_directions"], groups=o["whitening_groups"], l2_first=o["l2_first"],
            return_terms=True)


class SimTrace(Method):
    """``−(1/N) tr((z1 − μ) Σ⁻¹ (z2 − μ)ᵀ)``: the whitened affinity's trace (Eq. 3, 4)."""

    name, family, paper = "simtrace", "UniCLR", PAPER
    terms = ("trace",)
    predictor = "optional"
    whitens = True
    defaults = {**_WHITENING, **_TRICKS}

    def pair_loss(self, online, target, state):
        o = self.options
        return objectives.sim_trace_loss(online, target, eps=o["eps"], stop_gradient_cov=o["stop_gradient_cov"],
                                         groups=o["whitening_groups"], l2_first=o["l2_first"], return_terms=True)
