#!/usr/bin/env bash
# Weak scaling of the real train CLI on the GPUs of one host (JAX), ResNet-18 on Fashion-MNIST,
# augmentation on the device, per-GPU batch 512: 1 GPU; 1 process x 2 GPUs (DataParallel);
# 2 processes x 1 GPU (multi-controller, NCCL). Images/s from history.json, epochs 2..EPOCHS.
#   bash benchmarks/scaling.sh          (after the gpu-prep set-up line; writes $OUT/scaling.json)
set -u
OUT=${OUT:-/tmp/scaling-out}; mkdir -p "$OUT"
EPOCHS=${EPOCHS:-6}
export KERAS_BACKEND=jax PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
COMMON="--flagfile=configs/simaffinity.flags --augment_on=device --epochs=$EPOCHS --warmup_epochs=1 --knn_every=0 --run_dir=/tmp/scaling --overwrite --verbose=2"
train() { timeout "${LIMIT:-150}" python3 -m uniclr_tf.train $COMMON "$@"; }
ONLY=${ONLY:-g1 g2 p2}
if [[ " $ONLY " == *" g1 "* ]]; then
  CUDA_VISIBLE_DEVICES=0 train --run_name=g1 --batch_size=512 > "$OUT/g1.log" 2>&1; echo "g1 exit $?"
fi
if [[ " $ONLY " == *" g2 "* ]]; then
  CUDA_VISIBLE_DEVICES=0,1 train --run_name=g2 --batch_size=1024 --strategy=data_parallel > "$OUT/g2.log" 2>&1; echo "g2 exit $?"
fi
port=$((20000 + RANDOM % 10000))
[[ " $ONLY " == *" p2 "* ]] && for i in 0 1; do
  CUDA_VISIBLE_DEVICES=$i train --run_name=p2 --batch_size=1024 --strategy=data_parallel --num_processes=2 \
    --process_id=$i --coordinator_address=127.0.0.1:$port > "$OUT/p2-$i.log" 2>&1 &
done
wait; echo "p2 done"
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]; rows = {}
for name, gpus in (("g1", 1), ("g2", 2), ("p2", 2)):
    try:
        h = json.load(open(f"/tmp/scaling/{name}/history.json"))
        cfg = json.load(open(f"/tmp/scaling/{name}/config.json"))
    except OSError as e:
        rows[name] = {"error": str(e)}; continue
    steps, batch = cfg["steps_per_epoch"], cfg["batch_size"]
    secs = h[-1]["wall_seconds"] - h[0]["wall_seconds"]
    rate = (len(h) - 1) * steps * batch / secs
    rows[name] = {"gpus": gpus, "batch": batch, "images_per_s": rate, "per_gpu": rate / gpus,
                  "first_epoch_s": h[0]["wall_seconds"], "epochs": len(h)}
base = rows.get("g1", {}).get("per_gpu")
for r in rows.values():
    if base and "per_gpu" in r:
        r["weak_scaling_efficiency"] = r["per_gpu"] / base
json.dump(rows, open(f"{out}/scaling.json", "w"), indent=2)
for k, r in rows.items(): print(k, r)
PY
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
