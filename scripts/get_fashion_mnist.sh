#!/usr/bin/env bash
# Puts Fashion-MNIST where keras.datasets.fashion_mnist.load_data() reads it offline:
# ~/.keras/datasets/fashion-mnist/*.gz. Source, in order: the Debian package dataset-fashion-mnist
# (already installed, or installed with apt-get where available), else the online download
# through TFDS's fashion_mnist builder, written back in the same IDX format.
set -euo pipefail
dest="${HOME}/.keras/datasets/fashion-mnist"
files="train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz"
have_all() { for f in $files; do [ -s "$1/$f" ] || return 1; done; }
have_all "$dest" && exit 0
src=/usr/share/datasets/fashion-mnist
if ! have_all "$src" && command -v apt-get >/dev/null 2>&1; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  ($sudo apt-get update -qq && $sudo apt-get install -y -qq dataset-fashion-mnist) >/dev/null 2>&1 || true
fi
mkdir -p "$dest"
if have_all "$src"; then
  cp "$src"/*.gz "$dest"/
  echo "Fashion-MNIST copied from the Debian package into $dest"
else
  echo "dataset-fashion-mnist unavailable: downloading through TFDS"
  "${PYTHON:-python3}" scripts/tfds_to_idx.py "$dest"
fi
