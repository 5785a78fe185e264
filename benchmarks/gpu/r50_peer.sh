#!/usr/bin/env bash
# ResNet-50 at 224 px on one GPU, the model step against PyTorch, side by side in one job (run after the
# scripts/gpu-prep.sh set-up line, $OUT set; the GPU machines have PyTorch):
#   [BATCHES="128 256"] [REPEATS=3] [DP=4] bash benchmarks/gpu/r50_peer.sh
# For each batch, REPEATS times in turn: the bench's section a (JAX, bf16, synthetic device-resident views,
# SimAffinity, SGD: the same model and loss as benchmarks/torch_r50_peer.py), PyTorch eager and PyTorch with
# torch.compile. Each run reports the median images/s of its own repetitions, FLOPs per image and MFU;
# the summary gives, per batch and runner, the median and spread over the REPEATS runs and the ratio to
# torch.compile. With DP=N (N > 1), each repeat also runs the bench's step data-parallel over N GPUs at N x the
# batch (--devices=N, runner "keras-dpN"): its weak-scaling efficiency is its images/s over N x the one-GPU
# step's of the same repeat (wall clock of the timed steps); DP_BN=per_device adds the same data-parallel step with
# per-device batch norm (runner "keras-dpNpd"); PROCS=N (N > 1) the same data-parallel step as N processes x 1 GPU,
# one JAX job (bench --num_processes, runner "keras-pN"), and with PROCS_XLA='FLAGS' again under those XLA_FLAGS
# (runner "keras-pNx", e.g. the latency-hiding scheduler), with PROCS_BN=global_one_pass or per_device again with that
# --batch_norm (runner "keras-pNop" or "keras-pNpd"); TRACE=1 then traces 5 steps of the one-GPU step and of the
# PROCS-process one (bench --profile_dir) and summarises them with benchmarks/trace_summary.py, the N-process
# trace's kernels against the one-GPU trace's ($OUT/trace-summary.txt); EAGER=0 leaves out PyTorch eager, TORCH=0 both PyTorch runs;
# BN1=global_one_pass also runs the one-GPU step with that --batch_norm (runner "keras-op"; the "keras-pNop" runs'
# weak_efficiency_same_bn is against it). Writes $OUT/r50-peer.json and $OUT/r50-peer.log. About 1.5 minutes per batch and repeat.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/r50-peer}; mkdir -p "$OUT" "$OUT/runs"
BATCHES=${BATCHES:-128 256}; REPEATS=${REPEATS:-3}
# a smoke test elsewhere: SIZE (224), STEPS (20) and REPS (5) of each run; PY / TORCH_PY the interpreters
SIZE=${SIZE:-224}; STEPS=${STEPS:-20}; REPS=${REPS:-5}; PY=${PY:-python3}; TORCH_PY=${TORCH_PY:-python3}
DP=${DP:-1}; PROCS=${PROCS:-1}; PROCS_XLA=${PROCS_XLA:-}; ENCODER=${ENCODER:-resnet50}; DP_BN=${DP_BN:-}; PROCS_BN=${PROCS_BN:-}; BN1=${BN1:-}; TRACE=${TRACE:-0}; EAGER=${EAGER:-1}; TORCH=${TORCH:-1}
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/jax-cache-r50}  # repeats reuse the compile
bench_cmd() {  # bench_cmd TAG DEVICES BATCH: the bench's command line of a Keras runner, in the array $cmd
  cmd=("$PY" -m benchmarks.bench --sections=a --encoder="$ENCODER" --image_shape="$SIZE,$SIZE,3" --data=synthetic
       --num_images=$((4 * $3)) --objective=simaffinity --optimizer=sgd --batch_size="$3" --steps="$STEPS"
       --reps="$REPS" --devices="$2" --out="$OUT/runs/$1.json")
}
report() { grep -E "images/s|error|Error" | sed "s/^/$1 /" | tee -a "$OUT/r50-peer.log"; }  # report TAG < output
keras_step() {  # keras_step TAG DEVICES BATCH [BENCH FLAGS...]: one process on DEVICES GPUs
  local tag=$1 cmd; bench_cmd "$@"; shift 3
  "${cmd[@]}" "$@" 2>&1 | report "$tag"
}
keras_procs() {  # keras_procs TAG PROCESSES BATCH [BENCH FLAGS...]: the step as PROCESSES processes x 1 GPU, one JAX job
  local tag=$1 n=$2 port=$((20000 + RANDOM % 20000)) pids=() i cmd; bench_cmd "$@"; shift 3
  for ((i = n - 1; i >= 0; i--)); do  # process 0 last, in the foreground of the log
    CUDA_VISIBLE_DEVICES=$i "${cmd[@]}" "$@" --num_processes="$n" --process_id=$i --coordinator_address=127.0.0.1:$port \
      > "$OUT/runs/$tag.p$i.log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  report "$tag" < "$OUT/runs/$tag.p0.log"
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/r50-peer.log"
for b in $BATCHES; do
  for ((r = 1; r <= REPEATS; r++)); do
    keras_step "keras-b$b-r$r" 1 "$b"
    [ "$BN1" = global_one_pass ] && keras_step "keras-op-b$b-r$r" 1 "$b" --batch_norm=global_one_pass
    [ "$DP" -gt 1 ] && keras_step "keras-dp$DP-b$b-r$r" "$DP" $((DP * b))
    [ "$DP" -gt 1 ] && [ "$DP_BN" = per_device ] && keras_step "keras-dp${DP}pd-b$b-r$r" "$DP" $((DP * b)) --batch_norm=per_device
    [ "$PROCS" -gt 1 ] && keras_procs "keras-p$PROCS-b$b-r$r" "$PROCS" $((PROCS * b))
    [ "$PROCS" -gt 1 ] && [ -n "$PROCS_XLA" ] && XLA_FLAGS="$PROCS_XLA" keras_procs "keras-p${PROCS}x-b$b-r$r" "$PROCS" $((PROCS * b))
    case "$PROCS_BN" in global_one_pass) bn=op ;; per_device) bn=pd ;; *) bn= ;; esac
    [ "$PROCS" -gt 1 ] && [ -n "$bn" ] && keras_procs "keras-p$PROCS$bn-b$b-r$r" "$PROCS" $((PROCS * b)) --batch_norm="$PROCS_BN"
    [ "$TORCH" = 1 ] || continue
    [ "$EAGER" = 1 ] && "$TORCH_PY" benchmarks/torch_r50_peer.py --batch_size "$b" --image_size "$SIZE" --steps "$STEPS" --reps "$REPS" --out "$OUT/runs/eager-b$b-r$r.json" 2>&1 \
      | tail -n 1 | tee -a "$OUT/r50-peer.log"
    "$TORCH_PY" benchmarks/torch_r50_peer.py --batch_size "$b" --image_size "$SIZE" --steps "$STEPS" --reps "$REPS" \
      --compile --out "$OUT/runs/compile-b$b-r$r.json" 2>&1 \
      | tail -n 1 | tee -a "$OUT/r50-peer.log"
  done
done
if [ "$TRACE" = 1 ]; then  # 5 traced steps each (the runs' JSON under traces/, outside the summary's runs/)
  : > "$OUT/trace-summary.txt"
  for b in $BATCHES; do
    keras_step "trace-keras-b$b" 1 "$b" --profile_dir="$OUT/traces/keras-b$b" --reps=1 --out="$OUT/traces/keras-b$b.json"
    "$PY" benchmarks/trace_summary.py "$OUT/traces/keras-b$b" --json="$OUT/traces/keras-b$b.summary.json" \
      >> "$OUT/trace-summary.txt" 2>&1
    if [ "$PROCS" -gt 1 ]; then
      keras_procs "trace-p$PROCS-b$b" "$PROCS" $((PROCS * b)) --profile_dir="$OUT/traces/p$PROCS-b$b" --reps=1 \
        --out="$OUT/traces/p$PROCS-b$b.json"
      "$PY" benchmarks/trace_summary.py "$OUT/traces/p$PROCS-b$b/process-0" --json="$OUT/traces/p$PROCS-b$b.summary.json" \
        --compare="$OUT/traces/keras-b$b.summary.json" >> "$OUT/trace-summary.txt" 2>&1
    fi
    tail -n 60 "$OUT/trace-summary.txt"
  done
fi
"$PY" - "$OUT" <<'PYEOF' | tee -a "$OUT/r50-peer.log"
import glob, json, os, re, statistics, sys
out = sys.argv[1]
runs = {}
for path in glob.glob(os.path.join(out, "runs", "*.json")):
    runner, batch = re.match(r"([\w-]+?)-b(\d+)-r\d+\.json", os.path.basename(path)).groups()
    d = json.load(open(path))
    d = d.get("a_model_only", d)
    runs.setdefault((int(batch), runner), []).append(d)
summary = []
for (batch, runner), rs in sorted(runs.items()):
    rates = [r["images_per_s"] for r in rs]
    mfus = [r["mfu"] for r in rs if "mfu" in r]
    summary.append({"batch": batch, "runner": runner, "repeats": len(rs), "images_per_s": statistics.median(rates),
                    "min": min(rates), "max": max(rates), "flops_per_image": rs[0].get("flops_per_image"),
                    "mfu": statistics.median(mfus) if mfus else None})
compiled = {s["batch"]: s["images_per_s"] for s in summary if s["runner"] == "compile"}
one_gpu = {s["batch"]: s["images_per_s"] for s in summary if s["runner"] == "keras"}
one_gpu_op = {s["batch"]: s["images_per_s"] for s in summary if s["runner"] == "keras-op"}
for s in summary:  # data-parallel runs: weak-scaling efficiency against the one-GPU step at the same per-GPU batch
    m = re.fullmatch(r"keras-(?:dp|p)(\d+)(pd|op|x)?", s["runner"])
    if m and s["batch"] in one_gpu:
        s["devices"] = int(m.group(1))
        s["weak_efficiency"] = s["images_per_s"] / (s["devices"] * one_gpu[s["batch"]])
        if m.group(2) == "op" and s["batch"] in one_gpu_op:  # against the one-GPU step with the same batch norm
            s["weak_efficiency_same_bn"] = s["images_per_s"] / (s["devices"] * one_gpu_op[s["batch"]])
print("| batch | runner | repeats | images/s (median) | min-max | GFLOP/image | MFU | vs torch.compile |")
print("|---|---|---|---|---|---|---|---|")
for s in summary:
    s["vs_torch_compile"] = (s["images_per_s"] / compiled[s["batch"]]
                             if s["batch"] in compiled and "devices" not in s else None)
    fl = f"{s['flops_per_image'] / 1e9:.1f}" if s["flops_per_image"] else ""
    print(f"| {s['batch']} | {s['runner']} | {s['repeats']} | {s['images_per_s']:,.0f} | {s['min']:,.0f}-{s['max']:,.0f}"
          f" | {fl} | {s['mfu'] or 0:.3f} | {s['vs_torch_compile'] or 0:.2f} |"
          + (f" weak-scaling efficiency on {s['devices']} GPUs: {s['weak_efficiency']:.3f}" if "devices" in s else "")
          + (f" ({s['weak_efficiency_same_bn']:.3f} against keras-op)" if "weak_efficiency_same_bn" in s else ""))
json.dump(summary, open(os.path.join(out, "r50-peer.json"), "w"), indent=1)
PYEOF
