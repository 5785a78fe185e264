#!/usr/bin/env bash
# Issue 12's whole study in one command: every run of recipe.plan, methods200.plan and claims.plan (114 runs),
# one run per GPU of this machine at a time, each followed by its linear evaluation; then each plan's table
# with mean +- std over seeds (RES/PLAN/summary.md) and every plot of docs/results/reproduction.md drawn from these runs
# (RES/plots/). About 9 GPU-hours on H100s (2-view 200-epoch run ~6 min, 50-epoch ~1.5 min, a linear
# evaluation ~1 min): ~2.5 hours on a 4-GPU machine.
#   [RES=DIR] [RUNS_DIR=DIR] [T=seconds] [GPUS=0,1,...] bash benchmarks/study/reproduce.sh
# Resumable: RUNS_DIR (default runs/study) holds each run's folder and backups, RES (default
# runs/study-results) the copies, logs and tables; relative paths are from the repository root. Run the same
# command again after a time limit, a kill or a new GPU job with the same disks: a run that finished with
# the same command is not started again, a stopped one continues from its last backup, a missing one starts.
# T: whole seconds for this call (0: none). No run starts in its last MIN_START (100) seconds; at T the runs
# still going get SIGTERM (a backup, then exit) and are killed 90 s later if need be; the tables and plots
# follow, so give T about 2 minutes less than a hard limit. The linear evaluation augments on the device
# (LINEAR_EVAL), so a machine with JAX only (KERAS_BACKEND=jax) runs all of it. PYTHON: the plots'
# interpreter (needs matplotlib; without it the tables are written and the plots skipped). Exit status: 0
# when every run of the three plans finished, 3 while some have not (run the command again; a run that
# failed, e.g. diverged, is named and stays unfinished until its flags or seed change), 2 for bad arguments,
# 1 when a step itself failed.
set -u
cd "$(dirname "$0")/../.."
RES=${RES:-runs/study-results}; RUNS_DIR=${RUNS_DIR:-runs/study}; T=${T:-0}; MIN_START=${MIN_START:-100}
LINEAR_EVAL=${LINEAR_EVAL:---augment_on=device --batch_size=512}
STUDY_PYTHON=${STUDY_PYTHON:-python3}   # the interpreter of the runs (study.py's --python)
for pair in "T=$T" "MIN_START=$MIN_START"; do
  case ${pair#*=} in ''|*[!0-9]*) echo "reproduce: ${pair%%=*} must be whole seconds; received '${pair#*=}'" >&2; exit 2 ;; esac
done
PLANS="recipe methods200 claims"
start=$(date +%s); failed=0
mkdir -p "$RES"
for plan in $PLANS; do
  limit=0
  if [ "$T" != 0 ]; then
    limit=$(( T - ($(date +%s) - start) ))
    if [ $limit -le "$MIN_START" ]; then echo "reproduce: $plan not started ($limit s left)"; continue; fi
  fi
  python3 benchmarks/study.py --plan="benchmarks/study/$plan.plan" --out="$RES/$plan" --runs_dir="$RUNS_DIR" \
    --time_limit="$limit" --min_start="$MIN_START" --linear_eval="$LINEAR_EVAL" --python="$STUDY_PYTHON" \
    ${GPUS:+--gpus="$GPUS"} >> "$RES/$plan.log" 2>&1 || { echo "reproduce: $plan: study.py failed (see $RES/$plan.log)" >&2; failed=1; }
done
left=0
for plan in $PLANS; do
  [ -d "$RES/$plan" ] || { left=1; continue; }
  python3 benchmarks/study.py --plan="benchmarks/study/$plan.plan" --out="$RES/$plan" --summary_only --seeds > /dev/null \
    || { failed=1; continue; }
  # the count of unfinished runs; a run that failed (diverged, refused) would stay unfinished however often
  # the command runs, so it is named; exit status 3 while any run is unfinished
  python3 - "$RES/$plan" "$plan" <<'PY' || left=1
import json, sys
folder, plan = sys.argv[1:]
rows = json.load(open(f"{folder}/summary.json"))["rows"]
unfinished = [r for r in rows if r["status"] != "finished"]
print(f"reproduce: {folder}/summary.md ({len(unfinished)} runs of {plan} not finished)")
for r in unfinished:
    if r["status"] not in ("not started", "stopped"):
        print(f"reproduce: {r['name']}: {r['status']} (its log: {folder}/{r['name']}/)")
sys.exit(3 if unfinished else 0)
PY
done
if "${PYTHON:-python3}" -c "import matplotlib" 2>/dev/null; then
  DIRS="$RES/recipe $RES/methods200 $RES/claims" PLOTS="$RES/plots" PYTHON="${PYTHON:-python3}" \
    bash benchmarks/study/plots.sh
  rc=$?  # 3: a configuration missing, expected while runs remain (partial results draw partial plots)
  [ $rc = 0 ] || { [ $rc = 3 ] && [ $left = 1 ]; } || failed=1
else
  echo "reproduce: no matplotlib for ${PYTHON:-python3}: plots skipped (PYTHON=... bash benchmarks/study/plots.sh later)"
fi
[ $failed = 0 ] || exit 1
[ $left = 0 ] || { echo "reproduce: runs remain: run the same command again"; exit 3; }
