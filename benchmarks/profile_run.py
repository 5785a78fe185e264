"""Where the host's time goes in a real training run: ``train.run`` under cProfile.

    python -m benchmarks.profile_run --out=/tmp/run.prof -- --flagfile=configs/paper/fashion_mnist_simaffinity.flags \
        --augment_on=device --epochs=12 --knn_every=5 --run_dir=/tmp/p --overwrite

Everything after ``--`` goes to the train CLI. Prints the functions with the largest cumulative
time among the epoch-end work (callbacks, backups, history and curve writes, Keras's state sync,
feature extraction, the data stream) and the 25 largest overall; ``--out`` keeps the profile for
``python -m pstats`` or snakeviz. Host-side only: time the device spends computing shows up in the
call that waits for it (a log conversion, ``np.asarray`` of a result).
"""

import argparse
import cProfile
import pstats
import sys

EPOCH_END = ("on_epoch|on_train_batch|snapshot|to_host|write|plot_curves|jax_state_sync|extract_features|"
             "knn_|numpy_batches|pythonify_logs|_flush_futures|atomic_")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="", help="write the cProfile stats here")
    parser.add_argument("--top", type=int, default=30)
    args, train_args = parser.parse_known_args()
    train_args = [a for a in train_args if a != "--"]
    from absl import flags

    from uniclr_tf.training import cli as train
    train.define_flags()
    flags.FLAGS([sys.argv[0], *train_args])
    cfg = train.config_from_flags()
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        train.run(cfg)
    finally:
        profiler.disable()
        if args.out:
            profiler.dump_stats(args.out)
        stats = pstats.Stats(profiler, stream=sys.stdout)
        print("\n== epoch-end work and data stream (cumulative seconds) ==")
        stats.sort_stats("cumulative").print_stats(EPOCH_END, args.top)
        print("\n== overall ==")
        stats.sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
