"""Contrastive baselines: SimCLR's NT-Xent, MoCo's InfoNCE and CO2's consistency-regularised InfoNCE.

Pure ``keras.ops`` functions (TensorFlow and JAX backends, jit/XLA-safe: static shapes, no Python
control flow on tensor values). Rows are samples: every embedding is ``[N, D]`` (a queue is
``[K, D]``), and ``n(·)`` is ℓ2 normalisation of each row (safe at a zero row). The maths is
single-device: a distributed model gathers the embeddings across replicas before calling.

Losses are means over this call's rows, returned as float32 scalars (float64 for float64 inputs;
bfloat16 / float16 inputs are upcast to float32 before any arithmetic). With
``return_terms=True`` each returns ``(loss, terms)``, a dict of its unweighted terms.

===========  =====================================================================================
name         definition
===========  =====================================================================================
NT-Xent      ``Z = n([z1; z2])``, ``S = Z Zᵀ / τ`` minus its diagonal; mean over the ``2N`` rows of
             ``CE(S_r, other view of r)`` (SimCLR, Chen et al. 2020)
InfoNCE      ``CE(n(q) n(sg k)ᵀ / τ, diagonal)`` (MoCo v3) or, with a queue,
             ``CE([n(q_i)·n(k_i), n(q_i) n(queue)ᵀ] / τ, 0)`` (MoCo v2); ``sg`` = stop-gradient
CO2          InfoNCE with a queue ``+ α·½[KL(P‖Q) + KL(Q‖P)]`` (Wei et al., ICLR 2021)
===========  =====================================================================================
"""

from keras import ops

from uniclr_tf.objectives.uniclr import _cross_entropy_diagonal
from uniclr_tf.objectives.uniclr import l2_normalize
from uniclr_tf.objectives.tensors import as_dtype
from uniclr_tf.objectives.tensors import check_embedding
from uniclr_tf.objectives.tensors import check_embedding_pair
from uniclr_tf.objectives.tensors import check_non_negative
from uniclr_tf.objectives.tensors import check_positive
from uniclr_tf.objectives.tensors import check_same_feature_size
from uniclr_tf.objectives.tensors import compute_dtype

__all__ = [
    "co2_consistency",
    "co2_loss",
    "info_nce_loss",
    "nt_xent_loss",
]

# Logit given to the masked self-similarities of NT-Xent: exp(−1e9 − max) is exactly 0 in float32
# and float64, and unlike −inf it cannot turn into NaN (−inf · 0) anywhere downstream.
_MASKED_LOGIT = -1e9


def nt_xent_loss(z1, z2, temperature=0.5, return_terms=False):
    """NT-Xent, the normalised temperature-scaled cross-entropy of SimCLR (Chen et al., ICML 2020).

    Rows are samples: ``z1``, ``z2`` are ``[N, D]`` embeddings of two views of the same batch.
    With ``Z = n([z1; z2])`` (``[2N, D]``) and ``S = Z Zᵀ / τ``::

        ℓ_r = −log( exp(S_{r,p(r)}) / Σ_{c ≠ r} exp(S_{r,c}) ),   p(i) = i + N,  p(i + N) = i
        loss = (1 / 2N) Σ_r ℓ_r

    i.e. the self-similarity ``S_{r,r}`` is excluded from each row's softmax, the target of a row is
    the other view of the same sample, and the other ``2N − 2`` rows are its negatives (SimCLR's
    Eq. 1, averaged over all ``2N`` anchors).

    Args:
        z1, z2: ``[N, D]`` embeddings of the two views, same shape.
        temperature: ``τ > 0`` (SimCLR uses 0.5 on CIFAR-10 in its ablations, 0.1 on ImageNet).
        return_terms: also return ``{"cross_entropy": loss}``.

    Returns:
        Scalar, float32 (float64 for float64 inputs); with ``return_terms``, ``(loss, terms)``.
    """
    check_positive(temperature, "temperature")
    z1, z2, dtype = check_embedding_pair(z1, z2)
    tau = as_dtype(temperature, dtype)
    n1, n2 = l2_normalize(z1), l2_normalize(z2)
    z = ops.concatenate([n1, n2], axis=0)                              # [2N, D]
    s = ops.matmul(z, ops.transpose(z)) / tau                          # [2N, 2N]
    idx = ops.arange(ops.shape(z)[0])
    self_mask = ops.expand_dims(idx, 1) == ops.expand_dims(idx, 0)
    s = ops.where(self_mask, ops.full_like(s, _MASKED_LOGIT), s)
    pos = ops.sum(n1 * n2, axis=1) / tau                               # S_{i, i+N} = S_{i+N, i}
    ce = ops.mean(ops.logsumexp(s, axis=1) - ops.concatenate([pos, pos], axis=0))
    return (ce, {"cross_entropy": ce}) if return_terms else ce


def _normalised_query_key_queue(q, k, queue):
    """``n(q)``, ``n(sg k)``, ``n(sg queue)`` (queue may be None) in the common compute dtype."""
    q, k, dtype = check_embedding_pair(q, k, names=("q", "k"))
    if queue is not None:
        queue = check_embedding(queue, "queue")
        check_same_feature_size(queue, q, "queue", "q")
        dtype = compute_dtype(q, queue)
        q, k = ops.cast(q, dtype), ops.cast(k, dtype)
        queue = l2_normalize(ops.stop_gradient(ops.cast(queue, dtype)))
    return l2_normalize(q), l2_normalize(ops.stop_gradient(k)), queue, dtype


def _info_nce_with_queue(nq, nk, nqueue, tau):
    """Mean CE of the logits ``[n(q_i)·n(k_i), n(q_i) n(queue)ᵀ] / τ`` with target 0 (MoCo v2)."""
    pos = ops.sum(nq * nk, axis=1, keepdims=True) / tau               # [N, 1]
    neg = ops.matmul(nq, ops.transpose(nqueue)) / tau                  # [N, K]
    logits = ops.concatenate([pos, neg], axis=1)                       # [N, 1 + K]
    return ops.mean(ops.logsumexp(logits, axis=1) - pos[:, 0])


def info_nce_loss(q, k, temperature=0.2, queue=None, return_terms=False):
    """InfoNCE of MoCo (He et al., CVPR 2020; v2: Chen et al. 2020; v3: Chen, Xie & He, ICCV 2021).

    Rows are samples: ``q`` (queries, online encoder) and ``k`` (keys, the momentum encoder) are
    ``[N, D]``; ``k`` is treated as a constant (stop-gradient inside), as a key encoder's output.

    Without a queue (MoCo v3), the other keys of the batch are the negatives::

        loss = (1/N) Σ_i −log( exp(n(q_i)·n(k_i)/τ) / Σ_j exp(n(q_i)·n(k_j)/τ) )

    With a queue ``[K, D]`` of past keys (MoCo v2; also constant, normalised inside), the negatives
    of every query are the queue::

        logits_i = [n(q_i)·n(k_i), n(q_i) n(queue)ᵀ] / τ        # [1 + K], target 0
        loss = (1/N) Σ_i CE(logits_i, 0)

    (MoCo v3 scales its loss by ``2τ``; this function does not.)

    Args:
        q: ``[N, D]`` queries.
        k: ``[N, D]`` keys (positives), same shape as ``q``.
        temperature: ``τ > 0`` (0.2 for MoCo v2 and v3 ResNet, 0.07 for MoCo v1).
        queue: None, or ``[K, D]`` negatives.
        return_terms: also return ``{"cross_entropy": loss}``.

    Returns:
        Scalar, float32 (float64 if any input is float64); with ``return_terms``, ``(loss, terms)``.
    """
    check_positive(temperature, "temperature")
    nq, nk, nqueue, dtype = _normalised_query_key_queue(q, k, queue)
    tau = as_dtype(temperature, dtype)
    if nqueue is None:
        ce = _cross_entropy_diagonal(ops.matmul(nq, ops.transpose(nk)) / tau)
    else:
        ce = _info_nce_with_queue(nq, nk, nqueue, tau)
    return (ce, {"cross_entropy": ce}) if return_terms else ce


def _symmetric_kl(logits_p, logits_q):
    """Mean over rows of ``½ KL(P‖Q) + ½ KL(Q‖P) = ½ Σ_j (P_j − Q_j)(log P_j − log Q_j)``."""
    log_p = ops.log_softmax(logits_p, axis=1)
    log_q = ops.log_softmax(logits_q, axis=1)
    return ops.mean(0.5 * ops.sum((ops.exp(log_p) - ops.exp(log_q)) * (log_p - log_q), axis=1))


def _co2_consistency(nq, nk, nqueue, tau_con):
    return _symmetric_kl(ops.matmul(nq, ops.transpose(nqueue)) / tau_con,
                         ops.matmul(nk, ops.transpose(nqueue)) / tau_con)


def _require_queue(queue):
    if queue is None:
        raise ValueError("CO2 needs a queue of negatives: `queue` must be a [K, D] tensor; "
                         "received queue=None")


def co2_consistency(q, k, queue, temperature=0.04):
    """CO2's consistency term (Wei et al., ICLR 2021, arXiv 2010.02217), unweighted.

    The query's similarity distribution over the negatives (the "unlabeled" part of instance
    discrimination) should agree with that of its positive key, which serves as a soft pseudo label.
    Rows are samples: ``q``, ``k`` are ``[N, D]``, the negatives ``queue`` is ``[K, D]``::

        P_i = softmax(n(q_i) n(queue)ᵀ / τ_con)                  # [K]
        Q_i = softmax(n(k_i) n(queue)ᵀ / τ_con)                  # [K]
        L_con = (1/N) Σ_i ½ [KL(P_i ‖ Q_i) + KL(Q_i ‖ P_i)]

    The symmetric KL is CO2's disagreement measure as recalled from the paper (its method section
    could not be re-read here, see :func:`co2_loss`); the lightly port of CO2 computes the same
    symmetric KL, there with the positive appended to the negatives. ``k`` and ``queue`` are
    constants (stop-gradient inside): the gradient reaches ``q`` through both KL directions.

    Args:
        q: ``[N, D]`` queries. k: ``[N, D]`` positive keys. queue: ``[K, D]`` negatives.
        temperature: ``τ_con > 0``.

    Returns:
        Scalar ≥ 0, float32 (float64 if any input is float64).
    """
    check_positive(temperature, "temperature")
    _require_queue(queue)
    nq, nk, nqueue, dtype = _normalised_query_key_queue(q, k, queue)
    return _co2_consistency(nq, nk, nqueue, as_dtype(temperature, dtype))


def co2_loss(q, k, queue, temperature=0.2, consistency_temperature=0.04, consistency_weight=1.0,
             return_terms=False):
    """CO2, Consistent Contrast (Wei, Wang, Shen & Yuille, ICLR 2021, arXiv 2010.02217).

    MoCo's InfoNCE with a queue plus ``α`` times the consistency term (:func:`co2_consistency`)::

        loss = L_ins + α · L_con
        L_ins = (1/N) Σ_i CE([n(q_i)·n(k_i), n(q_i) n(queue)ᵀ] / τ, 0)            (as info_nce_loss)
        L_con = (1/N) Σ_i ½ [KL(P_i‖Q_i) + KL(Q_i‖P_i)],
                P_i = softmax(n(q_i) n(queue)ᵀ / τ_con),  Q_i = softmax(n(k_i) n(queue)ᵀ / τ_con)

    ``k`` and ``queue`` are constants (stop-gradient inside). The distributions are over the ``K``
    negatives only, as the paper's Figure 1 describes (the positive's similarity to the negatives is the
    query's pseudo label); lightly's ``CO2Regularizer`` also puts the positive pair's logit first in
    both.

    Defaults: ``τ = 0.2`` (MoCo v2), ``τ_con = 0.04`` and ``α = 1``. The CO2 paper's method and
    implementation sections could not be read while this was written (only the abstract and
    introduction of the stored copies were retrievable), so ``τ_con = 0.04`` rests on recollection
    of the paper and ``α = 1`` is a neutral weight that was NOT checked against its ImageNet /
    CIFAR settings; the lightly port of CO2 defaults to ``α = 1``, ``τ_con = 0.05``. Set both
    explicitly to reproduce a particular experiment.

    Args:
        q: ``[N, D]`` queries. k: ``[N, D]`` positive keys. queue: ``[K, D]`` negatives (required).
        temperature: ``τ > 0`` of the InfoNCE term.
        consistency_temperature: ``τ_con > 0`` of the consistency term.
        consistency_weight: ``α ≥ 0``.
        return_terms: also return ``{"cross_entropy": L_ins, "consistency": L_con}`` (unweighted).

    Returns:
        Scalar, float32 (float64 if any input is float64); with ``return_terms``, ``(loss, terms)``.
    """
    check_positive(temperature, "temperature")
    check_positive(consistency_temperature, "consistency_temperature")
    check_non_negative(consistency_weight, "consistency_weight")
    _require_queue(queue)
    nq, nk, nqueue, dtype = _normalised_query_key_queue(q, k, queue)
    ce = _info_nce_with_queue(nq, nk, nqueue, as_dtype(temperature, dtype))
    consistency = _co2_consistency(nq, nk, nqueue, as_dtype(consistency_temperature, dtype))
    loss = ce + as_dtype(consistency_weight, dtype) * consistency
    return (loss, {"cross_entropy": ce, "consistency": consistency}) if return_terms else loss
