"""Where the time between two epochs goes in a real training run: ``train.run`` with every piece of
the epoch-end and epoch-start work timed.

    python -m benchmarks.epoch_gap --out=gap.json [--variant=default] -- --flagfile=configs/simaffinity.flags \
        --augment_on=device --epochs=20 --knn_every=0 --run_dir=/tmp/g --overwrite --verbose=2 --nopictures

Everything after ``--`` goes to the train CLI. The *gap* of an epoch is the wall-clock from the end
of its steps (:class:`uniclr_tf.training.callbacks.StepClock`'s ``on_epoch_end``: Keras has fetched the last
step's logs) to the start of the next epoch (``StepClock.on_epoch_begin``): the device is idle then.
Its pieces: each callback's ``on_epoch_end`` (the backup's snapshot apart), the model's
``reset_metrics`` and the ``on_epoch_begin`` hooks. Also timed, in the backup writer's thread (off
the training thread): the fetch to the host, the finite check, the file write. Prints medians (the
first two epochs left out: compiles) and writes them with every sample to ``--out``.

``--variant`` changes one thing, to tell causes apart in one job: ``no_epoch_backup`` (epoch-end
backups skipped, the last one kept), ``one_piece`` (the backup fetched from the device in one
transfer per dtype, without pauses: the code before the fetch was cut into pieces),
``switch_interval_1ms`` (``sys.setswitchinterval(0.001)``: the training thread gets the GIL back
sooner from the writer's thread). Also recorded: each epoch's ``step_seconds`` (a backup fetched
while the steps run may slow them instead).
"""

import argparse
import collections
import json
import statistics
import sys
import time

SAMPLES = collections.defaultdict(list)
PROFILED = ("on_epoch|on_train_batch|snapshot|to_host|write|plot_curves|jax_state_sync|extract_features|"
            "knn_|numpy_batches|pythonify_logs|_flush_futures|atomic_")  # --cprofile: the functions printed
MARKS = collections.defaultdict(list)  # StepClock's epoch ends and begins (perf_counter)


def _timed(owner, name, label):
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            SAMPLES[label].append(time.perf_counter() - start)
    setattr(owner, name, wrapper)


def instrument(variant):
    from keras.src.callbacks import callback_list, history, progbar_logger

    from uniclr_tf.training import backup
    from uniclr_tf.training import callbacks
    from uniclr_tf.nets.model import UniCLR

    _timed(UniCLR, "reset_metrics", "reset_metrics")  # the model's own (one compiled call on JAX)
    try:
        from keras.src.backend.jax import trainer as jax_trainer
        _timed(jax_trainer.JAXTrainer, "jax_state_sync", "keras jax_state_sync (in the steps' time)")
        _timed(jax_trainer.JAXTrainer, "_get_jax_state", "keras _get_jax_state (in the steps' time)")
    except ImportError:
        pass
    _timed(callback_list.CallbackList, "on_epoch_begin", "on_epoch_begin, every callback")
    for cls in (callbacks.KNNMonitor, callbacks.HistoryRecorder, callbacks.CollapseDetector, backup.BackupCallback,
                progbar_logger.ProgbarLogger, history.History):
        _timed(cls, "on_epoch_end", f"{cls.__name__}.on_epoch_end")
    _timed(backup, "snapshot", "  of which backup.snapshot")
    _timed(backup.Writer, "submit", "  of which Writer.submit")
    _timed(backup, "to_host", "writer thread: to_host")
    _timed(backup, "non_finite_weights", "writer thread: finite check")
    _timed(backup, "write", "writer thread: npz + state.json")

    clock_end, clock_begin = callbacks.StepClock.on_epoch_end, callbacks.StepClock.on_epoch_begin

    def on_epoch_end(self, epoch, logs=None):
        clock_end(self, epoch, logs)
        MARKS["end"].append(time.perf_counter())
        if logs and "step_seconds" in logs:
            SAMPLES["steps of an epoch (step_seconds)"].append(logs["step_seconds"])

    def on_epoch_begin(self, epoch, logs=None):
        MARKS["begin"].append(time.perf_counter())
        clock_begin(self, epoch, logs)
    callbacks.StepClock.on_epoch_end, callbacks.StepClock.on_epoch_begin = on_epoch_end, on_epoch_begin

    if variant == "no_epoch_backup":
        original = backup.BackupCallback.on_epoch_end

        def skip(self, epoch, logs=None):
            if epoch + 1 < int((self.params or {}).get("epochs", 0)):
                self.progress.step = (epoch + 1) * self.progress.steps_per_epoch
                return None
            return original(self, epoch, logs)
        backup.BackupCallback.on_epoch_end = skip
    elif variant == "one_piece":
        backup.CHUNK_BYTES, backup.FETCH_PAUSE_S = 1 << 62, 0.0
    elif variant == "switch_interval_1ms":
        sys.setswitchinterval(0.001)
    elif variant != "default":
        raise SystemExit(f"unknown --variant {variant!r}")


def summary(skip=2):
    gaps = [b - e for e, b in zip(MARKS["end"], MARKS["begin"][1:])]
    rows = {"gap between epochs (device idle)": gaps}
    rows.update(SAMPLES)
    table = {}
    for name, values in rows.items():
        kept = values[skip:] if len(values) > skip + 2 else values
        if kept:
            table[name] = {"n": len(kept), "median_ms": 1e3 * statistics.median(kept), "max_ms": 1e3 * max(kept)}
    return table, {k: list(v) for k, v in rows.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="", help="write the table and the samples here (JSON)")
    parser.add_argument("--variant", default="default", choices=("default", "no_epoch_backup", "one_piece", "switch_interval_1ms"))
    parser.add_argument("--cprofile", default="", metavar="FILE",
                        help="also run train.run under cProfile: the stats to FILE (python -m pstats, snakeviz) and "
                             "the functions of the epoch-end work and the data stream by cumulative time printed")
    args, train_args = parser.parse_known_args()
    train_args = [a for a in train_args if a != "--"]
    from absl import flags

    from uniclr_tf.training import cli as train
    train.define_flags()
    flags.FLAGS([sys.argv[0], *train_args])
    cfg = train.config_from_flags()
    instrument(args.variant)
    start = time.perf_counter()
    from uniclr_tf.training import backup
    profiler = None
    if args.cprofile:
        import cProfile
        profiler = cProfile.Profile()
        profiler.enable()
    try:
        train.run(cfg)
    except backup.TrainingStopped as e:  # --stop_after_steps: the epochs measured are enough
        print(e)
    finally:
        if profiler is not None:
            import pstats
            profiler.disable()
            profiler.dump_stats(args.cprofile)
            print("\n== epoch-end work and data stream (cumulative seconds) ==")
            pstats.Stats(profiler, stream=sys.stdout).sort_stats("cumulative").print_stats(PROFILED, 30)
        table, samples = summary()
        print(f"\n== epoch boundaries, variant {args.variant} (medians without the first two epochs) ==")
        print(f"{'':58s} {'n':>4s} {'median ms':>10s} {'max ms':>9s}")
        for name, row in table.items():
            print(f"{name:58s} {row['n']:4d} {row['median_ms']:10.2f} {row['max_ms']:9.2f}")
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"variant": args.variant, "train_args": train_args, "table": table, "samples": samples,
                           "process_seconds": time.perf_counter() - start}, f, indent=1)


if __name__ == "__main__":
    main()
