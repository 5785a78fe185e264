"""Barlow Twins (Zbontar et al., ICML 2021, arXiv 2103.03230).

The cross-correlation matrix of the two views' batch-standardised embeddings is driven to the
identity: ``Σ_i (1 − C_ii)² + λ Σ_{i≠j} C_ij²``, λ 0.0051. Same network on both branches. Projector
Linear-BN-ReLU ×2 then Linear; BYOL's views.
"""

from uniclr_tf import objectives
from uniclr_tf.methods.base import Method, Option


class BarlowTwins(Method):
    name, family = "barlow_twins", "whitening"
    paper = "Zbontar et al. 2021, arXiv 2103.03230"
    terms = ("on_diagonal", "off_diagonal")
    projector_last_bn = False
    views = "byol"
    defaults = {"barlow_lambda": 0.0051}
    option_specs = {"barlow_lambda": Option(float, "Barlow Twins: weight λ of the off-diagonal terms.",
                                            lambda v: v >= 0, "a number >= 0")}

    def pair_loss(self, online, target, state):
        return objectives.barlow_twins_loss(online, target, lambd=self.options["barlow_lambda"], return_terms=True)
