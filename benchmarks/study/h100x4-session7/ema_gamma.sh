#!/usr/bin/env bash
# Session 7, last device call (2 GPUs; carry .whl .data): why two-view SimAffinity with an EMA target and no
# predictor does not learn (methods200.plan row simaffinity-ema-e200). The first 25 epochs of the same
# 200-epoch schedule (--stop_after_steps; 117 steps an epoch), kNN every 5 epochs: GPU 0 without the
# symmetric loss (--gamma=0), GPU 1 as the failed run but with seed 1. Histories to $OUT.
set -u
export PYTHONPATH=/tmp/site:$PWD KERAS_BACKEND=jax PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
ls /tmp/site >/dev/null 2>&1 || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --upgrade --target /tmp/site .whl/*.whl && mkdir -p ~/.keras/datasets && cp -r .data/fashion-mnist ~/.keras/datasets/; }
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
COMMON="--flagfile=configs/simaffinity.flags --augment_on=device --epochs=200 --knn_every=5 --optimizer=sgd
  --base_learning_rate=0.06 --weight_decay=5e-4 --warmup_epochs=10 --num_local_crops=0 --ema_momentum=0.99
  --stop_after_steps=$((25 * 117)) --run_dir=/tmp/eg --verbose=2 --nopictures --overwrite"
CUDA_VISIBLE_DEVICES=0 timeout ${LIMIT:-140} python3 -m uniclr_tf.train $COMMON --gamma=0 --run_name=ema-g0 > $OUT/ema-g0.log 2>&1 &
CUDA_VISIBLE_DEVICES=1 timeout ${LIMIT:-140} python3 -m uniclr_tf.train $COMMON --seed=1 --run_name=ema-g0.01-s1 > $OUT/ema-g0.01-s1.log 2>&1 &
wait
for r in ema-g0 ema-g0.01-s1; do cp /tmp/eg/$r/history.json $OUT/$r-history.json; python3 -c "
import json, sys; h = json.load(open(sys.argv[1]))
print(sys.argv[2], [(e['epoch'], round(e['cross_entropy'], 2), e.get('knn_top1')) for e in h])" $OUT/$r-history.json $r; done
