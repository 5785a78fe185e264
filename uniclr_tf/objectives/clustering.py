"""Clustering / self-distillation objectives: SwAV's swapped prediction and DINO's cross-entropy.

Pure ``keras.ops`` functions (TensorFlow and JAX backends, jit/XLA-safe). Rows are samples:
``scores`` are ``[B, K]`` similarities of ℓ2-normalised embeddings to K ℓ2-normalised prototypes
(SwAV), ``student`` / ``teacher`` are ``[B, K]`` logits of the DINO head. Scalars in float32 (float64
for float64 inputs; bfloat16 / float16 upcast to float32 first); ``return_terms=True`` returns
``(loss, terms)``. Under a distribution the model gathers the rows of every replica before calling
these, so Sinkhorn-Knopp's sums and DINO's centre are global, as in the authors' code.

* :func:`sinkhorn_knopp`: SwAV's equipartitioned soft codes (Caron et al., NeurIPS 2020, Alg. 1),
  computed in the log domain (the same numbers as the reference algorithm, without its overflow of
  ``exp(scores / ε)`` for unnormalised scores); no gradient flows through it.
* :func:`swapped_prediction_loss`: one direction of SwAV's loss (Eq. 1); :func:`swav_loss` both.
* :func:`dino_loss`: DINO's cross-entropy for one pair of views (Caron et al., ICCV 2021, Eq. 1 and
  Alg. 1), teacher centred and sharpened, no gradient into the teacher or the centre.
"""

from keras import ops

from uniclr_tf.objectives.tensors import as_dtype
from uniclr_tf.objectives.tensors import check_embedding
from uniclr_tf.objectives.tensors import check_embedding_pair
from uniclr_tf.objectives.tensors import check_positive
from uniclr_tf.objectives.tensors import compute_dtype
from uniclr_tf.objectives.tensors import static_shape

__all__ = [
    "dino_loss",
    "sinkhorn_knopp",
    "swapped_prediction_loss",
    "swav_loss",
]


def _check_iterations(iterations):
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"`iterations` must be an integer >= 1; received iterations={iterations!r}")


def sinkhorn_knopp(scores, epsilon=0.05, iterations=3):
    """SwAV's codes: the Sinkhorn-Knopp equipartition of the stop-gradient ``scores``.

    The reference algorithm (SwAV, Alg. 1; single device): ``Q = exp(scores / ε)ᵀ`` (``[K, B]``),
    ``Q /= sum(Q)``, then ``iterations`` times the rows of ``Q`` are normalised to sum ``1/K`` and its
    columns to sum ``1/B``; the codes are ``(Q · B)ᵀ``. Computed here on ``log Q`` with
    ``logsumexp`` (mathematically identical, finite for any scores).

    Args:
        scores: ``[B, K]`` prototype scores (no gradient flows back into them).
        epsilon: ε > 0, the entropic regularisation (smaller: sharper codes).
        iterations: number of row/column normalisation rounds (>= 1).

    Returns:
        ``[B, K]`` codes, each row a probability vector (sums to 1), each column summing to ``B/K``
        up to the convergence of the iterations; float32 (float64 for float64 scores).
    """
    check_positive(epsilon, "epsilon")
    _check_iterations(iterations)
    scores = check_embedding(scores, "scores")
    dtype = compute_dtype(scores)
    log_q = ops.stop_gradient(ops.cast(scores, dtype)) / as_dtype(epsilon, dtype)
    rows = ops.cast(ops.shape(log_q)[0], dtype)
    prototypes = ops.cast(ops.shape(log_q)[1], dtype)
    log_q = log_q - ops.logsumexp(log_q)                                     # Q /= sum(Q)
    for _ in range(iterations):
        log_q = log_q - ops.logsumexp(log_q, axis=0, keepdims=True) - ops.log(prototypes)  # per prototype: 1/K
        log_q = log_q - ops.logsumexp(log_q, axis=1, keepdims=True) - ops.log(rows)        # per sample: 1/B
    return ops.stop_gradient(ops.exp(log_q) * rows)


def _check_scores_pair(scores, target_scores):
    s, t = static_shape(scores), static_shape(target_scores)
    if s is not None and t is not None and s[-1] is not None and t[-1] is not None and s[-1] != t[-1]:
        raise ValueError("`scores` and `target_scores` must score the same K prototypes; received "
                         f"scores.shape={s} and target_scores.shape={t}")


def swapped_prediction_loss(scores, target_scores, temperature=0.1, epsilon=0.05, iterations=3,
                            return_terms=False):
    """One direction of SwAV's swapped prediction (Eq. 1 and 2): the codes of ``target_scores``
    predicted from ``scores``.

    ``loss = −mean_b Σ_k q_bk · log_softmax(scores_b / T)_k`` with ``q = sinkhorn_knopp(sg(target_scores))``.
    The two score batches may have different sizes (a local crop predicting a global view's codes
    needs the same B; rows are paired by index).

    Args:
        scores: ``[B, K]`` scores of the view that predicts (gradient flows).
        target_scores: ``[B, K]`` scores of the view whose codes are predicted (stop-gradient).
        temperature: T > 0 of the softmax. epsilon, iterations: of :func:`sinkhorn_knopp`.
        return_terms: also return ``{"cross_entropy": loss}``.

    Returns:
        Scalar, float32 (float64 for float64 inputs); with ``return_terms``, ``(loss, terms)``.
    """
    check_positive(temperature, "temperature")
    scores, target_scores, dtype = check_embedding_pair(scores, target_scores, names=("scores", "target_scores"))
    _check_scores_pair(scores, target_scores)
    codes = sinkhorn_knopp(target_scores, epsilon=epsilon, iterations=iterations)
    log_p = ops.log_softmax(scores / as_dtype(temperature, dtype), axis=-1)
    loss = -ops.mean(ops.sum(codes * log_p, axis=-1))
    return (loss, {"cross_entropy": loss}) if return_terms else loss


def swav_loss(scores1, scores2, temperature=0.1, epsilon=0.05, iterations=3, return_terms=False):
    """SwAV's loss for two views (Caron et al., NeurIPS 2020, Eq. 1):

    ``−½ [mean_b Σ_k q1 · log_softmax(scores2 / T) + mean_b Σ_k q2 · log_softmax(scores1 / T)]``,
    ``qi = sinkhorn_knopp(sg(scores_i), epsilon, iterations)``.

    Args:
        scores1, scores2: ``[B, K]`` prototype scores of the two views.
        temperature: T > 0. epsilon, iterations: of :func:`sinkhorn_knopp`.
        return_terms: also return ``{"cross_entropy": loss}``.

    Returns:
        Scalar, float32 (float64 for float64 inputs); with ``return_terms``, ``(loss, terms)``.
    """
    kwargs = dict(temperature=temperature, epsilon=epsilon, iterations=iterations)
    loss = 0.5 * (swapped_prediction_loss(scores2, scores1, **kwargs)
                  + swapped_prediction_loss(scores1, scores2, **kwargs))
    return (loss, {"cross_entropy": loss}) if return_terms else loss


def dino_loss(student, teacher, center, student_temperature=0.1, teacher_temperature=0.04, return_terms=False):
    """DINO's loss for one pair of views (Caron et al., ICCV 2021, Eq. 1 and Alg. 1):

    ``mean_b Σ_k −softmax((teacher − center) / T_t)_bk · log_softmax(student / T_s)_bk``, no gradient
    into ``teacher`` or ``center``. Over several views DINO takes the mean over the pairs whose views
    differ (the model's view pairs of an EMA-target method).

    Args:
        student: ``[B, K]`` student logits (gradient flows).
        teacher: ``[B, K]`` teacher logits of another view (stop-gradient).
        center: ``[K]`` or ``[1, K]`` running mean of the teacher logits (stop-gradient).
        student_temperature: T_s > 0.
        teacher_temperature: T_t > 0 (a number or a scalar tensor: the warm-up schedule's value).
        return_terms: also return ``{"cross_entropy": loss}``.

    Returns:
        Scalar, float32 (float64 for float64 inputs); with ``return_terms``, ``(loss, terms)``.
    """
    check_positive(student_temperature, "student_temperature")
    check_positive(teacher_temperature, "teacher_temperature")
    student, teacher, dtype = check_embedding_pair(student, teacher, names=("student", "teacher"))
    center = ops.convert_to_tensor(center)
    c_shape = static_shape(center)
    if c_shape is not None and (len(c_shape) not in (1, 2) or (len(c_shape) == 2 and c_shape[0] != 1)):
        raise ValueError(f"`center` must have shape [K] or [1, K]; received center.shape={c_shape}")
    s_shape = static_shape(student)
    if c_shape is not None and s_shape is not None and None not in (c_shape[-1], s_shape[-1]) \
            and c_shape[-1] != s_shape[-1]:
        raise ValueError(f"`center` must have the K={s_shape[-1]} of `student`; received center.shape={c_shape}")
    center = ops.reshape(ops.cast(center, dtype), (1, -1))
    targets = ops.softmax(ops.stop_gradient(teacher - center) / as_dtype(teacher_temperature, dtype), axis=-1)
    log_p = ops.log_softmax(student / as_dtype(student_temperature, dtype), axis=-1)
    loss = -ops.mean(ops.sum(targets * log_p, axis=-1))
    return (loss, {"cross_entropy": loss}) if return_terms else loss
