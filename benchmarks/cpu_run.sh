#!/usr/bin/env bash
# The CPU figures of issue 5: TensorFlow backend on the 2-core development machine, float32.
#   bash benchmarks/cpu_run.sh        (from the repository root; about 20 minutes)
# 1. ResNet-18 (CIFAR stem) + 2048-2048-256 at 28x28x1, batch 512: the model.
# 2. The CPU quickstart model (configs/quickstart.flags: tiny encoder width 32, projector
#    512-512-128, SimAffinity, batch 256) at 28x28x1, plus the objective costs (d) on the CPU.
# 3. The same quickstart model at 32x32x3 (colour jitter and grayscale active: the heavier host pipeline).
# Other processes on the machine skew these timings: each section records the 1-minute load average.
set -euo pipefail
export TF_CPP_MIN_LOG_LEVEL=2 KERAS_BACKEND=tensorflow
PY=${PYTHON:-.venv/bin/python}
$PY -m benchmarks.bench --data=fashion_mnist --image_shape=28,28,1 --encoder=resnet18 \
  --projector_dims=2048,2048,256 --batch_size=512 --precision=float32 --sections=a,c,b \
  --warmup_steps=1 --steps=2 --reps=3 --out=benchmarks/results/speed/cpu-tf-resnet18-28x28x1.json
$PY -m benchmarks.bench --data=fashion_mnist --image_shape=28,28,1 --encoder=tiny --encoder_width=32 \
  --projector_dims=512,512,128 --objective=simaffinity --batch_size=256 --precision=float32 \
  --sections=a,c,b,d --warmup_steps=3 --steps=10 --reps=5 --objective_n=256,512,1024 \
  --objective_d=128,256,2048 --whitening_n=512 --whitening_group_dims=256,64 --objective_iters=5 \
  --out=benchmarks/results/speed/cpu-tf-quickstart-28x28x1.json
$PY -m benchmarks.bench --data=fashion_mnist --image_shape=32,32,3 --encoder=tiny --encoder_width=32 \
  --projector_dims=512,512,128 --objective=simaffinity --batch_size=256 --precision=float32 \
  --sections=a,c,b --warmup_steps=3 --steps=10 --reps=5 --out=benchmarks/results/speed/cpu-tf-quickstart-32x32x3.json
