#!/usr/bin/env bash
# Issue 26: what removes the fixed per-step cost of the multi-GPU step (benchmarks/SCALING.md). Each
# variant runs benchmarks/scaling.sh's g4 (1 process x 4 GPUs, 512 images per GPU; p4 for the 4-process one),
# or with GPUS=2 its g2 (m2 for 2 processes), REPEATS times untraced, then once with --profile_steps on 5
# steps of the last epoch, summarised by benchmarks/trace_summary.py (TRACE=0: no traced run); g1 is the
# one-GPU reference, and each traced variant's kernels are compared with g1's (trace_summary.py --compare).
# Prints, per variant, the median over the repeats of each repeat's median ms a step (epochs FROM..EPOCHS),
# the repeats' spread, the weak-scaling efficiency against g1's, and the epoch end (an epoch's wall clock
# outside its steps, ms and share); for knn1/knn4, the kNN monitor's seconds per evaluation and the final kNN's.
#
#   VARIANTS="g1 base cmdbuf onepass lhs perdev p4" REPEATS=3 bash benchmarks/gpu/step_variants.sh
#
#   g1      one GPU, the reference                base    g4 (GPUS=2: g2) as shipped
#   cmdbuf  g4 with the NCCL collectives captured in XLA's CUDA graphs (--xla_gpu_enable_command_buffer=+COLLECTIVES)
#   onepass g4 with --batch_norm=global_one_pass (one combined all-reduce for both BN statistics)
# (measured on 4 x H100: benchmarks/SCALING.md, "Tried and slower")
#   lhs     g4 with XLA's latency-hiding scheduler   perdev  g4 with --batch_norm=per_device
# XLA's collective flags (measured on 4 x H200 with one process per GPU, launch+FLAG: no faster; SCALING.md):
#   sync    all-reduces on the compute stream (--xla_gpu_disable_async_collectives=ALLREDUCE)
#   oneshot XLA's one-shot all-reduce kernel for small all-reduces instead of NCCL's
#           (--xla_gpu_unsupported_use_all_reduce_one_shot_kernel=true; NCCL where it does not apply)
#   sym     NCCL symmetric buffers (--xla_gpu_experimental_enable_nccl_symmetric_buffers=true; measured with
#           NCCL_NVLS_ENABLE=0 in the environment: NVLink multicast off)
#   nocombine  without XLA's heuristic collective combining (..._enable_heuristic_collective_combining=false)
#   noshard each process autotunes every kernel itself (--xla_gpu_shard_autotuning=false; launch+noshard: no faster)
#   p4 (or p) GPUS processes x 1 GPU through python -m uniclr_tf.launch (scaling.sh's p4; m2 when GPUS=2)
#   launch  the same (scaling.sh's l4 / l2, the name of earlier measurements)
#   indep   GPUS independent one-GPU runs at once (scaling.sh's i4 / i2; GPU 0's run timed): the cost of
#           running side by side without any collective
#   bind    the launcher binds each process to a share of its GPU's NUMA node (--cpu_binding=gpu);
#           with indep, each run to an equal share of the CPUs (taskset)
#   s1      one GPU at base's global batch (GPUS x 512): strong scaling at that batch is base / (GPUS x s1)
#   A+B     the two combined (e.g. p4+onepass, cmdbuf+perdev)
#   knn1 / knn4  g1 / base with the kNN monitor every epoch on the whole 60,000-image bank (--knn_every=1
#           --knn_max_train=0), for the evaluation's time on 1 and 4 GPUs
# On 4 x H100 a variant of 3 untraced runs is ~1.5 minutes (50 s for the first run's compile, then ~25 s a run
# from the compilation cache): split VARIANTS over several invocations of a time-limited job.
# Output in $OUT (default /tmp/step-variants): variants.json, variants.log, traces.tar.gz (trace summaries).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/step-variants}; RUNS=${RUNS:-/tmp/step-variants-runs}; mkdir -p "$OUT" "$RUNS"; export OUT
VARIANTS=${VARIANTS:-g1 base cmdbuf onepass lhs perdev p4}; REPEATS=${REPEATS:-3}; EPOCHS=${EPOCHS:-6}
GPUS=${GPUS:-4}  # 4 or 2: the multi-GPU runs' GPU count
case "$GPUS" in 4) MULTI=g4; PROCS=p4 ;; 2) MULTI=g2; PROCS=m2 ;; *) echo "GPUS=$GPUS: 2 or 4"; exit 2 ;; esac
# timed epochs FROM..EPOCHS: epoch 1 holds the compile (or the cache's load), and epoch 2 is often still up
# to 2.5x slower than the later ones (on 4 x H100: 15.7 against 11.3 ms a step on one GPU)
FROM=${FROM:-3}
TRACE=${TRACE:-1}
TRACED=${TRACED:-}  # with TRACE=1, the variants traced (default: all of VARIANTS)
PY=${PYTHON:-python3}
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
# STEPS (a smoke test: --steps_per_epoch for every run) and EXTRA_ALL (flags for every run, e.g. a small model)
STEPS=${STEPS:-}; EXTRA_ALL=${EXTRA_ALL:-}
[ -n "$STEPS" ] && EXTRA_ALL="$EXTRA_ALL --steps_per_epoch=$STEPS"
steps_per_epoch() { [ -n "$STEPS" ] && echo "$STEPS" && return; [[ "$1" = g1 || "$1" = i? ]] && echo 117 || echo $((60000 / (512 * GPUS))); }  # 60,000 images a batch of 512 / 512 x GPUS (s1 too)
run_variant() {  # run_variant NAME: REPEATS timed runs + 1 traced run
  local v=$1 only=$MULTI xla="" extra="$EXTRA_ALL" tail="" part bind=""
  for part in ${v//+/ }; do  # a variant may combine several: p4+onepass, cmdbuf+perdev
    case "$part" in
      g1) only=g1 ;; base) ;; p4|p) only=$PROCS ;; s1) only=s1 ;; launch) only=l$GPUS ;; indep) only=i$GPUS ;;
      bind) bind=1 ;;
      knn1) only=g1; tail="--knn_every=1 --knn_max_train=0" ;;
      knn4) tail="--knn_every=1 --knn_max_train=0" ;;
      cmdbuf) xla="$xla --xla_gpu_enable_command_buffer=+COLLECTIVES" ;;
      lhs) xla="$xla --xla_gpu_enable_latency_hiding_scheduler=true" ;;
      sync) xla="$xla --xla_gpu_disable_async_collectives=ALLREDUCE" ;;
      oneshot) xla="$xla --xla_gpu_unsupported_use_all_reduce_one_shot_kernel=true" ;;
      sym) xla="$xla --xla_gpu_experimental_enable_nccl_symmetric_buffers=true" ;;
      nocombine) xla="$xla --xla_gpu_experimental_enable_heuristic_collective_combining=false" ;;
      noshard) xla="$xla --xla_gpu_shard_autotuning=false" ;;
      perdev) extra="$extra --batch_norm=per_device" ;;
      onepass) extra="$extra --batch_norm=global_one_pass" ;;
      *) echo "unknown variant $part (of $v)"; return 1 ;;
    esac
  done
  local spe last first
  spe=$(steps_per_epoch "$only"); last=$((spe * EPOCHS - 1)); first=$((last > 5 ? last - 4 : 1))
  echo "$only $spe" > "$RUNS/$v.run"  # the summary below reads the run's name and steps an epoch here
  local traced=$TRACE
  [ -n "$TRACED" ] && [[ " $TRACED " != *" $v "* ]] && traced=0
  for ((r = 1; r <= REPEATS + (traced ? 1 : 0); r++)); do
    local tag="$v-r$r" e="$extra"
    [ "$r" -gt "$REPEATS" ] && { tag="$v-trace"; e="$extra --profile_steps=$first,$last"; }
    echo "=== $(date -u +%T) $tag: ONLY=$only XLA_FLAGS='$xla' EXTRA='$e'"
    BIND=$bind LAUNCH_FLAGS=${bind:+--cpu_binding=gpu} XLA_FLAGS="$xla" STRONG=$((512 * GPUS)) RUNS="$RUNS/$tag" OUT="$RUNS/$tag" EPOCHS=$EPOCHS ONLY=$only EXTRA="$e" TAIL="$tail" LIMIT=${LIMIT:-120} \
      bash benchmarks/scaling.sh > "$RUNS/$tag.log" 2>&1
    echo "    exit $? ($(grep -c . "$RUNS/$tag.log") log lines)"
  done
  if [ -d "$RUNS/$v-trace/$only/profile" ]; then
    local against=()  # every traced variant's kernels against the one-GPU step's, when g1 was traced first
    [ "$v" != g1 ] && [ -f "$RUNS/g1-trace.summary.json" ] && against=(--compare="$RUNS/g1-trace.summary.json")
    "$PY" benchmarks/trace_summary.py "$RUNS/$v-trace/$only/profile" --json="$RUNS/$v-trace.summary.json" "${against[@]}" \
      > "$RUNS/$v-trace.summary.txt" 2>&1
    tail -n 40 "$RUNS/$v-trace.summary.txt"
  fi
}
for v in $VARIANTS; do run_variant "$v"; done 2>&1 | tee "$OUT/variants.log"
"$PY" - "$RUNS" "$EPOCHS" "$FROM" "$GPUS" $VARIANTS <<'PYEOF' | tee -a "$OUT/variants.log"
import glob, json, os, statistics, sys
sys.path.insert(0, "benchmarks")
from study import _json as load  # a JSON file's content, or None when missing or unreadable
runs, epochs, first, gpus, variants = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:]

out = {}
for v in variants:
    try:  # the scaling.sh run this variant ran, and its steps an epoch (written by run_variant)
        name, steps = open(os.path.join(runs, f"{v}.run")).read().split()
    except OSError:
        continue
    steps, images = int(steps), 512 if name in ("g1", "i2", "i4") else 512 * gpus
    repeats, ends, knn, final = [], [], [], []  # per repeat: median ms a step over epochs FROM..EPOCHS
    for folder in sorted(glob.glob(os.path.join(runs, f"{v}-r*", name))):
        history = load(os.path.join(folder, "history.json")) or []
        ms = [1000 * e["step_seconds"] / steps for e in history if first <= e["epoch"] <= epochs and "step_seconds" in e]
        if ms:
            repeats.append(statistics.median(ms))
        # the epoch end: an epoch's wall clock outside its steps (backup, history, the kNN monitor)
        pairs = [(prev, e) for prev, e in zip(history, history[1:])
                 if first <= e["epoch"] <= epochs and "step_seconds" in e and "wall_seconds" in e]
        if pairs:
            wall = sum(e["wall_seconds"] - prev["wall_seconds"] for prev, e in pairs)
            outside = wall - sum(e["step_seconds"] for _, e in pairs)
            ends.append((1000 * outside / len(pairs), outside / wall))
        knn += [e["knn_seconds"] for e in history if e.get("epoch", 0) >= 2 and "knn_seconds" in e]
        seconds = (load(os.path.join(folder, "metrics.json")) or {}).get("seconds", {})
        if "final_knn" in seconds:
            final.append(seconds["final_knn"])
    if not repeats:
        continue
    median = statistics.median(repeats)
    out[v] = {"run": name, "gpus": 1 if name in ("g1", "s1", "i2", "i4") else gpus, "repeat_medians_ms": repeats, "median_ms": median,
              "images_per_second": images * 1000 / median,
              "epoch_end_ms": [round(ms, 1) for ms, _ in ends], "epoch_end_share_of_wall": [round(f, 4) for _, f in ends]}
    if knn:
        out[v]["knn_monitor_seconds_median"] = statistics.median(knn)
    if final:
        out[v]["final_knn_seconds_median"] = statistics.median(final)
g1 = out.get("g1", {}).get("images_per_second")
s1 = out.get("s1", {}).get("images_per_second")
for v, r in out.items():
    r["weak_efficiency"] = (r["images_per_second"] / r["gpus"] / g1) if g1 and v != "s1" else None
    if s1 and r["gpus"] > 1:
        r["strong_efficiency"] = r["images_per_second"] / (r["gpus"] * s1)
    print(f"{v:7s} median {r['median_ms']:6.2f} ms/step over {len(r['repeat_medians_ms'])} repeats "
          f"(repeats {min(r['repeat_medians_ms']):.2f}-{max(r['repeat_medians_ms']):.2f})  "
          f"{r['images_per_second']:9.0f} images/s"
          + (f"  weak eff. {r['weak_efficiency']:.3f}" if r["weak_efficiency"] else "")
          + (f"  strong eff. {r['strong_efficiency']:.3f}" if r.get("strong_efficiency") else "")
          + (f"  epoch end {statistics.median(r['epoch_end_ms']):.0f} ms "
             f"({100 * statistics.median(r['epoch_end_share_of_wall']):.1f} % of the wall clock)" if r["epoch_end_ms"] else "")
          + (f"  kNN monitor {r['knn_monitor_seconds_median']:.2f} s" if "knn_monitor_seconds_median" in r else "")
          + (f"  final kNN {r['final_knn_seconds_median']:.2f} s" if "final_knn_seconds_median" in r else ""))
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp/step-variants"), "variants.json"), "w"), indent=1)
PYEOF
tar -czf "$OUT/traces.tar.gz" -C "$RUNS" $(cd "$RUNS" && ls -d ./*.summary.json ./*.summary.txt ./*.log 2>/dev/null) 2>/dev/null
ls -la "$OUT"
