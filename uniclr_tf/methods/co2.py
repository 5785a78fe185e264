"""CO2, consistent contrast (Wei, Wang, Shen, Yuille, ICLR 2021, arXiv 2010.02217).

MoCo (v2 here: EMA key encoder, queue, τ 0.2) plus a consistency term: the query's similarity
distribution over the queue's negatives is pulled towards the positive key's distribution over
the same negatives (KL, weight ``--consistency_weight``, temperature ``--consistency_temperature``).
"""

from uniclr_tf import objectives
from uniclr_tf.methods.base import Method, Option, SYMMETRIC_DEFAULTS


class CO2(Method):
    name, family = "co2", "consistency"
    paper = "Wei et al. 2021, arXiv 2010.02217"
    terms = ("cross_entropy", "consistency", "symmetry")
    target = "ema"
    ema_schedule = "constant"
    uses_queue = True
    projector_last_bn = False
    views = "mocov2"
    defaults = {"temperature": 0.2, "ema_momentum": 0.99, "queue_size": 4096, "consistency_weight": 1.0,
                "consistency_temperature": 0.04, "symmetric_loss_weight": 0.0, **SYMMETRIC_DEFAULTS}
    option_specs = {
        "consistency_weight": Option(float, "CO2: weight α of the consistency term.", lambda v: v >= 0,
                                     "a number >= 0"),
        "consistency_temperature": Option(float, "CO2: temperature of the similarity distributions over "
                                                 "the negatives.", lambda v: v > 0, "a number > 0"),
    }

    def pair_loss(self, online, target, state, gamma=0.0):
        o = self.options
        loss, terms = objectives.co2_loss(online, target, state["queue"].value, temperature=o["temperature"],
                                          consistency_temperature=o["consistency_temperature"],
                                          consistency_weight=o["consistency_weight"], return_terms=True)
        return self.with_symmetry(loss, terms, online, target, gamma)
