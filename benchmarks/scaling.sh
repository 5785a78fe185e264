#!/usr/bin/env bash
# Issue 10: scaling of the real train CLI over the GPUs of one host (JAX backend, NCCL), ResNet-18 on
# Fashion-MNIST (configs/paper/fashion_mnist_simaffinity.flags: projector 2048-2048-256, bf16, LARS; the recipe benchmarks/SCALING.md measured), augmentation on the
# device, no kNN monitor (--knn_every=0; the final kNN uses a 5,000-image memory bank), no pictures.
#
#   bash benchmarks/scaling.sh          (after the gpu-prep set-up line; $OUT set; 4 GPUs)
#
# Runs (ONLY: a space-separated subset of the names; default all, in this order):
#   weak scaling, PER_GPU (512) images per GPU:
#     g1  1 GPU, batch 512
#     g2  1 process x 2 GPUs (CUDA_VISIBLE_DEVICES=0,1, --strategy=data_parallel), batch 1024
#     g4  1 process x 4 GPUs, batch 2048
#     p4  4 processes x 1 GPU, one JAX job started by python -m uniclr_tf.launch (--num_processes=4 ...), batch 2048
#     m2  2 processes x 1 GPU, batch 1024 (not in the default set: the multi-process layout on a 2-GPU machine)
#     l2, l4  the same as m2 and p4 (the names of earlier measurements; not in the default set)
#     i2, i4  2 or 4 independent one-GPU runs at once, GPU k each, batch PER_GPU, no collective (not in the
#             default set): what running side by side costs without communication (i4's row is GPU 0's run,
#             i4-1 .. i4-3 the others'). BIND=1: each bound to an equal share of the CPUs (taskset)
#   LAUNCH_FLAGS: the launcher's own flags for p4, m2, l2, l4 (e.g. --cpu_binding=gpu)
#   strong scaling at the global batch STRONG (1024): s1 1 GPU; s2 = g2 (reused); s4 4 GPUs
#   loss parity: p1 (1 GPU, GPUs P1_GPUS=0) and p2 (2 GPUs, data_parallel, P2_GPUS=1,2), --batch_size=1024
#     --epochs=1 --steps_per_epoch=5 --seed=0; the two at once when their GPUs differ, else one after the other
#     (not timed: their throughput is not measured)
# Each run has `timeout LIMIT` (100 s) and a fresh folder /tmp/scaling/<name> (--overwrite); its output
# goes to /tmp/scaling/logs/<name>.log (its last lines are printed). After every run the summary
# (benchmarks/scaling_summary.py) rewrites $OUT/scaling.json from every run folder there, so a time limit
# that stops this script part-way leaves the JSON of what finished: images/s from history.json by the
# per-epoch step_seconds and by the wall clock (epochs 2..EPOCHS), per GPU, weak-scaling efficiency
# (per-GPU rate / g1's), strong-scaling efficiency (s_k / (k * s1)), first-epoch seconds, loss parity.
#
# NCCL_DEBUG=INFO by default: the per-run summary lists the transports NCCL chose (P2P over NVLink, SHM...).
# ONLY=p4r (not in the default set): p4 stopped by SIGTERM after STOP_EPOCH (1) epochs and run again; it must
# resume and finish with one continuous history (its status line in RUNS/p4r.status). m2r: the same with m2.
# Knobs: EPOCHS (4), LIMIT (100 s per run), ONLY, PER_GPU (512), STRONG (1024), PARITY_BATCH (1024),
# P1_GPUS, P2_GPUS, RUNS (/tmp/scaling), PYTHON (python3), EXTRA (train flags placed right after the
# flagfile, e.g. a smaller model), TAIL (train flags placed last: they override these defaults, e.g.
# --knn_every=1), CPU_DEVICES=1 (CPU smoke test: each run gets as many XLA CPU devices as
# GPUs named, --xla_force_host_platform_device_count).
# On 4 H100s each run is about 25 s of XLA compile (the compilation cache at /tmp/xla-cache shortens runs
# that share a computation) + ~15 s of start-up and final kNN + EPOCHS epochs of 60,000 images (~1.3 s on
# 1 GPU): the default set takes about 5-6 minutes.
set -u
OUT=${OUT:-/tmp/scaling-out}; mkdir -p "$OUT"
EPOCHS=${EPOCHS:-4}
LIMIT=${LIMIT:-100}
ONLY=${ONLY:-g1 g2 g4 p4 s1 s4 p1 p2}
PER_GPU=${PER_GPU:-512}
STRONG=${STRONG:-1024}
PARITY_BATCH=${PARITY_BATCH:-1024}
P1_GPUS=${P1_GPUS:-0}
P2_GPUS=${P2_GPUS:-1,2}
RUNS=${RUNS:-/tmp/scaling}
PY=${PYTHON:-python3}
EXTRA=${EXTRA:-}
TAIL=${TAIL:-}
export KERAS_BACKEND=jax PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
export NCCL_DEBUG=${NCCL_DEBUG:-INFO}  # into each run's log: the NCCL version and the transport between GPUs
LOGS=$RUNS/logs
mkdir -p "$LOGS"
T0=$SECONDS
# shellcheck disable=SC2086
COMMON=(--flagfile=configs/paper/fashion_mnist_simaffinity.flags $EXTRA --augment_on=device --epochs="$EPOCHS" --warmup_epochs=1
        --knn_every=0 --knn_max_train=5000 --nopictures --compilation_cache_dir=/tmp/xla-cache
        --run_dir="$RUNS" --overwrite --verbose=2 $TAIL)
NOISE="donated buffers were not usable|warnings.warn\\(|^ *$|oneDNN custom operations|absl::InitializeLog|was passed, but will be ignored|self.data_adapter = |Unable to initialize backend"

stamp() { echo "=== $(date -u +%H:%M:%S) [scaling +$((SECONDS - T0)) s] $*"; }
want() { [[ " $ONLY " == *" $1 "* ]]; }
ndev() { awk -F, '{print NF}' <<< "$1"; }
now() { date +%s.%N; }

children=()
cleanup() {  # a time limit around this script (TERM): stop the runs too (each timeout passes it on)
  stamp "stopped (signal): ending the runs still going"
  for p in "${children[@]}"; do kill -TERM "$p" 2>/dev/null; done
  wait
  exit 143
}
trap cleanup TERM INT

ENTRY=(-m uniclr_tf.train)  # what launch runs; launched() starts the train CLI through uniclr_tf.launch
PROCESSES=1                 # the processes a single() run starts (launched(): one per GPU)
PREFIX=()                   # a command the run is started under (independent() with BIND: taskset)
launch() {  # launch GPUS LOG TRAIN_FLAGS...: one train process in the background; its pid in $last
  local gpus=$1 log=$2; shift 2
  local env_=(CUDA_VISIBLE_DEVICES="$gpus")
  [ -n "${CPU_DEVICES:-}" ] && env_+=(XLA_FLAGS="--xla_force_host_platform_device_count=$(($(ndev "$gpus") / PROCESSES))")
  env "${env_[@]}" timeout --kill-after=15 "$LIMIT" "${PREFIX[@]}" "$PY" "${ENTRY[@]}" "${COMMON[@]}" "$@" > "$log" 2>&1 &
  last=$!
  children+=("$last")
}

show() {  # the last lines of a run's log, without the noise, and the NCCL transports it used
  grep -v -E "$NOISE| NCCL INFO " "$1" | tail -n "${2:-12}" | sed 's/^/    /'
  grep -h -o -E "NCCL version [^ ]+|via (P2P|SHM|NET|NVLS|COLLNET)[A-Za-z0-9/]*" "$1" | sort | uniq -c | head -6 | sed 's/^/    nccl: /'
}

record() {  # record NAME RC SECONDS GPUS PROCESSES, then rewrite the summary
  echo "rc=$2 seconds=$3 gpus=$4 gpus_n=$(ndev "$4") processes=$5" > "$RUNS/$1.status"
  "$PY" -m benchmarks.scaling_summary --runs="$RUNS" --out="$OUT/scaling.json" --quiet \
    || echo "scaling_summary failed (exit $?)"
}

single() {  # single NAME GPUS TRAIN_FLAGS...: one process (PROCESSES, through ENTRY) on the GPUs named, waited for
  local name=$1 gpus=$2; shift 2
  rm -rf "${RUNS:?}/$name" "$RUNS/$name.status"
  stamp "$name: CUDA_VISIBLE_DEVICES=$gpus $*"
  local t0; t0=$(now)
  launch "$gpus" "$LOGS/$name.log" --run_name="$name" "$@"
  wait "$last"; local rc=$?
  local secs; secs=$(awk -v a="$t0" -v b="$(now)" 'BEGIN{printf "%.1f", b - a}')
  stamp "$name: exit $rc after $secs s"
  show "$LOGS/$name.log" $([ "$rc" = 0 ] && echo 8 || echo 40)
  if [ "$rc" != 0 ]; then for f in "$LOGS/$name"/process-*.log; do [ -f "$f" ] && { echo "  -- $f:"; show "$f" 15; }; done; fi
  record "$name" "$rc" "$secs" "$gpus" "$PROCESSES"
}

launched() {  # launched NAME N: N processes x 1 GPU started by python -m uniclr_tf.launch, waited for
  local name=$1 n=$2
  # shellcheck disable=SC2206
  local PROCESSES=$n ENTRY=(-m uniclr_tf.launch --processes="$n" --log_dir="$LOGS/$name" ${LAUNCH_FLAGS:-} --)
  single "$name" "$(seq -s, 0 $((n - 1)))" --batch_size=$((n * PER_GPU))
}

independent() {  # independent NAME N: N one-GPU runs at once (GPU k: NAME, NAME-1, ...), waited for
  local name=$1 n=$2 k pids=() tags=() cpus ncpu; ncpu=$(nproc)
  rm -rf "${RUNS:?}/$name" "$RUNS/$name".status "$RUNS/$name"-*
  stamp "$name: $n independent one-GPU runs at once, batch $PER_GPU each${BIND:+, CPUs split}"
  local t0; t0=$(now)
  for ((k = 0; k < n; k++)); do
    local tag=$name; [ "$k" -gt 0 ] && tag=$name-$k
    local PREFIX=()
    [ -n "${BIND:-}" ] && cpus="$((k * ncpu / n))-$(((k + 1) * ncpu / n - 1))" && PREFIX=(taskset -c "$cpus")
    launch "$k" "$LOGS/$tag.log" --run_name="$tag" --batch_size="$PER_GPU"
    pids+=("$last"); tags+=("$tag")
  done
  local rc=0 r
  for p in "${pids[@]}"; do wait "$p"; r=$?; [ "$r" != 0 ] && rc=$r; done
  local secs; secs=$(awk -v a="$t0" -v b="$(now)" 'BEGIN{printf "%.1f", b - a}')
  stamp "$name: exit $rc after $secs s"
  for tag in "${tags[@]}"; do show "$LOGS/$tag.log" $([ "$rc" = 0 ] && echo 3 || echo 30); done
  record "$name" "$rc" "$secs" 0 1
}

resumed_multi() {  # resumed_multi NAME N (p4r, m2r): N processes x 1 GPU (the launcher) stopped by a real SIGTERM
  # to the launcher once STOP_EPOCH (1) epochs are in its history, then the same command again: it must resume and
  # end with one continuous history (epochs 1..EPOCHS, each once). Its own status line: NAME.status (rc 0 only if
  # all that held).
  local name=$1 n=$2; local flags=(--run_name="$name" --batch_size=$((n * PER_GPU))) stop_at=${STOP_EPOCH:-1}
  local gpus PROCESSES=$n ENTRY=(-m uniclr_tf.launch --processes="$n" --log_dir="$LOGS/$name" --)
  gpus=$(seq -s, 0 $((n - 1)))
  rm -rf "${RUNS:?}/$name" "$RUNS/$name.status"
  local t0; t0=$(now)
  stamp "$name: python -m uniclr_tf.launch --processes=$n, stopped after epoch $stop_at"
  launch "$gpus" "$LOGS/$name.log" "${flags[@]}"
  while kill -0 "$last" 2> /dev/null; do
    "$PY" -c "import json,sys; sys.exit(len(json.load(open(sys.argv[1]))) < int(sys.argv[2]))" \
      "$RUNS/$name/history.json" "$stop_at" 2> /dev/null && break
    sleep 0.5
  done
  stamp "$name: epoch $stop_at in the history: SIGTERM to the launcher (it forwards it to the $n processes)"
  kill -TERM "$last" 2> /dev/null  # timeout passes it on to the launcher
  wait "$last"; local first=$?
  mv "$LOGS/$name.log" "$LOGS/$name.stopped.log"
  stamp "$name: stopped with exit $first (143: SIGTERM, a backup saved); the same command again, without --overwrite"
  show "$LOGS/$name.stopped.log" 4
  local kept=() saved=("${COMMON[@]}") a
  for a in "${COMMON[@]}"; do [ "$a" = --overwrite ] || kept+=("$a"); done
  COMMON=("${kept[@]}")
  launch "$gpus" "$LOGS/$name.log" "${flags[@]}"
  wait "$last"; rc=$?
  COMMON=("${saved[@]}")
  local secs; secs=$(awk -v a="$t0" -v b="$(now)" 'BEGIN{printf "%.1f", b - a}')
  show "$LOGS/$name.log" 6
  local check
  check=$("$PY" -c "import json,sys; e=[x['epoch'] for x in json.load(open(sys.argv[1]))]; print('continuous' if e == list(range(1, int(sys.argv[2]) + 1)) else f'epochs {e}')" \
    "$RUNS/$name/history.json" "$EPOCHS" 2>&1)
  grep -q "resuming at" "$LOGS/$name.log" || check="$check; no 'resuming at' in the log"
  [ "$first" = 143 ] || check="$check; first part exited $first, not 143"
  [ "$check" = continuous ] && [ "$rc" = 0 ] || { [ "$rc" = 0 ] && rc=1; }
  stamp "$name: exit $rc after $secs s (both parts); history: $check"
  echo "rc=$rc seconds=$secs gpus=$gpus gpus_n=$n processes=$n first_exit=$first history=${check// /_}" \
    > "$RUNS/$name.status"
}

parity() {  # p1 and p2: concurrently when their GPUs differ
  local flags=(--batch_size="$PARITY_BATCH" --epochs=1 --steps_per_epoch=5 --seed=0)
  local overlap=0 g
  for g in ${P1_GPUS//,/ }; do [[ ",$P2_GPUS," == *",$g,"* ]] && overlap=1; done
  if [ "$overlap" = 0 ] && want p1 && want p2; then
    stamp "p1 (CUDA_VISIBLE_DEVICES=$P1_GPUS) and p2 (CUDA_VISIBLE_DEVICES=$P2_GPUS, data_parallel) at once: ${flags[*]}"
    rm -rf "${RUNS:?}/p1" "$RUNS/p2" "$RUNS/p1.status" "$RUNS/p2.status"
    local t0; t0=$(now)
    launch "$P1_GPUS" "$LOGS/p1.log" --run_name=p1 "${flags[@]}"; local a=$last
    launch "$P2_GPUS" "$LOGS/p2.log" --run_name=p2 --strategy=data_parallel "${flags[@]}"; local b=$last
    wait "$a"; local ra=$?
    local sa; sa=$(awk -v a="$t0" -v b="$(now)" 'BEGIN{printf "%.1f", b - a}')
    wait "$b"; local rb=$?
    local sb; sb=$(awk -v a="$t0" -v b="$(now)" 'BEGIN{printf "%.1f", b - a}')
    stamp "p1: exit $ra after $sa s; p2: exit $rb after $sb s"
    show "$LOGS/p1.log" $([ "$ra" = 0 ] && echo 4 || echo 40)
    show "$LOGS/p2.log" $([ "$rb" = 0 ] && echo 4 || echo 40)
    echo "rc=$ra seconds=$sa gpus=$P1_GPUS gpus_n=$(ndev "$P1_GPUS") processes=1" > "$RUNS/p1.status"
    record p2 "$rb" "$sb" "$P2_GPUS" 1
  else
    want p1 && single p1 "$P1_GPUS" "${flags[@]}"
    want p2 && single p2 "$P2_GPUS" --strategy=data_parallel "${flags[@]}"
  fi
  for n in p1 p2; do
    [ -f "$RUNS/$n/history.json" ] && echo "  $n epoch 1: $("$PY" -c "import json,sys; e=json.load(open(sys.argv[1]))[0]; print(json.dumps({k: e.get(k) for k in ('loss','step_seconds')}))" "$RUNS/$n/history.json")"
  done
}

stamp "scaling: ONLY='$ONLY' EPOCHS=$EPOCHS LIMIT=$LIMIT PER_GPU=$PER_GPU STRONG=$STRONG runs in $RUNS"
{ command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader; } > "$RUNS/gpus.txt" 2>&1
cat "$RUNS/gpus.txt"
echo "$PY -m uniclr_tf.train ${COMMON[*]} (EPOCHS=$EPOCHS LIMIT=$LIMIT)" > "$RUNS/command.txt"

want g1 && single g1 0 --batch_size="$PER_GPU"
want g2 && single g2 0,1 --batch_size=$((2 * PER_GPU)) --strategy=data_parallel
want g4 && single g4 0,1,2,3 --batch_size=$((4 * PER_GPU)) --strategy=data_parallel
want p4 && launched p4 4
want p4r && resumed_multi p4r 4
want m2 && launched m2 2
want m2r && resumed_multi m2r 2
want l2 && launched l2 2
want l4 && launched l4 4
want i2 && independent i2 2
want i4 && independent i4 4
want s1 && single s1 0 --batch_size="$STRONG"
if { want s1 || want s4; } && [ "$STRONG" != $((2 * PER_GPU)) ]; then
  echo "s2: STRONG=$STRONG is not g2's batch: the strong-scaling point at 2 GPUs is not measured"
fi
want s4 && single s4 0,1,2,3 --batch_size="$STRONG" --strategy=data_parallel
{ want p1 || want p2; } && parity

stamp "scaling done"
"$PY" -m benchmarks.scaling_summary --runs="$RUNS" --out="$OUT/scaling.json"
