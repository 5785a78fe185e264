"""Distribution strategies: one device, MirroredStrategy, MultiWorkerMirroredStrategy, TPUStrategy
(TF) or DataParallel (JAX, one or several processes).

``strategy_scope(name, tpu)`` returns a context manager under which the model and optimizer are
built. On the TF backend, ``default``/``mirrored``/``tpu`` are ``tf.distribute`` strategies; on
the JAX backend, ``data_parallel`` (and ``mirrored``, its equivalent) sets
``keras.distribution.DataParallel`` over all local devices. ``keras.distribution.DataParallel`` on
the TF backend silently does nothing (docs/stack.md), so asking for it there is an error.

``--strategy=multi_worker`` is ``tf.distribute.MultiWorkerMirroredStrategy``: one process per
worker, the cluster and this worker's index from ``$TF_CONFIG`` (what SLURM, Kubernetes and
``tf.distribute`` launchers set). Worker 0 (or the ``chief`` task) is the process that writes the run
folder and evaluates. It must be created before any other TensorFlow operation of the process.

On a machine without GPUs, ``$UNICLR_TF_CPU_DEVICES=N`` splits the CPU into N logical devices for
``--strategy=mirrored`` (TF's counterpart of JAX's ``--xla_force_host_platform_device_count``):
how the distributed code paths are tested on a CPU.

``--strategy=tpu`` connects to the TPU (resolver, ``experimental_connect_to_cluster``,
``initialize_tpu_system``) in a worker thread and waits at most ``UNICLR_TPU_TIMEOUT_S`` seconds
(default 60): an unreachable ``--tpu`` (connecting to an address that does not answer blocks with
no message) stops with one ``ValueError`` line naming it instead.
"""

import contextlib
import functools
import math
import os
import threading

import keras

from uniclr_tf.config.errors import UsageError

#: Logical CPU devices for --strategy=mirrored on a machine without GPUs (tests of the distributed paths).
TF_CPU_DEVICES_ENV = "UNICLR_TF_CPU_DEVICES"

#: Seconds to wait for the TPU connection; the environment variable overrides the default.
TPU_TIMEOUT_ENV = "UNICLR_TPU_TIMEOUT_S"
DEFAULT_TPU_TIMEOUT_S = 60.0


def num_replicas(strategy):
    return getattr(strategy, "num_replicas_in_sync", 1) if strategy is not None else 1


def num_data_parallel_devices(strategy):
    """Devices the batch is split over: the tf.distribute strategy's replicas, or on JAX the devices
    of the ``keras.distribution`` mesh (all processes'), 1 without either."""
    if strategy is not None:
        return num_replicas(strategy)
    distribution = keras.distribution.distribution() if keras.backend.backend() == "jax" else None
    if distribution is None:
        return 1
    return int(math.prod(distribution.device_mesh.shape))


ENV_ADDRESSES = "KERAS_DISTRIBUTION_JOB_ADDRESSES"
ENV_NUM_PROCESSES = "KERAS_DISTRIBUTION_NUM_PROCESSES"
ENV_PROCESS_ID = "KERAS_DISTRIBUTION_PROCESS_ID"


def initialize_processes(coordinator_address="", num_processes=0, process_id=-1):
    """Joins a JAX multi-controller job (several processes, one per host or per GPU), before any JAX
    computation; returns ``(process_id, num_processes)``, ``(0, 1)`` for a single process.

    Each argument falls back to Keras's environment variables (``KERAS_DISTRIBUTION_JOB_ADDRESSES``,
    ``..._NUM_PROCESSES``, ``..._PROCESS_ID``), which launchers such as SLURM scripts or Kubernetes
    manifests set per process. Goes through ``keras.distribution.initialize`` (``jax.distributed``);
    on CPU devices, collectives across processes use gloo.
    """
    num = int(num_processes or os.environ.get(ENV_NUM_PROCESSES) or 1)
    if num <= 1:
        return 0, 1
    if keras.backend.backend() != "jax":
        raise UsageError(f"--num_processes={num}: several processes are the JAX backend's multi-controller "
                         "mode (KERAS_BACKEND=jax, --strategy=data_parallel); on TensorFlow use tf.distribute")
    address = coordinator_address or os.environ.get(ENV_ADDRESSES, "")
    pid = int(process_id) if process_id is not None and int(process_id) >= 0 else int(os.environ.get(ENV_PROCESS_ID, -1))
    if not address or not 0 <= pid < num:
        raise UsageError(f"--num_processes={num} needs --coordinator_address=HOST:PORT (process 0's) and "
                         f"--process_id in [0, {num}) (or ${ENV_ADDRESSES} and ${ENV_PROCESS_ID}); "
                         f"received {address!r} and {pid}")
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU devices only; GPUs use NCCL
    keras.distribution.initialize(job_addresses=address, num_processes=num, process_id=pid)
    return jax.process_index(), jax.process_count()


def barrier(name, num_processes, strategy=None):
    """Waits until every process of a multi-process job gets here (no-op for one process): JAX's
    multi-controller sync, or for ``--strategy=multi_worker`` a one-number all-reduce."""
    if num_processes <= 1:
        return
    if keras.backend.backend() == "jax":
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(name)
        return
    import tensorflow as tf

    total = int(replica_sum(strategy)(tf.ones(())))
    if total != strategy.num_replicas_in_sync:
        raise RuntimeError(f"barrier {name!r}: {total} replicas answered, expected {strategy.num_replicas_in_sync}")


@functools.lru_cache(maxsize=4)
def replica_sum(strategy):
    """A compiled function of ``strategy`` (TF): ``f(x)`` is the sum of ``x`` over every replica of the
    job, each worker giving its own host value ``x`` (a collective: every worker must call it, in the
    same order). One per strategy, so repeated calls do not trace again."""
    import tensorflow as tf

    @tf.function
    def total(x):
        per_replica = strategy.run(lambda: tf.identity(x))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    return total


def worker_info(strategy):
    """``(process index, process count)`` of a ``--strategy=multi_worker`` job, the chief first:
    ``(0, 1)`` for any other strategy."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not getattr(strategy.extended, "_in_multi_worker_mode", lambda: False)():
        return 0, 1
    spec = resolver.cluster_spec().as_dict()
    chiefs, workers = len(spec.get("chief", [])), len(spec.get("worker", []))
    index = int(resolver.task_id) + (chiefs if resolver.task_type == "worker" else 0)
    return index, chiefs + workers


@contextlib.contextmanager
def local_only():
    """Runs Keras computations on this process's default device, outside the job's distribution."""
    distribution = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    try:
        yield
    finally:
        keras.distribution.set_distribution(distribution)


def local_copy(model):
    """A copy of ``model`` whose variables live on this process's default device only (outside the
    job's distribution or tf.distribute strategy), for work one process does alone (the kNN monitor).
    Refresh its weights with ``copy.set_weights(model.get_weights())``; the job's replicated weights
    read on any process."""
    if keras.backend.backend() != "jax":  # called outside the strategy's scope: plain variables
        copy = keras.models.clone_model(model)
        copy.set_weights(model.get_weights())
        return copy
    with local_only():
        copy = keras.models.clone_model(model)
        copy.set_weights(model.get_weights())
    return copy


def make_strategy(name="default", tpu=""):
    """Returns a tf.distribute strategy (TF backend) or None (JAX; the distribution is global)."""
    backend = keras.backend.backend()
    if backend == "jax":
        if name == "tpu":
            raise UsageError("--strategy=tpu needs the TensorFlow backend; on JAX use --strategy=data_parallel "
                             "(Keras-on-TPU with JAX sees the TPU cores as local devices)")
        if name in ("data_parallel", "mirrored"):
            import jax
            keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax.devices()))
        if name == "multi_worker":
            raise UsageError("--strategy=multi_worker is tf.distribute's (KERAS_BACKEND=tensorflow); on JAX run "
                             "one process per host or GPU with --strategy=data_parallel --num_processes=N")
        return None
    import tensorflow as tf
    if name == "data_parallel":
        raise UsageError("--strategy=data_parallel is the JAX backend's strategy (Keras's DataParallel does "
                         "nothing on TensorFlow); use --strategy=mirrored with KERAS_BACKEND=tensorflow")
    if name == "multi_worker":
        if not os.environ.get("TF_CONFIG"):
            raise UsageError("--strategy=multi_worker reads the cluster from $TF_CONFIG, which is not set: e.g. "
                             '{"cluster": {"worker": ["host1:12345", "host2:12345"]}, "task": {"type": "worker", '
                             '"index": 0}} on the first host (index 1 on the second)')
        return tf.distribute.MultiWorkerMirroredStrategy()
    if name == "mirrored":
        return tf.distribute.MirroredStrategy(devices=_mirrored_devices(tf))
    if name == "tpu":
        return tf.distribute.TPUStrategy(connect_tpu(tpu))
    return tf.distribute.get_strategy()


def _mirrored_devices(tf):
    """None (all GPUs, as MirroredStrategy chooses), or on a machine without GPUs the
    ``$UNICLR_TF_CPU_DEVICES`` logical CPU devices (one when unset)."""
    value = os.environ.get(TF_CPU_DEVICES_ENV, "").strip()
    if not value or tf.config.list_physical_devices("GPU"):
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"${TF_CPU_DEVICES_ENV}={value!r} must be a positive number of logical CPU devices")
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * int(value))
    return [d.name for d in tf.config.list_logical_devices("CPU")]


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
        raise UsageError(f"--tpu={tpu}: could not connect to the TPU within {timeout_s:g} s; {hint}; "
                         f"set {TPU_TIMEOUT_ENV}=SECONDS to wait longer")
    if "error" in outcome:
        error = outcome["error"]
        detail = (str(error).strip().splitlines() or [""])[0][:300]
        raise UsageError(f"--tpu={tpu}: could not connect to the TPU ({type(error).__name__}: {detail}); "
                         f"{hint}") from error
    return outcome["resolver"]


def scope(strategy):
    return strategy.scope() if strategy is not None else contextlib.nullcontext()
