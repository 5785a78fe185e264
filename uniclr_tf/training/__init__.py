"""Pretraining: the train CLI and everything a run needs around the model.

* :mod:`~uniclr_tf.training.cli`: ``python -m uniclr_tf.train``, a run in named phases.
* :mod:`~uniclr_tf.training.callbacks`: kNN monitor, history, collapse detector, EMA target.
* :mod:`~uniclr_tf.training.backup`, :mod:`~uniclr_tf.training.runs`,
  :mod:`~uniclr_tf.training.stop_signals`: backups and resume, run folders and their lock, signals.
* :mod:`~uniclr_tf.training.schedules`, :mod:`~uniclr_tf.training.optimizers`: warm-up + cosine, LARS,
  PyTorch-style SGD.
* :mod:`~uniclr_tf.training.steps`: the compiled train steps (TensorFlow, JAX);
  :mod:`~uniclr_tf.training.whole_batches`: in-memory arrays as whole, reshuffled batches for ``fit``.
* :mod:`~uniclr_tf.training.launch`, :mod:`~uniclr_tf.training.distribute`,
  :mod:`~uniclr_tf.training.autotune`: one process per GPU, strategies and meshes, XLA autotuning.
"""
