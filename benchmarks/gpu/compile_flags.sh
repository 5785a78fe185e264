#!/usr/bin/env bash
# Issue 9: how long XLA compiles the train CLI's step on a GPU, with the XLA flags that shorten
# autotuning, one variant per GPU at once (run after the gpu-prep set-up line; $OUT set; N GPUs, N <= 4).
# Each: configs/paper/fashion_mnist_simaffinity.flags (the LARS recipe measured), device augmentation, 3 epochs, no compilation cache, final kNN on
# a 5,000-image bank. Epoch 1's step_seconds minus epoch 2's is the compile (and autotune) time; epoch
# 2's images/s shows what the flag costs at run time. Writes $OUT/compile-flags.json and the logs.
set -u
VARIANTS=("" "--xla_gpu_autotune_level=1" "--xla_gpu_enable_triton_gemm=false"
          "--xla_gpu_autotune_level=1 --xla_gpu_enable_triton_gemm=false")
mkdir -p "$OUT/compile-flags"
for i in "${!VARIANTS[@]}"; do
  ( start=$(date +%s.%N)
    CUDA_VISIBLE_DEVICES=$i XLA_FLAGS="${VARIANTS[$i]}" timeout 240 python3 -m uniclr_tf.train \
      --flagfile=configs/paper/fashion_mnist_simaffinity.flags --augment_on=device --epochs=3 --warmup_epochs=1 --knn_every=0 --knn_max_train=5000 \
      --compilation_cache_dir= --nopictures --verbose=2 --run_dir=/tmp/compile-flags --run_name="v$i" --overwrite \
      > "$OUT/compile-flags/v$i.log" 2>&1
    echo "exit $? process_seconds $(python3 -c "import time; print(round(time.time() - $start, 1))")" >> "$OUT/compile-flags/v$i.log"
    cp /tmp/compile-flags/v$i/history.json "$OUT/compile-flags/v$i-history.json" 2>/dev/null ) &
done
wait
python3 - "${VARIANTS[@]}" <<'PY'
import json, os, sys
out = os.environ["OUT"]; rows = []
for i, flags in enumerate(sys.argv[1:]):
    try:
        h = json.load(open(f"{out}/compile-flags/v{i}-history.json"))
    except (OSError, ValueError):
        rows.append({"xla_flags": flags, "error": "no history"}); continue
    tail = open(f"{out}/compile-flags/v{i}.log").read().strip().splitlines()[-1]
    steady = sorted(e["step_seconds"] for e in h[1:])[len(h[1:]) // 2]
    rows.append({"xla_flags": flags or "(default)", "epoch1_step_seconds": round(h[0]["step_seconds"], 2),
                 "steady_epoch_step_seconds": round(steady, 3),
                 "compile_seconds_est": round(h[0]["step_seconds"] - steady, 2),
                 "images_per_second_steady": round(117 * 512 / steady), "process": tail})
gpu = os.popen("nvidia-smi --query-gpu=name --format=csv,noheader").read().split("\n")[0]
json.dump({"gpu": gpu, "rows": rows}, open(f"{out}/compile-flags.json", "w"), indent=1)
print(gpu)
for r in rows: print(r)
PY
