"""SimSiam (Chen & He, CVPR 2021, arXiv 2011.10566).

A predictor on the online branch and a stop-gradient target (the same network, detached; no EMA),
negative cosine similarity symmetrised over the two views. Projector with BN after every layer
(the last without affine parameters), MoCo v2's views.
"""

from uniclr_tf import objectives
from uniclr_tf.methods.base import Method


class SimSiam(Method):
    name, family = "simsiam", "asymmetric"
    paper = "Chen & He 2021, arXiv 2011.10566"
    terms = ("negative_cosine",)
    target = "stop_gradient"
    predictor = "always"
    views = "mocov2"
    defaults = {}

    def pair_loss(self, online, target, state):
        return objectives.negative_cosine_loss(online, target, return_terms=True)
