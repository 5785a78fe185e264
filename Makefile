# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cksum < requirements.txt | cut -d' ' -f1)
FMNIST := $(HOME)/.keras/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: demo test setup data bench clean docs

setup: $(STAMP)

# The pinned requirements.txt; then Keras Hub (the vit_* encoders) with --no-deps, because its wheel
# declares tensorflow-text, which would pull the full `tensorflow` next to tensorflow-cpu, while
# `import keras_hub` needs only regex and tokenizers (docs/stack.md); then this package, editable
# and with --no-deps (the pins are the environment; pyproject.toml only declares ranges), which adds
# the uniclr-train, uniclr-eval, uniclr-finetune, uniclr-export and uniclr-launch commands. setuptools >= 77 builds
# pyproject.toml's licence field, without a download.
$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip "setuptools>=77"
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps keras-hub==0.32.0 regex==2026.11.19 tokenizers==0.23.3
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

data: $(FMNIST)

$(FMNIST): | $(STAMP)
	PYTHON=$(PY) bash scripts/get_fashion_mnist.sh

# Pretrain on Fashion-MNIST on the CPU (quickstart config), print kNN vs the raw-pixel baseline,
# export the encoder as a SavedModel and reload it in a fresh process.
demo: $(STAMP) $(FMNIST)
	$(PY) -m uniclr_tf.train --flagfile=configs/quickstart.flags --method=simaffinity --encoder=small --temperature=0.1 --run_name=demo --overwrite
	$(PY) -m uniclr_tf.export --run_dir=runs/demo --out=runs/demo/export --overwrite
	$(PY) -m uniclr_tf.export --check=runs/demo/export --run_dir=runs/demo
	@$(PY) -c "import json; m = json.load(open('runs/demo/metrics.json')); \
	print(f\"\ndemo: kNN top-1 {m['knn_top1']:.4f} against {m['raw_pixel_knn_top1']:.4f} for raw pixels \
	({100 * (m['knn_top1'] - m['raw_pixel_knn_top1']):+.1f} points, the same {m['knn_memory_bank']:,}-image memory bank)\"); \
	print('pictures: runs/demo/views.png runs/demo/neighbours.png runs/demo/embedding.png runs/demo/curves.png'); \
	print('TensorBoard: tensorboard --logdir runs/demo/tb; SavedModel: runs/demo/export')"

# Three workers (pytest-xdist), each taking whole modules so a module's shared fixtures run once; the
# slowest modules go first (tests/conftest.py), which xdist would otherwise reorder by their number
# of tests. On 2 cores a third worker uses the time the others wait for their child processes: 1.96
# cores busy on average against 1.4-1.9 with two (the suite in 10.4 and 12.4 min against 12.1 and
# 12.9); four ran slower (13.5). TEST_WORKERS=0 runs the suite in this process.
TEST_WORKERS ?= 3
test: $(STAMP) $(FMNIST)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests

# The CPU figures of docs/results/speed.md (about 20 minutes) into runs/bench, and their report
# (runs/bench/speed.md); the GPU phases: bash benchmarks/speed.sh with no argument lists them.
bench: $(STAMP) $(FMNIST)
	OUT_DIR=runs/bench PYTHON=$(PY) bash benchmarks/speed.sh cpu

# The API reference generated from the docstrings (docs/api.md, mkdocs.yml) as a site in site/;
# --strict: a public name or a cross-reference that does not resolve fails the build.
docs: $(STAMP)
	$(PY) -m mkdocs build --strict

clean:
	rm -rf runs site .pytest_cache
