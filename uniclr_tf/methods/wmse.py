"""W-MSE (Ermolov, Siarohin, Sangineto, Sebe, ICML 2021, arXiv 2007.06346).

The embeddings are Cholesky-whitened in sub-batches of ``--whitening_size`` rows (each view with
its own statistics, as W-MSE does), then ``2 − 2·cos`` between the two views' whitened rows. Same
network on both branches; projector Linear-BN-ReLU-Linear to a small embedding (64 on CIFAR).
Needs ``whitening_size > D``; the default (0) picks the smallest divisor of the batch that is at
least ``2·D`` (W-MSE's 128 rows for D = 64), or the whole batch.

With local crops (W-MSE 4 gives its two extra views as local crops), each extra view is compared with
the two global ones; ``wmse_all_pairs`` compares every pair of views, the extra ones with each other
too, as W-MSE's own code does for its d views (6 pairs for d = 4, not 5).
"""

from uniclr_tf import objectives
from uniclr_tf.objectives.redundancy import whitened_distance
from uniclr_tf.objectives.whitening import subbatch_whiten
from uniclr_tf.config.errors import UsageError
from uniclr_tf.methods.base import Method, Option


class WMSE(Method):
    name, family = "wmse", "whitening"
    paper = "Ermolov et al. 2021, arXiv 2007.06346"
    terms = ("distance",)
    projector_last_bn = False
    views = "simclr"
    defaults = {"eps": 1e-4, "whitening_size": 0, "wmse_all_pairs": False}
    option_specs = {"whitening_size": Option(int, "W-MSE: rows per whitening sub-batch (must divide the "
                                                  "batch and exceed the embedding size); 0: the smallest "
                                                  "divisor of the batch >= 2 x the embedding size.",
                                             lambda v: v == 0 or v > 1, "0 or an integer > 1"),
                    "wmse_all_pairs": Option(bool, "W-MSE: compare every pair of views, the local crops with each "
                                                   "other too (W-MSE's d views: 6 pairs for d = 4); off: each local "
                                                   "crop with the global views only.")}
    # --eps is the other whitening methods' ridge too (one flag, its help in COMMON_OPTIONS); here a shrinkage
    _shrinkage = Option(float, "W-MSE: shrinkage ε of the covariance, (1 − ε)·Σ + ε·I.",
                        lambda v: 0 <= v < 1, "a number in [0, 1) (W-MSE's shrinkage)")

    @classmethod
    def spec(cls, option):
        return cls._shrinkage if option == "eps" else super().spec(option)

    def view_pairs(self, num_global, num_views):
        if not self.options["wmse_all_pairs"]:
            return super().view_pairs(num_global, num_views)
        return [(i, j) for i in range(num_views) for j in range(i + 1, num_views)]

    def sub_batch(self, batch_size, embedding_dim):
        """Rows per whitening sub-batch for a batch of ``batch_size`` rows."""
        size = int(self.options["whitening_size"])
        if size == 0:
            size = next((d for d in range(2 * embedding_dim, batch_size) if batch_size % d == 0), batch_size)
        return min(size, batch_size)

    def check_setup(self, batch_size, embedding_dim):
        size = self.sub_batch(batch_size, embedding_dim)
        if batch_size % size:
            raise UsageError(f"--whitening_size={size} must divide the batch of {batch_size} rows (--batch_size)")
        if size <= embedding_dim:
            raise UsageError(f"--whitening_size={size}: W-MSE whitens sub-batches of this many rows, which must "
                             f"exceed the embedding size {embedding_dim} (--projector_dims) for a full-rank covariance")

    def pairs_loss(self, online, target, pairs, state, weights):
        """Each view is whitened once for all of its pairs (once as an online view, once as a target),
        not once per pair: the numbers of :func:`wmse_loss` pair by pair, with 5 batched factorisations
        a step for W-MSE 4 instead of 10 (6 instead of 12 with ``wmse_all_pairs``)."""
        size = self._checked_sub_batch(online[0])

        def whitened(views, indices, role):
            return {k: subbatch_whiten(views[k], size, eps=self.options["eps"], name=f"{role} view {k}")
                    for k in sorted(set(indices))}

        white_online = whitened(online, [i for i, _ in pairs], "online")
        white_target = whitened(target, [j for _, j in pairs], "target")
        return [(loss, {"distance": loss})
                for loss in (whitened_distance(white_online[i], white_target[j]) for i, j in pairs)]

    def _checked_sub_batch(self, online):
        if online.shape[0] is None:
            raise ValueError("wmse needs a static batch size to split it into whitening sub-batches: give fit "
                             "arrays (it trains them in whole batches unless drop_remainder=False), or a tf.data "
                             "dataset batched with drop_remainder=True (train.run does)")
        return self.sub_batch(online.shape[0], online.shape[1])

    def pair_loss(self, online, target, state):
        size = self._checked_sub_batch(online)
        return objectives.wmse_loss(online, target, eps=self.options["eps"], whitening_size=size, return_terms=True)
