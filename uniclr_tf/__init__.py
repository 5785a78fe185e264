"""uniclr-tf: UniCLR (arXiv 2211.14516) self-supervised contrastive learning in Keras 3.

The objectives, layers, models and optimizers are written in ``keras.ops`` and run on the
TensorFlow (default) and JAX backends; only the data, distribution and export modules import
TensorFlow.
"""

__version__ = "0.1.0"
