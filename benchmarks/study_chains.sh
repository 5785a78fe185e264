#!/usr/bin/env bash
# One device call of a study spread over several GPUs: a chain of runs per GPU, each chain running its
# PLAN:RUN items one after the other through benchmarks/study.py (each followed by its linear evaluation),
# every study.py given the time this call has left. study.py is resumable: a run that a call stops at its
# time limit continues from its backup in $RUNS_DIR in the next call (on the same, still warm machine),
# and a finished one exits at once, so every call of a session runs the same command. Results and logs
# gather in $RES across calls; with $OUT set, each call returns all of it as $OUT/res.tgz.
#   T=<seconds> bash benchmarks/study_chains.sh CHAINS_FILE
# CHAINS_FILE: one chain per line, "GPU PLAN:RUN [PLAN:RUN ...]"; PLAN is benchmarks/study/PLAN.plan (or
# a path ending in .plan), GPU an id or "cpu"; '#' starts a comment. Environment: T (default 555),
# MIN_START (no run starts with fewer seconds left; default 100), RES (/tmp/res), RUNS_DIR (/tmp/study),
# LINEAR_EVAL (study.py's --linear_eval; default "--augment_on=device --batch_size=512", "none" for
# none), STUDY_PYTHON (study.py's --python; default this python3).
set -u
chains=${1:?a chains file}
T=${T:-555}; MIN_START=${MIN_START:-100}; RES=${RES:-/tmp/res}; RUNS_DIR=${RUNS_DIR:-/tmp/study}
LINEAR_EVAL=${LINEAR_EVAL:---augment_on=device --batch_size=512}
deadline=$(( $(date +%s) + T ))
mkdir -p "$RES"
call=$(( $(ls "$RES"/gpu-call*.txt 2>/dev/null | wc -l) + 1 ))
ls "$RUNS_DIR" 2>/dev/null | tr '\n' ' '; echo
(date -u; nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>/dev/null) \
  > "$RES/gpu-call$call.txt"

chain() {  # GPU PLAN:RUN ...
  local gpu=$1; shift
  for item in "$@"; do
    local plan=${item%%:*} name=${item#*:} left=$(( deadline - $(date +%s) ))
    case $plan in *.plan) ;; *) plan=benchmarks/study/$plan.plan ;; esac
    if [ $left -le "$MIN_START" ]; then echo "call $call, gpu $gpu: $name not started ($left s left)"; continue; fi
    local extra=()
    [ "$LINEAR_EVAL" = none ] || extra+=("--linear_eval=$LINEAR_EVAL")
    [ -z "${STUDY_PYTHON:-}" ] || extra+=("--python=$STUDY_PYTHON")
    python3 benchmarks/study.py --plan="$plan" --out="$RES/$(basename "$plan" .plan)" --runs_dir="$RUNS_DIR" \
      --gpus="$gpu" --time_limit=$left --min_start="$MIN_START" --only="$name" "${extra[@]}"
  done >> "$RES/chain$gpu.log" 2>&1
}
while read -r line; do
  line=${line%%#*}
  [ -n "${line// }" ] || continue
  # shellcheck disable=SC2086  # the line's words are the chain's arguments
  chain $line &
done < "$chains"
wait
for f in "$RES"/chain*.log; do echo "== $f"; grep "exit\|not started\|time limit" "$f" | tail -6; done
if [ -n "${OUT:-}" ]; then (cd "$RES" && tar czf "$OUT/res.tgz" .) && ls -la "$OUT"; fi
