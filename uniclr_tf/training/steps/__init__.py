"""Backend-specific halves of ``UniCLR.train_step``.

Keras 3 calls ``train_step(data)`` on TensorFlow and ``train_step(state, data)`` (pure function of
the variable values) on JAX. The maths lives once, in ``UniCLR.compute_objective`` and
``UniCLR.update_target``; these mixins only differentiate, apply the optimizer, run the EMA update
and update the metric trackers, in the way each backend wants.
"""

import keras


def train_step_mixin():
    """Returns the mixin class for the active Keras backend."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        from uniclr_tf.training.steps.tf_step import TensorFlowTrainStep
        return TensorFlowTrainStep
    if backend == "jax":
        from uniclr_tf.training.steps.jax_step import JaxTrainStep
        return JaxTrainStep
    raise RuntimeError(f"uniclr_tf supports the 'tensorflow' and 'jax' Keras backends; active backend is {backend!r}")
