"""Redundancy-reduction and whitening baselines: Barlow Twins, VICReg and W-MSE.

Pure ``keras.ops`` functions (TensorFlow and JAX backends, jit/XLA-safe: static shapes, no Python
control flow on tensor values). Rows are samples: ``z1``, ``z2`` are ``[N, D]`` embeddings of two
views of the same batch; the statistics are over the rows of this call (a distributed model gathers
across replicas first). Scalars in float32 (float64 for float64 inputs; bfloat16 / float16 upcast to
float32 first); ``return_terms=True`` returns ``(loss, terms)`` with the unweighted terms. Every
square root has a positive floor, so a collapsed batch (all rows equal) gives a finite loss and
finite gradients.

==============  ===================================================================================
Barlow Twins    ``Σ_i (1 − C_ii)² + λ Σ_{i≠j} C_ij²``, ``C = ẑ1ᵀ ẑ2 / N`` of batch-standardised views
VICReg          ``λ·inv + μ·var + ν·cov`` (invariance, variance hinge, covariance decorrelation)
W-MSE           ``(1/N) Σ_i 2 − 2 cos(w1_i, w2_i)``, each view Cholesky-whitened per sub-batch
Zero-CL         ``Σ_n (c_nn − 1)² + Σ_i (C_ii − 1)²`` of ZCA-whitened views, instance- and feature-wise
==============  ===================================================================================
"""

import keras
from keras import ops

from uniclr_tf.objectives.uniclr import l2_normalize
from uniclr_tf.objectives.tensors import as_dtype
from uniclr_tf.objectives.tensors import check_embedding_pair
from uniclr_tf.objectives.tensors import check_non_negative
from uniclr_tf.objectives.tensors import check_positive
from uniclr_tf.objectives.tensors import static_shape
from uniclr_tf.objectives.whitening import gram
from uniclr_tf.objectives.whitening import subbatch_whiten

__all__ = [
    "barlow_twins_loss",
    "vicreg_loss",
    "wmse_loss",
    "zca_whitening_matrix",
    "zero_cl_loss",
]

_BARLOW_BN_EPS = 1e-5    # BatchNorm1d(affine=False)'s ε, as the Barlow Twins code
_VICREG_STD_EPS = 1e-4   # inside VICReg's sqrt(Var + ε)


def _off_diagonal_mask(dim, dtype):
    return 1 - ops.eye(dim, dtype=dtype)


def _num_rows(z, dtype):
    return ops.cast(ops.shape(z)[0], dtype)


def barlow_twins_loss(z1, z2, lambd=0.0051, return_terms=False):
    """Barlow Twins (Zbontar, Jing, Misra, LeCun & Deny, ICML 2021, Eq. 1).

    Rows are samples. Each view is standardised over the batch as a BatchNorm without affine
    parameters (biased variance, ``ε = 1e-5`` inside the square root), then::

        ẑ = (z − mean(z)) / sqrt(var(z) + 1e-5)                # per feature, over the N rows
        C = ẑ1ᵀ ẑ2 / N                                          # [D, D] cross-correlation
        loss = Σ_i (1 − C_ii)² + λ Σ_{i≠j} C_ij²

    Args:
        z1, z2: ``[N, D]`` embeddings of the two views, same shape.
        lambd: ``λ ≥ 0``, the weight of the redundancy-reduction term (paper: 0.0051, i.e. about
            1/D for its D = 8192 projector).
        return_terms: also return ``{"on_diagonal": Σ(1 − C_ii)², "off_diagonal": Σ_{i≠j} C_ij²}``.

    Returns:
        Scalar, float32 (float64 for float64 inputs); with ``return_terms``, ``(loss, terms)``.
    """
    check_non_negative(lambd, "lambd")
    z1, z2, dtype = check_embedding_pair(z1, z2)
    eps = as_dtype(_BARLOW_BN_EPS, dtype)

    def standardise(z):
        centred = z - ops.mean(z, axis=0, keepdims=True)
        var = ops.mean(ops.square(centred), axis=0, keepdims=True)
        return centred / ops.sqrt(var + eps)

    c = ops.matmul(ops.transpose(standardise(z1)), standardise(z2)) / _num_rows(z1, dtype)
    on_diagonal = ops.sum(ops.square(1 - ops.diagonal(c)))
    off_diagonal = ops.sum(ops.square(c * _off_diagonal_mask(ops.shape(c)[0], dtype)))
    loss = on_diagonal + as_dtype(lambd, dtype) * off_diagonal
    if return_terms:
        return loss, {"on_diagonal": on_diagonal, "off_diagonal": off_diagonal}
    return loss


def vicreg_loss(z1, z2, sim_coeff=25.0, std_coeff=25.0, cov_coeff=1.0, return_terms=False):
    """VICReg (Bardes, Ponce & LeCun, ICLR 2022, Eq. 1–6).

    Rows are samples; ``N ≥ 2``. With ``z̄ = z − mean(z)`` (per feature, over the rows)::

        inv = (1 / (N·D)) Σ_{n,d} (z1 − z2)²_{nd}                           # invariance
        v(z) = (1/D) Σ_d relu(1 − sqrt(Var_d(z) + 1e-4))                      # Var unbiased (N − 1)
        var = ½ [v(z1) + v(z2)]                                               # variance
        c(z) = (1/D) Σ_{i≠j} [z̄ᵀz̄ / (N − 1)]_ij²                             # covariance
        cov = c(z1) + c(z2)
        loss = sim_coeff·inv + std_coeff·var + cov_coeff·cov

    (the averaging and summing over the two views as in the authors' code).

    Args:
        z1, z2: ``[N, D]`` embeddings of the two views, same shape.
        sim_coeff, std_coeff, cov_coeff: weights ``λ, μ, ν ≥ 0`` (paper: 25, 25, 1).
        return_terms: also return ``{"invariance", "variance", "covariance"}`` (unweighted).

    Returns:
        Scalar, float32 (float64 for float64 inputs); with ``return_terms``, ``(loss, terms)``.
    """
    check_non_negative(sim_coeff, "sim_coeff")
    check_non_negative(std_coeff, "std_coeff")
    check_non_negative(cov_coeff, "cov_coeff")
    z1, z2, dtype = check_embedding_pair(z1, z2)
    shape = static_shape(z1)
    if shape is not None and shape[0] is not None and shape[0] < 2:
        raise ValueError("VICReg's unbiased variance needs N >= 2 rows; "
                         f"received z1.shape={shape}")
    n_minus_1 = _num_rows(z1, dtype) - 1
    dim = ops.shape(z1)[1]
    eps = as_dtype(_VICREG_STD_EPS, dtype)
    mask = _off_diagonal_mask(dim, dtype)

    def variance_and_covariance(z):
        centred = z - ops.mean(z, axis=0, keepdims=True)
        var = ops.sum(ops.square(centred), axis=0) / n_minus_1
        hinge = ops.mean(ops.relu(1 - ops.sqrt(var + eps)))
        cov = ops.matmul(ops.transpose(centred), centred) / n_minus_1
        return hinge, ops.sum(ops.square(cov * mask)) / ops.cast(dim, dtype)

    invariance = ops.mean(ops.square(z1 - z2))
    v1, c1 = variance_and_covariance(z1)
    v2, c2 = variance_and_covariance(z2)
    variance = 0.5 * (v1 + v2)
    covariance = c1 + c2
    loss = (as_dtype(sim_coeff, dtype) * invariance + as_dtype(std_coeff, dtype) * variance
            + as_dtype(cov_coeff, dtype) * covariance)
    if return_terms:
        return loss, {"invariance": invariance, "variance": variance, "covariance": covariance}
    return loss


def wmse_loss(z1, z2, eps=1e-4, whitening_size=128, return_terms=False):
    """W-MSE, whitening MSE (Ermolov, Siarohin, Sangineto & Sebe, ICML 2021), two views.

    Rows are samples. The batch is split into contiguous sub-batches of ``m = whitening_size`` rows
    (``N`` a multiple of ``m``; one sub-batch when ``m ≥ N``; shuffle the batch beforehand for
    W-MSE's random sub-batches). EACH VIEW IS WHITENED SEPARATELY, each sub-batch with its own
    statistics, as in W-MSE (the UniCLR objectives instead whiten the two views jointly, with one
    ``μ`` and ``Σ`` of ``[z1; z2]``)::

        Σ_V = (V − μ_V)ᵀ(V − μ_V) / (m − 1),   (1 − ε)Σ_V + ε·I = L Lᵀ,   w(V) = (V − μ_V) L⁻ᵀ
        loss = (1/N) Σ_i ‖n(w1_i) − n(w2_i)‖² = (1/N) Σ_i (2 − 2·cos(w1_i, w2_i))

    (the unbiased covariance and the shrinkage ``(1 − ε)Σ + εI`` are W-MSE's code; see
    :func:`uniclr_tf.objectives.whitening.subbatch_whiten`: Cholesky factor and triangular solve, never an
    explicit inverse, float32 or wider at the highest matmul precision). Gradients flow through the
    whitening statistics, as in W-MSE. Needs ``whitening_size > D`` (W-MSE pairs small
    embeddings with sub-batches larger than them): with no more rows than features a sub-batch is
    whitened to mutually orthogonal rows whatever the data, and the loss carries no signal.
    W-MSE's ``w_iter`` (several random splits per step) is the caller's: average calls over
    shuffled batches.

    Args:
        z1, z2: ``[N, D]`` embeddings of the two views, same shape, ``D`` static.
        eps: shrinkage ``ε ∈ [0, 1)`` of the sub-batch covariance.
        whitening_size: sub-batch size ``m ≥ 2`` (W-MSE's ``w_size``, default 128).
        return_terms: also return ``{"distance": loss}``.

    Returns:
        Scalar, float32 (float64 for float64 inputs); with ``return_terms``, ``(loss, terms)``.
    """
    z1, z2, _ = check_embedding_pair(z1, z2)
    w1 = subbatch_whiten(z1, whitening_size, eps=eps, name="z1")
    w2 = subbatch_whiten(z2, whitening_size, eps=eps, name="z2")
    loss = whitened_distance(w1, w2)
    return (loss, {"distance": loss}) if return_terms else loss


def whitened_distance(w1, w2):
    """W-MSE's distance between two views already whitened (:func:`subbatch_whiten`): the mean over
    rows of ``‖n(w1_i) − n(w2_i)‖² = 2 − 2·cos(w1_i, w2_i)``. :func:`wmse_loss` is this after whitening
    each view; a caller comparing one view with several others whitens it once."""
    return ops.mean(2.0 - 2.0 * ops.sum(l2_normalize(w1) * l2_normalize(w2), axis=1))


# ----------------------------------------------------------------------------------------------
# Zero-CL
# ----------------------------------------------------------------------------------------------

_ZERO_CL_STD_EPS = 1e-4       # official code: (x − μ) / (σ + 1e-4), σ the unbiased standard deviation
_ZERO_CL_VAR_FLOOR = 1e-12    # σ = sqrt(max(var, 1e-12)): finite gradients for a constant row / column


def _matmul(a, b):
    """``a @ b`` at the highest matmul precision on JAX (no TF32 / bf16 passes); plain elsewhere."""
    if keras.backend.backend() == "jax":
        import jax  # backend-specific branch, only under the JAX backend

        return jax.numpy.matmul(a, b, precision=jax.lax.Precision.HIGHEST)
    return ops.matmul(a, b)


def _standardise(z, axis):
    """Zero-CL's ``standardization``: ``(z − mean) / (std + 1e-4)`` along ``axis``, unbiased std."""
    n = ops.cast(ops.shape(z)[axis], z.dtype)
    centred = z - ops.mean(z, axis=axis, keepdims=True)
    var = ops.sum(ops.square(centred), axis=axis, keepdims=True) / (n - 1.0)
    std = ops.sqrt(ops.maximum(var, as_dtype(_ZERO_CL_VAR_FLOOR, z.dtype)))
    return centred / (std + as_dtype(_ZERO_CL_STD_EPS, z.dtype))


def zca_whitening_matrix(x, eps=0.01):
    """ZCA whitening matrix of the rows of ``x`` ``[M, d]``: ``U diag(1/sqrt(S + ε)) Uᵀ`` with
    ``Σ = xᵀx / M = U diag(S) Uᵀ`` (no centring: Zero-CL standardises first). A constant: no gradient
    flows through it (the official code ``detach``es it). Float32 or wider, eigendecomposition of the
    symmetric Σ (the official code's SVD of a symmetric PSD matrix gives the same U, S)."""
    check_positive(eps, "eps")
    x = ops.stop_gradient(x)
    cov = gram(x) / ops.cast(ops.shape(x)[0], x.dtype)
    values, vectors = ops.eigh(0.5 * (cov + ops.transpose(cov)))
    scale = ops.rsqrt(ops.maximum(values, 0.0) + as_dtype(eps, x.dtype))
    return ops.stop_gradient(_matmul(vectors * scale[None, :], ops.transpose(vectors)))


def zero_cl_loss(z1, z2, eps=0.01, instance_weight=1.0, feature_weight=1.0, return_terms=False):
    """Zero-CL (Zhang et al., ICLR 2022, arXiv 2111.14521; official code ``main.py``'s ``ins_loss``
    and ``fea_loss``): instance-wise and feature-wise whitening, symmetric, no negatives.

    * Feature-wise (Zero-FCL): each view standardised per feature over the batch, ZCA-whitened over
      the D features (``Σ = ẑᵀẑ / N``, ``W = U(S + ε)^-½Uᵀ``), ``C = w1ᵀ w2 / N`` (``[D, D]``),
      ``feature = Σ_i (C_ii − 1)²``.
    * Instance-wise (Zero-ICL): each view standardised per sample over its features, then the same
      ZCA whitening with samples and features swapped (``[N, N]`` covariance over the D features),
      ``c = w1 w2ᵀ / D`` (``[N, N]``), ``instance = Σ_n (c_nn − 1)²``.
    * ``loss = instance_weight · instance + feature_weight · feature`` (the paper's hybrid Zero-CL).

    Choices of the official code followed: the standardisation uses the unbiased std plus 1e-4, the
    covariance divides by the number of rows (biased), ε = 0.01 is added to the eigenvalues, the
    whitening matrix is a constant (``detach``), only the diagonal of the cross-correlation enters
    (the whitening itself decorrelates), sums over the diagonal (not means). One change: the
    official code whitens each GPU's batch and all-reduces ``C``; here the model gathers the rows of
    every replica first, so the whitening and ``C`` are those of the global batch (one device and
    two replicas give the same loss). The std has a floor (``sqrt(max(var, 1e-12))``) so a collapsed
    batch gives finite gradients.

    Args:
        z1, z2: ``[N, D]`` projector outputs of the two views.
        eps: ε > 0 added to the eigenvalues of the covariance.
        instance_weight, feature_weight: the weights of the two terms (each at least 0).
        return_terms: also return ``{"instance": ..., "feature": ...}`` (unweighted).

    Returns:
        Scalar, float32 (float64 for float64 inputs); with ``return_terms``, ``(loss, terms)``.
    """
    check_positive(eps, "eps")
    check_non_negative(instance_weight, "instance_weight")
    check_non_negative(feature_weight, "feature_weight")
    z1, z2, dtype = check_embedding_pair(z1, z2)

    def whitened(z, axis):
        s = _standardise(z, axis)
        if axis == 0:                       # features: rows are samples
            return _matmul(s, zca_whitening_matrix(s, eps))
        t = ops.transpose(s)                # instances: rows are features
        return ops.transpose(_matmul(t, zca_whitening_matrix(t, eps)))

    n = ops.cast(ops.shape(z1)[0], dtype)
    d = ops.cast(ops.shape(z1)[1], dtype)
    f1, f2 = whitened(z1, 0), whitened(z2, 0)
    feature = ops.sum(ops.square(ops.sum(f1 * f2, axis=0) / n - 1.0))
    i1, i2 = whitened(z1, 1), whitened(z2, 1)
    instance = ops.sum(ops.square(ops.sum(i1 * i2, axis=1) / d - 1.0))
    loss = as_dtype(instance_weight, dtype) * instance + as_dtype(feature_weight, dtype) * feature
    return (loss, {"instance": instance, "feature": feature}) if return_terms else loss
