"""Distribution strategies: one device, MirroredStrategy, TPUStrategy (TF) or DataParallel (JAX).

``strategy_scope(name, tpu)`` returns a context manager under which the model and optimizer are
built. On the TF backend, ``default``/``mirrored``/``tpu`` are ``tf.distribute`` strategies; on
the JAX backend, ``data_parallel`` (and ``mirrored``, its equivalent) sets
``keras.distribution.DataParallel`` over all local devices. ``keras.distribution.DataParallel`` on
the TF backend silently does nothing (STACK.md), so asking for it there is an error.
"""

import contextlib

import keras


def num_replicas(strategy):
    return getattr(strategy, "num_replicas_in_sync", 1) if strategy is not None else 1


def make_strategy(name="default", tpu=""):
    """Returns a tf.distribute strategy (TF backend) or None (JAX; the distribution is global)."""
    backend = keras.backend.backend()
    if backend == "jax":
        if name == "tpu":
            raise ValueError("--strategy=tpu needs the TensorFlow backend; on JAX use --strategy=data_parallel "
                             "(Keras-on-TPU with JAX sees the TPU cores as local devices)")
        if name in ("data_parallel", "mirrored"):
            import jax
            keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax.devices()))
        return None
    import tensorflow as tf
    if name == "data_parallel":
        raise ValueError("--strategy=data_parallel is the JAX backend's strategy (Keras's DataParallel does "
                         "nothing on TensorFlow); use --strategy=mirrored with KERAS_BACKEND=tensorflow")
    if name == "mirrored":
        return tf.distribute.MirroredStrategy()
    if name == "tpu":
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    return tf.distribute.get_strategy()


def scope(strategy):
    return strategy.scope() if strategy is not None else contextlib.nullcontext()
