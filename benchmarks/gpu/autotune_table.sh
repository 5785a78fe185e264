#!/usr/bin/env bash
# Makes (or extends) the XLA autotuning table of uniclr_tf/training/autotune.py for the card of this GPU machine:
# each shipped GPU configuration trains one epoch (kNN monitor, final evaluation and pictures included, so
# every program a run compiles is tuned) with an empty compilation cache and without the shipped table;
# `python -m uniclr_tf.training.autotune collect` then adds every cache's autotune results to
# uniclr_tf/training/autotune_tables/jaxlib-<version>.json, copied to RESULTS_DIR. One configuration per GPU at a
# time (XLA times kernels on the GPU it compiles for; nothing else runs on that GPU meanwhile).
#   bash benchmarks/gpu/autotune_table.sh RESULTS_DIR        (after the gpu-prep.sh set-up line)
# CONFIGS="name|flags;name|flags" in the environment replaces the list below.
set -u
res=${1:?results folder}; mkdir -p "$res"
work=/tmp/autotune-table; rm -rf "$work"; mkdir -p "$work"
SGD="--optimizer=sgd --base_learning_rate=0.06 --weight_decay=5e-4"  # the PyTorch peer's recipe (docs/results/speed.md)
DEFAULT="simaffinity|--flagfile=configs/simaffinity.flags;simtrace|--flagfile=configs/simtrace.flags;\
simwhitening|--flagfile=configs/simwhitening.flags;paper-simaffinity|--flagfile=configs/paper/fashion_mnist_simaffinity.flags;\
paper-simaffinity-sgd|--flagfile=configs/paper/fashion_mnist_simaffinity.flags $SGD;\
paper-simtrace|--flagfile=configs/paper/fashion_mnist_simtrace.flags;paper-simwhitening|--flagfile=configs/paper/fashion_mnist_simwhitening.flags"
IFS=';' read -r -a CONFIGS <<< "${CONFIGS:-$DEFAULT}"
gpus=$(nvidia-smi -L | wc -l)
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee "$res/gpus.txt"
python3 -c "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__)" | tee -a "$res/gpus.txt"
for ((g = 0; g < gpus; g++)); do
  ( for ((i = g; i < ${#CONFIGS[@]}; i += gpus)); do
      name=${CONFIGS[$i]%%|*}; flags=${CONFIGS[$i]#*|}
      start=$(date +%s.%N)
      # shellcheck disable=SC2086
      CUDA_VISIBLE_DEVICES=$g python3 -m uniclr_tf.train $flags --augment_on=device --epochs=1 --warmup_epochs=0 \
          --knn_every=1 --verbose=2 --run_dir="$work/runs" --run_name="$name" --overwrite \
          --compilation_cache_dir="$work/cache-$name" --noautotune_table > "$res/$name.log" 2>&1
      echo "$name (GPU $g) exit $? process_seconds $(python3 -c "import time; print(round(time.time() - $start, 1))")" \
          | tee -a "$res/$name.log"
    done ) &
done
wait
names=$(for c in "${CONFIGS[@]}"; do printf '%s,' "${c%%|*}"; done)
caches=(); for d in "$work"/cache-*; do [ -d "$d/xla_gpu_per_fusion_autotune_cache_dir" ] && caches+=("$d"); done
python3 -m uniclr_tf.training.autotune collect "${caches[@]}" --configs="${names%,}" | tee -a "$res/gpus.txt"
python3 -m uniclr_tf.training.autotune list | tee -a "$res/gpus.txt"
cp uniclr_tf/training/autotune_tables/jaxlib-*.json "$res/"
