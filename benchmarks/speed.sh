#!/usr/bin/env bash
# The measurements of docs/results/speed.md (and the ResNet-50 rows of docs/results/scaling.md), by phase:
#   [OUT_DIR=runs/speed] [PYTHON=python3] bash benchmarks/speed.sh PHASE ...
# then `python -m benchmarks.report speed OUT_DIR/*.json` (OUT_DIR/speed.md; r50: report scaling, r50.md).
#
# On any machine (TensorFlow backend, float32; about 20 minutes on 2 cores; `make bench` runs it):
#   cpu      the bench (sections a, c, b) with ResNet-18 at 28x28x1, batch 512, and the CPU quickstart model
#            (tiny encoder, 512-512-128, SimAffinity, batch 256) at 28x28x1 with the objective costs (d) and at 32x32x3
# On a machine with one GPU and JAX with CUDA, PyTorch and torchvision (no TensorFlow needed); the bench:
# ResNet-18 (CIFAR stem) + 2048-2048-256, SimTrace, batch 512, bf16, Fashion-MNIST:
#   jax32    the bench at 32x32x3 (Fashion-MNIST padded, grey repeated), sections a, c, b, d
#   jax28    the same at 28x28x1 (Fashion-MNIST as is), sections a, c, b
#   torch32, torch28   benchmarks/torch_peer.py at those shapes (DataLoader with 16 workers)
#   wd2048   section a with a 2048-2048-2048 projector: full whitening, stop_gradient_cov, 8 feature groups
#   trace28  section a with the CLI's SGD recipe (SimAffinity) at 28x28x1, 5 steps traced, against its memory
#            floor (report roofline: OUT_DIR/traces)
#   xla28    section a of trace28's step under each of XLA's fusion options in XLA28 (NAME=VALUE for
#            --xla_gpu_NAME=VALUE, A+B for both; default XLA28_DEFAULT below), the plain step first and last
#            (OUT_DIR/xla28)
#   xla224   the same for r50's one-GPU step at batch 128 (no PyTorch), the options in XLA224 (OUT_DIR/xla224)
#   cli      benchmarks.cli_vs_bench: the bench's model step, then the train CLI for 100 epochs (FLAGFILE,
#            default the paper's LARS recipe, kNN every 10) with an empty compilation cache, then again warm
#   process  the same, 5 epochs, no kNN monitor: the CLI's process by phase (start-up, model, training, ...) with
#            an empty compilation cache, then warm (OUT_DIR/process.json; LABEL= names the runs)
#   r50      ResNet-50 at 224 px, the bench's model step against torchvision's (benchmarks/torch_r50_peer.py),
#            REPEATS (3) times each for each of BATCHES ("128"); DP=N adds the step over N GPUs of one process,
#            PROCS=N as N processes x 1 GPU (one JAX job: a machine with N GPUs); BN1=global_one_pass the
#            one-GPU step with that batch norm, PROCS_BN=... the N-process one; TORCH=0 no PyTorch, EAGER=0 no
#            eager PyTorch; TRACE=1 traces 5 steps of the first one-GPU step and torch.compile's, and prints the
#            step against its memory floor (report roofline) and its kernels against torch.compile's (OUT_DIR/r50/traces)
# On a machine with 4 GPUs (fewer: the same runs one after the other on GPU 0):
#   first_run  every run with an empty compilation cache, one per GPU at once: the GPU-augmented PyTorch peer
#            (benchmarks/torch_gpu_peer.py, 100 epochs, kNN every 25); the train CLI with the peer's SGD recipe
#            with and without the shipped XLA autotuning table; the LARS recipe (kNN every 10) with and without it
#            (fewer GPUs: the SGD run with the table, the peer, and unless LARS=0 the LARS run with the table)
#   autotune_table  each shipped GPU configuration one epoch with an empty cache and no table, one per GPU at a
#            time, then `python -m uniclr_tf.training.autotune collect`: the table for this machine's card
#            (uniclr_tf/training/autotune_tables/jaxlib-<version>.json, copied to OUT_DIR)
# Each phase has a time limit (LIMIT_SCALE=2 doubles them); what finished is kept when a later phase fails.
# BENCH_EXTRA / PEER_EXTRA: flags added to every bench / peer command (a smoke test uses tiny sizes).
set -u
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { sed -n '2,/^set -u/p' "$0" | sed 's/^# \{0,1\}//; /^set -u/d'; exit 2; }
OUT_DIR=${OUT_DIR:-runs/speed}; PY=${PYTHON:-python3}; SCALE=${LIMIT_SCALE:-1}
mkdir -p "$OUT_DIR"
LOG=$OUT_DIR/log.txt
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
say() { echo "=== $(date -u +%H:%M:%S) $*" | tee -a "$LOG"; }
run() {  # run LIMIT_S CMD...: the command under a time limit, its output into the log
  local limit=$(( $1 * SCALE )); shift
  say "$*"
  timeout --kill-after=10 "$limit" "$@" 2>&1 | grep --line-buffered -v -E "donated buffers were not usable|warnings.warn" | tee -a "$LOG"
  say "exit ${PIPESTATUS[0]}"
}
gpus() { nvidia-smi -L 2>/dev/null | grep -c '^GPU '; }

BENCH=("$PY" -m benchmarks.bench --data=fashion_mnist --encoder=resnet18 --projector_dims=2048,2048,256 --batch_size=512
       --precision=bfloat16 ${BENCH_EXTRA:-})
PEER=("$PY" benchmarks/torch_peer.py --data=fashion_mnist --batch_size=512 ${PEER_EXTRA:-})
XLA28_DEFAULT="experimental_enable_conv_fusion=true experimental_all_fusions_with_triton=true
  experimental_enable_triton_heroless_priority_fusion=true experimental_max_unroll_factor=8
  native_emitter_tune_unroll_factor_for_loops=true experimental_enable_fusion_block_level_rewriter=true
  experimental_enable_fusion_block_level_rewriter=true+experimental_enable_fusion_autotuner=true
  use_runtime_fusion=true"  # xla28's options: NAME=VALUE is XLA's --xla_gpu_NAME=VALUE; A+B both
XLA224_DEFAULT="experimental_enable_conv_fusion=true experimental_all_fusions_with_triton=true"  # xla224's
SGD="--optimizer=sgd --base_learning_rate=0.06 --weight_decay=5e-4 --warmup_epochs=10"  # the GPU peer's recipe
PAPER=configs/paper/fashion_mnist_simaffinity.flags

cpu() {
  export KERAS_BACKEND=tensorflow
  local tiny=(--encoder=tiny --encoder_width=32 --projector_dims=512,512,128 --objective=simaffinity --batch_size=256
              --precision=float32 --warmup_steps=3 --steps=10 --reps=5)
  run 1800 "$PY" -m benchmarks.bench --data=fashion_mnist --image_shape=28,28,1 --encoder=resnet18 \
    --projector_dims=2048,2048,256 --batch_size=512 --precision=float32 --sections=a,c,b --warmup_steps=1 --steps=2 \
    --reps=3 --out="$OUT_DIR/cpu-tf-resnet18-28x28x1.json"
  run 600 "$PY" -m benchmarks.bench --data=fashion_mnist --image_shape=28,28,1 "${tiny[@]}" --sections=a,c,b,d \
    --objective_n=256,512,1024 --objective_d=128,256,2048 --whitening_n=512 --whitening_group_dims=256,64 \
    --objective_iters=5 --out="$OUT_DIR/cpu-tf-quickstart-28x28x1.json"
  run 600 "$PY" -m benchmarks.bench --data=fashion_mnist --image_shape=32,32,3 "${tiny[@]}" --sections=a,c,b \
    --out="$OUT_DIR/cpu-tf-quickstart-32x32x3.json"
}

xla_sweep() {  # xla_sweep DIR LIMIT_S "OPTIONS" CMD...: CMD --out=DIR/NAME.json under each option, plain first and last
  local dir=$1 limit=$2 options=$3 v f flags; shift 3
  local tuned="--xla_gpu_per_fusion_autotune_cache_dir=$dir/autotune"  # the convolutions tuned once
  mkdir -p "$dir/autotune"
  for v in plain $options plain-again; do
    flags=""; case $v in plain*) ;; *) for f in ${v//+/ }; do flags="$flags --xla_gpu_$f"; done ;; esac
    XLA_FLAGS="$tuned$flags" KERAS_BACKEND=jax run "$limit" "$@" --out="$dir/$(sed 's/=[^+]*//g' <<< "$v").json"
  done
  "$PY" -m benchmarks.report speed "$dir"/*.json | tee -a "$LOG"
}

r50() {
  local out=$OUT_DIR/r50 b r i
  mkdir -p "$out"
  export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$out/xla-cache}  # repeats reuse the compile
  step() {  # step NAME DEVICES BATCH [PROCESSES] [BENCH FLAGS...]
    local name=$1 devices=$2 batch=$3 procs=${4:-1}; shift $(( $# < 4 ? $# : 4 ))
    local cmd=("$PY" -m benchmarks.bench --sections=a --encoder=resnet50 --image_shape=224,224,3 --data=synthetic
               --num_images=$((4 * batch)) --objective=simaffinity --optimizer=sgd --batch_size="$batch" --steps=20
               --reps=5 --devices="$devices" --out="$out/$name.json" "$@" ${BENCH_EXTRA:-})
    if [ "$procs" = 1 ]; then run 600 "${cmd[@]}"; return; fi
    local port=$((20000 + RANDOM % 20000)) pids=()
    for ((i = procs - 1; i >= 1; i--)); do
      CUDA_VISIBLE_DEVICES=$i "${cmd[@]}" --num_processes="$procs" --process_id=$i \
        --coordinator_address=127.0.0.1:$port > "$out/$name.p$i.log" 2>&1 & pids+=($!)
    done
    CUDA_VISIBLE_DEVICES=0 run 600 "${cmd[@]}" --num_processes="$procs" --process_id=0 --coordinator_address=127.0.0.1:$port
    wait "${pids[@]}"
  }
  peer() {  # peer NAME BATCH [--compile]
    run 600 "$PY" benchmarks/torch_r50_peer.py --batch_size "$2" --image_size 224 --steps 20 --reps 5 --out "$out/$1.json" "${@:3}"
  }
  for b in ${BATCHES:-128}; do
    for ((r = 1; r <= ${REPEATS:-3}; r++)); do
      local traced=() profiled=()  # TRACE=1: the first repeat traces 5 more steps after its timed ones
      if [ "${TRACE:-0}" = 1 ] && [ "$r" = 1 ]; then
        mkdir -p "$out/traces"
        traced=(--profile_dir="$out/traces/g1-b$b" --hlo_out="$out/traces/g1-b$b.hlo")
        profiled=(--profile "$out/traces/compile-b$b.json")
      fi
      step "g1-b$b-r$r" 1 "$b" 1 "${traced[@]}"
      [ -n "${BN1:-}" ] && step "g1-$BN1-b$b-r$r" 1 "$b" 1 --batch_norm="$BN1"
      [ "${DP:-1}" -gt 1 ] && step "dp$DP-b$b-r$r" "$DP" $((DP * b))
      [ "${PROCS:-1}" -gt 1 ] && step "p$PROCS-b$b-r$r" "$PROCS" $((PROCS * b)) "$PROCS"
      [ "${PROCS:-1}" -gt 1 ] && [ -n "${PROCS_BN:-}" ] && step "p$PROCS-$PROCS_BN-b$b-r$r" "$PROCS" $((PROCS * b)) "$PROCS" --batch_norm="$PROCS_BN"
      [ "${TORCH:-1}" = 1 ] || continue
      [ "${EAGER:-1}" = 1 ] && peer "eager-b$b-r$r" "$b"
      peer "compile-b$b-r$r" "$b" --compile "${profiled[@]}"
    done
    if [ "${TRACE:-0}" = 1 ]; then  # the traced step against its memory floor, and against torch.compile's kernels
      "$PY" -m benchmarks.report roofline "$out/traces/g1-b$b" "$out/traces/g1-b$b.hlo" --bench="$out/g1-b$b-r1.json" \
        --out="$out/traces/roofline-b$b.json" | tee -a "$LOG"
      [ -f "$out/traces/compile-b$b.json" ] && "$PY" -m benchmarks.report trace "$out/traces/g1-b$b" \
        --compare="$out/traces/compile-b$b.json" --min_kernels=50 --out="$out/traces/vs-compile-b$b.json" | tee -a "$LOG"
    fi
  done
  "$PY" -m benchmarks.report scaling "$out"/*.json --out="$OUT_DIR/r50-report.json" | tee "$OUT_DIR/r50.md"
}

first_run() {  # every run a first run: an empty compilation cache of its own
  local w=$OUT_DIR/first-run; mkdir -p "$w"
  export KERAS_BACKEND=jax
  cvb() {  # cvb GPU NAME LABEL FLAGFILE [TRAIN FLAGS...]: the bench, then the CLI for 100 epochs
    local gpu=$1 name=$2 label=$3 flagfile=$4; shift 4
    CUDA_VISIBLE_DEVICES=$gpu run 900 "$PY" -m benchmarks.cli_vs_bench --flagfile="$flagfile" --epochs=100 \
      --work="$w/$name" --label="$label" --out="$OUT_DIR/first-run-$name.json" -- --nopictures "$@"
  }
  peer() { CUDA_VISIBLE_DEVICES=$1 run 900 "$PY" benchmarks/torch_gpu_peer.py --epochs=100 --knn_every=25 --out="$OUT_DIR/first-run-peer.json"; }
  # shellcheck disable=SC2086
  if [ "$(gpus)" -ge 4 ]; then
    peer 0 &
    cvb 1 sgd-table "SGD, kNN every 25: first run, autotuning table" $PAPER --knn_every=25 $SGD &
    { cvb 2 sgd-notable "SGD, kNN every 25: first run, no table" $PAPER --knn_every=25 $SGD --noautotune_table
      cvb 2 lars-notable "LARS, kNN every 10: first run, no table" $PAPER --knn_every=10 --noautotune_table; } &
    cvb 3 lars-table "LARS, kNN every 10: first run, autotuning table" $PAPER --knn_every=10 &
    wait
  else
    cvb 0 sgd-table "SGD, kNN every 25: first run, autotuning table" $PAPER --knn_every=25 $SGD
    peer 0
    [ "${LARS:-1}" = 1 ] && cvb 0 lars-table "LARS, kNN every 10: first run, autotuning table" $PAPER --knn_every=10
  fi
}

autotune_table() {
  local w=$OUT_DIR/autotune-table n g i
  rm -rf "$w"; mkdir -p "$w"
  export KERAS_BACKEND=jax
  local configs=("simaffinity|--flagfile=configs/simaffinity.flags" "simtrace|--flagfile=configs/simtrace.flags"
                 "simwhitening|--flagfile=configs/simwhitening.flags" "paper-simaffinity|--flagfile=$PAPER"
                 "paper-simaffinity-sgd|--flagfile=$PAPER $SGD"
                 "paper-simtrace|--flagfile=configs/paper/fashion_mnist_simtrace.flags"
                 "paper-simwhitening|--flagfile=configs/paper/fashion_mnist_simwhitening.flags")
  n=$(gpus)
  for ((g = 0; g < n; g++)); do
    ( for ((i = g; i < ${#configs[@]}; i += n)); do
        local name=${configs[$i]%%|*} flags=${configs[$i]#*|}
        # shellcheck disable=SC2086  # one epoch with the kNN monitor and the pictures: every program a run compiles
        CUDA_VISIBLE_DEVICES=$g run 900 "$PY" -m uniclr_tf.train $flags --augment_on=device --epochs=1 --warmup_epochs=0 \
          --knn_every=1 --verbose=2 --run_dir="$w/runs" --run_name="$name" --overwrite \
          --compilation_cache_dir="$w/cache-$name" --noautotune_table
      done ) &
  done
  wait
  local names caches=()
  names=$(for c in "${configs[@]}"; do printf '%s,' "${c%%|*}"; done)
  for d in "$w"/cache-*; do [ -d "$d/xla_gpu_per_fusion_autotune_cache_dir" ] && caches+=("$d"); done
  run 300 "$PY" -m uniclr_tf.training.autotune collect "${caches[@]}" --configs="${names%,}"
  run 60 "$PY" -m uniclr_tf.training.autotune list
  cp uniclr_tf/training/autotune_tables/jaxlib-*.json "$OUT_DIR/"
}

say "phases: $*"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no GPU"; } | tee -a "$LOG"
for phase in "$@"; do
  case $phase in
    cpu) cpu ;;
    jax32) KERAS_BACKEND=jax run 300 "${BENCH[@]}" --image_shape=32,32,3 --sections=a,c,b,d --host_workers=8 --out="$OUT_DIR/bench-jax-32x32x3.json" ;;
    jax28) KERAS_BACKEND=jax run 200 "${BENCH[@]}" --image_shape=28,28,1 --sections=a,c,b --host_workers=8 --out="$OUT_DIR/bench-jax-28x28x1.json" ;;
    torch32) run 120 "${PEER[@]}" --image_shape=32,32,3 --workers=16 --out="$OUT_DIR/torch-peer-32x32x3.json" ;;
    torch28) run 120 "${PEER[@]}" --image_shape=28,28,1 --workers=16 --out="$OUT_DIR/torch-peer-28x28x1.json" ;;
    wd2048)
      for v in "1 --nostop_gradient_cov nosg" "1 --stop_gradient_cov sg" "8 --nostop_gradient_cov nosg"; do
        read -r groups sg tag <<< "$v"
        KERAS_BACKEND=jax run 150 "${BENCH[@]}" --image_shape=32,32,3 --sections=a --projector_dims=2048,2048,2048 \
          --whitening_groups="$groups" "$sg" --out="$OUT_DIR/bench-jax-d2048-g$groups-$tag.json"
      done ;;
    trace28)  # the 28 px step of the CLI's SGD recipe, traced, against its memory floor
      mkdir -p "$OUT_DIR/traces"
      KERAS_BACKEND=jax run 300 "${BENCH[@]}" --image_shape=28,28,1 --sections=a --objective=simaffinity --optimizer=sgd \
        --profile_dir="$OUT_DIR/traces/r18-28px" --hlo_out="$OUT_DIR/traces/r18-28px.hlo" --out="$OUT_DIR/traces/r18-28px.json"
      "$PY" -m benchmarks.report roofline "$OUT_DIR/traces/r18-28px" "$OUT_DIR/traces/r18-28px.hlo" \
        --bench="$OUT_DIR/traces/r18-28px.json" --out="$OUT_DIR/traces/roofline-r18-28px.json" | tee -a "$LOG" ;;
    xla28)  # section a of the SGD recipe at 28 px under each of XLA's fusion options, the plain step first and last
      xla_sweep "$OUT_DIR/xla28" 150 "${XLA28:-$XLA28_DEFAULT}" "${BENCH[@]}" --image_shape=28,28,1 --sections=a \
        --objective=simaffinity --optimizer=sgd ;;
    xla224)  # the same for ResNet-50's one-GPU step at 224 px, batch 128
      xla_sweep "$OUT_DIR/xla224" 400 "${XLA224:-$XLA224_DEFAULT}" "$PY" -m benchmarks.bench --sections=a \
        --encoder=resnet50 --image_shape=224,224,3 --data=synthetic --num_images=512 --objective=simaffinity \
        --optimizer=sgd --batch_size=128 --steps=20 --reps=5 --devices=1 ${BENCH_EXTRA:-} ;;
    cli) KERAS_BACKEND=jax run 900 "$PY" -m benchmarks.cli_vs_bench --flagfile="${FLAGFILE:-$PAPER}" --epochs=100 \
           --knn_every=10 --warm_rerun --work="$OUT_DIR/cli" --label="${FLAGFILE:-$PAPER}" --out="$OUT_DIR/cli.json" -- --nopictures ;;
    process) KERAS_BACKEND=jax run 400 "$PY" -m benchmarks.cli_vs_bench --flagfile="$PAPER" --epochs=5 --knn_every=0 \
           --warm_rerun --work="$OUT_DIR/process" --label="${LABEL:-5 epochs}" --out="$OUT_DIR/process.json" \
           -- --warmup_epochs=1 --nopictures ;;
    r50) KERAS_BACKEND=jax r50 ;;
    first_run) first_run ;;
    autotune_table) autotune_table ;;
    *) say "unknown phase $phase"; exit 2 ;;
  esac
done
results=$(ls "$OUT_DIR"/*.json 2>/dev/null | grep -v -e 'jaxlib-' -e 'speed.json' -e 'r50-report.json')
[ -n "$results" ] && "$PY" -m benchmarks.report speed $results --out="$OUT_DIR/speed.json" > "$OUT_DIR/speed.md" \
  && cat "$OUT_DIR/speed.md"
say "done"
