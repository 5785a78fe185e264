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
    # The longer conv runs beside the fusion and the all-reduce: the summed time grows, the busy time not.
    assert "| total | 6.000 | 7.000 | +1.000 |" in out
    assert "| time with a kernel running | 5.000 | 5.000 | +0.000 |" in out
    assert sa["busy_ms_per_step"]["/device:GPU:0"] == 5.0
    assert out.split("differ most")[1].split("|---|---|---|---|")[1].splitlines()[1].startswith("| conv |")


def test_kernel_kinds_of_xla_cudnn_and_inductor_names():
    """A fusion named after a ``convert`` is a fusion, not a convolution; Inductor's reductions and
    pointwise kernels are fusions whatever aten ops their names list."""
    from benchmarks.report import kernel_kind
    kinds = {"loop_convert_fusion_3": "other fusion", "input_convert_reduce_fusion_13": "reduce fusion",
             "wrapped_convert_1": "other fusion", "conv": "conv/matmul", "some_kernel": "other",
             "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc": "conv/matmul",
             "void cutlass__5x_cudnn::Kernel<cutlass_tensorop_bf16_s16816fprop>": "conv/matmul",
             "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT": "conv/matmul", "triton_gemm_dot_fusion": "conv/matmul",
             "triton_red_fused__native_batch_norm_legit_functional_convolution_backward_1": "reduce fusion",
             "triton_per_fused_add_2": "reduce fusion",
             "triton_poi_fused_add_convolution_backward_native_batch_norm_backward_3": "other fusion",
             "input_transpose_fusion_4": "transpose/copy", "Memset 3": "transpose/copy",
             "ncclDevKernel_AllReduce_Sum_f32_RING_LL": "nccl"}
    assert {name: kernel_kind(name) for name in kinds} == kinds


HLO = """HloModule step

%fused_reduce (p0: bf16[4,8]) -> f32[8] {
  %p0 = bf16[4,8]{1,0} parameter(0)
  %inner = f32[4,8]{1,0} fusion(%p0), kind=kLoop, calls=%nested
  ROOT %r = f32[8]{0} reduce(%inner), dimensions={0}
}

ENTRY %main (x: bf16[4,8], y: f32[8], /*index=2*/z: s8[16]) -> (f32[8]) {
  %x = bf16[4,8]{1,0} parameter(0)
  %y = f32[8]{0} parameter(1)
  %input_reduce_fusion.1 = f32[8]{0} fusion(%x), kind=kInput, calls=%fused_reduce
  %loop_add_fusion = (bf16[4,8]{1,0}, f32[8]{0}) fusion(%x, %input_reduce_fusion.1, %y), kind=kLoop, calls=%f2
  %conv = (bf16[4,8]{1,0}, u8[0]{0}) custom-call(%x, %x), custom_call_target="__cudnn$convForward"
  ROOT %t = (f32[8]{0}) tuple(%input_reduce_fusion.1)
}
"""


def test_roofline_joins_kernels_to_the_bytes_of_their_fusions(tmp_path):
    """Bytes of a fusion = its operands + its results (tuples summed; fusions inside fused computations
    not counted); a trace of 2 steps (counted by the host's launches, the device back to back) gives per
    step: the conv's ms and TFLOP/s from the bench's FLOPs, each fusion kind's GB, GB/s and its time at
    the card's peak bandwidth; the floor is the conv as measured plus the fusions at peak."""
    from benchmarks import report
    assert report.hlo_fusion_bytes(HLO) == {"input_reduce_fusion_1": 32 + 64, "loop_add_fusion": 96 + 64 + 32 + 32}
    assert report.type_bytes("(bf16[2,3]{1,0}, /*index=1*/pred[5], f32[])") == 12 + 5 + 4
    k = lambda ts, dur, name, pid=1: {"ph": "X", "pid": pid, "tid": 1, "ts": ts, "dur": dur, "name": name}
    events = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
              {"ph": "M", "name": "process_name", "pid": 9, "args": {"name": "/host:CPU"}}]
    for start in (0, 10):  # two steps, back to back: one cluster
        events += [k(start, 4, "sm90_xmma_fprop_implicit_gemm"), k(start + 4, 2, "input_reduce_fusion_1"),
                   k(start + 6, 4, "loop_add_fusion")]
        events.append(k(start, 3, "[0] GpuExecutable::ExecuteThunks", pid=9))
    with gzip.open(tmp_path / "trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    (tmp_path / "step.hlo").write_text(HLO)
    (tmp_path / "bench.json").write_text(json.dumps({
        "environment": {"device": "cuda:0 NVIDIA H200"}, "config": {"batch_size": 2},
        "a_model_only": {"flops_per_image": 4e3, "ms_per_step": 0.011}}))
    tables, s = report.roofline(str(tmp_path / "trace.json.gz"), str(tmp_path / "step.hlo"),
                                str(tmp_path / "bench.json"), min_kernels=3)
    assert s["steps"] == 2 and s["kernel_ms"] == 0.010 and s["conv_ms"] == 0.004
    assert abs(s["conv_tflops"] - 8e3 / 1e12 / 4e-6) < 1e-9 and s["peak_gbps"] == 4800.0
    rows = {r["kind"]: r for r in tables[0]["rows"]}
    assert rows["reduce fusion"]["gb"] == 96e-9 and abs(rows["reduce fusion"]["gbps"] - 96 / 1e6 / 0.002) < 1e-9
    assert rows["other fusion"]["gb"] == 224e-9 and rows["other fusion"]["matched"] == 1.0
    assert abs(s["memory_floor_ms"] - 320 / 1e6 / 4800) < 1e-15
    assert abs(s["floor_ms"] - (0.004 + 320 / 1e6 / 4800)) < 1e-12
    assert report.main(["roofline", str(tmp_path / "trace.json.gz"), str(tmp_path / "step.hlo"),
                        "--peak_gbps=1000", "--min_kernels=3"])[0]["rows"][0]["kind"] == "conv/matmul"


def test_a_pytorch_profiler_trace_reads_as_one_device(tmp_path, capsys):
    """torch.profiler's Chrome trace (kernels of category ``kernel``, steps apart) is one GPU whose steps
    and kernel kinds the trace report gives, and it compares with a JAX trace."""
    from benchmarks import report
    k = lambda ts, dur, name: {"ph": "X", "cat": "kernel", "pid": 0, "tid": 7, "ts": ts, "dur": dur, "name": name}
    events = [{"ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 0, "dur": 50000, "name": "aten::conv2d"}]
    for start in (0, 20000):
        events += [k(start, 3000, "sm90_xmma_dgrad_implicit_gemm"), k(start + 3000, 1000, "triton_red_fused_1"),
                   k(start + 4000, 2000, "triton_poi_fused_relu_2")]
    (tmp_path / "torch.json").write_text(json.dumps({"traceEvents": events}))
    summary = report.summarise_trace(report.load_trace(str(tmp_path / "torch.json")), min_kernels=3)
    assert len(summary["devices"]["/device:GPU:0"]) == 2
    assert summary["kinds_ms_per_step"]["/device:GPU:0"] == {"conv/matmul": 3.0, "other fusion": 2.0, "reduce fusion": 1.0}


def test_roofline_names_a_bad_input(tmp_path):
    from benchmarks import report
    (tmp_path / "not-a-trace.json").write_text('{"a": 1}')
    (tmp_path / "empty.hlo").write_text("HloModule m\n")
    with pytest.raises(SystemExit, match="not-a-trace.json: not a trace"):
        report.load_trace(str(tmp_path / "not-a-trace.json"))
    with pytest.raises(SystemExit, match="missing.json.gz: not a readable trace"):
        report.load_trace(str(tmp_path / "missing.json.gz"))
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "kernel", "pid": 0, "tid": 1, "ts": 0, "dur": 1, "name": "loop_add_fusion"}]}))
    with pytest.raises(SystemExit, match="empty.hlo: no fusion in it"):
        report.roofline(str(trace), str(tmp_path / "empty.hlo"), min_kernels=1)
    with pytest.raises(SystemExit, match="nope.hlo: cannot read the HLO"):
        report.roofline(str(trace), str(tmp_path / "nope.hlo"), min_kernels=1)


def test_scaling_report_times_a_runs_dir_from_the_epoch_asked(tmp_path):
    """A scaling.sh RUNS_DIR: each repeat's ms a step is the median of its epochs from ``first_epoch`` on
    (step_seconds / steps an epoch); weak efficiency is the per-GPU rate over the one-GPU variant's with the
    same options where the job has one (base+spe over g1+spe), else the plain g1's; a repeat that exited
    non-zero is failed."""
    from benchmarks import report
    runs = tmp_path / "runs"
    for variant, gpus, seconds in (("g1", 1, (9.0, 1.0, 1.2, 1.0)), ("base", 2, (9.0, 2.0, 1.25, 1.25)),
                                   ("g1+spe", 1, (9.0, 1.0, 0.8, 0.8)), ("base+spe", 2, (9.0, 1.0, 1.0, 1.0)),
                                   ("base+sync", 2, (9.0, 1.0, 1.2, 1.2))):
        (runs / f"{variant}-r1").mkdir(parents=True)
        (runs / f"{variant}.json").write_text(json.dumps(
            {"variant": variant, "run": variant.split("+")[0], "gpus": gpus, "batch_per_gpu": 100, "layout": variant}))
        (runs / f"{variant}-r1.status").write_text("rc=0 seconds=20")
        (runs / f"{variant}-r1" / "config.json").write_text(json.dumps({"steps_per_epoch": 100}))
        (runs / f"{variant}-r1" / "history.json").write_text(json.dumps(
            [{"epoch": i + 1, "step_seconds": s, "wall_seconds": sum(seconds[:i + 1])} for i, s in enumerate(seconds)]))
    (runs / "base-r2").mkdir()
    (runs / "base-r2.status").write_text("rc=124 seconds=150")
    rows = {r["variant"]: r for r in report.scaling([str(runs)], first_epoch=3)[0]["rows"]}
    assert rows["g1"]["ms"]["mean"] == 11.0 and rows["base"]["ms"]["mean"] == 12.5  # epochs 3-4
    assert rows["base"]["weak"] == pytest.approx(11.0 / 12.5) and rows["base"]["failed"] == 1 and rows["base"]["n"] == 1
    assert rows["base+spe"]["weak"] == pytest.approx(8.0 / 10.0)  # over g1+spe, not g1
    assert rows["base+sync"]["weak"] == pytest.approx(11.0 / 12.0)  # no g1+sync: over g1
    rows = {r["variant"]: r for r in report.main(["scaling", str(runs), "--first_epoch=2"])[0]["rows"]}
    assert rows["g1"]["ms"]["mean"] == 10.0 and rows["base"]["ms"]["mean"] == 12.5  # medians of epochs 2-4
    assert [t["title"] for t in report.scaling([str(runs)])] == [
        "Step time over GPUs: each repeat the median ms a step of its timed epochs"]  # no command recorded
    (runs / "environment.json").write_text(json.dumps(
        {"card": "2 x GPU", "date": "2026-01-02", "command": "GPUS=2 bash benchmarks/scaling.sh"}))
    commands = report.scaling([str(runs)])[1]
    assert commands["rows"] == [{"job": "2 x GPU, 2026-01-02", "card": "2 x GPU",
                                 "command": "GPUS=2 bash benchmarks/scaling.sh"}]


def test_trace_counts_steps_by_the_device_kernels_when_the_host_missed_an_enqueue(tmp_path, capsys):
    """Three steps back to back, the first enqueued before the trace began (the host shows 2): each
    step's kernels are divided by 3, the device's count, and the report says both counts. A kernel that
    several layers share (the conv, 3 times a step) does not change the count."""
    from benchmarks import report
    k = lambda ts, dur, name, pid=1: {"ph": "X", "pid": pid, "tid": 1, "ts": ts, "dur": dur, "name": name}
    events = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
              {"ph": "M", "name": "process_name", "pid": 9, "args": {"name": "/host:CPU"}}]
    for step, start in enumerate((0, 1000, 2000)):
        events += [k(start + 100 * i, 100, "sm90_xmma_fprop") for i in range(3)]
        events += [k(start + 300 + 100 * i, 100, f"loop_add_fusion_{i}") for i in range(4)]
        if step:
            events.append(k(start - 500, 400, "[0] GpuExecutable::ExecuteThunks", pid=9))
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    summary = report.summarise_trace(report.load_trace(str(path)), min_kernels=3)
    assert summary["steps_traced"] == 2 and summary["steps_by_kernels"] == {"/device:GPU:0": 3}
    assert summary["kinds_ms_per_step"]["/device:GPU:0"] == {"other fusion": 0.4, "conv/matmul": 0.3}
    report.main(["trace", str(path), "--min_kernels=3"])
    assert "(first device; 3 steps by its kernels, 2 enqueued by the host)" in capsys.readouterr().out
    assert report.device_step_count([]) == 0
