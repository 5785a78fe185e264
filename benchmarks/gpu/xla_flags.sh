#!/usr/bin/env bash
# Issue 10: does XLA's latency-hiding scheduler (collectives overlapped with compute) recover the
# 2-GPU step's overhead? On a 2-GPU machine (JAX; after the gpu-prep set-up line, $OUT set):
#   bash benchmarks/gpu/xla_flags.sh
# g1: 1 GPU, batch 512; g2: 2 GPUs data_parallel, batch 1024 (512 per GPU), default XLA flags;
# g2lhs: the same with --xla_gpu_enable_latency_hiding_scheduler=true. 4 epochs each; images/s from
# the CLI's step_seconds over epochs 2-4. Writes $OUT/xla-flags.json and the three logs.
set -u
export NCCL_NVLS_ENABLE=0
C="python3 -m uniclr_tf.train --flagfile=configs/paper/fashion_mnist_simaffinity.flags --augment_on=device --knn_every=0 --nopictures
   --warmup_epochs=1 --epochs=4 --knn_max_train=5000 --overwrite --verbose=2 --run_dir=/tmp/xf --compilation_cache_dir="
CUDA_VISIBLE_DEVICES=0 timeout 90 $C --run_name=g1 --batch_size=512 > "$OUT/g1.log" 2>&1; echo "g1 exit $?"
CUDA_VISIBLE_DEVICES=0,1 timeout 90 $C --run_name=g2 --batch_size=1024 --strategy=data_parallel > "$OUT/g2.log" 2>&1
echo "g2 exit $?"
CUDA_VISIBLE_DEVICES=0,1 XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true timeout 90 $C --run_name=g2lhs \
  --batch_size=1024 --strategy=data_parallel > "$OUT/g2lhs.log" 2>&1; echo "g2lhs exit $?"
python3 - "$OUT" <<'PY'
import json, os, sys
out, rows = sys.argv[1], {}
for name, gpus in (("g1", 1), ("g2", 2), ("g2lhs", 2)):
    try:
        h = json.load(open(f"/tmp/xf/{name}/history.json")); c = json.load(open(f"/tmp/xf/{name}/config.json"))
    except OSError as e:
        rows[name] = {"error": str(e)}; continue
    rate = (len(h) - 1) * c["steps_per_epoch"] * c["batch_size"] / sum(e["step_seconds"] for e in h[1:])
    rows[name] = {"gpus": gpus, "batch": c["batch_size"], "images_per_s": rate, "per_gpu": rate / gpus,
                  "ms_per_step": 1000 * sum(e["step_seconds"] for e in h[1:]) / ((len(h) - 1) * c["steps_per_epoch"])}
base = rows.get("g1", {}).get("per_gpu")
for r in rows.values():
    if base and "per_gpu" in r:
        r["weak_scaling_efficiency"] = r["per_gpu"] / base
json.dump(rows, open(f"{out}/xla-flags.json", "w"), indent=2)
for k, r in rows.items():
    print(k, {a: round(b, 3) if isinstance(b, float) else b for a, b in r.items()})
PY
nvidia-smi --query-gpu=name --format=csv,noheader
