"""tests/warm.py: a child forked from a warm interpreter behaves as one started by ``python``."""

import json
import os
import signal
import subprocess
import sys

from tests import warm
from tests.conftest import REPO_ROOT

PROBE = r"""
import json, os, sys
print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0], "name": __name__,
                  "flag": os.environ.get("UNICLR_PROBE"), "xla": os.environ.get("XLA_FLAGS", "")}))
code = sys.argv[1]
if code == "raise":
    raise ValueError("the probe failed")
sys.exit(int(code))
"""


def both(argv, **kwargs):
    """``argv`` run warm, then cold (by :mod:`subprocess`)."""
    env = dict(os.environ, UNICLR_PROBE="x", XLA_FLAGS="--xla_dump_to=/dev/null", **kwargs.pop("env", {}))
    hot = warm.run(argv, env=env, capture_output=True, text=True, timeout=300, **kwargs)
    cold = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, **kwargs)
    return hot, cold


def test_exit_codes_argv_environment_and_tracebacks_are_those_of_python(tmp_path):
    proc = warm.popen([sys.executable, "-c", "pass"], cwd=REPO_ROOT)
    differ = warm.env_differences(warm._server("tensorflow"), dict(os.environ))
    assert isinstance(proc, warm.WarmProcess), f"started cold; environment differs in {differ}"
    assert proc.wait(60) == 0
    for code in ("0", "3", "raise"):
        hot, cold = both([sys.executable, "-c", PROBE, code], cwd=tmp_path)
        assert hot.returncode == cold.returncode == (1 if code == "raise" else int(code))
        assert json.loads(hot.stdout) == json.loads(cold.stdout)
        assert json.loads(hot.stdout)["argv"] == ["-c", code] and json.loads(hot.stdout)["cwd"] == str(tmp_path)
        if code == "raise":
            assert hot.stderr.splitlines()[-1] == cold.stderr.splitlines()[-1] == "ValueError: the probe failed"
            assert hot.stderr.count("File ") == cold.stderr.count("File ")   # no frame of the warm interpreter


def test_a_module_runs_as_main_with_its_path_in_argv():
    hot = warm.run([sys.executable, "-m", "uniclr_tf.train", "--method=nope"], cwd=REPO_ROOT, capture_output=True,
                   text=True, timeout=300)
    assert hot.returncode == 1 and "--method=nope" in hot.stderr and "Traceback" not in hot.stderr   # absl's
    probe = warm.run([sys.executable, "-m", "tests.warm_probe"], cwd=REPO_ROOT, capture_output=True, text=True)
    out = json.loads(probe.stdout)
    assert out["name"] == "__main__" and out["argv0"].endswith(os.path.join("tests", "warm_probe.py"))
    assert out["path0"] == str(REPO_ROOT)


def test_signals_reach_the_child_and_end_it_as_they_would_end_python():
    ready = "import signal, sys, time\nprint('ready', flush=True)\ntime.sleep(60)\n"
    for sig, expected in ((signal.SIGINT, -signal.SIGINT), (signal.SIGTERM, -signal.SIGTERM),
                          (signal.SIGKILL, -signal.SIGKILL)):
        proc = warm.popen([sys.executable, "-c", ready], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready" and proc.poll() is None
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == expected, (sig, proc.returncode, err)
        if sig == signal.SIGINT:
            assert err.strip().endswith("KeyboardInterrupt")


def test_what_must_start_cold_does():
    cold_env = dict(os.environ, KERAS_HOME="/nonexistent")   # read by Keras at import
    for argv, env in (([sys.executable, "-c", "pass"], cold_env), (["true"], None),
                      ([sys.executable, "-c", "import sys; print('tensorflow' in sys.modules)"], None)):
        proc = warm.popen(argv, env=env, stdout=subprocess.PIPE, text=True)
        assert not isinstance(proc, warm.WarmProcess), argv
        assert proc.communicate()[0].strip() in ("", "False")   # a fresh interpreter has not imported it
    # the JAX one has not started a backend: the child still chooses its devices
    two = warm.run([sys.executable, "-c", "import jax; print(len(jax.devices()))"], capture_output=True, text=True,
                   env=dict(os.environ, KERAS_BACKEND="jax", XLA_FLAGS="--xla_force_host_platform_device_count=2"))
    assert two.returncode == 0 and two.stdout.strip() == "2", two.stderr[-2000:]
