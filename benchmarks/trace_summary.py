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


KINDS = (  # a kernel's kind, by the first pattern its lower-cased name matches
    ("nccl", ("nccl",)),
    ("conv/matmul", ("xmma", "cutlass", "cudnn", "conv", "gemm", "nvjet", "wgrad", "dgrad", "fprop", "implicit")),
    ("transpose/copy", ("transpose", "copy", "memcpy", "memset")),
    ("reduce fusion", ("reduce",)),
    ("other fusion", ("fusion",)),
)


def kernel_kind(name):
    low = name.lower()
    return next((kind for kind, keys in KINDS if any(k in low for k in keys)), "other")


def per_step_times(clusters, steps, top=25):
    """Kernel ms a step by kernel kind, and the ``top`` kernel names by ms a step (summed over a step's
    launches; kernels on concurrent streams both count), over ``clusters`` of kernels holding ``steps`` steps."""
    kinds, names = collections.Counter(), collections.Counter()
    for kernels in clusters:
        for e in kernels:
            kinds[kernel_kind(e["name"])] += e.get("dur", 0) / 1e3
            names[e["name"].split("(")[0][:120]] += e.get("dur", 0) / 1e3
    n = max(1, steps)
    return ({k: round(v / n, 4) for k, v in kinds.most_common()},
            {k: round(v / n, 4) for k, v in names.most_common(top)})


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
    host = [e for e in spans if names.get(e["pid"], "").startswith("/host")]
    enqueue = collections.defaultdict(list)
    for e in host:
        if e["name"].endswith("GpuExecutable::ExecuteThunks"):
            device = e["name"].split("]")[0].lstrip("[") if e["name"].startswith("[") else "0"
            enqueue[device].append(e["dur"] / 1e3)
    steps_traced = max((len(v) for v in enqueue.values()), default=0)
    out["steps_traced"] = steps_traced
    for pid, name in sorted(names.items()):
        if "GPU" not in name and "TPU" not in name:
            continue
        clusters = [s for s in device_steps([e for e in spans if e["pid"] == pid], gap_ms * 1e3) if len(s) >= min_kernels]
        out["devices"][name] = [step_row(s) for s in clusters]
        # per traced step (the host's executions): a "step" cluster may hold several steps when the
        # device never idled between them
        out.setdefault("kinds_ms_per_step", {})[name], out.setdefault("top_kernels_ms_per_step", {})[name] = \
            per_step_times(clusters, steps=steps_traced or len(clusters))
    out["host"]["enqueue_ms_per_step"] = {d: statistics.median(v) for d, v in sorted(enqueue.items())}
    graphs = sum(1 for e in host if e["name"] == "command_buffer::execute")
    out["host"]["graph_launches_per_device_step"] = graphs / max(1, steps_traced * max(1, len(enqueue)))
    out["host"]["python_events"] = sum(1 for e in host if e["name"].startswith("$"))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", help="a perfetto_trace.json.gz, or a folder holding one (RUN/profile)")
    parser.add_argument("--gap_ms", type=float, default=2.5, help="device idle time that separates two steps")
    parser.add_argument("--min_kernels", type=int, default=100, help="fewer kernels than this: not a step")
    parser.add_argument("--json", default="", help="also write the summary here")
    parser.add_argument("--compare", default="",
                        help="another trace (or a --json summary of one): print both traces' kernel time a step by "
                             "kind and the kernels whose time differs most (e.g. the 1-GPU step against the 2-GPU one)")
    args = parser.parse_args(argv)
    summary = summarise(load(args.trace), args.gap_ms, args.min_kernels)
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
    if args.compare:
        other = _summary(args.compare, args.gap_ms, args.min_kernels)
        compare(summary, other, args.trace, args.compare)


def _summary(path, gap_ms, min_kernels):
    if path.endswith(".json") and not path.endswith(".json.gz"):
        with open(path) as f:
            return json.load(f)
    return summarise(load(path), gap_ms, min_kernels)


def _first(table):
    """The first device's entry of a per-device table (the devices of one run compute the same program)."""
    return next(iter(table.values()), {}) if table else {}


def compare(a, b, name_a, name_b):
    """Kernel time a step by kind, and the kernel names whose time a step differs most, trace ``a`` against ``b``."""
    ka, kb = _first(a.get("kinds_ms_per_step")), _first(b.get("kinds_ms_per_step"))
    print(f"ms a step by kernel kind (first device):  A = {name_a}  B = {name_b}")
    for kind in sorted(set(ka) | set(kb), key=lambda k: -max(ka.get(k, 0), kb.get(k, 0))):
        print(f"  {kind:16s} A {ka.get(kind, 0):7.3f}  B {kb.get(kind, 0):7.3f}  B-A {kb.get(kind, 0) - ka.get(kind, 0):+7.3f}")
    print(f"  {'total':16s} A {sum(ka.values()):7.3f}  B {sum(kb.values()):7.3f}  B-A {sum(kb.values()) - sum(ka.values()):+7.3f}")
    ta, tb = _first(a.get("top_kernels_ms_per_step")), _first(b.get("top_kernels_ms_per_step"))
    diffs = sorted(set(ta) | set(tb), key=lambda k: -abs(tb.get(k, 0) - ta.get(k, 0)))[:15]
    print("kernels whose ms a step differ most (names absent from one side's top 25 count as 0 there):")
    for k in diffs:
        print(f"  A {ta.get(k, 0):7.3f}  B {tb.get(k, 0):7.3f}  {k[:100]}")


if __name__ == "__main__":
    main()
