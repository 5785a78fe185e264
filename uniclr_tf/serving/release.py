r"""Release a finished run: a self-contained folder of what it trained, to publish and load without training.

    python -m uniclr_tf.tools.release --run_dir=RUN --out=DIR [--overwrite] [--nosaved_model]

``--out`` receives::

    backbone.keras     the encoder alone (normalised float images [B, H, W, C] -> features [B, F]), loadable
                       with plain ``keras.saving.load_model`` on any Keras 3 backend, without uniclr_tf:
                       batch-norm layers that only training needs to be special (per-device groups, TF's
                       synchronized BN) are saved as plain ``BatchNormalization`` with the same weights
                       (inference is the same arithmetic)
    saved_model/       the TF SavedModel of ``uniclr_tf.export`` (``serving_default``: uint8 images of any
                       size -> ``features``, ``embedding``) and its ``export.json``; left out with
                       ``--nosaved_model``, or with a one-line note where TensorFlow is not installed (the
                       JAX-only GPU machines) or the Keras backend is not TensorFlow
    metrics.json flags.txt config.json dataset.json history.json linear_eval.json
                       copies of the run's files (``history.json`` and ``linear_eval.json`` when present)
    MODEL_CARD.md      method, dataset, encoder, epochs, batch, kNN top-1 (and the raw-pixel kNN baseline),
                       linear top-1 (``linear_eval.json``), the input spec, how to load both models, and
                       the command that trained it
    SHA256SUMS         the SHA-256 of every other file, relative paths: ``cd DIR && sha256sum -c SHA256SUMS``

Only a finished run is released: ``metrics.json`` must say ``"status": "finished"`` (``uniclr_tf.train``
writes it when the run ends; a stopped or diverged run's says why) and hold only finite numbers (the
strict JSON of ``uniclr_tf.training.runs`` writes a non-finite kNN or loss as ``null``: refused too);
``encoder.keras``, ``dataset.json`` and ``config.json`` (and ``projector.keras`` for the SavedModel)
must be there. A refusal is one ``error:`` line naming the folder and the file, before anything is
written. Before the folder is put in place, the release checks itself: ``backbone.keras`` reloaded
gives the run's ``encoder.keras`` features on a few images (and the SavedModel, reloaded, those of
the run's models: ``uniclr_tf.serving.export.check_export``), within 1e-5.

``--out`` must be missing or empty unless ``--overwrite``, which replaces only a release of this tool
(``MODEL_CARD.md`` and ``SHA256SUMS``): a folder of other files is refused even with
``--overwrite``. A run whose kNN top-1 is below its raw-pixel baseline is released with a warning,
at the top of its model card too. The release is written into a temporary
sibling folder (``.NAME.tmp-*``) and renamed to ``--out`` when complete (``uniclr_tf.export``'s
helpers): an earlier release there is replaced only then, and a failed or killed release leaves it
intact (a killed one leaves its ``.NAME.tmp-*`` folder, which can be deleted).

Only NumPy and the standard-library run-folder reader are imported before the checks: a refusal is
immediate.
"""

import dataclasses
import datetime
import hashlib
import importlib.util
import json
import math
import os
import shlex
import shutil
import sys

import numpy as np

from uniclr_tf.serving import export
from uniclr_tf.config.fields import check_field, flag, unset
from uniclr_tf.training.runs import (CONFIG_FILE, DATASET_FILE, ENCODER_FILE, PROJECTOR_FILE, RunFolder, RunFolderError,
                            atomic_write_json, atomic_write_text)

METRICS_FILE = "metrics.json"
FLAGS_FILE = "flags.txt"
HISTORY_FILE = "history.json"
LINEAR_EVAL_FILE = "linear_eval.json"
#: The run's files copied into the release, in this order (those missing from the run are skipped).
COPIED_FILES = (METRICS_FILE, FLAGS_FILE, CONFIG_FILE, DATASET_FILE, HISTORY_FILE, LINEAR_EVAL_FILE)
#: What a run folder must hold to be released (metrics.json is checked apart: finished, finite).
REQUIRED_FILES = (ENCODER_FILE, DATASET_FILE, CONFIG_FILE)
BACKBONE_FILE = export.BACKBONE_FILE
SAVED_MODEL_DIR = "saved_model"
CARD_FILE = "MODEL_CARD.md"
SUMS_FILE = "SHA256SUMS"
#: metrics.json entries that are numbers in a finished run: ``null`` there is a non-finite value
#: (``runs.atomic_write_json`` writes NaN and infinities as ``null``).
FINITE_KEYS = ("final_loss", "knn_top1", "knn_top5", "raw_pixel_knn_top1", "raw_pixel_knn_top5", "effective_rank")
NUM_CHECK_IMAGES = 4
TOLERANCE = export.DEFAULT_TOLERANCE


# --------------------------------------------------------------------------------------------
# The run folder: finished, finite (standard library and NumPy only)
# --------------------------------------------------------------------------------------------


def _non_finite(value, path=""):
    """The key paths (``a.b[2]``) of the non-finite numbers in a JSON value."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _non_finite(v, f"{path}.{k}" if path else str(k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _non_finite(v, f"{path}[{i}]")]
    if isinstance(value, float) and not math.isfinite(value):
        return [f"{path}={value}"]
    return []


def check_run(run_dir, saved_model=True, force=False):
    """``(RunFolder, metrics dict)`` of a run folder that can be released.

    Raises :class:`uniclr_tf.training.runs.RunFolderError` (one line naming the folder and the file) when the
    folder or a required file is missing, when ``metrics.json`` is missing (the run has not ended),
    corrupt, says another status than ``finished``, or holds a non-finite number (or ``null`` for one of
    :data:`FINITE_KEYS`).
    """
    folder = RunFolder(run_dir, require=REQUIRED_FILES + ((PROJECTOR_FILE,) if saved_model else ()))
    if not folder.has(METRICS_FILE):
        raise RunFolderError(f"run folder {folder.path!r}: no {METRICS_FILE}, so the run has not finished "
                             f"(uniclr_tf.train writes it when the run ends; rerun its training command to resume "
                             f"and finish it)")
    metrics = folder.read_json(METRICS_FILE)
    status = metrics.get("status", "finished")  # as uniclr_tf.train reads it (runs older than the field)
    if status == "collapsed" and not force:
        raise folder.error(METRICS_FILE, "says the run collapsed: its encoder holds a collapsed representation; pass "
                                         "--force to release it anyway")
    if status not in ("finished", "collapsed"):
        reason = f" ({metrics['reason']})" if metrics.get("reason") else ""
        raise folder.error(METRICS_FILE, f"says status {status!r}{reason}, not 'finished': only a finished run is "
                                         f"released (rerun its training command to resume and finish it)")
    bad = _non_finite(metrics) + [f"{k}=null" for k in FINITE_KEYS if k in metrics and metrics[k] is None]
    if bad:
        raise folder.error(METRICS_FILE, f"holds non-finite values ({', '.join(bad)}): a diverged or broken run "
                                         f"is not released")
    return folder, metrics


# --------------------------------------------------------------------------------------------
# The backbone: plain Keras layers, checked against the run's encoder
# --------------------------------------------------------------------------------------------


def _layers(model):
    """Every layer of ``model``, nested models' layers included (depth first, in order)."""
    return list(_layer_paths(model).values())


def _layer_paths(model, prefix=""):
    """``{path: layer}`` for every layer of ``model``, nested models' layers included (depth first, in
    order), the path its name under the names of the models around it: unique where names are not."""
    out = {}
    for layer in model.layers:
        out[prefix + layer.name] = layer
        if hasattr(layer, "layers"):
            out.update(_layer_paths(layer, f"{prefix}{layer.name}/"))
    return out


def _needs_plain_bn(layer):
    import keras
    return isinstance(layer, keras.layers.BatchNormalization) and (
        type(layer) is not keras.layers.BatchNormalization or getattr(layer, "synchronized", False))


def _needs_plain_pool(layer):
    from uniclr_tf.nets.pooling import MaxPooling2D
    return isinstance(layer, MaxPooling2D)


def portable_backbone(encoder):
    """``(backbone, replaced)``: ``encoder`` with its batch-norm layers of a subclass (e.g.
    :class:`uniclr_tf.nets.encoders.GroupBatchNormalization`) or with ``synchronized=True`` (TF only) rebuilt
    as plain ``keras.layers.BatchNormalization`` with the same weights (one called with a ``residual``
    followed by an ``Add`` named ``{name}_add``, one with ``relu=True`` by a ``ReLU`` named ``{name}_relu``),
    and its :class:`uniclr_tf.nets.pooling.MaxPooling2D` as Keras' own, so the
    saved file loads with plain Keras on any backend; inference is unchanged (both batch norms are plain
    batch norm with the moving statistics at ``training=False``; both poolings the same max). ``encoder``
    itself when there is none (``replaced`` = 0)."""
    import keras

    from uniclr_tf.nets.norm import GroupBatchNormalization

    old = _layer_paths(encoder)
    replaced = sum(_needs_plain_bn(layer) or _needs_plain_pool(layer) for layer in old.values())
    if not replaced:
        return encoder, 0
    relus = {layer.name for layer in old.values() if getattr(layer, "relu", False) is True}
    grouped = {layer.name for layer in old.values() if isinstance(layer, GroupBatchNormalization)}

    def plain(layer):
        config = layer.get_config()
        if _needs_plain_bn(layer):
            for key in (*GroupBatchNormalization.TRAINING_OPTIONS, "relu"):
                config.pop(key, None)
            config["synchronized"] = False
            return keras.layers.BatchNormalization.from_config(config)
        if _needs_plain_pool(layer):
            return keras.layers.MaxPooling2D.from_config(config)
        return layer.__class__.from_config(config)

    def call(layer, *args, **kwargs):
        residual = kwargs.pop("residual", None) if layer.name in grouped else None
        out = layer(*args, **kwargs)
        if residual is not None:
            out = keras.layers.Add(name=f"{layer.name}_add")([out, residual])
        return keras.layers.ReLU(name=f"{layer.name}_relu")(out) if layer.name in relus else out

    backbone = keras.models.clone_model(encoder, clone_function=plain, call_function=call, recursive=True)
    added = {f"{name}_{suffix}" for name in grouped for suffix in ("add", "relu")}
    new = {path: layer for path, layer in _layer_paths(backbone).items() if layer.name not in added}
    if sorted(old) != sorted(new):
        raise RuntimeError(f"the portable copy of the encoder has other layers than {ENCODER_FILE}")
    for path, src in old.items():
        if not hasattr(src, "layers"):
            new[path].set_weights(src.get_weights())
    return backbone, replaced


def _custom_modules(model):
    """The uniclr_tf modules a model's layers come from (to import before loading it)."""
    modules = {type(layer).__module__ for layer in _layers(model)}
    return sorted(m for m in modules if m.split(".")[0] == "uniclr_tf")


def check_images(image_shape, count=NUM_CHECK_IMAGES, seed=0):
    """Deterministic uint8 images of the run's shape, for the self-checks."""
    return np.random.default_rng(seed).integers(0, 256, (count, *image_shape), dtype=np.uint8)


def _features(model, inputs):
    import keras
    return keras.ops.convert_to_numpy(model(inputs, training=False)).astype(np.float32)


def saved_model_unavailable():
    """Why the SavedModel cannot be written in this process (None when it can)."""
    try:
        have_tf = importlib.util.find_spec("tensorflow") is not None
    except ImportError:
        have_tf = False
    if not have_tf:
        return "TensorFlow is not installed"
    import keras
    if keras.backend.backend() != "tensorflow":
        return f"the Keras backend is {keras.backend.backend()!r}, not TensorFlow (KERAS_BACKEND=tensorflow)"
    return None


# --------------------------------------------------------------------------------------------
# MODEL_CARD.md and SHA256SUMS
# --------------------------------------------------------------------------------------------


def is_release(folder):
    """Whether ``folder`` holds a release of this tool (what ``--overwrite`` may replace)."""
    return all(os.path.isfile(os.path.join(folder, name)) for name in (CARD_FILE, SUMS_FILE))


def below_raw_pixels(metrics):
    """A sentence saying the run's kNN top-1 is below its raw-pixel kNN baseline, or None."""
    knn, raw = metrics.get("knn_top1"), metrics.get("raw_pixel_knn_top1")
    below = metrics.get("below_raw_pixel_baseline")
    if below is None and isinstance(knn, (int, float)) and isinstance(raw, (int, float)):
        below = knn < raw
    if not below:
        return None
    return (f"this encoder's kNN top-1 ({_num(knn)}) is below the raw-pixel kNN baseline ({_num(raw)}): its "
            "features classify the test split worse than the pixels do; it learned nothing useful on this data")


def _num(value, digits=4):
    return "n/a" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _floats(values):
    return ", ".join(repr(float(v)) for v in values)


def _train_command(flags_text, config):
    """``(one-line command, flag lines)`` from ``flags.txt`` (None when the run has none)."""
    if flags_text is None:
        return None, []
    lines = [line.strip() for line in flags_text.splitlines() if line.strip() and not line.strip().startswith("#")]
    run_dir = config.get("run_dir")
    extra = [f"--run_dir={run_dir}"] if run_dir and not any(line.startswith("--run_dir=") for line in lines) else []
    return "python -m uniclr_tf.train " + " ".join(shlex.quote(arg) for arg in lines + extra), lines + extra


def model_card(name, folder, metrics, config, linear, flags_text, backbone_info, saved_model_note, versions):
    """The text of ``MODEL_CARD.md``."""
    info = folder.dataset
    height, width, channels = folder.image_shape
    mean, std = folder.mean, folder.std
    if len(mean) == 1 and channels > 1:
        mean, std = mean * channels, std * channels
    method = config.get("method") or metrics.get("method") or folder.objective or "unknown"
    dataset = config.get("dataset") or info.get("dataset") or "unknown"
    encoder = config.get("encoder") or "unknown"
    if config.get("encoder_width"):
        encoder += f" (width {config['encoder_width']})"
    feature_dim = backbone_info["feature_dim"]
    epochs = config.get("epochs", metrics.get("epochs"))
    lines = [f"# {name}: {method} on {dataset}", "",
             f"A self-supervised **{method}** encoder ({encoder}, {feature_dim}-d features) pretrained on "
             f"**{dataset}** with uniclr-tf (Keras 3 self-supervised learning; UniCLR: arXiv 2211.14516), released "
             f"from the run folder "
             f"`{name}` by `python -m uniclr_tf.tools.release` on {versions['date']} (uniclr-tf "
             f"{versions['uniclr_tf']}, Keras {versions['keras']}, backend {versions['backend']}).", "",
             *([f"> **Warning**: {below_raw_pixels(metrics)}.", ""] if below_raw_pixels(metrics) else []),
             *_results_table(metrics, config, linear)]
    lines += ["", "## Training", "",
              f"- method: `{method}`" + (f" (options: {json.dumps(config['method_options'], sort_keys=True)})"
                                         if config.get("method_options") else ""),
              f"- dataset: `{dataset}`" + (f" ({info['num_train']} training images)" if info.get("num_train") else ""),
              f"- encoder: `{encoder}`; projector {config.get('projector_dims', 'n/a')}",
              f"- epochs: {epochs}" + (f" ({metrics['steps']} steps)" if metrics.get("steps") else ""),
              f"- batch size: {config.get('batch_size', 'n/a')}",
              f"- optimizer: {config.get('optimizer', 'n/a')}, "
              f"base learning rate {config.get('base_learning_rate', 'n/a')}, "
              f"weight decay {config.get('weight_decay', 'n/a')}, precision {config.get('precision', 'n/a')}",
              f"- final loss: {_num(metrics.get('final_loss'))}"]
    command, flag_lines = _train_command(flags_text, config)
    lines += ["", "## Input", "",
              f"- `{BACKBONE_FILE}`: float32 `[batch, {height}, {width}, {channels}]`, normalised: "
              f"`x = (uint8 / 255 - mean) / std` per channel with mean = [{_floats(mean)}], std = [{_floats(std)}]. "
              f"Spatial sizes are free (`(None, None, {channels})`), but the encoder was trained at {height}x{width}; "
              f"uniclr_tf's `EvalPreprocess` (or the SavedModel) resamples other sizes (largest central box, "
              f"antialiased bilinear). Output: features `[batch, {feature_dim}]`"
              + (f" (layers computing in `{backbone_info['dtype_policy']}`)"
                 if backbone_info["dtype_policy"] != "float32" else "") + "."]
    if saved_model_note is None:
        lines.append(f"- `{SAVED_MODEL_DIR}/`: TF SavedModel, signature `serving_default`: `images` uint8 "
                     f"`[batch, height, width, {channels}]` (pixel values 0-255, any height and width: resampled to "
                     f"{height}x{width} and normalised inside) -> `features` float32 `[batch, {feature_dim}]` and "
                     f"`embedding` float32 `[batch, {backbone_info['embedding_dim']}]` (the projector's output); "
                     f"inference-mode batch norm. `{SAVED_MODEL_DIR}/export.json` gives the same spec.")
    else:
        lines.append(f"- `{SAVED_MODEL_DIR}/`: not in this release ({saved_model_note}).")
    imports = "".join(f"; import {m}" for m in backbone_info["custom_modules"])
    lines += ["", "## Loading", "", f"`{BACKBONE_FILE}` (Keras 3, any backend"
              + (f"; needs `{imports[2:]}`" if imports else "; uniclr_tf not needed") + "):", "",
              "```python",
              f"import keras, numpy as np{imports}  # images: uint8 [batch, {height}, {width}, {channels}]",
              f"backbone = keras.saving.load_model(\"{BACKBONE_FILE}\", compile=False)",
              f"features = backbone.predict((images / 255.0 - np.float32([{_floats(mean)}])) "
              f"/ np.float32([{_floats(std)}]), verbose=0)",
              "```"]
    if saved_model_note is None:
        lines += ["", f"`{SAVED_MODEL_DIR}/` (TensorFlow; TF Serving serves it as is):", "",
                  "```python",
                  f"import tensorflow as tf  # images: uint8 [batch, height, width, {channels}], any height and width",
                  f"serve = tf.saved_model.load(\"{SAVED_MODEL_DIR}\").signatures[\"serving_default\"]",
                  "features = serve(images=tf.constant(images))[\"features\"]  # and [\"embedding\"]",
                  "```"]
    lines += ["", "## How it was trained", ""]
    if command is None:
        lines.append("The run folder has no flags.txt: its settings are in config.json.")
    else:
        lines += [f"Replay with `python -m uniclr_tf.train --flagfile={FLAGS_FILE}` (this folder's copy"
                  + (f", plus `--run_dir={config['run_dir']}`" if config.get("run_dir") else "")
                  + "); in full:", "", "```bash", command, "```"]
    lines += ["", "## Files", "",
              f"`{SUMS_FILE}` holds the SHA-256 of every other file: `sha256sum -c {SUMS_FILE}` in this folder checks "
              f"them. `{METRICS_FILE}`, `{CONFIG_FILE}`, `{DATASET_FILE}`, `{FLAGS_FILE}`, `{HISTORY_FILE}` (per-epoch "
              f"losses and kNN) and `{LINEAR_EVAL_FILE}` are the run's own files, where it has them.", ""]
    return "\n".join(lines)


def _results_table(metrics, config, linear):
    """The model card's "Results" section: the kNN of the run, its raw-pixel baseline, and the
    sections of ``linear_eval.json``."""
    lines = ["## Results", "", "| evaluation | top-1 |", "| --- | --- |"]
    if metrics.get("knn_top1") is not None:
        bank = f", memory bank {metrics['knn_memory_bank']}" if metrics.get("knn_memory_bank") else ""
        test = f", {metrics['knn_test']} test images" if metrics.get("knn_test") else ""
        lines.append(f"| weighted kNN on the backbone's test-split features (k={config.get('knn_k', 200)}, "
                     f"T={config.get('knn_temperature', 0.1)}{bank}{test}) | {_num(metrics['knn_top1'])} |")
    if metrics.get("raw_pixel_knn_top1") is not None:
        lines.append(f"| raw-pixel kNN baseline (same protocol on the pixels) | "
                     f"{_num(metrics['raw_pixel_knn_top1'])} |")
    for key, section in (linear or {}).items():
        if isinstance(section, dict) and "top1" in section and key.startswith(("linear[", "knn[")):
            settings = section.get("settings") or {}
            how = f", {settings['epochs']} epochs, batch {settings['batch_size']}" if "epochs" in settings else ""
            lines.append(f"| {key} (`linear_eval.json`{how}) | {_num(section['top1'])} |")
    if metrics.get("knn_top1") is None and not linear:
        lines.append("| (no labelled evaluation: the dataset has no labels) | n/a |")
    return lines


def sha256(path, chunk=2 ** 20):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256sums(root):
    """``sha256sum``'s text for every file under ``root`` (relative ``/`` paths, sorted), ``SHA256SUMS`` aside."""
    rows = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in files:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            if rel == SUMS_FILE:
                continue
            if "\n" in rel or "\\" in rel:
                raise ValueError(f"{path}: a file name sha256sum -c cannot read back")
            rows.append((rel, sha256(path)))
    return "".join(f"{digest}  {rel}\n" for rel, digest in sorted(rows))


# --------------------------------------------------------------------------------------------
# The release
# --------------------------------------------------------------------------------------------


def release_run(run_dir, out_dir, overwrite=False, saved_model=True, log=print, force=False):
    """Writes the release of the finished run ``run_dir`` to ``out_dir`` (see the module docstring);
    returns ``{"out", "files": {relative path: size in bytes}, "knn_top1", "saved_model",
    "plain_layers"}`` (``saved_model``: None when written, else why not). Raises ``RunFolderError``
    / ``ValueError`` (refusals, before anything is written) or ``RuntimeError`` (a self-check failed:
    nothing is put in place)."""
    folder, metrics = check_run(run_dir, saved_model, force=force)
    target = export.check_export_target(out_dir, None, overwrite, run_dir, what="release folder",
                                        recognise=is_release)
    below = below_raw_pixels(metrics)
    if below:
        log(f"warning: {below}")
    config = folder.config
    linear = folder.read_json(LINEAR_EVAL_FILE) if folder.has(LINEAR_EVAL_FILE) else None
    flags_text = None
    if folder.has(FLAGS_FILE):
        with open(folder.file(FLAGS_FILE)) as f:
            flags_text = f.read()
    why_not = None if saved_model else "left out by --nosaved_model"
    unavailable = saved_model_unavailable() if saved_model else None
    if unavailable:
        why_not = f"{unavailable} where it was made; `python -m uniclr_tf.export` writes it from the run folder"
        log(f"note: {unavailable}: no {SAVED_MODEL_DIR}/ in this release (the rest is written)")

    import keras

    import uniclr_tf

    encoder = folder.load_encoder()
    preprocess = folder.eval_preprocess()
    backbone, replaced = portable_backbone(encoder)
    inputs = preprocess(check_images(folder.image_shape))
    want = _features(encoder, inputs)
    projector_dims = config.get("projector_dims")
    backbone_info = {"feature_dim": int(encoder.output_shape[-1]),
                     "embedding_dim": projector_dims[-1] if projector_dims else "D",
                     "dtype_policy": getattr(getattr(backbone, "dtype_policy", None), "name", "float32"),
                     "custom_modules": _custom_modules(backbone)}

    with export.staging_folder(target) as (staging, dest):
        backbone.save(os.path.join(staging, BACKBONE_FILE))
        got = _features(keras.saving.load_model(os.path.join(staging, BACKBONE_FILE), compile=False), inputs)
        diff = float(np.max(np.abs(got - want)))
        if not diff <= TOLERANCE * max(1.0, float(np.max(np.abs(want)))):
            raise RuntimeError(f"{BACKBONE_FILE} reloaded differs from {folder.file(ENCODER_FILE)} by {diff:.3g} "
                               f"(max abs, {NUM_CHECK_IMAGES} images): nothing released")
        if why_not is None:
            sm_dir = os.path.join(staging, SAVED_MODEL_DIR)
            meta = export.export_run(run_dir, sm_dir, force=force)
            os.remove(os.path.join(sm_dir, BACKBONE_FILE))  # the release's own, one level up
            atomic_write_json(os.path.join(sm_dir, export.EXPORT_JSON),
                              {**meta, "backbone": f"../{BACKBONE_FILE}", "saved_model_dir": "."})
            backbone_info["embedding_dim"] = meta["embedding_dim"]
            result = export.check_export(sm_dir, run_dir, num_images=NUM_CHECK_IMAGES, force=force)
            if not result["ok"]:
                raise RuntimeError(f"the SavedModel reloaded differs from the run's models by "
                                   f"{result['max_abs_diff']:.3g} (max abs): nothing released")
        for name in COPIED_FILES:
            if folder.has(name):
                shutil.copyfile(folder.file(name), os.path.join(staging, name))
        versions = {"uniclr_tf": uniclr_tf.__version__, "keras": keras.__version__,
                    "backend": keras.backend.backend(), "date": datetime.date.today().isoformat()}
        name = os.path.basename(os.path.normpath(os.path.abspath(run_dir)))
        atomic_write_text(os.path.join(staging, CARD_FILE),
                          model_card(name, folder, metrics, config, linear, flags_text, backbone_info, why_not,
                                     versions))
        atomic_write_text(os.path.join(staging, SUMS_FILE), sha256sums(staging))
        files = {}
        for root, _, names in os.walk(staging):
            for n in names:
                path = os.path.join(root, n)
                files[os.path.relpath(path, staging).replace(os.sep, "/")] = os.path.getsize(path)
        export.check_export_target(out_dir, None, overwrite, what="release folder",  # nothing appeared meanwhile
                                   recognise=is_release)
        export.replace_dir(staging, dest)
    return {"out": out_dir, "files": files, "knn_top1": metrics.get("knn_top1"), "saved_model": why_not,
            "plain_layers": replaced}


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ReleaseConfig:
    """Every setting of one ``python -m uniclr_tf.tools.release`` invocation. Each field is a flag of the
    same name, declared with its help (:func:`uniclr_tf.config.fields.flag`); the order is ``--help``'s
    (:data:`HELP_GROUPS`)."""

    run_dir: str = unset(str, "The finished run folder written by uniclr_tf.train (metrics.json with status "
                              "finished, encoder.keras, projector.keras, dataset.json, config.json).")
    out: str = unset(str, "The release folder; must be missing or empty unless --overwrite.")
    overwrite: bool = flag(False, "Replace a non-empty --out entirely (once the new release is complete); without "
                                  "it such a folder is refused.")
    force: bool = flag(False, "Release a run whose metrics.json says it collapsed (refused otherwise).")
    saved_model: bool = flag(True, "Also write saved_model/ (the TF SavedModel of uniclr_tf.export; needs "
                                   "TensorFlow: left out with a note where it is not installed).")

    def __post_init__(self):
        check_field(self, bool(self.run_dir), "run_dir", "the finished run folder written by uniclr_tf.train")
        check_field(self, bool(self.out), "out", "the release folder to write")


#: ``--help``'s groups: ``(title, first field)`` (:func:`uniclr_tf.config.flagutil.group_fields`).
HELP_GROUPS = [("the run and the release folder", "run_dir"), ("what the release holds", "saved_model")]


def define_flags(flag_values=None):
    """One flag per ``ReleaseConfig`` field, same name, same default, the help next to the field
    (defined when the command runs, not on import)."""
    from uniclr_tf.config import flagutil
    flagutil.define_flags(ReleaseConfig, flag_values=flag_values)


def config_from_flags(flag_values=None) -> ReleaseConfig:
    from uniclr_tf.config import flagutil
    return flagutil.config_from_flags(ReleaseConfig, flag_values)


def run(cfg: ReleaseConfig):
    """Releases the run as ``cfg`` says and prints what was written; a refusal or a failed
    self-check stops with one ``error:`` line."""
    try:
        result = release_run(cfg.run_dir, cfg.out, overwrite=cfg.overwrite, saved_model=cfg.saved_model,
                             force=cfg.force)
    except (OSError, ValueError, RuntimeError) as e:
        sys.exit(f"error: {e}")
    total = sum(result["files"].values())
    listed = ", ".join(n for n in sorted(result["files"]) if "/" not in n)
    print(f"released {cfg.run_dir} -> {cfg.out}: {len(result['files'])} files, {total / 2 ** 20:.1f} MB ({listed}"
          + (f", {SAVED_MODEL_DIR}/" if result["saved_model"] is None else "") + ")")
    if result["knn_top1"] is not None:
        print(f"kNN top-1 {result['knn_top1']:.4f}; see {os.path.join(cfg.out, CARD_FILE)}")
    print(f"verify with: cd {cfg.out} && sha256sum -c {SUMS_FILE}")


def main(argv):
    from absl import logging

    from uniclr_tf.config import flagutil
    logging.set_verbosity(logging.WARNING)
    run(flagutil.config_or_exit(ReleaseConfig))


def entry_point():
    """What ``python -m uniclr_tf.tools.release`` does."""
    from uniclr_tf.config import flagutil
    define_flags()
    flagutil.run_cli(__name__, __doc__, main, groups=flagutil.group_fields(ReleaseConfig, HELP_GROUPS))


if __name__ == "__main__":
    entry_point()
