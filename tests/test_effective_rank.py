"""The effective rank the kNN monitor logs (collapse diagnostics), against a float64 SVD reference."""

import numpy as np
import pytest

from uniclr_tf.evaluation import effective_rank


def reference(features):
    x = np.asarray(features, np.float64)
    s = np.linalg.svd(x - x.mean(0), compute_uv=False)
    p = s / s.sum()
    p = p[p > 0]
    return float(np.exp(-(p * np.log(p)).sum()))


@pytest.mark.parametrize("seed", [0, 1])
def test_effective_rank_matches_the_svd_definition(seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(300, 24)) @ np.diag(np.linspace(0.1, 3.0, 24))  # unequal directions
    got = effective_rank(x.astype(np.float32))
    assert got == pytest.approx(reference(x), rel=2e-3)
    assert 1.0 < got < 24.0


def test_effective_rank_extremes():
    rng = np.random.default_rng(2)
    line = np.outer(rng.normal(size=500), rng.normal(size=16)) + 3.0  # collapsed onto one direction
    assert effective_rank(line.astype(np.float32)) == pytest.approx(1.0, abs=0.05)
    white = rng.normal(size=(20000, 8))  # every direction the same: close to the full rank
    assert effective_rank(white.astype(np.float32)) == pytest.approx(8.0, rel=0.01)
    assert effective_rank(np.ones((10, 4), np.float32)) == 0.0  # no variance at all
