"""Shared test set-up: TensorFlow backend by default, quiet logs, a subprocess runner.

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

import pytest  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]


def run_python_snippet(code, backend="tensorflow", env=None, timeout=600):
    """Runs ``code`` in a fresh interpreter; returns the JSON object it prints on its last line."""
    full_env = dict(os.environ)
    full_env.update({"KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2",
                     "PYTHONPATH": str(REPO_ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")})
    full_env.update(env or {})
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO_ROOT,
                          env=full_env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"subprocess ({backend}) failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    lines = [l for l in proc.stdout.strip().splitlines() if l.strip()]
    return json.loads(lines[-1])


@pytest.fixture
def run_python():
    return run_python_snippet
