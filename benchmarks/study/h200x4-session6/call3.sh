# Session 6, device call 3 (right after call 2, on the same warm machine; carry .whl .data): every 200-epoch
# seed run not finished yet continues from its backup in /tmp/study, then its linear evaluation; GPUs 0-3.
# Run as: T=<seconds> bash <this file>
export PYTHONPATH=/tmp/site:$PWD KERAS_BACKEND=jax PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TF_CPP_MIN_LOG_LEVEL=2
ls /tmp/site >/dev/null 2>&1 || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && mkdir -p ~/.keras/datasets && cp -r .data/fashion-mnist ~/.keras/datasets/; }
ls /tmp/study; rm -rf /tmp/res; mkdir -p /tmp/res; (date -u; nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader) > /tmp/res/gpu.txt
LE="--augment_on=device --batch_size=512"; T=${T:-560}
python3 benchmarks/study.py --plan=benchmarks/study/methods200.plan --out=/tmp/res/methods --runs_dir=/tmp/study --gpus=0,1,2,3 --time_limit=$T --min_start=100 --only=byol-e200-s2,simclr-e200-s2,barlow_twins-e200-s1,vicreg-e200-s1,barlow_twins-e200-s2,vicreg-e200-s2 --linear_eval="$LE" > /tmp/res/methods.log 2>&1 &
P1=$!
# the SimAffinity seed, if call 2 left it unfinished, shares GPU 1 (memory allocated as needed)
XLA_PYTHON_CLIENT_PREALLOCATE=false python3 benchmarks/study.py --plan=benchmarks/study/recipe.plan --out=/tmp/res/recipe --runs_dir=/tmp/study --gpus=1 --time_limit=$T --min_start=100 --only=sgd-t0.2-e200-s2 --linear_eval="$LE" > /tmp/res/recipe.log 2>&1 &
P2=$!
wait $P1 $P2
for f in /tmp/res/*.log; do echo "== $f"; tail -12 $f; done; cd /tmp/res && tar czf $OUT/call3.tgz . ; ls -la $OUT
