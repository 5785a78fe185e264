#!/usr/bin/env bash
# Issue 10 on 2 GPUs of one host: does per-device batch norm (--batch_norm=per_device) recover the
# weak-scaling efficiency that global BN loses, and what does it do to what the model learns?
#   bash benchmarks/gpu/bn_scaling.sh RESULTS_DIR     (after the gpu-prep set-up line; 2 GPUs)
# 1. timed, alone: scaling.sh's g1 and g2 (1 GPU batch 512; 1 process x 2 GPUs batch 1024, 4 epochs)
#    with global BN, then again with --batch_norm=per_device (RESULTS_DIR/{global,per_device}/scaling.json).
# 2. learning: configs/simaffinity.flags (the SGD recipe, two views as measured) on 2 GPUs, global batch 1024, 50 epochs, kNN
#    every 10 epochs, global then per-device BN (RESULTS_DIR/learn-{global,per_device}-history.json).
#    LEARN=0 skips it.
set -u
res=${1:?results folder}
mkdir -p "$res"
for bn in global per_device; do
  OUT=$res/$bn RUNS=/tmp/bn-scaling-$bn ONLY="g1 g2" EPOCHS=4 EXTRA="--batch_norm=$bn" NCCL_DEBUG=WARN \
    bash benchmarks/scaling.sh > "$res/scaling-$bn.log" 2>&1
  echo "== $bn: $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print({r: {k: v for k, v in d['rows'][r].items() if k in ('images_per_s', 'per_gpu', 'weak_scaling_efficiency', 'images_per_s_wall', 'first_epoch_s')} for r in d['rows']})" "$res/$bn/scaling.json" 2>&1)"
done
[ "${LEARN:-1}" = 1 ] || exit 0  # LEARN=0: the timed part only
for bn in global per_device; do
  start=$SECONDS
  CUDA_VISIBLE_DEVICES=0,1 timeout 170 python3 -m uniclr_tf.train --flagfile=configs/simaffinity.flags --num_local_crops=0 --augment_on=device \
    --strategy=data_parallel --batch_size=1024 --epochs=50 --warmup_epochs=5 --knn_every=10 --batch_norm=$bn \
    --nopictures --verbose=2 --run_dir=/tmp/bn-learn --run_name=$bn --overwrite --compilation_cache_dir=/tmp/xla-cache \
    > "$res/learn-$bn.log" 2>&1
  echo "== learn $bn: exit $? after $((SECONDS - start)) s; $(grep -E "kNN|knn" "$res/learn-$bn.log" | tail -n 2 | tr '\n' ' ')"
  cp /tmp/bn-learn/$bn/history.json "$res/learn-$bn-history.json" 2>/dev/null
done
