"""SwAV (Caron et al., NeurIPS 2020, arXiv 2006.09882): swapped prediction of online cluster codes.

Each view's ℓ2-normalised projection is scored against K learnable, ℓ2-normalised prototypes; the
codes of a global view are the Sinkhorn-Knopp equipartition of its stop-gradient scores
(``objectives.sinkhorn_knopp``, ε 0.05, 3 iterations, over the global batch: the model gathers the
replicas' rows first), and every other view predicts them through a softmax of its own scores at
temperature 0.1 (``objectives.swapped_prediction_loss``). With multi-crop, codes come from the global
views only and each local crop predicts both; the loss is the mean over these pairs, which for two
views is ``objectives.swav_loss``. No negatives, no predictor, no momentum encoder: the asymmetry is
the non-differentiable code assignment.

The prototypes are a trainable ``[K, D]`` weight of the model, owned by this method
(``build_state``). Following the paper's code: frozen (no gradient) for the first
``--freeze_prototypes_epochs`` (1) and ℓ2-normalised. The authors renormalise the stored weights
after every step; here the normalisation is part of the forward pass (weight normalisation), which
gives the same scores and, to first order, the same update. Not implemented: the paper's queue of
past embeddings for small batches (``--queue_length``, 0 in its ≥ 4096-image recipes) and its
optional 2-D projector output; SwAV's head is ``Linear-BN-ReLU-Linear`` (2048-128), no BN at the end.
"""

from keras import ops

from uniclr_tf import objectives
from uniclr_tf.methods.base import Method, Option


class SwAV(Method):
    name, family = "swav", "asymmetric"
    paper = "Caron et al. 2020, arXiv 2006.09882"
    terms = ("cross_entropy",)
    target = "stop_gradient"  # the codes come from the stop-gradient scores of the global views
    projector_last_bn = False
    views = "simclr"  # SimCLR's colour distortion and blur on every view
    defaults = {"temperature": 0.1, "num_prototypes": 3000, "sinkhorn_epsilon": 0.05, "sinkhorn_iterations": 3,
                "freeze_prototypes_epochs": 1.0}
    option_specs = {
        "sinkhorn_epsilon": Option(float, "SwAV: entropic regularisation ε of Sinkhorn-Knopp (smaller: sharper codes).",
                                   lambda v: v > 0, "a number > 0"),
        "sinkhorn_iterations": Option(int, "SwAV: Sinkhorn-Knopp normalisation rounds.", lambda v: v >= 1,
                                      "an integer >= 1"),
        "freeze_prototypes_epochs": Option(float, "SwAV: epochs at the start during which the prototypes get no "
                                                  "gradient.", lambda v: v >= 0, "a number >= 0"),
    }

    def build_state(self, model, embedding_dim):
        prototypes = model.add_weight(shape=(int(self.options["num_prototypes"]), int(embedding_dim)),
                                      initializer="glorot_uniform", trainable=True, name="swav_prototypes",
                                      dtype="float32")
        return {"prototypes": prototypes}

    def frozen(self, state):
        """True (a boolean tensor) while the prototypes are frozen; False without ``steps_per_epoch``."""
        steps_per_epoch = state.get("steps_per_epoch")
        if not steps_per_epoch:
            return False
        steps = int(round(float(self.options["freeze_prototypes_epochs"]) * steps_per_epoch))
        return ops.less(ops.cast(state.get("step", 0), "int64"), steps)

    def pair_loss(self, online, target, state):
        prototypes = ops.convert_to_tensor(state["prototypes"])
        frozen = self.frozen(state)
        if frozen is not False:
            prototypes = ops.where(frozen, ops.stop_gradient(prototypes), prototypes)
        prototypes = objectives.l2_normalize(prototypes)
        scores = ops.matmul(objectives.l2_normalize(ops.cast(online, "float32")), ops.transpose(prototypes))
        target_scores = ops.matmul(objectives.l2_normalize(ops.cast(ops.stop_gradient(target), "float32")),
                                   ops.transpose(ops.stop_gradient(prototypes)))
        return objectives.swapped_prediction_loss(
            scores, target_scores, temperature=self.options["temperature"], epsilon=self.options["sinkhorn_epsilon"],
            iterations=int(self.options["sinkhorn_iterations"]), return_terms=True)
