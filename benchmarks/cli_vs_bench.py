"""The train CLI against the bench, side by side in one job: what users get vs what the step can do.

    python -m benchmarks.cli_vs_bench --flagfile=configs/paper/fashion_mnist_simaffinity.flags --epochs=100 --knn_every=10 \
        --out=benchmarks/cli-vs-bench.json [-- extra train flags]

1. ``python -m benchmarks.bench --sections=a`` with the flagfile's model (encoder, projector, batch,
   precision, method): the model-only images/s of the hand-threaded compiled step on resident data.
2. ``python -m uniclr_tf.train`` with the same flagfile, ``--augment_on=device``, the given epochs
   and kNN cadence, in a fresh run folder: the real CLI (data feeding, callbacks, backups, plots,
   kNN monitor). From its ``history.json``:

   * training images/s = (epochs − 1) · steps · batch / (wall-clock from the end of epoch 1 to the
     end of training − the kNN monitor's seconds in that span): the "training wall-clock";
   * the share of the CLI's wall-clock (fit start to end) outside training steps, from the CLI's own
     clocks: ``step_seconds`` of each epoch (epoch start to the end of its last step), the first
     epoch's compile (its step time minus the median epoch's) counted outside; the same share with
     the steps counted at the bench's model-only rate; and the median time between two epochs
     outside steps and kNN (backups, history, curves).

   From its ``metrics.json``: the whole process's wall clock by phase (start-up, data, model, raw-pixel
   kNN, training, saving, final kNN, pictures), as the CLI clocked it.

Prints a table and writes the JSON. Any flags after ``--`` go to the train command.
``--summarise=RUN_DIR --model_rate=N --process_seconds=S`` prints the same table for a run already
made (e.g. a rerun of the CLI with the compilation cache warm, in a later job).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def parse_flagfile(path):
    flags = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("--flagfile="):
                flags.update(parse_flagfile(line.split("=", 1)[1]))
            elif line.startswith("--") and "=" in line:
                key, value = line[2:].split("=", 1)
                flags[key] = value
    return flags


def run(cmd, log):
    print("$ " + " ".join(cmd), flush=True)
    start = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        with open(log) as f:
            tail = f.read()[-3000:]
        sys.exit(f"error: {' '.join(cmd[:4])} ... exited {proc.returncode}:\n{tail}")
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--flagfile", default="configs/paper/fashion_mnist_simaffinity.flags")
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--knn_every", type=int, default=10)
    parser.add_argument("--image_shape", default="28,28,1", help="the dataset's image shape (for the bench)")
    parser.add_argument("--bench_extra", default="", help="extra flags for the bench (e.g. --quick sizes)")
    parser.add_argument("--out", default="")
    parser.add_argument("--label", default="", help="what this run is, for the report's table")
    parser.add_argument("--warm_rerun", action="store_true",
                        help="run the CLI a second time, in a new folder, with the compilation cache warm")
    parser.add_argument("--work", default="", help="folder for run folders and logs (default: a temp folder)")
    parser.add_argument("--summarise", default="", metavar="RUN_DIR",
                        help="no runs: the table of a finished run folder (with --model_rate and --process_seconds)")
    parser.add_argument("--model_rate", type=float, default=0.0, help="the bench's model-only images/s (--summarise)")
    parser.add_argument("--process_seconds", type=float, default=0.0, help="the CLI process's wall-clock (--summarise)")
    args, train_extra = parser.parse_known_args()
    train_extra = [a for a in train_extra if a != "--"]
    if args.summarise:
        if args.model_rate <= 0 or args.process_seconds <= 0:
            parser.error("--summarise needs --model_rate and --process_seconds")
        result = summarise_run(args.summarise, args.model_rate, args.process_seconds, "(an earlier run)")
        result["label"] = args.label
        print_rows(result, args.model_rate)
        write_json(result, args.out)
        return
    work = args.work or tempfile.mkdtemp(prefix="cli-vs-bench-")
    os.makedirs(work, exist_ok=True)
    flags = parse_flagfile(args.flagfile)
    for extra in train_extra:
        if extra.startswith("--") and "=" in extra:
            key, value = extra[2:].split("=", 1)
            flags[key] = value
    py = sys.executable

    bench_json = os.path.join(work, "bench.json")
    bench_cmd = [py, "-m", "benchmarks.bench", "--sections=a", f"--image_shape={args.image_shape}",
                 "--data=fashion_mnist", f"--encoder={flags.get('encoder', 'resnet18')}",
                 f"--projector_dims={flags.get('projector_dims', '2048,2048,256')}",
                 f"--batch_size={flags.get('batch_size', '512')}", f"--optimizer={flags.get('optimizer', 'lars')}",
                 f"--precision={flags.get('precision', 'float32')}",
                 f"--objective={flags.get('method', flags.get('objective', 'simtrace'))}", f"--out={bench_json}",
                 *args.bench_extra.split()]
    if "encoder_width" in flags:
        bench_cmd.append(f"--encoder_width={flags['encoder_width']}")
    run(bench_cmd, os.path.join(work, "bench.log"))
    with open(bench_json) as f:
        bench = json.load(f)
    model_rate = bench["a_model_only"]["images_per_s"]

    cache = os.path.join(work, "xla-cache")  # emptied: the first CLI run compiles cold
    shutil.rmtree(cache, ignore_errors=True)
    result = measure_cli(py, args, work, "cli", train_extra, cache, model_rate)
    result["bench"] = {"environment": bench.get("environment"), "a_model_only": bench["a_model_only"]}
    env = bench.get("environment") or {}
    result.update(card=env.get("device"), date=env.get("date"), label=args.label)
    result["bench_command"] = " ".join(bench_cmd[1:])
    if args.warm_rerun:  # the same command in a new folder: the compiled steps come from the cache
        result["warm_cache_rerun"] = measure_cli(py, args, work, "cli-warm", train_extra, cache, model_rate)
    for label, res in [("cold compilation cache", result)] + (
            [("warm compilation cache (rerun)", result["warm_cache_rerun"])] if args.warm_rerun else []):
        print(f"\n{label:<52} {'value':>12}")
        print_rows(res, model_rate)
    write_json(result, args.out)


def write_json(result, out):
    """Writes ``result`` to ``out`` (nothing when ``out`` is empty)."""
    if out:
        with open(out, "w") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {out}")


def measure_cli(py, args, work, name, train_extra, cache, model_rate):
    """Runs the train CLI in ``work/name`` and measures it from its history.json (see the module doc)."""
    train_cmd = [py, "-m", "uniclr_tf.train", f"--flagfile={args.flagfile}", "--augment_on=device",
                 f"--epochs={args.epochs}", f"--knn_every={args.knn_every}", f"--run_dir={work}",
                 f"--run_name={name}", f"--compilation_cache_dir={cache}", "--overwrite", "--verbose=2",
                 *train_extra]
    cli_seconds = run(train_cmd, os.path.join(work, f"{name}.log"))
    return summarise_run(os.path.join(work, name), model_rate, cli_seconds, " ".join(train_cmd[1:]))


def summarise_run(run_dir, model_rate, cli_seconds, train_command):
    """The measures of the module doc from a finished run folder (its history.json, metrics.json and
    config.json), the bench's model-only images/s and the CLI process's wall-clock."""
    with open(os.path.join(run_dir, "history.json")) as f:
        history = json.load(f)
    with open(os.path.join(run_dir, "metrics.json")) as f:
        metrics = json.load(f)
    with open(os.path.join(run_dir, "config.json")) as f:
        config = json.load(f)
    steps, batch = int(config["steps_per_epoch"]), int(config["batch_size"])
    first, last = history[0], history[-1]
    knn_after_first = sum(e.get("knn_seconds") or 0.0 for e in history[1:])
    train_wall = last["wall_seconds"] - first["wall_seconds"] - knn_after_first
    images = (len(history) - 1) * steps * batch
    cli_rate = images / train_wall
    fit_wall = last["wall_seconds"]
    step_time = len(history) * steps * batch / model_rate
    knn_total = sum(e.get("knn_seconds") or 0.0 for e in history)
    step_seconds = [e.get("step_seconds") for e in history]
    if all(v is not None for v in step_seconds) and len(step_seconds) > 1:
        median_epoch = statistics.median(step_seconds[1:])
        compile_s = max(step_seconds[0] - median_epoch, 0.0)
        in_steps = sum(step_seconds) - compile_s
        walls = [0.0] + [e["wall_seconds"] for e in history]
        gaps = [walls[i + 1] - walls[i] - step_seconds[i] - (history[i].get("knn_seconds") or 0.0)
                for i in range(1, len(history))]
        clocks = {"steps_seconds": in_steps, "compile_seconds_estimate": compile_s,
                  "median_epoch_step_seconds": median_epoch, "median_gap_between_epochs_seconds": statistics.median(gaps),
                  "share_outside_training_steps_measured": 1.0 - in_steps / fit_wall,
                  "share_outside_training_steps_measured_after_epoch_1":
                      1.0 - sum(step_seconds[1:]) / (fit_wall - first["wall_seconds"]),
                  "share_outside_training_steps_measured_whole_process": 1.0 - in_steps / cli_seconds}
    else:
        clocks = {}
    result = {
        "bench_model_only_images_per_s": model_rate,
        "cli_training_images_per_s": cli_rate,
        "ratio_cli_to_bench": cli_rate / model_rate,
        "cli_process_seconds": cli_seconds,
        "cli_fit_wall_seconds": fit_wall,
        "first_epoch_seconds": first["wall_seconds"],
        "knn_seconds_total": knn_total,
        "knn_evaluations": sum(1 for e in history if e.get("knn_seconds")),
        "share_outside_training_steps": 1.0 - step_time / fit_wall,
        "share_outside_training_steps_after_epoch_1": 1.0 - (images / model_rate) / (fit_wall - first["wall_seconds"]),
        **clocks,
        "epochs": len(history), "steps_per_epoch": steps, "batch_size": batch,
        "final_knn_top1": metrics.get("knn_top1"), "raw_pixel_knn_top1": metrics.get("raw_pixel_knn_top1"),
        "train_command": train_command,
    }
    phases = {k: v for k, v in (metrics.get("seconds") or {}).items() if k not in ("this_invocation", "knn_monitor")}
    if "wall" in phases:  # the run's own wall clock by phase (start-up, data, model, training, final kNN, ...)
        result["process_phases_seconds"] = phases
    return result


def print_rows(result, model_rate):
    clocks = result
    cli_rate, fit_wall = result["cli_training_images_per_s"], result["cli_fit_wall_seconds"]
    knn_total = result["knn_seconds_total"]
    rows = [("bench (a) model-only images/s", f"{model_rate:,.0f}"),
            ("train CLI images/s (after epoch 1, kNN excluded)", f"{cli_rate:,.0f}"),
            ("ratio CLI / bench", f"{cli_rate / model_rate:.3f}"),
            ("CLI fit wall-clock s", f"{fit_wall:.1f}"),
            ("  first epoch (compile) s", f"{result['first_epoch_seconds']:.1f}"),
            (f"  kNN monitor s ({result['knn_evaluations']} evaluations)", f"{knn_total:.1f}"),
            ("share outside steps (steps at the bench's rate)", f"{result['share_outside_training_steps']:.3f}"),
            ("  the same after epoch 1", f"{result['share_outside_training_steps_after_epoch_1']:.3f}"),
            ("final kNN top-1 / raw pixels", f"{result.get('final_knn_top1') or 0:.4f} / {result.get('raw_pixel_knn_top1') or 0:.4f}")]
    if "steps_seconds" in clocks:
        rows += [("CLI's own clocks: training steps s", f"{clocks['steps_seconds']:.1f}"),
                 ("  first-epoch compile s (estimate)", f"{clocks['compile_seconds_estimate']:.1f}"),
                 ("  median gap between epochs s", f"{clocks['median_gap_between_epochs_seconds']:.3f}"),
                 ("  share of fit wall-clock outside steps", f"{clocks['share_outside_training_steps_measured']:.3f}"),
                 ("  the same after epoch 1",
                  f"{clocks['share_outside_training_steps_measured_after_epoch_1']:.3f}"),
                 ("  share of the whole process outside steps",
                  f"{clocks['share_outside_training_steps_measured_whole_process']:.3f}")]
    phases = result.get("process_phases_seconds") or {}
    if phases:
        rows.append(("CLI process by phase (its own clock): wall s", f"{phases['wall']:.1f}"))
        rows += [(f"  {phase} s", f"{seconds:.1f}") for phase, seconds in phases.items() if phase != "wall"]
    for name, value in rows:
        print(f"{name:<52} {value:>12}")


if __name__ == "__main__":
    main()
