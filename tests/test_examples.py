"""Every script of examples/ runs, at tiny sizes (``UNICLR_EXAMPLES_TINY=1``), as a user runs it.

One interpreter per backend runs its examples one after the other (one TensorFlow or JAX import
each), both at once: all six on TensorFlow, and on JAX the one written for both backends (b) and the
resumed fit (f). Each interpreter works in a folder of its own, where the examples write
``runs/examples/``.
"""

import json
import os
import subprocess
import sys
import textwrap

from tests import warm
from tests.conftest import REPO_ROOT

EXAMPLES = REPO_ROOT / "examples"
SCRIPTS = sorted(p.name for p in EXAMPLES.glob("[a-z]_*.py"))
ON_JAX = ["b_custom_train_step.py", "f_resume_from_backup.py"]

RUNNER = textwrap.dedent(r"""
    import json, os, runpy, sys, time
    seconds = {}
    for path in sys.argv[1:]:
        start = time.perf_counter()
        sys.argv = [path]
        print(f"=== {os.path.basename(path)}", flush=True)
        runpy.run_path(path, run_name="__main__")
        seconds[os.path.basename(path)] = round(time.perf_counter() - start, 1)
    print(json.dumps(seconds))
""")


def start(backend, scripts, folder):
    env = {**os.environ, "KERAS_BACKEND": backend, "UNICLR_EXAMPLES_TINY": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
           "PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return warm.popen([sys.executable, "-c", RUNNER, *(str(EXAMPLES / s) for s in scripts)], cwd=folder,
                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc, timeout=900):
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert proc.returncode == 0, f"{out[-4000:]}\n{err[-6000:]}"
    return out, json.loads(out.strip().splitlines()[-1])


def output_of(out, script):
    """The lines ``script`` printed."""
    return out.split(f"=== {script}\n", 1)[1].split("\n=== ", 1)[0]


def test_every_example_runs_and_says_what_it_shows(tmp_path):
    assert SCRIPTS == ["a_pretrain_folder.py", "b_custom_train_step.py", "c_ema_target_predictor.py",
                       "d_multicrop.py", "e_exported_encoder.py", "f_resume_from_backup.py"]
    for script in SCRIPTS:  # short: each shows one thing
        assert len((EXAMPLES / script).read_text().splitlines()) <= 60, script
    (tmp_path / "tf").mkdir()
    (tmp_path / "jax").mkdir()
    procs = [start("tensorflow", SCRIPTS, tmp_path / "tf"), start("jax", ON_JAX, tmp_path / "jax")]
    try:
        (tf_out, tf_seconds), (jax_out, jax_seconds) = (finish(p) for p in procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert sorted(tf_seconds) == SCRIPTS and sorted(jax_seconds) == ON_JAX
    assert "kNN top-1 of the pretrained backbone:" in output_of(tf_out, "a_pretrain_folder.py")
    for out, backend in ((tf_out, "tensorflow"), (jax_out, "jax")):
        assert "SimAffinity + symmetric loss:" in output_of(out, "b_custom_train_step.py")
        assert f"on {backend}" in output_of(out, "b_custom_train_step.py")
        resumed = output_of(out, "f_resume_from_backup.py")
        assert "interrupted during epoch 3" in resumed and "resumed after {'epoch': " in resumed
    assert "the target trails the online encoder" in output_of(tf_out, "c_ema_target_predictor.py")
    assert "view pairs compared:" in output_of(tf_out, "d_multicrop.py")
    exported = output_of(tf_out, "e_exported_encoder.py")
    assert "features of 40 px images: (8, 64)" in exported and "same features as the Keras encoder: True" in exported
