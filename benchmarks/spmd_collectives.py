"""What crosses between devices in one data-parallel train step: the collectives XLA compiled.

    python -m benchmarks.spmd_collectives --devices=2 -- --flagfile=configs/paper/fashion_mnist_simaffinity.flags \
        --batch_size=1024 [train flags...]

Builds the real training model of ``python -m uniclr_tf.train --strategy=data_parallel`` (JAX,
``keras.distribution.DataParallel``) over ``--devices`` devices (CPU devices are made with
``--xla_force_host_platform_device_count`` when no accelerator is there: the partitioning is the
same; only the timings are not), compiles Keras's train step for the first batch and lists every
collective of the optimised program (all-reduce, all-gather, reduce-scatter, all-to-all,
collective-permute) with its shape and bytes, grouped by op and shape, plus the totals. Prints a
table and writes JSON (``--out``). The step is compiled, never run.

What to look for: the gradient all-reduce (about the parameter bytes), small all-reduces of the
batch-norm statistics (global BN), an all-gather of the embeddings for the global loss, and nothing
of the size of activations: a collective moving activations means the partitioner resharded
the batch (e.g. around concatenating the views).
"""

import argparse
import collections
import json
import os
import re
import sys

from benchmarks.report import type_bytes  # bytes of an HLO type

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def collectives(hlo_text):
    """``[(op, result type, bytes)]`` of the collectives in an optimised HLO module's text."""
    found = []
    for line in hlo_text.splitlines():
        m = re.search(r"=\s*(.+?)\s+(" + "|".join(COLLECTIVES) + r")(-start)?\(", line)
        if not m or "-done" in line.split("=")[1][:40]:
            continue
        found.append((m.group(2), m.group(1).strip(), type_bytes(m.group(1))))
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=2, help="CPU devices to make when no accelerator is there")
    parser.add_argument("--out", default="")
    parser.add_argument("--hlo", default="", help="also write the optimised HLO text here")
    args, train_args = parser.parse_known_args()
    train_args = [a for a in train_args if a != "--"]
    os.environ["KERAS_BACKEND"] = "jax"
    flags_env = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags_env:
        os.environ["XLA_FLAGS"] = f"{flags_env} --xla_force_host_platform_device_count={args.devices}".strip()
    import jax
    from absl import flags
    from keras.src.backend.jax import trainer as jax_trainer

    captured = {}

    class Captured(Exception):
        pass

    def capturing_jit(fn, **kwargs):
        jitted = jax.jit(fn, **kwargs)

        def call(state, data):
            compiled = jitted.lower(state, data).compile()
            captured["hlo"] = compiled.as_text()
            captured["memory"] = compiled.memory_analysis()
            raise Captured()
        return call

    jax_trainer.jit = capturing_jit
    from uniclr_tf.training import cli as train
    train.define_flags()
    devices = jax.devices()
    flags.FLAGS([sys.argv[0], "--strategy=data_parallel", "--augment_on=device", "--epochs=1", "--knn_every=0",
                 "--nopictures", "--run_dir=/tmp/spmd-collectives", "--run_name=step", "--overwrite",
                 "--compilation_cache_dir=", "--steps_per_epoch=1", "--verbose=2",
                 *train_args])
    cfg = train.config_from_flags()
    try:
        train.run(cfg)
    except Captured:
        pass
    if "hlo" not in captured:
        sys.exit("error: the train step was not compiled (did the run start?)")
    found = collectives(captured["hlo"])
    groups = collections.OrderedDict()
    for op, shape, nbytes in found:
        key = (op, shape)
        count, total = groups.get(key, (0, 0))
        groups[key] = (count + 1, total + nbytes)
    rows = sorted(groups.items(), key=lambda kv: -kv[1][1])
    totals = collections.Counter()
    counts = collections.Counter()
    for op, _, nbytes in found:
        totals[op] += nbytes
        counts[op] += 1
    print(f"\n{len(devices)} {devices[0].platform} devices, global batch {cfg.optim.batch_size}, method {cfg.method}, "
          f"encoder {cfg.network.encoder}; {len(found)} collectives in the compiled step")
    print(f"{'op':<20} {'count':>6} {'MiB':>10}   result shape")
    for (op, shape), (count, nbytes) in rows[:40]:
        print(f"{op:<20} {count:>6} {nbytes / 2**20:>10.3f}   {shape[:90]}")
    print("totals: " + ", ".join(f"{op} {counts[op]} x, {totals[op] / 2**20:.2f} MiB" for op in totals))
    result = {"devices": len(devices), "platform": devices[0].platform, "batch_size": cfg.optim.batch_size,
              "method": cfg.method, "encoder": cfg.network.encoder, "train_args": train_args,
              "totals_bytes": dict(totals), "counts": dict(counts),
              "groups": [{"op": op, "shape": shape, "count": c, "bytes": b} for (op, shape), (c, b) in rows]}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {args.out}")
    if args.hlo:
        with open(args.hlo, "w") as f:
            f.write(captured["hlo"])


if __name__ == "__main__":
    main()
