r"""Where a traced training step's time goes, device by device: a summary of the Perfetto trace that
``--profile_steps=FIRST,LAST`` writes (``RUN/profile/plugins/profile/*/perfetto_trace.json.gz``).

    python benchmarks/trace_summary.py RUN/profile [--json=OUT.json]

Each GPU's kernels are cut into steps where the device sat idle for more than ``--gap_ms`` (a step's
kernels run back to back, between steps the device waits for the host); per step it prints the span
from first kernel to last, the time some compute kernel ran, the time some NCCL kernel ran (an NCCL
kernel also counts the wait for the slowest peer), the idle time inside the step, and the collectives by
kind. From the host side: per device, the time its thread spent enqueuing the step's work
(``GpuExecutable::ExecuteThunks``) and the CUDA-graph launches (``command_buffer::execute``) per step.
A step that is not one cluster (the host enqueues slower than the device runs) shows as several short
"steps"; compare the kernel counts.
"""

import argparse
import collections
import glob
import gzip
import json
import os
import statistics


def load(path):
    if os.path.isdir(path):
        found = sorted(glob.glob(os.path.join(path, "**", "perfetto_trace.json.gz"), recursive=True))
        if not found:
            raise SystemExit(f"{path}: no perfetto_trace.json.gz below it (was the run traced with --profile_steps?)")
        path = found[-1]
    with gzip.open(path) as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def busy(events):
    """Microseconds during which at least one of ``events`` ran (the union of their intervals)."""
    total, start, end = 0.0, None, None
    for e in sorted(events, key=lambda e: e["ts"]):
        s, t = e["ts"], e["ts"] + e.get("dur", 0)
        if end is None or s > end:
            total += 0 if end is None else end - start
            start, end = s, t
        else:
            end = max(end, t)
    return total + (0 if end is None else end - start)


def is_nccl(event):
    return "nccl" in event["name"].lower()


def device_steps(kernels, gap_us):
    kernels = sorted(kernels, key=lambda e: e["ts"])
    steps = [[kernels[0]]] if kernels else []
    for before, e in zip(kernels, kernels[1:]):
        if e["ts"] - (before["ts"] + before.get("dur", 0)) > gap_us:
            steps.append([])
        steps[-1].append(e)
    return steps


def step_row(kernels):
    span = kernels[-1]["ts"] + kernels[-1].get("dur", 0) - kernels[0]["ts"]
    nccl = [e for e in kernels if is_nccl(e)]
    compute = [e for e in kernels if not is_nccl(e)]
    kinds = collections.Counter(e["name"].split("(")[0].replace("ncclDevKernel_", "") for e in nccl)
    return {"kernels": len(kernels), "span_ms": span / 1e3, "compute_ms": busy(compute) / 1e3,
            "nccl_ms": busy(nccl) / 1e3, "idle_ms": (span - busy(kernels)) / 1e3, "collectives": dict(kinds)}


def summarise(events, gap_ms=2.5, min_kernels=100):
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    spans = [e for e in events if e.get("ph") == "X"]
    out = {"devices": {}, "host": {}}
    for pid, name in sorted(names.items()):
        if "GPU" not in name and "TPU" not in name:
            continue
        steps = [step_row(s) for s in device_steps([e for e in spans if e["pid"] == pid], gap_ms * 1e3)
                 if len(s) >= min_kernels]
        out["devices"][name] = steps
    host = [e for e in spans if names.get(e["pid"], "").startswith("/host")]
    enqueue = collections.defaultdict(list)
    for e in host:
        if e["name"].endswith("GpuExecutable::ExecuteThunks"):
            device = e["name"].split("]")[0].lstrip("[") if e["name"].startswith("[") else "0"
            enqueue[device].append(e["dur"] / 1e3)
    out["host"]["enqueue_ms_per_step"] = {d: statistics.median(v) for d, v in sorted(enqueue.items())}
    steps_traced = max((len(v) for v in enqueue.values()), default=0)
    graphs = sum(1 for e in host if e["name"] == "command_buffer::execute")
    out["host"]["graph_launches_per_device_step"] = graphs / max(1, steps_traced * max(1, len(enqueue)))
    out["host"]["python_events"] = sum(1 for e in host if e["name"].startswith("$"))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", help="a perfetto_trace.json.gz, or a folder holding one (RUN/profile)")
    parser.add_argument("--gap_ms", type=float, default=2.5, help="device idle time that separates two steps")
    parser.add_argument("--json", default="", help="also write the summary here")
    args = parser.parse_args(argv)
    summary = summarise(load(args.trace), args.gap_ms)
    for device, steps in summary["devices"].items():
        print(device)
        for s in steps:
            print(f"  {s['kernels']:5d} kernels  span {s['span_ms']:6.2f} ms  compute {s['compute_ms']:6.2f}  "
                  f"nccl {s['nccl_ms']:5.2f}  idle {s['idle_ms']:5.2f}  {s['collectives']}")
    host = summary["host"]
    print("host: enqueue per step (ms, median) by device:", {d: round(v, 2) for d, v in host["enqueue_ms_per_step"].items()},
          f"| CUDA-graph launches per device-step: {host['graph_launches_per_device_step']:.0f}")
    if host["python_events"]:
        print(f"note: {host['python_events']} Python-function events: the Python tracer was on and slows the host")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
