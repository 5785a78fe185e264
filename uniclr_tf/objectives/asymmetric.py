"""Asymmetric (predictor + stop-gradient) baselines: BYOL's distance and SimSiam's negative cosine.

Pure ``keras.ops`` functions (TensorFlow and JAX backends, jit/XLA-safe). Rows are samples: ``p``
(the online predictor's output) and ``z`` (the target: the EMA encoder's projection in BYOL, the
same encoder's projection in SimSiam) are ``[N, D]``; ``z`` is a constant (stop-gradient inside).
``cos(a, b) = n(a)·n(b)`` with ``n(·)`` the row ℓ2 normalisation (safe at a zero row). One
direction only: symmetrise by calling twice with the views swapped. Scalars in float32 (float64 for
float64 inputs; bfloat16 / float16 upcast to float32 first); ``return_terms=True`` returns
``(loss, terms)``.
"""

from keras import ops

from uniclr_tf.objectives.uniclr import l2_normalize
from uniclr_tf.objectives.tensors import check_embedding_pair

__all__ = [
    "byol_loss",
    "negative_cosine_loss",
]


def _cosine_to_constant(p, z):
    """``cos(p_i, sg(z_i))`` per row ``[N]`` in the compute dtype."""
    p, z, _ = check_embedding_pair(p, z, names=("p", "z"))
    return ops.sum(l2_normalize(p) * l2_normalize(ops.stop_gradient(z)), axis=1)


def byol_loss(p, z, return_terms=False):
    """BYOL's regression loss (Grill et al., NeurIPS 2020, Eq. 2), one direction.

    ``loss = (1/N) Σ_i ‖n(p_i) − n(sg z_i)‖² = (1/N) Σ_i (2 − 2·cos(p_i, z_i))``, in ``[0, 4]``,
    0 when every prediction points along its target.

    Args:
        p: ``[N, D]`` online predictions. z: ``[N, D]`` target projections (stop-gradient inside).
        return_terms: also return ``{"distance": loss}``.

    Returns:
        Scalar, float32 (float64 for float64 inputs); with ``return_terms``, ``(loss, terms)``.
    """
    loss = ops.mean(2.0 - 2.0 * _cosine_to_constant(p, z))
    return (loss, {"distance": loss}) if return_terms else loss


def negative_cosine_loss(p, z, return_terms=False):
    """SimSiam's negative cosine similarity (Chen & He, CVPR 2021, Eq. 1), one direction.

    ``loss = −(1/N) Σ_i cos(p_i, sg(z_i))``, in ``[−1, 1]`` (SimSiam's symmetric loss is the mean of
    this with the two views swapped).

    Args:
        p: ``[N, D]`` predictions. z: ``[N, D]`` projections of the other view (stop-gradient inside).
        return_terms: also return ``{"negative_cosine": loss}``.

    Returns:
        Scalar, float32 (float64 for float64 inputs); with ``return_terms``, ``(loss, terms)``.
    """
    loss = -ops.mean(_cosine_to_constant(p, z))
    return (loss, {"negative_cosine": loss}) if return_terms else loss
