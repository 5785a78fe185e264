#!/usr/bin/env bash
# Issue 9 on one GPU (JAX backend; run after the scripts/gpu-prep.sh set-up line, $OUT set):
#   bash benchmarks/gpu/cli_speed.sh FLAGFILE TAG [EXTRA TRAIN FLAGS...]
# 1. benchmarks.cli_vs_bench: the bench's model-only step, then the train CLI for 100 epochs with the
#    kNN monitor every ${KNN_EVERY:-10} epochs, cold (empty XLA compilation cache) and again warm;
# 2. benchmarks.profile_run: 12 epochs of the same run under cProfile (host time by function).
# Writes $OUT/<TAG>.json, <TAG>.log, <TAG>-history-{cold,warm}.json and <TAG>-profile.txt.
set -uo pipefail
flagfile=$1; tag=$2; shift 2
work=/tmp/w-$tag
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/$tag.log"
python3 -m benchmarks.cli_vs_bench --flagfile="$flagfile" --epochs="${EPOCHS:-100}" --knn_every="${KNN_EVERY:-10}" \
    --warm_rerun --work="$work" --out="$OUT/$tag.json" -- "$@" 2>&1 | tee -a "$OUT/$tag.log"
cp "$work/cli/history.json" "$OUT/$tag-history-cold.json" 2>/dev/null
cp "$work/cli-warm/history.json" "$OUT/$tag-history-warm.json" 2>/dev/null
if [ "${PROFILE:-1}" = 1 ]; then
  python3 -m benchmarks.profile_run --top=40 -- --flagfile="$flagfile" --augment_on=device --epochs=12 \
      --knn_every=5 --run_dir=/tmp/p --run_name="$tag" --overwrite --verbose=2 --nopictures \
      --compilation_cache_dir="$work/xla-cache" "$@" > "$OUT/$tag-profile.txt" 2>&1
  grep -A50 "== epoch-end" "$OUT/$tag-profile.txt" | head -60
fi
