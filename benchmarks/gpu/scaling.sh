#!/usr/bin/env bash
# Issue 10 on one host with 4 GPUs (H100 x4; JAX with CUDA, no TensorFlow, no network), in ONE device call
# of at most 10 minutes. From the repository root, after the gpu-prep set-up line:
#
#   bash benchmarks/gpu/scaling.sh
#
# Everything is written under $OUT (6 files): scaling.log (all console output), scaling.json,
# memory-r18.json, memory-r50.json, objective-share.json, and logs.tar.gz (every run's whole log). Phases, each under its own time limit taken
# from a deadline (TOTAL seconds for the whole script, 550 by default), timestamps printed between them:
#
# 1. timed, alone on the machine: benchmarks/scaling.sh runs g1 g2 g4 p4 s1 s4 (weak scaling at 512
#    images per GPU: 1 GPU, 1 process x 2 and x 4 GPUs, 4 processes x 1 GPU; strong scaling at a global
#    batch of 1024: 1 and 4 GPUs, 2 GPUs = g2), EPOCHS=4 epochs each (~50 s a run, ~5 min).
# 2. not timed, three lanes at once (~3.5 min, the ResNet-50 compiles being the longest):
#      GPU 0      memory_probe ResNet-50 at 224 px, batches 32,64,128,256 (compile only)
#      GPU 1      memory_probe ResNet-18 at 224 px, batches 64,128,256,512, then --verify (one real step at
#                 the predicted largest batch and at 1.1x it)
#      GPUs 2,3   scaling.sh's loss parity: p1 (1 GPU) then p2 (2 GPUs, data_parallel), 5 steps, seed 0
#    Each probe process sees one GPU (CUDA_VISIBLE_DEVICES) and compiles for it alone; their results do
#    not depend on what the other GPUs do. MEM_PARALLEL=0 instead runs the two probes one after the
#    other on GPU 0 and the parity runs at the end of phase 1, as one queue: about 12 minutes in all, so the
#    deadline then cuts the ResNet-50 probe short.
# 3. timed, alone: bench section d on GPU 0, the objective alone (SimAffinity forward + backward on
#    random [N, D] embeddings, bf16; and SimTrace at N=512) for N = 256 ... 8192 and D = 256, 2048
#    (~45 s). N is the number of rows of each view's embedding matrix = the images of the GLOBAL batch
#    (each image gives one row in z1 and one in z2; the affinity matrix is N x N, and every GPU computes
#    the whole global loss on the gathered embeddings). So global batches 512 -> 8192 images are
#    N = 512 -> 8192, not N/2; N = 8192 is added to the list for that reason. Its share of a step:
#    divide by the step time of a run at that global batch (e.g. scaling.json's g4: 2048 images).
#
# Knobs: TOTAL (550 s), SCALING_ONLY, MEM_PARALLEL (1), MEM_R18 / MEM_R50 / OBJ_FLAGS (the probe and
# bench flags), PYTHON (python3), WORK (/tmp/gpu-scaling: the lanes' logs), and scaling.sh's own
# (EPOCHS, LIMIT, PER_GPU, STRONG, EXTRA, CPU_DEVICES ...), passed through the environment.
set -u
OUT=${OUT:-/tmp/gpu-scaling-out}
WORK=${WORK:-/tmp/gpu-scaling}
mkdir -p "$OUT" "$WORK"
export OUT KERAS_BACKEND=jax PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TF_CPP_MIN_LOG_LEVEL=2
PY=${PYTHON:-python3}
export PYTHON=$PY
TOTAL=${TOTAL:-550}
OBJ_RESERVE=${OBJ_RESERVE:-55}
MEM_RESERVE=${MEM_RESERVE:-150}
SCALING_ONLY=${SCALING_ONLY:-g1 g2 g4 p4 s1 s4}
MEM_PARALLEL=${MEM_PARALLEL:-1}
MEM_R18=${MEM_R18:---encoder=resnet18 --image_size=224 --batches=64,128,256,512 --verify}
MEM_R50=${MEM_R50:---encoder=resnet50 --image_size=224 --batches=32,64,128,256}
OBJ_FLAGS=${OBJ_FLAGS:---objective_n=256,512,1024,2048,4096,8192 --objective_d=256,2048 --reps=3}
NOISE="donated buffers were not usable|warnings.warn\\(|^ *$|oneDNN custom operations|absl::InitializeLog|was passed, but will be ignored|self.data_adapter = |Unable to initialize backend"
T0=$SECONDS

stamp() { echo "##### $(date -u +%H:%M:%S) [+$((SECONDS - T0)) s of $TOTAL] $*"; }
left() { echo $((TOTAL - (SECONDS - T0))); }
clamp() { local v=$1; [ "$v" -gt "$2" ] && v=$2; [ "$v" -lt "${3:-10}" ] && v=${3:-10}; echo "$v"; }
show() { echo "----- $1"; grep -v -E "$NOISE" "$1" 2>/dev/null | tail -n "${2:-60}"; }

main() {
  stamp "issue 10 on $(hostname): OUT=$OUT TOTAL=$TOTAL s, MEM_PARALLEL=$MEM_PARALLEL"
  nvidia-smi --query-gpu=index,name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv 2>&1
  nvidia-smi topo -m 2>&1 | head -12
  "$PY" -c "import importlib.metadata as m; print('jax', m.version('jax'), '| jaxlib', m.version('jaxlib'), '| keras', m.version('keras'))" 2>&1

  local only=$SCALING_ONLY
  [ "$MEM_PARALLEL" = 1 ] || only="$only p1 p2"
  local lim; lim=$(clamp $(($(left) - MEM_RESERVE - OBJ_RESERVE)) 480 60)
  stamp "phase 1: scaling.sh ONLY='$only' (limit $lim s)"
  ONLY="$only" timeout --kill-after=25 "$lim" bash benchmarks/scaling.sh
  stamp "phase 1: exit $?"

  lim=$(clamp $(($(left) - OBJ_RESERVE)) 400 30)
  if [ "$MEM_PARALLEL" = 1 ]; then
    stamp "phase 2: at once (limit $lim s): memory r50 on GPU 0 | memory r18 on GPU 1 | parity p1, p2 on GPUs 2,3"
    # shellcheck disable=SC2086
    CUDA_VISIBLE_DEVICES=0 timeout --kill-after=15 "$lim" "$PY" -m benchmarks.memory_probe $MEM_R50 \
      --out="$OUT/memory-r50.json" > "$WORK/memory-r50.log" 2>&1 &
    local a=$!
    # shellcheck disable=SC2086
    CUDA_VISIBLE_DEVICES=1 timeout --kill-after=15 "$lim" "$PY" -m benchmarks.memory_probe $MEM_R18 \
      --out="$OUT/memory-r18.json" > "$WORK/memory-r18.log" 2>&1 &
    local b=$!
    ONLY="p1 p2" P1_GPUS=2 P2_GPUS=2,3 timeout --kill-after=25 "$lim" bash benchmarks/scaling.sh \
      > "$WORK/parity.log" 2>&1 &
    local c=$!
    wait "$a"; local ra=$?
    stamp "phase 2: memory r50 exit $ra"
    wait "$b"; local rb=$?
    wait "$c"; local rc=$?
    stamp "phase 2: memory r18 exit $rb, parity exit $rc"
    show "$WORK/memory-r50.log" 40
    show "$WORK/memory-r18.log" 40
    show "$WORK/parity.log" 40
  else
    local half=$((lim / 2))
    stamp "phase 2a: memory r18 on GPU 0 (limit $half s)"
    # shellcheck disable=SC2086
    CUDA_VISIBLE_DEVICES=0 timeout --kill-after=15 "$half" "$PY" -m benchmarks.memory_probe $MEM_R18 \
      --out="$OUT/memory-r18.json"
    stamp "phase 2a: exit $?"
    lim=$(clamp $(($(left) - OBJ_RESERVE)) 400 30)
    stamp "phase 2b: memory r50 on GPU 0 (limit $lim s)"
    # shellcheck disable=SC2086
    CUDA_VISIBLE_DEVICES=0 timeout --kill-after=15 "$lim" "$PY" -m benchmarks.memory_probe $MEM_R50 \
      --out="$OUT/memory-r50.json"
    stamp "phase 2b: exit $?"
  fi

  lim=$(clamp $(($(left) - 5)) 300 20)
  stamp "phase 3: bench section d, the objective alone, on GPU 0 (limit $lim s)"
  # shellcheck disable=SC2086
  CUDA_VISIBLE_DEVICES=0 timeout --kill-after=10 "$lim" "$PY" -m benchmarks.bench --sections=d --objective=simaffinity \
    --data=synthetic $OBJ_FLAGS --out="$OUT/objective-share.json"
  stamp "phase 3: exit $?"

  "$PY" -m benchmarks.scaling_summary --runs="${RUNS:-/tmp/scaling}" --out="$OUT/scaling.json"
  # The runs' whole logs (tracebacks, NCCL set-up) and the lanes' logs, in case something needs a closer look.
  tar -czf "$OUT/logs.tar.gz" -C / "${RUNS:-/tmp/scaling}/logs" "$WORK" 2>/dev/null
  ls -la "$OUT"
  stamp "done"
}

main 2>&1 | grep --line-buffered -v -E "$NOISE" | tee "$OUT/scaling.log"
