"""Command-line tools around the library (``python -m uniclr_tf.tools.NAME --help``):

* :mod:`.folder_to_tfrecord`: writes an image folder (``folder:`` layout) as TFRecord shards
  and a JSON of its classes and counts, for ``--dataset=tfrecord:...``.
* :mod:`.release`: turns a finished run folder into a self-contained release folder
  (``backbone.keras``, ``saved_model/``, the run's metrics and flags, ``MODEL_CARD.md``, ``SHA256SUMS``).
"""
