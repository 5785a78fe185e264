"""Release (``python -m uniclr_tf.tools.release``): a finished run folder -> backbone.keras, saved_model/,
the run's small files, MODEL_CARD.md and SHA256SUMS, written aside and renamed.

The shared ``tiny_run`` (a real 2-step SimCLR run) is copied once per module, with a ``linear_eval.json``
added, and variants of it: an interrupted run, one without metrics.json, one whose kNN is non-finite,
one whose encoder has per-device-group and synchronized batch norm. Every CLI case runs as ``python -m``
in a fork of one interpreter that has imported TensorFlow (``conftest.run_cli_forks``); a JAX process
without TensorFlow then loads the released backbones with plain Keras through the card's own snippet
and releases the run without TensorFlow.
"""

import hashlib
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import types
import zipfile

import keras
import numpy as np
import pytest

from tests.conftest import NO_TENSORFLOW, PythonJob, file_tree, run_cli_forks
from uniclr_tf.evaluation import protocols
from uniclr_tf.training.runs import RunFolder, RunFolderError
from uniclr_tf.serving import release

if keras.backend.backend() != "tensorflow":  # the run's reference features and the SavedModel: TF
    pytest.skip("release tests run on the TensorFlow backend", allow_module_level=True)

TOL = 1e-5
LINEAR_TOP1 = 0.4321
TOP_FILES = {"backbone.keras", "saved_model", "metrics.json", "flags.txt", "config.json", "dataset.json",
             "history.json", "linear_eval.json", "MODEL_CARD.md", "SHA256SUMS"}

# A JAX process where TensorFlow cannot be imported (a machine with JAX only): the released backbones through
# the card's own snippet, with plain Keras (no uniclr_tf imported), then a release of the run.
NO_TF_PROCESS = NO_TENSORFLOW + r"""
import json, os, re, sys
import time
import keras  # imported (on JAX) while the TF releases are written
import numpy as np
root = ROOT
deadline = time.monotonic() + 300
for name in ("out", "out_grouped"):  # a release appears whole (renamed into place)
    while not os.path.exists(os.path.join(root, name, "SHA256SUMS")):
        if time.monotonic() > deadline:
            raise TimeoutError(name)
        time.sleep(0.05)
images = np.load(os.path.join(root, "images.npy"))
out = {}
for name in ("out", "out_grouped"):
    with open(os.path.join(root, name, "MODEL_CARD.md")) as f:
        snippet = re.findall(r"```python\n(.*?)```", f.read(), re.S)[0]
    os.chdir(os.path.join(root, name))
    scope = {"images": images}
    exec(snippet, scope)
    out[name] = np.asarray(scope["features"], np.float64).tolist()
os.chdir(root)
out["backend"] = keras.backend.backend()
out["uniclr_tf_imported"] = sorted(m for m in sys.modules if m.split(".")[0] == "uniclr_tf")
from uniclr_tf.serving import release
notes = []
result = release.release_run(os.path.join(root, "run"), os.path.join(root, "out_notf"), log=notes.append)
out.update(notes=notes, saved_model=result["saved_model"], files=sorted(result["files"]),
           tensorflow_imported="tensorflow" in sys.modules)
print(json.dumps(out))
"""


def _copy_run(src, dst):
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("backup", "tb", "linear_eval*", "finetune*", "export"))
    return dst


def _write_metrics(run, **changes):
    metrics = json.loads((run / "metrics.json").read_text())
    metrics.update(changes)
    (run / "metrics.json").write_text(json.dumps(metrics))  # allow_nan: a bare NaN, as a foreign writer might


def _grouped_encoder(run):
    """encoder.keras of ``run`` rewritten with GroupBatchNormalization (groups=2) and synchronized BN
    layers, one of two each, same weights: what --batch_norm=per_device / MirroredStrategy runs save;
    each grouped one takes in the ReLU after it (``relu=True``), as one-pass batch norm on JAX does."""
    from uniclr_tf.nets.norm import GroupBatchNormalization
    encoder = keras.saving.load_model(run / "encoder.keras", compile=False)
    names = {layer.name for layer in encoder.layers}
    seen, fused = [], set()

    def swap(layer):
        config = layer.get_config()
        if isinstance(layer, keras.layers.BatchNormalization):
            seen.append(layer.name)
            if len(seen) % 2:
                relu = layer.name.replace("bn", "relu")  # the tiny encoder's bn{i} -> relu{i}
                fused.update({relu} & names)
                return GroupBatchNormalization.from_config({**config, "groups": 2, "relu": relu in names})
            return keras.layers.BatchNormalization.from_config({**config, "synchronized": True})
        return layer.__class__.from_config(config)

    def call(layer, *args, **kwargs):
        return args[0] if layer.name in fused else layer(*args, **kwargs)

    grouped = keras.models.clone_model(encoder, clone_function=swap, call_function=call)
    grouped.set_weights(encoder.get_weights())
    assert len(seen) >= 2 and fused and not fused & {layer.name for layer in grouped.layers}, (seen, fused)
    (run / "encoder.keras").unlink()
    grouped.save(run / "encoder.keras")


def _reference(run, images):
    """The run's own encoder (and projector) on ``images`` through EvalPreprocess, inference mode."""
    folder = RunFolder(run)
    x = folder.eval_preprocess()(images)
    features = folder.load_encoder()(x, training=False)
    embedding = folder.load_projector()(features, training=False)
    return keras.ops.convert_to_numpy(features), keras.ops.convert_to_numpy(embedding)


@pytest.fixture(scope="module")
def released(tiny_run, tmp_path_factory):
    root = tmp_path_factory.mktemp("release")
    run = _copy_run(tiny_run, root / "run")
    protocols.merge_results(str(run / "linear_eval.json"),
                            protocols.section_key("linear", "fashion_mnist", 1.0, 0),
                            {"top1": LINEAR_TOP1, "top5": 0.9, "settings": {"epochs": 3, "batch_size": 64}},
                            {"run_dir": str(run), "pretraining_dataset": "fashion_mnist"})
    interrupted = _copy_run(run, root / "interrupted")
    _write_metrics(interrupted, status="interrupted", reason="stop_after_steps")
    no_metrics = _copy_run(run, root / "no_metrics")
    (no_metrics / "metrics.json").unlink()
    diverged = _copy_run(run, root / "nan_knn")
    _write_metrics(diverged, knn_top1=None)  # how runs.atomic_write_json writes a NaN
    grouped = _copy_run(run, root / "grouped")
    _grouped_encoder(grouped)
    occupied = root / "occupied"
    occupied.mkdir()
    (occupied / "notes.txt").write_text("not a release")
    previous = root / "previous"
    previous.mkdir()
    (previous / "old.txt").write_text("an earlier release")
    for name in (release.CARD_FILE, release.SUMS_FILE):  # what makes it a release --overwrite may replace
        (previous / name).write_text("")
    images = np.random.default_rng(7).integers(0, 256, (5, *RunFolder(run).image_shape), dtype=np.uint8)
    np.save(root / "images.npy", images)

    cases = {
        "ok": [f"--run_dir={run}", f"--out={root / 'out'}"],
        "grouped": [f"--run_dir={grouped}", f"--out={root / 'out_grouped'}", "--nosaved_model"],
        "overwrite": [f"--run_dir={run}", f"--out={previous}", "--overwrite", "--nosaved_model"],
        "interrupted": [f"--run_dir={interrupted}", f"--out={root / 'refused_interrupted'}"],
        "no_metrics": [f"--run_dir={no_metrics}", f"--out={root / 'refused_no_metrics'}"],
        "nan_knn": [f"--run_dir={diverged}", f"--out={root / 'refused_nan_knn'}"],
        "missing": [f"--run_dir={root / 'no_such_run'}", f"--out={root / 'refused_missing'}"],
        "occupied": [f"--run_dir={run}", f"--out={occupied}"],
        "no_out": [f"--run_dir={run}"],
        "no_run_dir": [f"--out={root / 'refused_no_run_dir'}"],
    }
    no_tf = PythonJob(NO_TF_PROCESS.replace("ROOT", repr(str(root))), backend="jax")  # waits for out, out_grouped
    try:
        results = dict(zip(cases, run_cli_forks("uniclr_tf.tools.release", list(cases.values()))))
        yield types.SimpleNamespace(root=root, run=run, grouped=grouped, occupied=occupied, previous=previous,
                                    images=images, cli=results, cli_args=cases, no_tf=no_tf, out=root / "out")
    finally:
        no_tf.kill()


def _ok(result):
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
    return result


# --- what a release holds -------------------------------------------------------------------------


def test_release_holds_the_models_the_runs_files_and_nothing_else(released):
    _ok(released.cli["ok"])
    out = released.out
    assert set(os.listdir(out)) == TOP_FILES
    for name in ("metrics.json", "flags.txt", "config.json", "dataset.json", "history.json", "linear_eval.json"):
        assert (out / name).read_bytes() == (released.run / name).read_bytes(), name
    assert (out / "saved_model" / "saved_model.pb").is_file()
    meta = json.loads((out / "saved_model" / "export.json").read_text())
    assert meta["backbone"] == "../backbone.keras" and not (out / "saved_model" / "backbone.keras").exists()
    assert "kNN top-1" in released.cli["ok"].stdout and "sha256sum -c SHA256SUMS" in released.cli["ok"].stdout
    # written aside and renamed: no temporary folder left beside it (once the release made beside it, by
    # the process without TensorFlow, has finished too)
    released.no_tf.result()
    assert not [n for n in os.listdir(released.root) if ".tmp-" in n or ".old-" in n]


def test_sha256sums_lists_every_file_with_its_digest(released):
    _ok(released.cli["ok"])
    out = released.out
    lines = (out / "SHA256SUMS").read_text().splitlines()
    listed = {}
    for line in lines:
        digest, path = re.fullmatch(r"([0-9a-f]{64})  (\S+)", line).groups()
        listed[path] = digest
    files = {p.replace(os.sep, "/") for p in file_tree(out)} - {"SHA256SUMS"}
    assert set(listed) == files and "saved_model/variables/variables.index" in files
    for path, digest in listed.items():
        assert hashlib.sha256((out / path).read_bytes()).hexdigest() == digest, path
    if shutil.which("sha256sum"):
        proc = subprocess.run(["sha256sum", "-c", "--strict", "SHA256SUMS"], cwd=out, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_model_card_gives_the_runs_numbers_input_and_command(released):
    _ok(released.cli["ok"])
    card = (released.out / "MODEL_CARD.md").read_text()
    metrics = json.loads((released.run / "metrics.json").read_text())
    config = json.loads((released.run / "config.json").read_text())
    assert f"| {metrics['knn_top1']:.4f} |" in card
    assert f"raw-pixel kNN baseline (same protocol on the pixels) | {metrics['raw_pixel_knn_top1']:.4f} |" in card
    assert f"linear[fashion_mnist, labels=100%] (`linear_eval.json`, 3 epochs, batch 64) | {LINEAR_TOP1:.4f} |" in card
    assert "# run: simclr on fashion_mnist" in card
    assert f"- encoder: `tiny (width 8)`" in card and "- epochs: 1 (2 steps)" in card and "- batch size: 64" in card
    h, w, c = RunFolder(released.run).image_shape
    assert f"float32 `[batch, {h}, {w}, {c}]`" in card and f"`images` uint8 `[batch, height, width, {c}]`" in card
    assert f"mean = [{RunFolder(released.run).mean[0]!r}]" in card
    flags = [line for line in (released.run / "flags.txt").read_text().splitlines() if line.strip()]
    command = "python -m uniclr_tf.train " + " ".join(map(shlex.quote, [*flags, f"--run_dir={config['run_dir']}"]))
    assert f"```bash\n{command}\n```" in card


def test_backbone_keras_gives_the_runs_encoder_features(released):
    _ok(released.cli["ok"])
    want, _ = _reference(released.run, released.images)
    backbone = keras.saving.load_model(released.out / "backbone.keras", compile=False)
    got = keras.ops.convert_to_numpy(backbone(RunFolder(released.run).eval_preprocess()(released.images),
                                              training=False))
    assert float(np.max(np.abs(got - want))) <= TOL
    assert float(np.max(np.abs(want))) > 0.1  # features, not zeros


def test_saved_model_gives_the_runs_outputs_through_the_cards_snippet(released, monkeypatch):
    tf = pytest.importorskip("tensorflow")
    _ok(released.cli["ok"])
    want, want_embedding = _reference(released.run, released.images)
    serve = tf.saved_model.load(str(released.out / "saved_model")).signatures["serving_default"]
    out = serve(images=tf.constant(released.images))
    assert float(np.max(np.abs(out["features"].numpy() - want))) <= TOL
    assert float(np.max(np.abs(out["embedding"].numpy() - want_embedding))) <= TOL
    snippets = re.findall(r"```python\n(.*?)```", (released.out / "MODEL_CARD.md").read_text(), re.S)
    assert len(snippets) == 2 and all(len(s.strip().splitlines()) == 3 for s in snippets)
    monkeypatch.chdir(released.out)  # the card's paths are relative to the release folder
    scope = {"images": released.images}
    exec(snippets[1], scope)
    assert float(np.max(np.abs(np.asarray(scope["features"]) - want))) <= TOL


def test_group_and_synchronized_batch_norm_are_released_as_plain_batch_norm(released):
    _ok(released.cli["grouped"])
    out = released.root / "out_grouped"
    assert "saved_model" not in os.listdir(out)
    assert "left out by --nosaved_model" in (out / "MODEL_CARD.md").read_text()

    def keras_config(path):
        with zipfile.ZipFile(path) as z:
            return z.read("config.json").decode()

    source = keras_config(released.grouped / "encoder.keras")
    assert "GroupBatchNormalization" in source and '"synchronized": true' in source  # what needed replacing
    assert '"relu": true' in source
    text = keras_config(out / "backbone.keras")
    assert "uniclr_tf" not in text and '"synchronized": true' not in text and "GroupBatchNormalization" not in text
    want, _ = _reference(released.run, released.images)  # the same weights as the plain run
    backbone = keras.saving.load_model(out / "backbone.keras", compile=False)
    got = keras.ops.convert_to_numpy(backbone(RunFolder(released.run).eval_preprocess()(released.images),
                                              training=False))
    assert float(np.max(np.abs(got - want))) <= TOL


def test_backbones_load_with_plain_keras_on_jax_and_release_without_tensorflow(released):
    """On JAX, TensorFlow not importable: the card's snippet (plain Keras, uniclr_tf not imported) gives
    the run's features for both backbones; a release there leaves saved_model/ out with a note."""
    _ok(released.cli["ok"])
    _ok(released.cli["grouped"])
    out = released.no_tf.result()
    assert out["backend"] == "jax" and out["uniclr_tf_imported"] == [] and not out["tensorflow_imported"]
    want, _ = _reference(released.run, released.images)
    for name in ("out", "out_grouped"):
        assert float(np.max(np.abs(np.asarray(out[name]) - want))) <= TOL, name
    notes = [n for n in out["notes"] if n.startswith("note:")]  # (a warning, when the tiny run is below raw pixels)
    assert len(notes) == 1 and "TensorFlow is not installed" in notes[0], out["notes"]
    assert out["saved_model"] and "saved_model/" not in " ".join(out["files"])
    notf = released.root / "out_notf"
    assert set(os.listdir(notf)) == TOP_FILES - {"saved_model"}
    assert ("`saved_model/`: not in this release (TensorFlow is not installed where it was made; "
            "`python -m uniclr_tf.export` writes it") in (notf / "MODEL_CARD.md").read_text()
    assert "saved_model" not in (notf / "SHA256SUMS").read_text()


# --- refusals, --overwrite, a failed self-check ---------------------------------------------------------


@pytest.mark.parametrize("case, culprit", [
    ("interrupted", "metrics.json says status 'interrupted' (stop_after_steps), not 'finished'"),
    ("no_metrics", "no metrics.json, so the run has not finished"),
    ("nan_knn", "metrics.json holds non-finite values (knn_top1=null)"),
    ("missing", "does not exist"),
])
def test_unfinished_or_broken_run_folders_are_refused_and_nothing_is_written(released, case, culprit):
    result = released.cli[case]
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: run folder ") and culprit in lines[0], result.stderr
    run_name = {"missing": "no_such_run"}.get(case, case)
    assert str(released.root / run_name) in lines[0]
    out = re.fullmatch(r"--out=(.*)", released.cli_args[case][1]).group(1)
    assert not os.path.lexists(out)  # nothing written: no folder, no temporary sibling
    assert not [n for n in os.listdir(released.root) if n.startswith(f".{os.path.basename(out)}.")]


@pytest.mark.parametrize("case, line", [
    ("no_out", "error: --out: expected the release folder to write; not given"),
    ("no_run_dir", "error: --run_dir: expected the finished run folder written by uniclr_tf.train; not given"),
])
def test_a_missing_required_flag_is_one_error_line_naming_it(released, case, line):
    """``ReleaseConfig`` refuses a missing ``--run_dir`` or ``--out`` as every CLI refuses a bad flag:
    one ``error: --flag: ...`` line, exit code 1, no traceback, nothing written."""
    result = released.cli[case]
    assert result.returncode == 1, (result.stdout[-2000:], result.stderr[-2000:])
    assert result.stderr.strip().splitlines() == [line]
    assert not os.path.lexists(released.root / "refused_no_run_dir")


def test_non_empty_out_is_refused_untouched_and_overwrite_replaces_it(released):
    result = released.cli["occupied"]
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --out={released.occupied}: the release folder is not "
                                                   "empty; pass --overwrite"), result.stderr
    assert file_tree(released.occupied) == {"notes.txt": b"not a release"}

    _ok(released.cli["overwrite"])
    assert set(os.listdir(released.previous)) == TOP_FILES - {"saved_model"}  # old.txt gone
    assert not [n for n in os.listdir(released.root) if n.startswith(".previous.")]


def test_check_run_refuses_a_bare_nan_and_accepts_the_finished_run(released, tmp_path):
    folder, metrics = release.check_run(released.run)
    assert metrics["status"] == "finished" and math.isfinite(metrics["knn_top1"])
    run = _copy_run(released.run, tmp_path / "nan_loss")
    _write_metrics(run, final_loss=float("nan"), seconds={"this_invocation": float("inf")})
    with pytest.raises(RunFolderError, match=r"non-finite values \(final_loss=nan, seconds.this_invocation=inf\)"):
        release.check_run(run)


def test_a_backbone_that_does_not_match_the_run_is_not_released_and_the_old_release_stays(released, tmp_path,
                                                                                           monkeypatch):
    """The self-check: a backbone.keras whose features differ from encoder.keras (here: one weight of
    the copy perturbed) stops the release before anything is put in place; with --overwrite the
    earlier release stays whole, and is replaced once a release completes."""
    portable = release.portable_backbone

    def perturbed(encoder):
        backbone = keras.models.clone_model(encoder)
        weights = encoder.get_weights()
        weights[0] = weights[0] + 0.5
        backbone.set_weights(weights)
        return backbone, 0

    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("the earlier release")
    for name in (release.CARD_FILE, release.SUMS_FILE):
        (out / name).write_text("")
    before = file_tree(tmp_path)
    monkeypatch.setattr(release, "portable_backbone", perturbed)
    with pytest.raises(RuntimeError, match="backbone.keras reloaded differs from .*encoder.keras"):
        release.release_run(released.run, out, overwrite=True, saved_model=False, log=lambda _: None)
    assert file_tree(tmp_path) == before  # no temporary folder left either
    monkeypatch.setattr(release, "portable_backbone", portable)
    result = release.release_run(released.run, out, overwrite=True, saved_model=False, log=lambda _: None)
    assert result["saved_model"] == "left out by --nosaved_model"
    assert set(os.listdir(out)) == TOP_FILES - {"saved_model"} and os.listdir(tmp_path) == ["out"]


def test_portable_copy_splits_batch_norms_that_took_in_a_sum_and_a_relu(tmp_path):
    """A one-pass ResNet-18 (the JAX default) has batch norms that took in the ReLU after them and, at each
    block's end, the shortcut's sum and the ReLU: the portable copy writes each back as Keras' batch norm,
    ``Add`` and ``ReLU`` with the same weights and the same features, and loads as plain Keras layers."""
    from uniclr_tf.nets import encoders
    encoder = encoders.build_encoder("resnet18", (12, 12, 1), width=4, norm=encoders.BatchNorm(one_pass=True))
    with_sum = [layer.name for layer in encoder.layers if isinstance(layer, encoders.GroupBatchNormalization)
                and len(layer._inbound_nodes[0].input_tensors) == 2]
    assert len(with_sum) == 8
    portable, replaced = release.portable_backbone(encoder)
    assert replaced == sum(isinstance(layer, encoders.GroupBatchNormalization) for layer in encoder.layers) == 20
    kinds = {type(layer).__name__ for layer in portable.layers}
    assert "GroupBatchNormalization" not in kinds and release._custom_modules(portable) == []
    assert {f"{name}_add" for name in with_sum} <= {layer.name for layer in portable.layers}
    assert sorted(v.path for v in portable.weights) == sorted(v.path for v in encoder.weights)
    images = np.random.default_rng(0).normal(size=(3, 12, 12, 1)).astype("float32")
    portable.save(tmp_path / "portable.keras")
    loaded = keras.saving.load_model(tmp_path / "portable.keras", compile=False)
    for model in (portable, loaded):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(model(images, training=False)),
                                      keras.ops.convert_to_numpy(encoder(images, training=False)))
