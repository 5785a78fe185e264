"""Zero-CL (Zhang et al., ICLR 2022, arXiv 2111.14521): instance- and feature-wise whitening.

Both views are standardised and ZCA-whitened twice, over the batch (feature-wise: D × D covariance)
and over the features (instance-wise: N × N covariance), and the diagonal of each whitened
cross-correlation is pulled to 1 (``objectives.zero_cl_loss``: the paper's Eq. for Zero-FCL and
Zero-ICL, the hybrid Zero-CL their sum; the official code's ``fea_loss`` / ``ins_loss`` choices:
std + 1e-4, ε 0.01 on the eigenvalues, whitening matrix detached, sums over the diagonal).
Symmetric: no negatives, no predictor, no stop-gradient or momentum branch. Projector as the
official code's (Linear-BN-ReLU hidden layers, a plain last layer).
"""

from uniclr_tf import objectives
from uniclr_tf.methods.base import Method, Option


class ZeroCL(Method):
    name, family = "zero_cl", "whitening"
    paper = "Zhang et al. 2022, arXiv 2111.14521"
    terms = ("instance", "feature")
    target = "same"
    projector_last_bn = False
    views = "byol"  # the official code's transforms (blur 1.0 / 0.1, solarisation 0 / 0.2)
    defaults = {"zca_eps": 0.01, "instance_weight": 1.0, "feature_weight": 1.0}
    option_specs = {
        "zca_eps": Option(float, "Zero-CL: ε added to the covariance's eigenvalues in the ZCA whitening.",
                          lambda v: v > 0, "a number > 0"),
        "instance_weight": Option(float, "Zero-CL: weight of the instance-wise term (0: Zero-FCL alone).",
                                  lambda v: v >= 0, "a number >= 0"),
        "feature_weight": Option(float, "Zero-CL: weight of the feature-wise term (0: Zero-ICL alone).",
                                 lambda v: v >= 0, "a number >= 0"),
    }

    def pair_loss(self, online, target, state):
        o = self.options
        return objectives.zero_cl_loss(online, target, eps=o["zca_eps"], instance_weight=o["instance_weight"],
                                       feature_weight=o["feature_weight"], return_terms=True)
