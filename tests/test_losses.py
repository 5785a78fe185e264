"""Tests of the baseline SSL losses of uniclr_tf.objectives (contrastive, asymmetric, redundancy).

Every loss is compared with an independent float64 NumPy reference written here straight from its
definition (loops over rows where the definition is per row); gradients with central finite
differences of that reference in float64; then properties (aligned embeddings, stop-gradients,
collapsed batches), mixed precision, ``return_terms``, argument validation, XLA and the JAX backend.
"""

import numpy as np
import pytest

import keras
from keras import ops

from uniclr_tf import objectives as obj

tf_only = pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                             reason="gradients through tf.GradientTape")


# ----------------------------------------------------------------------------------------------
# float64 NumPy references (rows are samples), straight from the definitions
# ----------------------------------------------------------------------------------------------

def ref_l2n(z):
    return z / np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)


def ref_lse(v):
    m = np.max(v)
    return m + np.log(np.sum(np.exp(v - m)))


def ref_log_softmax(v):
    return v - ref_lse(v)


def ref_nt_xent(z1, z2, tau=0.5):
    n = z1.shape[0]
    z = ref_l2n(np.concatenate([z1, z2]))
    s = z @ z.T / tau
    total = 0.0
    for r in range(2 * n):
        target = (r + n) % (2 * n)
        others = [c for c in range(2 * n) if c != r]
        total += ref_lse(s[r, others]) - s[r, target]
    return total / (2 * n)


def ref_info_nce(q, k, tau=0.2, queue=None):
    nq, nk = ref_l2n(q), ref_l2n(k)
    total = 0.0
    for i in range(q.shape[0]):
        if queue is None:
            logits = nk @ nq[i] / tau
            total += ref_lse(logits) - logits[i]
        else:
            logits = np.concatenate([[nq[i] @ nk[i]], ref_l2n(queue) @ nq[i]]) / tau
            total += ref_lse(logits) - logits[0]
    return total / q.shape[0]


def ref_co2_consistency(q, k, queue, tau_con=0.04):
    nq, nk, nqueue = ref_l2n(q), ref_l2n(k), ref_l2n(queue)
    total = 0.0
    for i in range(q.shape[0]):
        log_p = ref_log_softmax(nqueue @ nq[i] / tau_con)
        log_q = ref_log_softmax(nqueue @ nk[i] / tau_con)
        kl_pq = np.sum(np.exp(log_p) * (log_p - log_q))
        kl_qp = np.sum(np.exp(log_q) * (log_q - log_p))
        total += 0.5 * (kl_pq + kl_qp)
    return total / q.shape[0]


def ref_co2(q, k, queue, tau=0.2, tau_con=0.04, alpha=1.0):
    return ref_info_nce(q, k, tau, queue) + alpha * ref_co2_consistency(q, k, queue, tau_con)


def ref_cos(a, b):
    return np.array([a[i] @ b[i] / (np.linalg.norm(a[i]) * np.linalg.norm(b[i]))
                     for i in range(a.shape[0])])


def ref_byol(p, z):
    return float(np.mean(2 - 2 * ref_cos(p, z)))


def ref_negative_cosine(p, z):
    return float(-np.mean(ref_cos(p, z)))


def ref_barlow_terms(z1, z2):
    def bn(z):  # BatchNorm without affine: biased variance, eps 1e-5 inside the sqrt
        return (z - z.mean(axis=0)) / np.sqrt(z.var(axis=0) + 1e-5)

    n, d = z1.shape
    c = bn(z1).T @ bn(z2) / n
    on = sum((1 - c[i, i]) ** 2 for i in range(d))
    off = sum(c[i, j] ** 2 for i in range(d) for j in range(d) if i != j)
    return on, off


def ref_barlow(z1, z2, lambd=0.0051):
    on, off = ref_barlow_terms(z1, z2)
    return on + lambd * off


def ref_vicreg_terms(z1, z2):
    n, d = z1.shape
    inv = np.mean((z1 - z2) ** 2)

    def var_cov(z):
        std = np.sqrt(z.var(axis=0, ddof=1) + 1e-4)
        cov = np.cov(z, rowvar=False)                      # unbiased, (N − 1)
        off = sum(cov[i, j] ** 2 for i in range(d) for j in range(d) if i != j) / d
        return np.mean(np.maximum(0.0, 1 - std)), off

    v1, c1 = var_cov(z1)
    v2, c2 = var_cov(z2)
    return inv, 0.5 * (v1 + v2), c1 + c2


def ref_vicreg(z1, z2, sim=25.0, std=25.0, cov=1.0):
    i, v, c = ref_vicreg_terms(z1, z2)
    return sim * i + std * v + cov * c


def ref_wmse_whiten(z, m, eps):
    n, d = z.shape
    m = min(m, n)
    out = np.zeros_like(z)
    for start in range(0, n, m):
        v = z[start:start + m]
        centred = v - v.mean(axis=0)
        cov = centred.T @ centred / (m - 1)
        l = np.linalg.cholesky((1 - eps) * cov + eps * np.eye(d))
        out[start:start + m] = np.linalg.solve(l, centred.T).T      # (V − μ) L⁻ᵀ
    return out


def ref_wmse(z1, z2, eps=1e-4, m=128):
    return float(np.mean(2 - 2 * ref_cos(ref_wmse_whiten(z1, m, eps), ref_wmse_whiten(z2, m, eps))))


def ref_sinkhorn(scores, eps=0.05, iterations=3):
    """SwAV's Algorithm 1 as written (exp domain, single device)."""
    q = np.exp(scores / eps).T                  # [K, B]
    q = q / q.sum()
    k, b = q.shape
    for _ in range(iterations):
        q = q / q.sum(axis=1, keepdims=True) / k
        q = q / q.sum(axis=0, keepdims=True) / b
    return (q * b).T


def ref_swav(s1, s2, tau=0.1, eps=0.05, iterations=3, codes=None):
    """``codes``: (q1, q2) to use instead of those of (s1, s2) (stop-gradient: finite differences
    must hold them constant)."""
    q1, q2 = codes or (ref_sinkhorn(s1, eps, iterations), ref_sinkhorn(s2, eps, iterations))
    a = np.mean([q1[r] @ ref_log_softmax(s2[r] / tau) for r in range(s1.shape[0])])
    b = np.mean([q2[r] @ ref_log_softmax(s1[r] / tau) for r in range(s1.shape[0])])
    return -0.5 * (a + b)


def ref_dino(student, teacher, center, ts=0.1, tt=0.04):
    total = 0.0
    for r in range(student.shape[0]):
        p = np.exp(ref_log_softmax((teacher[r] - center) / tt))
        total -= p @ ref_log_softmax(student[r] / ts)
    return total / student.shape[0]


def ref_zero_cl_parts(z1, z2, eps=0.01, frozen=None):
    """Zero-CL's official ``fea_loss`` + ``ins_loss`` (single device); ``frozen``: whitening matrices
    to use instead of those of (z1, z2) (the official code detaches them: finite differences must
    hold them constant)."""
    def stdz(z, axis):
        return (z - z.mean(axis=axis, keepdims=True)) / (z.std(axis=axis, ddof=1, keepdims=True) + 1e-4)

    def zca(x):
        values, vectors = np.linalg.eigh(x.T @ x / x.shape[0])
        return vectors @ np.diag(1 / np.sqrt(values + eps)) @ vectors.T

    n, d = z1.shape
    f = [stdz(z, 0) for z in (z1, z2)]          # [N, D]: rows are samples
    t = [stdz(z, 1).T for z in (z1, z2)]        # [D, N]: rows are features
    mats = frozen or [zca(x) for x in f + t]
    f = [x @ w for x, w in zip(f, mats[:2])]
    t = [x @ w for x, w in zip(t, mats[2:])]
    feature = np.sum((np.diag(f[0].T @ f[1] / n) - 1) ** 2)
    instance = np.sum((np.diag(t[0].T @ t[1] / d) - 1) ** 2)
    return instance, feature, mats


def ref_zero_cl(z1, z2, eps=0.01, frozen=None):
    instance, feature, _ = ref_zero_cl_parts(z1, z2, eps, frozen)
    return instance + feature


# ----------------------------------------------------------------------------------------------
# cases: (library loss, reference), each a function of (view 1, view 2, queue)
# ----------------------------------------------------------------------------------------------

CASES = {
    "nt_xent": (lambda a, b, qu: obj.nt_xent_loss(a, b, temperature=0.3),
                lambda a, b, qu: ref_nt_xent(a, b, 0.3)),
    "info_nce": (lambda a, b, qu: obj.info_nce_loss(a, b, temperature=0.2),
                 lambda a, b, qu: ref_info_nce(a, b, 0.2)),
    "info_nce_queue": (lambda a, b, qu: obj.info_nce_loss(a, b, temperature=0.2, queue=qu),
                       lambda a, b, qu: ref_info_nce(a, b, 0.2, qu)),
    "co2": (lambda a, b, qu: obj.co2_loss(a, b, qu, temperature=0.2, consistency_temperature=0.1,
                                          consistency_weight=0.7),
            lambda a, b, qu: ref_co2(a, b, qu, 0.2, 0.1, 0.7)),
    "co2_consistency": (lambda a, b, qu: obj.co2_consistency(a, b, qu),
                        lambda a, b, qu: ref_co2_consistency(a, b, qu)),
    "byol": (lambda a, b, qu: obj.byol_loss(a, b), lambda a, b, qu: ref_byol(a, b)),
    "negative_cosine": (lambda a, b, qu: obj.negative_cosine_loss(a, b),
                        lambda a, b, qu: ref_negative_cosine(a, b)),
    "barlow_twins": (lambda a, b, qu: obj.barlow_twins_loss(a, b, lambd=0.02),
                     lambda a, b, qu: ref_barlow(a, b, 0.02)),
    "vicreg": (lambda a, b, qu: obj.vicreg_loss(a, b), lambda a, b, qu: ref_vicreg(a, b)),
    "wmse": (lambda a, b, qu: obj.wmse_loss(a, b, whitening_size=32),
             lambda a, b, qu: ref_wmse(a, b, 1e-4, 32)),
    # scores of unnormalised embeddings: a milder ε / T than the defaults (made for cosines) keeps
    # exp(scores / ε) within float32's comfortable range for the 1e-5 comparison
    "swav": (lambda a, b, qu: obj.swav_loss(a, b, temperature=0.5, epsilon=0.5, iterations=3),
             lambda a, b, qu: ref_swav(a, b, 0.5, 0.5, 3)),
    "dino": (lambda a, b, qu: obj.dino_loss(a, b, qu[0], student_temperature=0.5, teacher_temperature=0.3),
             lambda a, b, qu: ref_dino(a, b, qu[0], 0.5, 0.3)),
    "zero_cl": (lambda a, b, qu: obj.zero_cl_loss(a, b), lambda a, b, qu: ref_zero_cl(a, b)),
}


def views(seed, n, d, dtype=np.float32, noise=0.5, offset=0.3, k=40):
    """Two correlated views (non-zero mean, unequal scales per dimension) and a queue ``[k, D]``."""
    rng = np.random.default_rng(seed)
    scale = rng.uniform(0.5, 2.0, size=d)
    z1 = rng.normal(size=(n, d)) * scale + offset
    z2 = z1 + noise * rng.normal(size=(n, d)) * scale
    queue = rng.normal(size=(k, d)) * scale + offset
    return z1.astype(dtype), z2.astype(dtype), queue.astype(dtype)


def rel_err(got, want):
    return abs(float(got) - want) / max(abs(want), 1e-12)


def dtype_of(x):
    return keras.backend.standardize_dtype(x.dtype)


SHAPES = [(32, 8, 1), (64, 12, 2), (96, 6, 3)]     # N multiple of the W-MSE sub-batch (32 > D)


# ----------------------------------------------------------------------------------------------
# values vs the float64 reference
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n,d,seed", SHAPES)
@pytest.mark.parametrize("dtype,rtol", [(np.float64, 1e-10), (np.float32, 1e-5)])
def test_losses_match_float64_reference(n, d, seed, dtype, rtol):
    z1, z2, queue = views(seed, n, d, dtype=dtype)
    x1, x2, xq = (v.astype(np.float64) for v in (z1, z2, queue))
    for name, (fn, ref_fn) in CASES.items():
        got = fn(z1, z2, queue)
        assert dtype_of(got) == np.dtype(dtype).name, name
        assert ops.ndim(got) == 0, name
        assert rel_err(got, ref_fn(x1, x2, xq)) <= rtol, name


def test_wmse_one_sub_batch_when_whitening_size_reaches_the_batch():
    z1, z2, _ = views(4, 24, 5, dtype=np.float64)
    want = ref_wmse(z1, z2, 1e-4, 24)
    for size in (24, 128):     # 128 is the default
        assert rel_err(obj.wmse_loss(z1, z2, whitening_size=size), want) <= 1e-10
    # several sub-batches differ from one
    assert rel_err(obj.wmse_loss(z1, z2, whitening_size=12), ref_wmse(z1, z2, 1e-4, 12)) <= 1e-10
    assert abs(float(obj.wmse_loss(z1, z2, whitening_size=12)) - want) > 1e-3


@pytest.mark.parametrize("low", ["bfloat16", "float16"])
def test_low_precision_inputs_are_computed_in_float32(low):
    z1, z2, queue = views(7, 64, 8)
    lows = [ops.cast(v, low) for v in (z1, z2, queue)]
    ups = [ops.cast(v, "float32") for v in lows]        # the SAME values, upcast
    for name, (fn, _) in CASES.items():
        got = fn(*lows)
        assert dtype_of(got) == "float32", name
        assert float(got) == pytest.approx(float(fn(*ups)), rel=1e-6, abs=1e-7), name
        assert float(got) == pytest.approx(float(fn(z1, z2, queue)), rel=1e-2, abs=1e-3), name


# ----------------------------------------------------------------------------------------------
# gradients vs central finite differences of the reference (float64)
# ----------------------------------------------------------------------------------------------

def tape_grads(fn, *inputs):
    """Gradients of ``fn(*inputs)`` w.r.t. every input (zeros where TF reports none)."""
    import tensorflow as tf

    ts = [tf.constant(x) for x in inputs]
    with tf.GradientTape() as tape:
        tape.watch(ts)
        loss = fn(*ts)
    grads = tape.gradient(loss, ts)
    return [np.zeros(x.shape) if g is None else g.numpy() for g, x in zip(grads, inputs)]


def fd_grad(ref_fn, inputs, which, h=1e-5):
    """Central finite differences of ``ref_fn(*inputs)`` w.r.t. ``inputs[which]``."""
    x = inputs[which]
    out = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        plus, minus = [v.copy() for v in inputs], [v.copy() for v in inputs]
        plus[which][idx] += h
        minus[which][idx] -= h
        out[idx] = (ref_fn(*plus) - ref_fn(*minus)) / (2 * h)
    return out


_GZ1, _GZ2, _GQ = views(21, 8, 3, dtype=np.float64, k=5)

# (library, reference, inputs the gradient reaches: the others are stop-gradient constants)
GRAD_CASES = {
    "nt_xent": (lambda a, b: obj.nt_xent_loss(a, b, temperature=0.5),
                lambda a, b: ref_nt_xent(a, b, 0.5), (0, 1)),
    "barlow_twins": (lambda a, b: obj.barlow_twins_loss(a, b, lambd=0.05),
                     lambda a, b: ref_barlow(a, b, 0.05), (0, 1)),
    "vicreg": (lambda a, b: obj.vicreg_loss(a, b), lambda a, b: ref_vicreg(a, b), (0, 1)),
    "wmse": (lambda a, b: obj.wmse_loss(a, b, whitening_size=4),
             lambda a, b: ref_wmse(a, b, 1e-4, 4), (0, 1)),
    "co2": (lambda a, b: obj.co2_loss(a, b, _GQ, consistency_temperature=0.1, consistency_weight=2.0),
            lambda a, b: ref_co2(a, b, _GQ, 0.2, 0.1, 2.0), (0,)),
    "info_nce": (lambda a, b: obj.info_nce_loss(a, b), lambda a, b: ref_info_nce(a, b), (0,)),
    "byol": (lambda a, b: obj.byol_loss(a, b), lambda a, b: ref_byol(a, b), (0,)),
    "swav": (lambda a, b: obj.swav_loss(a, b, temperature=0.3, epsilon=0.2),
             lambda a, b: ref_swav(a, b, 0.3, 0.2, codes=(ref_sinkhorn(_GZ1, 0.2), ref_sinkhorn(_GZ2, 0.2))), (0, 1)),
    "dino": (lambda a, b: obj.dino_loss(a, b, _GQ[0], student_temperature=0.2, teacher_temperature=0.1),
             lambda a, b: ref_dino(a, b, _GQ[0], 0.2, 0.1), (0,)),
    # the whitening matrices are constants (detached, as the official code): held at their value
    "zero_cl": (lambda a, b: obj.zero_cl_loss(a, b),
                lambda a, b: ref_zero_cl(a, b, frozen=ref_zero_cl_parts(_GZ1, _GZ2)[2]), (0, 1)),
}


@tf_only
@pytest.mark.parametrize("case", sorted(GRAD_CASES))
def test_gradients_match_finite_differences(case):
    fn, ref_fn, reached = GRAD_CASES[case]
    inputs = [_GZ1, _GZ2]
    got = tape_grads(fn, *inputs)
    for which in reached:
        want = fd_grad(ref_fn, inputs, which)
        assert np.all(np.isfinite(got[which]))
        np.testing.assert_allclose(got[which], want, rtol=1e-6,
                                   atol=1e-8 * max(1.0, np.abs(want).max()), err_msg=case)


# ----------------------------------------------------------------------------------------------
# properties
# ----------------------------------------------------------------------------------------------

def test_aligned_well_separated_embeddings_give_a_small_contrastive_loss():
    eye = np.eye(16, dtype=np.float32)
    z, queue = eye[:8] * 3.0, eye[8:]                 # orthogonal samples, queue orthogonal too
    assert float(obj.nt_xent_loss(z, z, temperature=0.05)) < 1e-6
    assert float(obj.info_nce_loss(z, z, temperature=0.05)) < 1e-6
    assert float(obj.info_nce_loss(z, z, temperature=0.05, queue=queue)) < 1e-6
    # mismatched positives are heavily penalised
    assert float(obj.nt_xent_loss(z, z[::-1].copy(), temperature=0.05)) > 15.0
    assert float(obj.info_nce_loss(z, z[::-1].copy(), temperature=0.05)) > 15.0
    # a collapsed batch cannot tell its samples apart: log(2N − 1) and log(N)
    const = np.ones((8, 4), np.float32)
    assert float(obj.nt_xent_loss(const, const)) == pytest.approx(np.log(15), rel=1e-6)
    assert float(obj.info_nce_loss(const, const)) == pytest.approx(np.log(8), rel=1e-6)


def test_byol_and_negative_cosine_at_identical_and_opposite_inputs():
    z1, _, _ = views(31, 16, 8)
    assert float(obj.byol_loss(z1, z1)) == pytest.approx(0.0, abs=1e-6)
    assert float(obj.byol_loss(z1, -z1)) == pytest.approx(4.0, rel=1e-6)
    assert float(obj.byol_loss(z1, 2.5 * z1)) == pytest.approx(0.0, abs=1e-6)   # scale-invariant
    assert float(obj.negative_cosine_loss(z1, z1)) == pytest.approx(-1.0, rel=1e-6)
    assert float(obj.negative_cosine_loss(z1, -z1)) == pytest.approx(1.0, rel=1e-6)


def test_co2_consistency_vanishes_when_query_equals_key_and_is_positive_otherwise():
    z1, z2, queue = views(41, 16, 8)
    assert float(obj.co2_consistency(z1, z1, queue)) == pytest.approx(0.0, abs=1e-7)
    assert float(obj.co2_consistency(z1, z2, queue)) > 1e-3
    # α = 0 is MoCo v2's InfoNCE
    assert float(obj.co2_loss(z1, z2, queue, consistency_weight=0.0)) == pytest.approx(
        float(obj.info_nce_loss(z1, z2, queue=queue)), rel=1e-7)


def test_redundancy_losses_at_identical_standardised_views():
    # identical views: Barlow's C is the correlation matrix of z, VICReg's invariance is 0
    z1, _, _ = views(51, 256, 4, dtype=np.float64)
    _, terms = obj.barlow_twins_loss(z1, z1, return_terms=True)
    assert float(terms["on_diagonal"]) < 1e-6
    _, terms = obj.vicreg_loss(z1, z1, return_terms=True)
    assert float(terms["invariance"]) == 0.0
    # unit-variance independent features: no variance hinge, nearly no covariance
    white = np.random.default_rng(52).normal(size=(4096, 4)) * 1.5
    _, terms = obj.vicreg_loss(white, white, return_terms=True)
    assert float(terms["variance"]) == 0.0 and float(terms["covariance"]) < 1e-2


@tf_only
def test_stop_gradient_targets_receive_no_gradient():
    z1, z2, queue = views(61, 16, 8, dtype=np.float64)
    cases = {   # loss of (online, target, queue) → the target and the queue are constants
        "byol": lambda a, b, qu: obj.byol_loss(a, b),
        "negative_cosine": lambda a, b, qu: obj.negative_cosine_loss(a, b),
        "info_nce": lambda a, b, qu: obj.info_nce_loss(a, b),
        "info_nce_queue": lambda a, b, qu: obj.info_nce_loss(a, b, queue=qu),
        "co2": lambda a, b, qu: obj.co2_loss(a, b, qu),
        "co2_consistency": lambda a, b, qu: obj.co2_consistency(a, b, qu),
    }
    for name, fn in cases.items():
        g_online, g_target, g_queue = tape_grads(fn, z1, z2, queue)
        assert np.abs(g_online).max() > 1e-4, name
        assert np.all(g_target == 0), name
        assert np.all(g_queue == 0), name


@tf_only
@pytest.mark.parametrize("name", sorted(CASES))
def test_collapsed_batch_gives_finite_loss_and_gradients(name):
    fn, _ = CASES[name]
    row = np.random.default_rng(71).normal(size=(1, 8)).astype(np.float32)
    collapsed = np.tile(row, (64, 1))
    for queue in (np.tile(row, (16, 1)), views(72, 16, 8)[2]):
        loss = float(fn(collapsed, collapsed.copy(), queue))
        assert np.isfinite(loss), name
        for g in tape_grads(fn, collapsed, collapsed.copy(), queue):
            assert np.all(np.isfinite(g)), name
    zero = np.zeros((64, 8), np.float32)            # all-zero rows: ℓ2 normalisation must be safe
    assert np.isfinite(float(fn(zero, zero.copy(), np.zeros((16, 8), np.float32)))), name
    for g in tape_grads(fn, zero, zero.copy(), np.zeros((16, 8), np.float32)):
        assert np.all(np.isfinite(g)), name


def test_return_terms_combine_to_the_loss():
    z1, z2, queue = views(81, 32, 8, dtype=np.float64)

    def check(fn, combine, **kwargs):
        loss, terms = fn(return_terms=True, **kwargs)
        assert float(loss) == pytest.approx(float(fn(**kwargs)), rel=1e-12)
        assert float(combine(terms)) == pytest.approx(float(loss), rel=1e-12)
        return terms

    check(lambda **kw: obj.nt_xent_loss(z1, z2, **kw), lambda t: t["cross_entropy"])
    check(lambda **kw: obj.info_nce_loss(z1, z2, **kw), lambda t: t["cross_entropy"])
    check(lambda **kw: obj.info_nce_loss(z1, z2, queue=queue, **kw), lambda t: t["cross_entropy"])
    terms = check(lambda **kw: obj.co2_loss(z1, z2, queue, consistency_weight=3.0, **kw),
                  lambda t: t["cross_entropy"] + 3.0 * t["consistency"])
    assert float(terms["consistency"]) == pytest.approx(float(obj.co2_consistency(z1, z2, queue)))
    assert float(terms["cross_entropy"]) == pytest.approx(float(obj.info_nce_loss(z1, z2, queue=queue)))
    check(lambda **kw: obj.byol_loss(z1, z2, **kw), lambda t: t["distance"])
    check(lambda **kw: obj.negative_cosine_loss(z1, z2, **kw), lambda t: t["negative_cosine"])
    terms = check(lambda **kw: obj.barlow_twins_loss(z1, z2, lambd=0.3, **kw),
                  lambda t: t["on_diagonal"] + 0.3 * t["off_diagonal"])
    on, off = ref_barlow_terms(z1, z2)
    assert float(terms["on_diagonal"]) == pytest.approx(on, rel=1e-10)
    assert float(terms["off_diagonal"]) == pytest.approx(off, rel=1e-10)
    terms = check(lambda **kw: obj.vicreg_loss(z1, z2, sim_coeff=2.0, std_coeff=3.0, cov_coeff=4.0, **kw),
                  lambda t: 2.0 * t["invariance"] + 3.0 * t["variance"] + 4.0 * t["covariance"])
    for key, want in zip(("invariance", "variance", "covariance"), ref_vicreg_terms(z1, z2)):
        assert float(terms[key]) == pytest.approx(want, rel=1e-10, abs=1e-14), key
    check(lambda **kw: obj.wmse_loss(z1, z2, whitening_size=16, **kw), lambda t: t["distance"])
    for fn in (obj.nt_xent_loss, obj.byol_loss, obj.negative_cosine_loss, obj.barlow_twins_loss,
               obj.vicreg_loss, obj.wmse_loss, obj.info_nce_loss):
        _, terms = fn(z1, z2, return_terms=True)
        assert all(dtype_of(v) == "float64" for v in terms.values())


# ----------------------------------------------------------------------------------------------
# argument validation
# ----------------------------------------------------------------------------------------------

def test_bad_arguments_raise_value_errors_naming_the_argument():
    z, _, queue = views(91, 32, 8)
    bad = [
        ("temperature=0.0", lambda: obj.nt_xent_loss(z, z, temperature=0.0)),
        ("temperature=-0.1", lambda: obj.info_nce_loss(z, z, temperature=-0.1)),
        ("temperature=0", lambda: obj.co2_loss(z, z, queue, temperature=0)),
        ("consistency_temperature=0.0", lambda: obj.co2_loss(z, z, queue, consistency_temperature=0.0)),
        ("consistency_weight=-1.0", lambda: obj.co2_loss(z, z, queue, consistency_weight=-1.0)),
        ("temperature=0.0", lambda: obj.co2_consistency(z, z, queue, temperature=0.0)),
        ("queue=None", lambda: obj.co2_loss(z, z, None)),
        ("queue=None", lambda: obj.co2_consistency(z, z, None)),
        ("queue.shape=(40, 5)", lambda: obj.info_nce_loss(z, z, queue=queue[:, :5])),
        ("queue.shape=(40,)", lambda: obj.co2_loss(z, z, queue[:, 0])),
        ("lambd=-0.5", lambda: obj.barlow_twins_loss(z, z, lambd=-0.5)),
        ("sim_coeff=-1.0", lambda: obj.vicreg_loss(z, z, sim_coeff=-1.0)),
        ("std_coeff=-2.0", lambda: obj.vicreg_loss(z, z, std_coeff=-2.0)),
        ("cov_coeff=-3.0", lambda: obj.vicreg_loss(z, z, cov_coeff=-3.0)),
        ("N >= 2", lambda: obj.vicreg_loss(z[:1], z[:1])),
        ("whitening_size=12", lambda: obj.wmse_loss(z, z, whitening_size=12)),
        ("whitening_size=1", lambda: obj.wmse_loss(z, z, whitening_size=1)),
        ("whitening_size=16.0", lambda: obj.wmse_loss(z, z, whitening_size=16.0)),
        ("eps=1.5", lambda: obj.wmse_loss(z, z, eps=1.5)),
        ("p.shape=(32, 8) and z.shape=(32, 4)", lambda: obj.byol_loss(z, z[:, :4])),
        ("`p`", lambda: obj.negative_cosine_loss(z[0], z)),
        ("q.shape=(32, 8) and k.shape=(16, 8)", lambda: obj.info_nce_loss(z, z[:16])),
        ("z1.shape=(32, 8) and z2.shape=(32, 7)", lambda: obj.nt_xent_loss(z, z[:, :7])),
        ("`z2`", lambda: obj.barlow_twins_loss(z, np.zeros((2, 32, 8), np.float32))),
        ("floating-point", lambda: obj.vicreg_loss(z, np.ones((32, 8), np.int32))),
    ]
    for expected, call in bad:
        with pytest.raises(ValueError, match=None) as info:
            call()
        assert expected in str(info.value), (expected, str(info.value))
    with pytest.raises(ValueError) as info:
        obj.wmse_loss(z, z, whitening_size=12)
    assert "N=32" in str(info.value) and "12" in str(info.value)


def test_every_name_is_exported():
    for name in ("nt_xent_loss", "info_nce_loss", "co2_loss", "co2_consistency", "byol_loss",
                 "negative_cosine_loss", "barlow_twins_loss", "vicreg_loss", "wmse_loss",
                 "sim_affinity_loss", "sim_whitening_loss", "sim_trace_loss", "symmetry_loss",
                 "affinity_matrix", "embedding_std", "l2_normalize", "whiten", "group_whiten",
                 "sinkhorn_knopp", "swav_loss", "swapped_prediction_loss",
                 "dino_loss", "zero_cl_loss", "zca_whitening_matrix"):
        assert name in obj.__all__ and hasattr(obj, name), name
    assert not hasattr(obj, "LOSSES") and not hasattr(obj, "get_objective")  # the old registry is gone


# ----------------------------------------------------------------------------------------------
# XLA (TensorFlow) and the JAX backend
# ----------------------------------------------------------------------------------------------

@tf_only
def test_xla_compiled_losses_match_eager():
    import tensorflow as tf

    z1, z2, queue = views(101, 64, 8)
    names = sorted(CASES)
    # one XLA program for every loss (one compilation)
    compiled = tf.function(lambda a, b, qu: tf.stack([CASES[n][0](a, b, qu) for n in names]),
                           jit_compile=True)
    got = compiled(z1, z2, queue).numpy()
    for name, value in zip(names, got):
        assert value == pytest.approx(float(CASES[name][0](z1, z2, queue)), rel=1e-5), name


@tf_only
def test_tf_function_with_unknown_batch_size_matches_eager():
    import tensorflow as tf

    z1, z2, queue = views(105, 64, 8)
    spec = [tf.TensorSpec([None, 8], tf.float32)] * 3
    for name, (fn, _) in CASES.items():
        graph_fn = tf.function(fn, input_signature=spec, autograph=False)
        assert float(graph_fn(z1, z2, queue)) == pytest.approx(float(fn(z1, z2, queue)), rel=1e-5), name


JAX_CASES = {   # name → the call, as source evaluated in the JAX subprocess and here
    "nt_xent": "obj.nt_xent_loss(a, b, temperature=0.3)",
    "info_nce": "obj.info_nce_loss(a, b)",
    "info_nce_queue": "obj.info_nce_loss(a, b, queue=qu)",
    "co2": "obj.co2_loss(a, b, qu, consistency_weight=0.7)",
    "co2_consistency": "obj.co2_consistency(a, b, qu)",
    "byol": "obj.byol_loss(a, b)",
    "negative_cosine": "obj.negative_cosine_loss(a, b)",
    "barlow_twins": "obj.barlow_twins_loss(a, b)",
    "vicreg": "obj.vicreg_loss(a, b)",
    "wmse": "obj.wmse_loss(a, b, whitening_size=32)",
    "swav": "obj.swav_loss(a, b, temperature=0.5, epsilon=0.5)",
    "dino": "obj.dino_loss(a, b, qu[0], student_temperature=0.5, teacher_temperature=0.3)",
    "zero_cl": "obj.zero_cl_loss(a, b)",
    "sinkhorn_sum": "obj.sinkhorn_knopp(a * 0.1)[0, 0] + obj.sinkhorn_knopp(a * 0.1)[5, 3]",
}


@tf_only
def test_jax_backend_matches_tensorflow(run_python):
    z1, z2, queue = views(111, 64, 8)
    out = run_python(f"""
        import json
        import jax
        import jax.numpy as jnp
        import numpy as np
        import keras
        from uniclr_tf import objectives as obj
        z1 = np.array({z1.tolist()!r}, np.float32)
        z2 = np.array({z2.tolist()!r}, np.float32)
        queue = np.array({queue.tolist()!r}, np.float32)
        calls = {JAX_CASES!r}
        names = sorted(calls)
        fns = [eval("lambda a, b, qu: " + calls[n]) for n in names]

        def total_and_values(a, b, qu):
            values = jnp.stack([fn(a, b, qu) for fn in fns])
            return jnp.sum(values), values

        # one jit program: every loss, and the gradient of their sum w.r.t. all inputs
        step = jax.jit(jax.value_and_grad(total_and_values, argnums=(0, 1, 2), has_aux=True))
        (_, values), grads = step(z1, z2, queue)
        res = dict(zip(names, np.asarray(values).astype(float).tolist()))
        res["eager_wmse"] = float(obj.wmse_loss(z1, z2, whitening_size=32))
        res["grads_finite"] = all(bool(np.all(np.isfinite(np.asarray(g)))) for g in grads)
        res["backend"] = keras.backend.backend()
        print(json.dumps(res))
    """, backend="jax")
    assert out["backend"] == "jax"
    assert out["grads_finite"]
    a, b, qu = z1, z2, queue  # noqa: F841 (names used by the evaluated calls)
    for name, call in JAX_CASES.items():
        tf_value = float(eval(call))
        assert rel_err(out[name], tf_value) <= 1e-5, name
    assert rel_err(out["eager_wmse"], float(obj.wmse_loss(z1, z2, whitening_size=32))) <= 1e-5


# ----------------------------------------------------------------------------------------------
# SwAV, DINO, Zero-CL: what the shared cases above do not cover
# ----------------------------------------------------------------------------------------------

def test_sinkhorn_knopp_matches_swav_algorithm_and_equipartitions():
    rng = np.random.default_rng(121)
    z = ref_l2n(rng.normal(size=(48, 16)))
    c = ref_l2n(rng.normal(size=(10, 16)))
    scores = z @ c.T                                     # cosines, SwAV's range, at the default ε
    for iterations in (1, 3, 10):
        want = ref_sinkhorn(scores, 0.05, iterations)
        got64 = np.asarray(obj.sinkhorn_knopp(scores, iterations=iterations))
        got32 = np.asarray(obj.sinkhorn_knopp(scores.astype(np.float32), iterations=iterations))
        np.testing.assert_allclose(got64, want, rtol=1e-10, atol=1e-14)
        np.testing.assert_allclose(got32, want, rtol=2e-4, atol=1e-6)
        np.testing.assert_allclose(got64.sum(axis=1), 1.0, rtol=1e-12)    # each row a distribution
    # converged: every prototype gets B/K of the mass
    np.testing.assert_allclose(np.asarray(obj.sinkhorn_knopp(scores, iterations=200)).sum(axis=0), 48 / 10, rtol=1e-6)
    # unnormalised scores at ε 0.05 overflow exp() in the reference algorithm, not here
    big = np.asarray(obj.sinkhorn_knopp((scores * 100).astype(np.float32)))
    assert np.all(np.isfinite(big)) and np.allclose(big.sum(axis=1), 1.0, atol=1e-5)


def test_swav_default_settings_match_reference_and_two_directions():
    rng = np.random.default_rng(122)
    protos = ref_l2n(rng.normal(size=(20, 8)))
    z1 = ref_l2n(rng.normal(size=(32, 8)))
    z2 = ref_l2n(z1 + 0.3 * rng.normal(size=(32, 8)))
    s1, s2 = z1 @ protos.T, z2 @ protos.T
    assert rel_err(obj.swav_loss(s1, s2), ref_swav(s1, s2)) <= 1e-10
    assert rel_err(obj.swav_loss(s1.astype(np.float32), s2.astype(np.float32)), ref_swav(s1, s2)) <= 1e-4
    # the mean of the two swapped directions (the model's ordered pairs) is swav_loss
    both = 0.5 * (float(obj.swapped_prediction_loss(s2, s1)) + float(obj.swapped_prediction_loss(s1, s2)))
    assert both == pytest.approx(float(obj.swav_loss(s1, s2)), rel=1e-12)
    _, terms = obj.swav_loss(s1, s2, return_terms=True)
    assert float(terms["cross_entropy"]) == pytest.approx(float(obj.swav_loss(s1, s2)), rel=1e-12)


@tf_only
def test_codes_and_teacher_and_centre_receive_no_gradient():
    z1, z2, queue = views(123, 16, 8, dtype=np.float64)
    g_s, g_t = tape_grads(lambda a, b: obj.swapped_prediction_loss(a, b, epsilon=0.5), z1, z2)
    assert np.abs(g_s).max() > 1e-4 and np.all(g_t == 0)
    g_q, = tape_grads(lambda a: obj.sinkhorn_knopp(a)[0, 0] + 0.0, z1)
    assert np.all(g_q == 0)
    g_s, g_t, g_c = tape_grads(lambda a, b, c: obj.dino_loss(a, b, c), z1, z2, queue[0])
    assert np.abs(g_s).max() > 1e-4 and np.all(g_t == 0) and np.all(g_c == 0)


def test_dino_centre_and_temperatures():
    z1, z2, queue = views(124, 16, 8, dtype=np.float64)
    center = queue[0]
    assert rel_err(obj.dino_loss(z1, z2, center), ref_dino(z1, z2, center)) <= 1e-10
    assert rel_err(obj.dino_loss(z1, z2, center[None, :]), ref_dino(z1, z2, center)) <= 1e-10
    # a scalar tensor temperature (the warm-up schedule's value) is accepted
    tt = ops.convert_to_tensor(0.07, dtype="float64")
    assert rel_err(obj.dino_loss(z1, z2, center, teacher_temperature=tt), ref_dino(z1, z2, center, 0.1, 0.07)) <= 1e-10
    # a constant shift of the teacher is what centring removes
    assert float(obj.dino_loss(z1, z2 + 3.0, center + 3.0)) == pytest.approx(float(obj.dino_loss(z1, z2, center)))


def test_zero_cl_terms_match_reference_and_whitening_whitens():
    z1, z2, _ = views(125, 64, 12, dtype=np.float64)
    instance, feature, _ = ref_zero_cl_parts(z1, z2)
    loss, terms = obj.zero_cl_loss(z1, z2, instance_weight=0.5, feature_weight=2.0, return_terms=True)
    assert float(terms["instance"]) == pytest.approx(instance, rel=1e-10)
    assert float(terms["feature"]) == pytest.approx(feature, rel=1e-10)
    assert float(loss) == pytest.approx(0.5 * instance + 2.0 * feature, rel=1e-10)
    x = (z1 - z1.mean(0)) / z1.std(0)
    w = np.asarray(obj.zca_whitening_matrix(x, eps=1e-9))
    np.testing.assert_allclose((x @ w).T @ (x @ w) / 64, np.eye(12), atol=1e-6)
    np.testing.assert_allclose(w, w.T, atol=1e-12)                   # ZCA: symmetric


def test_new_losses_refuse_bad_arguments_naming_them():
    z, _, queue = views(126, 32, 8)
    bad = [
        ("epsilon=0", lambda: obj.sinkhorn_knopp(z, epsilon=0)),
        ("iterations=0", lambda: obj.sinkhorn_knopp(z, iterations=0)),
        ("temperature=-1", lambda: obj.swav_loss(z, z, temperature=-1)),
        ("scores.shape=(32, 8) and target_scores.shape=(32, 7)", lambda: obj.swapped_prediction_loss(z, z[:, :7])),
        ("teacher_temperature=0.0", lambda: obj.dino_loss(z, z, queue[0], teacher_temperature=0.0)),
        ("center.shape=(7,)", lambda: obj.dino_loss(z, z, queue[0, :7])),
        ("center.shape=(2, 8)", lambda: obj.dino_loss(z, z, queue[:2])),
        ("eps=0.0", lambda: obj.zero_cl_loss(z, z, eps=0.0)),
        ("feature_weight=-1", lambda: obj.zero_cl_loss(z, z, feature_weight=-1)),
    ]
    for expected, call in bad:
        with pytest.raises(ValueError) as info:
            call()
        assert expected in str(info.value), (expected, str(info.value))
