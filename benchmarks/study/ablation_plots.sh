#!/usr/bin/env bash
# The 50-epoch ablation plots of REPRODUCTION.md section 2 (claims b, c, d), from the runs kept in
# benchmarks/study/: each curve is the mean of a configuration's seeds with a band of +- one std.
#   bash benchmarks/study/ablation_plots.sh          (with a python that has matplotlib: PYTHON=.venv/bin/python)
set -eu
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
S=benchmarks/study
# where each run of claims.plan lives: seed 0 of the first rows in h100x4-call3, of the session 8 rows in
# h200x4-session8; seeds 1-2 in h100-seeds (sessions 4-5) or h100x4-session8(-b) (session 8)
find_run() {
  for d in $S/h100x4-call3/claims $S/h100-call4/claims $S/h100-seeds $S/h200x4-session8/claims \
           $S/h100x4-session8/claims $S/h100x4-session8-b/claims; do
    [ -f "$d/$1/history.json" ] && { echo "$d/$1"; return; }
  done
  echo "no run $1 in $S" >&2; return 1
}
seeds() {  # NAME -> the folders of NAME, NAME-s1, NAME-s2 that finished (a diverged seed is left out)
  local out=() name
  for name in "$1" "$1-s1" "$1-s2"; do
    f=$(find_run "$name") || continue
    grep -q '"status": "finished"' "$f/metrics.json" 2>/dev/null && out+=("$f")
  done
  (IFS=,; echo "${out[*]}")
}
A() { echo "$1=$(seeds "$2")"; }

$PY benchmarks/study_plots.py --out=$S/claim-bc-simaffinity.png --ylim=0.79,0.87 \
  --title="(b, c) SimAffinity with and without τ and γ, 50 epochs (mean of 3 seeds ± std)" \
  "$(A "τ 0.1, γ 0.01" aff-t0.1-g0.01)" "$(A "τ 0.1, γ 0" aff-t0.1-g0)" \
  "$(A "τ 1, γ 0.01" aff-t1-g0.01)" "$(A "τ 1, γ 0" aff-t1-g0)"
$PY benchmarks/study_plots.py --out=$S/claim-b-simclr.png \
  --title="(b) the symmetric loss added to SimCLR, 50 epochs (mean of 3 seeds ± std)" \
  "$(A "SimCLR (τ 0.5)" simclr)" "$(A "SimCLR + γ 0.01" simclr-g0.01)" "$(A "SimAffinity τ 0.1, γ 0.01" aff-t0.1-g0.01)"
$PY benchmarks/study_plots.py --out=$S/claim-c-simwhitening.png --ylim=0.76,0.87 \
  --title="(c) SimWhitening with and without τ and γ, 50 epochs (mean of 3 seeds ± std)" \
  "$(A "SimWhitening τ 0.2, γ 0.01" whiten-t0.2-g0.01)" "$(A "SimWhitening τ 0.2, γ 0" whiten-t0.2-g0)" \
  "$(A "SimWhitening τ 1, γ 0.01" whiten-t1-g0.01)" "$(A "SimWhitening τ 1, γ 0" whiten-t1-g0)" \
  "$(A "SimAffinity τ 0.1, γ 0.01" aff-t0.1-g0.01)" "$(A "SimAffinity τ 1, γ 0" aff-t1-g0)"
D=("$(A "SimTrace alone" simtrace)" "$(A "+ predictor" simtrace-pred)" "$(A "+ EMA target 0.99" simtrace-ema)"
   "$(A "+ stop-gradient of the covariance" simtrace-sgcov)" "$(A "+ predictor + EMA (seed 2 diverged)" simtrace-tricks)")
$PY benchmarks/study_plots.py --out=$S/claim-d-simtrace.png --ylim=0.78,0.875 \
  --title="(d) SimTrace alone and with each trick, kNN, 50 epochs (mean of 3 seeds ± std)" "${D[@]}"
$PY benchmarks/study_plots.py --out=$S/claim-d-rank.png --metric=effective_rank \
  --title="(d) effective rank of the backbone's features (of 512), 50 epochs" "${D[@]}"
$PY benchmarks/study_plots.py --out=$S/claim-d-std.png --metric=embedding_std \
  --title="(d) embedding std (ℓ2-normalised, 1/√256 = 0.0625 at most), 50 epochs" "${D[@]}"
