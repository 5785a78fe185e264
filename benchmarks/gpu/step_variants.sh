#!/usr/bin/env bash
# Issue 26: what removes the fixed per-step cost of the 4-GPU step (docs/results/scaling.md, "A trace of
# the 4-GPU step"). Each variant runs benchmarks/scaling.sh's g4 (1 process x 4 GPUs, 512 images per GPU;
# p4 for the 4-process one) REPEATS times untraced, then once with --profile_steps on 5 steps of the last
# epoch, summarised by benchmarks/trace_summary.py; g1 is the one-GPU reference. Prints the median ms a
# step over epochs 2..EPOCHS of the repeats and the weak-scaling efficiency against g1's median.
#
#   VARIANTS="g1 base cmdbuf onepass lhs perdev p4" REPEATS=3 bash benchmarks/gpu/step_variants.sh
#
#   g1      one GPU, the reference                base    g4 as shipped
#   cmdbuf  g4 with the NCCL collectives captured in XLA's CUDA graphs (--xla_gpu_enable_command_buffer=+COLLECTIVES)
#   onepass g4 with --batch_norm=global_one_pass (one all-reduce for both BN statistics)
#   lhs     g4 with XLA's latency-hiding scheduler   perdev  g4 with --batch_norm=per_device
#   p4      4 processes x 1 GPU
# Each variant is ~2.5 minutes (one compile, then the compilation cache): split VARIANTS over several invocations.
# Output in $OUT (default /tmp/step-variants): variants.json, variants.log, traces.tar.gz (trace summaries).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/step-variants}; RUNS=${RUNS:-/tmp/step-variants-runs}; mkdir -p "$OUT" "$RUNS"; export OUT
VARIANTS=${VARIANTS:-g1 base cmdbuf onepass lhs perdev p4}; REPEATS=${REPEATS:-3}; EPOCHS=${EPOCHS:-3}
PY=${PYTHON:-python3}
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
# STEPS (a smoke test: --steps_per_epoch for every run) and EXTRA_ALL (flags for every run, e.g. a small model)
STEPS=${STEPS:-}; EXTRA_ALL=${EXTRA_ALL:-}
[ -n "$STEPS" ] && EXTRA_ALL="$EXTRA_ALL --steps_per_epoch=$STEPS"
steps_per_epoch() { [ -n "$STEPS" ] && echo "$STEPS" && return; [ "$1" = g1 ] && echo 117 || echo 29; }  # 60,000 images at 512 / 2,048
run_variant() {  # run_variant NAME: REPEATS timed runs + 1 traced run
  local v=$1 only=g4 xla="" extra="$EXTRA_ALL"
  case "$v" in
    g1) only=g1 ;; base) ;; p4) only=p4 ;;
    cmdbuf) xla="--xla_gpu_enable_command_buffer=+COLLECTIVES" ;;
    lhs) xla="--xla_gpu_enable_latency_hiding_scheduler=true" ;;
    perdev) extra="$extra --batch_norm=per_device" ;;
    onepass) extra="$extra --batch_norm=global_one_pass" ;;
    *) echo "unknown variant $v"; return 1 ;;
  esac
  local spe last first
  spe=$(steps_per_epoch "$only"); last=$((spe * EPOCHS - 1)); first=$((last > 5 ? last - 4 : 1))
  for ((r = 1; r <= REPEATS + 1; r++)); do
    local tag="$v-r$r" e="$extra"
    [ "$r" -gt "$REPEATS" ] && { tag="$v-trace"; e="$extra --profile_steps=$first,$last"; }
    echo "=== $(date -u +%T) $tag: ONLY=$only XLA_FLAGS='$xla' EXTRA='$e'"
    XLA_FLAGS="$xla" RUNS="$RUNS/$tag" OUT="$RUNS/$tag" EPOCHS=$EPOCHS ONLY=$only EXTRA="$e" LIMIT=${LIMIT:-120} \
      bash benchmarks/scaling.sh > "$RUNS/$tag.log" 2>&1
    echo "    exit $? ($(grep -c . "$RUNS/$tag.log") log lines)"
  done
  [ -d "$RUNS/$v-trace/$only/profile" ] && "$PY" benchmarks/trace_summary.py "$RUNS/$v-trace/$only/profile" \
    --json="$RUNS/$v-trace.summary.json" | tail -n 3
}
for v in $VARIANTS; do run_variant "$v"; done 2>&1 | tee "$OUT/variants.log"
"$PY" - "$RUNS" "$EPOCHS" "$STEPS" $VARIANTS <<'PYEOF' | tee -a "$OUT/variants.log"
import glob, json, os, statistics, sys
runs, epochs, fixed, variants = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
out = {}
for v in variants:
    name = "g1" if v == "g1" else "p4" if v == "p4" else "g4"
    steps, images = (117, 512) if v == "g1" else (29, 2048)
    steps = int(fixed) if fixed else steps
    ms = []
    for folder in sorted(glob.glob(os.path.join(runs, f"{v}-r*", name))):
        try:
            history = json.load(open(os.path.join(folder, "history.json")))
        except OSError:
            continue
        ms += [1000 * e["step_seconds"] / steps for e in history if 2 <= e["epoch"] <= epochs]
    if ms:
        out[v] = {"ms_per_step": ms, "median_ms": statistics.median(ms), "images_per_second": images * 1000 / statistics.median(ms)}
g1 = out.get("g1", {}).get("images_per_second")
for v, r in out.items():
    r["weak_efficiency"] = (r["images_per_second"] / (1 if v == "g1" else 4) / g1) if g1 else None
    print(f"{v:7s} median {r['median_ms']:6.2f} ms/step over {len(r['ms_per_step'])} epochs "
          f"(min {min(r['ms_per_step']):.2f}, max {max(r['ms_per_step']):.2f})  {r['images_per_second']:9.0f} images/s"
          + (f"  weak eff. {r['weak_efficiency']:.3f}" if r["weak_efficiency"] else ""))
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp/step-variants"), "variants.json"), "w"), indent=1)
PYEOF
tar -czf "$OUT/traces.tar.gz" -C "$RUNS" $(cd "$RUNS" && ls -d ./*.summary.json ./*.log 2>/dev/null) 2>/dev/null
ls -la "$OUT"
