"""``train_step`` for the TensorFlow backend (also under MirroredStrategy / TPUStrategy)."""

import tensorflow as tf


class TensorFlowTrainStep:
    """Mixin: GradientTape step. Expects the host class to define ``compute_objective``,
    ``update_target`` and ``update_metrics``."""

    def train_step(self, data):
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        variables = self.trainable_variables
        with tf.GradientTape() as tape:
            loss, logs = self.compute_objective(data, training=True)
            # Every replica computes the same global loss from gathered embeddings, and Keras sums
            # gradients across replicas: divide once so updates equal one device's.
            scaled = self.optimizer.scale_loss(loss / replicas)
        grads = tape.gradient(scaled, variables)
        self.optimizer.apply(grads, variables)
        self.update_target()
        results = self.update_metrics(logs)
        if getattr(tf.distribute.get_strategy().extended, "_in_multi_worker_mode", lambda: False)():
            # Keras 3 averages a multi-worker step's logs with strategy.reduce(MEAN, v, axis=0), which
            # needs an axis to reduce (keras-team/keras#20585): give each value one; the result is a scalar.
            results = {k: tf.reshape(v, [1]) for k, v in results.items()}
        return results

    def all_gather(self, x):
        """Concatenates ``x`` from all replicas along the batch axis (identity on one replica)."""
        ctx = tf.distribute.get_replica_context()
        if ctx is None or ctx.num_replicas_in_sync == 1:
            return x
        gathered = ctx.all_gather(x, axis=0)
        if x.shape[0] is not None:  # keep the batch size static (XLA/TPU; losses that split the batch)
            gathered = tf.ensure_shape(gathered, [x.shape[0] * ctx.num_replicas_in_sync, *x.shape[1:]])
        return gathered
