"""Defects from the user review that belong to no other test module: an unreachable ``--tpu`` must
fail fast with one line, the ``tfds:`` loader's undeclared ``importlib_resources``, and the Python
version README states.
"""

import importlib.metadata
import os
import re
import time

import pytest

from tests.conftest import REPO_ROOT
from uniclr_tf.training import distribute

# An address that refuses or never answers (port 1 on the loopback), and a TPU name that does not
# exist (resolved through the GCE metadata server, absent here).
TPU_PROBE = """
import json, time
from uniclr_tf.training import distribute
out = {}
for tpu in ("grpc://127.0.0.1:1", "no-such-tpu-uniclr-test"):
    start = time.monotonic()
    try:
        distribute.make_strategy("tpu", tpu)
        out[tpu] = {"message": None}
    except ValueError as e:
        out[tpu] = {"message": str(e)}
    out[tpu]["seconds"] = time.monotonic() - start
print(json.dumps(out))
"""


def test_unreachable_tpu_fails_fast_with_one_line(run_python):
    """``--strategy=tpu --tpu=<unreachable>`` used to block with no message; now the connection runs
    in a thread for at most ``UNICLR_TPU_TIMEOUT_S`` and fails with a ``--tpu=`` line (the process
    exits normally although the abandoned connection attempt is still blocked)."""
    start = time.monotonic()
    out = run_python(TPU_PROBE, env={distribute.TPU_TIMEOUT_ENV: "3"}, timeout=120)
    elapsed = time.monotonic() - start
    for tpu, result in out.items():
        message = result["message"]
        assert message is not None, tpu
        assert message.startswith(f"--tpu={tpu}: could not connect to the TPU"), message
        assert "\n" not in message and "gcloud" in message and "zone" in message, message
        assert result["seconds"] < 30, (tpu, result)
    # The loopback address does not answer: the timeout is what stops it, and says so.
    hung = out["grpc://127.0.0.1:1"]["message"]
    assert "within 3 s" in hung and distribute.TPU_TIMEOUT_ENV in hung, hung
    assert elapsed < 90, elapsed  # TF import + two attempts + interpreter exit


def test_tpu_timeout_setting(monkeypatch):
    monkeypatch.delenv(distribute.TPU_TIMEOUT_ENV, raising=False)
    assert distribute.tpu_timeout_s() == distribute.DEFAULT_TPU_TIMEOUT_S == 60
    monkeypatch.setenv(distribute.TPU_TIMEOUT_ENV, "2.5")
    assert distribute.tpu_timeout_s() == 2.5
    assert distribute.tpu_timeout_s(7) == 7.0  # an explicit value wins
    for bad in ("soon", "0", "-1"):
        monkeypatch.setenv(distribute.TPU_TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match=distribute.TPU_TIMEOUT_ENV):
            distribute.tpu_timeout_s()


def test_tfds_can_import_importlib_resources():
    """tensorflow-datasets 4.9.10 imports ``importlib_resources`` (lazily, in
    ``core/dataset_builder.py``) without depending on it: ``tfds:cifar10`` failed on a fresh install
    with ``No module named 'importlib_resources'``. requirements.txt now installs it."""
    import importlib_resources
    from tensorflow_datasets.core import dataset_builder

    # Attribute access resolves tfds' lazy import, the step that failed.
    assert dataset_builder.importlib_resources.abc.Traversable is importlib_resources.abc.Traversable
    with open(REPO_ROOT / "requirements.txt") as f:
        names = [re.split(r"[<>=!~\[; ]", line.strip(), maxsplit=1)[0].lower().replace("-", "_")
                 for line in f if line.strip() and not line.lstrip().startswith("#")]
    assert "importlib_resources" in names


def test_readme_python_version_matches_the_pinned_jax():
    """README's minimum Python is the one the installed (pinned) JAX requires (>= 3.11)."""
    requires = importlib.metadata.metadata("jax")["Requires-Python"]
    minimum = re.search(r">=\s*(\d+\.\d+)", requires).group(1)
    with open(os.path.join(REPO_ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    stated = re.findall(r"Python ≥ (\d+\.\d+)", readme)
    assert stated and set(stated) == {minimum}, (stated, requires)
    assert minimum == "3.11"
