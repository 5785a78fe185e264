#!/usr/bin/env bash
# Issue 12's whole study in one command: every run of recipe.plan, methods200.plan and claims.plan (112 runs),
# one run per GPU of this machine at a time, each followed by its linear evaluation; then each plan's table
# with mean +- std over seeds (RES/PLAN/summary.md) and every plot of REPRODUCTION.md drawn from these runs
# (RES/plots/). About 9 GPU-hours on H100s (2-view 200-epoch run ~6 min, 50-epoch ~1.5 min, a linear
# evaluation ~1 min): ~2.5 hours on a 4-GPU machine.
#   RES=DIR RUNS_DIR=DIR [T=seconds] [GPUS=0,1,...] bash benchmarks/study/reproduce.sh
# Resumable: RUNS_DIR holds each run's folder and backups. Run the same command again after a time limit
# (T: this call's seconds, 0 = none; no run starts in its last MIN_START = 100 s and the runs still going
# get SIGTERM, which saves a backup), a kill or a new GPU job with the same disks: a finished run exits at
# once, a stopped one continues from its last backup, a missing one starts. On a machine without
# TensorFlow (JAX only) the linear evaluation augments on the device, as below. PYTHON: the plots'
# interpreter (needs matplotlib; without it the tables are still written and the plots are skipped).
set -u
cd "$(dirname "$0")/../.."
RES=${RES:-study-results}; RUNS_DIR=${RUNS_DIR:-runs/study}; T=${T:-0}; MIN_START=${MIN_START:-100}
LINEAR_EVAL=${LINEAR_EVAL:---augment_on=device --batch_size=512}
STUDY_PYTHON=${STUDY_PYTHON:-python3}   # the interpreter of the runs (study.py's --python)
start=$(date +%s)
mkdir -p "$RES"
for plan in recipe methods200 claims; do
  limit=0
  if [ "$T" != 0 ]; then
    limit=$(( T - ($(date +%s) - start) ))
    if [ $limit -le "$MIN_START" ]; then echo "reproduce: $plan not started ($limit s left)"; continue; fi
  fi
  python3 benchmarks/study.py --plan="benchmarks/study/$plan.plan" --out="$RES/$plan" --runs_dir="$RUNS_DIR" \
    --time_limit="$limit" --min_start="$MIN_START" --linear_eval="$LINEAR_EVAL" --python="$STUDY_PYTHON" \
    ${GPUS:+--gpus="$GPUS"} > "$RES/$plan.log" 2>&1
  echo "reproduce: $plan: $(grep -c ' exit 0$' "$RES/$plan.log") phases ended well this call (log: $RES/$plan.log)"
done
for plan in recipe methods200 claims; do
  [ -d "$RES/$plan" ] && python3 benchmarks/study.py --plan="benchmarks/study/$plan.plan" --out="$RES/$plan" \
    --summary_only --seeds > /dev/null && echo "reproduce: $RES/$plan/summary.md"
done
if "${PYTHON:-python3}" -c "import matplotlib" 2>/dev/null; then
  DIRS="$RES/recipe $RES/methods200 $RES/claims" PLOTS="$RES/plots" PYTHON="${PYTHON:-python3}" \
    bash benchmarks/study/plots.sh
else
  echo "reproduce: no matplotlib for ${PYTHON:-python3}: plots skipped (PYTHON=... bash benchmarks/study/plots.sh later)"
fi
