#!/usr/bin/env bash
# Every plot of docs/results/reproduction.md, from study runs found by name. A curve is one configuration:
# the mean of its seeds (runs NAME, NAME-s1, NAME-s2 that finished) with a band of +- one std, or one run.
#   bash benchmarks/study/plots.sh        the curated runs (benchmarks/results/*/runs.json) -> benchmarks/results/*/*.png
#   DIRS="R/recipe R/claims R/methods200" PLOTS=R/plots bash benchmarks/study/plots.sh     a rerun's results
# DIRS: the folders that hold run folders (NAME/history.json), searched in order; unset or empty: the
# curated runs.json of benchmarks/results/{recipe,methods,ablations}, unpacked into a temporary folder
# (benchmarks/study_runs.py). PLOTS: where the pictures go, one sub-folder per study (recipe, methods,
# ablations). PYTHON: an interpreter with matplotlib
# (default python3). A configuration with no finished run is left out of its plot, with a line on stderr;
# a plot with no curve at all is not drawn. Exit status: 0 when every curve was drawn, 3 when some
# configuration or plot was missing, 1 when drawing failed.
set -u
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
PLOTS=${PLOTS:-benchmarks/results}
if [ -z "${DIRS:-}" ]; then
  KEPT=$(mktemp -d); trap 'rm -rf "$KEPT"' EXIT
  for study in recipe methods ablations; do
    python3 benchmarks/study_runs.py unpack "benchmarks/results/$study/runs.json" --to="$KEPT/$study" || exit 1
    DIRS="${DIRS:-} $KEPT/$study"
  done
fi
RAW=0.7881  # raw-pixel kNN on the same protocol (k 200, T 0.1, the 60k bank)
mkdir -p "$PLOTS/recipe" "$PLOTS/methods" "$PLOTS/ablations"

finished() {  # NAME -> the first folder of DIRS holding a finished run NAME
  local d
  for d in $DIRS; do
    if grep -q '"status": *"finished"' "$d/$1/metrics.json" 2>/dev/null && [ -f "$d/$1/history.json" ]; then
      echo "$d/$1"; return
    fi
  done
}
curve() {  # LABEL NAME [one] -> "LABEL=FOLDER[,FOLDER...]": NAME's seeds (or NAME alone with "one")
  local folders=() name f
  for name in "$2" $([ "${3:-}" = one ] || echo "$2-s1 $2-s2"); do
    f=$(finished "$name"); [ -n "$f" ] && folders+=("$f")
  done
  if [ ${#folders[@]} -eq 0 ]; then echo "plots: no finished run of $2; left out" >&2; return; fi
  (IFS=,; echo "$1=${folders[*]}")
}
plot() {  # OUT_NAME [study_plots options...] -- CURVE_SPEC...  (each CURVE_SPEC "LABEL|NAME[|one]")
  local out=$1; shift
  local options=() curves=() spec c
  while [ $# -gt 0 ] && [ "$1" != -- ]; do options+=("$1"); shift; done
  shift
  for spec in "$@"; do
    IFS='|' read -r label name one <<< "$spec"
    c=$(curve "$label" "$name" "$one")  # (a subshell: it reports a missing configuration by printing nothing)
    if [ -n "$c" ]; then curves+=("$c"); else missing=1; fi
  done
  if [ ${#curves[@]} -eq 0 ]; then echo "plots: $out: no curve, not drawn" >&2; missing=1; return; fi
  "$PY" benchmarks/study_plots.py --out="$PLOTS/$out" "${options[@]}" "${curves[@]}" || failed=1
}
missing=0; failed=0

# 1. the recipe (recipe.plan, 200 epochs)
plot recipe/recipe-200.png --reference=$RAW --title="ResNet-18 on Fashion-MNIST, 200 epochs, kNN top-1 (mean of the seeds run)" -- \
  "SimAffinity + 4 local crops|sgd-t0.2-e200-mc4" "SimAffinity τ 0.2|sgd-t0.2-e200" \
  "SimWhitening τ 0.2|simwhitening-sgd-t0.2-e200" "SimTrace|simtrace-sgd-e200" "SimAffinity wd 1e-3|sgd-t0.2-e200-wd1e-3" \
  "SimAffinity batch 256|sgd-t0.2-e200-b256" "SimAffinity crop 0.35|sgd-t0.2-e200-crop35"
plot recipe/recipe-mc4-seeds.png --reference=$RAW --title="SimAffinity, 200 epochs: the default recipe (4 local crops) against two views" -- \
  "SimAffinity + 4 local crops|sgd-t0.2-e200-mc4" "SimAffinity two views τ 0.2|sgd-t0.2-e200"

# 2. every method at 200 epochs (methods200.plan; the UniCLR rows from recipe.plan): seed 0, then the seeds
M200=("SimAffinity τ0.1 γ0.01|sgd-t0.1-e200|one" "SimAffinity τ0.1 γ0|aff-t0.1-g0-e200|one"
      "SimWhitening τ0.2 γ0.01|simwhitening-sgd-t0.2-e200|one" "SimTrace|simtrace-sgd-e200|one"
      "SimTrace+pred+EMA|simtrace-tricks-e200|one" "SimCLR|simclr-e200|one" "MoCo v2|moco_v2-e200|one"
      "MoCo v3|moco_v3-e200|one" "CO2|co2-e200|one" "BYOL|byol-e200|one")
plot methods/claim-a-methods-200.png --reference=$RAW \
  --title="Fashion-MNIST, ResNet-18, 200 epochs, two views, SGD 0.06 / wd 5e-4 for every method (1 seed)" -- \
  "${M200[@]}" "SimSiam|simsiam-e200|one" "Barlow Twins|barlow_twins-e200|one" "VICReg|vicreg-e200|one" "W-MSE|wmse-e200|one"
plot methods/claim-a-methods-200-zoom.png --ylim=0.82,0.905 --title="The same runs, kNN 0.82-0.905 (SimSiam and W-MSE fall below)" -- \
  "${M200[@]}" "Barlow Twins|barlow_twins-e200|one" "VICReg|vicreg-e200|one"
plot methods/claim-a-seeds-200.png --ylim=0.80,0.905 --title="kNN top-1, 200 epochs, mean of 3 seeds (band: ± one std)" -- \
  "SimAffinity τ0.2 γ0.01|sgd-t0.2-e200" "SimCLR|simclr-e200" "BYOL|byol-e200" "Barlow Twins|barlow_twins-e200" "VICReg|vicreg-e200"
plot methods/claim-a-ema-seeds-200.png --ylim=0.80,0.905 \
  --title="kNN top-1, 200 epochs: the methods with an EMA target (mean of 3 seeds, band: ± one std)" -- \
  "SimAffinity τ0.2 γ0.01|sgd-t0.2-e200" "SimAffinity + EMA + predictor|simaffinity-ema-pred-e200" \
  "SimAffinity + EMA, γ 0 (1 seed)|simaffinity-ema-g0-e200" "BYOL|byol-e200" "MoCo v2|moco_v2-e200" "MoCo v3|moco_v3-e200" "CO2|co2-e200"
plot methods/claim-uniclr-seeds-200.png --ylim=0.80,0.895 \
  --title="kNN top-1, 200 epochs: the three UniCLR objectives (mean of 3 seeds, band: ± one std)" -- \
  "SimAffinity τ0.2 γ0.01|sgd-t0.2-e200" "SimWhitening τ0.2 γ0.01|simwhitening-sgd-t0.2-e200" "SimTrace|simtrace-sgd-e200"

# 3. the 50-epoch study and the paper's ablations (claims.plan)
plot ablations/claim-a-methods.png --reference=$RAW --title="(a) 50 epochs, SGD recipe, ResNet-18; band: ± 1 std over 3 seeds" -- \
  "SimAffinity τ0.1 γ0.01|aff-t0.1-g0.01" "SimTrace|simtrace" "SimCLR|simclr" "BYOL|byol" "Barlow Twins|barlow_twins" \
  "VICReg|vicreg" "MoCo v2|moco_v2" "SimSiam|simsiam" "W-MSE|wmse" "CO2|co2"
plot ablations/claim-bc-simaffinity.png --ylim=0.79,0.87 \
  --title="(b, c) SimAffinity with and without τ and γ, 50 epochs (mean of 3 seeds ± std)" -- \
  "τ 0.1, γ 0.01|aff-t0.1-g0.01" "τ 0.1, γ 0|aff-t0.1-g0" "τ 1, γ 0.01|aff-t1-g0.01" "τ 1, γ 0|aff-t1-g0"
plot ablations/claim-b-simclr.png --title="(b) the symmetric loss added to SimCLR, 50 epochs (mean of 3 seeds ± std)" -- \
  "SimCLR (τ 0.5)|simclr" "SimCLR + γ 0.01|simclr-g0.01" "SimAffinity τ 0.1, γ 0.01|aff-t0.1-g0.01"
plot ablations/claim-c-simwhitening.png --ylim=0.76,0.87 \
  --title="(c) SimWhitening with and without τ and γ, 50 epochs (mean of 3 seeds ± std)" -- \
  "SimWhitening τ 0.2, γ 0.01|whiten-t0.2-g0.01" "SimWhitening τ 0.2, γ 0|whiten-t0.2-g0" \
  "SimWhitening τ 1, γ 0.01|whiten-t1-g0.01" "SimWhitening τ 1, γ 0|whiten-t1-g0" \
  "SimAffinity τ 0.1, γ 0.01|aff-t0.1-g0.01" "SimAffinity τ 1, γ 0|aff-t1-g0"
D=("SimTrace alone|simtrace" "+ predictor|simtrace-pred" "+ EMA target 0.99|simtrace-ema"
   "+ stop-gradient of the covariance|simtrace-sgcov" "+ predictor + EMA|simtrace-tricks")
plot ablations/claim-d-simtrace.png --ylim=0.78,0.875 \
  --title="(d) SimTrace alone and with each trick, kNN, 50 epochs (mean of the seeds that finished ± std)" -- "${D[@]}"
plot ablations/claim-d-rank.png --metric=effective_rank \
  --title="(d) effective rank of the backbone's features (of 512), 50 epochs" -- "${D[@]}"
plot ablations/claim-d-std.png --metric=embedding_std \
  --title="(d) embedding std (ℓ2-normalised, 1/√256 = 0.0625 at most), 50 epochs" -- "${D[@]}"
[ $failed = 0 ] || exit 1
[ $missing = 0 ] || exit 3
