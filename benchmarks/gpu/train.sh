#!/usr/bin/env bash
# Real pretraining runs of the train CLI on the lent GPU (JAX backend, no TensorFlow there):
# ResNet-18 on Fashion-MNIST with the paper's recipe (configs/<objective>.flags), augmentation on
# the device, shortened to EPOCHS epochs. Copies the small result files of each run to $OUT.
#   bash benchmarks/gpu/train.sh simaffinity simtrace        (after the gpu-prep.sh set-up line)
set -uo pipefail
EPOCHS=${EPOCHS:-100}
for objective in "$@"; do
  echo "=== $objective: $EPOCHS epochs"
  timeout "${PHASE_TIMEOUT:-420}" python3 -m uniclr_tf.train --flagfile="configs/$objective.flags" \
    --augment_on=device --epochs="$EPOCHS" --knn_every=25 --run_dir=/tmp/runs --run_name="gpu-$objective" \
    > "$OUT/train-$objective.log" 2>&1
  echo "exit $?"
  tr '\r' '\n' < "$OUT/train-$objective.log" | grep -E "kNN|run folder|steps/epoch|Error|error" | tail -8
  for f in metrics.json history.json flags.txt; do
    cp "/tmp/runs/gpu-$objective/$f" "$OUT/$objective-$f" 2>/dev/null
  done
done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
