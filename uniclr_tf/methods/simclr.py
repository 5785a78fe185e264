"""SimCLR (Chen, Kornblith, Norouzi, Hinton, ICML 2020, arXiv 2002.05709).

NT-Xent over the 2N views of a batch: each view's positive is the other view of its image, the
other 2N − 2 views are its negatives; τ 0.5. Target branch: the same network (gradient flows both
ways). The UniCLR symmetric loss is an add-on (``--symmetric_loss_weight``), 0 by default.
"""

from uniclr_tf import objectives
from uniclr_tf.methods.base import Method, SYMMETRIC_DEFAULTS


class SimCLR(Method):
    name, family = "simclr", "contrastive"
    paper = "Chen et al. 2020, arXiv 2002.05709"
    terms = ("cross_entropy", "symmetry")
    projector_last_bn = False  # SimCLR's MLP head ends in a plain linear layer
    views = "simclr"
    defaults = {"temperature": 0.5, "symmetric_loss_weight": 0.0, **SYMMETRIC_DEFAULTS}

    def pair_loss(self, online, target, state, gamma=0.0):
        loss, terms = objectives.nt_xent_loss(online, target, temperature=self.options["temperature"],
                                              return_terms=True)
        return self.with_symmetry(loss, terms, online, target, gamma)

    def setup_warnings(self):
        if self.options["symmetric_loss_weight"] > 0:
            return ["warning: SimCLR with the symmetric loss (--gamma > 0) collapsed in every seed of this project's "
                    "Fashion-MNIST study, also on the global pair only (docs/results/reproduction.md); the "
                    "collapse detector will stop it (--on_collapse)"]
        return []
