#!/usr/bin/env bash
# Prepares this checkout for a machine with GPUs, Python 3.12 and JAX with CUDA, but no TensorFlow and no
# network access (docs/stack.md). Training there uses Keras 3 on the JAX backend. Run it on a machine with
# network access, in the repository:
#   bash scripts/gpu-prep.sh [EXTRA_WHEEL_SPEC ...]
# It
#   1. downloads the wheels such a machine lacks (Keras, namex, optree, Keras Hub for the vit_* encoders,
#      and any extra spec given) into .whl/ (git-ignored), for CPython 3.12 on manylinux x86-64; keras-hub's
#      own dependencies regex and tokenizers are assumed present, and --no-deps keeps out the
#      tensorflow-text it declares (docs/stack.md);
#   2. copies Fashion-MNIST (Debian package dataset-fashion-mnist) into .data/fashion-mnist/ (git-ignored).
# Copy the checkout with .whl/ and .data/ to that machine and, there, before any benchmarks/*.sh:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
#     && export PYTHONPATH=/tmp/site:$PWD KERAS_BACKEND=jax \
#     && mkdir -p ~/.keras/datasets && cp -r .data/fashion-mnist ~/.keras/datasets/
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
