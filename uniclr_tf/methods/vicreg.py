"""VICReg (Bardes, Ponce, LeCun, ICLR 2022, arXiv 2105.04906).

Invariance (MSE between the views) + variance (a hinge keeping each dimension's std at 1) +
covariance (off-diagonal covariance driven to 0), weighted 25 / 25 / 1. Same network on both
branches; projector Linear-BN-ReLU ×2 then Linear; BYOL's views.
"""

from uniclr_tf import objectives
from uniclr_tf.methods.base import Method, Option


def _weight(what):
    return Option(float, f"VICReg: weight of the {what} term.", lambda v: v >= 0, "a number >= 0")


class VICReg(Method):
    name, family = "vicreg", "whitening"
    paper = "Bardes et al. 2022, arXiv 2105.04906"
    terms = ("invariance", "variance", "covariance")
    projector_last_bn = False
    views = "byol"
    defaults = {"vicreg_sim_coeff": 25.0, "vicreg_std_coeff": 25.0, "vicreg_cov_coeff": 1.0}
    option_specs = {"vicreg_sim_coeff": _weight("invariance"), "vicreg_std_coeff": _weight("variance"),
                    "vicreg_cov_coeff": _weight("covariance")}

    def pair_loss(self, online, target, state):
        o = self.options
        return objectives.vicreg_loss(online, target, sim_coeff=o["vicreg_sim_coeff"], std_coeff=o["vicreg_std_coeff"],
                                      cov_coeff=o["vicreg_cov_coeff"], return_terms=True)
