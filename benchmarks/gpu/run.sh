#!/usr/bin/env bash
# The GPU suite of issue 5, in one call of the device tool (one H100/H200, Python 3.12, JAX, PyTorch,
# no TensorFlow). Run from the repository root after the set-up line that gpu-prep.sh prints:
#
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
#     && export PYTHONPATH=/tmp/site:$PWD KERAS_BACKEND=jax \
#     && mkdir -p ~/.keras/datasets && cp -r .data/fashion-mnist ~/.keras/datasets/ \
#     && bash benchmarks/gpu/run.sh [PHASE ...]
#
# PHASES (default: jax32 jax28 torch32 torch28):
#   jax32    python -m benchmarks.bench, ResNet-18 at 32x32x3 (Fashion-MNIST padded, grey repeated), sections a,c,b,d
#   jax28    the same at 28x28x1 (Fashion-MNIST as is), sections a,c,b
#   torch32  benchmarks/torch_peer.py at 32x32x3 (16 DataLoader workers)
#   torch28  benchmarks/torch_peer.py at 28x28x1
#   wd2048   step cost with a 2048-2048-2048 projector: full whitening vs 8 feature groups vs stop-gradient
# Each phase has its own time limit, so what finished comes back even if a later phase does not.
# Everything goes to $OUT: log.txt (all output, nvidia-smi first) and one JSON per phase.
# BENCH_EXTRA / PEER_EXTRA: flags appended to every bench / peer command (a local dry run uses tiny sizes).
set -u
OUT=${OUT:-/tmp/bench-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 KERAS_BACKEND=jax TF_CPP_MIN_LOG_LEVEL=2
LOG="$OUT/log.txt"
PY=${PYTHON:-python3}
PHASES=("$@")
[ ${#PHASES[@]} -eq 0 ] && PHASES=(jax32 jax28 torch32 torch28)

say() { echo "=== $(date -u +%H:%M:%S) $*" | tee -a "$LOG"; }
run() {  # run LIMIT_S CMD...: the command with a time limit, all output into the log
  local limit=$1; shift
  say "$*"
  timeout --signal=TERM --kill-after=10 "$limit" "$@" 2>&1 | grep --line-buffered -v -E "donated buffers were not usable|warnings.warn" | tee -a "$LOG"
  say "exit ${PIPESTATUS[0]}"
}

say "phases: ${PHASES[*]}"
nvidia-smi 2>&1 | tee -a "$LOG"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv 2>&1 | tee -a "$LOG"
${PEER_PYTHON:-$PY} -c "import torch, torchvision; print('torch', torch.__version__, '| torchvision', torchvision.__version__)" 2>&1 | tee -a "$LOG"
$PY -c "import jax, keras; print('jax', jax.__version__, jax.devices(), '| keras', keras.__version__)" 2>&1 | tee -a "$LOG"
echo "cpus: $(nproc)" | tee -a "$LOG"

BENCH="$PY -m benchmarks.bench --data=fashion_mnist --encoder=resnet18 --projector_dims=2048,2048,256 --batch_size=512 --precision=bfloat16"
PEER="${PEER_PYTHON:-$PY} benchmarks/torch_peer.py --data=fashion_mnist --batch_size=512"
for phase in "${PHASES[@]}"; do
  case $phase in
    jax32) run 300 $BENCH --image_shape=32,32,3 --sections=a,c,b,d --host_workers=8 --out="$OUT/bench-jax-32x32x3.json" ${BENCH_EXTRA:-} ;;
    jax28) run 200 $BENCH --image_shape=28,28,1 --sections=a,c,b --host_workers=8 --out="$OUT/bench-jax-28x28x1.json" ${BENCH_EXTRA:-} ;;
    torch32) run 120 $PEER --image_shape=32,32,3 --workers=16 --out="$OUT/torch-peer-32x32x3.json" ${PEER_EXTRA:-} ;;
    torch28) run 120 $PEER --image_shape=28,28,1 --workers=16 --out="$OUT/torch-peer-28x28x1.json" ${PEER_EXTRA:-} ;;
    wd2048)
      for v in "1 nosg" "8 nosg" "1 sg"; do
        set -- $v
        sg=--nostop_gradient_cov; [ "$2" = sg ] && sg=--stop_gradient_cov
        run 150 $BENCH --image_shape=32,32,3 --sections=a --projector_dims=2048,2048,2048 --whitening_groups=$1 $sg \
          --out="$OUT/bench-jax-d2048-g$1-$2.json" ${BENCH_EXTRA:-}
      done ;;
    *) say "unknown phase $phase" ;;
  esac
done
say "done"
