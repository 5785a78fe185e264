"""Tests of uniclr_tf.objectives and uniclr_tf.objectives.whitening.

Values are compared with an independent float64 NumPy reference written here (Σ⁻¹ through
``np.linalg.solve`` for the trace and one-sided forms, ``np.linalg.cholesky`` + a triangular solve
for whitening); gradients with central finite differences of that reference in float64; then the
paper's properties, mixed precision, the N < D regime, input validation and the JAX backend.
"""

import numpy as np
import pytest

import keras
from keras import ops

from uniclr_tf import objectives as obj

UNICLR_LOSSES = {"simaffinity": obj.sim_affinity_loss, "simwhitening": obj.sim_whitening_loss,
                 "simtrace": obj.sim_trace_loss}
from uniclr_tf.objectives import whitening

try:
    from scipy.linalg import solve_triangular as _scipy_solve_triangular
except ImportError:  # pragma: no cover
    _scipy_solve_triangular = None

tf_only = pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                             reason="gradients through tf.GradientTape")


# ----------------------------------------------------------------------------------------------
# float64 NumPy reference (rows are samples)
# ----------------------------------------------------------------------------------------------

def ref_l2n(z):
    return z / np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)


def ref_affinity(z1, z2, tau=1.0):
    return ref_l2n(z1) @ ref_l2n(z2).T / tau


def ref_ce(a):
    m = a.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(a - m).sum(axis=1))
    return float(np.mean(lse - np.diag(a)))


def ref_sym(a):
    return float(np.sqrt(np.sum((a - a.T) ** 2)))


def ref_affinity_objective(a, gamma, symmetric_directions=False):
    ce = ref_ce(a)
    if symmetric_directions:
        ce = 0.5 * (ce + ref_ce(a.T))
    return ce + gamma * ref_sym(a)


def ref_sim_affinity(z1, z2, tau=0.5, gamma=0.01, symmetric_directions=False):
    return ref_affinity_objective(ref_affinity(z1, z2, tau), gamma, symmetric_directions)


def ref_stats(z1, z2, eps):
    zh = np.concatenate([z1, z2]).astype(np.float64)
    mu = zh.mean(axis=0)
    c = zh - mu
    return mu, c.T @ c / zh.shape[0] + eps * np.eye(zh.shape[1])


def ref_lower_solve(l, b):
    if _scipy_solve_triangular is not None:
        return _scipy_solve_triangular(l, b, lower=True)
    return np.linalg.solve(l, b)


def ref_whiten(z1, z2, eps=1e-4, stats=None):
    mu, cov = stats if stats is not None else ref_stats(z1, z2, eps)
    l = np.linalg.cholesky(cov)
    return ref_lower_solve(l, (z1 - mu).T).T, ref_lower_solve(l, (z2 - mu).T).T


def ref_sim_whitening(z1, z2, tau=1.0, gamma=0.01, eps=1e-4, mode="cholesky",
                      symmetric_directions=False, stats=None):
    if mode == "cholesky":
        w1, w2 = ref_whiten(z1, z2, eps, stats)
        a = ref_affinity(w1, w2, tau)
    else:  # the authors' one-sided form, ridge 0.01 instead of eps
        mu, cov = stats if stats is not None else ref_stats(z1, z2, 0.01)
        a = (z1 - mu) @ np.linalg.solve(cov, (z2 - mu).T) / z1.shape[0] / tau
    return ref_affinity_objective(a, gamma, symmetric_directions)


def ref_sim_trace(z1, z2, eps=1e-4, stats=None):
    mu, cov = stats if stats is not None else ref_stats(z1, z2, eps)
    return float(-np.trace((z1 - mu) @ np.linalg.solve(cov, (z2 - mu).T)) / z1.shape[0])


def ref_authors(q, k, kind, tau=1.0, gamma=0.01, ddof=1):
    """The authors' code (UniCLR_built_on_MoCov3, moco/builder.py: SimWhitening.simwhitening_loss,
    SimTrace.simtrace_loss), in float64: q, k ℓ2-normalised first, their joint mean and covariance
    over 2N − ddof rows plus 0.01·I, an explicit inverse, A = (q − μ)Σ⁻¹(k − μ)ᵀ; SimTrace −tr(A)/N,
    SimWhitening CE(A/N/τ) + γ‖A/N/τ − (A/N/τ)ᵀ‖_F. ddof=1 is theirs, ddof=0 this project's covariance."""
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
    q, k = unit(np.asarray(q, np.float64)), unit(np.asarray(k, np.float64))
    z = np.concatenate([q, k])
    mu = z.mean(axis=0)
    cov = (z - mu).T @ (z - mu) / (z.shape[0] - ddof) + 0.01 * np.eye(z.shape[1])
    a = (q - mu) @ np.linalg.inv(cov) @ (k - mu).T
    if kind == "simtrace":
        return float(-np.trace(a) / q.shape[0])
    return ref_affinity_objective(a / q.shape[0] / tau, gamma)


def views(seed, n, d, dtype=np.float32, noise=0.5, offset=0.3):
    """Two correlated views with a non-zero mean and unequal scales per dimension."""
    rng = np.random.default_rng(seed)
    scale = rng.uniform(0.5, 2.0, size=d)
    z1 = rng.normal(size=(n, d)) * scale + offset
    z2 = z1 + noise * rng.normal(size=(n, d)) * scale
    return z1.astype(dtype), z2.astype(dtype)


def rel_err(got, want):
    return abs(float(got) - want) / max(abs(want), 1e-12)


SHAPES = [(64, 16, 11), (32, 128, 12), (128, 32, 13), (64, 16, 14)]


# ----------------------------------------------------------------------------------------------
# values vs the float64 reference
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n,d,seed", SHAPES)
def test_affinity_family_matches_float64_reference(n, d, seed):
    z1, z2 = views(seed, n, d)
    x1, x2 = z1.astype(np.float64), z2.astype(np.float64)  # the same values, in float64
    a = ops.convert_to_numpy(obj.affinity_matrix(z1, z2, temperature=0.5))
    a_ref = ref_affinity(x1, x2, 0.5)
    assert a.shape == (n, n) and a.dtype == np.float32
    assert np.max(np.abs(a - a_ref)) <= 1e-5 * np.max(np.abs(a_ref))
    assert rel_err(obj.symmetry_loss(a_ref.astype(np.float32)), ref_sym(a_ref)) <= 1e-5
    for sym_dirs in (False, True):
        got = obj.sim_affinity_loss(z1, z2, temperature=0.5, gamma=0.01,
                                    symmetric_directions=sym_dirs)
        assert rel_err(got, ref_sim_affinity(x1, x2, 0.5, 0.01, sym_dirs)) <= 1e-5
    # gamma and tau are really used
    got = obj.sim_affinity_loss(z1, z2, temperature=0.2, gamma=0.5)
    assert rel_err(got, ref_sim_affinity(x1, x2, 0.2, 0.5)) <= 1e-5


@pytest.mark.parametrize("n,d,seed", SHAPES)
def test_whitening_family_matches_float64_reference(n, d, seed):
    z1, z2 = views(seed, n, d)
    x1, x2 = z1.astype(np.float64), z2.astype(np.float64)
    w1, w2 = obj.whiten(z1, z2, eps=1e-4)
    r1, r2 = ref_whiten(x1, x2, 1e-4)
    scale = max(np.abs(r1).max(), np.abs(r2).max())
    if 2 * n > d:  # well conditioned: whitened features themselves agree
        assert np.max(np.abs(ops.convert_to_numpy(w1) - r1)) <= 1e-4 * scale
        assert np.max(np.abs(ops.convert_to_numpy(w2) - r2)) <= 1e-4 * scale
    for kwargs in ({}, {"temperature": 0.5, "gamma": 0.1}, {"symmetric_directions": True}):
        got = obj.sim_whitening_loss(z1, z2, **kwargs)
        ref = ref_sim_whitening(x1, x2, tau=kwargs.get("temperature", 1.0),
                                gamma=kwargs.get("gamma", 0.01),
                                symmetric_directions=kwargs.get("symmetric_directions", False))
        assert rel_err(got, ref) <= 1e-4, kwargs
    got = obj.sim_whitening_loss(z1, z2, temperature=0.5, mode="one_sided")
    assert rel_err(got, ref_sim_whitening(x1, x2, tau=0.5, mode="one_sided")) <= 1e-4
    got = obj.sim_trace_loss(z1, z2, eps=1e-4)
    assert rel_err(got, ref_sim_trace(x1, x2, 1e-4)) <= 1e-4
    got = obj.sim_trace_loss(z1, z2, eps=0.1)
    assert rel_err(got, ref_sim_trace(x1, x2, 0.1)) <= 1e-4


@pytest.mark.parametrize("n,d,seed", SHAPES)
def test_l2_first_reproduces_the_authors_simwhitening_and_simtrace(n, d, seed):
    """``l2_first`` with the one-sided form (SimWhitening) or ε = 0.01 (SimTrace) is the authors' code
    up to its covariance's 2N − 1 (this one's 2N), a relative change under 1/N; without ``l2_first``
    (the paper) the raw embeddings are whitened and the values are several times further off."""
    z1, z2 = views(seed, n, d)
    x1, x2 = z1.astype(np.float64), z2.astype(np.float64)
    cases = {"simwhitening": lambda **kw: obj.sim_whitening_loss(z1, z2, temperature=0.5, gamma=0.1,
                                                                  mode="one_sided", **kw),
             "simtrace": lambda **kw: obj.sim_trace_loss(z1, z2, eps=0.01, stop_gradient_cov=True, **kw)}
    for kind, loss in cases.items():
        got = float(loss(l2_first=True))
        assert rel_err(got, ref_authors(x1, x2, kind, tau=0.5, gamma=0.1, ddof=0)) <= 1e-4, kind
        authors = ref_authors(x1, x2, kind, tau=0.5, gamma=0.1)
        assert rel_err(got, authors) <= 1 / n, kind
        assert rel_err(float(loss()), authors) > 5 * rel_err(got, authors), kind


def test_float64_inputs_stay_float64_and_exact():
    z1, z2 = views(3, 40, 8, dtype=np.float64)
    cases = [
        (obj.sim_affinity_loss(z1, z2), ref_sim_affinity(z1, z2)),
        (obj.sim_whitening_loss(z1, z2), ref_sim_whitening(z1, z2)),
        (obj.sim_whitening_loss(z1, z2, mode="one_sided"),
         ref_sim_whitening(z1, z2, mode="one_sided")),
        (obj.sim_trace_loss(z1, z2), ref_sim_trace(z1, z2)),
    ]
    for got, ref in cases:
        assert keras.backend.standardize_dtype(got.dtype) == "float64"
        assert rel_err(got, ref) <= 1e-10


# ----------------------------------------------------------------------------------------------
# gradients vs central finite differences (float64)
# ----------------------------------------------------------------------------------------------

def tape_grads(fn, z1, z2):
    import tensorflow as tf

    t1, t2 = tf.constant(z1), tf.constant(z2)
    with tf.GradientTape() as tape:
        tape.watch([t1, t2])
        loss = fn(t1, t2)
    g1, g2 = tape.gradient(loss, [t1, t2])
    return np.concatenate([g1.numpy().ravel(), g2.numpy().ravel()])


def fd_grads(ref_fn, z1, z2, h=1e-5):
    x = np.concatenate([z1.ravel(), z2.ravel()])
    k = z1.size
    out = np.zeros_like(x)
    for i in range(x.size):
        xp, xm = x.copy(), x.copy()
        xp[i] += h
        xm[i] -= h
        fp = ref_fn(xp[:k].reshape(z1.shape), xp[k:].reshape(z2.shape))
        fm = ref_fn(xm[:k].reshape(z1.shape), xm[k:].reshape(z2.shape))
        out[i] = (fp - fm) / (2 * h)
    return out


_N, _D = 6, 3
_Z1, _Z2 = views(21, _N, _D, dtype=np.float64)
_STATS = ref_stats(_Z1, _Z2, 1e-4)        # frozen statistics for the stop-gradient references
_STATS_ONE_SIDED = ref_stats(_Z1, _Z2, 0.01)

GRAD_CASES = {
    "simaffinity": (lambda a, b: obj.sim_affinity_loss(a, b, temperature=0.5, gamma=0.1),
                    lambda a, b: ref_sim_affinity(a, b, 0.5, 0.1)),
    "simaffinity_both_directions": (
        lambda a, b: obj.sim_affinity_loss(a, b, gamma=0.1, symmetric_directions=True),
        lambda a, b: ref_sim_affinity(a, b, 0.5, 0.1, symmetric_directions=True)),
    "simwhitening": (lambda a, b: obj.sim_whitening_loss(a, b, temperature=0.5, gamma=0.1),
                     lambda a, b: ref_sim_whitening(a, b, tau=0.5, gamma=0.1)),
    "simwhitening_sg": (
        lambda a, b: obj.sim_whitening_loss(a, b, temperature=0.5, gamma=0.1,
                                            stop_gradient_cov=True),
        lambda a, b: ref_sim_whitening(a, b, tau=0.5, gamma=0.1, stats=_STATS)),
    "simwhitening_one_sided": (
        lambda a, b: obj.sim_whitening_loss(a, b, mode="one_sided", gamma=0.1),
        lambda a, b: ref_sim_whitening(a, b, gamma=0.1, mode="one_sided")),
    "simwhitening_one_sided_sg": (
        lambda a, b: obj.sim_whitening_loss(a, b, mode="one_sided", gamma=0.1,
                                            stop_gradient_cov=True),
        lambda a, b: ref_sim_whitening(a, b, gamma=0.1, mode="one_sided",
                                       stats=_STATS_ONE_SIDED)),
    "simwhitening_one_sided_l2_first": (
        lambda a, b: obj.sim_whitening_loss(a, b, mode="one_sided", gamma=0.1, l2_first=True),
        lambda a, b: ref_authors(a, b, "simwhitening", gamma=0.1, ddof=0)),
    "simtrace": (lambda a, b: obj.sim_trace_loss(a, b), lambda a, b: ref_sim_trace(a, b)),
    "simtrace_l2_first": (lambda a, b: obj.sim_trace_loss(a, b, eps=0.01, l2_first=True),
                          lambda a, b: ref_authors(a, b, "simtrace", ddof=0)),
    "simtrace_sg": (lambda a, b: obj.sim_trace_loss(a, b, stop_gradient_cov=True),
                    lambda a, b: ref_sim_trace(a, b, stats=_STATS)),
}


@tf_only
@pytest.mark.parametrize("case", sorted(GRAD_CASES))
def test_gradients_match_finite_differences(case):
    fn, ref_fn = GRAD_CASES[case]
    got = tape_grads(fn, _Z1, _Z2)
    want = fd_grads(ref_fn, _Z1, _Z2)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8 * max(1.0, np.abs(want).max()))


@tf_only
@pytest.mark.parametrize("plain,sg", [("simtrace", "simtrace_sg"),
                                      ("simwhitening", "simwhitening_sg"),
                                      ("simwhitening_one_sided", "simwhitening_one_sided_sg")])
def test_stop_gradient_cov_changes_the_gradient_not_the_value(plain, sg):
    f_plain, f_sg = GRAD_CASES[plain][0], GRAD_CASES[sg][0]
    assert float(f_plain(_Z1, _Z2)) == pytest.approx(float(f_sg(_Z1, _Z2)), rel=1e-12)
    g_plain, g_sg = tape_grads(f_plain, _Z1, _Z2), tape_grads(f_sg, _Z1, _Z2)
    assert np.max(np.abs(g_plain - g_sg)) > 1e-3 * np.max(np.abs(g_plain))


@tf_only
def test_symmetry_gradient_is_finite_at_a_symmetric_affinity():
    # z1 == z2 makes A exactly symmetric: a naive sqrt(sum(d²)) would give a NaN gradient here.
    z = views(5, 8, 4, dtype=np.float64)[0]
    for fn in (lambda a, b: obj.sim_affinity_loss(a, b, gamma=0.5),
               lambda a, b: obj.sim_whitening_loss(a, b, gamma=0.5)):
        g = tape_grads(fn, z, z.copy())
        assert np.all(np.isfinite(g)) and np.abs(g).max() > 0


# ----------------------------------------------------------------------------------------------
# properties
# ----------------------------------------------------------------------------------------------

def test_whitened_features_have_identity_covariance():
    z1, z2 = views(31, 256, 16)
    w1, w2 = obj.whiten(z1, z2, eps=1e-6)
    w = np.concatenate([ops.convert_to_numpy(w1), ops.convert_to_numpy(w2)]).astype(np.float64)
    assert w.shape == (512, 16)
    np.testing.assert_allclose(w.mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(w.T @ w / w.shape[0], np.eye(16), atol=1e-4)
    # the raw features were far from white
    z = np.concatenate([z1, z2]).astype(np.float64)
    assert np.max(np.abs(np.cov(z.T, bias=True) - np.eye(16))) > 0.5


def test_whiten_never_uses_an_explicit_inverse(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("explicit inverse used")

    for name in ("inv", "cholesky_inverse", "solve"):
        monkeypatch.setattr(keras.ops, name, forbidden)
    z1, z2 = views(1, 32, 8)
    obj.whiten(z1, z2)
    obj.sim_trace_loss(z1, z2)
    obj.sim_whitening_loss(z1, z2, mode="one_sided")


def test_simtrace_lower_bound_at_identical_views():
    n, d, eps = 256, 16, 1e-4
    z1, z2 = views(41, n, d)
    at_equal = float(obj.sim_trace_loss(z1, z1, eps=eps))
    # exact value −Σ λ/(λ+ε) over the eigenvalues λ of the plain covariance
    lam = np.linalg.eigvalsh(ref_stats(z1.astype(np.float64), z1.astype(np.float64), 0.0)[1])
    assert at_equal == pytest.approx(-np.sum(lam / (lam + eps)), rel=1e-5)
    assert at_equal >= -d - 1e-3
    assert at_equal == pytest.approx(-d, rel=1e-3)
    correlated = float(obj.sim_trace_loss(z1, z2, eps=eps))
    independent = float(obj.sim_trace_loss(z1, views(42, n, d)[0], eps=eps))
    assert at_equal < correlated < independent
    assert abs(independent) < 2.0  # unrelated views: trace near 0, far above −D


def test_proposition_1_trace_identity():
    # tr(Z1 Σ⁻¹ Z2ᵀ) = tr(Σ⁻¹ Z2ᵀ Z1) (App. B, rows are samples): Eq. 3 and Eq. 4 agree.
    z1, z2 = views(51, 96, 24, dtype=np.float64)
    mu, cov = ref_stats(z1, z2, 1e-4)
    eq4 = -np.trace(np.linalg.solve(cov, (z2 - mu).T @ (z1 - mu))) / z1.shape[0]
    assert float(obj.sim_trace_loss(z1, z2, eps=1e-4)) == pytest.approx(eq4, rel=1e-10)
    w1, w2 = (ops.convert_to_numpy(w) for w in obj.whiten(z1, z2, eps=1e-4))
    assert -np.sum(w1 * w2) / z1.shape[0] == pytest.approx(eq4, rel=1e-10)


def test_symmetry_loss_zero_iff_symmetric():
    rng = np.random.default_rng(61)
    b = rng.normal(size=(10, 10)).astype(np.float32)
    assert float(obj.symmetry_loss(b + b.T)) == 0.0
    assert float(obj.symmetry_loss(b)) > 0.1
    assert float(obj.symmetry_loss(np.array([[0.0, 1.0], [0.0, 0.0]], np.float32))) == \
        pytest.approx(np.sqrt(2.0), rel=1e-7)  # the Frobenius norm, not its square


def test_cross_entropy_of_perfect_and_collapsed_affinities():
    eye = np.eye(8, dtype=np.float32)
    # orthogonal positives, temperature 0.05: margin 20 → CE = log(1 + 7e⁻²⁰) ≈ 1.4e-8
    assert float(obj.sim_affinity_loss(eye, eye, temperature=0.05)) < 1e-6
    # wrong pairing: the positive has the lowest logit of its row
    assert float(obj.sim_affinity_loss(eye, eye[::-1].copy(), temperature=0.05)) > 15.0
    # collapse: all rows equal → A constant → CE = log N, symmetric term 0
    const = np.ones((8, 4), np.float32)
    assert float(obj.sim_affinity_loss(const, const)) == pytest.approx(np.log(8), rel=1e-6)


def test_embedding_std_detects_collapse():
    d = 64
    z = np.random.default_rng(71).normal(size=(512, d)).astype(np.float32)
    healthy = float(obj.embedding_std(z))
    assert healthy == pytest.approx(1 / np.sqrt(d), rel=0.05)
    collapsed = np.tile(z[:1], (512, 1)) * np.linspace(1, 3, 512, dtype=np.float32)[:, None]
    assert float(obj.embedding_std(collapsed)) < 1e-6


@tf_only
def test_tf_function_with_unknown_batch_size_matches_eager():
    import tensorflow as tf

    z1, z2 = views(81, 48, 8)
    spec = [tf.TensorSpec([None, 8], tf.float32)] * 2
    for name, fn in UNICLR_LOSSES.items():
        graph_fn = tf.function(fn, input_signature=spec)
        assert float(graph_fn(z1, z2)) == pytest.approx(float(fn(z1, z2)), rel=1e-6), name


# ----------------------------------------------------------------------------------------------
# precision
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("low", ["bfloat16", "float16"])
def test_low_precision_inputs_are_computed_in_float32(low):
    z1, z2 = views(91, 64, 16)
    l1, l2 = ops.cast(z1, low), ops.cast(z2, low)
    u1, u2 = ops.cast(l1, "float32"), ops.cast(l2, "float32")    # the SAME values, upcast
    x1, x2 = (ops.convert_to_numpy(u).astype(np.float64) for u in (u1, u2))
    refs = {"simaffinity": ref_sim_affinity(x1, x2), "simwhitening": ref_sim_whitening(x1, x2),
            "simtrace": ref_sim_trace(x1, x2)}
    for name, fn in UNICLR_LOSSES.items():
        got = fn(l1, l2)
        assert keras.backend.standardize_dtype(got.dtype) == "float32", name
        assert float(got) == pytest.approx(float(fn(u1, u2)), rel=1e-6), name
        assert rel_err(got, refs[name]) <= 1e-4, name
    w1, _ = obj.whiten(l1, l2)
    assert keras.backend.standardize_dtype(w1.dtype) == "float32"
    assert keras.backend.standardize_dtype(obj.affinity_matrix(l1, l2).dtype) == "float32"


def _tf32_round(x):
    """Rounds float32 to TF32 (10 explicit mantissa bits), as tensor cores do with their inputs."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    b = (b + np.uint32(0x1000)) & np.uint32(0xFFFFE000)
    return b.view(np.float32)


def _tf32_matmul(a, b):
    a, b = ops.convert_to_numpy(a), ops.convert_to_numpy(b)
    return ops.convert_to_tensor(np.matmul(_tf32_round(a), _tf32_round(b)).astype(np.float32))


def test_split_gram_recovers_float32_accuracy_under_tf32():
    x = np.random.default_rng(101).normal(size=(512, 64)).astype(np.float32)
    x = x - x.mean(axis=0)
    exact = x.astype(np.float64).T @ x.astype(np.float64)
    scale = np.abs(exact).max()
    naive = ops.convert_to_numpy(_tf32_matmul(x.T, x))
    split = ops.convert_to_numpy(whitening.split_gram(ops.convert_to_tensor(x), _tf32_matmul))
    assert np.abs(naive - exact).max() / scale > 1e-5      # the TF32 trap
    assert np.abs(split - exact).max() / scale < 2e-6      # fixed
    assert np.abs(ops.convert_to_numpy(whitening.gram(x)) - exact).max() / scale < 2e-6


# ----------------------------------------------------------------------------------------------
# N < D
# ----------------------------------------------------------------------------------------------

@tf_only
def test_fewer_samples_than_dimensions_gives_finite_values_and_gradients():
    z1, z2 = views(111, 8, 64, dtype=np.float32)
    fns = {
        "simwhitening": lambda a, b: obj.sim_whitening_loss(a, b),
        "simwhitening_sg": lambda a, b: obj.sim_whitening_loss(a, b, stop_gradient_cov=True),
        "one_sided": lambda a, b: obj.sim_whitening_loss(a, b, mode="one_sided"),
        "simtrace": lambda a, b: obj.sim_trace_loss(a, b),
        "simtrace_sg": lambda a, b: obj.sim_trace_loss(a, b, stop_gradient_cov=True),
    }
    for name, fn in fns.items():
        assert np.isfinite(float(fn(z1, z2))), name
        assert np.all(np.isfinite(tape_grads(fn, z1, z2))), name


def test_fewer_samples_than_dimensions_makes_whitening_losses_flat():
    # With 2N ≤ D and a small ε, whitening maps 2N distinct centred rows to mutually orthogonal
    # vectors (Ŵ Ŵᵀ = 2N·(I − 11ᵀ/2N)), so SimTrace ≈ +1 however correlated the views are: the
    # loss is flat, no learning signal (identical views, rank N − 1, give −(N − 1)).
    n = 16
    for seed, noise in ((121, 0.5), (122, 0.05)):
        z1, z2 = views(seed, n, 64, dtype=np.float64, noise=noise)
        assert float(obj.sim_trace_loss(z1, z2, eps=1e-6)) == pytest.approx(1.0, abs=1e-2)
        assert float(obj.sim_trace_loss(z1, z1, eps=1e-6)) == pytest.approx(-(n - 1), abs=1e-2)
        # SimWhitening likewise: A is constant, CE = log N
        assert float(obj.sim_whitening_loss(z1, z2, eps=1e-8)) == pytest.approx(np.log(n), rel=1e-6)
    # with 2N > D the same correlated views are far from +1
    z1, z2 = views(123, 64, 16, noise=0.05)
    assert float(obj.sim_trace_loss(z1, z2)) < -10.0


# ----------------------------------------------------------------------------------------------
# API: validation, registry
# ----------------------------------------------------------------------------------------------

def test_input_validation_names_the_argument_and_shape():
    z = np.zeros((8, 4), np.float32)
    with pytest.raises(ValueError, match=r"z1.*\(8,\)"):
        obj.sim_affinity_loss(np.zeros(8, np.float32), z)
    with pytest.raises(ValueError, match=r"z2.*\(2, 8, 4\)"):
        obj.sim_trace_loss(z, np.zeros((2, 8, 4), np.float32))
    with pytest.raises(ValueError, match=r"\(8, 4\).*\(8, 5\)"):
        obj.sim_whitening_loss(z, np.zeros((8, 5), np.float32))
    with pytest.raises(ValueError, match=r"\(8, 4\).*\(7, 4\)"):
        obj.whiten(z, np.zeros((7, 4), np.float32))
    with pytest.raises(ValueError, match=r"a.*\(8, 4\)"):
        obj.symmetry_loss(z)
    with pytest.raises(ValueError, match="mode"):
        obj.sim_whitening_loss(z, z, mode="zca")
    with pytest.raises(ValueError, match="temperature"):
        obj.affinity_matrix(z, z, temperature=0.0)


def test_whiten_is_reexported():
    assert obj.whiten is whitening.whiten


# ----------------------------------------------------------------------------------------------
# JAX backend
# ----------------------------------------------------------------------------------------------

@tf_only
def test_jax_backend_matches_tensorflow(run_python):
    z1, z2 = views(131, 32, 8)
    out = run_python(f"""
        import json
        import jax
        import numpy as np
        from uniclr_tf import objectives as obj
        z1 = np.array({z1.tolist()!r}, np.float32)
        z2 = np.array({z2.tolist()!r}, np.float32)
        res = {{}}
        losses = {{"simaffinity": obj.sim_affinity_loss, "simwhitening": obj.sim_whitening_loss,
                   "simtrace": obj.sim_trace_loss}}
        for name, fn in losses.items():
            res[name] = float(fn(z1, z2))
            res[name + "_jit"] = float(jax.jit(fn)(z1, z2))
        g = jax.grad(lambda a, b: obj.sim_trace_loss(a, b))(z1, z2)
        res["simtrace_grad"] = np.asarray(g).tolist()
        res["backend"] = __import__("keras").backend.backend()
        print(json.dumps(res))
    """, backend="jax")
    assert out["backend"] == "jax"
    for name, fn in UNICLR_LOSSES.items():
        tf_value = float(fn(z1, z2))
        assert rel_err(out[name], tf_value) <= 1e-5, name
        assert rel_err(out[name + "_jit"], tf_value) <= 1e-5, name
    g_tf = tape_grads(obj.sim_trace_loss, z1, z2)[: z1.size].reshape(z1.shape)
    np.testing.assert_allclose(np.array(out["simtrace_grad"]), g_tf, rtol=1e-4,
                               atol=1e-5 * np.abs(g_tf).max())


def test_return_terms_decompose_the_loss():
    rng = np.random.default_rng(11)
    z1, z2 = (rng.normal(size=(32, 8)).astype("float32") for _ in range(2))
    for fn, kwargs in ((obj.sim_affinity_loss, dict(gamma=0.3)), (obj.sim_whitening_loss, dict(gamma=0.3))):
        loss, terms = fn(z1, z2, return_terms=True, **kwargs)
        np.testing.assert_allclose(float(loss), float(fn(z1, z2, **kwargs)), rtol=1e-6)
        np.testing.assert_allclose(float(terms["cross_entropy"]) + 0.3 * float(terms["symmetry"]), float(loss), rtol=1e-5)
        assert float(terms["symmetry"]) > 0
    loss, terms = obj.sim_trace_loss(z1, z2, return_terms=True)
    np.testing.assert_allclose(float(terms["trace"]), float(loss))
