r"""Throughput benchmark of UniCLR pre-training.

    python -m benchmarks.bench [--quick] [--image_shape=32,32,3] [--out=benchmarks/x.json]
    KERAS_BACKEND=jax python -m benchmarks.bench ...          # the GPU path

Sections (each: warm-up, then the median of ``--reps`` timed repetitions of ``--steps`` steps;
every repetition ends by waiting for the device, so asynchronous dispatch is counted):

* (a) ``a_model_only``: the compiled train step alone, on device-resident, already augmented views
  (a few batches rotated, so no input cost at all). The model is ``train.build_model`` +
  ``train.build_optimizer`` (``--optimizer``, LARS by default) under the ``--precision`` policy, the real training model.
  Also ``flops_per_image`` (the model's FLOPs a training step, counted from its convolutions and dense
  layers; XLA's own count, ``xla_flops_per_image``, leaves out on GPUs the convolutions handed to cuDNN,
  ~95 % of a ResNet-50's) and ``mfu`` against ``--peak_tflops`` per device (default: an H100 / H200's
  dense bf16 peak);
  ``benchmarks/torch_r50_peer.py`` is its PyTorch peer at 224 px. ``--devices=N``: the step data-parallel
  over N devices (keras.distribution.DataParallel), ``--batch_size`` the global batch; with
  ``--num_processes=N --process_id=i --coordinator_address=HOST:PORT`` the same step as a JAX job of N
  processes (one GPU each: ``PROCS=N bash benchmarks/speed.sh r50`` starts them), process 0 writing.
* (b) ``b_host_aug``: end to end with the views made on the host. TensorFlow backend:
  ``data.pretrain_dataset`` with the ``ViewAugmenter`` mapped in tf.data (exactly what
  ``train --augment_on=host`` runs). JAX backend (no TensorFlow needed): the same
  ``ViewAugmenter``, jitted on JAX's CPU device, run by ``--host_workers`` threads (each with its
  own random stream) that gather shuffled uint8 batches, augment them on the CPU and copy the views
  to the accelerator through a bounded queue. The pipeline alone is also timed.
* (c) ``c_device_aug``: end to end with the raw uint8 batch sent to the device and augmented
  inside the compiled step (``train --augment_on=device``). TF: ``data.pretrain_dataset`` without
  augmenter; JAX: shuffled uint8 batches gathered on the host and copied per step. JAX also times
  ``c_device_aug_resident``: the uint8 dataset held on the device, batches gathered there.
* (d) ``d_objective``: forward + backward of the objective alone on random ``[N, D]`` embeddings in
  the compute dtype: SimAffinity vs N and D; SimTrace (Cholesky whitening) at each D, plain,
  ``stop_gradient_cov`` and feature-group whitening (``groups``), in ms per call.
* ``memory``: peak device memory (JAX ``memory_stats``), the compiled step's buffers (XLA memory
  analysis, JAX) and the process's peak RSS.

For end-to-end sections ``input_wait_frac`` is the share of wall time the training loop spent
obtaining its next batch (tf.data / the host workers / the host gather and copy). On TensorFlow
the step is synchronous, so that time is lost; under JAX dispatch is asynchronous and it overlaps
with the device's previous step: the real input cost there is ``1 − ratio`` to section (a).

Data: ``fashion_mnist`` (28×28×1, real); for a 3-channel shape the images are zero-padded to the
size and the grey channel is repeated (CIFAR-10 needs a download); ``synthetic``: uniform random
uint8. The bench imports TensorFlow itself only on the TensorFlow backend (tf.data), so it runs
where TensorFlow is absent (a GPU machine with JAX only); where it is installed, ``keras.utils.set_random_seed``
imports it to seed it, whatever the backend.

Results of the GPU and CPU runs: ``docs/results/speed.md``.
"""

import datetime
import json
import os
import platform
import queue
import resource
import statistics
import sys
import threading
import time

import numpy as np
from absl import app, flags

SECTIONS = ("a", "b", "c", "d")
QUICK = dict(encoder="tiny", encoder_width=8, projector_dims=("64", "64", "32"), batch_size=32,
             image_shape=("16", "16", "3"), data="synthetic", steps=3, reps=3, warmup_steps=1,
             objective_n=("32", "64"), objective_d=("32", "64"), whitening_group_dims=("16",),
             whitening_n=64, objective_iters=3, host_workers=2, num_images=256)

FLAGS = flags.FLAGS


def define_flags():
    flags.DEFINE_bool("quick", False, "Tiny sizes for a smoke run on the CPU (about 30 s): "
                      + ", ".join(f"{k}={','.join(v) if isinstance(v, tuple) else v}" for k, v in QUICK.items())
                      + "; flags given explicitly win.")
    flags.DEFINE_enum("data", "fashion_mnist", ["fashion_mnist", "synthetic"],
                      "Images: Fashion-MNIST (padded / channel-repeated to --image_shape) or random uint8.")
    flags.DEFINE_list("image_shape", ["32", "32", "3"], "H,W,C of the images (C 1 or 3).")
    flags.DEFINE_integer("num_images", 0, "Use the first N images (0: all 60000 of Fashion-MNIST; 10000 synthetic).")
    flags.DEFINE_enum("encoder", "resnet18", ["resnet18", "resnet50", "tiny"], "Backbone.")
    flags.DEFINE_integer("encoder_width", 0, "Base width (0: the architecture's default).")
    flags.DEFINE_list("projector_dims", ["2048", "2048", "256"], "Projector layer sizes.")
    from uniclr_tf import methods
    flags.DEFINE_enum("objective", "simtrace", list(methods.names()), "Method of the step (uniclr_tf.methods).")
    flags.DEFINE_integer("whitening_groups", 1, "Feature groups of the step's whitening (1: the paper's full whitening).")
    flags.DEFINE_bool("stop_gradient_cov", False, "Stop the gradient through the step's whitening statistics.")
    flags.DEFINE_integer("batch_size", 512, "Images per step (each gives two views).")
    flags.DEFINE_enum("optimizer", "lars", ["lars", "sgd", "adamw"], "Optimizer of the step (train's --optimizer).")
    flags.DEFINE_enum("precision", "bfloat16", ["float32", "bfloat16", "float16"], "Mixed-precision policy.")
    flags.DEFINE_list("sections", list(SECTIONS), "Sections to run: a (model only), b (host aug), c (device aug), d (objective).")
    flags.DEFINE_integer("warmup_steps", 3, "Untimed steps after compilation.")
    flags.DEFINE_integer("steps", 20, "Steps per timed repetition.")
    flags.DEFINE_integer("reps", 5, "Timed repetitions (the median is reported).")
    flags.DEFINE_integer("host_steps", 0, "Steps per repetition of section b (0: --steps).")
    flags.DEFINE_integer("host_workers", 0, "JAX host augmentation threads (0: half the CPU cores, at least 1).")
    flags.DEFINE_list("objective_n", ["256", "512", "1024", "2048"], "Section d: samples per view N.")
    flags.DEFINE_list("objective_d", ["256", "2048"], "Section d: embedding sizes D.")
    flags.DEFINE_list("whitening_group_dims", ["256", "64"], "Section d: feature-group sizes of group whitening (groups = D / size).")
    flags.DEFINE_integer("whitening_n", 512, "Section d: N of the whitening measurements (0: every --objective_n).")
    flags.DEFINE_integer("objective_iters", 20, "Section d: calls per timed repetition.")
    flags.DEFINE_bool("jit_compile", False, "TensorFlow backend: compile the step with XLA.")
    flags.DEFINE_integer("seed", 0, "Random seed.")
    flags.DEFINE_integer("devices", 1, "JAX, section a: data-parallel over this many local devices (keras.distribution."
                         "DataParallel, as train's --strategy=data_parallel); --batch_size is the global batch.")
    flags.DEFINE_integer("num_processes", 1, "JAX, section a: this process is one of N of a multi-controller job "
                         "(one per GPU, as train's --num_processes); --devices counts every process's devices.")
    flags.DEFINE_integer("process_id", 0, "With --num_processes > 1: this process's index in [0, N).")
    flags.DEFINE_string("profile_dir", "", "After section a's timed steps, trace --profile_steps more steps with "
                        "the backend's profiler into this folder (process i of a job: its process-i subfolder), "
                        "as the train CLI's --profile_steps does: python -m benchmarks.report trace FOLDER summarises it.")
    flags.DEFINE_integer("profile_steps", 5, "Steps traced with --profile_dir.")
    flags.DEFINE_string("hlo_out", "", "JAX: write section a's compiled step as XLA's optimised HLO text to this file "
                        "(its fusions' operand and result shapes: `python -m benchmarks.report roofline TRACE HLO`).")
    flags.DEFINE_string("coordinator_address", "", "With --num_processes > 1: process 0's HOST:PORT.")
    from uniclr_tf.config.train_config import STATE_LAYOUTS
    flags.DEFINE_enum("state_layout", "auto", list(STATE_LAYOUTS),
                      "JAX: the state's layouts between steps, as train's --state_layout (its default too).")
    flags.DEFINE_enum("batch_norm", "global_one_pass", ["global", "global_one_pass", "per_device"],
                      "The model's batch norm, as train's --batch_norm (its default too): the global batch's "
                      "statistics from one pass or two, or per device with --devices > 1.")
    flags.DEFINE_float("peak_tflops", 0.0, "Section a's MFU: the device's peak TFLOP/s (0: the dense bf16 peak of "
                       "an H100 / H200 when the device is one; else no MFU).")
    flags.DEFINE_string("label", "", "Free-form label stored in the JSON.")
    flags.DEFINE_string("out", "", "Write the JSON here (default: benchmarks/bench-<backend>-<HxWxC>.json).")


def _resolve_quick(argv_flags):
    """--quick changes the defaults of the flags not given on the command line."""
    if not FLAGS.quick:
        return
    for name, value in QUICK.items():
        if name not in argv_flags:
            FLAGS[name].value = list(value) if isinstance(value, tuple) else value


# ------------------------------------------------------------------------------------------------
# Small utilities


def _ints(values):
    return [int(v) for v in values]


def _median(values):
    return float(statistics.median(values)) if values else float("nan")


def _rss_peak_bytes():
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB


def _now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Timer:
    """Accumulates wall time and host CPU time of timed repetitions."""

    def __init__(self):
        self.wall, self.cpu, self.wait = [], [], []

    def summary(self, steps, batch):
        per_rep = [steps * batch / t for t in self.wall]
        out = {"images_per_s": _median(per_rep),
               "images_per_s_min": min(per_rep), "images_per_s_max": max(per_rep),
               "ms_per_step": 1e3 * _median(self.wall) / steps,
               "host_cpu_ms_per_step": 1e3 * _median(self.cpu) / steps,
               "reps": len(self.wall), "steps_per_rep": steps, "batch_size": batch}
        if self.wait:
            out["input_wait_frac"] = _median([w / t for w, t in zip(self.wait, self.wall)])
            out["input_wait_ms_per_step"] = 1e3 * _median(self.wait) / steps
        return out


# ------------------------------------------------------------------------------------------------
# Data


def load_images(name, shape, num_images, seed=0):
    """uint8 ``[N, H, W, C]`` images; Fashion-MNIST is zero-padded / channel-repeated to ``shape``."""
    h, w, c = shape
    if name == "synthetic":
        n = num_images or 10_000
        return np.random.default_rng(seed).integers(0, 256, (n, h, w, c), dtype=np.uint8)
    import keras  # keras' offline loader (no TensorFlow needed)

    (x, _), _ = keras.datasets.fashion_mnist.load_data()
    if num_images:
        x = x[:num_images]
    if h < 28 or w < 28:
        raise ValueError(f"fashion_mnist is 28x28; --image_shape must be at least that; received {shape}")
    top, left = (h - 28) // 2, (w - 28) // 2
    x = np.pad(x, ((0, 0), (top, h - 28 - top), (left, w - 28 - left)))[..., None]
    return np.ascontiguousarray(np.repeat(x, c, axis=-1)).astype(np.uint8)


class EpochSampler:
    """Shuffled batches of indices, a new permutation every epoch (what a data loader does)."""

    def __init__(self, n, batch, seed):
        self.n, self.batch = n, batch
        self.rng = np.random.default_rng(seed)
        self.perm, self.pos = self.rng.permutation(n), 0

    def __call__(self):
        if self.pos + self.batch > self.n:
            self.perm, self.pos = self.rng.permutation(self.n), 0
        idx = self.perm[self.pos:self.pos + self.batch]
        self.pos += self.batch
        return np.sort(idx)


def channel_stats(images, max_pixels=2 ** 24):
    """Per-channel mean and std (floored at 1/255) of the first images, at most 10,000 of them and
    ``max_pixels`` pixels: at 224 px a float64 copy of 10,000 images would take 12 GB a process."""
    n = max(1, min(10_000, max_pixels // int(np.prod(images.shape[1:-1]))))
    x = images[:n].reshape(-1, images.shape[-1]).astype(np.float64) / 255.0
    return tuple(float(v) for v in x.mean(0)), tuple(float(max(v, 1 / 255)) for v in x.std(0))


# ------------------------------------------------------------------------------------------------
# The model and its compiled step (one stepper per backend)


def build_training_model(shape, mean, std):
    """The training model exactly as ``train.run`` builds it, from a ``TrainConfig``."""
    import types

    import keras

    from uniclr_tf.config.train_config import TrainConfig
    from uniclr_tf.training.cli import build_augmenter, build_model, build_optimizer

    from uniclr_tf import methods
    takes = methods.get(FLAGS.objective).defaults
    options = {k: v for k, v in (("stop_gradient_cov", FLAGS.stop_gradient_cov),
                                 ("whitening_groups", FLAGS.whitening_groups)) if k in takes}
    cfg = TrainConfig.make(encoder=FLAGS.encoder, encoder_width=FLAGS.encoder_width,
                      projector_dims=tuple(_ints(FLAGS.projector_dims)), method=FLAGS.objective, **options,
                      batch_size=FLAGS.batch_size, optimizer=FLAGS.optimizer,
                      precision=FLAGS.precision, seed=FLAGS.seed, online_probe=False,
                      augment_on="device", epochs=100, warmup_epochs=10, batch_norm=FLAGS.batch_norm)
    keras.utils.set_random_seed(cfg.system.seed)
    if cfg.system.precision != "float32":
        keras.mixed_precision.set_global_policy(f"mixed_{cfg.system.precision}")
    info = types.SimpleNamespace(image_shape=tuple(shape), num_classes=None, mean=mean, std=std)
    device_aug = build_augmenter(cfg, info)
    model = build_model(cfg, info, augmenter=device_aug, devices=max(FLAGS.devices, 1))
    model.compile(optimizer=build_optimizer(cfg, steps_per_epoch=100), jit_compile=FLAGS.jit_compile)
    model.optimizer.build(model.trainable_variables)
    host_aug = build_augmenter(cfg, info)  # a separate instance (own random streams) for the host
    return cfg, model, host_aug


# Dense bf16 peak of the cards the GPU runs use (NVIDIA's data sheets, without sparsity), TFLOP/s.
PEAK_BF16_TFLOPS = {"H100": 989.4, "H200": 989.4}


def training_model_flops(model, image_shape, views=2):
    """A training step's model FLOPs per image: ``views`` forwards through the encoder, projector and
    predictor, times 3 (the backward pass computes two products per forward one). A forward counts
    the convolutions and dense layers (2 FLOPs a multiply-add), with the output shapes of one real
    forward of an ``image_shape`` image (encoders take any image size, so their layers' symbolic shapes
    are unknown): what the MFU convention counts (the model's FLOPs, not the kernels'); normalisation,
    activations and attention's own products are left out (under 1 % of a ResNet's count)."""
    import numpy as np
    heads = [m for m in (model.encoder, model.projector, getattr(model, "predictor", None)) if m is not None]
    kinds = ("Conv2D", "Dense", "DepthwiseConv2D", "EinsumDense")
    layers = [l for m in heads for l in m._flatten_layers(include_self=False) if type(l).__name__ in kinds]
    shapes = {}

    def recording(layer, call):
        def record(*args, **kwargs):
            out = call(*args, **kwargs)
            shapes[id(layer)] = tuple(out.shape[1:])
            return out
        return record

    for layer in layers:
        layer.call = recording(layer, layer.call)
    try:
        x = np.zeros((1, *image_shape), "float32")
        for m in heads:
            x = m(x, training=False)
    finally:
        for layer in layers:
            del layer.call  # the class's own again
    forward = 0
    for layer in layers:
        out, kernel = shapes.get(id(layer), ()), tuple(layer.kernel.shape)
        if type(layer).__name__ == "DepthwiseConv2D":
            per_output = int(np.prod(kernel[:2]))
        elif type(layer).__name__ == "EinsumDense":
            per_output = int(np.prod(kernel)) // max(int(out[-1]), 1) if out else 0
        else:
            per_output = int(np.prod(kernel[:-1])) // max(getattr(layer, "groups", 1), 1)
        forward += 2 * per_output * int(np.prod(out)) if out else 0
    return 3 * views * forward


def model_flops_utilisation(step_flops, batch, images_per_s, device, model_flops=0):
    """``flops_per_image``: the model's FLOPs a training step per image (:func:`training_model_flops`)
    when given, else XLA's count of the step / the global batch; ``xla_flops_per_image`` the latter
    (on GPUs it leaves out the convolutions XLA hands to cuDNN: ResNet-50 at 224 px, 0.9 of ~49 GFLOP);
    and, on a card of ``PEAK_BF16_TFLOPS`` or with ``--peak_tflops``, ``mfu``: achieved FLOP/s over the
    peak of the ``--devices`` devices."""
    if not step_flops and not model_flops:
        return {}
    out = {"flops_per_image": model_flops or step_flops / batch}
    if step_flops:
        out["xla_flops_per_image"] = step_flops / batch
    peak = FLAGS.peak_tflops or next((v for k, v in PEAK_BF16_TFLOPS.items() if k in str(device)), 0.0)
    if peak:
        devices = max(FLAGS.devices, 1)
        out.update(peak_tflops=peak, mfu=images_per_s * out["flops_per_image"] / (devices * peak * 1e12))
    return out


class JaxStepper:
    """The model's JAX ``train_step``, jitted (ahead of time, per input structure), state threaded."""

    def __init__(self, model):
        import jax

        self.jax = jax
        self.model = model
        self.state = (
            [v.value for v in model.trainable_variables],
            [v.value for v in model.non_trainable_variables],
            [v.value for v in model.optimizer.variables],
            [v.value for v in model.metrics_variables],
        )
        self.jitted = jax.jit(model.train_step, donate_argnums=0)
        from uniclr_tf.training.steps.jax_step import LaidOutStep, lays_out_state
        # As Keras' fit with train's --state_layout (training.steps.jax_step): the state in XLA's layouts
        self.laid_out = LaidOutStep(model.train_step) if lays_out_state(FLAGS.state_layout) else None
        self.compiled = {}
        self.memory = {}
        self.flops = {}

    def _key(self, data):
        leaves = self.jax.tree_util.tree_leaves(data)
        return tuple((tuple(x.shape), str(x.dtype)) for x in leaves)

    def compile(self, name, data):
        t = time.perf_counter()
        if self.laid_out is not None:
            lowered, (compiled, _) = None, self.laid_out.compiled(self.state, data)[1]
            print(f"the state in XLA's layouts (XLA compiles of the step so far: {self.laid_out.compiles})", flush=True)
        else:
            lowered = self.jitted.lower(self.state, data)
            compiled = lowered.compile()
        seconds = time.perf_counter() - t
        self.compiled[self._key(data)] = compiled
        if FLAGS.hlo_out and name == "views" and (FLAGS.num_processes == 1 or FLAGS.process_id == 0):
            with open(FLAGS.hlo_out, "w") as f:
                f.write(compiled.as_text())
        try:
            m = compiled.memory_analysis()
            self.memory[name] = {k: int(getattr(m, k)) for k in (
                "argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes",
                "generated_code_size_in_bytes") if hasattr(m, k)}
        except Exception as e:  # not every platform reports it
            self.memory[name] = {"error": f"{type(e).__name__}: {e}"}
        # XLA's count of the step's floating-point operations (``xla_flops_per_image``), of the lowered
        # step when it has one: the whole (unpartitioned) computation, where the compiled step's count is
        # per device. On GPUs both leave out the convolutions handed to cuDNN (ResNet-50 at 224 px: 0.9 of
        # 46.4 GFLOP an image), hence the model's own count (training_model_flops) for the MFU.
        for source in filter(None, (lowered, compiled)):
            try:
                cost = source.cost_analysis()
                cost = cost[0] if isinstance(cost, (list, tuple)) else cost
                self.flops[name] = float(cost["flops"])
                break
            except Exception:  # noqa: BLE001 - not every platform or version reports it
                continue
        return seconds

    def __call__(self, data):
        if self.laid_out is not None:
            logs, self.state = self.laid_out(self.state, data)
        else:
            fn = self.compiled.get(self._key(data), self.jitted)
            logs, self.state = fn(self.state, data)
        self.logs = logs

    def sync(self):
        self.jax.block_until_ready(self.state)
        loss = self.logs["loss"]  # replicated; in a multi-process job only this process's copies are readable
        return float(np.asarray(loss.addressable_data(0)) if hasattr(loss, "addressable_data") else loss)


class TfStepper:
    """The model's TensorFlow ``train_step`` in a ``tf.function`` (XLA with --jit_compile)."""

    def __init__(self, model):
        import tensorflow as tf

        self.fn = tf.function(model.train_step, jit_compile=FLAGS.jit_compile, reduce_retracing=True)
        self.memory = {}
        self.flops = {}

    def compile(self, name, data):
        t = time.perf_counter()
        self(data)
        self.sync()
        return time.perf_counter() - t

    def __call__(self, data):
        self.logs = self.fn(data)

    def sync(self):
        return float(self.logs["loss"])


def timed(stepper, next_batch, steps, reps, warmup, batch):
    """Warm-up, then ``reps`` repetitions of ``steps`` steps; ``next_batch() -> (data, wait_s)``."""
    for _ in range(warmup):
        stepper(next_batch()[0])
    if warmup:
        stepper.sync()
    timer = Timer()
    track_wait = True
    for _ in range(reps):
        wait = 0.0
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(steps):
            data, w = next_batch()
            if w is None:
                track_wait = False
            else:
                wait += w
            stepper(data)
        loss = stepper.sync()
        timer.wall.append(time.perf_counter() - t0)
        timer.cpu.append(time.process_time() - c0)
        timer.wait.append(wait)
    if not track_wait:
        timer.wait = []
    out = timer.summary(steps, batch)
    out["loadavg_1m_after"] = os.getloadavg()[0]  # other processes on the machine skew CPU timings
    out["final_loss"] = loss
    out["finite_loss"] = bool(np.isfinite(loss))
    return out


def _profile_dir():
    """``--profile_dir``, or its process-i subfolder in a job of several processes."""
    if FLAGS.num_processes > 1:
        return os.path.join(FLAGS.profile_dir, f"process-{FLAGS.process_id}")
    return FLAGS.profile_dir


def trace_steps(stepper, next_batch, steps, log_dir):
    """``steps`` more steps, whole, under the profiler (the device idle before the first and after the
    last); returns ``log_dir``."""
    from uniclr_tf.training.callbacks import start_trace, stop_trace
    stepper.sync()
    start_trace(log_dir)
    try:
        for _ in range(steps):
            stepper(next_batch()[0])
        stepper.sync()
    finally:
        stop_trace()
    print(f"   profiler: {steps} steps traced into {log_dir}", flush=True)
    return log_dir


def cycle(items):
    def next_batch():
        next_batch.i = (next_batch.i + 1) % len(items)
        return items[next_batch.i], None
    next_batch.i = -1
    return next_batch


def timed_iterator(it, convert=lambda x: x):
    def next_batch():
        t = time.perf_counter()
        data = convert(next(it))
        return data, time.perf_counter() - t
    return next_batch


# ------------------------------------------------------------------------------------------------
# Host augmentation under JAX: the ViewAugmenter jitted on the CPU device, in worker threads


class JaxHostAugmenter:
    """``workers`` threads: shuffled uint8 batch → CPU-jitted ViewAugmenter → views on the accelerator."""

    def __init__(self, augmenter, images, batch, workers, seed, target_device, prefetch=None):
        import jax

        self.jax = jax
        self.images, self.batch = images, batch
        self.cpu = jax.devices("cpu")[0]
        self.target = target_device
        base = [np.asarray(v.value) for v in augmenter.non_trainable_variables]
        self.fn = jax.jit(lambda s, x: augmenter.stateless_call([], s, x, training=True))
        self.queue = queue.Queue(maxsize=prefetch or 2 * workers)
        self.stop = threading.Event()
        self.errors = []
        self.states = []
        for i in range(workers):
            states = []
            for s in base:  # a distinct random stream per worker
                s = s.copy()
                if s.dtype == np.uint32 and s.shape == (2,):
                    s[0] = (int(s[0]) + 1_000_003 * (i + 1) + seed) % (2 ** 32)
                states.append(jax.device_put(s, self.cpu))
            self.states.append(states)
        self.threads = [threading.Thread(target=self._work, args=(i,), daemon=True) for i in range(workers)]

    def compile(self):
        x = self.jax.device_put(self.images[: self.batch], self.cpu)
        t = time.perf_counter()
        views, _ = self.fn(self.states[0], x)
        self.jax.block_until_ready(views)
        return time.perf_counter() - t

    def _work(self, i):
        sampler = EpochSampler(len(self.images), self.batch, 1000 + i)
        state = self.states[i]
        try:
            while not self.stop.is_set():
                idx = sampler()
                x = self.jax.device_put(self.images[idx], self.cpu)
                views, state = self.fn(state, x)
                views = self.jax.device_put(views, self.target)
                self.jax.block_until_ready(views)
                while not self.stop.is_set():
                    try:
                        self.queue.put(tuple(views), timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except Exception as e:  # surfaced by get()
            self.errors.append(e)

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def get(self):
        while True:
            if self.errors:
                raise RuntimeError(f"host augmentation worker failed: {self.errors[0]!r}") from self.errors[0]
            try:
                return self.queue.get(timeout=1.0)
            except queue.Empty:
                continue

    def close(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=10)


# ------------------------------------------------------------------------------------------------
# Section d: the objective alone


def objective_cases(precision_dtype):
    ns, ds = _ints(FLAGS.objective_n), _ints(FLAGS.objective_d)
    wn = [FLAGS.whitening_n] if FLAGS.whitening_n else ns
    cases = []
    for d in ds:
        for n in ns:
            cases.append(("simaffinity", n, d, {"temperature": 0.5}))
    for d in ds:
        for n in wn:
            cases.append(("simtrace", n, d, {}))
            cases.append(("simtrace", n, d, {"stop_gradient_cov": True}))
            for size in _ints(FLAGS.whitening_group_dims):
                if size < d and d % size == 0:
                    cases.append(("simtrace", n, d, {"groups": d // size}))
                    cases.append(("simtrace", n, d, {"groups": d // size, "stop_gradient_cov": True}))
    return cases


def run_objectives(backend, dtype):
    import keras

    from uniclr_tf import objectives

    rng = np.random.default_rng(FLAGS.seed)
    results = []
    iters, reps = FLAGS.objective_iters, FLAGS.reps
    for name, n, d, options in objective_cases(dtype):
        loss_fn = {"simaffinity": objectives.sim_affinity_loss, "simwhitening": objectives.sim_whitening_loss,
                   "simtrace": objectives.sim_trace_loss}[name]
        z1 = rng.normal(size=(n, d)).astype(np.float32)
        z2 = (z1 + 0.5 * rng.normal(size=(n, d))).astype(np.float32)
        z1 = keras.ops.cast(keras.ops.convert_to_tensor(z1), dtype)
        z2 = keras.ops.cast(keras.ops.convert_to_tensor(z2), dtype)
        if backend == "jax":
            import jax

            fn = jax.jit(jax.value_and_grad(lambda a, b: loss_fn(a, b, **options), argnums=(0, 1)))
            sync = jax.block_until_ready
        else:
            import tensorflow as tf

            @tf.function(jit_compile=FLAGS.jit_compile)
            def fn(a, b):
                with tf.GradientTape() as tape:
                    tape.watch([a, b])
                    value = loss_fn(a, b, **options)
                return value, tape.gradient(value, [a, b])

            def sync(out):
                return [np.asarray(t) for t in tf.nest.flatten(out)]
        t = time.perf_counter()
        out = fn(z1, z2)
        sync(out)
        compile_s = time.perf_counter() - t
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            for _ in range(iters):
                out = fn(z1, z2)
            sync(out)
            times.append((time.perf_counter() - t) / iters)
        value = float(np.asarray(out[0]))
        variant = "full" if "groups" not in options else f"groups={options['groups']}"
        if options.get("stop_gradient_cov"):
            variant += "+stop_gradient_cov"
        if name == "simaffinity":
            variant = "affinity"
        row = {"objective": name, "variant": variant, "n": n, "d": d, "dtype": dtype,
               "options": options, "ms": 1e3 * _median(times), "ms_min": 1e3 * min(times),
               "compile_s": compile_s, "value": value, "finite": bool(np.isfinite(value))}
        results.append(row)
        print(f"  d: {name:<11} {variant:<28} N={n:<5} D={d:<5} {row['ms']:8.3f} ms  (value {value:.4g})",
              flush=True)
    return results


# ------------------------------------------------------------------------------------------------
# Main


def environment(backend):
    import keras

    env = {"backend": backend, "keras": keras.__version__, "python": platform.python_version(),
           "cpu_count": os.cpu_count(), "machine": platform.machine(), "date": _now(),
           "loadavg_1m_at_start": os.getloadavg()[0],
           "command": "python -m benchmarks.bench " + " ".join(sys.argv[1:])}
    if os.environ.get("XLA_FLAGS"):
        env["xla_flags"] = os.environ["XLA_FLAGS"]
    if backend == "jax":
        import jax

        dev = jax.devices()[0]
        env.update(jax=jax.__version__, platform=dev.platform, device=str(getattr(dev, "device_kind", dev)),
                   devices=len(jax.devices()))
    else:
        import tensorflow as tf

        gpus = tf.config.list_logical_devices("GPU")
        env.update(tensorflow=tf.__version__, platform="gpu" if gpus else "cpu",
                   device=gpus[0].name if gpus else f"CPU ({os.cpu_count()} cores)")
    return env


def device_peak_bytes(backend):
    if backend != "jax":
        return None
    import jax

    try:
        stats = jax.devices()[0].memory_stats() or {}
    except Exception:
        return None
    return stats.get("peak_bytes_in_use")


def print_table(result):
    rows = [("a", "model step only (device-resident views)", result.get("a_model_only")),
            ("b", "end-to-end, host augmentation", result.get("b_host_aug")),
            ("b'", "host augmentation pipeline alone", (result.get("b_host_aug") or {}).get("pipeline")),
            ("c", "end-to-end, device augmentation", result.get("c_device_aug")),
            ("c'", "device aug, uint8 data on device", result.get("c_device_aug_resident"))]
    env = result["environment"]
    print(f"\nUniCLR bench | {env['backend']} on {env['device']} | {result['config']['encoder']} "
          f"{result['config']['image_shape']} batch {result['config']['batch_size']} "
          f"{result['config']['precision']} {result['config']['objective']}")
    head = f"{'':3} {'section':<42} {'images/s':>10} {'ms/step':>9} {'wait %':>7} {'host CPU ms':>11} {'compile s':>9}"
    print(head)
    print("-" * len(head))
    for key, name, r in rows:
        if not r:
            continue
        wait = f"{100 * r['input_wait_frac']:.1f}" if "input_wait_frac" in r else "-"
        cpu = f"{r['host_cpu_ms_per_step']:.1f}" if "host_cpu_ms_per_step" in r else "-"
        comp = f"{r['compile_s']:.1f}" if "compile_s" in r else "-"
        ms = r.get("ms_per_step", r.get("ms_per_batch"))
        print(f"{key:3} {name:<42} {r['images_per_s']:>10.0f} {ms:>9.2f} {wait:>7} {cpu:>11} {comp:>9}")
    for k, v in result.get("ratios", {}).items():
        print(f"    ratio {k}: {v:.3f}")
    if result.get("d_objective"):
        print(f"\n(d) objective forward+backward, ms per call ({result['d_objective'][0]['dtype']} inputs)")
        print(f"    {'objective':<11} {'variant':<28} {'N':>5} {'D':>5} {'ms':>9}")
        for r in result["d_objective"]:
            print(f"    {r['objective']:<11} {r['variant']:<28} {r['n']:>5} {r['d']:>5} {r['ms']:>9.3f}")
    mem = result.get("memory", {})
    print(f"\nmemory: process peak RSS {mem.get('process_peak_rss_bytes', 0) / 2**20:.0f} MiB"
          + (f", device peak {mem['device_peak_bytes'] / 2**20:.0f} MiB" if mem.get("device_peak_bytes") else ""))
    for name, m in mem.get("compiled_step", {}).items():
        if "temp_size_in_bytes" in m:
            print(f"    compiled step {name}: temp {m['temp_size_in_bytes'] / 2**20:.0f} MiB, "
                  f"arguments {m.get('argument_size_in_bytes', 0) / 2**20:.0f} MiB")


def output_path():
    import keras

    return FLAGS.out or os.path.join("benchmarks", f"bench-{keras.backend.backend()}-"
                                     f"{'x'.join(FLAGS.image_shape)}.json")


def save(result):
    """Writes the JSON (after every section, so a run stopped part-way keeps what it measured); in a
    multi-process job, process 0 only."""
    out = output_path()
    if FLAGS.num_processes > 1 and FLAGS.process_id != 0:
        return out
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=2, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))
    return out


def run_bench():
    import keras

    backend = keras.backend.backend()
    sections = [s.strip() for s in FLAGS.sections]
    _join_processes(backend, sections)
    bad = [s for s in sections if s not in SECTIONS]
    if bad:
        raise app.UsageError(f"--sections: unknown {bad}; expected some of {list(SECTIONS)}")
    if FLAGS.profile_dir and ("a" not in sections or FLAGS.profile_steps < 1):
        raise app.UsageError(f"--profile_dir traces section a's step: give --sections with a and --profile_steps >= 1 "
                             f"(received --sections={','.join(sections)} --profile_steps={FLAGS.profile_steps})")
    shape = tuple(_ints(FLAGS.image_shape))
    if len(shape) != 3 or shape[-1] not in (1, 3):
        raise app.UsageError(f"--image_shape must be H,W,C with C in (1, 3); received {FLAGS.image_shape}")
    batch = FLAGS.batch_size
    images = load_images(FLAGS.data, shape, FLAGS.num_images, FLAGS.seed)
    if len(images) < batch:
        raise app.UsageError(f"{len(images)} images are fewer than --batch_size={batch}")
    mean, std = channel_stats(images)
    result = {"environment": environment(backend),
              "config": {k: FLAGS[k].value for k in (
                  "quick", "data", "encoder", "encoder_width", "projector_dims", "objective",
                  "whitening_groups", "stop_gradient_cov", "batch_size", "precision", "sections",
                  "warmup_steps", "steps", "reps", "host_steps", "host_workers", "objective_iters",
                  "jit_compile", "seed", "label")},
              "memory": {}}
    result["config"].update(image_shape=list(shape), num_images=len(images),
                            data_note=("Fashion-MNIST train images" + (
                                f", zero-padded to {shape[0]}x{shape[1]} and the grey channel repeated to 3"
                                if shape != (28, 28, 1) else "") if FLAGS.data == "fashion_mnist"
                                else "uniform random uint8"))
    print(f"bench: {backend} on {result['environment']['device']}, {len(images)} images {shape}, "
          f"batch {batch}, sections {sections}", flush=True)
    steps, reps, warm = FLAGS.steps, FLAGS.reps, FLAGS.warmup_steps
    needs_model = any(s in sections for s in "abc")
    compute_dtype = "float32" if FLAGS.precision == "float32" else FLAGS.precision

    distribution = _data_parallel(backend, sections, batch)
    result["config"]["batch_norm"] = FLAGS.batch_norm
    result["config"]["state_layout"] = FLAGS.state_layout
    if distribution is not None:
        result["config"]["devices"] = FLAGS.devices
        result["config"]["processes"] = FLAGS.num_processes
    if needs_model:
        cfg, model, host_aug = build_training_model(shape, mean, std)
        result["config"]["model_params"] = int(sum(np.prod(v.shape) for v in model.trainable_variables))
        model_flops = training_model_flops(model, shape)  # before the steps (JAX donates the variables)
        stepper = JaxStepper(model) if backend == "jax" else TfStepper(model)
        dev_aug = model.augmenter

        sampler = EpochSampler(len(images), batch, FLAGS.seed)

        def uint8_batch():
            return images[sampler()]

        # Device-resident, already augmented views (a few batches rotated).
        resident = []
        for _ in range(4):
            views = dev_aug(keras.ops.convert_to_tensor(uint8_batch()), training=True)
            resident.append(tuple(_on_devices(keras.ops.convert_to_numpy(v), distribution) for v in views))

        if "a" in sections:
            print("a: model step only ...", flush=True)
            compile_s = stepper.compile("views", resident[0])
            r = timed(stepper, cycle(resident), steps, reps, warm, batch)
            r["compile_s"] = compile_s
            r.update(model_flops_utilisation(stepper.flops.get("views"), batch, r["images_per_s"],
                                             result["environment"]["device"], model_flops))
            result["a_model_only"] = r
            save(result)
            print(f"   {r['images_per_s']:.0f} images/s", flush=True)
            if FLAGS.profile_dir:
                r["profile_dir"] = trace_steps(stepper, cycle(resident), FLAGS.profile_steps, _profile_dir())
                save(result)

        if "c" in sections:
            print("c: end-to-end, device augmentation ...", flush=True)
            if backend == "jax":
                import jax

                dev = jax.devices()[0]

                def host_feed():
                    t = time.perf_counter()
                    x = jax.device_put(uint8_batch(), dev)
                    return x, time.perf_counter() - t

                compile_s = stepper.compile("uint8", jax.device_put(uint8_batch(), dev))
                r = timed(stepper, host_feed, steps, reps, warm, batch)
                r["compile_s"] = compile_s
                r["feed"] = "shuffled uint8 batch gathered on the host (NumPy) and copied per step"
                result["c_device_aug"] = r
                print(f"   {r['images_per_s']:.0f} images/s", flush=True)
                on_device = jax.device_put(images, dev)
                gather = jax.jit(lambda data, idx: jax.numpy.take(data, idx, axis=0))

                def resident_feed():
                    t = time.perf_counter()
                    idx = jax.device_put(sampler().astype(np.int32), dev)
                    x = gather(on_device, idx)
                    return x, time.perf_counter() - t

                r = timed(stepper, resident_feed, steps, reps, warm, batch)
                r["feed"] = "uint8 dataset resident on the device; shuffled batch gathered there"
                result["c_device_aug_resident"] = r
                save(result)
                print(f"   resident: {r['images_per_s']:.0f} images/s", flush=True)
            else:
                from uniclr_tf import data as data_lib

                info = _dataset_info(data_lib, images, shape, mean, std)
                ds = data_lib.pretrain_dataset(info, batch, None, shuffle=True, seed=FLAGS.seed, repeat=True)
                it = iter(ds)
                compile_s = stepper.compile("uint8", next(it))
                r = timed(stepper, timed_iterator(it), steps, reps, warm, batch)
                r["compile_s"] = compile_s
                r["feed"] = "data.pretrain_dataset(augmenter=None): tf.data shuffled uint8 batches"
                result["c_device_aug"] = r
                save(result)
                print(f"   {r['images_per_s']:.0f} images/s", flush=True)

        if "b" in sections:
            print("b: end-to-end, host augmentation ...", flush=True)
            host_steps = FLAGS.host_steps or steps
            if backend == "jax":
                import jax

                workers = FLAGS.host_workers or max(1, (os.cpu_count() or 2) // 2)
                feeder = JaxHostAugmenter(host_aug, images, batch, workers, FLAGS.seed, jax.devices()[0])
                aug_compile_s = feeder.compile()
                feeder.start()
                try:
                    if "views" not in [k for k in stepper.memory]:
                        stepper.compile("views", feeder.get())
                    pipe = _time_pipeline(feeder.get, host_steps, reps, batch, jax.block_until_ready)
                    r = timed(stepper, timed_iterator(iter(feeder.get, None)), host_steps, reps, warm, batch)
                finally:
                    feeder.close()
                r.update(pipeline=pipe, augment_compile_s=aug_compile_s, host_workers=workers,
                         feed=(f"ViewAugmenter jitted on the JAX CPU device, {workers} threads "
                               "(gather shuffled uint8 batch, augment, copy views to the accelerator)"))
            else:
                from uniclr_tf import data as data_lib

                info = _dataset_info(data_lib, images, shape, mean, std)
                ds = data_lib.pretrain_dataset(info, batch, host_aug, shuffle=True, seed=FLAGS.seed, repeat=True)
                it = iter(ds)
                first = next(it)
                if "views" not in stepper.memory and "a" not in sections:
                    stepper.compile("views", first)
                pipe = _time_pipeline(lambda: next(it), host_steps, reps, batch, lambda x: x)
                r = timed(stepper, timed_iterator(it), host_steps, reps, warm, batch)
                r.update(pipeline=pipe, feed="data.pretrain_dataset(augmenter=ViewAugmenter) in tf.data")
            result["b_host_aug"] = r
            save(result)
            print(f"   {r['images_per_s']:.0f} images/s (pipeline alone {r['pipeline']['images_per_s']:.0f})",
                  flush=True)
        result["memory"]["compiled_step"] = stepper.memory
        result["memory"]["device_peak_bytes_after_steps"] = device_peak_bytes(backend)

    if "d" in sections:
        print("d: objective cost ...", flush=True)
        result["d_objective"] = run_objectives(backend, compute_dtype)
        save(result)

    a = result.get("a_model_only", {}).get("images_per_s")
    ratios = {}
    if a:
        for key in ("b_host_aug", "c_device_aug", "c_device_aug_resident"):
            if key in result:
                ratios[f"{key}/a_model_only"] = result[key]["images_per_s"] / a
    result["ratios"] = ratios
    if "d_objective" in result and a:
        step_ms = result["a_model_only"]["ms_per_step"]
        for row in result["d_objective"]:
            row["frac_of_model_step"] = row["ms"] / step_ms
    result["memory"]["process_peak_rss_bytes"] = _rss_peak_bytes()
    result["memory"]["device_peak_bytes"] = device_peak_bytes(backend)
    return result


def _data_parallel(backend, sections, batch):
    """With ``--devices=N > 1`` or several processes (JAX, section a only): Keras's DataParallel over the
    first N devices (a job of several processes: all of them), set (before the model is built: its
    variables replicated) and returned; else None."""
    if FLAGS.devices <= 1 and FLAGS.num_processes <= 1:
        return None
    _require_jax_section_a(f"--devices={FLAGS.devices}", backend, sections)
    import jax
    import keras

    devices = jax.devices()
    if FLAGS.devices > len(devices) or batch % FLAGS.devices:
        raise app.UsageError(f"--devices={FLAGS.devices}: {len(devices)} devices here, and --batch_size={batch} "
                             "must split evenly over them")
    if FLAGS.num_processes > 1 and FLAGS.devices != len(devices):
        raise app.UsageError(f"--devices={FLAGS.devices}: a {FLAGS.num_processes}-process job runs on all its "
                             f"{len(devices)} devices")
    distribution = keras.distribution.DataParallel(devices=devices[:FLAGS.devices])
    keras.distribution.set_distribution(distribution)
    return distribution


def _require_jax_section_a(flag, backend, sections):
    """Several devices or processes are for the JAX backend's section a only: else a usage error naming ``flag``."""
    if backend != "jax" or set(sections) != {"a"}:
        raise app.UsageError(f"{flag} is for the JAX backend's section a only "
                             f"(backend {backend}, --sections={','.join(sections)})")


def _join_processes(backend, sections):
    """With ``--num_processes > 1``: joins the multi-controller job (before any JAX computation)."""
    if FLAGS.num_processes <= 1:
        return
    _require_jax_section_a(f"--num_processes={FLAGS.num_processes}", backend, sections)
    from uniclr_tf.training import distribute

    distribute.initialize_processes(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)


def _on_devices(array, distribution):
    """``array`` on the default device, or split along its first axis by ``distribution``'s data layout
    (in a multi-process job each process places only its own devices' rows)."""
    import keras

    if distribution is None:
        return keras.ops.convert_to_tensor(array)
    layout = distribution.get_data_layout(array.shape)
    if FLAGS.num_processes > 1:
        import jax

        return jax.make_array_from_callback(array.shape, layout.backend_layout, lambda index: array[index])
    return keras.distribution.distribute_tensor(array, layout)


def _dataset_info(data_lib, images, shape, mean, std):
    labels = np.zeros(len(images), np.int64)
    split = data_lib.Split("train", len(images), images=images, labels=labels)
    empty = data_lib.Split("test", 0, images=images[:0], labels=labels[:0])
    return data_lib.DatasetInfo(name="bench", image_shape=tuple(shape), num_classes=None,
                                num_train=len(images), num_test=0, mean=mean, std=std,
                                splits={"train": split, "test": empty}, spec="bench")


def _time_pipeline(get, steps, reps, batch, sync):
    """Images per second of the input pipeline alone (no training step)."""
    for _ in range(2):
        sync(get())
    walls = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(steps):
            x = get()
        sync(x)
        walls.append(time.perf_counter() - t)
    per = [steps * batch / w for w in walls]
    return {"images_per_s": _median(per), "images_per_s_min": min(per), "images_per_s_max": max(per),
            "ms_per_batch": 1e3 * _median(walls) / steps}


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    given = {a.lstrip("-").split("=")[0] for a in sys.argv[1:] if a.startswith("--")}
    _resolve_quick(given)
    result = run_bench()
    out = save(result)
    print_table(result)
    print(f"\nwrote {out}")


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    define_flags()
    app.run(main)
