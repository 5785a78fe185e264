"""The step profiler (``--profile_steps``) and the trace report of benchmarks/report.py."""

import gzip
import json
import os

import keras
import numpy as np
import pytest

from uniclr_tf.training.callbacks import StepProfiler



def test_step_profiler_traces_the_steps_asked_for(tmp_path, capsys):
    """A real fit of 6 steps: the trace starts at step 2 and stops after step 4, once; files land in
    the folder (TensorBoard's profile layout on every backend)."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.random.rand(48, 4).astype("float32"), np.random.rand(48, 2).astype("float32")
    profiler = StepProfiler(str(tmp_path / "profile"), 2, 4)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[profiler])
    out = capsys.readouterr().out
    assert out.count("profiler: tracing steps 2..4") == 1 and out.count("profiler: trace written") == 1
    written = [os.path.join(d, f) for d, _, files in os.walk(tmp_path / "profile") for f in files]
    assert any("plugins" in p and "profile" in p for p in written), written
    with pytest.raises(ValueError, match="first <= last"):
        StepProfiler(str(tmp_path), 3, 2)


def test_profile_steps_flag_is_checked():
    from uniclr_tf.config.train_config import TrainConfig
    from uniclr_tf.config.errors import UsageError
    assert TrainConfig.make(profile_steps=(3, 5)).invocation.profile_steps == (3, 5)
    for bad in ((0, 2), (5, 3), (1, 2, 3)):
        with pytest.raises(UsageError, match="--profile_steps"):
            TrainConfig.make(profile_steps=bad)


def _trace(path):
    """Two GPUs, two steps each: GPU 0 computes 0-4 ms with an all-reduce 3-5 ms, then after a 6-ms gap
    a second step; the host enqueues each step in 7 ms."""
    k = lambda pid, ts, dur, name: {"ph": "X", "pid": pid, "tid": 1, "ts": ts, "dur": dur, "name": name}
    events = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
              {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/device:GPU:1"}},
              {"ph": "M", "name": "process_name", "pid": 9, "args": {"name": "/host:CPU"}}]
    for pid in (1, 2):
        for start in (0, 11000):
            events += [k(pid, start, 2000, "conv"), k(pid, start + 2000, 2000, "fusion"),
                       k(pid, start + 3000, 2000, "ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)")]
    events += [k(9, t, 7000, f"[{d}] GpuExecutable::ExecuteThunks") for d in (0, 1) for t in (0, 11000)]
    events += [k(9, t, 10, "command_buffer::execute") for t in range(8)]
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)


def test_trace_summary_splits_steps_and_separates_compute_from_collectives(tmp_path):
    from benchmarks import report
    folder = tmp_path / "profile" / "plugins" / "profile" / "x"
    folder.mkdir(parents=True)
    _trace(folder / "perfetto_trace.json.gz")
    summary = report.summarise_trace(report.load_trace(str(tmp_path / "profile")), gap_ms=2.5, min_kernels=1)
    steps = summary["devices"]["/device:GPU:0"]
    assert len(steps) == 2 and len(summary["devices"]) == 2
    assert steps[0] == {"kernels": 3, "span_ms": 5.0, "compute_ms": 4.0, "nccl_ms": 2.0, "idle_ms": 0.0,
                        "collectives": {"AllReduce_Sum_f32_RING_LL": 1}}
    assert summary["host"]["enqueue_ms_per_step"] == {"0": 7.0, "1": 7.0}
    assert summary["host"]["graph_launches_per_device_step"] == 2  # 8 launches / (2 steps x 2 devices)
    assert report.busy([{"ts": 0, "dur": 5}, {"ts": 3, "dur": 5}, {"ts": 20, "dur": 1}]) == 9
    tables, _ = report.trace(str(tmp_path / "profile"), gap_ms=2.5, min_kernels=1)
    gpu0 = tables[0]["rows"][0]
    assert gpu0["device"] == "/device:GPU:0" and gpu0["steps"] == 2 and gpu0["enqueue_ms"] == 7.0
    assert gpu0["span_ms"]["mean"] == 5.0 and gpu0["nccl_ms"]["mean"] == 2.0


def test_trace_summary_times_kernel_kinds_and_compares_two_traces(tmp_path, capsys):
    """Per step: the conv (2 ms), the fusion (2 ms) and the all-reduce (2 ms) by kind; a second trace
    whose conv takes 3 ms shows +1 ms of conv/matmul and names that kernel first."""
    from benchmarks import report
    a, b = tmp_path / "a.json.gz", tmp_path / "b.json.gz"
    _trace(a)
    _trace(b)
    with gzip.open(b, "rt") as f:
        events = json.load(f)["traceEvents"]
    for e in events:
        if e.get("name") == "conv":
            e["dur"] = 3000
    with gzip.open(b, "wt") as f:
        json.dump({"traceEvents": events}, f)
    sa = report.summarise_trace(report.load_trace(str(a)), gap_ms=2.5, min_kernels=1)
    assert sa["kinds_ms_per_step"]["/device:GPU:0"] == {"conv/matmul": 2.0, "other fusion": 2.0, "nccl": 2.0}
    assert sa["top_kernels_ms_per_step"]["/device:GPU:1"]["ncclDevKernel_AllReduce_Sum_f32_RING_LL"] == 2.0
    report.main(["trace", str(a), f"--compare={b}", "--min_kernels=1"])
    out = capsys.readouterr().out
    assert "| conv/matmul | 2.000 | 3.000 | +1.000 |" in out
    assert out.split("differ most")[1].split("|---|---|---|---|")[1].splitlines()[1].startswith("| conv |")
