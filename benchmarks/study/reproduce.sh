#!/usr/bin/env bash
# The studies of docs/results/reproduction.md in one command, on a machine with one or more GPUs and JAX with
# CUDA (KERAS_BACKEND=jax; no TensorFlow needed): every run of each plan of PLANS, one run per GPU slot at a
# time, each followed by its linear evaluation; then each plan's report (RES/PLAN/summary.md: per
# configuration the seeds run and failed, kNN and linear top-1 as mean +- std, wall clock and images/s) and
# the figures drawn from these runs (RES/plots/).
#   [PLANS="recipe methods200 claims"] [RES=DIR] [RUNS_DIR=DIR] [T=seconds] [GPUS=0,1,...] [PER_GPU=1] \
#     [LINEAR_EVAL=none] [ONLY=NAME,...] bash benchmarks/study/reproduce.sh
#   PLANS=robustness PER_GPU=2 LINEAR_EVAL=none bash benchmarks/study/reproduce.sh    # every shipped config, 5 seeds
#   PLANS=full_schedule bash benchmarks/study/reproduce.sh                            # every shipped config, 3 seeds
# The default PLANS are 114 runs, about 9 GPU-hours on H100s (a two-view 200-epoch run ~6 min, a 50-epoch run
# ~1.5 min, a linear evaluation ~1 min): ~2.5 hours on a machine with 4 GPUs. robustness: 90 runs of 30 epochs,
# about 30 minutes on 4 H200s at PER_GPU=2.
# Resumable: RUNS_DIR (default runs/study) holds each run's folder and backups, RES (default
# runs/study-results) the copies, logs and reports; relative paths are from the repository root. Run the same
# command again after a time limit or a kill with the same disks: a run that finished with the same command is
# not started again, a stopped one continues from its last backup, a missing one starts.
# T: whole seconds for this call (0: none). No run starts in its last MIN_START (100) seconds; at T the runs
# still going get SIGTERM (a backup, then exit) and are killed 90 s later if need be; the reports and figures
# follow, so give T about 2 minutes less than a hard limit. LINEAR_EVAL: the linear evaluation's flags
# (default: augmentation on the device, so a machine with JAX only runs all of it), "none" for none.
# ONLY: these runs of the plans only, started in the order named (comma-separated names; longest first packs
# the GPUs best under T; the reports still cover every run the results hold).
# PYTHON: the figures' interpreter (needs matplotlib; without it the reports are written and the figures
# skipped). A generated plan (robustness, full_schedule) must match `python -m benchmarks.study plan NAME`.
# Exit status: 0 when every run of the plans finished, 3 while some have not (run the command again; a run that
# failed, e.g. diverged, is named and stays unfinished until its flags or seed change), 2 for bad arguments, 1
# when a step itself failed.
set -u
cd "$(dirname "$0")/../.."
PLANS=${PLANS:-recipe methods200 claims}
RES=${RES:-runs/study-results}; RUNS_DIR=${RUNS_DIR:-runs/study}; T=${T:-0}; MIN_START=${MIN_START:-100}
LINEAR_EVAL=${LINEAR_EVAL:---augment_on=device --batch_size=512}
STUDY_PYTHON=${STUDY_PYTHON:-python3}   # the interpreter of the runs (study.py's --python)
for pair in "T=$T" "MIN_START=$MIN_START" "PER_GPU=${PER_GPU:-1}"; do
  case ${pair#*=} in ''|*[!0-9]*) echo "reproduce: ${pair%%=*} must be a whole number; received '${pair#*=}'" >&2; exit 2 ;; esac
done
for plan in $PLANS; do
  [ -f "benchmarks/study/$plan.plan" ] || { echo "reproduce: no benchmarks/study/$plan.plan" >&2; exit 2; }
  case $plan in robustness|full_schedule)
    python3 -m benchmarks.study plan "$plan" | cmp -s - "benchmarks/study/$plan.plan" \
      || { echo "reproduce: benchmarks/study/$plan.plan is stale: python -m benchmarks.study plan $plan > it" >&2; exit 1; } ;;
  esac
done
extra=()
[ "$LINEAR_EVAL" = none ] || extra+=("--linear_eval=$LINEAR_EVAL")
start=$(date +%s); failed=0
mkdir -p "$RES"
for plan in $PLANS; do
  limit=0
  if [ "$T" != 0 ]; then
    limit=$(( T - ($(date +%s) - start) ))
    if [ $limit -le "$MIN_START" ]; then echo "reproduce: $plan not started ($limit s left)"; continue; fi
  fi
  python3 -m benchmarks.study --plan="benchmarks/study/$plan.plan" --out="$RES/$plan" --runs_dir="$RUNS_DIR" \
    --time_limit="$limit" --min_start="$MIN_START" --per_gpu="${PER_GPU:-1}" --python="$STUDY_PYTHON" \
    ${GPUS:+--gpus="$GPUS"} ${ONLY:+--only="$ONLY"} "${extra[@]}" >> "$RES/$plan.log" 2>&1 \
    || { echo "reproduce: $plan: the study failed (see $RES/$plan.log)" >&2; failed=1; }
done
left=0; folders=()
for plan in $PLANS; do
  [ -d "$RES/$plan" ] || { left=1; continue; }
  folders+=("$RES/$plan")
  python3 -m benchmarks.study --plan="benchmarks/study/$plan.plan" --out="$RES/$plan" --summary_only > /dev/null \
    || { failed=1; continue; }
  # the count of unfinished runs; a run that failed (diverged, refused) would stay unfinished however often
  # the command runs, so it is named; exit status 3 while any run is unfinished
  python3 - "$RES/$plan" "$plan" <<'PY' || left=1
import json, sys
folder, plan = sys.argv[1:]
runs = json.load(open(f"{folder}/summary.json"))["tables"][-1]["rows"]  # the report's table per run
from benchmarks.study import read_plan
planned = len(read_plan(f"benchmarks/study/{plan}.plan")[1])
unfinished = [r for r in runs if r["status"] != "finished"]
missing = planned - len(runs)
print(f"reproduce: {folder}/summary.md ({len(unfinished) + missing} runs of {plan} not finished)")
for r in unfinished:
    if r["status"] not in ("not started", "stopped"):
        print(f"reproduce: {r['name']}: {r['status']} (its log: {folder}/{r['name']}/)")
sys.exit(3 if unfinished or missing else 0)
PY
done
if [ ${#folders[@]} -gt 0 ] && "${PYTHON:-python3}" -c "import matplotlib" 2>/dev/null; then
  "${PYTHON:-python3}" -m benchmarks.report study "${folders[@]}" --plots="$RES/plots" > "$RES/report.md" || failed=1
else
  echo "reproduce: no matplotlib for ${PYTHON:-python3}: figures skipped (python -m benchmarks.report study ... --plots=DIR later)"
fi
[ $failed = 0 ] || exit 1
[ $left = 0 ] || { echo "reproduce: runs remain: run the same command again"; exit 3; }
