#!/usr/bin/env bash
# The train CLI over the GPUs of one machine: step time, weak and strong scaling, and the multi-process
# checks. Needs a machine with GPUS GPUs (2 or more; 4 for the pages' tables) and JAX with CUDA
# (KERAS_BACKEND=jax; no TensorFlow needed), Fashion-MNIST in ~/.keras/datasets. The model: ResNet-18 on
# 28 px Fashion-MNIST (configs/paper/fashion_mnist_simaffinity.flags: projector 2048-2048-256, bf16, LARS),
# augmentation on the device, no kNN monitor, PER_GPU (512) images per GPU, EPOCHS (6) epochs of which
# epochs FROM (3) on are timed (epoch 1 holds the compile).
#
#   GPUS=4 VARIANTS="g1 base launch" REPEATS=3 bash benchmarks/scaling.sh
#   GPUS=2 VARIANTS="g1 g1+twopass launch launch+twopass" bash benchmarks/scaling.sh
#   GPUS=4 VARIANTS="resume parity" bash benchmarks/scaling.sh        # the checks, no timing
#
# Variants (A+B: a run of A with option B):
#   g1       one GPU, the reference                 base     1 process x GPUS GPUs (--strategy=data_parallel)
#   launch   one process per GPU (python -m uniclr_tf.launch --processes=GPUS), one JAX job
#   indep    GPUS independent one-GPU runs at once, one per GPU, no collective (GPU 0's run is timed)
#   s1       one GPU at base's global batch (GPUS x PER_GPU): the strong-scaling reference
#   resume   launch stopped by SIGTERM to the launcher after epoch 1, then the same command again: it must
#            resume and end with one continuous history (a check; its line in RUNS_DIR/checks.txt)
#   parity   1 GPU and 1 process x 2 GPUs, the same flags and seed, 5 steps: their epoch-1 losses (a check)
#   options  onepass (--batch_norm=global_one_pass, the default), twopass (--batch_norm=global, Keras's
#            two-pass statistics), perdev (--batch_norm=per_device), knn (the kNN monitor every epoch on
#            the whole bank), bind (launch --cpu_binding=gpu; indep: taskset, a share of the CPUs each),
#            spe (4 steps compiled into one program, --steps_per_execution=4, on the first 57,344 images:
#            112, 56 or 28 steps an epoch on 1, 2 or 4 GPUs), and XLA flags: lhs (latency-hiding
#            scheduler), cmdbuf (collectives in CUDA graphs), sync (all-reduces on the compute stream;
#            syncall: every collective), oneshot (XLA's one-shot all-reduce), sym (NCCL symmetric
#            buffers), nocombine (no heuristic collective combining), noshard (every process autotunes),
#            pgle (the latency-hiding scheduler fed by JAX's profile-guided latency estimates: the step's
#            first 3 runs profiled, then recompiled), split (all-reduces combined up to 4 MiB rather than
#            30, so those of the gradients can start as the backward pass makes them; launch+lhs+split
#            overlaps them with it), ovl (the scheduler may keep 4 collectives in flight at once, not 1),
#            early (each collective starts as soon as its operands exist), ck (XLA's own Triton
#            all-reduce kernels, one- or two-shot, where it can use them), atdump (the run's autotuning
#            results written to RUNS_DIR/autotune.textproto), atload (read from there: the convolution
#            algorithms g1+atdump chose), sol (the latency-hiding scheduler with XLA's analytical
#            speed-of-light cost model), dump (the step's HLO after XLA's passes, in RUNS_DIR/hlo-VARIANT
#            with VARIANT's + as -; from a run that compiles, not one served from the cache), p2p (XLA's
#            copies between the GPUs of one process rather than NCCL's send/receive), nograph (no CUDA
#            graphs: every kernel launched on its own), cgraph (the convolutions in the CUDA graphs too),
#            nbc (NCCL's non-blocking communicators, with XLA's asynchronous NCCL execution that they
#            need), ub (NCCL's user buffers: collectives on XLA's buffers, no copies), ms (collectives on
#            several streams), nch1 (each collective on one NCCL channel); and for every collective
#            NCCL's protocol, ll (NCCL_PROTO=LL, its low-latency protocol for small messages) or ll128
#            (NCCL_PROTO=LL128), its algorithm, ring (NCCL_ALGO=Ring) or tree (NCCL_ALGO=Tree), conn1
#            (CUDA_DEVICE_MAX_CONNECTIONS=1: one hardware queue a GPU), nomix
#            (NCCL_GRAPH_MIXING_SUPPORT=0: no support for NCCL calls in and out of CUDA graphs at once),
#            and grp (NCCL_LAUNCH_MODE=GROUP: one process's GPUs launch each collective together)
# Each variant runs REPEATS (3) times, each run under `timeout LIMIT` (150 s) with the compilation cache in
# RUNS_DIR/xla-cache; TRACE=1 adds one run with --profile_steps over 5 steps of the last epoch
# (RUNS_DIR/VARIANT-trace: python -m benchmarks.report trace RUNS_DIR/VARIANT-trace [--compare=...]).
# At the end, and after every variant: OUT_DIR/scaling.json and scaling.md from
# `python -m benchmarks.report scaling RUNS_DIR` (per variant ms a step, images/s, weak and strong efficiency,
# the epoch end's share of the wall clock, failed runs), so a time limit that stops the script keeps what
# finished. Settings: GPUS (every GPU nvidia-smi lists), VARIANTS ("g1 base launch"), REPEATS, TRACE, EPOCHS,
# FROM, PER_GPU, LIMIT, OUT_DIR (runs/scaling), RUNS_DIR (OUT_DIR/runs), PYTHON (python3), EXTRA (train flags
# for every run), CPU_DEVICES=1 (a smoke test on XLA CPU devices, one per "GPU"). On 4 H100s a run is about
# 25 s of compile (less from the cache) + 15 s of start-up + 6 epochs of ~1.3 s.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
GPUS=${GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')}
VARIANTS=${VARIANTS:-g1 base launch}; REPEATS=${REPEATS:-3}; TRACE=${TRACE:-0}
EPOCHS=${EPOCHS:-6}; FROM=${FROM:-3}; PER_GPU=${PER_GPU:-512}; LIMIT=${LIMIT:-150}
OUT_DIR=${OUT_DIR:-runs/scaling}; RUNS_DIR=${RUNS_DIR:-$OUT_DIR/runs}; EXTRA=${EXTRA:-}
[ "${GPUS:-0}" -ge 2 ] 2>/dev/null || { echo "scaling: GPUS must be 2 or more (found '${GPUS:-}')" >&2; exit 2; }
export KERAS_BACKEND=jax PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
mkdir -p "$OUT_DIR" "$RUNS_DIR/logs"
ALL=$(seq -s, 0 $((GPUS - 1)))
COMMON=(--flagfile=configs/paper/fashion_mnist_simaffinity.flags --augment_on=device --epochs="$EPOCHS"
        --warmup_epochs=1 --knn_every=0 --knn_max_train=5000 --nopictures --overwrite --verbose=2
        --compilation_cache_dir="$RUNS_DIR/xla-cache" --run_dir="$RUNS_DIR")
"$PY" - "$RUNS_DIR/environment.json" "$*" <<'PY'
import datetime, json, subprocess, sys
from importlib import metadata
try:
    cards = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                           text=True).stdout.split("\n")
    card = f"{sum(1 for c in cards if c)} x {cards[0]}" if cards[0] else "CPU devices"
except OSError:
    card = "CPU devices"
versions = []
for p in ("jax", "keras"):
    try:
        versions.append(f"{p} {metadata.version(p)}")
    except metadata.PackageNotFoundError:
        pass
versions = ", ".join(versions)
json.dump({"card": card, "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
           "software": versions, "command": "bash benchmarks/scaling.sh"}, open(sys.argv[1], "w"))
PY

run() {  # run NAME GPUS PROCESSES [TRAIN FLAGS...]: one train command (PROCESSES > 1: the launcher), waited for
  local name=$1 gpus=$2 procs=$3; shift 3
  local env_=(CUDA_VISIBLE_DEVICES="$gpus") entry=(-m uniclr_tf.train)
  [ -n "${CPU_DEVICES:-}" ] && env_+=(XLA_FLAGS="${XLA:-} --xla_force_host_platform_device_count=$(( $(awk -F, '{print NF}' <<< "$gpus") / procs ))")
  [ -z "${CPU_DEVICES:-}" ] && [ -n "${XLA:-}" ] && env_+=(XLA_FLAGS="$XLA")
  [ -n "${RUN_ENV:-}" ] && read -ra runenv_ <<< "$RUN_ENV" && env_+=("${runenv_[@]}")
  [ "$procs" -gt 1 ] && entry=(-m uniclr_tf.launch --processes="$procs" --log_dir="$RUNS_DIR/logs/$name" ${LAUNCH_FLAGS:-} --)
  # shellcheck disable=SC2086
  env "${env_[@]}" timeout --kill-after=20 "$LIMIT" ${PREFIX:-} "$PY" "${entry[@]}" "${COMMON[@]}" $EXTRA \
    --run_name="$name" "$@" > "$RUNS_DIR/logs/$name.log" 2>&1
}

variant() {  # variant NAME: REPEATS timed runs (+ a traced one), its spec in RUNS_DIR/NAME.json
  local v=$1 kind part xla="" runenv="" extra=() bind="" images=60000
  kind=${v%%+*}
  for part in $(tr '+' ' ' <<< "${v#"$kind"}"); do
    case $part in
      onepass) extra+=(--batch_norm=global_one_pass) ;; twopass) extra+=(--batch_norm=global) ;;
      perdev) extra+=(--batch_norm=per_device) ;;
      knn) extra+=(--knn_every=1 --knn_max_train=0) ;; bind) bind=1 ;;
      spe) images=57344; extra+=(--steps_per_execution=4 --max_examples=$images) ;;
      lhs) xla="$xla --xla_gpu_enable_latency_hiding_scheduler=true" ;;
      cmdbuf) xla="$xla --xla_gpu_enable_command_buffer=+COLLECTIVES" ;;
      sync) xla="$xla --xla_gpu_disable_async_collectives=ALLREDUCE" ;;
      syncall) xla="$xla --xla_gpu_disable_async_collectives=ALLCOLLECTIVES" ;;
      oneshot) xla="$xla --xla_gpu_unsupported_use_all_reduce_one_shot_kernel=true" ;;
      sym) xla="$xla --xla_gpu_experimental_enable_nccl_symmetric_buffers=true" ;;
      nocombine) xla="$xla --xla_gpu_experimental_enable_heuristic_collective_combining=false" ;;
      noshard) xla="$xla --xla_gpu_shard_autotuning=false" ;;
      split) xla="$xla --xla_gpu_all_reduce_combine_threshold_bytes=4194304" ;;
      ovl) xla="$xla --xla_gpu_experimental_parallel_collective_overlap_limit=4" ;;
      early) xla="$xla --xla_gpu_experimental_collective_start_as_early_as_possible=true" ;;
      ck) xla="$xla --xla_gpu_experimental_use_collective_kernels=ALL_REDUCE" ;;
      atdump) xla="$xla --xla_gpu_dump_autotune_results_to=$RUNS_DIR/autotune.textproto" ;;
      atload) xla="$xla --xla_gpu_load_autotune_results_from=$RUNS_DIR/autotune.textproto" ;;
      sol) xla="$xla --xla_gpu_enable_latency_hiding_scheduler=true --xla_gpu_enable_analytical_sol_latency_estimator=true" ;;
      p2p) xla="$xla --xla_gpu_use_memcpy_local_p2p=true" ;;
      dump) xla="$xla --xla_dump_to=$RUNS_DIR/hlo-${v//+/-} --xla_dump_hlo_as_text --xla_dump_hlo_module_re=.*train.*" ;;
      nograph) xla="$xla --xla_gpu_enable_command_buffer=" ;;
      cgraph) xla="$xla --xla_gpu_enable_command_buffer=+CONVOLUTION" ;;
      grp) runenv="$runenv NCCL_LAUNCH_MODE=GROUP" ;;
      nbc) xla="$xla --xla_gpu_nccl_async_execution=true --xla_gpu_nccl_blocking_communicators=false" ;;
      nomix) runenv="$runenv NCCL_GRAPH_MIXING_SUPPORT=0" ;;
      nch1) xla="$xla --xla_gpu_nccl_collective_max_nchannels=1" ;;
      ub) xla="$xla --xla_gpu_enable_nccl_user_buffers=true" ;;
      ms) xla="$xla --xla_gpu_experimental_enable_collective_multi_streaming=true" ;;
      ll) runenv="$runenv NCCL_PROTO=LL" ;; ll128) runenv="$runenv NCCL_PROTO=LL128" ;;
      ring) runenv="$runenv NCCL_ALGO=Ring" ;; tree) runenv="$runenv NCCL_ALGO=Tree" ;;
      conn1) runenv="$runenv CUDA_DEVICE_MAX_CONNECTIONS=1" ;;
      pgle) xla="$xla --xla_gpu_enable_latency_hiding_scheduler=true"
            runenv="$runenv JAX_ENABLE_PGLE=true JAX_PGLE_PROFILING_RUNS=3" ;;
      *) echo "scaling: unknown option '$part' of $v" >&2; return 2 ;;
    esac
  done
  local gpus=$ALL procs=1 ngpu=$GPUS batch=$((GPUS * PER_GPU)) per=$PER_GPU layout
  case $kind in
    g1) gpus=0; ngpu=1; batch=$PER_GPU; layout="1 GPU" ;;
    base) layout="1 process x $GPUS GPUs (--strategy=data_parallel)"; extra+=(--strategy=data_parallel) ;;
    launch) procs=$GPUS; layout="one process per GPU (python -m uniclr_tf.launch)" ;;
    indep) ngpu=1; batch=$PER_GPU; layout="$GPUS independent one-GPU runs at once (GPU 0's)" ;;
    s1) gpus=0; ngpu=1; per=$batch; layout="1 GPU at the $GPUS-GPU global batch ($batch)" ;;
    resume) resume "${extra[@]}"; return ;;
    parity) parity "${extra[@]}"; return ;;
    *) echo "scaling: unknown variant '$v'" >&2; return 2 ;;
  esac
  [ -n "$bind" ] && layout="$layout, CPUs bound"
  local options
  # shellcheck disable=SC2086
  options=$(echo ${extra[*]/--strategy=data_parallel/} $xla $runenv)  # the options' own flags, in the report
  [ -n "$options" ] && layout="$layout, $options"
  printf '{"variant": "%s", "run": "%s", "gpus": %d, "batch_per_gpu": %d, "layout": "%s"}\n' \
    "$v" "$kind" "$ngpu" "$per" "$layout" > "$RUNS_DIR/$v.json"
  local r tag flags last=$((EPOCHS * (images / batch))) rc start
  for ((r = 1; r <= REPEATS + (TRACE == 1 ? 1 : 0); r++)); do
    tag=$v-r$r; flags=("${extra[@]}" --batch_size="$batch")
    [ "$r" -gt "$REPEATS" ] && { tag=$v-trace; flags+=(--profile_steps=$((last - 5)),$((last - 1))); }
    echo "=== $(date -u +%T) $tag: $layout, batch $batch${xla:+, XLA_FLAGS=$xla}${runenv:+,$runenv}"
    start=$SECONDS
    if [ "$kind" = indep ]; then  # one run per GPU at once; GPU 0's is the variant's
      local k pids=() cpus=$(nproc)
      for ((k = GPUS - 1; k >= 0; k--)); do
        local name=$tag prefix=""
        [ "$k" -gt 0 ] && name=gpu$k.$tag  # not VARIANT-rN: only GPU 0's run is the variant's
        [ -n "$bind" ] && prefix="taskset -c $((k * cpus / GPUS))-$(((k + 1) * cpus / GPUS - 1))"
        XLA=$xla RUN_ENV=$runenv PREFIX=$prefix run "$name" "$k" 1 "${flags[@]}" & pids+=($!)
      done
      rc=0; for k in "${pids[@]}"; do wait "$k" || rc=$?; done
    else
      XLA=$xla RUN_ENV=$runenv LAUNCH_FLAGS=${bind:+--cpu_binding=gpu} run "$tag" "$gpus" "$procs" "${flags[@]}"; rc=$?
    fi
    echo "rc=$rc seconds=$((SECONDS - start))" > "$RUNS_DIR/$tag.status"
    echo "    exit $rc after $((SECONDS - start)) s"
    [ "$rc" = 0 ] || tail -n 15 "$RUNS_DIR/logs/$tag.log" | sed 's/^/    /'
  done
}

resume() {  # launch, SIGTERM to the launcher once epoch 1 is in the history, then the same command again
  local name=resume flags=("$@" --batch_size=$((GPUS * PER_GPU)))
  echo "=== $(date -u +%T) resume: one process per GPU, stopped after epoch 1, then resumed"
  run "$name" "$ALL" "$GPUS" "${flags[@]}" &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    "$PY" -c "import json,sys; sys.exit(len(json.load(open(sys.argv[1]))) < 1)" "$RUNS_DIR/$name/history.json" 2>/dev/null && break
    sleep 0.5
  done
  pkill -TERM -P "$pid" 2>/dev/null  # timeout, the launcher's parent, passes it on; the launcher forwards it
  wait "$pid"; local first=$?
  mv "$RUNS_DIR/logs/$name.log" "$RUNS_DIR/logs/$name.stopped.log"
  local saved=("${COMMON[@]}") kept=() a; for a in "${COMMON[@]}"; do [ "$a" = --overwrite ] || kept+=("$a"); done
  COMMON=("${kept[@]}"); run "$name" "$ALL" "$GPUS" "${flags[@]}"; local rc=$?; COMMON=("${saved[@]}")
  local history
  history=$("$PY" -c "import json,sys; e=[x['epoch'] for x in json.load(open(sys.argv[1]))]; print('continuous' if e == list(range(1, int(sys.argv[2]) + 1)) else f'epochs {e}')" \
    "$RUNS_DIR/$name/history.json" "$EPOCHS" 2>&1)
  local verdict=passed
  { [ "$first" = 143 ] && [ "$rc" = 0 ] && [ "$history" = continuous ] && grep -q "resuming at" "$RUNS_DIR/logs/$name.log"; } || verdict=FAILED
  echo "resume: $verdict (first part exit $first, second exit $rc, history $history)" | tee -a "$RUNS_DIR/checks.txt"
}

parity() {  # p1 (1 GPU) and p2 (1 process x 2 GPUs), the same flags and seed, 5 steps: epoch-1 losses
  local flags=("$@" --batch_size=$((2 * PER_GPU)) --epochs=1 --steps_per_epoch=5 --seed=0)
  echo "=== $(date -u +%T) parity: 1 GPU against 1 process x 2 GPUs, 5 steps"
  if [ "$GPUS" -gt 2 ]; then  # side by side on GPUs 0 and 1,2; on 2 GPUs one after the other (they share GPU 0)
    run p1 0 1 "${flags[@]}" & local a=$!
    run p2 1,2 1 --strategy=data_parallel "${flags[@]}" &
    local b=$!; wait "$a"; wait "$b"
  else
    run p1 0 1 "${flags[@]}"
    run p2 0,1 1 --strategy=data_parallel "${flags[@]}"
  fi
  "$PY" - "$RUNS_DIR" <<'PY' | tee -a "$RUNS_DIR/checks.txt"
import json, os, sys
loss = [json.load(open(os.path.join(sys.argv[1], n, "history.json")))[0]["loss"] for n in ("p1", "p2")]
print(f"parity: epoch-1 loss 1 GPU {loss[0]:.6f}, 2 GPUs {loss[1]:.6f}, relative difference {abs(loss[1] - loss[0]) / abs(loss[0]):.1e}")
PY
}

report() { "$PY" -m benchmarks.report scaling "$RUNS_DIR" --first_epoch="$FROM" --out="$OUT_DIR/scaling.json" > "$OUT_DIR/scaling.md"; }
status=0
for v in $VARIANTS; do
  variant "$v" || status=$?
  [ -n "$(ls "$RUNS_DIR"/*-r*.status 2>/dev/null)" ] && report
done
if [ -n "$(ls "$RUNS_DIR"/*-r*.status 2>/dev/null)" ]; then report && cat "$OUT_DIR/scaling.md"; fi
[ -f "$RUNS_DIR/checks.txt" ] && cat "$RUNS_DIR/checks.txt"
exit $status
