#!/usr/bin/env bash
# Issue 9: where a first (cold) run's compile time goes on a GPU. Runs the train CLI with an empty
# compilation cache and JAX_LOG_COMPILES=1, once per XLA_FLAGS variant, one after the other (compile
# times are CPU-bound: nothing else runs meanwhile), then benchmarks/compile_report.py on each log.
#   bash benchmarks/gpu/compile_report.sh RESULTS_DIR [CONFIG] [EPOCHS] [EXTRA TRAIN FLAGS...]
# (docs/results/speed.md's numbers: configs/simaffinity.flags with its two global views, --num_local_crops=0.)
# (after the gpu-prep set-up line). RESULTS_DIR gets v<i>.log, v<i>.json (the report), v<i>-history.json.
set -u
res=${1:?results folder}; config=${2:-configs/simaffinity.flags}; epochs=${3:-3}; shift $(( $# < 3 ? $# : 3 ))
# XLA_FLAGS variants (VARIANTS="a|b|c" in the environment overrides; "" = XLA's defaults). The XLA of
# jaxlib 0.11.2 refuses --xla_gpu_enable_llvm_module_compilation_parallelism (unknown flag).
IFS='|' read -r -a VARIANTS <<< "${VARIANTS:-|--xla_gpu_force_compilation_parallelism=16|--xla_gpu_autotune_level=0}"
mkdir -p "$res"
for i in "${!VARIANTS[@]}"; do
  start=$(date +%s.%N)
  XLA_FLAGS="${VARIANTS[$i]}" JAX_LOG_COMPILES=1 timeout "${LIMIT:-150}" python3 -m uniclr_tf.train --flagfile="$config" \
    --augment_on=device --epochs="$epochs" --warmup_epochs=1 --knn_every=1 --compilation_cache_dir= --nopictures \
    --verbose=2 --run_dir=/tmp/compile-report --run_name="v$i" --overwrite "$@" > "$res/v$i.log" 2>&1
  echo "exit $? xla_flags '${VARIANTS[$i]}' process_seconds $(python3 -c "import time; print(round(time.time() - $start, 1))")" \
    | tee -a "$res/v$i.log"
  cp /tmp/compile-report/v$i/history.json "$res/v$i-history.json" 2>/dev/null
  python3 benchmarks/compile_report.py "$res/v$i.log" --json="$res/v$i.json" --top=12
  python3 -c "import json,sys; h=json.load(open(sys.argv[1])); print('step_seconds per epoch:', [round(e['step_seconds'], 2) for e in h], 'kNN s:', [round(e.get('knn_seconds', 0), 2) for e in h])" "$res/v$i-history.json" 2>/dev/null
done
