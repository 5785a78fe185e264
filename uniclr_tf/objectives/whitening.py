"""Joint covariance and Cholesky whitening of two views (UniCLR, arXiv 2211.14516, §3.1–§3.2).

Rows are samples: ``z1`` and ``z2`` are ``[N, D]`` (the paper writes ``Z ∈ R^{D×N}``; every formula
here is the paper's, transposed). The statistics are those of the two views together::

    Ẑ = concat(z1, z2)                      # [2N, D]
    μ = mean(Ẑ)                             # [D]
    Σ = (Ẑ − μ)ᵀ(Ẑ − μ) / (2N) + ε·I        # [D, D]
    Σ = L Lᵀ                                # Cholesky, L lower-triangular
    w(z) = (z − μ) L⁻ᵀ                      # a triangular solve, never an explicit inverse

so that ``w(z1) w(z2)ᵀ = (z1 − μ) Σ⁻¹ (z2 − μ)ᵀ`` and the whitened rows of ``Ẑ`` have covariance
``I − ε L⁻¹L⁻ᵀ ≈ I`` (the eigenvalues of ``I − ε Σ⁻¹``).

All linear algebra runs in float32 or wider whatever the input dtype (bfloat16 / float16 are upcast
to float32, float64 stays float64), and the covariance product runs at the highest matmul precision
the backend offers (TF32, the float32 default on Ampere+ GPUs, cost 3e-5 to 1e-4 of max|Σ| here).

Needs ``2N > D`` to mean anything: with ``2N ≤ D`` and a small ε, the ``2N`` centred rows of ``Ẑ``
(rank ``2N − 1``) are whitened to mutually orthogonal vectors, ``Ŵ Ŵᵀ ≈ 2N·(I − 11ᵀ/2N)``, whatever
the data, so whitening-based losses go flat (SimTrace ≈ +1, SimWhitening ≈ log N).

:func:`group_whiten` is the cheap variant: each of ``G`` feature groups whitened with its own
statistics (block-diagonal ``Σ``), one batched Cholesky of ``G`` ``D/G × D/G`` matrices.

:func:`subbatch_whiten` is W-MSE's whitening (Ermolov et al., ICML 2021), used by the W-MSE
baseline loss: ONE view at a time, each contiguous sub-batch of rows with its own statistics.

The generic tensor helpers (dtype handling, shape checks) live in :mod:`uniclr_tf.objectives.tensors`.

Pure ``keras.ops``; TensorFlow and JAX are imported lazily, only inside the backend-specific
precision branch of :func:`gram`.
"""

import functools
import numbers

import keras
from keras import ops

from uniclr_tf.objectives.tensors import as_dtype
from uniclr_tf.objectives.tensors import check_embedding
from uniclr_tf.objectives.tensors import check_embedding_pair
from uniclr_tf.objectives.tensors import compute_dtype
from uniclr_tf.objectives.tensors import static_shape

__all__ = [
    "batched_gram",
    "check_groups",
    "check_whitening_size",
    "gram",
    "group_whiten",
    "joint_statistics",
    "split_gram",
    "subbatch_whiten",
    "whiten",
]


@functools.lru_cache(maxsize=None)
def _tf_has_gpu():
    import tensorflow as tf  # backend-specific branch, only under the TensorFlow backend

    return bool(tf.config.list_logical_devices("GPU"))


def _tf_gpu_uses_tf32():
    """True when TensorFlow may run float32 matmuls in TF32 (a visible GPU and TF32 left on)."""
    import tensorflow as tf  # backend-specific branch, only under the TensorFlow backend

    return _tf_has_gpu() and bool(tf.config.experimental.tensor_float_32_execution_enabled())


def split_gram(x, matmul=ops.matmul):
    """``xᵀ x`` accurate to float32 even when ``matmul`` rounds its inputs to TF32 (10-bit mantissa).

    ``x = hi + lo`` with ``hi = bfloat16(x)`` (8 significant bits, exact in TF32) and ``lo = x − hi``
    (exact in float32, ``|lo| ≤ 2⁻⁸|x|``). Then ``xᵀx = hiᵀhi + hiᵀlo + loᵀx``: the first product is
    exact, the TF32 rounding of ``lo`` and ``x`` in the others costs about 2⁻²⁰ relative (3 matmuls,
    the "3xTF32" scheme). Measured with TF32 matmuls on an H200 (through JAX's default precision):
    max error 3e-7 to 6e-7 of max|Σ| for 2N ≤ 2048, D ≤ 512, vs 3e-5 to 5e-5 for one TF32 matmul
    and 1e-7 to 2e-7 at full float32; what is left is the float32 accumulation of the GPU kernel.
    """
    hi = ops.cast(ops.cast(x, "bfloat16"), x.dtype)
    lo = x - hi
    hi_t = ops.transpose(hi)
    g = matmul(hi_t, hi) + matmul(hi_t, lo) + matmul(ops.transpose(lo), x)
    return 0.5 * (g + ops.transpose(g))


def gram(x):
    """``xᵀ x`` for ``x`` of shape ``[M, D]`` at the highest matmul precision of the backend.

    * JAX: ``precision=HIGHEST`` (the default float32 dot may use TF32 / bf16 passes on GPU/TPU).
    * TensorFlow: TF has no per-op precision and TF32 is a global switch, on by default, used on
      Ampere+ GPUs; when it may apply, :func:`split_gram` recovers float32 accuracy.
    * Otherwise (CPU, float64, other backends): a plain matmul.
    """
    backend = keras.backend.backend()
    if backend == "jax":
        import jax  # backend-specific branch, only under the JAX backend

        return jax.numpy.matmul(ops.transpose(x), x, precision=jax.lax.Precision.HIGHEST)
    if (backend == "tensorflow" and keras.backend.standardize_dtype(x.dtype) == "float32"
            and _tf_gpu_uses_tf32()):
        return split_gram(x)
    return ops.matmul(ops.transpose(x), x)


def joint_statistics(z1, z2, eps=1e-4, stop_gradient_cov=False):
    """Joint mean ``μ`` [D] and Cholesky factor ``L`` [D, D] of ``Σ`` of both views (§3.1).

    ``Σ = (Ẑ − μ)ᵀ(Ẑ − μ)/(2N) + eps·I`` with ``Ẑ = concat(z1, z2)``, ``Σ = L Lᵀ``. Rows are samples.

    Args:
        z1, z2: ``[N, D]`` embeddings of the two views.
        eps: ridge added to the covariance; keeps ``Σ`` positive definite when ``2N ≤ D`` (the
            Cholesky of a singular matrix is NaN or an error, depending on the backend).
        stop_gradient_cov: if True, no gradient flows through ``μ`` and ``L``.

    Returns:
        ``(mu, chol, z1, z2)``: the statistics, and the two views cast to the compute dtype.
    """
    z1, z2, dtype = check_embedding_pair(z1, z2)
    z_hat = ops.concatenate([z1, z2], axis=0)
    if stop_gradient_cov:
        z_hat = ops.stop_gradient(z_hat)
    mu = ops.mean(z_hat, axis=0)
    centred = z_hat - mu
    num = ops.cast(ops.shape(z_hat)[0], dtype)
    dim = ops.shape(z1)[1]
    cov = gram(centred) / num + as_dtype(eps, dtype) * ops.eye(dim, dtype=dtype)
    chol = ops.cholesky(cov)
    return mu, chol, z1, z2


def whiten(z1, z2, eps=1e-4, stop_gradient_cov=False):
    """Cholesky whitening of two views with their joint mean and covariance (UniCLR §3.1, §3.2).

    Rows are samples: ``z1``, ``z2`` are ``[N, D]``. With ``Ẑ = concat(z1, z2)``,
    ``μ = mean(Ẑ)``, ``Σ = (Ẑ − μ)ᵀ(Ẑ − μ)/(2N) + eps·I = L Lᵀ``, returns
    ``w(z) = (z − μ) L⁻ᵀ`` for both views, computed with one triangular solve (no explicit inverse),
    so that ``w(z1) w(z2)ᵀ = (z1 − μ) Σ⁻¹ (z2 − μ)ᵀ`` (the whitened affinity of Eq. 2).

    Computed in float32 (bfloat16 / float16 inputs are upcast) or float64 for float64 inputs.

    Args:
        z1, z2: ``[N, D]`` embeddings of the two views, same shape.
        eps: ridge ``ε`` added to ``Σ``.
        stop_gradient_cov: stop the gradient through ``μ`` and ``Σ`` (hence ``L``), not through
            ``z`` (the authors' code detaches the covariance; the paper lets it flow).

    Returns:
        ``(w1, w2)``, each ``[N, D]``.
    """
    mu, chol, z1, z2 = joint_statistics(z1, z2, eps=eps, stop_gradient_cov=stop_gradient_cov)
    centred = ops.concatenate([z1, z2], axis=0) - mu                    # [2N, D]
    # w = centred L⁻ᵀ  ⇔  wᵀ = L⁻¹ centredᵀ: one lower-triangular solve on [D, 2N].
    w = ops.transpose(ops.solve_triangular(chol, ops.transpose(centred), lower=True))
    n = ops.shape(z1)[0]
    return w[:n], w[n:]


# ----------------------------------------------------------------------------------------------
# Cheap whitening: feature-group (block-diagonal) whitening
# ----------------------------------------------------------------------------------------------

def batched_gram(x):
    """``xᵀ x`` per group for ``x`` of shape ``[G, M, d]`` → ``[G, d, d]``, at the precision of :func:`gram`."""
    backend = keras.backend.backend()
    xt = ops.swapaxes(x, -1, -2)
    if backend == "jax":
        import jax  # backend-specific branch, only under the JAX backend

        return jax.numpy.matmul(xt, x, precision=jax.lax.Precision.HIGHEST)
    if (backend == "tensorflow" and keras.backend.standardize_dtype(x.dtype) == "float32"
            and _tf_gpu_uses_tf32()):
        hi = ops.cast(ops.cast(x, "bfloat16"), x.dtype)
        lo = x - hi
        hi_t = ops.swapaxes(hi, -1, -2)
        g = ops.matmul(hi_t, hi) + ops.matmul(hi_t, lo) + ops.matmul(ops.swapaxes(lo, -1, -2), x)
        return 0.5 * (g + ops.swapaxes(g, -1, -2))
    return ops.matmul(xt, x)


def check_groups(groups, dim):
    """Validates ``groups`` (a positive int dividing the feature size ``dim``); returns it as an int."""
    if isinstance(groups, bool) or int(groups) != groups or groups < 1:
        raise ValueError(f"`groups` must be a positive integer; received groups={groups!r}")
    groups = int(groups)
    if dim is not None and dim % groups:
        raise ValueError(f"`groups` must divide the feature size D={dim}; received groups={groups}")
    return groups


def group_whiten(z1, z2, groups=1, eps=1e-4, stop_gradient_cov=False):
    """Feature-group whitening: the cheap, block-diagonal version of :func:`whiten`.

    The ``D`` features are split into ``groups`` contiguous groups of ``d = D / groups``; each
    group is whitened with its own joint mean and covariance of both views (the statistics of
    :func:`whiten` restricted to the group)::

        Σ_g = (Ẑ_g − μ_g)ᵀ(Ẑ_g − μ_g) / (2N) + ε·I_d = L_g L_gᵀ      w_g(z) = (z_g − μ_g) L_g⁻ᵀ

    i.e. whitening with the block-diagonal part of ``Σ`` (correlations between groups are left in;
    Decorrelated BN's and W-MSE's group whitening). One batched Cholesky of ``groups`` ``d × d``
    matrices replaces the ``D × D`` one: ``groups²`` times fewer flops, and the sequential depth of
    the factorisation and of the triangular solves drops from ``D`` to ``d`` (the groups run side by
    side). ``groups=1`` is exactly :func:`whiten` (the same code path). Each group needs
    ``2N > d`` instead of ``2N > D``.

    For SimTrace the loss with groups is the sum over groups of each group's SimTrace, and its
    lower bound is still about ``−D``.

    Args:
        z1, z2: ``[N, D]`` embeddings of the two views, same shape; ``groups`` must divide ``D``.
        groups: number of feature groups (1: full whitening).
        eps: ridge ``ε`` added to each ``Σ_g``.
        stop_gradient_cov: stop the gradient through ``μ`` and the ``Σ_g`` (not through ``z``).

    Returns:
        ``(w1, w2)``, each ``[N, D]``, float32 (float64 for float64 inputs).
    """
    z1, z2, dtype = check_embedding_pair(z1, z2)
    shape = static_shape(z1)
    dim = None if shape is None else shape[1]
    groups = check_groups(groups, dim)
    if groups == 1:
        return whiten(z1, z2, eps=eps, stop_gradient_cov=stop_gradient_cov)
    if dim is None:
        raise ValueError("group_whiten needs a static feature size D; received an unknown D")
    d = dim // groups
    z_hat = ops.concatenate([z1, z2], axis=0)                           # [M, D], M = 2N
    stats = ops.stop_gradient(z_hat) if stop_gradient_cov else z_hat
    mu = ops.mean(stats, axis=0)
    num = ops.cast(ops.shape(z_hat)[0], dtype)
    xs = ops.transpose(ops.reshape(stats - mu, (-1, groups, d)), (1, 0, 2))   # [G, M, d]
    cov = batched_gram(xs) / num + as_dtype(eps, dtype) * ops.eye(d, dtype=dtype)
    chol = ops.cholesky(cov)                                             # [G, d, d]
    rhs = ops.transpose(ops.reshape(z_hat - mu, (-1, groups, d)), (1, 2, 0))  # [G, d, M]
    w = ops.solve_triangular(chol, rhs, lower=True)                      # [G, d, M]
    w = ops.reshape(ops.transpose(w, (2, 0, 1)), (-1, dim))              # [M, D]
    n = ops.shape(z1)[0]
    return w[:n], w[n:]


# ----------------------------------------------------------------------------------------------
# W-MSE whitening: one view, contiguous sub-batches, each with its own statistics
# ----------------------------------------------------------------------------------------------

def check_whitening_size(whitening_size, num_rows):
    """Validates W-MSE's sub-batch size against the batch size ``num_rows`` (``None`` if unknown).

    Returns the effective sub-batch size: ``whitening_size``, or ``num_rows`` when
    ``whitening_size ≥ num_rows`` (one sub-batch).
    """
    if (isinstance(whitening_size, bool) or not isinstance(whitening_size, numbers.Integral)
            or whitening_size < 2):
        raise ValueError("`whitening_size` must be an integer >= 2 (the covariance of a sub-batch "
                         f"divides by its size − 1); received whitening_size={whitening_size!r}")
    whitening_size = int(whitening_size)
    if num_rows is None:
        return whitening_size
    if whitening_size >= num_rows:
        if num_rows < 2:
            raise ValueError(f"W-MSE whitening needs at least 2 rows; received N={num_rows}")
        return num_rows
    if num_rows % whitening_size:
        raise ValueError(
            f"The batch size N={num_rows} must be a multiple of `whitening_size`; "
            f"received whitening_size={whitening_size}")
    return whitening_size


def subbatch_whiten(z, whitening_size, eps=1e-4, name="z"):
    """W-MSE whitening of ONE view: each contiguous sub-batch of rows with its own statistics.

    Rows are samples: ``z`` is ``[N, D]``, split into ``N / m`` contiguous sub-batches ``V`` of
    ``m = whitening_size`` rows (one sub-batch when ``whitening_size ≥ N``). As W-MSE's code
    (Ermolov et al., ICML 2021) does, for each sub-batch::

        μ_V = mean(V)                                      # [D]
        Σ_V = (V − μ_V)ᵀ(V − μ_V) / (m − 1)                # unbiased, as W-MSE
        (1 − ε)·Σ_V + ε·I = L Lᵀ                           # W-MSE's shrinkage ridge
        w(V) = (V − μ_V) L⁻ᵀ                               # a triangular solve, no explicit inverse

    One batched Cholesky of ``N/m`` ``D × D`` matrices, the covariance products at the precision of
    :func:`batched_gram` (float32 or wider, highest matmul precision). The gradient flows through
    ``μ_V`` and ``Σ_V`` (W-MSE detaches neither). Needs ``m > D``: with ``m ≤ D`` the centred rows of
    a sub-batch are whitened to mutually orthogonal vectors whatever the data.

    Args:
        z: ``[N, D]`` embeddings of one view; ``N`` a multiple of ``whitening_size`` (or ≤ it;
            when ``N`` is unknown at trace time it must be a multiple). ``D`` must be static.
        whitening_size: sub-batch size ``m`` (an integer ≥ 2).
        eps: shrinkage ``ε`` in ``[0, 1)``.
        name: the argument name used in error messages.

    Returns:
        ``[N, D]`` whitened rows, float32 (float64 for float64 inputs).
    """
    z = check_embedding(z, name)
    if isinstance(eps, (int, float)) and not 0 <= eps < 1:
        raise ValueError(f"`eps` must be in [0, 1) (W-MSE's shrinkage); received eps={eps!r}")
    shape = static_shape(z)
    num_rows = None if shape is None else shape[0]
    dim = None if shape is None else shape[1]
    if dim is None:
        raise ValueError(f"W-MSE whitening needs a static feature size D; received {name}.shape={shape}")
    m = check_whitening_size(whitening_size, num_rows)
    dtype = compute_dtype(z)
    z = ops.cast(z, dtype)
    v = ops.reshape(z, (-1, m, dim))                                      # [S, m, D]
    centred = v - ops.mean(v, axis=1, keepdims=True)
    eps_t = as_dtype(eps, dtype)
    cov = batched_gram(centred) / as_dtype(m - 1, dtype)                  # [S, D, D]
    cov = (1 - eps_t) * cov + eps_t * ops.eye(dim, dtype=dtype)
    chol = ops.cholesky(cov)
    # w = centred L⁻ᵀ  ⇔  wᵀ = L⁻¹ centredᵀ: one batched lower-triangular solve on [S, D, m].
    w = ops.solve_triangular(chol, ops.swapaxes(centred, -1, -2), lower=True)
    return ops.reshape(ops.swapaxes(w, -1, -2), (-1, dim))
