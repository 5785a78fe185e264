"""Training callbacks: the kNN monitor, the history / log / curves recorder, a step clock, the
collapse detector and a step profiler.

Those that implement ``on_train_batch_end`` declare ``async_safe``: Keras then dispatches the per-step
hook off the training thread instead of converting every step's logs to Python numbers (a device sync)."""

import contextlib
import math
import os
import threading
import time

import keras
import numpy as np

from uniclr_tf.training import runs
from uniclr_tf.training.curves import plot_curves, start_drawing
from uniclr_tf.evaluation import knn_eval


class KNNMonitor(keras.callbacks.Callback):
    """Weighted kNN top-1 of the backbone on the test split every ``every`` epochs.

    Writes ``knn_top1``/``knn_top5`` and the backbone features' ``effective_rank`` on the test split
    (:func:`uniclr_tf.evaluation.effective_rank`: near 1 for a collapsed representation) into the
    epoch logs (so TensorBoard and CSVLogger placed after it record them) and keeps the history in
    ``self.history``. ``train`` (the memory bank) and ``test`` are ``(uint8 images, labels)``;
    ``preprocess`` maps the images to the encoder's inputs (:class:`uniclr_tf.EvalPreprocess`).

    Examples:
        >>> monitor = uniclr_tf.KNNMonitor(model.encoder, uniclr_tf.EvalPreprocess(32), (train_x, train_y),
        ...                                (test_x, test_y), num_classes=10, every=5, k=20)
        >>> model.fit(train_x, batch_size=256, epochs=50, callbacks=[monitor])  # logs knn_top1 every 5 epochs
    """

    def __init__(self, encoder, preprocess, train, test, num_classes, every=1, k=200, temperature=0.1,
                 batch_size=2048, refresh=None, context=None):
        super().__init__()
        self.refresh = refresh  # called before each evaluation (e.g. copies weights into a local encoder)
        self.context = context or contextlib.nullcontext  # around each evaluation (e.g. local devices only)
        self.batch_size = batch_size  # large batches: fewer host round trips when extracting features
        self.encoder, self.preprocess = encoder, preprocess
        self.train, self.test, self.num_classes = train, test, num_classes
        self.every, self.k, self.temperature = every, k, temperature
        self.history = []
        self.seconds = 0.0  # time spent evaluating (reported apart from training time)

    def on_epoch_end(self, epoch, logs=None):
        if self.every <= 0 or (epoch + 1) % self.every:
            return
        start = time.perf_counter()
        with self.context():
            if self.refresh is not None:
                self.refresh()
            acc = knn_eval(self.encoder, self.preprocess, self.train, self.test, self.num_classes,
                           self.k, self.temperature, batch_size=self.batch_size, with_rank=True)
        seconds = time.perf_counter() - start
        self.seconds += seconds
        self.history.append({"epoch": epoch + 1, **acc})
        if logs is not None:
            logs["knn_top1"], logs["knn_top5"] = acc["top1"], acc["top5"]
            logs["effective_rank"] = acc["effective_rank"]
            logs["knn_seconds"] = seconds
        print(f"epoch {epoch + 1}: kNN top-1 {acc['top1']:.4f}  top-5 {acc['top5']:.4f}", flush=True)


class StepClock(keras.callbacks.Callback):
    """Adds ``step_seconds`` to each epoch's logs: the wall-clock from the epoch's start to the end
    of its last step (Keras has fetched the step's results by then). Put it first, so no other
    callback's epoch-end work counts; the rest of an epoch's wall-clock is spent outside the steps
    (the kNN monitor, backups, history, the first step's compile is inside the first epoch)."""

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None and hasattr(self, "_start"):
            logs["step_seconds"] = time.perf_counter() - self._start


def start_trace(log_dir):
    """Starts the backend's profiler into ``log_dir``: on JAX ``jax.profiler`` with a Perfetto trace
    (``python -m benchmarks.report trace`` reads it) and without Python events, on TensorFlow
    ``tf.profiler``."""
    os.makedirs(log_dir, exist_ok=True)
    if keras.backend.backend() == "jax":
        import jax
        options = jax.profiler.ProfileOptions()
        options.python_tracer_level = 0  # with Python events, 13-ms steps took 22 ms: a false timeline
        jax.profiler.start_trace(log_dir, create_perfetto_trace=True, profiler_options=options)
    else:
        import tensorflow as tf
        tf.profiler.experimental.start(log_dir)


def stop_trace():
    """Stops the profiler :func:`start_trace` started; the trace is written then."""
    if keras.backend.backend() == "jax":
        import jax
        jax.profiler.stop_trace()
    else:
        import tensorflow as tf
        tf.profiler.experimental.stop()


class StepProfiler(keras.callbacks.Callback):
    """Traces optimizer steps ``first..last`` of this invocation (counted from 1) with the backend's
    profiler into ``log_dir``: on JAX ``jax.profiler`` (TensorBoard's profile plus a Perfetto trace,
    ``*.trace.json.gz``, that https://ui.perfetto.dev opens), on TensorFlow ``tf.profiler``.

    The trace starts before step ``first`` is dispatched and stops once step ``last``'s results reached
    the host (``on_train_batch_end`` gets them as Python numbers), so it holds whole steps; it declares
    ``async_safe`` so that Keras keeps dispatching steps ahead of the device, as without it (a
    per-step sync would change what is measured). A trace still open at the epoch's end stops there."""

    async_safe = True

    def __init__(self, log_dir, first, last):
        super().__init__()
        if not 1 <= first <= last:
            raise ValueError(f"StepProfiler: expected 1 <= first <= last; received {first}, {last}")
        self.log_dir, self.first, self.last = log_dir, int(first), int(last)
        self._begun = 0  # steps dispatched by this invocation
        self._offset = 0  # steps dispatched by this invocation before the current epoch
        self._state = "waiting"  # -> "tracing" -> "done"
        self._lock = threading.Lock()

    def on_epoch_begin(self, epoch, logs=None):
        self._offset = self._begun

    def on_train_batch_begin(self, batch, logs=None):
        self._begun += 1
        if self._begun == self.first and self._state == "waiting":
            start_trace(self.log_dir)
            self._state = "tracing"
            print(f"profiler: tracing steps {self.first}..{self.last} into {self.log_dir}", flush=True)

    def on_train_batch_end(self, batch, logs=None):
        if self._offset + int(batch) + 1 >= self.last:  # (this thread may run behind the dispatching one)
            self._stop()

    def on_epoch_end(self, epoch, logs=None):
        self._stop()

    def on_train_end(self, logs=None):
        self._stop()

    def _stop(self):
        with self._lock:
            if self._state != "tracing":
                return
            self._state = "done"
        stop_trace()
        print(f"profiler: trace written to {self.log_dir}", flush=True)


class EpochTensorBoard(keras.callbacks.TensorBoard):
    """Keras's TensorBoard callback with per-epoch scalars (``epoch_<name>``) and, every
    ``every_steps`` optimizer steps, per-step scalars (``step_<name>``: the epoch's running means so
    far, as Keras's own per-batch summaries are), written at the epoch's end.

    Keras's callback writes per-step summaries from ``on_train_batch_end`` through ``tf.summary``;
    here that hook only records the step's logs (already Python numbers) and is declared safe for
    Keras's asynchronous dispatch (JAX): the training thread never waits for it, and TensorFlow is
    called from the main thread alone (Keras's hook converting JAX arrays to TF tensors in the
    dispatch thread crashed a 2-device JAX run). ``initial_step`` numbers a resumed run's steps.
    """

    async_safe = True

    def __init__(self, log_dir, every_steps=0, steps_per_epoch=1, initial_step=0, **kwargs):
        kwargs.setdefault("update_freq", "epoch")
        if kwargs["update_freq"] != "epoch":
            raise ValueError("EpochTensorBoard writes per-step scalars itself (every_steps); keep update_freq='epoch'")
        super().__init__(log_dir, **kwargs)
        self.every_steps, self.steps_per_epoch = int(every_steps), int(steps_per_epoch)
        self.initial_step = int(initial_step)
        self._pending = []  # (global step, {name: value}) recorded since the last epoch end
        self._epoch_begin_step = self.initial_step

    def on_epoch_begin(self, epoch, logs=None):
        super().on_epoch_begin(epoch, logs)
        self._epoch_begin_step = max(epoch * self.steps_per_epoch, self.initial_step)

    def on_train_batch_end(self, batch, logs=None):
        step = self._epoch_begin_step + int(batch) + 1  # optimizer steps done
        if self.every_steps > 0 and step % self.every_steps == 0 and logs:
            self._pending.append((step, {k: float(v) for k, v in logs.items() if np.ndim(v) == 0}))

    def _collect_learning_rate(self, logs):
        """Keras's ``epoch_learning_rate``, read on the host: a schedule with ``host_value``
        (:class:`uniclr_tf.training.schedules.WarmupCosine`) is evaluated in NumPy at the optimizer's step
        counter; Keras evaluates it in ``keras.ops``, a dozen XLA compiles on JAX at the first epoch's
        end. Other optimizers and schedules: Keras's way."""
        optimizer = self.model.optimizer
        optimizer = getattr(optimizer, "inner_optimizer", optimizer)  # a LossScaleOptimizer's
        schedule = getattr(optimizer, "_learning_rate", None)
        if not hasattr(schedule, "host_value") or hasattr(optimizer, "optimizers"):
            return super()._collect_learning_rate(logs)
        logs["learning_rate"] = schedule.host_value(int(np.asarray(optimizer.iterations.value)))
        return logs

    def on_epoch_end(self, epoch, logs=None):
        pending, self._pending = self._pending, []
        if pending:
            import tensorflow as tf
            with self._train_writer.as_default():
                for step, values in pending:
                    for name, value in values.items():
                        tf.summary.scalar(f"step_{name}", value, step=step)
        super().on_epoch_end(epoch, logs)


def _finite_or_none(value):
    value = float(np.asarray(value))
    return value if math.isfinite(value) else None


#: Exit status of a run stopped by :class:`CollapseDetector` (``--on_collapse=stop``).
EXIT_COLLAPSED = 3
#: The folder of a run that keeps its last backup verified healthy (a ``backup/`` inside, as the run's own).
HEALTHY_DIR = "healthy"


class TrainingCollapsed(Exception):
    """The representation collapsed (:class:`CollapseDetector`); ``epoch`` and ``signal`` say when and how."""

    def __init__(self, message, epoch, signal, healthy_epoch=None):
        super().__init__(message)
        self.epoch, self.signal, self.healthy_epoch = epoch, signal, healthy_epoch


class CollapseDetector(keras.callbacks.Callback):
    """Stops (or warns about) a run whose representation collapses, at the epoch end where it shows.

    Two signals, chosen on the histories of this project's Fashion-MNIST runs of every shipped method
    (docs: "collapse detection"); either one fires:

    * ``std``: the embedding std (:func:`uniclr_tf.objectives.embedding_std`, about ``1/sqrt(D)`` when
      spread out) below ``std_fraction / sqrt(D)`` after the first epoch, and at the end of a run's
      last epoch whichever it is (a one-epoch run is checked too). Healthy runs stayed above
      0.14/sqrt(D) (the whitening objectives, whose projector outputs are low-rank before whitening,
      are the lowest); SimCLR with a symmetric loss that collapsed it fell to 0.008/sqrt(D).
    * ``knn``: a kNN-monitor reading below the raw-pixel kNN baseline by more than ``knn_margin``,
      once the warm-up (and at least ``min_epochs`` epochs) is over, or once the reading fell that far
      below the run's best. Collapsed runs read 0.38-0.58 against a raw-pixel 0.79; healthy ones never
      fell 0.10 below it after their warm-up. (An encoder that has not learned yet, a few steps into a
      run, can read far below raw pixels without a drop: it is not stopped.)

    At every kNN reading that passes, the backup of that epoch (or the latest before it) is kept aside
    in ``RUN/healthy/backup/`` (hard links: no copy), so a collapsed run can be restarted from before
    the collapse with other flags (``--resume_from=RUN/healthy``). Put it after the kNN monitor (it
    reads its ``knn_top1``) and after the backup callback (the epoch's backup is then written).
    In a plain ``fit`` (no ``run_dir``), ``on_collapse="stop"`` raises :class:`TrainingCollapsed`
    and ``"warn"`` prints one line.

    Examples:
        >>> monitor = uniclr_tf.KNNMonitor(model.encoder, preprocess, train, test, num_classes=10)
        >>> detector = uniclr_tf.CollapseDetector(embedding_dim=128, raw_pixel_top1=0.78, warmup_epochs=10)
        >>> model.fit(images, epochs=100, callbacks=[monitor, detector])  # stops when the embeddings collapse
    """

    def __init__(self, embedding_dim, raw_pixel_top1=None, warmup_epochs=0, on_collapse="stop", run_dir=None,
                 writer=None, std_fraction=0.02, knn_margin=0.10, min_epochs=5):
        super().__init__()
        self.healthy_std = 1.0 / math.sqrt(embedding_dim)
        self.raw = raw_pixel_top1
        self.warmup_epochs = float(warmup_epochs)
        self.on_collapse = on_collapse
        self.run_dir, self.writer = run_dir, writer
        self.std_fraction, self.knn_margin, self.min_epochs = std_fraction, knn_margin, min_epochs
        self.best_knn = None
        self.healthy_epoch = None  # the last epoch whose kNN reading passed

    def _last_epoch(self, epoch):
        """Whether ``epoch`` (0-based) is the last one ``fit`` runs."""
        epochs = (self.params or {}).get("epochs")
        return bool(epochs) and epoch + 1 >= int(epochs)

    def signal(self, epoch, logs):
        """The signal that fires at the end of (0-based) ``epoch``, as a phrase, or None."""
        std = logs.get("embedding_std")
        if std is not None and (epoch >= 1 or self._last_epoch(epoch)) and math.isfinite(float(std)):
            if float(std) < self.std_fraction * self.healthy_std:
                return (f"embedding std {float(std):.2e}, below {self.std_fraction} x the {self.healthy_std:.3f} of "
                        "spread-out embeddings")
        knn = logs.get("knn_top1")
        if knn is None or self.raw is None:
            return None
        knn = float(knn)
        low = knn < self.raw - self.knn_margin
        # a drop counts from a reading that had learned something (not the noise of an untrained encoder)
        dropped = (self.best_knn is not None and self.best_knn >= self.raw - self.knn_margin
                   and knn < self.best_knn - self.knn_margin)
        if low and (epoch + 1 > max(self.warmup_epochs, self.min_epochs) or dropped):
            best = f", down from {self.best_knn:.4f}" if self.best_knn is not None else ""
            return (f"kNN top-1 {knn:.4f}{best}, more than {self.knn_margin:.2f} below the raw-pixel baseline "
                    f"{self.raw:.4f}")
        return None

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        signal = self.signal(epoch, logs)
        knn = logs.get("knn_top1")
        if signal is None:
            if knn is not None:
                self.best_knn = max(float(knn), self.best_knn or 0.0)
                self.healthy_epoch = epoch + 1
                self._keep_healthy_backup()
            return
        line = (f"collapse at epoch {epoch + 1}: {signal}. Likely causes: a symmetric-loss weight too large for "
                "this set-up (--gamma; in Python the method option symmetric_loss_weight), a learning rate too high "
                "(--base_learning_rate) or too short a warm-up (--warmup_epochs; in Python the optimizer's "
                "schedule), a method that needs its predictor or EMA target (--predictor, --ema_momentum; "
                "options of the same names)")
        if self.on_collapse == "warn":
            print(f"warning: {line}", flush=True)
            return
        if self.healthy_epoch is not None and self.run_dir:
            line += (f". The last healthy backup (epoch {self.healthy_epoch}) is kept in "
                     f"{os.path.join(self.run_dir, HEALTHY_DIR)}: restart from it with other flags, "
                     f"--resume_from={os.path.join(self.run_dir, HEALTHY_DIR)} --run_name=NEW_NAME")
        raise TrainingCollapsed(line, epoch + 1, signal.split(",")[0], self.healthy_epoch)

    def _keep_healthy_backup(self):
        """Links the latest backup (this epoch's, once written) into ``RUN/healthy/backup/``."""
        if self.writer is None or not self.run_dir or not self.writer.enabled:
            return
        from uniclr_tf.training import backup
        self.writer.wait()
        state = self.writer.last
        if state is None:
            return
        source = os.path.join(self.run_dir, backup.BACKUP_DIR)
        folder = os.path.join(self.run_dir, HEALTHY_DIR, backup.BACKUP_DIR)
        os.makedirs(folder, exist_ok=True)
        target = os.path.join(folder, state["weights"])
        if not os.path.exists(target):
            tmp = target + ".tmp"
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
            try:
                os.link(os.path.join(source, state["weights"]), tmp)
            except OSError:  # another file system, or no hard links there
                import shutil
                shutil.copyfile(os.path.join(source, state["weights"]), tmp)
            os.replace(tmp, target)
        runs.atomic_write_json(os.path.join(folder, backup.STATE_FILE), dict(state, healthy_epoch=self.healthy_epoch))
        for old in os.listdir(folder):
            if old.startswith("weights-") and old != state["weights"]:
                os.remove(os.path.join(folder, old))


def has_accelerator():
    """Whether the Keras backend sees a GPU or TPU (False on a machine with CPUs only)."""
    if keras.backend.backend() == "jax":
        import jax
        return any(d.platform != "cpu" for d in jax.devices())
    import tensorflow as tf
    return bool(tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("TPU"))


def duration_text(seconds):
    """``seconds`` in words a person reads at a glance: minutes, hours or days."""
    if seconds < 90 * 60:
        return f"{max(seconds / 60, 1):.0f} minutes"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} hours"
    return f"{seconds / 86400:.1f} days"


class LongRunNotice(keras.callbacks.Callback):
    """On a machine with CPUs only, one line after the first steps when the whole run will take hours:
    the measured time of a step, the estimated time of the run and ``hint`` (where to find a recipe
    sized for the machine). The first step (tracing and compiling) is not measured: the next
    ``measure_steps`` are. Nothing is printed on a machine with a GPU or TPU, nor for a
    run estimated under ``threshold_s``.

    Works in ``on_train_batch_begin`` (no per-step log conversion); the measured steps end with one
    read of a weight, so that the time of a step dispatched ahead (JAX) is the time it took."""

    def __init__(self, total_steps, initial_step=0, hint="", threshold_s=3600.0, measure_steps=1, accelerated=None,
                 clock=time.monotonic, print_fn=print):
        super().__init__()
        self.total_steps, self.initial_step = int(total_steps), int(initial_step)
        self.hint, self.threshold_s, self.measure_steps = hint, float(threshold_s), max(int(measure_steps), 1)
        self._accelerated = accelerated
        self.clock, self.print_fn = clock, print_fn
        self._epoch_start_step = self.initial_step
        self._start = None  # (step, time) at the end of the first step of this fit
        self.estimate_s = None  # the estimated seconds of the remaining run, once measured
        self.done = False

    def on_epoch_begin(self, epoch, logs=None):
        steps = int((self.params or {}).get("steps") or 0)
        self._epoch_start_step = max(epoch * steps, self.initial_step) if steps else self._epoch_start_step

    def _sync(self):
        variables = self.model.trainable_variables
        if variables:
            np.asarray(keras.ops.convert_to_numpy(variables[0].value))

    def on_train_batch_begin(self, batch, logs=None):
        if self.done:
            return
        if self._accelerated is None:
            self._accelerated = has_accelerator()
        if self._accelerated:
            self.done = True
            return
        step = self._epoch_start_step + batch  # the steps done before this batch
        if step == self.initial_step:
            return  # the first step: it traces and compiles
        if self._start is None:
            self._sync()
            self._start = (step, self.clock())
            return
        if step - self._start[0] < self.measure_steps:
            return
        self._sync()
        per_step = (self.clock() - self._start[1]) / (step - self._start[0])
        self.done = True
        left = max(self.total_steps - step, 0)
        self.estimate_s = per_step * left
        if self.estimate_s >= self.threshold_s:
            self.print_fn(f"note: {per_step:.2f} s a step on this machine's CPU: the {left:,} steps left of this "
                          f"run will take about {duration_text(self.estimate_s)}. {self.hint}".rstrip(), flush=True)


class BackupAndResume(keras.callbacks.Callback):
    """Backs the whole training state up into ``directory`` at every epoch end, and resumes from it
    when ``fit`` starts again: a ``fit`` that was interrupted (killed, a crash, a time limit) continues
    from its last finished epoch with the same weights, EMA target, method state, optimizer state and
    step counter (so the learning-rate and EMA schedules go on where they were).

    Give the same callback (or one on the same ``directory``) to the ``fit`` that resumes, on a model
    built and compiled the same way, with the same ``epochs``; with arrays or a dataset of known
    length Keras knows the steps of an epoch (for an endless dataset pass ``steps_per_epoch``). The
    backup is written off the training thread, atomically (a kill at any instant leaves a usable
    one), checked for NaN first, and the one before it is kept until the next is on disk; an epoch
    end that would wait for the previous backup, still being written, is skipped (never the last). On JAX the
    views' random state is in the backup too, and a resumed fit computes what the uninterrupted one
    would have; so it does on TensorFlow with a seeded ``ViewAugmenter`` as the model's augmenter (its
    views keyed by seed, step and replica). A tf.data map is the caller's: keyed by batch
    (``pretrain_dataset(..., augment_seed=)``) it resumes exactly too, otherwise it draws other crops.
    Arrays keep their batches: ``UniCLR.fit`` orders epoch ``e``'s rows by ``e`` and the seeded
    augmenter's seed (else a seed drawn from NumPy's generator at the model's first fit).

    Examples:
        >>> backup = uniclr_tf.BackupAndResume("checkpoints/run1")
        >>> model.fit(images, batch_size=256, epochs=100, callbacks=[backup])  # stopped during epoch 37
        >>> model.fit(images, batch_size=256, epochs=100, callbacks=[backup])  # resumes at epoch 37

    Args:
      directory: the folder of the backup (created; ``directory/backup/``).
      verbose: print one line when resuming.
    """

    def __init__(self, directory, verbose=True):
        super().__init__()
        if not isinstance(directory, (str, os.PathLike)) or not str(directory):
            raise TypeError(f"directory: expected a folder path; received {directory!r}")
        self.directory = os.fspath(directory)
        self.verbose = bool(verbose)
        self.resumed_from = None  # the state of the backup the last fit resumed from (epoch, step)
        self._inner = None

    def on_train_begin(self, logs=None):
        from uniclr_tf.training import backup
        steps = (self.params or {}).get("steps")
        if not steps:
            raise ValueError("BackupAndResume needs the steps of an epoch: pass steps_per_epoch to fit when the "
                             "data has no known length")
        os.makedirs(self.directory, exist_ok=True)
        if self._inner is not None:  # this callback's last fit may still be writing (it stopped on an error)
            self._inner.writer.wait(raise_error=False)
        state = backup.latest(self.directory)
        self.resumed_from = None
        if state is not None:
            if state["step"] != state["epoch"] * steps:
                raise ValueError(f"BackupAndResume: the backup in {self.directory} is at step {state['step']}, which "
                                 f"is not the end of an epoch of {steps} steps: resume with the batch size and data "
                                 "it was made with")
            self._restore(state)
            self.model._initial_epoch = int(state["epoch"])  # read by Keras' fit (as by keras.callbacks.BackupAndRestore)
            self.resumed_from = {"epoch": int(state["epoch"]), "step": int(state["step"])}
            if self.verbose:
                print(f"resuming from {os.path.join(self.directory, backup.BACKUP_DIR)}: {state['epoch']} epochs "
                      f"({state['step']} steps) done", flush=True)
        writer = backup.Writer(self.directory, last=state)
        progress = backup.Progress(steps, state["step"] if state else 0)
        self._inner = backup.BackupCallback(writer, progress, every_s=float("inf"))
        self._inner.set_model(self.model)
        self._inner.set_params(self.params)

    def _restore(self, state):
        """Loads the backup ``state`` into the model, variable by variable in the model's order; the
        names must match but for the numbers Keras appends to make names unique in a process (a second
        model built in the same process has other ones)."""
        import re
        from uniclr_tf.training import backup
        variables = backup._variables(self.model)
        with np.load(os.path.join(self.directory, backup.BACKUP_DIR, state["weights"])) as data:
            keys = sorted(k for k in data.files if k != backup.STATE_KEY)
            arrays = [data[k] for k in keys]
        unnumbered = lambda path: re.sub(r"_\d+(?=/|$)", "", path)  # noqa: E731
        mismatch = len(keys) != len(variables) or next(
            ((k, v) for k, v, a in zip(keys, variables, arrays)
             if unnumbered(k.split("|", 1)[1]) != unnumbered(v.path) or tuple(a.shape) != tuple(v.shape)), None)
        if mismatch:
            what = (f"{len(keys)} arrays for {len(variables)} variables" if mismatch is True else
                    f"{mismatch[0].split('|', 1)[1]} where the model has {mismatch[1].path} {tuple(mismatch[1].shape)}")
            raise ValueError(f"BackupAndResume: the backup in {self.directory} is of another model ({what}); build "
                             "and compile the model as it was, or use another directory")
        for variable, array in zip(variables, arrays):
            variable.assign(array)

    def on_epoch_begin(self, epoch, logs=None):
        self._inner.on_epoch_begin(epoch, logs)

    def on_train_batch_begin(self, batch, logs=None):
        self._inner.on_train_batch_begin(batch, logs)

    def on_epoch_end(self, epoch, logs=None):
        self._inner.on_epoch_end(epoch, logs)

    def on_train_end(self, logs=None):
        if self.resumed_from is not None:
            self.model._initial_epoch = None  # a later fit starts where it is told
        if self._inner is not None:
            self._inner.writer.wait()  # the last epoch's backup is on disk (an error in writing it is raised)


class HistoryRecorder(keras.callbacks.Callback):
    """Keeps every epoch's logs (and its wall-clock seconds); writes ``history.json`` and ``log.csv``
    every epoch and ``curves.png`` at the end and, during training, every ``plot_every_s`` seconds (the
    first ``plot_every_s`` after it is created: a run shorter than that draws its curves once).
    Non-finite values are written as null (strict JSON) and as empty CSV cells.

    The files are written by a background thread, one epoch after the other: two atomic writes with
    fsync (3–5 ms an epoch on the development machine's disk, more where fsync is slow, as on network
    file systems), which the next epoch's steps need not wait for. An error (a full disk) is raised
    at the next epoch end. The epoch's backup waits for them
    (:meth:`pending_write`, given to :class:`uniclr_tf.training.backup.BackupCallback`), so a resumed run's
    history holds every backed-up epoch. During training the curves are drawn by a child process
    (:func:`uniclr_tf.training.curves.start_drawing`: about a second of matplotlib, which in a thread
    would hold the GIL and starve the device of steps), skipped while the previous drawing is still going
    on; the last drawing, at the end, in the training thread.

    ``epochs`` continues an earlier history (a resumed run). ``title`` heads the plot;
    ``reference`` is drawn as a dashed line on the accuracy panel (e.g. ``{"raw-pixel kNN": 0.75}``).
    """

    def __init__(self, run_dir, title="", plot_every_s=60.0, reference=None, epochs=()):
        super().__init__()
        self.run_dir, self.title = run_dir, title
        self.plot_every_s = plot_every_s
        self.reference = dict(reference or {})
        self.epochs = list(epochs)
        self._last_plot = time.monotonic()
        self._plotter = None  # the child process drawing the curves, if any
        self._files_pool = None  # one worker: history.json and log.csv, epoch after epoch
        self._files = None  # the Future of the last history.json + log.csv write submitted
        self._files_error = None  # the first error of a background write, not raised yet
        self._created = self._epoch_start = time.perf_counter()

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        entry = {"epoch": epoch + 1, **{k: _finite_or_none(v) for k, v in (logs or {}).items()}}
        now = time.perf_counter()
        entry["epoch_seconds"] = now - self._epoch_start
        entry["wall_seconds"] = now - self._created  # since this invocation set up its callbacks
        self.epochs.append(entry)
        self._raise_failed_write()
        if self._files_pool is None:
            from concurrent.futures import ThreadPoolExecutor
            self._files_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="history-writer")
        self._files = self._files_pool.submit(self._write_files_in_background, list(self.epochs))
        if time.monotonic() - self._last_plot >= self.plot_every_s and not self.drawing:
            self._plot(background=True)

    def on_train_end(self, logs=None):
        self.write(plot=True)

    def pending_write(self):
        """A callable that blocks until the files of every epoch recorded so far are written (raising
        the write's error), or None when nothing is being written. Called in the training thread; what
        it returns may run in another (the backup writer's, before it writes the epoch's backup)."""
        future = self._files
        if future is None:
            return None
        return future.result

    def _raise_failed_write(self):
        error, self._files_error = self._files_error, None
        if error is not None:
            raise error  # a background write's error (the first), here in the training thread

    def _write_files_in_background(self, epochs):
        try:
            self._write_files(epochs)
        except BaseException as e:
            if self._files_error is None:
                self._files_error = e
            raise

    def _write_files(self, epochs):
        runs.atomic_write_json(os.path.join(self.run_dir, "history.json"), epochs, indent=1)
        runs.atomic_write_text(os.path.join(self.run_dir, "log.csv"), history_csv(epochs))

    @property
    def drawing(self):
        """True while the curves of an earlier epoch are being drawn in the background."""
        return self._plotter is not None and self._plotter.poll() is None

    def wait(self):
        """Waits for the background writes and drawing, if any (without raising their errors: called
        while another may be on its way; :meth:`write` raises them)."""
        self._drain_writes()
        self._join_plotter()

    def _drain_writes(self):
        """Waits for the background history writes still queued and stops their thread."""
        if self._files_pool is not None:
            self._files_pool.shutdown(wait=True)
            self._files_pool = None
        self._files = None

    def _join_plotter(self):
        if self._plotter is not None:
            self._plotter.wait()
            self._plotter = None

    def write(self, plot=True):
        """Writes history.json and log.csv now (after the background writes, whose error it raises),
        and (``plot``) the curves, after any drawing still going on."""
        self._drain_writes()
        self._raise_failed_write()
        self._write_files(self.epochs)
        if plot:
            self._plot(background=False)

    def _plot(self, background):
        self._last_plot = time.monotonic()
        args = (list(self.epochs), os.path.join(self.run_dir, "curves.png"), self.title, self.reference)
        self._join_plotter()
        if background:
            self._plotter = start_drawing(*args)
        else:
            plot_curves(*args)


def history_csv(epochs):
    """``log.csv`` of a history: one row per epoch, one column per key seen (no all-empty columns)."""
    keys = list(dict.fromkeys(k for e in epochs for k in e))
    lines = [",".join(keys)]
    for e in epochs:
        lines.append(",".join("" if e.get(k) is None else repr(e[k]) for k in keys))
    return "\n".join(lines) + "\n"


