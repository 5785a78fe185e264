"""Evaluation of a pretrained backbone: one home for protocols, run loading, kNN, linear and fine-tuning.

    features.py   extract_features (the one feature extractor: arrays or tf.data batches), knn_eval of a
                  backbone (the training monitor's and the final kNN), raw_pixel_knn, effective_rank
    knn.py        weighted kNN and top-k accuracy (NumPy, or compiled on the device)
    protocols.py  the labelled subset of --label_fraction, its record, the section key, merge_results
    run.py        a run folder as evaluations read it: check_run_dir, load_run, load_run_data
    cli.py        what the evaluation command lines share (common fields with their help, checks, run_main)
    linear.py     linear evaluation (and kNN) of a frozen backbone: ``python -m uniclr_tf.linear_eval``
    finetune.py   fine-tuning with a new linear head: ``python -m uniclr_tf.finetune``

The feature functions are this package's API (``from uniclr_tf.evaluation import knn_eval``).
"""

from uniclr_tf.evaluation.features import (device_features, effective_rank, effective_rank_tensor, extract_features,
                                           features_on_host, knn_eval, raw_pixel_knn)

__all__ = ["device_features", "effective_rank", "effective_rank_tensor", "extract_features", "features_on_host",
           "knn_eval", "raw_pixel_knn"]
