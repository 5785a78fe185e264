"""BYOL (Grill et al., NeurIPS 2020, arXiv 2006.07733).

A predictor on the online branch, an EMA target (0.99 rising to 1 on a cosine), the loss
``2 − 2·cos(p, z_target)`` symmetrised over the two views; no negatives. Asymmetric views: blur
p 1.0 / 0.1 and solarisation p 0 / 0.2. Projector Linear-BN-ReLU-Linear (no BN at the end).
"""

from uniclr_tf import objectives
from uniclr_tf.methods.base import Method


class BYOL(Method):
    name, family = "byol", "asymmetric"
    paper = "Grill et al. 2020, arXiv 2006.07733"
    terms = ("distance",)
    target = "ema"
    predictor = "always"
    projector_last_bn = False
    views = "byol"
    defaults = {"ema_momentum": 0.99}

    def pair_loss(self, online, target, state):
        return objectives.byol_loss(online, target, return_terms=True)
