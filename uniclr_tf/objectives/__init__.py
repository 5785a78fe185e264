"""Self-supervised objectives as pure ``keras.ops`` functions (TensorFlow and JAX backends).

Rows are samples: embeddings are ``[N, D]``. Every loss returns a scalar mean over this call's rows
(float32, float64 for float64 inputs, bfloat16 / float16 upcast to float32 first) and, with
``return_terms=True``, ``(loss, terms)``. One module per family; this package re-exports them all:

* :mod:`~uniclr_tf.objectives.uniclr`: the UniCLR objectives (arXiv 2211.14516): SimAffinity,
  SimWhitening, SimTrace, the symmetric loss, the affinity matrix, ``embedding_std``, ``l2_normalize``.
* :mod:`~uniclr_tf.objectives.contrastive`: SimCLR's NT-Xent, MoCo's InfoNCE, CO2.
* :mod:`~uniclr_tf.objectives.asymmetric`: BYOL, SimSiam's negative cosine.
* :mod:`~uniclr_tf.objectives.redundancy`: Barlow Twins, VICReg, W-MSE, Zero-CL.
* :mod:`~uniclr_tf.objectives.clustering`: SwAV's Sinkhorn-Knopp and swapped prediction, DINO.

The whitening maths is in :mod:`uniclr_tf.objectives.whitening` (``whiten`` and ``group_whiten`` are
re-exported here), the generic tensor helpers in :mod:`uniclr_tf.objectives.tensors`.

Two views' embeddings in, a scalar out, on either backend and inside any training step:

Examples:
    >>> import numpy as np
    >>> from uniclr_tf import objectives
    >>> z1, z2 = np.random.default_rng(0).normal(size=(2, 256, 64)).astype("float32")
    >>> loss, terms = objectives.sim_affinity_loss(z1, z2, temperature=0.5, gamma=0.01, return_terms=True)
    >>> sorted(terms)
    ['cross_entropy', 'symmetry']
    >>> w1, w2 = objectives.whiten(z1, z2)  # Cholesky whitening of both views' rows together
    >>> trace = objectives.sim_trace_loss(z1, z2)  # -tr(w1 w2^T) / N
    >>> baseline = objectives.nt_xent_loss(z1, z2, temperature=0.5)  # SimCLR's; every baseline's loss is here
"""

from uniclr_tf.objectives.asymmetric import byol_loss
from uniclr_tf.objectives.asymmetric import negative_cosine_loss
from uniclr_tf.objectives.clustering import dino_loss
from uniclr_tf.objectives.clustering import sinkhorn_knopp
from uniclr_tf.objectives.clustering import swapped_prediction_loss
from uniclr_tf.objectives.clustering import swav_loss
from uniclr_tf.objectives.contrastive import co2_consistency
from uniclr_tf.objectives.contrastive import co2_loss
from uniclr_tf.objectives.contrastive import info_nce_loss
from uniclr_tf.objectives.contrastive import nt_xent_loss
from uniclr_tf.objectives.redundancy import barlow_twins_loss
from uniclr_tf.objectives.redundancy import vicreg_loss
from uniclr_tf.objectives.redundancy import wmse_loss
from uniclr_tf.objectives.redundancy import zca_whitening_matrix
from uniclr_tf.objectives.redundancy import zero_cl_loss
from uniclr_tf.objectives.uniclr import WHITENING_MODES
from uniclr_tf.objectives.uniclr import affinity_matrix
from uniclr_tf.objectives.uniclr import embedding_std
from uniclr_tf.objectives.uniclr import group_whiten
from uniclr_tf.objectives.uniclr import l2_normalize
from uniclr_tf.objectives.uniclr import sim_affinity_loss
from uniclr_tf.objectives.uniclr import sim_trace_loss
from uniclr_tf.objectives.uniclr import sim_whitening_loss
from uniclr_tf.objectives.uniclr import symmetry_loss
from uniclr_tf.objectives.uniclr import whiten

__all__ = [
    "WHITENING_MODES",
    "affinity_matrix",
    "barlow_twins_loss",
    "byol_loss",
    "co2_consistency",
    "co2_loss",
    "dino_loss",
    "embedding_std",
    "group_whiten",
    "info_nce_loss",
    "l2_normalize",
    "negative_cosine_loss",
    "nt_xent_loss",
    "sim_affinity_loss",
    "sim_trace_loss",
    "sim_whitening_loss",
    "sinkhorn_knopp",
    "swapped_prediction_loss",
    "swav_loss",
    "symmetry_loss",
    "vicreg_loss",
    "whiten",
    "wmse_loss",
    "zca_whitening_matrix",
    "zero_cl_loss",
]
