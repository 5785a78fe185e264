#!/usr/bin/env bash
# Issue 9, the cold first run: how much of the train step's first compile is XLA's GPU autotuning that a
# table of earlier autotuning results (XLA's per-fusion autotune cache, kept by JAX's compilation cache
# in <cache>/xla_gpu_per_fusion_autotune_cache_dir) would save, on a machine with 4 GPUs, one job:
#   GPU 0: table run A (2 epochs, empty cache, JAX's default XLA caches), then A2 (3 epochs, a fresh
#          cache holding only A's autotune results), then the 100-epoch SGD recipe run seeded the same way;
#   GPU 1: table run B (the same, JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES=all: autotune results and the
#          compiled-kernel cache), then B2 seeded with both, then the 100-epoch LARS run (kNN every 10)
#          seeded with A's autotune results;
#   GPU 2: the GPU-augmented PyTorch peer, 100 epochs, kNN every 25;
#   GPU 3: the 100-epoch SGD recipe run (kNN every 25) and the LARS run (kNN every 10), empty caches.
# Run after the gpu-prep.sh set-up line, $OUT set. Everything lands in $OUT (logs, histories, tables).
set -u
W=/tmp/tp; mkdir -p $W "$OUT"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpus.txt"
python3 -c "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__)" | tee -a "$OUT/gpus.txt"
SGD="--flagfile=configs/paper/fashion_mnist_simaffinity.flags --optimizer=sgd --base_learning_rate=0.06 --weight_decay=5e-4 --warmup_epochs=10 --augment_on=device --verbose=2 --nopictures --overwrite"
LARS="--flagfile=configs/paper/fashion_mnist_simaffinity.flags --augment_on=device --verbose=2 --nopictures --overwrite"

train() {  # GPU NAME CACHE [flags...]: one CLI run, its wall-clock and history into $OUT
  local gpu=$1 name=$2 cache=$3; shift 3
  local start; start=$(date +%s.%N)
  CUDA_VISIBLE_DEVICES=$gpu JAX_LOG_COMPILES=1 python3 -m uniclr_tf.train "$@" --run_dir=$W/runs --run_name="$name" \
      --compilation_cache_dir="$cache" > "$OUT/$name.log" 2>&1
  echo "$name exit $? process_seconds $(python3 -c "import time; print(round(time.time() - $start, 1))")" | tee -a "$OUT/$name.log"
  cp $W/runs/$name/history.json "$OUT/$name-history.json" 2>/dev/null
  python3 benchmarks/compile_report.py "$OUT/$name.log" --json="$OUT/$name-compile.json" --top=6 > "$OUT/$name-compile.txt" 2>&1
}
seed() {  # FROM_CACHE TO_CACHE [kernels]: a fresh cache with only the autotune results (and kernel cache)
  mkdir -p "$2"; cp -r "$1/xla_gpu_per_fusion_autotune_cache_dir" "$2/"
  [ "${3:-}" = kernels ] && cp "$1/xla_gpu_kernel_cache_file" "$2/" 2>/dev/null
  echo "seeded $2: $(ls "$2/xla_gpu_per_fusion_autotune_cache_dir" | wc -l) autotune entries"
}
entries() { echo "$1: $(ls "$2/xla_gpu_per_fusion_autotune_cache_dir" 2>/dev/null | wc -l) autotune entries, $(du -sk "$2/xla_gpu_per_fusion_autotune_cache_dir" 2>/dev/null | cut -f1) KiB; kernel cache $(du -k "$2/xla_gpu_kernel_cache_file" 2>/dev/null | cut -f1) KiB" | tee -a "$OUT/tables.txt"; }

( train 0 A $W/cA $SGD --epochs=2 --knn_every=1 --warmup_epochs=1; entries A $W/cA
  seed $W/cA $W/cA2; train 0 A2 $W/cA2 $SGD --epochs=3 --knn_every=1 --warmup_epochs=1; entries A2-after $W/cA2
  mkdir -p "$OUT/table"; cp -r $W/cA/xla_gpu_per_fusion_autotune_cache_dir "$OUT/table/"
  seed $W/cA $W/cS; train 0 sgd-table $W/cS $SGD --epochs=100 --knn_every=25; entries sgd-table-after $W/cS ) &
( JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES=all train 1 B $W/cB $SGD --epochs=2 --knn_every=1 --warmup_epochs=1; entries B $W/cB
  seed $W/cB $W/cB2 kernels
  JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES=all train 1 B2 $W/cB2 $SGD --epochs=3 --knn_every=1 --warmup_epochs=1; entries B2-after $W/cB2
  while [ ! -d "$OUT/table" ]; do sleep 2; done
  seed $W/cA $W/cL; train 1 lars-table $W/cL $LARS --epochs=100 --knn_every=10; entries lars-table-after $W/cL ) &
( CUDA_VISIBLE_DEVICES=2 python3 benchmarks/torch_gpu_peer.py --epochs=100 --knn_every=25 --out="$OUT/peer.json" > "$OUT/peer.log" 2>&1
  echo "peer exit $?" | tee -a "$OUT/peer.log" ) &
( train 3 sgd-cold $W/c3 $SGD --epochs=100 --knn_every=25
  train 3 lars-cold $W/c4 $LARS --epochs=100 --knn_every=10 ) &
wait
tail -n 3 "$OUT"/*-compile.txt
grep -h "exit\|kNN top-1 (k" "$OUT"/*.log | tail -n 30
