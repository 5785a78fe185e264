"""The networks: encoders (ResNets, ViTs, Keras Hub backbones), projection and prediction heads, the
normalisation layers, and :class:`~uniclr_tf.nets.model.UniCLR`, the pretraining ``keras.Model``."""
