#!/usr/bin/env bash
# Issue 9, point 7 on one GPU (JAX; run after the scripts/gpu-prep.sh set-up line, $OUT set): the
# GPU-augmented PyTorch peer and the train CLI with the peer's recipe (SGD, lr 0.06 x batch/256,
# wd 5e-4, 10 warm-up epochs; the same ResNet-18 + projector, SimAffinity, batch 512, bf16), 100 epochs,
# kNN every 25, in one job on one card. The CLI runs twice: with an empty XLA compilation cache (a first
# run) and again with it filled (a resumed or repeated run). Writes $OUT/peer.json, peer.log,
# cli-sgd-{cold,warm}-history.json, cli-sgd.log (with each process's wall-clock).
set -uo pipefail
EPOCHS=${EPOCHS:-100}; KNN=${KNN_EVERY:-25}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/cli-sgd.log"
python3 benchmarks/torch_gpu_peer.py --epochs="$EPOCHS" --knn_every="$KNN" --out="$OUT/peer.json" > "$OUT/peer.log" 2>&1
echo "peer exit $?"; tail -4 "$OUT/peer.log"
for run in cold warm; do
  start=$(date +%s.%N)
  python3 -m uniclr_tf.train --flagfile=configs/paper/fashion_mnist_simaffinity.flags --optimizer=sgd --base_learning_rate=0.06 \
    --weight_decay=5e-4 --warmup_epochs=10 --augment_on=device --epochs="$EPOCHS" --knn_every="$KNN" \
    --run_dir=/tmp/pv --run_name="sgd-$run" --overwrite --verbose=2 --nopictures \
    --compilation_cache_dir=/tmp/pv/xla-cache >> "$OUT/cli-sgd.log" 2>&1
  code=$?; end=$(date +%s.%N)
  echo "cli $run exit $code process_seconds $(python3 -c "print(round($end - $start, 1))")" | tee -a "$OUT/cli-sgd.log"
  cp /tmp/pv/sgd-$run/history.json "$OUT/cli-sgd-$run-history.json"
  grep "kNN top-1 (k" "$OUT/cli-sgd.log" | tail -1
done
python3 benchmarks/peer_vs_cli_summary.py --peer="$OUT/peer.json" --cold="$OUT/cli-sgd-cold-history.json" \
  --warm="$OUT/cli-sgd-warm-history.json" --out="$OUT/peer-vs-cli.json"
