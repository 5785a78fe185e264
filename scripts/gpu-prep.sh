#!/usr/bin/env bash
# Prepare this checkout for a run on a GPU machine that has Python 3.12 with JAX (CUDA) but no
# TensorFlow and no network (the lent device machines; docs/stack.md). GPU runs there use Keras 3 on
# the JAX backend. Run from the development machine, in the repository:
#   bash scripts/gpu-prep.sh [EXTRA_WHEEL_SPEC ...]
# It
#   1. downloads the wheels the GPU machine lacks (Keras, namex, optree, Keras Hub for the vit_*
#      encoders, and any extra spec given) into .whl/ (git-ignored), for CPython 3.12 on manylinux
#      x86-64; keras-hub's own dependencies regex and tokenizers are in the GPU image already, and
#      --no-deps keeps out the tensorflow-text it declares (docs/stack.md);
#   2. copies Fashion-MNIST (Debian package dataset-fashion-mnist) into .data/fashion-mnist/ (git-ignored).
# Then give the device command carry [".whl", ".data"] and begin it with:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
#     && export PYTHONPATH=/tmp/site:$PWD KERAS_BACKEND=jax \
#     && mkdir -p ~/.keras/datasets && cp -r .data/fashion-mnist ~/.keras/datasets/
# (benchmarks/gpu/run.sh and benchmarks/gpu/train.sh are then run the same way).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl .data/fashion-mnist
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
for spec in "keras==${KERAS_VERSION:-3.15.1}" namex optree "keras-hub==${KERAS_HUB_VERSION:-0.32.0}" "$@"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${plat[@]}" -d .whl "$spec"
done
src=/usr/share/datasets/fashion-mnist
if [ ! -d "$src" ]; then
  apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist
fi
cp "$src"/*.gz .data/fashion-mnist/
du -sh .whl .data
