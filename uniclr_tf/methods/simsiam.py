"""SimSiam (Chen & He, CVPR 2021, arXiv 2011.10566).

A predictor on the online branch and a stop-gradient target (the same network, detached; no EMA),
negative cosine similarity symmetrised over the two views. Projector with BN after every layer
(the last without affine parameters), MoCo v2's views. The predictor learns at a fixed rate, the
schedule's peak (the paper's §4.2 and its code's ``--fix-pred-lr``, used for its CIFAR results):
with the predictor on the cosine schedule too, this project's Fashion-MNIST runs lost rank and
kNN accuracy after epoch 20 (``--predictor_fixed_lr=false`` restores that).
"""

from uniclr_tf import objectives
from uniclr_tf.methods.base import Method, Option


class SimSiam(Method):
    name, family = "simsiam", "asymmetric"
    paper = "Chen & He 2021, arXiv 2011.10566"
    terms = ("negative_cosine",)
    target = "stop_gradient"
    predictor = "always"
    views = "mocov2"
    defaults = {"predictor_fixed_lr": True}
    option_specs = {"predictor_fixed_lr": Option(bool, "SimSiam: the predictor learns at the schedule's peak rate, "
                                                       "not on the schedule (the paper's fixed predictor lr).")}

    def pair_loss(self, online, target, state):
        return objectives.negative_cosine_loss(online, target, return_terms=True)
