#!/usr/bin/env bash
# Session 7's device calls (nvidia-h100-x4 asked; carry .whl .data): every call ran this same file, the
# four chains of chains.txt (one per GPU) through benchmarks/study_chains.sh, after the gpu-prep.sh set-up
# when the machine lacked it. Results and logs gathered in /tmp/res across calls; each call returned them all.
#   T=<seconds for this call's runs> bash benchmarks/study/h100x4-session7/call.sh
set -u
export PYTHONPATH=/tmp/site:$PWD KERAS_BACKEND=jax PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TF_CPP_MIN_LOG_LEVEL=2
ls /tmp/site >/dev/null 2>&1 || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --upgrade --target /tmp/site .whl/*.whl && mkdir -p ~/.keras/datasets && cp -r .data/fashion-mnist ~/.keras/datasets/; }
T=${T:-555} bash benchmarks/study_chains.sh benchmarks/study/h100x4-session7/chains.txt
