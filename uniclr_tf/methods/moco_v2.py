"""MoCo v2 (Chen, Fan, Girshick, He 2020, arXiv 2003.04297; MoCo: He et al., CVPR 2020).

Queries from the online network, keys from an EMA key encoder (constant momentum 0.99 here, the
small-data value; MoCo uses 0.999 on ImageNet); InfoNCE of each query against its own key and a
FIFO queue of past keys as negatives (4096 for small data), τ 0.2. Symmetrised over the two views
(as solo-learn does for CIFAR); both views' keys enter the queue. MLP head without BN at the end.
"""

from uniclr_tf import objectives
from uniclr_tf.methods.base import Method, SYMMETRIC_DEFAULTS


class MoCoV2(Method):
    name, family = "moco_v2", "contrastive"
    paper = "Chen et al. 2020, arXiv 2003.04297"
    terms = ("cross_entropy", "symmetry")
    target = "ema"
    ema_schedule = "constant"
    uses_queue = True
    projector_last_bn = False
    views = "mocov2"
    defaults = {"temperature": 0.2, "ema_momentum": 0.99, "queue_size": 4096, "symmetric_loss_weight": 0.0,
                **SYMMETRIC_DEFAULTS}

    def pair_loss(self, online, target, state, gamma=0.0):
        loss, terms = objectives.info_nce_loss(online, target, temperature=self.options["temperature"],
                                               queue=state["queue"].value, return_terms=True)
        return self.with_symmetry(loss, terms, online, target, gamma)
