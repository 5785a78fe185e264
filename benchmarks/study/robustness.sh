#!/usr/bin/env bash
# The seed-robustness check on a GPU machine: every shipped GPU config x 5 seeds x the first 30 epochs,
# one run per GPU slot, resumable (rerun the same command: finished runs are skipped, stopped
# ones resume from their backups in RUNS_DIR), then the table (config, seeds failed, kNN min/mean/max).
#   T=<seconds> [GPUS=0,1,2,3] [PER_GPU=2] [OUT=/tmp/robustness] [RUNS_DIR=/tmp/robustness-runs] \
#     bash benchmarks/study/robustness.sh
# Exits 3 while runs remain (study.py's convention), 0 once every run ended.
# Cost on 4 H200s at PER_GPU=2: a two-view run takes 100-150 s beside another on its GPU (Zero-CL ~200 s,
# the multi-crop default ~210 s), so the 90 runs need about 30 minutes: the command four times with T=540.
set -u
cd "$(dirname "$0")/../.."
T=${T:-540}; OUT=${OUT:-/tmp/robustness}; RUNS_DIR=${RUNS_DIR:-/tmp/robustness-runs}
GPUS=${GPUS:-$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | paste -sd, -)}
python3 benchmarks/robustness.py plan | cmp -s - benchmarks/study/robustness.plan \
  || { echo "benchmarks/study/robustness.plan is stale: python benchmarks/robustness.py plan > it"; exit 1; }
python3 benchmarks/study.py --plan=benchmarks/study/robustness.plan --out="$OUT" --runs_dir="$RUNS_DIR" \
  --gpus="${GPUS:-cpu}" --per_gpu="${PER_GPU:-2}" --time_limit="$T" --min_start="${MIN_START:-90}"
status=$?
python3 benchmarks/robustness.py table "$OUT"
exit $status
