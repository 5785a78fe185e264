"""UniCLR objectives: SimAffinity, SimWhitening, SimTrace and the symmetric loss (arXiv 2211.14516).

One module of :mod:`uniclr_tf.objectives` (the baseline losses live in its sibling modules
``contrastive``, ``asymmetric`` and ``redundancy``); the package re-exports every name.

Every function here is a pure ``keras.ops`` function (TensorFlow and JAX backends). Rows are
samples: ``z1`` and ``z2`` are the ``[N, D]`` embeddings of two views of the same batch (the paper
writes ``Z ∈ R^{D×N}``; formulas here are the paper's, transposed). ``n(·)`` is ℓ2 normalisation
of each row.

=============  ======================================================================  ==========
name           definition                                                              paper
=============  ======================================================================  ==========
affinity       ``A = n(z1) n(z2)ᵀ / τ``                                                Eq. 1
symmetry       ``‖A − Aᵀ‖_F`` (Frobenius norm, not squared)                            Eq. 5
SimAffinity    ``mean_i CE(A_i, i) + γ‖A − Aᵀ‖_F``                                     Eq. 1, 5, 6
SimWhitening   SimAffinity on ``n(w(z1)), n(w(z2))`` (whiten, ℓ2, then τ and γ)        Eq. 2, 6
SimTrace       ``−(1/N) tr((z1 − μ) Σ⁻¹ (z2 − μ)ᵀ) = −(1/N) Σ_i w(z1)_i · w(z2)_i``      Eq. 3, 4
=============  ======================================================================  ==========

Losses return scalars that are means over this call's rows (a per-replica mean: a distributed
``train_step`` divides by the replica count itself), in float32, or float64 for float64 inputs;
bfloat16 / float16 inputs are upcast to float32 before any arithmetic.

The authors' public code differs from the paper in a few places; each difference is a keyword
option that defaults to the paper: ``mode="one_sided"`` (SimWhitening), ``l2_first`` and
``stop_gradient_cov`` (whitening-based losses), ``symmetric_directions`` (cross-entropy losses).

Cheap whitening (not in the paper): ``groups=G`` on the whitening-based losses whitens ``G``
feature groups separately (block-diagonal ``Σ``; see :func:`uniclr_tf.objectives.whitening.group_whiten`),
which replaces the ``D × D`` Cholesky by ``G`` batched ``D/G × D/G`` ones; ``groups=1`` is the paper.
"""

from keras import ops

from uniclr_tf.objectives.tensors import as_dtype
from uniclr_tf.objectives.tensors import check_embedding
from uniclr_tf.objectives.tensors import check_embedding_pair
from uniclr_tf.objectives.tensors import check_non_negative
from uniclr_tf.objectives.tensors import check_positive
from uniclr_tf.objectives.tensors import compute_dtype
from uniclr_tf.objectives.tensors import static_shape
from uniclr_tf.objectives.whitening import group_whiten
from uniclr_tf.objectives.whitening import whiten

__all__ = [
    "affinity_matrix",
    "embedding_std",
    "group_whiten",
    "l2_normalize",
    "sim_affinity_loss",
    "sim_trace_loss",
    "sim_whitening_loss",
    "symmetry_loss",
    "whiten",
]

WHITENING_MODES = ("cholesky", "one_sided")
_L2_EPS = 1e-12  # as torch.nn.functional.normalize


def l2_normalize(z):
    """``n(z)``: each row divided by its ℓ2 norm (rows of norm < 1e-12 are divided by 1e-12).

    Safe at ``z = 0``: the value is 0 and the gradient finite (no ``0/0``, no ``1/sqrt(0)``).
    """
    sq = ops.sum(ops.square(z), axis=-1, keepdims=True)
    return z * ops.rsqrt(ops.maximum(sq, ops.cast(_L2_EPS**2, z.dtype)))


def _frobenius(x):
    """``‖x‖_F`` with a zero (sub)gradient at ``x = 0`` instead of NaN (sqrt'(0) = ∞ times 0)."""
    sq = ops.sum(ops.square(x))
    positive = sq > 0
    safe = ops.where(positive, sq, ops.ones_like(sq))
    return ops.where(positive, ops.sqrt(safe), ops.zeros_like(sq))


def _diagonal(a):
    """The diagonal of a square ``a`` as a masked row sum (exactly ``ops.diagonal``: the other terms are
    zeros): on a row-sharded ``A`` every device keeps its rows' entries, where a gather of the diagonal
    made XLA all-gather its indices and scatter-add the gradient across devices."""
    n = a.shape[0] if a.shape[0] is not None else ops.shape(a)[0]
    return ops.sum(a * ops.eye(n, dtype=a.dtype), axis=1)


def _cross_entropy_diagonal(a):
    """Mean over rows of the cross-entropy of logits ``a`` [N, N] with targets ``0..N−1``."""
    return ops.mean(ops.logsumexp(a, axis=1) - _diagonal(a))


def _affinity_objective(a, gamma, symmetric_directions, return_terms=False):
    """``CE_rows(A) + γ‖A − Aᵀ‖_F``; with ``symmetric_directions``, CE averaged over ``A`` and ``Aᵀ``.

    For two views of one batch ``A(z2, z1) = A(z1, z2)ᵀ``, so the reverse direction ``L(z2, z1)`` is
    the row-wise CE of ``Aᵀ`` and the symmetric term is the same in both directions.
    """
    ce = _cross_entropy_diagonal(a)
    if symmetric_directions:
        ce = 0.5 * (ce + _cross_entropy_diagonal(ops.transpose(a)))
    symmetry = symmetry_loss(a)
    loss = ce + as_dtype(gamma, a.dtype) * symmetry
    return (loss, {"cross_entropy": ce, "symmetry": symmetry}) if return_terms else loss


def _whiten(z1, z2, eps, stop_gradient_cov, groups, l2_first=False):
    """:func:`whiten` (``groups == 1``, the paper) or its cheap feature-group form; with ``l2_first``,
    of the ℓ2-normalised rows (the authors' code)."""
    if l2_first:
        z1, z2 = l2_normalize(z1), l2_normalize(z2)
    if isinstance(groups, (int, float)) and not isinstance(groups, bool) and groups == 1:
        return whiten(z1, z2, eps=eps, stop_gradient_cov=stop_gradient_cov)
    return group_whiten(z1, z2, groups=groups, eps=eps, stop_gradient_cov=stop_gradient_cov)


def affinity_matrix(z1, z2, temperature=1.0):
    """Affinity matrix ``A = n(z1) n(z2)ᵀ / τ`` of two views (UniCLR Eq. 1).

    Rows are samples: ``z1``, ``z2`` are ``[N, D]``; ``A[i, j]`` is the cosine similarity of sample
    ``i`` of view 1 and sample ``j`` of view 2 divided by ``τ``; positives lie on the diagonal.

    Args:
        z1, z2: ``[N, D]`` embeddings, same shape.
        temperature: ``τ > 0``.

    Returns:
        ``[N, N]`` tensor, float32 (float64 for float64 inputs).
    """
    check_positive(temperature, "temperature")
    z1, z2, dtype = check_embedding_pair(z1, z2)
    a = ops.matmul(l2_normalize(z1), ops.transpose(l2_normalize(z2)))
    return a / as_dtype(temperature, dtype)


def symmetry_loss(a):
    """Symmetric loss ``‖A − Aᵀ‖_F`` (UniCLR Eq. 5), the Frobenius norm, not squared.

    ``A`` is an ``[N, N]`` affinity matrix (rows are samples of view 1, columns of view 2), plain or
    whitened. The (sub)gradient at a symmetric ``A`` is 0, not NaN.

    Returns:
        Scalar, float32 (float64 for a float64 ``A``).
    """
    a = check_embedding(a, "a")
    shape = static_shape(a)
    if shape is not None and None not in shape and shape[0] != shape[1]:
        raise ValueError(f"`a` must be a square [N, N] affinity matrix; received a.shape={shape}")
    a = ops.cast(a, compute_dtype(a))
    return _frobenius(a - ops.transpose(a))


def sim_affinity_loss(z1, z2, temperature=0.5, gamma=0.01, symmetric_directions=False, return_terms=False):
    """SimAffinity: ``mean_i CE(A_i, i) + γ‖A − Aᵀ‖_F`` with ``A = n(z1) n(z2)ᵀ / τ`` (UniCLR Eq. 1, 5, 6).

    Rows are samples: ``z1``, ``z2`` are ``[N, D]``; the target of row ``i`` is column ``i`` (its
    positive); the other ``N − 1`` columns are its negatives. The symmetric term is taken on the
    τ-scaled ``A``, as in the paper's pseudocode (Alg. 1). Paper defaults: τ = 0.5, γ = 0.01.

    Args:
        z1, z2: ``[N, D]`` embeddings of the two views, same shape.
        temperature: ``τ > 0``.
        gamma: weight ``γ ≥ 0`` of the symmetric loss.
        symmetric_directions: if True, average the CE of both directions ``L(z1, z2)`` and
            ``L(z2, z1)`` (the authors' code sums them); default False (the paper).
        return_terms: also return ``{"cross_entropy", "symmetry"}`` (the unweighted ``‖A − Aᵀ‖_F``).

    Returns:
        Scalar mean over the ``N`` rows, float32 (float64 for float64 inputs); with
        ``return_terms``, ``(loss, terms)``.
    """
    check_non_negative(gamma, "gamma")
    a = affinity_matrix(z1, z2, temperature=temperature)
    return _affinity_objective(a, gamma, symmetric_directions, return_terms)


def sim_whitening_loss(z1, z2, temperature=1.0, gamma=0.01, eps=1e-4, mode="cholesky",
                       stop_gradient_cov=False, symmetric_directions=False, one_sided_ridge=0.01,
                       return_terms=False, groups=1, l2_first=False):
    """SimWhitening: SimAffinity on Cholesky-whitened, then ℓ2-normalised views (UniCLR Eq. 2, 6, §3.2).

    Rows are samples: ``z1``, ``z2`` are ``[N, D]``. ``mode="cholesky"`` (the paper)::

        w1, w2 = whiten(z1, z2, eps)            # joint μ, Σ = L Lᵀ; w = (z − μ) L⁻ᵀ
        A = n(w1) n(w2)ᵀ / τ
        loss = mean_i CE(A_i, i) + γ‖A − Aᵀ‖_F

    ``mode="one_sided"`` (the authors' code): no ℓ2 re-normalisation, the bilinear form scaled by
    the batch size, with the authors' ridge ``one_sided_ridge`` (0.01) in place of ``eps``::

        A = (z1 − μ)(Σ₀ + 0.01·I)⁻¹(z2 − μ)ᵀ / N / τ      # Σ₀ the plain joint covariance

    computed as ``w1 w2ᵀ / N / τ`` through the Cholesky factor (never an explicit inverse), then the
    same CE + γ‖A − Aᵀ‖_F. The authors' code also ℓ2-normalises ``z1``, ``z2`` before the statistics
    (``l2_first=True``; its covariance divides by ``2N − 1``, this one by ``2N``). In ``"cholesky"``
    mode it needs ``2N > D``: with ``2N ≤ D`` and a small ε the whitened rows are mutually
    orthogonal, ``A`` is constant and the loss ≈ log N (flat).

    Args:
        z1, z2: ``[N, D]`` embeddings of the two views, same shape.
        temperature: ``τ > 0`` (1.0, i.e. none, for the paper's headline SimWhitening row).
        gamma: weight ``γ ≥ 0`` of the symmetric loss.
        eps: ridge ``ε`` added to ``Σ`` in ``mode="cholesky"``.
        mode: ``"cholesky"`` (default) or ``"one_sided"``.
        stop_gradient_cov: stop the gradient through ``μ`` and ``Σ`` (not through ``z``).
        symmetric_directions: average the CE of both directions (see :func:`sim_affinity_loss`).
        one_sided_ridge: the ridge of ``mode="one_sided"`` (ignored in ``"cholesky"`` mode).
        return_terms: also return ``{"cross_entropy", "symmetry"}`` (see :func:`sim_affinity_loss`).
        groups: whiten ``groups`` contiguous feature groups separately (block-diagonal ``Σ``, see
            :func:`uniclr_tf.objectives.whitening.group_whiten`): much cheaper at large ``D``, an
            approximation of the paper's full whitening; 1 (default) is the paper.
        l2_first: ℓ2-normalise ``z1``, ``z2`` before ``μ``, ``Σ`` and the whitening (the authors'
            code); default False (the paper whitens the embeddings themselves).

    Returns:
        Scalar mean over the ``N`` rows, float32 (float64 for float64 inputs).
    """
    check_positive(temperature, "temperature")
    check_non_negative(gamma, "gamma")
    if mode not in WHITENING_MODES:
        raise ValueError(f"`mode` must be one of {WHITENING_MODES}; received mode={mode!r}")
    if mode == "cholesky":
        check_positive(eps, "eps")
        w1, w2 = _whiten(z1, z2, eps, stop_gradient_cov, groups, l2_first)
        a = affinity_matrix(w1, w2, temperature=temperature)
    else:
        check_positive(one_sided_ridge, "one_sided_ridge")
        w1, w2 = _whiten(z1, z2, one_sided_ridge, stop_gradient_cov, groups, l2_first)
        n = ops.cast(ops.shape(w1)[0], w1.dtype)
        a = ops.matmul(w1, ops.transpose(w2)) / (n * as_dtype(temperature, w1.dtype))
    return _affinity_objective(a, gamma, symmetric_directions, return_terms)


def sim_trace_loss(z1, z2, eps=1e-4, stop_gradient_cov=False, return_terms=False, groups=1, l2_first=False):
    """SimTrace: ``−(1/N) tr((z1 − μ) Σ⁻¹ (z2 − μ)ᵀ)`` (UniCLR Eq. 3, 4).

    Rows are samples: ``z1``, ``z2`` are ``[N, D]``; ``μ``, ``Σ`` are the joint statistics of both
    views (see :func:`whiten`). ``Σ⁻¹`` is applied through its Cholesky factor, as
    ``−(1/N) Σ_i w(z1)_i · w(z2)_i`` with ``w(z) = (z − μ) L⁻ᵀ``: no explicit inverse, no square root,
    no ℓ2 normalisation, no temperature, no symmetric term. By Proposition 1 (App. B) this equals
    ``−(1/N) tr(Σ⁻¹ (z2 − μ)ᵀ(z1 − μ))``. The trace is symmetric in the two views, so no
    two-direction option is needed. Bounded below by about ``−D``, reached at ``z1 == z2``
    (``−Σ_k λ_k / (λ_k + ε)``). Needs ``2N > D``: with ``2N ≤ D`` and a small ε, distinct views give
    ≈ +1 whatever the data (flat loss, no learning signal; see :mod:`uniclr_tf.objectives.whitening`).

    Args:
        z1, z2: ``[N, D]`` embeddings of the two views, same shape.
        eps: ridge ``ε`` added to ``Σ``.
        stop_gradient_cov: stop the gradient through ``μ`` and ``Σ`` (the authors' code detaches
            the covariance; the paper's point, App. B, is that it need not).
        return_terms: also return ``{"trace": loss}`` (one term; for a uniform interface).
        groups: whiten ``groups`` contiguous feature groups separately (block-diagonal ``Σ``, see
            :func:`uniclr_tf.objectives.whitening.group_whiten`); the loss is then the sum of the groups'
            SimTrace losses. 1 (default) is the paper.
        l2_first: ℓ2-normalise ``z1``, ``z2`` before ``μ``, ``Σ`` and the whitening. The authors' code
            does (with ``stop_gradient_cov`` and a ridge of 0.01, its covariance over ``2N − 1``); the
            paper does not ("we even do not use ℓ2 normalization for SimTrace"); default False.

    Returns:
        Scalar (a mean over the ``N`` rows), float32 (float64 for float64 inputs); with
        ``return_terms``, ``(loss, terms)``.
    """
    check_positive(eps, "eps")
    w1, w2 = _whiten(z1, z2, eps, stop_gradient_cov, groups, l2_first)
    loss = -ops.mean(ops.sum(w1 * w2, axis=1))
    return (loss, {"trace": loss}) if return_terms else loss


def embedding_std(z):
    """Collapse diagnostic: mean over dimensions of the per-dimension std of ``n(z)``.

    Rows are samples (``z`` is ``[N, D]``). About ``1/sqrt(D)`` for healthy (spread-out) embeddings,
    0 when all rows collapse to one direction. Not a loss; no paper equation (it is the usual
    SimSiam-style monitor).

    Returns:
        Scalar, float32 (float64 for float64 inputs).
    """
    z = check_embedding(z, "z")
    z = ops.cast(z, compute_dtype(z))
    return ops.mean(ops.std(l2_normalize(z), axis=0))
