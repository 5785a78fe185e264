"""Command-line tools around the library (``python -m uniclr_tf.tools.NAME --help``):

* :mod:`.folder_to_tfrecord`: writes an image folder (``folder:`` layout) as TFRecord shards
  and a JSON of its classes and counts, for ``--dataset=tfrecord:...``.
"""
