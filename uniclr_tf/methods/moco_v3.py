"""MoCo v3 (Chen, Xie, He, ICCV 2021, arXiv 2104.02057).

EMA target (0.99 rising to 1 on a cosine) and a predictor on the online branch; symmetrised InfoNCE
over the batch (the other keys of the batch are the negatives, no queue), τ 0.2 (the paper's ViT
setting and solo-learn's CIFAR one; the official ResNet-50 recipe keeps τ 1.0). The authors scale
the loss by 2τ and sum the two directions; here the directions are averaged (LARS's trust ratio
absorbs the constant).
"""

from uniclr_tf import objectives
from uniclr_tf.methods.base import Method, SYMMETRIC_DEFAULTS


class MoCoV3(Method):
    name, family = "moco_v3", "contrastive"
    paper = "Chen, Xie, He 2021, arXiv 2104.02057"
    terms = ("cross_entropy", "symmetry")
    target = "ema"
    predictor = "always"
    views = "byol"  # MoCo v3 uses BYOL's asymmetric blur / solarisation
    defaults = {"temperature": 0.2, "ema_momentum": 0.99, "symmetric_loss_weight": 0.0, **SYMMETRIC_DEFAULTS}

    def pair_loss(self, online, target, state, gamma=0.0):
        loss, terms = objectives.info_nce_loss(online, target, temperature=self.options["temperature"],
                                               return_terms=True)
        return self.with_symmetry(loss, terms, online, target, gamma)
