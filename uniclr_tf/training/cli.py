r"""Pretrain an encoder with UniCLR or any registered method.

    python -m uniclr_tf.train --flagfile=configs/simtrace.flags [--flag=value ...]
    python -m uniclr_tf.train --flagfile=configs/quickstart.flags --method=byol

A run folder ``<run_dir>/<run_name>`` (default ``<method>-<dataset>``) receives the resolved
flagfile (``flags.txt``, replayable with ``--flagfile``), ``config.json``, ``dataset.json``,
TensorBoard logs (``tb/``), a backup (``backup/``: every epoch, every ``--backup_every_minutes``, on
SIGTERM / SIGINT), ``history.json`` + ``log.csv`` every epoch, ``curves.png`` every minute and at the
end, the backbone as ``encoder.keras``, the whole model's weights, and ``metrics.json`` with the final
kNN top-1 next to the raw-pixel kNN baseline (or, for a run that stopped, why and where).

Rerunning the same command resumes the run from its backup; a finished run says so and exits 0; a
folder holding a run with other flags is refused (``--overwrite`` starts over). A run whose
representation collapses stops (``--on_collapse``, :class:`uniclr_tf.training.callbacks.CollapseDetector`):
``metrics.json`` says ``"collapsed"`` and ``RUN/healthy/`` keeps its last healthy backup
(``--resume_from``). Exit codes: 0 finished, 1 error or divergence, 3 collapsed, 75 stopped by
``--stop_after_steps``, 128 + N stopped by signal N.
"""

import contextlib
import dataclasses
import errno
import json
import os
import signal
import sys
import tempfile
import time

from absl import flags

from uniclr_tf.config import flagutil
from uniclr_tf.config.train_config import TrainConfig
from uniclr_tf.config.errors import UsageError

ALIASES = {"objective": "method", "gamma": "symmetric_loss_weight"}


def define_flags(flag_values=None):
    """One flag per field of ``TrainConfig``'s sub-configs and ``--method`` (same name, same default,
    the help next to the field), one per option of any registered method (default None: the method's
    own), and the aliases ``--objective``, ``--gamma``; into ``flag_values`` (default: absl's FLAGS)."""
    from uniclr_tf import methods
    flag_values = flags.FLAGS if flag_values is None else flag_values
    flagutil.define_flags(TrainConfig, flag_values=flag_values, skip=("method",))
    method = next(f for f in dataclasses.fields(TrainConfig) if f.name == "method")
    flags.DEFINE_enum("method", method.default, methods.names(), method.metadata["help"], flag_values=flag_values)
    for name, spec in methods.option_specs().items():
        users = [m for m in methods.names() if name in methods.get(m).defaults]
        help_ = f"{spec.help} [{', '.join(users)}]"
        flagutil.define_flag(name, None, spec.kind, help_, flag_values, choices=spec.choices or None)
    for alias, target in ALIASES.items():
        flags.DEFINE_alias(alias, target, flag_values=flag_values)


def config_from_flags(flag_values=None):
    """A ``TrainConfig`` from parsed flags: fields, plus the method options that were given."""
    from uniclr_tf import methods
    flag_values = flags.FLAGS if flag_values is None else flag_values
    values = flagutil.config_values(TrainConfig, flag_values)
    options = {name: flag_values[name].value for name in methods.option_specs()
               if flag_values[name].value is not None}
    return TrainConfig.from_flat({**values, "method_options": options})


def build_augmenter(cfg, info, method=None):
    """The method's view recipe with the view flags that were given, sized for the dataset (the public
    ``uniclr_tf.ViewAugmenter.from_recipe``)."""
    import uniclr_tf
    method = method if method is not None else cfg.build_method()
    recipe = uniclr_tf.RECIPES[method.views].replace(**cfg.views.overrides())
    size = cfg.data.image_size or info.image_shape[0]
    return uniclr_tf.ViewAugmenter.from_recipe(recipe, (size, size, info.image_shape[-1]), num_local=cfg.views.num_local_crops,
                                     local_size=cfg.views.local_size or None, mean=info.mean, std=info.std,
                                     seed=cfg.system.seed)


def build_model(cfg, info, augmenter=None, devices=1, method=None):
    """The encoder of ``--encoder`` in a ``uniclr_tf.UniCLR`` model, which adds the method's heads of
    ``--projector_dims`` / ``--predictor_hidden`` (+ EMA target, state, probe): the public constructors
    (``method``: the run's, else built from ``cfg``).

    ``devices`` > 1 (the batch split over several): ``--batch_norm=global`` synchronises BN on TF
    (JAX's global arrays need nothing); ``per_device`` keeps TF's per-replica BN and, on JAX, builds
    ``GroupBatchNormalization`` with one group per device (one-pass statistics); ``global_one_pass`` is
    global BN whose statistics take one pass (on JAX: ``GroupBatchNormalization(one_pass=True)``)."""
    import uniclr_tf
    from uniclr_tf.nets.norm import BatchNorm
    method = method if method is not None else cfg.build_method()
    size = cfg.data.image_size or info.image_shape[0]
    norm = BatchNorm.for_run(cfg.system.batch_norm, devices)
    encoder = uniclr_tf.build_encoder(cfg.network.encoder, (size, size, info.image_shape[-1]),
                                      width=cfg.network.encoder_width or None, norm=norm,
                                      stem=cfg.network.encoder_stem)
    steps_per_epoch = max(cfg.optim.steps_per_epoch, 1)
    return uniclr_tf.UniCLR(encoder, method=method, augmenter=augmenter, num_global=2,
                            projector_dims=cfg.network.projector_dims, predictor_hidden=cfg.network.predictor_hidden,
                            norm=norm, ema_total_steps=cfg.optim.epochs * steps_per_epoch,
                            steps_per_epoch=steps_per_epoch, gather_across_replicas=cfg.system.gather_across_replicas,
                            view_batch_norm=cfg.network.view_batch_norm,
                            num_classes=info.num_classes if cfg.evaluation.online_probe and info.num_classes else None)


def build_optimizer(cfg, steps_per_epoch, method=None):
    """LARS (or SGD / AdamW) with the linear warm-up + cosine schedule, lr = batch/256 · base
    (``method``: the run's, else built from ``cfg``)."""
    import uniclr_tf
    from uniclr_tf.training.optimizers import build_optimizer as make_optimizer
    optim = cfg.optim
    schedule = uniclr_tf.WarmupCosine(optim.base_learning_rate, optim.batch_size, total_steps=optim.epochs * steps_per_epoch,
                            warmup_steps=int(round(optim.warmup_epochs * steps_per_epoch)))
    # The online probe is a plain linear classifier: no trust ratio, no decay (as solo-learn).
    probe = ["linear_probe"] if optim.optimizer in ("lars", "sgd") else ()
    # SimSiam's predictor learns at a constant rate (the schedule's peak), not on the schedule.
    method = method if method is not None else cfg.build_method()
    fixed = ["predictor"] if method.options.get("predictor_fixed_lr") else []
    return make_optimizer(optim.optimizer, schedule, momentum=optim.momentum, weight_decay=optim.weight_decay,
                          eta=optim.lars_eta, clip_lr=optim.lars_clip_lr,
                          exclude_from_adaptation=probe if optim.optimizer == "lars" else (),
                          exclude_from_weight_decay=probe, fixed_lr_patterns=fixed,
                          fixed_learning_rate=schedule.peak_learning_rate if fixed else None)


def run_path(cfg):
    """The run folder: ``<run_dir>/<run_name>``, by default ``<method>-<dataset>`` (so rerunning the
    same command finds the same folder and resumes it)."""
    from uniclr_tf.training import runs
    name = cfg.system.run_name or f"{cfg.method}-{cfg.data.dataset.replace(':', '_').replace('/', '_')}"
    return runs.run_folder_path(cfg.invocation.run_dir, name)


def check_writable(folder):
    """Raises ValueError naming --run_dir when ``folder`` cannot be created or written."""
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise UsageError(f"--run_dir={folder}: cannot create or write there ({e.strerror or e})") from None


def refuse_foreign_folder(run_dir):
    """Raises the refusal of :func:`prepare_run_folder` for a non-empty folder that holds no run of
    this tool, before anything (the lock file) is written into it."""
    from uniclr_tf.training import runs
    if os.path.isdir(run_dir) and set(os.listdir(run_dir)) - {runs.LOCK_FILE} and not runs.is_run_folder(run_dir):
        raise UsageError(f"--run_name: {run_dir} exists and holds files that are not a run of uniclr_tf.train "
                         "(no config.json + flags.txt); choose another --run_name or --run_dir")


#: Settings whose default changed, with the default they had before: a run folder made with the old
#: default resumes with it (its config.json says so), not with the new one.
CHANGED_DEFAULTS = {"batch_norm": "global"}


def keep_changed_defaults(cfg, run_dir):
    """``cfg``, where a setting of :data:`CHANGED_DEFAULTS` has its new default while the run in ``run_dir``
    was made with the old one, set back to the run's value (with a one-line note), so rerunning an
    older run's command resumes it instead of being refused for other flags."""
    config_path = os.path.join(run_dir, "config.json")
    if cfg.invocation.overwrite or not os.path.isfile(config_path):
        return cfg
    try:
        with open(config_path) as f:
            old = dict(TrainConfig.from_json(f.read()).flag_items())
    except (OSError, ValueError, TypeError):
        return cfg  # prepare_run_folder says what is wrong with it
    mine, default = dict(cfg.flag_items()), dict(TrainConfig().flag_items())
    kept = {name: old[name] for name, before in CHANGED_DEFAULTS.items()
            if old.get(name) == before and mine.get(name) == default.get(name) != before}
    for name, value in kept.items():
        print(f"note: {run_dir} was started with --{name}={value}, the default then; it resumes with it",
              flush=True)
    return cfg.replace(**kept) if kept else cfg


def _resolved(cfg):
    """``cfg`` with every method option written out: an option added since a run was made takes its
    default, as the run did without it; unresolvable (an option the method no longer takes), as it is,
    so that the differences name it."""
    try:
        return cfg.resolved()
    except (ValueError, TypeError):
        return cfg


def prepare_run_folder(cfg, run_dir):
    """Decides what to do with ``run_dir``: returns ``("new", None)``, ``("resume", state or None)`` or
    ``("finished", metrics)``; raises ValueError when it holds a run with other flags (unless
    ``--overwrite``, which empties it first) or files that are not a run of this tool (always).
    The caller holds the folder's lock (:class:`uniclr_tf.training.runs.RunLock`)."""
    from uniclr_tf.training import backup
    from uniclr_tf.training import runs
    if not os.path.isdir(run_dir) or not set(os.listdir(run_dir)) - {runs.LOCK_FILE}:
        return "new", None
    if not runs.is_run_folder(run_dir):
        raise UsageError(f"--run_name: {run_dir} exists and holds files that are not a run of uniclr_tf.train "
                         "(no config.json + flags.txt); choose another --run_name or --run_dir")
    if cfg.invocation.overwrite:
        runs.clear_run_folder(run_dir)
        return "new", None
    config_path = os.path.join(run_dir, "config.json")
    try:
        with open(config_path) as f:
            old = TrainConfig.from_json(f.read())
    except (OSError, ValueError, TypeError) as e:
        raise UsageError(f"--run_name: {run_dir} holds a run whose config.json is unreadable ({e}); pass "
                         "--overwrite to start it again, or another --run_name") from None
    diffs = _resolved(cfg).differences(_resolved(old))
    if diffs:
        listed = "; ".join(f"--{k}: {b!r} in the folder, {a!r} now" for k, a, b in diffs[:8])
        more = f" (and {len(diffs) - 8} more)" if len(diffs) > 8 else ""
        raise UsageError(f"--run_name: {run_dir} holds a run with other flags: {listed}{more}. Pass --overwrite to "
                         "start it again, or another --run_name")
    metrics_path = os.path.join(run_dir, "metrics.json")
    metrics = _read_metrics(metrics_path) if os.path.exists(metrics_path) else None
    if metrics is not None:
        if metrics.get("status", "finished") == "finished":
            return "finished", metrics
        if metrics.get("status") == "collapsed":  # the same flags would collapse again
            from uniclr_tf.training.callbacks import TrainingCollapsed
            raise TrainingCollapsed(
                f"run folder {run_dir}: this run collapsed ({metrics.get('reason', 'see metrics.json')}); rerunning "
                "the same flags would collapse again: restart from its last healthy backup with other flags "
                f"(--resume_from={os.path.join(run_dir, 'healthy')} --run_name=NEW_NAME), or --overwrite",
                metrics.get("epoch"), metrics.get("signal"), metrics.get("healthy_epoch"))
    return "resume", backup.latest(run_dir)


def enable_compilation_cache(path, autotune_table=True):
    """JAX's persistent compilation cache in ``path`` (``~`` expanded; empty: left as it is).

    The XLA compile of a ResNet-18 train step takes 20-25 s on an H100 (GPU autotuning included);
    a resumed run, a rerun with other evaluation flags or the next run of a study loads it in about
    a second. Entries are keyed by the computation, the devices and the JAX/XLA versions, so a stale
    entry is never used. TensorFlow has no such cache: nothing is done there. Nor on JAX's CPU
    backend, where compiles take seconds (and test runs would fill the cache folder).

    With ``autotune_table``, the XLA autotuning results shipped for this card and jaxlib are put in the
    cache first (:mod:`uniclr_tf.training.autotune`): a first run on a fresh machine then compiles its ResNet-18
    step in 6-11 s instead of 20-25 (measured on an H200 and an H100).
    """
    import keras
    if not path or keras.backend.backend() != "jax":
        return None
    import jax
    if jax.default_backend() == "cpu":
        return None
    path = os.path.abspath(os.path.expanduser(path))
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:  # a cache is an optimisation: never a reason to stop
        print(f"warning: --compilation_cache_dir={path}: {e.strerror}; compiling without a cache", flush=True)
        return None
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # the variable initialisers too
    if autotune_table:
        from uniclr_tf.training import autotune
        autotune.seed_for_jax(path)
    return path


def wants_convolution_graphs(xla_flags):
    """Whether ``xla_flags`` (an ``XLA_FLAGS`` value) puts convolutions into XLA's CUDA graphs
    (``--xla_gpu_enable_command_buffer=...CONVOLUTION...``, as a list or a ``+`` to the defaults)."""
    value = None
    for word in (xla_flags or "").split():
        if word.startswith("--xla_gpu_enable_command_buffer="):
            value = word.split("=", 1)[1]  # the last one counts, as in XLA
    return value is not None and any(t.strip().lstrip("+") == "CONVOLUTION" for t in value.upper().split(","))


def prime_cudnn_for_graphs():
    """With convolutions in XLA's CUDA graphs (:func:`wants_convolution_graphs` of ``XLA_FLAGS``), runs
    one small convolution on each local GPU before the first step; returns how many GPUs it primed.

    XLA records those convolutions into its graphs by stream capture on the first step, and cuDNN
    cannot create its handle during a capture. With the shipped autotuning table nothing calls cuDNN
    before that step, which then fails ("Could not create cudnn handle", cuDNN status 5003)."""
    import keras
    if keras.backend.backend() != "jax" or not wants_convolution_graphs(os.environ.get("XLA_FLAGS")):
        return 0
    import jax
    import jax.numpy as jnp
    gpus = [d for d in jax.local_devices() if d.platform == "gpu"]
    for device in gpus:
        x, w = jax.device_put((jnp.ones((1, 8, 8, 8), jnp.bfloat16), jnp.ones((3, 3, 8, 8), jnp.bfloat16)), device)
        jax.block_until_ready(jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                                           dimension_numbers=("NHWC", "HWIO", "NHWC")))
    return len(gpus)


def _read_metrics(path):
    """``metrics.json`` as a dict, or None (with one warning line) when it is not a JSON object with a
    string ``status``: the run then resumes from its backup, whose final stage writes it again."""
    try:
        with open(path) as f:
            metrics = json.load(f)
        if isinstance(metrics, dict) and isinstance(metrics.get("status", "finished"), str):
            return metrics
        problem = "not a JSON object with a string 'status'"
    except (OSError, ValueError) as e:
        problem = f"unreadable ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
    print(f"warning: {path} is {problem}; resuming the run from its backup", flush=True)
    return None


def _read_history(run_dir, completed_epochs):
    """The epochs of ``history.json`` up to ``completed_epochs``; entries that are not objects with
    an integer ``epoch`` are dropped, and an unreadable file (one warning line) is an empty history."""
    path = os.path.join(run_dir, "history.json")
    if not os.path.exists(path):
        return []
    try:
        with open(path) as f:
            entries = json.load(f)
    except (OSError, ValueError) as e:
        print(f"warning: {path} is unreadable ({type(e).__name__}); the history restarts from this epoch", flush=True)
        return []
    if not isinstance(entries, list):
        entries = []
    return [e for e in entries if isinstance(e, dict) and isinstance(e.get("epoch"), int)
            and not isinstance(e.get("epoch"), bool) and e["epoch"] <= completed_epochs]


def process_age():
    """Seconds since this process started (Linux: ``/proc``; elsewhere None): the imports and flag
    parsing before :func:`run`, which the phases' clock cannot see from inside it."""
    try:
        with open("/proc/self/stat") as f:
            started = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: clock ticks after boot
        with open("/proc/uptime") as f:
            return max(float(f.read().split()[0]) - started / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class PhaseClock:
    """The wall clock of an invocation by phase (metrics.json's ``seconds``): each :meth:`mark` adds the
    time since the previous mark (or the clock's start) to its phase."""

    def __init__(self, before=None):
        self.seconds = {} if before is None else {"start_up": before}
        self._last = time.perf_counter()

    def mark(self, phase):
        now = time.perf_counter()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self._last
        self._last = now

    def line(self, monitor_seconds):
        """One line: the wall clock and its phases over 0.05 s, training with its kNN monitor."""
        names = {"start_up": "start-up (imports, flags)", "set_up": "set-up", "raw_pixel_knn": "raw-pixel kNN",
                 "final_knn": "final kNN"}
        parts = [f"training {v:.1f} (kNN monitor {monitor_seconds:.1f})" if k == "training"
                 else f"{names.get(k, k)} {v:.1f}" for k, v in self.seconds.items() if v >= 0.05 or k == "training"]
        return f"wall clock {sum(self.seconds.values()):.1f} s: " + ", ".join(parts)


@dataclasses.dataclass
class RunContext:
    """What the phases of :func:`run` share. ``cfg`` is resolved (the method's defaults written out)
    and, once the data is loaded, holds the run's steps per epoch; ``method`` is built once, here."""
    cfg: TrainConfig
    method: object
    process_id: int = 0
    num_processes: int = 1
    early_strategy: object = None  # tf.distribute's multi-worker strategy, made before any other TF op
    info: object = None  # the dataset (uniclr_tf.data.DatasetInfo)
    num_train: int = 0
    size: int = 0  # the side of the (square) training images
    strategy: object = None
    augmenter: object = None
    run_dir: str = ""
    status: str = ""  # what the run folder held: "new" or "resume"
    state: dict = None  # the backup this run starts from (None: step 0)
    model: object = None
    clock: PhaseClock = None  # the wall clock by phase

    @property
    def chief(self):
        """Process 0: the one process that writes the run folder and evaluates."""
        return self.process_id == 0

    @property
    def steps_per_epoch(self):
        return self.cfg.optim.steps_per_epoch

    @property
    def last_epoch(self):
        """The last epoch this invocation trains to (the schedule stays that of --epochs)."""
        return self.cfg.optim.stop_at_epoch or self.cfg.optim.epochs

    @property
    def initial_step(self):
        return self.state["step"] if self.state else 0


@dataclasses.dataclass
class Evaluation:
    """Process 0's kNN evaluations: in a multi-process job on a local copy of the encoder (the job's
    arrays span every process, so a computation on them needs every process), refreshed before use."""
    encoder: object
    preprocess: object
    local: object = contextlib.nullcontext  # the context the evaluations run in
    refresh: object = None  # copies the model's encoder weights into ``encoder`` (several processes)
    train: object = None  # the kNN memory bank's source (arrays or tf.data batches)
    test: object = None
    raw: dict = None  # the raw-pixel kNN baseline
    monitor: object = None  # the per-epoch KNNMonitor


@dataclasses.dataclass
class Fit:
    """What training left behind: the history, the backup writer, the progress, and why it stopped
    early with a backup (``stopped``: "stop_after_steps" or a signal's name; None: it did not)."""
    history: object
    writer: object
    progress: object
    interrupts: object = None
    agreement: object = None  # backup.(Collective)StopAgreement in a job of several processes
    stopped: str = None
    seconds: float = 0.0


def run(cfg, start_up_seconds=None):
    """Runs (or resumes) one pretraining job described by ``cfg``; returns ``(run folder, metrics)``.

    ``start_up_seconds``: the process's time before this call (the CLI's imports and flags), counted in
    metrics.json's wall clock by phase (``seconds``) with the phases of this call.
    Raises :class:`uniclr_tf.training.backup.TrainingStopped` when it stopped early with a backup (a signal,
    ``--stop_after_steps``) and :class:`uniclr_tf.training.backup.TrainingDiverged` on a non-finite loss or weight.
    Process 0 holds the run folder's lock (:class:`uniclr_tf.training.runs.RunLock`) until it returns.
    """
    clock = PhaseClock(start_up_seconds)
    with contextlib.ExitStack() as held:  # keeps the run folder's lock until the run ends
        ctx = _prepare_process(cfg)
        ctx.clock = clock
        clock.mark("set_up")
        _load_data(ctx)
        clock.mark("data")
        _set_up_devices(ctx)
        finished = _open_run_folder(ctx, held)
        if finished is not None:
            return ctx.run_dir, finished
        clock.mark("set_up")
        _build_training_model(ctx)
        clock.mark("model")
        evaluation = _prepare_evaluation(ctx)
        clock.mark("raw_pixel_knn")
        fit = _fit(ctx, evaluation)
        return ctx.run_dir, _finish(ctx, evaluation, fit)


def _prepare_process(cfg):
    """Joins the job (JAX processes, tf.distribute's workers), turns the compilation cache on, seeds,
    resolves the config and builds its method; process 0 checks that --run_dir can be written."""
    import keras
    from uniclr_tf.training import backup
    from uniclr_tf.training import distribute
    backup.set_phase("before training started; nothing was saved by this invocation: rerun the same command")
    if cfg.invocation.export and keras.backend.backend() != "tensorflow":
        raise UsageError("--export writes a TF SavedModel and needs KERAS_BACKEND=tensorflow; train under "
                         f"{keras.backend.backend()!r}, then run `python -m uniclr_tf.export` with the TF backend")
    # A multi-controller job (several JAX processes) is joined before any JAX computation.
    this = cfg.invocation
    process_id, num_processes = distribute.initialize_processes(this.coordinator_address, this.num_processes,
                                                                this.process_id)
    enable_compilation_cache(this.compilation_cache_dir, this.autotune_table)
    prime_cudnn_for_graphs()
    # tf.distribute's multi-worker strategy must exist before any other TensorFlow operation.
    early = distribute.make_strategy(cfg.system.strategy) if cfg.system.strategy == "multi_worker" else None
    if early is not None:  # one process per worker; worker 0 (or the chief) is process 0
        process_id, num_processes = distribute.worker_info(early)
    keras.utils.set_random_seed(cfg.system.seed)
    cfg = cfg.resolved()  # the method's defaults written out: flags.txt replays the same run
    ctx = RunContext(cfg, cfg.build_method(), process_id, num_processes, early_strategy=early)
    if ctx.chief:
        check_writable(cfg.invocation.run_dir)
    return ctx


def _load_data(ctx):
    """The dataset (process 0 prints its notes) and the steps of an epoch, written into ``ctx.cfg``."""
    from uniclr_tf import data
    cfg, spec = ctx.cfg, ctx.cfg.data
    batch_size, per_execution = cfg.optim.batch_size, cfg.system.steps_per_execution
    info = data.load_dataset(spec.dataset, image_size=spec.image_size or None, data_dir=spec.data_dir or None,
                             skip_bad_files=spec.skip_bad_files, max_examples=spec.max_examples or None,
                             eval_spec=spec.eval_dataset or None, holdout_fraction=spec.holdout_fraction,
                             max_in_memory_mb=spec.max_in_memory_mb, max_image_pixels=spec.max_image_pixels or None,
                             check_duplicates=cfg.invocation.check_duplicates)
    if ctx.chief:  # where the test split comes from, what is held out, whether the data streams
        for note in info.notes:
            print(note, flush=True)
    num_train = min(info.num_train, spec.max_examples or info.num_train)
    if num_train < batch_size:  # every batch would repeat images (a contrastive batch then holds duplicates)
        raise UsageError(f"--batch_size={batch_size}: {spec.dataset} has only {num_train} training images, fewer "
                         "than one batch; lower --batch_size or add images")
    steps_per_epoch = cfg.optim.steps_per_epoch or max(num_train // batch_size, 1)
    ctx.cfg = cfg.replace(steps_per_epoch=steps_per_epoch)
    if per_execution > 1 and steps_per_epoch % per_execution:
        raise UsageError(f"--steps_per_execution={per_execution} must divide the {steps_per_epoch} steps "
                         f"of an epoch (Keras runs whole blocks of steps, so an epoch would run more)")
    ctx.info, ctx.num_train, ctx.size = info, num_train, spec.image_size or info.image_shape[0]


def _set_up_devices(ctx):
    """The precision policy, the distribution strategy and, under it, the view augmenter."""
    import keras
    from uniclr_tf import data
    from uniclr_tf.training import distribute
    cfg = ctx.cfg
    if cfg.system.precision != "float32":
        keras.mixed_precision.set_global_policy(f"mixed_{cfg.system.precision}")
    # The distribution first: every variable (the augmenter's random state too) is created under it.
    ctx.strategy = (ctx.early_strategy if ctx.early_strategy is not None
                    else distribute.make_strategy(cfg.system.strategy, cfg.system.tpu))
    replicas = distribute.num_replicas(ctx.strategy)
    if cfg.optim.batch_size % replicas:
        raise UsageError(f"--batch_size={cfg.optim.batch_size} must be divisible by the {replicas} replicas")
    if replicas > 1 and not cfg.system.gather_across_replicas:  # each replica's loss sees its own rows only
        ctx.method.check_setup(cfg.optim.batch_size // replicas, cfg.network.embedding_dim)
    if ctx.num_processes > 1 and keras.backend.backend() == "jax" and not data.have_tensorflow():
        # numpy_batches shards itself (shard=...)
        keras.distribution.distribution().auto_shard_dataset = False
    ctx.augmenter = build_augmenter(cfg, ctx.info, ctx.method)


def _open_run_folder(ctx, held):
    """Opens the run folder: new, resumed (``ctx.state``: its backup, or --resume_from's) or finished
    (returns its metrics). Process 0 decides (and may --overwrite) under the folder's lock, kept in
    ``held``, and writes the run's files; then the others read the same folder (shared storage) and
    reach the same decision."""
    from uniclr_tf.training import backup
    from uniclr_tf.training import distribute
    from uniclr_tf.training import runs
    run_dir = ctx.run_dir = run_path(ctx.cfg)
    cfg = ctx.cfg = keep_changed_defaults(ctx.cfg, run_dir)
    if ctx.chief:
        refuse_foreign_folder(run_dir)  # before the lock: nothing is written into a folder that is not a run
        held.enter_context(runs.RunLock(run_dir))  # one process at a time; the others see who holds it
        status, found = prepare_run_folder(cfg, run_dir)
        if status != "new":  # what a process killed mid-write (kill -9) left behind
            runs.remove_temporaries(run_dir)
        if status != "finished":
            _write_run_files(run_dir, cfg, ctx.augmenter, ctx.info, ctx.size)
    distribute.barrier("run folder prepared", ctx.num_processes, ctx.strategy)
    if not ctx.chief:
        status, found = prepare_run_folder(cfg.replace(overwrite=False), run_dir)
    if status == "finished":
        print(f"run folder {run_dir}: this run already finished ({found.get('epochs')} epochs); its results are in "
              f"{os.path.join(run_dir, 'metrics.json')}. Pass --overwrite to train it again.")
        if cfg.invocation.export and ctx.chief:  # asked now: the finished run is exported now
            from uniclr_tf.serving.export import export_run
            export_run(run_dir, os.path.join(run_dir, "export"), overwrite=True)
            print(f"exported the finished run to {os.path.join(run_dir, 'export')} (--export)", flush=True)
        return found
    ctx.status, ctx.state = status, found if status == "resume" else None
    resume_from = cfg.invocation.resume_from
    if status == "new" and resume_from:
        ctx.state = backup.latest(resume_from)
        if ctx.state is None:
            raise UsageError(f"--resume_from={resume_from}: no backup there ({backup.state_path(resume_from)} "
                             "is missing)")
    return None


def _build_training_model(ctx):
    """The model under the strategy, compiled, its optimizer's variables built, restored from the backup."""
    import keras
    from uniclr_tf.training import backup
    from uniclr_tf.training import distribute
    from uniclr_tf.nets.variables import batched_initialisers
    cfg = ctx.cfg
    # On JAX a few XLA programs, compiled side by side, compute every variable's initial value (model,
    # heads, optimizer), not ~60 small ones, one for each shape and distribution, compiled in turn.
    with distribute.scope(ctx.strategy), batched_initialisers():
        model = build_model(cfg, ctx.info, ctx.augmenter if cfg.system.augment_on == "device" else None,
                            devices=distribute.num_data_parallel_devices(ctx.strategy), method=ctx.method)
        # JAX must jit ("auto"): with jit_compile=False Keras-on-JAX runs the step eagerly (~70x
        # slower on a GPU). TF runs a tf.function graph unless --jit_compile asks for XLA.
        jit = True if cfg.system.jit_compile else ("auto" if keras.backend.backend() == "jax" else False)
        model.state_layout = cfg.system.state_layout  # read on JAX (training.steps.jax_step)
        model.compile(optimizer=build_optimizer(cfg, ctx.steps_per_epoch, method=ctx.method), jit_compile=jit,
                      steps_per_execution=cfg.system.steps_per_execution)
        # The optimizer's variables now, with the model's (as a resume does), not inside fit: on JAX
        # their initialisers are XLA compiles of their own, which would count in the first epoch.
        model.optimizer.build(model.trainable_variables)
        if ctx.state:  # the backup restored (a damaged newest one falls back to the one before)
            own = ctx.status != "new"  # --resume_from's run may have other epochs
            ctx.state = backup.restore(model, ctx.run_dir if own else cfg.invocation.resume_from, ctx.state,
                                       steps_per_epoch=ctx.steps_per_epoch if own else None,
                                       total_steps=cfg.optim.epochs * ctx.steps_per_epoch if own else None)
    ctx.model = model


def _train_data(ctx, skip):
    """The training stream from step ``skip`` on (deterministic given the seed)."""
    from uniclr_tf import data
    cfg, info = ctx.cfg, ctx.info
    batch_size, seed, augment_on = cfg.optim.batch_size, cfg.system.seed, cfg.system.augment_on
    labelled = bool(info.num_classes) and cfg.evaluation.online_probe
    if data.have_tensorflow():
        return data.pretrain_dataset(info, batch_size, ctx.augmenter if augment_on == "host" else None,
                                     shuffle=True, seed=seed, repeat=True, with_labels=labelled,
                                     skip_batches=skip,  # Keras shards tf.data over processes itself
                                     augment_seed=seed)  # views keyed by batch: a resume draws the same
    if augment_on == "device":  # e.g. the JAX-only GPU machine: in-memory uint8 batches
        return data.numpy_batches(info, batch_size, shuffle=True, seed=seed, with_labels=labelled,
                                  skip_batches=skip, shard=(ctx.process_id, ctx.num_processes))
    raise UsageError("--augment_on=host uses tf.data, and TensorFlow is not installed here; "
                     "use --augment_on=device")


def _prepare_evaluation(ctx):
    """The kNN evaluations of process 0: the raw-pixel baseline now, the monitor for every N epochs."""
    import uniclr_tf
    from uniclr_tf.training import distribute
    from uniclr_tf.evaluation import raw_pixel_knn
    knn, info, model = ctx.cfg.evaluation, ctx.info, ctx.model
    single = ctx.num_processes == 1
    ev = Evaluation(model.encoder if single else distribute.local_copy(model.encoder),
                    uniclr_tf.EvalPreprocess(ctx.size, info.mean, info.std),
                    local=contextlib.nullcontext if single else distribute.local_only)
    if not single:
        ev.refresh = lambda: ev.encoder.set_weights(model.encoder.get_weights())
    if info.num_classes and ctx.chief:
        # In-memory splits as arrays; streamed ones as tf.data batches, of which only features are kept.
        ev.train = _eval_source(info, "train", knn.knn_max_train or None)
        ev.test = _eval_source(info, "test")
        ev.raw = raw_pixel_knn(ev.train, ev.test, info.num_classes, knn.knn_k, knn.knn_temperature)
        ev.monitor = uniclr_tf.KNNMonitor(ev.encoder, ev.preprocess, ev.train, ev.test, info.num_classes, every=knn.knn_every,
                                k=knn.knn_k, temperature=knn.knn_temperature, refresh=ev.refresh, context=ev.local)
    return ev


def _callbacks(ctx, ev, fit, interrupts):
    """The step clock first (its step_seconds end where the other callbacks' work begins), the kNN
    monitor, the history, TensorBoard, the backups (of what the others wrote for the epoch), then the
    collapse detector (it keeps the backup of each epoch it finds healthy); on a machine without a GPU,
    the note of a run that will take hours."""
    import uniclr_tf
    from uniclr_tf import data
    from uniclr_tf.training import backup
    from uniclr_tf.training.callbacks import EpochTensorBoard, LongRunNotice, StepClock, StepProfiler
    cfg, this, chief = ctx.cfg, ctx.cfg.invocation, ctx.chief
    callbacks = [StepClock()] + ([ev.monitor] if ev.monitor else [])
    if chief:
        callbacks.append(LongRunNotice(ctx.last_epoch * ctx.steps_per_epoch, ctx.initial_step, hint=LONG_RUN_HINT))
    if this.profile_steps and chief:
        callbacks.insert(0, StepProfiler(os.path.join(ctx.run_dir, "profile"), *map(int, this.profile_steps)))
    saver = backup.BackupCallback(fit.writer, fit.progress, every_s=60.0 * this.backup_every_minutes,
                                  stop_after_steps=this.stop_after_steps, interrupts=interrupts,
                                  method=cfg.method, before_write=fit.history.pending_write if chief else None,
                                  agreement=fit.agreement)
    if chief:
        callbacks.append(fit.history)
    if data.have_tensorflow() and chief:  # Keras's TensorBoard callback writes through tf.summary
        callbacks.append(EpochTensorBoard(os.path.join(ctx.run_dir, "tb"), every_steps=this.tensorboard_every_steps,
                                          steps_per_epoch=ctx.steps_per_epoch, initial_step=ctx.initial_step))
    callbacks.append(saver)
    if chief:  # (the kNN monitor runs on process 0 alone: in a job of several processes it only warns)
        detect = cfg.evaluation
        on_collapse = detect.on_collapse if ctx.num_processes == 1 else "warn"
        callbacks.append(uniclr_tf.CollapseDetector(cfg.network.embedding_dim, ev.raw["top1"] if ev.raw else None,
                                          cfg.optim.warmup_epochs, on_collapse, ctx.run_dir, fit.writer,
                                          knn_margin=detect.collapse_knn_margin,
                                          std_fraction=detect.collapse_std_fraction))
    return callbacks


#: What the note of a run that will take hours on a machine without a GPU points to.
LONG_RUN_HINT = "This recipe is sized for a GPU; configs/quickstart.flags trains on a CPU in minutes."


def _announce(ctx):
    """The run's first lines: its folder (and where it resumes), the method, the data and the steps."""
    import keras
    cfg = ctx.cfg
    print(f"run folder: {ctx.run_dir}" + _resume_note(ctx.state, cfg.optim.epochs)
          + f"\nmethod: {ctx.method!r}, logging {', '.join(ctx.method.terms)}\n"
          f"{cfg.data.dataset}: {ctx.num_train} training images {tuple(ctx.info.image_shape)}, "
          f"{ctx.steps_per_epoch} steps/epoch of batch {cfg.optim.batch_size}, backend {keras.backend.backend()}",
          flush=True)
    for line in ctx.method.setup_warnings():
        print(line, flush=True)


def _fit(ctx, ev):
    """Trains to the last epoch. A failure (diverged, collapsed, interrupted at once) is written to
    metrics.json and raised; a stop with a backup (a signal, --stop_after_steps) is ``Fit.stopped``."""
    from uniclr_tf.training import backup
    from uniclr_tf.training.callbacks import HistoryRecorder, TrainingCollapsed
    cfg, run_dir = ctx.cfg, ctx.run_dir
    completed_epochs = ctx.state["epoch"] if ctx.state else 0
    fit = Fit(HistoryRecorder(run_dir, title=f"{cfg.method} · {os.path.basename(run_dir)} · {cfg.data.dataset}",
                              reference={"raw-pixel kNN top-1": ev.raw["top1"]} if ev.raw else None,
                              epochs=_read_history(run_dir, completed_epochs) if ctx.chief else ()),
              backup.Writer(run_dir, method=cfg.method, enabled=ctx.chief, last=ctx.state),
              backup.Progress(ctx.steps_per_epoch, ctx.initial_step))
    fit.agreement = backup.StopAgreement.for_job() or backup.CollectiveStopAgreement.for_strategy(ctx.strategy)
    with backup.Interrupts() as fit.interrupts:
        callbacks = _callbacks(ctx, ev, fit, fit.interrupts)
        _announce(ctx)
        start = time.perf_counter()
        try:
            _fit_epochs(ctx, callbacks)
            fit.writer.wait()  # the last backup is on disk (and was finite)
            if fit.interrupts.signal is not None:  # acknowledged after the last step: it stops the run all the same
                fit.stopped = signal.Signals(fit.interrupts.signal).name
                if ctx.chief:
                    fit.history.write()
        except backup.StopTraining as e:  # between two steps, after a backup
            fit.stopped = e.reason
            if ctx.chief:
                fit.history.write()
        except backup.TrainingDiverged as e:
            _record_failure(run_dir, cfg, "diverged", str(e), fit.progress)
            raise
        except TrainingCollapsed as e:  # a run that looks finished must not be one that collapsed
            _record_collapse(ctx, fit, e)
            raise
        except backup.Interrupted as e:  # a second SIGINT: stopped at once, between two backups
            _record_interrupted(ctx, fit, e)
            raise
        except Exception as e:
            if _diverged_in_step(e):
                raise _record_divergence(ctx, fit) from None
            raise
        finally:
            fit.writer.wait(raise_error=False)
            fit.history.wait()
        fit.seconds = time.perf_counter() - start
    return fit


def _fit_epochs(ctx, callbacks):
    """``model.fit`` from the resumed step to the last epoch: a partial epoch first, alone. The stream
    is shuffled already (``shuffle=False``: Keras would only warn that it ignores its shuffle)."""
    cfg, model, steps_per_epoch, initial_step = ctx.cfg, ctx.model, ctx.steps_per_epoch, ctx.initial_step
    verbose = cfg.invocation.verbose or (1 if sys.stdout.isatty() else 2)
    epoch = initial_step // steps_per_epoch
    if initial_step % steps_per_epoch:  # resumed mid-epoch: finish that epoch first
        # (a multiple of --steps_per_execution: backups happen between blocks, which divide an epoch)
        # epochs=cfg.optim.epochs, stopped after this one: the progress bar says "Epoch E/<epochs>"
        model.fit(_train_data(ctx, initial_step), initial_epoch=epoch, epochs=cfg.optim.epochs,
                  steps_per_epoch=steps_per_epoch - initial_step % steps_per_epoch,
                  callbacks=callbacks + [_stop_after_one_epoch()], verbose=verbose, shuffle=False)
        epoch += 1
    if epoch < ctx.last_epoch:
        model.fit(_train_data(ctx, epoch * steps_per_epoch), initial_epoch=epoch, epochs=ctx.last_epoch,
                  steps_per_epoch=steps_per_epoch, callbacks=callbacks, verbose=verbose, shuffle=False)


def _save_encoder(ctx):
    """``encoder.keras`` and ``projector.keras`` as they are (atomically; collective on several processes)."""
    from uniclr_tf.training import runs
    runs.atomic_save(os.path.join(ctx.run_dir, "encoder.keras"), ctx.model.encoder.save)
    runs.atomic_save(os.path.join(ctx.run_dir, "projector.keras"), ctx.model.projector.save)


def _record_collapse(ctx, fit, e):
    """A collapsed run: its history, its encoder as it is (export and release refuse it unless
    --force, as a stopped run's), and metrics.json saying "collapsed"."""
    fit.history.write()
    _save_encoder(ctx)
    _record_failure(ctx.run_dir, ctx.cfg, "collapsed", str(e), fit.progress, signal=e.signal,
                    healthy_epoch=e.healthy_epoch)


def _record_interrupted(ctx, fit, e):
    """Stopped at once (a second SIGINT): the backup being written is finished first; says what is left."""
    from uniclr_tf.training import backup
    fit.writer.wait(raise_error=False)
    last = fit.writer.last
    backup.set_phase("stopped at once, no backup of this step; " + (
        f"the last backup is at epoch {last['epoch'] + 1}, step {last['step']}: rerun the same command to "
        "resume from it" if last else "no backup yet: rerunning the same command starts over"))
    if ctx.chief:
        _record_failure(ctx.run_dir, ctx.cfg, "interrupted", f"{e} (stopped at once)", fit.progress, last)


def _diverged_in_step(error):
    """Whether a step failed on a non-finite covariance: TensorFlow raises from inside the compiled step
    (XLA's Cholesky, a numerics check: a ``tf.errors.OpError`` naming it); JAX returns NaN, which the
    backups' finiteness checks catch (:class:`uniclr_tf.training.backup.TrainingDiverged`)."""
    tf = sys.modules.get("tensorflow")  # never imported here: a TF error needs TensorFlow loaded
    if tf is None or not isinstance(error, tf.errors.OpError):
        return False
    return "Cholesky" in str(error) or "NaN" in str(error)


def _record_divergence(ctx, fit):
    """A step that failed on a non-finite covariance: metrics.json says "diverged"; returns the error to raise."""
    from uniclr_tf.training import backup
    message = backup.divergence_message(fit.progress.epoch + 1, fit.progress.step, ["covariance (Cholesky)"],
                                        method=ctx.cfg.method)
    _record_failure(ctx.run_dir, ctx.cfg, "diverged", message, fit.progress)
    return backup.TrainingDiverged(message)


def _stop_with_backup(ctx, fit):
    """A run stopped early with a backup: the folder stays usable (export and linear_eval read the
    encoder of the backed-up weights), metrics.json says "interrupted"; raises TrainingStopped."""
    from uniclr_tf.training import backup
    stopped = fit.stopped
    # (a process of a job stopped by another process's signal stops with that signal's code)
    signum = fit.interrupts.signal or getattr(signal.Signals, str(stopped), signal.SIGTERM)
    code = backup.EXIT_PAUSED if stopped == "stop_after_steps" else 128 + int(signum)
    _save_encoder(ctx)
    if ctx.chief:
        _record_failure(ctx.run_dir, ctx.cfg, "interrupted", stopped, fit.progress)
    else:  # process 0 writes the job's backup
        raise backup.TrainingStopped(f"stopped with the job at step {fit.progress.step} ({stopped}); process 0 "
                                     "saved the backup. Rerun the same command to resume.", code)
    last = fit.writer.last
    if last is None:  # stopped before its first step: nothing to back up
        raise backup.TrainingStopped(f"stopped before the first step ({stopped}); no backup was needed. Rerun "
                                     "the same command to start the run.", code)
    where = (f"after the last step ({last['step']}) of epoch {last['epoch']}, before the final stage"
             if last["epoch"] >= ctx.last_epoch else f"at epoch {last['epoch'] + 1}, step {last['step']}")
    raise backup.TrainingStopped(
        f"stopped {where} ({stopped}); backup saved in "
        f"{os.path.join(ctx.run_dir, backup.BACKUP_DIR)}. Rerun the same command to resume.", code)


def _finish(ctx, ev, fit):
    """The final stage: saves, final kNN, pictures, export, then metrics.json ("finished" is written
    last, after every artefact asked for). Saving a model of a multi-process job is collective (every
    process calls it, in the same order; each writes its own temporary file and the identical results
    are renamed into place)."""
    from uniclr_tf import data
    from uniclr_tf.training import backup
    from uniclr_tf.training import distribute
    from uniclr_tf.training import runs
    cfg, info, run_dir = ctx.cfg, ctx.info, ctx.run_dir
    backup.set_phase(_after_training_phase(fit.writer.last, fit.stopped))
    if fit.stopped is not None:
        _stop_with_backup(ctx, fit)
    clock = ctx.clock
    clock.mark("training")  # the fit's last backup and history written
    _save_encoder(ctx)
    runs.atomic_save(os.path.join(run_dir, "model.weights.h5"), ctx.model.save_weights)
    clock.mark("saving")
    if not ctx.chief:
        distribute.barrier("run finished", ctx.num_processes, ctx.strategy)
        return {"status": "finished", "process_id": ctx.process_id}
    monitor = ev.monitor.seconds if ev.monitor else 0.0
    metrics = {"status": "finished", "method": cfg.method, "epochs": ctx.last_epoch,
               "steps": ctx.last_epoch * ctx.steps_per_epoch,
               "final_loss": fit.history.epochs[-1].get("loss") if fit.history.epochs else None}
    if info.num_classes:
        metrics.update(_final_knn(ctx, ev))
        clock.mark("final_knn")
    skipped = info.skipped_while_streaming()
    if skipped:
        metrics["skipped_while_streaming"] = len(skipped)
        print(f"{cfg.data.dataset}: skipped {len(skipped)} bad image file(s) while streaming (first: {skipped[0]})")
    if cfg.invocation.pictures:
        metrics["pictures"] = _write_pictures(ctx, ev, tensorboard=data.have_tensorflow())
        clock.mark("pictures")
    if cfg.invocation.export:  # before metrics.json: "finished" is written last, after every artefact asked for
        from uniclr_tf.serving.export import export_run
        export_run(run_dir, os.path.join(run_dir, "export"), overwrite=True)
        clock.mark("export")
    # Where this invocation's time went: its phases, whose sum is "wall" (the process's, from its
    # start, under the CLI); "training" holds the fit ("this_invocation") with its kNN monitor
    # ("knn_monitor") and the set-up of its callbacks.
    metrics["seconds"] = {"this_invocation": fit.seconds, "knn_monitor": monitor, **clock.seconds,
                          "wall": sum(clock.seconds.values())}
    print(clock.line(monitor), flush=True)
    runs.atomic_write_json(os.path.join(run_dir, "metrics.json"), metrics)
    distribute.barrier("run finished", ctx.num_processes, ctx.strategy)
    return metrics


def _final_knn(ctx, ev):
    """The final kNN of the encoder next to the raw-pixel baseline (printed): metrics.json's fields."""
    from uniclr_tf.evaluation import knn_eval
    knn, info, raw = ctx.cfg.evaluation, ctx.info, ev.raw
    with ev.local():
        if ev.refresh:
            ev.refresh()
        # with the effective rank: the kNN monitor's compiled program again, not a second one
        ssl = knn_eval(ev.encoder, ev.preprocess, ev.train, ev.test, info.num_classes, knn.knn_k,
                       knn.knn_temperature, batch_size=2048, with_rank=True)
    metrics = dict(knn_top1=ssl["top1"], knn_top5=ssl["top5"], effective_rank=ssl["effective_rank"],
                   raw_pixel_knn_top1=raw["top1"], raw_pixel_knn_top5=raw["top5"],
                   raw_pixel_knn_memory_bank=raw["memory_bank"],
                   knn_memory_bank=min(knn.knn_max_train or info.num_train, info.num_train),
                   knn_test=info.num_test)
    metrics["below_raw_pixel_baseline"] = bool(ssl["top1"] < raw["top1"])
    print(f"kNN top-1 (k={knn.knn_k}, T={knn.knn_temperature}) on the test split: {ssl['top1']:.4f} | "
          f"raw-pixel kNN baseline: {raw['top1']:.4f}"
          + (" | below the raw-pixel baseline: this run learned nothing useful" if ssl["top1"] < raw["top1"]
             else ""))
    return metrics


def _write_pictures(ctx, ev, tensorboard):
    """views.png, neighbours.png, embedding.png (and TensorBoard's), on a sample of a streamed split
    (its first images; their order is shuffled); returns their file names."""
    from uniclr_tf.evaluation import pictures
    from uniclr_tf.data import FASHION_MNIST_CLASSES
    cfg, info = ctx.cfg, ctx.info
    train_images = ev.train if isinstance(ev.train, tuple) else _picture_sample(info, "train", 10000)
    test_images = ev.test if isinstance(ev.test, tuple) else _picture_sample(info, "test", 2000)
    with ev.local():
        drawn = pictures.write_run_pictures(
            ctx.run_dir, ev.encoder, ev.preprocess, ctx.augmenter, train_images, test_images,
            class_names=FASHION_MNIST_CLASSES if cfg.data.dataset == "fashion_mnist" else None,
            tensorboard=tensorboard, batch_size=2048)  # the kNN's batch: its compiled features
    print("pictures: " + "  ".join(v for k, v in drawn.items() if k in ("views", "neighbours", "embedding")))
    return {k: os.path.basename(v) for k, v in drawn.items()}


#: Batch of the evaluation passes over a streamed split (decoded uint8 images in flight).
STREAM_EVAL_BATCH = 256
#: Streamed data: the pictures use at most this many MB of decoded images per split.
PICTURE_SAMPLE_MB = 256


def _eval_source(info, split, max_examples=None):
    """What the kNN evaluations read of a split: its ``(images, labels)`` arrays when in memory
    (views, no copy), else its tf.data batches (read again at each evaluation)."""
    from uniclr_tf import data
    if info.split(split).in_memory:
        return data.as_numpy(info, split, max_examples=max_examples)
    return data.eval_dataset(info, split, STREAM_EVAL_BATCH, max_examples=max_examples)


def _picture_sample(info, split, count):
    """The first ``count`` images of a split as arrays; of a streamed split (read and decoded), at
    most :data:`PICTURE_SAMPLE_MB` of them."""
    from uniclr_tf import data
    if not info.split(split).in_memory:
        height, width, channels = info.image_shape
        count = max(1, min(count, PICTURE_SAMPLE_MB * 2 ** 20 // (height * width * channels)))
    return data.as_numpy(info, split, max_examples=count)


def _write_run_files(run_dir, cfg, augmenter, info, size):
    """``flags.txt`` (replayable), ``config.json`` (with the view recipe used) and ``dataset.json``."""
    from uniclr_tf.training import runs
    os.makedirs(run_dir, exist_ok=True)
    runs.mark_run_folder(run_dir)  # first: what --overwrite recognises as a run of this tool
    runs.atomic_write_text(os.path.join(run_dir, "flags.txt"), cfg.to_flagfile())
    runs.atomic_write_json(os.path.join(run_dir, "config.json"),
                           {**cfg.to_flat(), "views": json.loads(json.dumps(augmenter.get_config(), default=str))})
    runs.atomic_write_json(os.path.join(run_dir, "dataset.json"),
                           {"dataset": cfg.data.dataset, "eval_dataset": cfg.data.eval_dataset,
                            "image_shape": [size, size, info.image_shape[-1]],
                            "num_classes": info.num_classes, "mean": list(map(float, info.mean)),
                            "std": list(map(float, info.std)), "num_train": info.num_train,
                            "num_test": info.num_test, "streamed": not info.in_memory,
                            "test_duplicates_of_train": info.test_duplicates})


def _record_failure(run_dir, cfg, status, reason, progress, at=None, **extra):
    """``metrics.json`` of a run that did not finish: always valid JSON, saying why and where (``at``:
    a backup's state, where a resume would start, instead of ``progress``; ``extra``: more fields)."""
    from uniclr_tf.training import runs
    epoch, step = (at["epoch"] + 1, at["step"]) if at else (progress.epoch + 1, progress.step)
    if at is None and progress.step == progress.initial_step == 0 and status == "interrupted":
        epoch, step = 1, 0
    runs.atomic_write_json(os.path.join(run_dir, "metrics.json"),
                           {"status": status, "reason": reason, "method": cfg.method, "epochs": cfg.optim.epochs,
                            "epoch": epoch, "step": step, **extra})


def _resume_note(state, epochs):
    """`` (resuming at epoch E, step S)``, or what is left of a run whose epochs are all done."""
    if not state:
        return ""
    if state["epoch"] >= epochs:
        return f" (all {epochs} epochs done, step {state['step']}: resuming at the final stage)"
    return f" (resuming at epoch {state['epoch'] + 1}, step {state['step']})"


def _stop_after_one_epoch():
    """A callback that ends ``fit`` after its first epoch: a resumed partial epoch runs with the real
    ``epochs`` (so the progress bar says "Epoch 2/3", not "2/2") and stops there."""
    import keras

    class StopAfterEpoch(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            self.model.stop_training = True
    return StopAfterEpoch()


def _after_training_phase(last, stopped):
    """What a signal during the saves / final stage leaves (:func:`uniclr_tf.training.backup.set_phase`)."""
    if last is None:
        return "no backup yet: rerunning the same command starts the run"
    where = f"the last backup is at epoch {last['epoch'] + 1 if stopped else last['epoch']}, step {last['step']}"
    if stopped:
        return f"{where}: rerun the same command to resume"
    return (f"training is complete and backed up ({where}); the final stage (saves, kNN, pictures, export) is not: "
            "rerun the same command to finish it")


def main(argv):
    from uniclr_tf.training import backup
    from uniclr_tf.training.callbacks import EXIT_COLLAPSED, TrainingCollapsed
    from uniclr_tf.data import DataError, bad_file_message
    from uniclr_tf.training.runs import RunFolderError
    try:
        try:
            cfg = config_from_flags()
        except ValueError as e:  # building the config from the flags: what fails is a flag's value
            raise UsageError(str(e)) from None
        with backup.Interrupts(immediate=True):  # outside training a signal stops at once (training: a backup)
            run_dir, metrics = run(cfg, start_up_seconds=process_age())
        if metrics.get("below_raw_pixel_baseline"):  # the last line a finished run prints says so
            print(f"note: {run_dir} finished, but its kNN top-1 {metrics['knn_top1']:.4f} is below the raw-pixel "
                  f"baseline {metrics['raw_pixel_knn_top1']:.4f}: this encoder learned nothing useful", flush=True)
    except backup.TrainingStopped as e:  # a backup is on disk; rerunning resumes
        print(str(e), flush=True)
        sys.exit(e.exit_code)
    except backup.Interrupted as e:  # one true line of what is left, then 128 + N
        print(f"\nreceived {e}: {backup.phase()}", flush=True)
        sys.exit(e.exit_code)
    except (DataError, RunFolderError, backup.TrainingDiverged) as e:  # one line naming the culprit
        sys.exit(f"error: {e}")
    except TrainingCollapsed as e:  # metrics.json says "collapsed"; the last healthy backup is kept
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(EXIT_COLLAPSED)
    except OSError as e:
        line = write_error_line(e)
        if line is None:
            raise
        sys.exit(line)
    except UsageError as e:  # a bad flag or value, named; any other ValueError is a bug: its traceback
        sys.exit(f"error: {e}")
    except Exception as e:  # a streamed image that fails to decode (tf.data's error carries its name)
        bad = bad_file_message(e)
        if bad is None:
            raise
        sys.exit(f"error: {bad} (found while streaming; --skip_bad_files skips such files)")


def write_error_line(e):
    """The ``error:`` line of a failed write (None for another OSError): a full disk asks for room,
    a permission or read-only refusal names the file and asks for access (or another --run_dir)."""
    where = e.filename or "a file"
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return (f"error: could not write {where} ({e.strerror}): permission denied or a read-only file system; "
                "files written before are intact, including the last backup: make it writable (or pass another "
                "--run_dir) and rerun the same command to resume")
    if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) or "space" in str(e):
        return (f"error: could not write {where} ({e.strerror}); files written before are intact, including the "
                "last backup: make room and rerun the same command to resume")
    return None


#: Lines that TensorFlow's native libraries print while they load, whatever TF_CPP_MIN_LOG_LEVEL says
#: (before their logging is set up): notices a user cannot act on.
NATIVE_IMPORT_NOISE = ("All log messages before absl::InitializeLog() is called", "oneDNN custom operations are on",
                       "cpu_feature_guard", "To enable the following instructions:")


@contextlib.contextmanager
def native_import_notices_dropped(noise=NATIVE_IMPORT_NOISE):
    """Runs the block with the process's stderr (file descriptor 2) held in a temporary file, then
    writes back every line of it but those containing one of ``noise``: Python's own output and any
    error come through whole, after the block."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no file descriptor 2: nothing to filter
        yield
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            lines = held.read().decode(errors="replace").splitlines(keepends=True)
            sys.stderr.write("".join(line for line in lines if not any(n in line for n in noise)))
            sys.stderr.flush()


def entry_point():
    """The ``uniclr-train`` console script (pyproject.toml): what ``python -m uniclr_tf.train`` does."""
    from uniclr_tf.config import flagutil
    with native_import_notices_dropped():  # the flags' definitions import Keras and its backend
        define_flags()
    flagutil.run_cli(__name__, __doc__, main, groups=help_groups())


def help_groups():
    """``--help``'s groups: one per sub-config of ``TrainConfig`` (its ``TITLE``), ``--method`` and
    then the method options in the method's place."""
    from uniclr_tf import methods
    groups = flagutil.section_groups(TrainConfig)
    options = [("method options (unset: the method's default; [methods that take it])", list(methods.option_specs()))]
    at = next(i for i, (title, _) in enumerate(groups) if title == "method") + 1
    return groups[:at] + options + groups[at:]


if __name__ == "__main__":
    entry_point()
