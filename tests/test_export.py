"""Export: SavedModel reloaded in a fresh process, saved_model_cli, the .keras backbone, strict
inputs, the CLI (export, --check, bad run folders, JAX refusal), the export folder (a non-empty
``--out`` refused, ``--overwrite``, written aside and renamed: a killed export changes nothing), the
REST client against the local TF Serving stand-in, and the client decoding image files as training.

One tiny run folder (tiny encoder, 2-layer projector, BN with non-trivial moving statistics) is
exported once per module (``version=1``, TF Serving's layout); subprocess tests reuse it.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import types

import keras
import numpy as np
import pytest

from tests import warm
from tests.conftest import REPO_ROOT, file_tree
from uniclr_tf.nets import encoders
from uniclr_tf.serving import export
from uniclr_tf.nets import heads
from uniclr_tf.augment import EvalPreprocess
from uniclr_tf.config.train_config import TrainConfig

if keras.backend.backend() != "tensorflow":  # the export itself needs TF; JAX is covered by a subprocess
    pytest.skip("export tests run on the TensorFlow backend", allow_module_level=True)

IMAGE_SHAPE = (28, 28, 1)
MEAN, STD = (0.286,), (0.353,)
TOL = 1e-5


def _load_module(name):
    spec = importlib.util.spec_from_file_location(f"uniclr_export_{name}", REPO_ROOT / "export" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_run(run_dir, seed=0, encoder_name="tiny", width=4, projector_dims=(32, 8)):
    """A run folder as ``uniclr_tf.training.cli.run`` leaves it (the files export reads)."""
    keras.utils.set_random_seed(seed)
    os.makedirs(run_dir, exist_ok=True)
    encoder = encoders.build_encoder(encoder_name, IMAGE_SHAPE, width=width)
    projector = heads.projector(encoder.output_shape[-1], projector_dims)
    rng = np.random.default_rng(seed)
    # Moving statistics far from (0, 1), and affine parameters, so inference-mode BN matters.
    for model in (encoder, projector):
        for layer in model.layers:
            if isinstance(layer, keras.layers.BatchNormalization):
                n = layer.moving_mean.shape[0]
                layer.moving_mean.assign(rng.normal(0.0, 0.5, n).astype("float32"))
                layer.moving_variance.assign(rng.uniform(0.3, 3.0, n).astype("float32"))
                if layer.scale:
                    layer.gamma.assign(rng.uniform(0.5, 1.5, n).astype("float32"))
                if layer.center:
                    layer.beta.assign(rng.normal(0.0, 0.2, n).astype("float32"))
    encoder.save(os.path.join(run_dir, "encoder.keras"))
    projector.save(os.path.join(run_dir, "projector.keras"))
    with open(os.path.join(run_dir, "dataset.json"), "w") as f:
        json.dump({"dataset": "fashion_mnist", "image_shape": list(IMAGE_SHAPE), "num_classes": 10,
                   "mean": list(MEAN), "std": list(STD), "num_train": 60000}, f, indent=2)
    with open(os.path.join(run_dir, "config.json"), "w") as f:
        f.write(TrainConfig.make(encoder=encoder_name, encoder_width=width, projector_dims=projector_dims).to_json())
    return encoder, projector


def reference(encoder, projector, images):
    """The in-memory Keras path: EvalPreprocess + encoder + projector, inference mode."""
    x = EvalPreprocess(IMAGE_SHAPE[:2], mean=MEAN, std=STD)(images)
    features = encoder(x, training=False)
    return {"features": keras.ops.convert_to_numpy(features),
            "embedding": keras.ops.convert_to_numpy(projector(features, training=False))}


def max_diff(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


class Job:
    """A subprocess started now and awaited when a test needs it (each costs a TF import, ~5 s of
    CPU: the module starts them together so that they overlap)."""

    def __init__(self, args, backend="tensorflow", cold=False):
        env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2",
               "PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               **({"UNICLR_TESTS_COLD": "1"} if cold else {})}
        self.proc = warm.popen(args, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
        self._result = None

    def result(self, timeout=300):
        if self._result is None:
            out, err = self.proc.communicate(timeout=timeout)
            self._result = types.SimpleNamespace(returncode=self.proc.returncode, stdout=out, stderr=err)
        return self._result

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def export_cli(*args):
    return [sys.executable, "-m", "uniclr_tf.export", *args]


FRESH_PROCESS = """
import json, sys
import numpy as np
import tensorflow as tf
root, saved_model = sys.argv[1], sys.argv[2]
serve = tf.saved_model.load(saved_model).signatures["serving_default"]
images, other = np.load(root + "/images.npy"), np.load(root + "/other.npy")
out = {}
for name, x in (("batch", images), ("alone", images[2:3]), ("reversed", images[::-1]), ("other", other)):
    y = serve(images=tf.constant(x))
    out[name] = {k: v.numpy().tolist() for k, v in y.items()}
spec = serve.structured_input_signature[1]["images"]
out["spec"] = {"dtype": spec.dtype.name, "shape": list(spec.shape), "outputs": sorted(serve.structured_outputs)}
errors = {}
for name, x in (("rank3", tf.zeros([28, 28, 1], tf.uint8)), ("channels3", tf.zeros([2, 28, 28, 3], tf.uint8)),
                ("float32", tf.zeros([2, 28, 28, 1], tf.float32))):
    try:
        serve(images=x)
        errors[name] = None
    except Exception as e:
        errors[name] = getattr(e, "message", str(e))
out["errors"] = errors
print(json.dumps(out))
"""

# Under KERAS_BACKEND=jax: export refuses with a clear message; --check's comparison still works
# (the SavedModel against the JAX-backend Keras models: a cross-backend parity check).
JAX_PROCESS = """
import json, sys
import keras
from uniclr_tf.serving import export
run_dir, out_dir, jax_out = sys.argv[1:]
try:
    export.export_run(run_dir, jax_out)
    message = None
except RuntimeError as e:
    message = str(e)
result = export.check_export(out_dir, run_dir, num_images=3)
print(json.dumps({"backend": keras.backend.backend(), "message": message, "ok": result["ok"],
                  "diffs": {k: diff for k, (diff, _) in result["checks"].items()}}))
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    run_dir, out_dir = str(root / "run"), str(root / "export")
    encoder, projector = make_run(run_dir)
    other_run = str(root / "other_run")  # same architecture, other weights: the check must fail
    make_run(other_run, seed=1)
    meta = export.export_run(run_dir, out_dir, version=1)
    rng = np.random.default_rng(42)
    images = rng.integers(0, 256, (5,) + IMAGE_SHAPE, dtype=np.uint8)
    other = rng.integers(0, 256, (3, 33, 21, 1), dtype=np.uint8)  # not the training size, not square
    np.save(root / "images.npy", images)
    np.save(root / "other.npy", other)
    saved_model = os.path.join(out_dir, "1")
    saved_model_cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    jobs = {
        # cold: a process that has imported neither the package nor Keras, as a server has not
        "fresh": Job([sys.executable, "-c", FRESH_PROCESS, str(root), saved_model], cold=True),
        "saved_model_cli": Job([saved_model_cli, "run", "--dir", saved_model, "--tag_set", "serve",
                                "--signature_def", "serving_default", "--inputs", f"images={root / 'images.npy'}",
                                "--outdir", str(root / "saved_model_cli")]),
        "check": Job(export_cli(f"--check={out_dir}", f"--run_dir={run_dir}", "--num_check_images=4")),
        "jax": Job([sys.executable, "-c", JAX_PROCESS, run_dir, out_dir, str(root / "jax_out")], backend="jax"),
    }
    yield types.SimpleNamespace(root=root, run_dir=run_dir, other_run=other_run, out_dir=out_dir,
                                saved_model=saved_model, meta=meta, encoder=encoder, projector=projector,
                                images=images, other=other, jobs=jobs, ref=reference(encoder, projector, images),
                                ref_other=reference(encoder, projector, other))
    for job in jobs.values():
        job.kill()


@pytest.fixture(scope="module")
def fresh(exported):
    """Everything a fresh process sees with ``tf.saved_model.load`` (outputs and error messages)."""
    result = exported.jobs["fresh"].result()
    assert result.returncode == 0, result.stderr[-5000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_export_writes_savedmodel_backbone_and_metadata(exported):
    out = exported.out_dir
    assert os.path.isfile(os.path.join(out, "1", "saved_model.pb"))
    assert os.path.isfile(os.path.join(out, "backbone.keras"))
    with open(os.path.join(out, "export.json")) as f:
        meta = json.load(f)
    assert meta == json.loads(json.dumps(exported.meta))
    assert meta["signature"] == "serving_default" and meta["saved_model_dir"] == "1" and meta["version"] == 1
    assert meta["inputs"]["images"]["dtype"] == "uint8"
    assert meta["inputs"]["images"]["shape"] == [None, None, None, 1]
    assert meta["outputs"]["features"]["shape"] == [None, 16] and meta["outputs"]["embedding"]["shape"] == [None, 8]
    assert meta["image_size"] == [28, 28] and meta["channels"] == 1
    assert meta["mean"] == list(MEAN) and meta["std"] == list(STD)
    assert meta["source_run"] == os.path.abspath(exported.run_dir) and meta["encoder"] == "tiny"
    assert export.find_saved_model(out) == os.path.join(out, "1")


def test_find_saved_model_layouts(tmp_path):
    plain, versioned = tmp_path / "plain", tmp_path / "versioned"
    plain.mkdir()
    (plain / "saved_model.pb").write_bytes(b"")
    for v in ("1", "2", "10"):
        (versioned / v).mkdir(parents=True)
        (versioned / v / "saved_model.pb").write_bytes(b"")
    (versioned / "11").mkdir()  # no SavedModel inside: ignored
    assert export.find_saved_model(str(plain)) == str(plain)
    assert export.find_saved_model(str(versioned)) == str(versioned / "10")
    (versioned / "export.json").write_text(json.dumps({"saved_model_dir": "2"}))  # the latest export wins
    assert export.find_saved_model(str(versioned)) == str(versioned / "2")
    with pytest.raises(FileNotFoundError, match="no SavedModel"):
        export.find_saved_model(str(tmp_path / "missing"))


def test_check_images_names_expected_and_received():
    good = np.zeros((2, 9, 7, 3), np.uint8)
    assert export.check_images(good, 3) is not None
    with pytest.raises(ValueError, match=r"dtype uint8 .*received dtype float32"):
        export.check_images(good.astype(np.float32), 3)
    with pytest.raises(ValueError, match=r"received dtype int64"):
        export.check_images([[[[1, 2, 3]]]], 3)
    with pytest.raises(ValueError, match=r"rank 4 \[batch, height, width, 3\]; received rank 3 .*images\[None\]"):
        export.check_images(good[0], 3)
    with pytest.raises(ValueError, match=r"1 channel\(s\) .*received 3"):
        export.check_images(good, 1)


def test_backbone_keras_reloads_and_matches(exported):
    backbone = keras.saving.load_model(os.path.join(exported.out_dir, "backbone.keras"), compile=False)
    x = EvalPreprocess(IMAGE_SHAPE[:2], mean=MEAN, std=STD)(exported.images)
    assert max_diff(backbone(x, training=False), exported.encoder(x, training=False)) == 0.0
    assert backbone.input_shape == (None, None, None, 1)


def _cli(args):
    return Job(export_cli(*args)).result()


def test_check_export_detects_a_different_model(exported):
    result = export.check_export(exported.out_dir, exported.other_run, num_images=2)
    assert result["max_abs_diff"] > 1e-2 and not result["ok"]


def test_check_export_passes_a_resnet18_with_trained_batch_norm(tmp_path):
    """With BN statistics and affine terms away from their initial values (as after training), the
    SavedModel's graph (optimised by Grappler) and eager Keras round a ResNet-18 differently in
    float32: ~1e-4 on features of size ~100 here, 1e-5 on a real Fashion-MNIST run (identity BN:
    bit-exact). An absolute 1e-5 limit refused such an export; the limit is relative."""
    run_dir, out_dir = str(tmp_path / "run"), str(tmp_path / "export")
    make_run(run_dir, encoder_name="resnet18", width=0, projector_dims=(256, 64))
    export.export_run(run_dir, out_dir)
    result = export.check_export(out_dir, run_dir, num_images=4)
    assert result["ok"], result["checks"]
    assert result["checks"]["backbone.keras/features"][0] == 0.0  # same ops, same way: exact


def test_cli_missing_run_files_one_line_error(exported, tmp_path):
    incomplete = tmp_path / "incomplete"
    incomplete.mkdir()
    for name in ("encoder.keras", "dataset.json"):
        shutil.copy(os.path.join(exported.run_dir, name), incomplete / name)
    proc = _cli([f"--run_dir={incomplete}", f"--out={tmp_path / 'out'}"])
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "projector.keras" in lines[0] and lines[0].startswith("error:"), proc.stderr
    assert not (tmp_path / "out").exists()
    missing = str(tmp_path / "nope")
    proc = _cli([f"--run_dir={missing}", f"--out={tmp_path / 'out'}"])
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: run folder {missing!r} does not exist"), proc.stderr


@pytest.mark.parametrize("args, line", [
    (["--run_dir=RUN", "--out=OUT", "--version=-1"], "error: --version: expected an integer >= 0"),
    (["--run_dir=RUN", "--check=OUT", "--num_check_images=0"], "error: --num_check_images: expected an integer >= 1"),
    (["--out=OUT"], "error: --run_dir: expected the run folder written by uniclr_tf.train; not given"),
    (["--run_dir=RUN"], "error: --out: expected the export folder to write"),
    (["--run_dir=RUN", "--out=OUT", "--check=OUT"], "error: --check: expected either --out=DIR (export) or --check"),
])
def test_cli_bad_or_missing_flag_one_error_line(tmp_path, args, line):
    """A bad value (absl's ``lower_bound`` once printed its "FATAL Flags parsing error") or a missing
    required flag: one ``error: --flag: ...`` line naming the flag, exit code 1, no traceback,
    nothing written (``ExportConfig``)."""
    args = [a.replace("RUN", str(tmp_path / "run")).replace("OUT", str(tmp_path / "out")) for a in args]
    proc = warm.run(export_cli(*args), cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                    env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(line), proc.stderr
    assert os.listdir(tmp_path) == []


def test_the_makefile_export_commands_parse():
    """``make demo``'s export and ``--check`` command lines, exactly as the Makefile has them, give
    the ``ExportConfig`` they mean (the flags parsed as ``python -m uniclr_tf.export`` parses them)."""
    import shlex

    from absl import flags

    from uniclr_tf.config import flagutil
    lines = [line.split("-m uniclr_tf.export", 1)[1] for line in (REPO_ROOT / "Makefile").read_text().splitlines()
             if "-m uniclr_tf.export " in line]
    configs = []
    for line in lines:
        fv = flags.FlagValues()
        export.define_flags(fv)
        fv(["uniclr_tf.export", *shlex.split(line)])
        configs.append(flagutil.config_from_flags(export.ExportConfig, fv))
    assert configs == [export.ExportConfig(run_dir="runs/demo", out="runs/demo/export", overwrite=True),
                       export.ExportConfig(run_dir="runs/demo", check="runs/demo/export")], configs


def test_rest_client_against_standin_server(exported, tmp_path):
    client, standin = _load_module("client"), _load_module("standin_server")
    with standin.StandinServer(exported.out_dir, "uniclr", port=0) as server:
        assert server.servable.version == 1
        assert client.channels_from_metadata(client.rest_metadata(server.url, "uniclr")) == 1
        for columnar in (False, True):
            got = client.rest_predict(exported.images, server.url, "uniclr", columnar=columnar)
            for key in ("features", "embedding"):
                assert got[key].dtype == np.float32
                assert max_diff(got[key], exported.ref[key]) <= TOL, (columnar, key)
        got = client.rest_predict(exported.other, server.url, "uniclr", version=1, channels=1)
        assert max_diff(got["features"], exported.ref_other["features"]) <= TOL

        # Checked on the client before sending...
        with pytest.raises(ValueError, match="channel"):
            client.rest_predict(np.zeros((1, 28, 28, 3), np.uint8), server.url, "uniclr")
        # ... and by the server (TF Serving's error format) when sent anyway.
        url = f"{server.url}/v1/models/uniclr:predict"
        for body, fragment in (({"instances": [[[[1.5]]]]}, "not of expected type: uint8"),
                               ({"instances": [[[[1, 2, 3]]]]}, "expected shape [?,?,?,1]"),
                               ({"inputs": {"images": [[[300]]]}}, "out of range"),
                               ({"signature_name": "nope", "instances": [[[[1]]]]}, "not found in signature def")):
            with pytest.raises(client.ServingError, match="HTTP 400") as info:
                client._http(url, body)
            assert fragment in str(info.value), str(info.value)
        with pytest.raises(client.ServingError, match="HTTP 404"):
            client.rest_predict(exported.images, server.url, "unknown_model", channels=1)

        # The CLI on image files of two sizes (separate requests), written to an .npz.
        from PIL import Image
        paths = []
        for i, array in enumerate((exported.images[0], exported.other[0], exported.images[1])):
            paths.append(str(tmp_path / f"{i}.png"))
            Image.fromarray(array[..., 0]).save(paths[-1])
        client.main(["--server", server.url, "--model", "uniclr", "--out", str(tmp_path / "f.npz"), *paths])
    saved = np.load(tmp_path / "f.npz")
    want = np.stack([exported.ref["features"][0], exported.ref_other["features"][0], exported.ref["features"][1]])
    assert max_diff(saved["features"], want) <= TOL


def test_grpc_client_against_grpc_standin(exported):
    """Only where ``tensorflow-serving-api`` is installed (not a requirement of the project)."""
    pytest.importorskip("tensorflow_serving.apis.prediction_service_pb2_grpc")
    from concurrent import futures

    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    client = _load_module("client")
    serve = tf.saved_model.load(exported.saved_model).signatures["serving_default"]

    class Service(prediction_service_pb2_grpc.PredictionServiceServicer):
        def Predict(self, request, context):  # noqa: N802 (gRPC's naming)
            outputs = serve(**{k: tf.constant(tf.make_ndarray(v)) for k, v in request.inputs.items()})
            response = predict_pb2.PredictResponse()
            for k, v in outputs.items():
                response.outputs[k].CopyFrom(tf.make_tensor_proto(v.numpy()))
            return response

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(Service(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        got = client.grpc_predict(exported.images, f"127.0.0.1:{port}", "uniclr", channels=1)
    finally:
        server.stop(0)
    for key in ("features", "embedding"):
        assert max_diff(got[key], exported.ref[key]) <= TOL, key


# --- the export folder: refused when not empty, --overwrite, written aside and renamed ----------


def test_cli_refuses_a_non_empty_out_and_overwrite_replaces_it(exported, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("not an export")
    proc = _cli([f"--run_dir={exported.run_dir}", f"--out={out}"])
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --out={out}: ") and "--overwrite" in lines[0], proc.stderr
    assert file_tree(out) == {"notes.txt": b"not an export"}  # untouched
    assert os.listdir(tmp_path) == ["out"]

    proc = _cli([f"--run_dir={exported.run_dir}", f"--out={out}", "--overwrite"])  # not an export: kept
    assert proc.returncode != 0 and "refusing to delete them" in proc.stderr, proc.stderr[-3000:]
    assert file_tree(out) == {"notes.txt": b"not an export"}
    (out / "notes.txt").unlink()
    (out / "export.json").write_text("{}")  # an export (an old one): replaced whole
    (out / "notes.txt").write_text("left over")
    proc = _cli([f"--run_dir={exported.run_dir}", f"--out={out}", "--overwrite"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "notes.txt" not in os.listdir(out)
    assert {"saved_model.pb", "variables", "backbone.keras", "export.json"} <= set(os.listdir(out))
    assert json.loads((out / "export.json").read_text())["saved_model_dir"] == "."
    assert os.listdir(tmp_path) == ["out"]  # no temporary or set-aside folder left behind


def test_killed_export_leaves_the_previous_export_intact(exported, tmp_path):
    """SIGKILL while the export is being written: ``--out`` still holds the previous export, byte
    for byte; the only trace is the killed export's ``.out.tmp-*`` sibling."""
    import signal
    import time

    out = tmp_path / "out"
    shutil.copytree(exported.out_dir, out)  # the previous export (version 1 layout)
    before = file_tree(out)
    job = Job(export_cli(f"--run_dir={exported.run_dir}", f"--out={out}", "--overwrite"))
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and job.proc.poll() is None:
        if any(name.startswith(".out.tmp-") for name in os.listdir(tmp_path)):
            break
        time.sleep(0.005)
    assert job.proc.poll() is None, ("the export ended before it could be killed", job.result().stderr[-3000:])
    job.proc.send_signal(signal.SIGKILL)
    job.proc.communicate()
    assert file_tree(out) == before
    left = sorted(set(os.listdir(tmp_path)) - {"out"})
    assert len(left) == 1 and left[0].startswith(".out.tmp-"), left


def test_export_run_versions_overwrite_and_a_failed_export(exported, tmp_path, monkeypatch):
    # --version: a new version folder joins the others (TF Serving picks it up); an existing one
    # needs overwrite and is then replaced entirely.
    base = tmp_path / "serving"
    export.export_run(exported.run_dir, str(base), version=1)
    export.export_run(exported.run_dir, str(base), version=2)
    assert sorted(os.listdir(base)) == ["1", "2", "backbone.keras", "export.json"]
    assert export.find_saved_model(str(base)) == str(base / "2")
    with pytest.raises(ValueError) as error:
        export.export_run(exported.run_dir, str(base), version=2)
    message = str(error.value)
    assert message.startswith(f"--out={base}: ") and str(base / "2") in message and "--overwrite" in message
    (base / "2" / "stale.txt").write_text("left over")
    version_1 = file_tree(base / "1")
    export.export_run(exported.run_dir, str(base), version=2, overwrite=True)
    assert "stale.txt" not in os.listdir(base / "2") and os.path.isfile(base / "2" / "saved_model.pb")
    assert file_tree(base / "1") == version_1
    assert sorted(os.listdir(base)) == ["1", "2", "backbone.keras", "export.json"]

    # An empty --out is fine without overwrite.
    (tmp_path / "empty").mkdir()
    export.export_run(exported.run_dir, str(tmp_path / "empty"))
    assert os.path.isfile(tmp_path / "empty" / "saved_model.pb")

    # A failure after the SavedModel is written leaves the previous export as it was, and no
    # temporary folder.
    plain = tmp_path / "plain"
    export.export_run(exported.run_dir, str(plain))
    before = file_tree(plain)

    def crash(*args, **kwargs):
        raise RuntimeError("simulated crash")

    monkeypatch.setattr(export, "atomic_write_json", crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        export.export_run(exported.run_dir, str(plain), overwrite=True)
    monkeypatch.undo()
    assert file_tree(plain) == before
    assert sorted(os.listdir(tmp_path)) == ["empty", "plain", "serving"]

    # The run folder is never replaced, even with overwrite.
    with pytest.raises(ValueError, match="holds the run folder"):
        export.export_run(exported.run_dir, os.path.dirname(exported.run_dir), overwrite=True)
    assert os.path.isfile(os.path.join(exported.run_dir, "encoder.keras"))


# --- export/client.py decodes image files exactly as training does ------------------------------


def test_client_decodes_image_files_as_training_does(tmp_path):
    """16-bit PNGs (grey, grey + alpha, RGB) and 8-bit ones: ``load_images`` (either backend) gives
    the uint8 pixels a ``folder:`` dataset trains on (PIL's ``convert("L")`` clipped 10000 to 255;
    training has 10000 >> 8 = 39)."""
    import tensorflow as tf

    from uniclr_tf import data

    client = _load_module("client")
    rng = np.random.default_rng(3)
    grey16 = rng.integers(0, 65536, (6, 7, 1)).astype(np.uint16)
    grey16[0, 0, 0] = 10000
    grey_alpha16 = rng.integers(0, 65536, (6, 7, 2)).astype(np.uint16)
    rgb16 = rng.integers(0, 65536, (6, 7, 3)).astype(np.uint16)
    rgb16[0, 0] = (10000, 20000, 65535)
    grey8 = rng.integers(0, 256, (6, 7, 1)).astype(np.uint8)
    rgb8 = rng.integers(0, 256, (6, 7, 3)).astype(np.uint8)
    datasets = {1: (grey16, grey_alpha16, grey8),
                3: (rgb16, rgb8, grey16)}  # a grey image in an RGB dataset: repeated over 3 channels

    def write_png(path, array):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(tf.io.encode_png(array).numpy())
        return str(path)

    for channels, arrays in datasets.items():
        root = tmp_path / f"c{channels}"
        files = [write_png(root / "train" / f"{i}.png", a) for i, a in enumerate(arrays)]  # file order
        write_png(root / "test" / "0.png", arrays[0])
        info = data.load_dataset(f"folder:{root}")
        assert info.image_shape == (6, 7, channels)
        trained_on = data.as_numpy(info, "train")[0]
        assert trained_on[0, 0, 0, 0] == 39
        for backend in (None, "pil"):
            sent = client.load_images(files, channels, backend=backend)
            assert len(sent) == len(trained_on)
            for path, got, want in zip(files, sent, trained_on):
                assert got.dtype == np.uint8 and got.shape == want.shape, (path, backend, got.shape)
                np.testing.assert_array_equal(got, want, err_msg=f"{path} (backend {backend})")
    np.testing.assert_array_equal(client.load_images([str(tmp_path / "c3" / "train" / "0.png")], 3)[0][0, 0],
                                  [39, 78, 255])
    with pytest.raises(ValueError, match="cannot decode image"):
        (tmp_path / "bad.png").write_text("not a PNG")
        client.load_images([str(tmp_path / "bad.png")], 1)


# Subprocess results (started by the `exported` fixture, overlapping the tests above).

def test_fresh_process_reload_matches_in_memory_model(exported, fresh):
    assert fresh["spec"] == {"dtype": "uint8", "shape": [None, None, None, 1], "outputs": ["embedding", "features"]}
    for key in ("features", "embedding"):
        assert np.asarray(fresh["batch"][key]).shape == exported.ref[key].shape
        assert max_diff(fresh["batch"][key], exported.ref[key]) <= TOL, key


def test_other_image_sizes_are_resampled_like_eval_preprocess(exported, fresh):
    # The signature's spatial dims are free; EvalPreprocess on the static shape is the reference.
    for key in ("features", "embedding"):
        assert max_diff(fresh["other"][key], exported.ref_other[key]) <= TOL, key
    assert max_diff(fresh["other"]["features"], exported.ref["features"][:3]) > 1e-3  # really other inputs


def test_outputs_do_not_depend_on_the_rest_of_the_batch(fresh):
    batch = {k: np.asarray(v) for k, v in fresh["batch"].items()}
    for key in ("features", "embedding"):
        assert max_diff(fresh["alone"][key], batch[key][2:3]) <= TOL, key
        assert max_diff(fresh["reversed"][key], batch[key][::-1]) <= TOL, key
    # The batch statistics differ a lot from the moving ones: training-mode BN would not pass this.
    assert max_diff(batch["features"][0], batch["features"][1]) > 1e-3


def test_savedmodel_rejects_wrong_rank_channels_and_dtype(fresh):
    errors = fresh["errors"]
    assert "Shape of tensor images [28,28,1] is not compatible with expected shape [?,?,?,1]" in errors["rank3"]
    assert "Shape of tensor images [2,28,28,3] is not compatible with expected shape [?,?,?,1]" in errors["channels3"]
    assert errors["float32"] is not None and "uint8" in errors["float32"]


def test_saved_model_cli_run(exported):
    # saved_model_cli only evaluates literals in --input_exprs (no np.zeros(...)): feed an .npy.
    result = exported.jobs["saved_model_cli"].result()
    assert result.returncode == 0, result.stderr[-3000:]
    for key in ("features", "embedding"):
        assert max_diff(np.load(exported.root / "saved_model_cli" / f"{key}.npy"), exported.ref[key]) <= TOL, key


def test_cli_check_reloads_and_compares(exported):
    proc = exported.jobs["check"].result()
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "max abs diff other_size/features" in proc.stdout and "max abs diff backbone.keras/features" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1].startswith("OK: SavedModel")



def test_jax_backend_export_refuses_and_check_matches(exported):
    result = exported.jobs["jax"].result()
    assert result.returncode == 0, result.stderr[-5000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["backend"] == "jax"
    assert "needs the TensorFlow backend" in out["message"] and "KERAS_BACKEND=tensorflow" in out["message"]
    assert not (exported.root / "jax_out").exists()
    assert out["ok"] and max(out["diffs"].values()) <= TOL, out["diffs"]
