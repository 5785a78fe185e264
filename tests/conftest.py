"""Shared test set-up: TensorFlow backend by default, quiet logs, a subprocess runner, and what the
evaluation tests share: a tiny real pretraining run and a synthetic folder dataset.

Tests that need the JAX backend (or a fresh process, e.g. for export reloads) run a snippet in a
subprocess through the ``run_python`` fixture; Keras picks its backend once per process.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# XLA's CPU backend spends most of the compile of these small train steps in LLVM's optimisation
# passes, which make the machine code faster, not different (no fast-math on CPU), and in its
# MLIR fusion emitters, where the older emitters build the same fusions' code in a third of the time
# (a tiny train step: 2.0 s -> 0.65 s on JAX, 3.4 s -> 2.1 s on TF with XLA; LLVM's passes off alone
# took the JAX 2-process test from 78 s to 45 s on the 2-core machine). Both off for the tests, this
# process and every child.
XLA_TEST_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
if XLA_TEST_FLAGS not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {XLA_TEST_FLAGS}".strip()

# TensorFlow's oneDNN kernels (its default on x86) set up a primitive for each new shape and thread
# pool, which on these tiny models costs more than it computes: the suite took 20.4-21.3 min of CPU on
# the 2-core machine without them against 25.5 with them. Off for the tests (TensorFlow reads it at
# import), this process and every child; `make demo` and users' runs keep TensorFlow's default.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

# JAX's persistent compilation cache, in one folder for the whole test session (made by the first
# process of the session, whose environment the pytest workers and every child inherit; removed when it
# exits): the processes of a multi-process job, a resumed run and the snippets of a test compile the
# same programs, each compile costing seconds of CPU. The train CLI keeps no cache on JAX's CPU
# backend (``training.cli.enable_compilation_cache``); tests/test_compiles.py turns it off to see
# every compile.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile
    _cache_dir, _cache_owner = tempfile.mkdtemp(prefix="uniclr-tests-xla-cache-"), os.getpid()
    atexit.register(lambda: os.getpid() == _cache_owner and shutil.rmtree(_cache_dir, ignore_errors=True))
    os.environ.update(JAX_COMPILATION_CACHE_DIR=_cache_dir, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.2")


def xla_flags(*flags):
    """``XLA_FLAGS`` for a child process: the tests' own (above) and ``flags``."""
    return " ".join([os.environ["XLA_FLAGS"], *flags])


import pytest  # noqa: E402

from tests import warm  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]

# The modules whose tests take longest (process start-up and tracing in child processes), run first:
# `make test` hands whole modules to 3 workers (pytest-xdist, --dist loadfile), and a long module
# handed out last would run alone at the end.
SLOW_MODULES = ("test_distribute.py", "test_methods.py", "test_resilience.py", "test_bench.py",
                "test_safety.py", "test_streaming.py", "test_collapse.py", "test_export.py", "test_hostile.py",
                "test_fuzz.py", "test_examples.py", "test_api.py")


@pytest.fixture(scope="session", autouse=True)
def warm_interpreters():
    """The warm interpreters (tests/warm.py) of both backends, started at once in the background: the
    first test to start a child need not wait ~10 s for one."""
    warm.warm_up("tensorflow", "jax")


@pytest.fixture(autouse=True)
def environment_restored():
    """Each test leaves ``os.environ`` as it found it, whatever it imported: importing
    ``jax.experimental.pallas`` sets ``MOSAIC_GPU_CUDA_ROOT``, and a variable left behind makes every later
    child of that pytest worker differ from its warm interpreter's environment, so start cold."""
    saved = dict(os.environ)
    yield
    if dict(os.environ) != saved:
        os.environ.clear()
        os.environ.update(saved)


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(SLOW_MODULES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_MODULES)))  # stable: same order within


class PythonJob:
    """``code`` running in a fresh interpreter, started now; :meth:`result` waits for it and returns
    the JSON object it prints on its last line. Tests start several at once so that their start-up,
    tracing and compiling (one core each) overlap on the 2-core machine."""

    def __init__(self, code, backend="tensorflow", env=None, timeout=600):
        full_env = dict(os.environ)
        full_env.update({"KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2",
                         "PYTHONPATH": str(REPO_ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")})
        full_env.update(env or {})
        self.backend, self.timeout = backend, timeout
        self.proc = warm.popen([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO_ROOT, env=full_env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self._out = None

    def result(self):
        if self._out is None:
            try:
                self._out = self.proc.communicate(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise
        out, err = self._out
        if self.proc.returncode != 0:
            raise AssertionError(f"subprocess ({self.backend}) failed:\n{out[-3000:]}\n{err[-5000:]}")
        lines = [l for l in out.strip().splitlines() if l.strip()]
        return json.loads(lines[-1])

    @property
    def stdout(self):
        self.result()
        return self._out[0]

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self._out = self.proc.communicate()


#: Prepended to a subprocess's code: TensorFlow (and what needs it) cannot be imported, as on the
#: JAX-only GPU machines.
NO_TENSORFLOW = r"""
import importlib.abc, sys

class NoTensorFlow(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tensorflow", "tensorflow_datasets", "tensorboard"):
            raise ModuleNotFoundError("No module named " + name)

sys.meta_path.insert(0, NoTensorFlow())
"""


def file_tree(root):
    """``{relative path: bytes}`` of every file under ``root``."""
    out = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = f.read()
    return out


def run_python_snippet(code, backend="tensorflow", env=None, timeout=600):
    """Runs ``code`` in a fresh interpreter; returns the JSON object it prints on its last line."""
    return PythonJob(code, backend, env, timeout).result()


def run_python_snippets(*jobs):
    """Runs several ``(code, backend[, env])`` at once; returns their JSON objects in order. If one
    fails, the others are killed."""
    started = [PythonJob(*job) for job in jobs]
    try:
        return [job.result() for job in started]
    finally:
        for job in started:
            job.kill()


# A JAX child's log of what XLA compiles: ``compiles`` gets ``[phase[0], name]`` for each compilation, in
# order (``jit(train_step)`` -> ``train_step``); the child sets ``phase[0]`` as it goes. The persistent
# compilation cache is off: the tests' shared cache would hide compiles.
COMPILE_LOG = r"""
import logging as _logging, re as _re
import jax as _jax
_jax.config.update("jax_log_compiles", True)
_jax.config.update("jax_enable_compilation_cache", False)
phase, compiles = ["build"], []

class _Record(_logging.Handler):
    def emit(self, record):
        found = _re.search(r"Finished XLA compilation of (\S+) in", record.getMessage())
        if found:
            compiles.append([phase[0], _re.sub(r"^\w+\((.*)\)$", r"\1", found.group(1))])

_logging.getLogger("jax").addHandler(_Record(level=_logging.DEBUG))
"""


# A child writes a file that another one, started at the same time, reads: written aside, then
# renamed (``publish``), and awaited (``wait_for``).
HANDOFF = r"""
import os as _os, time as _time

def publish(save, path):
    tmp = path.replace(".weights.h5", ".partial.weights.h5")
    save(tmp)
    _os.replace(tmp, path)

def wait_for(path, timeout=600):
    deadline = _time.monotonic() + timeout
    while not _os.path.exists(path):
        if _time.monotonic() > deadline:
            raise TimeoutError(path)
        _time.sleep(0.05)
"""


def run_cli_forks(module, cases, env=None, timeout=600):
    """``python -m module *args`` for each ``args`` of ``cases``, one after the other, each a child of the
    warm interpreter (tests/warm.py): a list of ``(returncode, stdout, stderr)`` namespaces."""
    import types
    full_env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "3",
                "PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {})}
    results = []
    for args in cases:
        proc = warm.run([sys.executable, "-m", module, *args], cwd=REPO_ROOT, env=full_env, capture_output=True,
                        text=True, timeout=timeout)
        results.append(types.SimpleNamespace(returncode=proc.returncode, stdout=proc.stdout, stderr=proc.stderr))
    return results


@pytest.fixture
def run_python():
    return run_python_snippet


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """One real ``uniclr_tf.train`` run (SimCLR, 2 steps of a width-8 tiny encoder, 512 Fashion-MNIST
    images a split), shared by the evaluation tests (linear_eval, finetune), which only add files.

    The train entry point's own flags -> config -> ``run`` path, in-process (a subprocess would
    spend more time starting TensorFlow than training).
    """
    from absl import flags
    from uniclr_tf.training import cli as train
    parent = tmp_path_factory.mktemp("runs")
    fv = flags.FlagValues()
    train.define_flags(fv)
    fv(["train", f"--flagfile={REPO_ROOT / 'configs' / 'quickstart.flags'}", "--method=simclr", "--encoder=tiny",
        "--encoder_width=8", "--projector_dims=64,32", "--batch_size=64", "--max_examples=512",
        "--knn_max_train=512", "--epochs=1", "--steps_per_epoch=2", "--knn_every=0", "--nopictures",
        f"--run_dir={parent}", "--run_name=run"])
    path, _ = train.run(train.config_from_flags(fv))
    return Path(path)


def write_stripes_folder(root, per_class_train, per_class_test, size=32, channels=1, seed=0):
    """A ``folder:`` dataset of PNGs in ``root/{train,test}/classK/``: 4 easy classes, stripes
    (horizontal for classes 0 and 2, vertical for 1 and 3) on a bright (0, 1) or dark (2, 3)
    background, with noise; the orientation survives crops and horizontal flips. Returns ``root``."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    stripes = ((np.arange(size) // 2) % 2).astype(np.float32) - 0.5
    for split, count in (("train", per_class_train), ("test", per_class_test)):
        for c in range(4):
            folder = Path(root, split, f"class{c}")
            folder.mkdir(parents=True, exist_ok=True)
            pattern = stripes[:, None] if c % 2 == 0 else stripes[None, :]
            for i in range(count):
                image = rng.normal(170.0 if c < 2 else 70.0, 20.0, (size, size)) + 100.0 * pattern
                image = np.clip(image, 0, 255).astype(np.uint8)
                if channels == 3:
                    image = np.repeat(image[..., None], 3, axis=-1)
                Image.fromarray(image).save(folder / f"{i:04d}.png")
    return Path(root)


@pytest.fixture(scope="session")
def stripes_folder(tmp_path_factory):
    """:func:`write_stripes_folder`: 32x32 grey PNGs (the tiny run's encoder takes 28x28x1), 100
    training and 50 test images a class."""
    return write_stripes_folder(tmp_path_factory.mktemp("stripes"), 100, 50)
