"""Distribution strategies: one device, MirroredStrategy, TPUStrategy (TF) or DataParallel (JAX).

``strategy_scope(name, tpu)`` returns a context manager under which the model and optimizer are
built. On the TF backend, ``default``/``mirrored``/``tpu`` are ``tf.distribute`` strategies; on
the JAX backend, ``data_parallel`` (and ``mirrored``, its equivalent) sets
``keras.distribution.DataParallel`` over all local devices. ``keras.distribution.DataParallel`` on
the TF backend silently does nothing (STACK.md), so asking for it there is an error.

``--strategy=tpu`` connects to the TPU (resolver, ``experimental_connect_to_cluster``,
``initialize_tpu_system``) in a worker thread and waits at most ``UNICLR_TPU_TIMEOUT_S`` seconds
(default 60): an unreachable ``--tpu`` (connecting to an address that does not answer blocks with
no message) stops with one ``ValueError`` line naming it instead.
"""

import contextlib
import os
import threading

import keras

#: Seconds to wait for the TPU connection; the environment variable overrides the default.
TPU_TIMEOUT_ENV = "UNICLR_TPU_TIMEOUT_S"
DEFAULT_TPU_TIMEOUT_S = 60.0


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
        return tf.distribute.TPUStrategy(connect_tpu(tpu))
    return tf.distribute.get_strategy()


def tpu_timeout_s(timeout_s=None):
    """``timeout_s``, else ``$UNICLR_TPU_TIMEOUT_S``, else 60; a positive number of seconds."""
    if timeout_s is None:
        value = os.environ.get(TPU_TIMEOUT_ENV, "").strip()
        try:
            timeout_s = float(value) if value else DEFAULT_TPU_TIMEOUT_S
        except ValueError:
            raise ValueError(f"{TPU_TIMEOUT_ENV}={value!r} must be a number of seconds") from None
    if not timeout_s > 0:
        raise ValueError(f"the TPU connection timeout must be > 0 seconds; received {timeout_s!r} "
                         f"(from {TPU_TIMEOUT_ENV} or timeout_s)")
    return float(timeout_s)


def connect_tpu(tpu, timeout_s=None):
    """Resolves, connects to and initialises the TPU ``tpu``; returns its ``TPUClusterResolver``.

    Runs in a daemon thread and waits at most ``timeout_s`` (:func:`tpu_timeout_s`). On timeout or
    failure raises ``ValueError("--tpu=ADDRESS: could not connect ...")``: one line naming the
    address and what to check. A timed-out attempt is abandoned (its thread does not keep the
    process alive).
    """
    import tensorflow as tf

    timeout_s = tpu_timeout_s(timeout_s)
    outcome = {}

    def connect():
        try:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
            tf.config.experimental_connect_to_cluster(resolver)
            tf.tpu.experimental.initialize_tpu_system(resolver)
            outcome["resolver"] = resolver
        except BaseException as e:  # noqa: B036 -- reported by the caller
            outcome["error"] = e

    thread = threading.Thread(target=connect, name="uniclr-tpu-connect", daemon=True)
    thread.start()
    thread.join(timeout_s)
    hint = (f"check the TPU name or grpc:// address and its zone/project (`gcloud compute tpus list "
            f"--zone=ZONE`; `gcloud config set compute/zone ZONE`), that this VM may reach it, "
            f"and that the TPU is READY")
    if thread.is_alive():
        raise ValueError(f"--tpu={tpu}: could not connect to the TPU within {timeout_s:g} s; {hint}; "
                         f"set {TPU_TIMEOUT_ENV}=SECONDS to wait longer")
    if "error" in outcome:
        error = outcome["error"]
        detail = (str(error).strip().splitlines() or [""])[0][:300]
        raise ValueError(f"--tpu={tpu}: could not connect to the TPU ({type(error).__name__}: {detail}); "
                         f"{hint}") from error
    return outcome["resolver"]


def scope(strategy):
    return strategy.scope() if strategy is not None else contextlib.nullcontext()
