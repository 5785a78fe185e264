r"""What an evaluation protocol is: its labelled subset, its name, and where its results go.

``linear_eval`` (linear probe, kNN) and ``finetune`` evaluate a run's encoder under a *protocol*:
a dataset (the pretraining one, or any other spec for transfer) and a fraction of its training
labels. This module holds what they share:

* :func:`label_subset` — the labelled subset of the semi-supervised protocol (below), a pure NumPy
  function of ``(labels, fraction, seed)``; :func:`labelled_subset` applies it to the training
  split of a :class:`uniclr_tf.data.DatasetInfo` and describes it for the results
  (:func:`subset_record`).
* :func:`section_key` — the protocol's name, the key of its section in the results JSON, e.g.
  ``linear[fashion_mnist, labels=100%]``, ``knn[tfds:cifar10, labels=1%, seed=0]``,
  ``finetune[folder:/data/x, labels=10%, seed=3]``; :func:`folder_name` is the same name as a
  file-system-safe folder name.
* :func:`merge_results` — writes one section into a results JSON, keeping the others.

The labelled subset (``--label_fraction=f``, 0 < f ≤ 1)
-------------------------------------------------------
The semi-supervised protocol of SimCLR (Chen et al. 2020, arXiv 2002.05709, §6 / Appendix B.5)
and its successors trains on 1 % or 10 % of the labelled training images, class-balanced. Here,
for the training split as loaded (file order, after ``--max_examples``), for each class ``c``
present, in increasing label order:

1. ``i_c`` = the indices of the class's ``n_c`` examples, in increasing order;
2. ``π_c = numpy.random.default_rng([seed, c]).permutation(n_c)``;
3. keep ``i_c[π_c[:k_c]]`` with ``k_c = max(1, floor(f · n_c + 0.5))`` (``f · n_c`` rounded half
   up, at least one example per class).

The subset is the union over the classes, sorted (file order). It depends only on the labels, ``f``
and ``seed`` (``--seed``, a non-negative integer); each class's draw depends only on its own members
(adding images of one class never changes another class's choice); a larger ``f`` does not
necessarily contain a smaller one's. ``f = 1`` keeps the whole split (nothing is drawn). The results
record ``label_subset``: ``fraction``, ``seed``, ``size`` (of ``of``) and, when ``f < 1``, the
classes and the smallest / largest per-class count, the ``sha256`` of the indices (int64
little-endian bytes) and the first 10 indices, so that two results can be checked to use the same
images.

Only the standard library and NumPy are imported at module level; TensorFlow only when the
training split is streamed (``tfds:``).
"""

import dataclasses
import hashlib
import json
import math
import os
import re
import types

import numpy as np

from uniclr_tf.training import runs

#: The ``--label_fraction`` of the fully supervised protocol (the whole training split).
ALL_LABELS = 1.0
#: How many of the subset's first indices the results record.
RECORDED_INDICES = 10


def check_label_fraction(fraction):
    """``fraction`` as a float in (0, 1]; ``ValueError`` otherwise."""
    value = float(fraction)
    if not 0.0 < value <= 1.0:
        raise ValueError(f"label_fraction must lie in (0, 1]; received {fraction!r}")
    return value


def per_class_count(fraction, n):
    """``k_c = max(1, floor(fraction · n + 0.5))`` examples kept of a class of ``n`` (0 for none)."""
    return max(1, int(math.floor(fraction * n + 0.5))) if n else 0


def label_subset(labels, fraction, seed):
    """The indices of the labelled subset (module docstring): sorted int64 ``[M]``.

    Args:
      labels: int ``[N]`` class labels (>= 0) of the training split, in file order.
      fraction: in (0, 1]; 1 returns ``arange(N)``.
      seed: a non-negative integer.

    Raises:
      ValueError: a fraction outside (0, 1], a negative seed, or a negative (unlabelled) label.
    """
    fraction = check_label_fraction(fraction)
    labels = np.asarray(labels).reshape(-1)
    if int(seed) != seed or seed < 0:
        raise ValueError(f"seed must be a non-negative integer; received {seed!r}")
    if len(labels) and labels.min() < 0:
        raise ValueError(f"the labelled subset needs labels >= 0; found {labels.min()} (-1 means unlabelled)")
    if fraction == ALL_LABELS:
        return np.arange(len(labels), dtype=np.int64)
    chosen = []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        order = np.random.default_rng([int(seed), int(c)]).permutation(len(members))
        chosen.append(members[order[:per_class_count(fraction, len(members))]])
    return np.sort(np.concatenate(chosen)).astype(np.int64) if chosen else np.zeros((0,), np.int64)


def indices_sha256(indices):
    """SHA-256 (hex) of ``indices`` as int64 little-endian bytes."""
    return hashlib.sha256(np.asarray(indices, dtype="<i8").tobytes()).hexdigest()


def subset_record(indices, labels, fraction, seed):
    """What the results say about a drawn labelled subset (``indices`` into the split's ``labels``)."""
    counts = np.bincount(np.asarray(labels)[indices]) if len(indices) else np.zeros((0,), np.int64)
    counts = counts[counts > 0]
    return {"fraction": float(fraction), "seed": int(seed), "size": int(len(indices)), "of": int(len(labels)),
            "classes": int(len(counts)), "min_per_class": int(counts.min()) if len(counts) else 0,
            "max_per_class": int(counts.max()) if len(counts) else 0,
            "rule": "per class c: default_rng([seed, c]).permutation, first max(1, floor(f*n_c + 0.5))",
            "sha256": indices_sha256(indices), "first_indices": [int(i) for i in indices[:RECORDED_INDICES]]}


def split_labels(info, split="train"):
    """The int64 labels of a split of ``info`` in file order (a streamed split is read once)."""
    part = info.split(split)
    if part.in_memory:
        return np.asarray(part.labels, np.int64)
    batches = [np.asarray(y, np.int64) for y in part.dataset.map(lambda image, label: label).batch(8192)
               .as_numpy_iterator()]
    return np.concatenate(batches) if batches else np.zeros((0,), np.int64)


def labelled_subset(info, fraction, seed):
    """``info`` with its training split cut to the labelled subset, and the subset's record.

    In-memory splits are indexed; a streamed split is read once for its labels, then filtered by
    position (its order is fixed: TFDS files are read unshuffled). ``fraction = 1`` returns ``info``
    itself, recorded as ``{"fraction": 1.0, "seed", "size", "of"}`` (nothing drawn, nothing read).

    Raises:
      uniclr_tf.data.DataError: unlabelled training examples, naming the dataset.
    """
    from uniclr_tf.data import DataError, Split

    fraction = check_label_fraction(fraction)
    if fraction == ALL_LABELS:
        return info, {"fraction": fraction, "seed": int(seed), "size": int(info.num_train), "of": int(info.num_train)}
    labels = split_labels(info, "train")
    try:
        indices = label_subset(labels, fraction, seed)
    except ValueError as e:
        raise DataError(f"{info.spec or info.name}: training split: {e}") from None
    record = subset_record(indices, labels, fraction, seed)
    part = info.split("train")
    if part.in_memory:
        images, kept = part.images[indices], part.labels[indices]
        images.setflags(write=False)
        kept.setflags(write=False)
        train = Split(name="train", num_examples=len(indices), images=images, labels=kept)
    else:
        from uniclr_tf.data import tf

        keep = np.zeros(len(labels), bool)
        keep[indices] = True
        mask = tf.constant(keep)
        kept = part.dataset.enumerate().filter(lambda index, pair: tf.gather(mask, index))
        dataset = kept.map(lambda _, example: example)  # decoded (image, label) pairs, the subset's
        from uniclr_tf.data.stream import Stream, dataset_records
        train = Split(name="train", num_examples=len(indices), stream=Stream(dataset_records(dataset, len(indices))))
    splits = types.MappingProxyType({**info.splits, "train": train})
    return dataclasses.replace(info, splits=splits, num_train=len(indices)), record


def _percent(fraction):
    return f"{100 * float(fraction):g}%"


def section_key(kind, dataset, fraction, seed):
    """The protocol's name: ``KIND[DATASET, labels=P%]``, with ``, seed=S`` when ``fraction < 1``
    (the subset depends on the seed). E.g. ``linear[tfds:cifar10, labels=1%, seed=0]``."""
    fraction = check_label_fraction(fraction)
    seed_part = f", seed={int(seed)}" if fraction < ALL_LABELS else ""
    return f"{kind}[{dataset}, labels={_percent(fraction)}{seed_part}]"


def folder_name(dataset, fraction, seed):
    """The protocol (without its kind) as a folder name: ``fashion_mnist_labels=10pct_seed=0``."""
    inner = section_key("x", dataset, fraction, seed)[2:-1].replace("%", "pct")
    return re.sub(r"[^A-Za-z0-9.=-]+", "_", inner).strip("_")


def merge_results(path, key, value, extra=None):
    """Writes ``{key: value}`` (and the top-level entries ``extra``) into the JSON at ``path``,
    keeping its other sections. Written atomically as strict JSON (a non-finite loss becomes
    ``null``); an unreadable previous file is replaced. Returns the whole new content."""
    results = {}
    if os.path.isfile(path):
        try:
            with open(path) as f:
                results = json.load(f)
        except (OSError, ValueError):
            results = {}
        if not isinstance(results, dict):
            results = {}
    results.update(extra or {})
    results[key] = value
    runs.atomic_write_json(path, results)
    return results

