# Session 6, device call 2 (nvidia-h100-x4 asked; carry .whl .data): GPU 0 times the epoch boundary (the backup
# fetched in one piece, then in pieces) and the CLI against the bench (100 epochs, kNN every 10, cache warm
# from the two runs before); GPUs 1-3 (and GPU 0 after) train 200-epoch seeds. Run as: bash <this file>
export PYTHONPATH=/tmp/site:$PWD KERAS_BACKEND=jax PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TF_CPP_MIN_LOG_LEVEL=2
ls /tmp/site >/dev/null 2>&1 || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && mkdir -p ~/.keras/datasets && cp -r .data/fashion-mnist ~/.keras/datasets/; }
ls /tmp/study; rm -rf /tmp/res; mkdir -p /tmp/res/gap /tmp/res/speed; (date -u; nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader) > /tmp/res/gpu.txt
LE="--augment_on=device --batch_size=512"; T=560
python3 benchmarks/study.py --plan=benchmarks/study/methods200.plan --out=/tmp/res/methods --runs_dir=/tmp/study --gpus=2,3 --time_limit=$T --min_start=100 --only=byol-e200-s2,simclr-e200-s2,barlow_twins-e200-s1,vicreg-e200-s1 --linear_eval="$LE" > /tmp/res/methods23.log 2>&1 &
P1=$!
( python3 benchmarks/study.py --plan=benchmarks/study/recipe.plan --out=/tmp/res/recipe --runs_dir=/tmp/study --gpus=1 --time_limit=$T --min_start=100 --only=sgd-t0.2-e200-s2 --linear_eval="$LE" > /tmp/res/recipe1.log 2>&1; python3 benchmarks/study.py --plan=benchmarks/study/methods200.plan --out=/tmp/res/methods --runs_dir=/tmp/study --gpus=1 --time_limit=$((T-SECONDS)) --min_start=30 --only=barlow_twins-e200-s2 --linear_eval="$LE" > /tmp/res/methods1.log 2>&1 ) &
P2=$!
( export CUDA_VISIBLE_DEVICES=0; G="--flagfile=configs/paper/fashion_mnist_simaffinity.flags --augment_on=device --epochs=100 --stop_after_steps=2925 --knn_every=0 --run_dir=/tmp/g --overwrite --verbose=2 --nopictures --compilation_cache_dir=/tmp/w/xla-cache"
  for v in one_piece default; do n=$((n+1)); timeout 150 python3 -m benchmarks.epoch_gap --variant=$v --out=/tmp/res/gap/$n-$v.json -- $G --run_name=$v > /tmp/res/gap/$n-$v.log 2>&1; tail -19 /tmp/res/gap/$n-$v.log; done
  timeout 330 python3 -m benchmarks.cli_vs_bench --flagfile=configs/paper/fashion_mnist_simaffinity.flags --epochs=100 --knn_every=10 --work=/tmp/w --out=/tmp/res/speed/h200-call-b.json > /tmp/res/speed/cli-vs-bench.log 2>&1; tail -25 /tmp/res/speed/cli-vs-bench.log; cp /tmp/w/cli/history.json /tmp/res/speed/h200-call-b-history.json
  python3 benchmarks/study.py --plan=benchmarks/study/methods200.plan --out=/tmp/res/methods --runs_dir=/tmp/study --gpus=0 --time_limit=$((T-SECONDS)) --min_start=30 --only=vicreg-e200-s2 --linear_eval="$LE" > /tmp/res/methods0.log 2>&1 ) &
P3=$!
wait $P1 $P2 $P3
for f in /tmp/res/*.log; do echo "== $f"; tail -4 $f; done; cd /tmp/res && tar czf $OUT/callB.tgz . ; ls -la $OUT
