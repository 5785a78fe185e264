#!/usr/bin/env bash
# Issue 9's cold goals on a fresh 4-GPU machine, one job, every run with an empty compilation cache (a first
# run on the machine), with and without the shipped XLA autotuning table (uniclr_tf/training/autotune.py):
#   GPU 0: the GPU-augmented PyTorch peer, 100 epochs, kNN every 25 (benchmarks/torch_gpu_peer.py);
#   GPU 1: the train CLI with the peer's recipe (SGD; gpu/peer_vs_cli.sh's flags), 100 epochs, kNN every 25, table on;
#   GPU 2: the same without the table (--noautotune_table), then the paper's LARS recipe, kNN every 10, without it;
#   GPU 3: benchmarks.cli_vs_bench: the bench's model-only step, then the LARS recipe, kNN every 10, table on.
# A card the shipped table lacks gets one first (gpu/autotune_table.sh on the two recipes; said in the log).
# On a machine with fewer than 4 GPUs, GPU 0 runs the table-on SGD run, then the peer, then the LARS run.
# Run after the gpu-prep.sh set-up line; writes logs, histories and JSON to RESULTS_DIR (default $OUT/first-run).
set -u
res=${1:-$OUT/first-run}; mkdir -p "$res"; W=/tmp/first-run; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader | tee "$res/gpus.txt"
card=$(python3 -c "import jax; print(jax.devices()[0].device_kind)")
PEER_RECIPE="--optimizer=sgd --base_learning_rate=0.06 --weight_decay=5e-4"  # the PyTorch peer's (docs/results/speed.md)
if ! python3 -m uniclr_tf.training.autotune list 2>/dev/null | grep -q "  $card:"; then
  echo "the shipped table has no $card: making one for the two recipes first" | tee -a "$res/gpus.txt"
  CONFIGS="paper-simaffinity|--flagfile=configs/paper/fashion_mnist_simaffinity.flags;paper-simaffinity-sgd|--flagfile=configs/paper/fashion_mnist_simaffinity.flags $PEER_RECIPE" \
    bash benchmarks/gpu/autotune_table.sh "$res/table" > "$res/table.log" 2>&1
fi
python3 -m uniclr_tf.training.autotune list | tee -a "$res/gpus.txt"
SGD="--flagfile=configs/paper/fashion_mnist_simaffinity.flags $PEER_RECIPE --warmup_epochs=10 --augment_on=device --epochs=100 --knn_every=25 --verbose=2 --nopictures --overwrite"
LARS="--flagfile=configs/paper/fashion_mnist_simaffinity.flags --augment_on=device --epochs=100 --knn_every=10 --verbose=2 --nopictures --overwrite"
train() {  # GPU NAME [flags...]: one CLI run with an empty cache; its process seconds, history and metrics
  local gpu=$1 name=$2; shift 2
  local start; start=$(date +%s.%N)
  # shellcheck disable=SC2086
  CUDA_VISIBLE_DEVICES=$gpu python3 -m uniclr_tf.train "$@" --run_dir=$W/runs --run_name="$name" \
      --compilation_cache_dir=$W/cache-$name > "$res/$name.log" 2>&1
  echo "$name exit $? process_seconds $(python3 -c "import time; print(round(time.time() - $start, 1))")" | tee -a "$res/$name.log"
  cp $W/runs/$name/history.json "$res/$name-history.json"; cp $W/runs/$name/metrics.json "$res/$name-metrics.json"
}
peer() {
  CUDA_VISIBLE_DEVICES=$1 python3 benchmarks/torch_gpu_peer.py --epochs=100 --knn_every=25 --out="$res/peer.json" > "$res/peer.log" 2>&1
  echo "peer exit $?" | tee -a "$res/peer.log"
}
lars_table() {
  CUDA_VISIBLE_DEVICES=$1 python3 -m benchmarks.cli_vs_bench --flagfile=configs/paper/fashion_mnist_simaffinity.flags \
    --epochs=100 --knn_every=10 --work=$W/cvb --out="$res/lars-table-cli-vs-bench.json" -- --nopictures > "$res/lars-table.log" 2>&1
  echo "cli_vs_bench exit $?" | tee -a "$res/lars-table.log"; cp $W/cvb/cli/history.json "$res/lars-table-history.json"
}
if [ "$(nvidia-smi -L | wc -l)" -lt 4 ]; then
  train 0 sgd-table $SGD; peer 0; lars_table 0
  exit 0
fi
( peer 0 ) &
( train 1 sgd-table $SGD ) &
( train 2 sgd-notable $SGD --noautotune_table; train 2 lars-notable $LARS --noautotune_table ) &
( lars_table 3 ) &
wait
grep -h "XLA autotuning\|kNN top-1 (k" "$res"/*.log
