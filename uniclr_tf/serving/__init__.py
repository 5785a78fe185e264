"""Export and release: a run's encoder as a SavedModel for ``tf.saved_model.load`` and TF Serving
(:mod:`~uniclr_tf.serving.export`, ``python -m uniclr_tf.export``), and a run packed for others
(:mod:`~uniclr_tf.serving.release`, ``python -m uniclr_tf.tools.release``)."""
