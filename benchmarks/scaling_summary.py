"""Summary of the runs of ``benchmarks/scaling.sh`` (issue 10): images/s, scaling efficiencies, loss parity.

    python3 -m benchmarks.scaling_summary --runs=/tmp/scaling --out=$OUT/scaling.json [--quiet]

Reads each run folder ``<runs>/<name>`` (``history.json``, ``config.json``) and the status line
``scaling.sh`` wrote for it (``<runs>/<name>.status``: exit code, process seconds, GPUs, processes).
Needs the standard library only (no Keras, JAX or TensorFlow), so it runs after every run and a
time limit that stops the script part-way still leaves a complete JSON of what finished.

Per run, with ``steps`` and ``batch`` (global) from ``config.json`` and epochs 2..N of ``history.json``
(epoch 1 holds the XLA compile):

* ``images_per_s``: sum of steps · batch over epochs 2..N / sum of their ``step_seconds`` (the CLI's
  StepClock: an epoch's start to the end of its last step; callbacks' epoch-end work excluded);
* ``images_per_s_wall``: (N − 1) · steps · batch / (``wall_seconds`` of epoch N − that of epoch 1)
  (everything between the two epoch ends: steps, backups, history writes);
* ``per_gpu`` (and ``per_gpu_wall``): the rate divided by the run's GPUs;
* ``weak_scaling_efficiency``: per-GPU rate / g1's per-GPU rate (g2, g4, p4, m2, l2, l4, i2, i4; 512 images per GPU);
* ``strong_scaling_efficiency``: s_k's rate / (k · s1's rate) at the same global batch (s2 is g2);
* ``first_epoch_s``: ``wall_seconds`` of epoch 1 (the compile and the first epoch's steps).

Loss parity: the epoch-1 ``loss`` of p1 (1 GPU) and p2 (2 GPUs, data_parallel), same flags and seed,
and their relative difference; the same for s1 and g2 (both global batch 1024, a whole epoch).
"""

import argparse
import datetime
import json
import os
import platform

# name: (GPUs, processes, layout, scaling kind)
LAYOUTS = {
    "g1": (1, 1, "1 GPU", "weak"),
    "g2": (2, 1, "1 process x 2 GPUs (data_parallel)", "weak"),
    "g4": (4, 1, "1 process x 4 GPUs (data_parallel)", "weak"),
    "p4": (4, 4, "4 processes x 1 GPU (python -m uniclr_tf.launch, NCCL)", "weak"),
    "m2": (2, 2, "2 processes x 1 GPU (python -m uniclr_tf.launch, NCCL)", "weak"),
    "l2": (2, 2, "2 processes x 1 GPU, python -m uniclr_tf.launch", "weak"),
    "l4": (4, 4, "4 processes x 1 GPU, python -m uniclr_tf.launch", "weak"),
    "i2": (1, 1, "GPU 0's run of 2 independent one-GPU runs at once (no collective)", "weak"),
    "i4": (1, 1, "GPU 0's run of 4 independent one-GPU runs at once (no collective)", "weak"),
    "s1": (1, 1, "1 GPU", "strong"),
    "s4": (4, 1, "1 process x 4 GPUs (data_parallel)", "strong"),
    "p1": (1, 1, "1 GPU (loss parity)", "parity"),
    "p2": (2, 1, "1 process x 2 GPUs (loss parity)", "parity"),
}
HISTORY_KEYS = ("epoch", "loss", "step_seconds", "epoch_seconds", "wall_seconds")


def _load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_status(runs, name):
    """``<runs>/<name>.status``: ``key=value`` words written by scaling.sh (rc, seconds, gpus, processes)."""
    try:
        with open(os.path.join(runs, f"{name}.status")) as f:
            words = f.read().split()
    except OSError:
        return {}
    out = {}
    for w in words:
        if "=" in w:
            k, v = w.split("=", 1)
            try:
                out[k] = float(v) if "." in v else int(v)
            except ValueError:
                out[k] = v
    return out


def rates(history, steps, batch):
    """(images/s by the step clock, images/s by the wall clock) over epochs 2..N; None where unknown."""
    later = history[1:]
    if not later or not steps or not batch:
        return None, None
    images = len(later) * steps * batch
    step_s = [e.get("step_seconds") for e in later]
    by_steps = images / sum(step_s) if all(isinstance(s, (int, float)) and s > 0 for s in step_s) else None
    try:
        span = history[-1]["wall_seconds"] - history[0]["wall_seconds"]
    except (KeyError, TypeError):
        span = None
    by_wall = images / span if span and span > 0 else None
    return by_steps, by_wall


def run_row(runs, name):
    gpus, processes, layout, kind = LAYOUTS[name]
    status = read_status(runs, name)
    folder = os.path.join(runs, name)
    history, config = _load(os.path.join(folder, "history.json")), _load(os.path.join(folder, "config.json"))
    if not status and history is None:
        return None  # not run
    row = {"layout": layout, "kind": kind, "gpus": int(status.get("gpus_n", gpus)),
           "processes": int(status.get("processes", processes)), "exit_code": status.get("rc"),
           "process_seconds": status.get("seconds"), "cuda_visible_devices": status.get("gpus")}
    if history is None or config is None:
        row["error"] = f"no history.json / config.json in {folder}"
        return row
    steps, batch = config.get("steps_per_epoch"), config.get("batch_size")
    row.update(batch=batch, per_gpu_batch=batch / row["gpus"] if batch else None, steps_per_epoch=steps,
               epochs=len(history), epochs_asked=config.get("epochs"))
    row["images_per_s"], row["images_per_s_wall"] = rates(history, steps, batch)
    for key, rate in (("per_gpu", row["images_per_s"]), ("per_gpu_wall", row["images_per_s_wall"])):
        row[key] = rate / row["gpus"] if rate else None
    first = history[0] if history else {}
    row["first_epoch_s"] = first.get("wall_seconds")
    row["first_epoch_step_s"] = first.get("step_seconds")
    later = sorted(e["step_seconds"] for e in history[1:] if isinstance(e.get("step_seconds"), (int, float)))
    row["median_epoch_step_s"] = later[len(later) // 2] if later else None
    row["loss_epoch_1"] = first.get("loss")
    row["loss_last"] = history[-1].get("loss") if history else None
    row["history"] = [{k: e.get(k) for k in HISTORY_KEYS} for e in history]
    return row


def _ratio(a, b):
    return a / b if a is not None and b else None


def _parity(a, b, what):
    if not a or not b or a.get("loss_epoch_1") is None or b.get("loss_epoch_1") is None:
        return None
    la, lb = a["loss_epoch_1"], b["loss_epoch_1"]
    return {"what": what, "loss_a": la, "loss_b": lb, "abs_diff": abs(lb - la),
            "rel_diff": abs(lb - la) / abs(la) if la else None}


def summarize(runs):
    rows = {name: r for name in LAYOUTS if (r := run_row(runs, name)) is not None}
    g1 = rows.get("g1", {})
    for name in ("g1", "g2", "g4", "p4", "m2", "l2", "l4"):
        if name in rows:
            rows[name]["weak_scaling_efficiency"] = _ratio(rows[name].get("per_gpu"), g1.get("per_gpu"))
            rows[name]["weak_scaling_efficiency_wall"] = _ratio(rows[name].get("per_gpu_wall"), g1.get("per_gpu_wall"))
    s1 = rows.get("s1", {})
    strong = {}
    candidates = {"s1": rows.get("s1"), "s2": rows.get("g2"), "s4": rows.get("s4")}
    for name, r in candidates.items():
        if not r or "batch" not in r:
            continue
        if s1.get("batch") and r["batch"] != s1["batch"]:
            continue  # not the same global batch: no strong-scaling point
        k = r["gpus"]
        entry = {"source": "g2" if name == "s2" else name, "gpus": k, "batch": r["batch"],
                 "images_per_s": r.get("images_per_s"), "images_per_s_wall": r.get("images_per_s_wall"),
                 "strong_scaling_efficiency": _ratio(r.get("images_per_s"), k * s1["images_per_s"])
                 if s1.get("images_per_s") else None,
                 "strong_scaling_efficiency_wall": _ratio(r.get("images_per_s_wall"), k * s1["images_per_s_wall"])
                 if s1.get("images_per_s_wall") else None}
        strong[name] = entry
        if name in rows:
            rows[name]["strong_scaling_efficiency"] = entry["strong_scaling_efficiency"]
            rows[name]["strong_scaling_efficiency_wall"] = entry["strong_scaling_efficiency_wall"]
    parity = _parity(rows.get("p1"), rows.get("p2"),
                     "epoch-1 loss, p1 (1 GPU) vs p2 (2 GPUs data_parallel): same flags, seed 0, 5 steps")
    parity_epoch = None
    if rows.get("s1", {}).get("batch") and rows["s1"]["batch"] == rows.get("g2", {}).get("batch"):
        parity_epoch = _parity(rows["s1"], rows["g2"],
                               f"epoch-1 loss, s1 (1 GPU) vs g2 (2 GPUs data_parallel): global batch "
                               f"{rows['s1']['batch']}, a whole epoch (rounding differences grow over its steps)")
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "environment": environment(runs), "rows": rows, "strong_scaling": strong,
            "parity": parity, "parity_whole_epoch": parity_epoch,
            "method": ("images/s over epochs 2..N: steps*batch / step_seconds (StepClock) and by wall-clock "
                       "(wall_seconds of the last epoch - of the first); weak efficiency = per-GPU rate / g1's; "
                       "strong efficiency = s_k rate / (k * s1 rate)")}


def environment(runs):
    env = {"python": platform.python_version(), "host": platform.node()}
    try:
        from importlib import metadata
        for pkg in ("jax", "jaxlib", "keras"):
            try:
                env[pkg] = metadata.version(pkg)
            except metadata.PackageNotFoundError:
                pass
    except ImportError:
        pass
    for name in ("gpus.txt", "command.txt"):
        try:
            with open(os.path.join(runs, name)) as f:
                env[name.split(".")[0]] = f.read().strip()
        except OSError:
            pass
    return env


def _f(x, fmt="{:,.0f}"):
    return "-" if x is None else fmt.format(x)


def print_table(summary):
    rows = summary["rows"]
    head = (f"{'run':<4} {'layout':<42} {'batch':>6} {'steps':>5} {'ep':>3} {'images/s':>9} {'(wall)':>9} "
            f"{'per GPU':>8} {'weak':>5} {'strong':>6} {'1st ep s':>8} {'proc s':>6} {'rc':>3}")
    print(head)
    print("-" * len(head))
    for name, r in rows.items():
        eff = r.get("weak_scaling_efficiency") if r["kind"] == "weak" else None
        strong = r.get("strong_scaling_efficiency")
        print(f"{name:<4} {r['layout'][:42]:<42} {_f(r.get('batch')):>6} {_f(r.get('steps_per_epoch')):>5} "
              f"{_f(r.get('epochs')):>3} {_f(r.get('images_per_s')):>9} {_f(r.get('images_per_s_wall')):>9} "
              f"{_f(r.get('per_gpu')):>8} {_f(eff, '{:.2f}'):>5} {_f(strong, '{:.2f}'):>6} "
              f"{_f(r.get('first_epoch_s'), '{:.1f}'):>8} {_f(r.get('process_seconds'), '{:.0f}'):>6} "
              f"{_f(r.get('exit_code'), '{}'):>3}" + (f"  {r['error']}" if "error" in r else ""))
    s = summary["strong_scaling"]
    if s:
        print("strong scaling (global batch " + str(next(iter(s.values()))["batch"]) + "): " + ", ".join(
            f"{k} {_f(v['images_per_s'])} images/s (eff {_f(v['strong_scaling_efficiency'], '{:.2f}')})"
            for k, v in s.items()))
    for key in ("parity", "parity_whole_epoch"):
        p = summary.get(key)
        if p:
            print(f"{key}: {p['what']}: {json.dumps(p['loss_a'])} vs {json.dumps(p['loss_b'])}, "
                  f"relative difference {_f(p['rel_diff'], '{:.2e}')}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", default="/tmp/scaling", help="Parent folder of the run folders.")
    parser.add_argument("--out", default="", help="Write the JSON here.")
    parser.add_argument("--quiet", action="store_true", help="Write the JSON only (no table).")
    args = parser.parse_args(argv)
    summary = summarize(args.runs)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(summary, f, indent=1)
        os.replace(tmp, args.out)
    if not args.quiet:
        print_table(summary)
        if args.out:
            print(f"wrote {args.out}")
    return summary


if __name__ == "__main__":
    main()
