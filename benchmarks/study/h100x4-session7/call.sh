#!/usr/bin/env bash
# Session 7's device calls (nvidia-h100-x4 asked; carry .whl .data): every call runs this same file. Four
# chains, one per GPU; a chain runs its PLAN:RUN items one after the other through benchmarks/study.py,
# each followed by its linear evaluation. study.py is resumable: a run that a call stops at its time limit
# continues from its backup in /tmp/study in the next call (on the same, still warm machine), and a finished
# one exits at once. Results and logs gather in /tmp/res across calls; each call returns all of it.
#   T=<seconds for this call's runs> bash benchmarks/study/session7/call.sh
set -u
export PYTHONPATH=/tmp/site:$PWD KERAS_BACKEND=jax PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TF_CPP_MIN_LOG_LEVEL=2
ls /tmp/site >/dev/null 2>&1 || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --upgrade --target /tmp/site .whl/*.whl && mkdir -p ~/.keras/datasets && cp -r .data/fashion-mnist ~/.keras/datasets/; }
T=${T:-555}; deadline=$(( $(date +%s) + T )); call=$(ls /tmp/res/gpu-call*.txt 2>/dev/null | wc -l); call=$((call + 1))
mkdir -p /tmp/res; ls /tmp/study 2>/dev/null | tr '\n' ' '; echo
(date -u; nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader) > /tmp/res/gpu-call$call.txt
LE="--augment_on=device --batch_size=512"
chain() {  # GPU PLAN:RUN ...
  local gpu=$1; shift
  for item in "$@"; do
    local plan=${item%%:*} name=${item#*:} left=$(( deadline - $(date +%s) ))
    if [ $left -le 100 ]; then echo "call $call, gpu $gpu: $name not started ($left s left)"; continue; fi
    python3 benchmarks/study.py --plan=benchmarks/study/$plan.plan --out=/tmp/res/$plan --runs_dir=/tmp/study \
      --gpus=$gpu --time_limit=$left --min_start=100 --only=$name --linear_eval="$LE"
  done >> /tmp/res/chain$gpu.log 2>&1
}
chain 0 recipe:simwhitening-sgd-t0.2-e200-s1 methods200:co2-e200-s1 &
chain 1 recipe:simwhitening-sgd-t0.2-e200-s2 methods200:simaffinity-ema-pred-e200 methods200:co2-e200-s2 &
chain 2 recipe:simtrace-sgd-e200-s1 methods200:moco_v2-e200-s1 methods200:moco_v2-e200-s2 &
chain 3 recipe:simtrace-sgd-e200-s2 methods200:moco_v3-e200-s1 methods200:moco_v3-e200-s2 &
wait
for f in /tmp/res/chain*.log; do echo "== $f"; grep -v "^ *$" "$f" | grep "exit\|not started\|time limit" | tail -6; done
cd /tmp/res && tar czf "$OUT/res.tgz" . && ls -la "$OUT"
