r"""Export a pretraining run for serving (TF Serving SavedModel) and for fine-tuning (.keras).

    python -m uniclr_tf.export --run_dir=runs/demo --out=runs/demo/export [--version=1]
    python -m uniclr_tf.export --check=runs/demo/export --run_dir=runs/demo

The SavedModel's ``serving_default`` signature takes ONE input, ``images``: uint8
``[batch, height, width, C]`` (height and width free; C fixed by the run), and returns
``features`` (backbone, ``[batch, F]``) and ``embedding`` (projector, ``[batch, D]``), both float32.
Preprocessing lives inside the model: images of the training size go straight through
:class:`uniclr_tf.augment.EvalPreprocess` (uint8 → [0, 1] → per-channel mean/std of the run);
other sizes are first resampled to the training size the way ``EvalPreprocess`` resamples (largest
central box of the training aspect ratio, antialiased bilinear; see :func:`resample_to`), because
``EvalPreprocess`` itself needs static spatial sizes. Inference uses the BatchNorm moving statistics
(``training=False``), so an image's outputs do not depend on the rest of the batch.

The export folder ``--out`` receives::

    saved_model.pb, variables/   the SavedModel (in ``<out>/<version>/`` with ``--version``, the
                                 numbered layout TF Serving expects; see export/README.md)
    backbone.keras               the encoder, for fine-tuning (normalised float images → features)
    export.json                  input spec, output names and sizes, image size, mean/std, source run

Export needs the TensorFlow backend (SavedModel). ``--check`` loads the SavedModel with
``tf.saved_model.load`` in its own process, runs ``serving_default`` on deterministic uint8 images and
compares with ``EvalPreprocess`` + ``encoder.keras`` + ``projector.keras`` of the run folder; it exits
non-zero when a difference exceeds ``--tolerance`` (1e-5, relative to the outputs' size; see
:func:`check_export`).

The run folder is read through :class:`uniclr_tf.training.runs.RunFolder`: a missing or corrupt file stops
with one ``RunFolderError`` line naming it.

``--out`` must be missing or empty: a non-empty folder is refused with one line naming it, unless
``--overwrite``, which replaces it entirely (nothing of the old folder is left), and only when it
holds an export of this tool (``export.json``, a SavedModel, or numbered SavedModel folders): a
folder of other files is refused even with ``--overwrite``, as ``uniclr_tf.train`` refuses to
overwrite a folder that holds no run. The export is
written into a temporary sibling folder (``.NAME.tmp-*``) and renamed to ``--out`` at the end, so a
crash or kill mid-export never leaves a half-written export there: the previous export, if any,
stays intact until the rename (a killed export leaves its ``.NAME.tmp-*`` folder behind, which can
be deleted). With ``--version=N`` the unit is the version folder ``<out>/N``: it is written the same
way (its temporary folder inside ``<out>`` is not a number, so TF Serving ignores it) and holds its
own ``export.json``, the other version folders of ``<out>`` are kept (TF Serving picks up the new
one), ``--overwrite`` is needed only to replace an existing ``<out>/N``, and ``backbone.keras`` and
``export.json`` (the latest export's) are then replaced atomically. An export killed after ``<out>/N``
appeared but before those two were replaced is finished by running the same command again (no
``--overwrite`` needed), and :func:`find_saved_model` already names ``<out>/N``, the latest export.
Temporary files of killed exports are removed by the next export into the same ``--out``.

Only NumPy (and the standard-library :mod:`uniclr_tf.training.runs` and :mod:`uniclr_tf.config.fields`) is imported
at module level: :func:`check_images` serves ``export/client.py`` without TensorFlow or Keras.
"""

import contextlib
import dataclasses
import errno
import json
import os
import re
import shutil
import sys
import time
import uuid

import numpy as np

from uniclr_tf.config.errors import UsageError
from uniclr_tf.config.fields import check_field, flag, unset
from uniclr_tf.training.runs import (CONFIG_FILE, DATASET_FILE, ENCODER_FILE, PROJECTOR_FILE, RunFolder, atomic_save,
                            atomic_write_json)

SIGNATURE = "serving_default"
INPUT_NAME = "images"
OUTPUT_NAMES = ("features", "embedding")
RUN_FILES = (ENCODER_FILE, PROJECTOR_FILE, DATASET_FILE)  # config.json is optional (metadata only)
SAVED_MODEL_FILE = "saved_model.pb"
BACKBONE_FILE = "backbone.keras"
EXPORT_JSON = "export.json"
DEFAULT_TOLERANCE = 1e-5


# --------------------------------------------------------------------------------------------
# Validation (NumPy only)
# --------------------------------------------------------------------------------------------


def check_images(images, channels):
    """Validates a batch for the ``serving_default`` signature; returns it as a NumPy array.

    Args:
        images: array-like, uint8 ``[batch, height, width, channels]``.
        channels: the channel count the model was trained on (1 or 3).

    Raises:
        ValueError: naming the expected and the received dtype, rank or channel count.
    """
    array = np.asarray(images)
    if array.dtype != np.uint8:
        raise ValueError(f"images must have dtype uint8 (pixel values 0-255); received dtype "
                         f"{array.dtype} (convert with np.clip(x, 0, 255).astype(np.uint8))")
    if array.ndim != 4:
        hint = " (add a batch axis: images[None])" if array.ndim == 3 else ""
        raise ValueError(f"images must have rank 4 [batch, height, width, {channels}]; received "
                         f"rank {array.ndim} with shape {tuple(array.shape)}{hint}")
    if array.shape[-1] != channels:
        raise ValueError(f"images must have {channels} channel(s) in the last axis [batch, height, "
                         f"width, {channels}]; received {array.shape[-1]} (shape {tuple(array.shape)})")
    if array.shape[1] == 0 or array.shape[2] == 0:
        raise ValueError(f"images must have a non-zero height and width; received shape {tuple(array.shape)}")
    return array


def check_run_dir(run_dir, force=False):
    """The :class:`uniclr_tf.training.runs.RunFolder` of ``run_dir``
    (:func:`uniclr_tf.evaluation.run.check_run_dir`); raises ``RunFolderError`` (a ``ValueError``,
    one line naming the folder and the missing file) unless it holds ``RUN_FILES``, or when its
    ``metrics.json`` says the run collapsed (unless ``force``)."""
    from uniclr_tf.evaluation.run import check_run_dir as check_files
    return check_files(run_dir, RUN_FILES, refuse_collapsed="" if force else (
        "its encoder would serve a collapsed representation; pass --force to export it anyway"))


def _read_meta(path):
    """An ``export.json`` as a dict, or None."""
    try:
        with open(path) as f:
            meta = json.load(f)
        return meta if isinstance(meta, dict) else None
    except (OSError, ValueError):
        return None


def _newer_version(export_dir, than=None):
    """``(version folder, its export.json)`` of the latest export written into a numbered version
    folder (each holds its own ``export.json``) if it is newer than the ``export.json`` ``than``
    (None: any), else ``(None, None)``."""
    best, best_meta = None, None
    if not os.path.isdir(export_dir):
        return None, None
    for name in os.listdir(export_dir):
        folder = os.path.join(export_dir, name)
        meta = _read_meta(os.path.join(folder, EXPORT_JSON)) if name.isdigit() else None
        if meta is None or not os.path.isfile(os.path.join(folder, SAVED_MODEL_FILE)):
            continue
        stamp = meta.get("exported_at")
        if not isinstance(stamp, (int, float)):
            continue
        if best_meta is None or stamp > best_meta["exported_at"]:
            best, best_meta = folder, meta
    if best_meta is None or (than is not None and isinstance(than.get("exported_at"), (int, float))
                             and than["exported_at"] >= best_meta["exported_at"]):
        return None, None
    return best, best_meta


def find_saved_model(export_dir):
    """The SavedModel folder of an export: the latest export's (the one ``export.json`` names, or a
    version folder whose own ``export.json`` is newer: an export killed before it replaced the
    top-level files), else ``export_dir`` itself, else its highest numbered version folder."""
    top = _read_meta(os.path.join(export_dir, EXPORT_JSON))
    newer, _ = _newer_version(export_dir, top)
    if newer is not None:
        return os.path.normpath(newer)
    try:
        named = os.path.join(export_dir, top["saved_model_dir"])
        if os.path.isfile(os.path.join(named, SAVED_MODEL_FILE)):
            return os.path.normpath(named)
    except (KeyError, TypeError):
        pass
    if os.path.isfile(os.path.join(export_dir, SAVED_MODEL_FILE)):
        return export_dir
    versions = []
    if os.path.isdir(export_dir):
        versions = [int(d) for d in os.listdir(export_dir)
                    if d.isdigit() and os.path.isfile(os.path.join(export_dir, d, SAVED_MODEL_FILE))]
    if not versions:
        raise FileNotFoundError(f"{export_dir!r} holds no SavedModel ({SAVED_MODEL_FILE} in it or in "
                                f"a numbered version folder such as {os.path.join(export_dir, '1')})")
    return os.path.join(export_dir, str(max(versions)))


def is_export(folder):
    """Whether ``folder`` holds an export of this tool: an ``export.json``, a SavedModel, or
    numbered SavedModel folders (what ``--overwrite`` may replace)."""
    if os.path.isfile(os.path.join(folder, EXPORT_JSON)) or os.path.isfile(os.path.join(folder, SAVED_MODEL_FILE)):
        return True
    return any(name.isdigit() and os.path.isfile(os.path.join(folder, name, SAVED_MODEL_FILE))
               for name in os.listdir(folder))


def check_export_target(out_dir, version=None, overwrite=False, run_dir=None, what="export folder",
                        recognise=is_export):
    """The folder an export writes and replaces: ``out_dir``, or ``out_dir/<version>``.

    Raises ``ValueError`` (one line starting with ``--out=`` and naming the folder) when that folder
    exists and is not empty and ``overwrite`` is False, when ``overwrite`` is True but the folder
    holds something else than what this tool writes there (``recognise(folder)``: an export, or
    ``uniclr_tf.tools.release``'s release), when it (or ``out_dir``) is not a folder, or when it
    holds ``run_dir``. Changes nothing on disk. ``what`` names the folder in the messages
    (``uniclr_tf.tools.release`` checks its release folder with it).
    """
    if not out_dir:
        raise UsageError(f"--out= names no folder; expected the {what}")
    if version is not None and os.path.lexists(out_dir) and not os.path.isdir(out_dir):
        raise UsageError(f"--out={out_dir}: exists and is not a folder")
    target = out_dir if version is None else os.path.join(out_dir, str(version))
    if run_dir is not None:
        real_target, real_run = os.path.realpath(target), os.path.realpath(run_dir)
        if os.path.commonpath([real_target, real_run]) == real_target:
            raise UsageError(f"--out={out_dir}: {target} holds the run folder {run_dir}; choose another --out")
    if os.path.lexists(target):
        if not os.path.isdir(target):
            raise UsageError(f"--out={out_dir}: {target} exists and is not a folder; remove it or choose another --out")
        if os.listdir(target) and not overwrite:
            if version is None:
                raise UsageError(f"--out={out_dir}: the {what} is not empty; pass --overwrite to replace "
                                 f"it (everything in it is deleted) or choose another --out")
            raise UsageError(f"--out={out_dir}: its version folder {target} is not empty; pass --overwrite to "
                             f"replace that version (the other versions are kept) or choose another --version")
        if os.listdir(target) and not recognise(target):
            raise UsageError(f"--out={out_dir}: --overwrite: {target} holds files that are not a {what} of this tool; "
                             "refusing to delete them: remove them yourself or choose another --out")
    return target


_DEAD_TEMP = re.compile(r"\.tmp-(\d+)-\d+")


def remove_dead_temporaries(folder):
    """Removes the temporary files (``NAME.tmp-<pid>-<n>...``) that a killed export left directly in
    ``folder`` (their process no longer runs); returns their names."""
    removed = []
    if not os.path.isdir(folder):
        return removed
    for name in os.listdir(folder):
        match = _DEAD_TEMP.search(name)
        path = os.path.join(folder, name)
        if match is None or not os.path.isfile(path) or _alive(int(match.group(1))):
            continue
        with contextlib.suppress(OSError):
            os.remove(path)
            removed.append(name)
    return removed


def _alive(pid):
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


@contextlib.contextmanager
def staging_folder(target):
    """``(staging, dest)``: ``dest`` the real path ``target`` names (a symlinked target keeps its
    link), ``staging`` a new empty sibling folder of it (``.NAME.tmp-*``: the same file system, so
    the final rename is atomic; the umask's permissions, where ``tempfile.mkdtemp``'s 0700 would hide
    it from TF Serving). The caller writes into ``staging`` and puts it in place with
    :func:`replace_dir`; whatever is left of it is deleted on the way out."""
    dest = os.path.realpath(target)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    staging = os.path.join(os.path.dirname(dest), f".{os.path.basename(dest)}.tmp-{uuid.uuid4().hex[:12]}")
    os.mkdir(staging)
    try:
        yield staging, dest
    finally:
        if os.path.isdir(staging):
            shutil.rmtree(staging, ignore_errors=True)


def replace_dir(staging, dest):
    """Renames the finished folder ``staging`` to ``dest`` (same parent). An existing ``dest`` is
    first renamed aside and deleted after, so it stays whole until the export is in place."""
    aside = None
    if os.path.lexists(dest):
        aside = os.path.join(os.path.dirname(dest), f".{os.path.basename(dest)}.old-{uuid.uuid4().hex[:12]}")
        os.rename(dest, aside)
    try:
        os.rename(staging, dest)
    except BaseException:
        if aside is not None:
            os.rename(aside, dest)
        raise
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def require_tensorflow_backend():
    import keras
    backend = keras.backend.backend()
    if backend != "tensorflow":
        raise RuntimeError(f"export writes a TensorFlow SavedModel and needs the TensorFlow backend; "
                           f"the Keras backend is {backend!r}. Rerun with KERAS_BACKEND=tensorflow "
                           f"(weights saved under any backend load there).")


# --------------------------------------------------------------------------------------------
# The serving function (TensorFlow)
# --------------------------------------------------------------------------------------------


def resample_to(images, size, crop_fraction=1.0, antialias=True, input_scale=255.0):
    """uint8 ``[B, h, w, C]`` of any (dynamic) h, w → float32 ``[B, H, W, C]`` divided by ``input_scale``.

    The same arithmetic as ``EvalPreprocess`` before its normalisation (scale, then the largest
    central box with the output's aspect ratio, shrunk by ``crop_fraction``, bilinear with
    antialiasing when shrinking, half-pixel centres, and the same contraction order), written with
    TensorFlow ops so that h and w may be unknown when the graph is built. Images that already have
    the output size (and ``crop_fraction == 1``) are only cast and scaled, as ``EvalPreprocess``
    does. Feed the result to an ``EvalPreprocess`` with ``input_scale=1``.

    Run eagerly it equals ``EvalPreprocess`` bit for bit. Inside a graph (the SavedModel) Grappler's
    constant folding turns ``x / constant`` into ``x * (1 / constant)``, which moves the resampled
    pixels by up to ~3e-6 (in [0, 1] units); ``EvalPreprocess`` in a ``tf.function`` gets the same.
    """
    import tensorflow as tf

    from uniclr_tf.augment import resize_matrix

    out_h, out_w = size
    channels = images.shape[-1]
    x = tf.cast(images, tf.float32) * (1.0 / input_scale)
    height, width = tf.shape(images)[1], tf.shape(images)[2]

    def resample():
        hf, wf = tf.cast(height, tf.float32), tf.cast(width, tf.float32)
        ratio = out_w / out_h
        in_ratio = wf / hf
        box_h = tf.where(in_ratio < ratio, wf / ratio, hf)
        box_w = tf.where(in_ratio > ratio, hf * ratio, wf)
        y0, x0 = (hf - box_h) / 2.0, (wf - box_w) / 2.0
        f = float(crop_fraction)
        y0, x0, box_h, box_w = y0 + box_h * (1 - f) / 2, x0 + box_w * (1 - f) / 2, box_h * f, box_w * f
        ry = resize_matrix(y0, box_h, height, out_h, antialias)
        rx = resize_matrix(x0, box_w, width, out_w, antialias)
        # augment.apply_separable's choice of the cheaper contraction order (same rounding).
        rows_first = out_h * height * width + out_h * width * out_w <= height * width * out_w + out_h * height * out_w
        return tf.cond(rows_first,
                       lambda: tf.einsum("jw,biwc->bijc", rx, tf.einsum("ih,bhwc->biwc", ry, x)),
                       lambda: tf.einsum("ih,bhjc->bijc", ry, tf.einsum("jw,bhwc->bhjc", rx, x)))

    static = images.shape[1], images.shape[2]
    if crop_fraction != 1.0 or (None not in static and static != (out_h, out_w)):
        out = resample()
    elif None not in static:
        out = x
    else:
        same = tf.logical_and(tf.equal(height, out_h), tf.equal(width, out_w))
        out = tf.cond(same, lambda: tf.reshape(x, [-1, out_h, out_w, channels]), resample)
    return tf.ensure_shape(out, [None, out_h, out_w, channels])


def build_serving_fn(encoder, projector, preprocess):
    """``images`` (uint8 ``[B, h, w, C]``) → ``{"features", "embedding"}``, inference mode."""
    import tensorflow as tf
    config = preprocess.get_config()
    size = tuple(config["size"])
    crop_fraction = float(config.get("crop_fraction", 1.0))
    antialias = bool(config.get("antialias", True))
    input_scale = float(config.get("input_scale", 255.0))
    # Scaling happens in resample_to (before resampling, as in EvalPreprocess): normalise only.
    normalise = type(preprocess).from_config({**config, "input_scale": 1.0})
    channels = int(encoder.input_shape[-1])

    def serve(images):
        # The signature's TensorSpec is not enforced at run time (a loaded signature fed [B, H, W, 3]
        # or [H, W, C] runs on); EnsureShape is, with "Shape of tensor images [..] is not compatible
        # with expected shape [?,?,?,C]". Static-shape asserts would be constant-folded away.
        images = tf.ensure_shape(images, [None, None, None, channels])
        x = normalise(resample_to(images, size, crop_fraction, antialias, input_scale))
        features = encoder(x, training=False)
        embedding = projector(features, training=False)
        # float32 whatever the layers' policy (a mixed-precision run saves mixed_* layers).
        return {"features": tf.cast(features, tf.float32), "embedding": tf.cast(embedding, tf.float32)}

    return serve


def write_saved_model(path, encoder, projector, preprocess):
    """Writes the SavedModel of ``encoder`` + ``projector`` to ``path``: one ``serving_default``
    signature (:func:`build_serving_fn`) taking uint8 images of the encoder's channels."""
    import keras
    import tensorflow as tf

    channels = int(encoder.input_shape[-1])
    archive = keras.export.ExportArchive()
    archive.track(encoder)
    archive.track(projector)
    archive.add_endpoint(SIGNATURE, build_serving_fn(encoder, projector, preprocess),
                         input_signature=[tf.TensorSpec([None, None, None, channels], tf.uint8, name=INPUT_NAME)])
    archive.write_out(path, verbose=False)


def load_run(run_dir, force=False):
    """``(encoder, projector, EvalPreprocess, dataset.json dict)`` of a run folder, checked
    (channels, feature size) by :class:`uniclr_tf.training.runs.RunFolder`
    (:func:`uniclr_tf.evaluation.run.load_run` of the files an export reads)."""
    from uniclr_tf.evaluation.run import load_run as load
    check_run_dir(run_dir, force=force)  # the export checks: a collapsed run is refused unless forced
    run = load(run_dir, require_labels=False, require=RUN_FILES, projector=True)
    return run.encoder, run.projector, run.folder.eval_preprocess(), run.dataset


def export_run(run_dir, out_dir, version=None, overwrite=False, force=False):
    """Exports the run folder ``run_dir`` to ``out_dir``; returns the ``export.json`` dict.

    Writes the SavedModel to ``out_dir`` (or ``out_dir/<version>`` when ``version`` is given, the
    layout TF Serving needs), ``out_dir/backbone.keras`` and ``out_dir/export.json``.
    ``out_dir`` (``out_dir/<version>`` with ``version``) must be missing or empty unless
    ``overwrite``, which replaces it entirely; it is written into a temporary sibling folder and
    renamed into place at the end (see the module docstring).
    """
    folder = check_run_dir(run_dir, force=force)
    if version is not None and (not isinstance(version, int) or version < 1):
        raise ValueError(f"version must be a positive int (TF Serving's version folder); received {version!r}")
    remove_dead_temporaries(out_dir)
    if version is not None and not overwrite:
        finished = _finish_interrupted(run_dir, out_dir, version)
        if finished is not None:
            return finished
    check_export_target(out_dir, version, overwrite, run_dir)  # before the slow work
    require_tensorflow_backend()
    import keras
    import tensorflow as tf

    config = folder.config if folder.has(CONFIG_FILE) else {}  # optional (metadata); checked before the slow work
    encoder, projector, preprocess, info = load_run(run_dir, force=force)

    saved_model_dir = out_dir if version is None else os.path.join(out_dir, str(version))
    meta = _export_meta(run_dir, out_dir, saved_model_dir, version, encoder, projector, preprocess,
                        info, config, keras.__version__, tf.__version__)
    with staging_folder(saved_model_dir) as (staging, dest), _disk_errors(saved_model_dir):
        write_saved_model(staging, encoder, projector, preprocess)
        if version is None:  # the whole export is this folder
            encoder.save(os.path.join(staging, BACKBONE_FILE))
            atomic_write_json(os.path.join(staging, EXPORT_JSON), meta)
        else:  # the version folder says what it is (a killed export is finished from it)
            atomic_write_json(os.path.join(staging, EXPORT_JSON), {**meta, "saved_model_dir": "."})
        check_export_target(out_dir, version, overwrite)  # still free (nothing appeared meanwhile)
        replace_dir(staging, dest)
    if version is not None:  # the latest export's metadata beside the version folders
        atomic_save(os.path.join(out_dir, BACKBONE_FILE), lambda tmp: encoder.save(tmp))
        atomic_write_json(os.path.join(out_dir, EXPORT_JSON), meta)
    return meta


def _finish_interrupted(run_dir, out_dir, version):
    """The ``export.json`` dict after finishing an export of ``run_dir`` into ``out_dir/<version>``
    that was killed after its version folder appeared but before ``backbone.keras`` and
    ``export.json`` beside it were replaced (None: there is none to finish)."""
    folder = os.path.join(out_dir, str(version))
    inner = _read_meta(os.path.join(folder, EXPORT_JSON))
    if (inner is None or not os.path.isfile(os.path.join(folder, SAVED_MODEL_FILE))
            or inner.get("source_run") != os.path.abspath(run_dir) or inner.get("version") != version):
        return None
    newer, _ = _newer_version(out_dir, _read_meta(os.path.join(out_dir, EXPORT_JSON)))
    if os.path.normpath(newer or "") != os.path.normpath(folder) and os.path.isfile(os.path.join(out_dir,
                                                                                                 BACKBONE_FILE)):
        return None
    require_tensorflow_backend()
    encoder, _, _, _ = load_run(run_dir)
    meta = {**inner, "saved_model_dir": os.path.relpath(folder, out_dir)}
    atomic_save(os.path.join(out_dir, BACKBONE_FILE), lambda tmp: encoder.save(tmp))
    atomic_write_json(os.path.join(out_dir, EXPORT_JSON), meta)
    return {**meta, "finished_interrupted": True}


@contextlib.contextmanager
def _disk_errors(path):
    """TensorFlow's file errors while writing ``path`` as the ``OSError`` they are (a full disk:
    ``ResourceExhaustedError``), so that callers say them in one line like any other failed write."""
    import tensorflow as tf
    try:
        yield
    except tf.errors.OpError as e:
        text = _first_line(e.message)
        if isinstance(e, tf.errors.ResourceExhaustedError) or "space left" in text.lower():
            raise OSError(errno.ENOSPC, "No space left on device", path) from None
        if isinstance(e, tf.errors.PermissionDeniedError):
            raise OSError(errno.EACCES, "Permission denied", path) from None
        raise


def _first_line(text):
    text = str(text).strip()
    return text.splitlines()[0] if text else ""


def _export_meta(run_dir, out_dir, saved_model_dir, version, encoder, projector, preprocess, info, config,
                 keras_version, tf_version):
    """The ``export.json`` dict."""
    height, width, channels = info["image_shape"]
    feat_dim, emb_dim = int(encoder.output_shape[-1]), int(projector.output_shape[-1])
    return {
        "format": "tf_saved_model",
        "saved_model_dir": os.path.relpath(saved_model_dir, out_dir),
        "version": version,
        "signature": SIGNATURE,
        "inputs": {INPUT_NAME: {"dtype": "uint8", "shape": [None, None, None, channels],
                                "note": "any height/width; resampled to image_size inside the model"}},
        "outputs": {"features": {"dtype": "float32", "shape": [None, feat_dim]},
                    "embedding": {"dtype": "float32", "shape": [None, emb_dim]}},
        "feature_dim": feat_dim,
        "embedding_dim": emb_dim,
        "image_size": [height, width],
        "channels": channels,
        "mean": [float(v) for v in info["mean"]],
        "std": [float(v) for v in info["std"]],
        "preprocess": preprocess.get_config(),
        "backbone": BACKBONE_FILE,
        "backbone_input": "float32 [batch, height, width, C] already preprocessed (EvalPreprocess)",
        "source_run": os.path.abspath(run_dir),
        "dataset": info.get("dataset"),
        "encoder": config.get("encoder"),
        "objective": config.get("objective", config.get("method")),
        "keras_version": keras_version,
        "tensorflow_version": tf_version,
        "exported_at": time.time(),
    }


# --------------------------------------------------------------------------------------------
# Check: reload the SavedModel and compare with the Keras models of the run
# --------------------------------------------------------------------------------------------


def check_export(export_dir, run_dir, num_images=8, seed=0, tolerance=DEFAULT_TOLERANCE, force=False):
    """Runs the reloaded SavedModel and the run's Keras models on the same uint8 images.

    Compared (max abs difference, each with its limit):

    * ``backbone.keras/features``: the reloaded backbone vs ``encoder.keras``, the same ops run the
      same way on both sides (bit-exact in practice), limit ``tolerance``.
    * ``train_size/*``: ``num_images`` random images of the training size, SavedModel vs
      ``EvalPreprocess`` + ``encoder.keras`` + ``projector.keras``; ``other_size/*``: 3 images of
      another, non-square size (resampled inside the model); and ``alone_vs_batch/features``: the
      first image alone vs in its batch. Float32 rounding differs legitimately between the traced
      graph and eager Keras (Grappler rewrites a division by a constant into a multiplication by its
      reciprocal, and a ResNet-18's batch norms once their statistics are away from their initial
      values: 1e-5 on the features of size ~19 of a trained run) and between batch sizes, by about
      1e-7 to 1e-6 relative, so the limit is
      ``tolerance * max(1, largest |output|)``.

    Returns ``{"saved_model_dir", "checks": {name: (diff, limit)}, "ok", "max_abs_diff"}``.
    """
    import keras
    import tensorflow as tf

    saved_model_dir = find_saved_model(export_dir)
    encoder, projector, preprocess, info = load_run(run_dir, force=force)
    height, width, channels = info["image_shape"]
    try:
        loaded = tf.saved_model.load(saved_model_dir)
    except Exception as e:  # a missing variables/ folder, a damaged file: say which, in one line
        raise ValueError(f"{saved_model_dir}: cannot load the SavedModel ({type(e).__name__}: "
                         f"{_first_line(getattr(e, 'message', e))})") from None
    if SIGNATURE not in loaded.signatures:
        raise ValueError(f"{saved_model_dir} has no {SIGNATURE!r} signature; it has {list(loaded.signatures)}")
    serve = loaded.signatures[SIGNATURE]

    def keras_outputs(images):
        features = encoder(preprocess(images), training=False)
        out = {"features": features, "embedding": projector(features, training=False)}
        return {k: keras.ops.convert_to_numpy(v).astype(np.float32) for k, v in out.items()}

    def served(images):
        return {k: np.asarray(v) for k, v in serve(**{INPUT_NAME: tf.constant(images)}).items()}

    def max_abs(a, b):
        return float(np.max(np.abs(a - b)))

    rng = np.random.default_rng(seed)
    train = rng.integers(0, 256, (num_images, height, width, channels), dtype=np.uint8)
    other = rng.integers(0, 256, (3, height + 9, width + 3, channels), dtype=np.uint8)
    got, want = served(train), keras_outputs(train)
    got_other, want_other = served(other), keras_outputs(other)
    scale = max(1.0, *(float(np.max(np.abs(v))) for v in (*want.values(), *want_other.values())))
    checks = {}
    for key in OUTPUT_NAMES:
        checks[f"train_size/{key}"] = (max_abs(got[key], want[key]), tolerance * scale)
    backbone_path = os.path.join(export_dir, BACKBONE_FILE)
    if os.path.isfile(backbone_path):
        backbone = keras.saving.load_model(backbone_path, compile=False)
        feats = keras.ops.convert_to_numpy(backbone(preprocess(train), training=False)).astype(np.float32)
        checks["backbone.keras/features"] = (max_abs(feats, want["features"]), tolerance)
    for key in OUTPUT_NAMES:
        checks[f"other_size/{key}"] = (max_abs(got_other[key], want_other[key]), tolerance * scale)
    checks["alone_vs_batch/features"] = (max_abs(served(train[:1])["features"], got["features"][:1]), tolerance * scale)
    return {"saved_model_dir": saved_model_dir, "checks": checks,
            "ok": all(diff <= limit for diff, limit in checks.values()),
            "max_abs_diff": max(diff for diff, _ in checks.values())}


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ExportConfig:
    """Every setting of one ``python -m uniclr_tf.export`` invocation. Each field is a flag of the same
    name, declared with its help (:func:`uniclr_tf.config.fields.flag`); the order is ``--help``'s
    (:data:`HELP_GROUPS`)."""

    run_dir: str = unset(str, "Run folder written by uniclr_tf.train (encoder.keras, projector.keras, "
                              "dataset.json).")
    out: str = unset(str, "Export folder (SavedModel, backbone.keras, export.json); must be missing or empty "
                          "unless --overwrite.")
    version: int = flag(0, "Write the SavedModel into <out>/<version> (TF Serving's numbered layout); 0 writes it "
                           "into <out> itself.")
    overwrite: bool = flag(False, "Replace a non-empty --out (with --version: a non-empty <out>/<version>) "
                                  "entirely; without it such a folder is refused.")
    force: bool = flag(False, "Export a run whose metrics.json says it collapsed (refused otherwise).")
    check: str = unset(str, "Instead of exporting: reload the export folder in this process and compare it with "
                            "the Keras models of --run_dir.")
    num_check_images: int = flag(8, "Random uint8 images of the training size used by --check.")
    tolerance: float = flag(DEFAULT_TOLERANCE, "--check fails above this max abs difference, times max(1, largest "
                                               "|output|) where float32 rounding legitimately differs (SavedModel "
                                               "graph vs eager Keras, resampled sizes, image alone vs batch); "
                                               "backbone.keras must match within it unscaled.")

    def __post_init__(self):
        check_field(self, bool(self.run_dir), "run_dir", "the run folder written by uniclr_tf.train")
        check_field(self, bool(self.out) or bool(self.check), "out",
                    "the export folder to write (or --check=DIR to verify an export)")
        check_field(self, not (self.out and self.check), "check",
                    "either --out=DIR (export) or --check=DIR (verify an export), not both")
        check_field(self, self.version >= 0, "version",
                    "an integer >= 0 (TF Serving's version folder; 0: the SavedModel in --out itself)")
        check_field(self, self.num_check_images >= 1, "num_check_images", "an integer >= 1")


#: ``--help``'s groups: ``(title, first field)`` (:func:`uniclr_tf.config.flagutil.group_fields`).
HELP_GROUPS = [("export (--out)", "run_dir"), ("verify an export (--check)", "check")]


def define_flags(flag_values=None):
    """One flag per ``ExportConfig`` field, same name, same default, the help next to the field
    (defined when the command runs, not on import)."""
    from uniclr_tf.config import flagutil
    flagutil.define_flags(ExportConfig, flag_values=flag_values)


def config_from_flags(flag_values=None) -> ExportConfig:
    from uniclr_tf.config import flagutil
    return flagutil.config_from_flags(ExportConfig, flag_values)


def run(cfg: ExportConfig):
    """Exports (``--out``) or checks an export (``--check``) as ``cfg`` says and prints the outcome;
    a refused run folder or export folder, or a failed write, stops with one ``error:`` line, a
    failed check with exit code 1."""
    try:
        check_run_dir(cfg.run_dir, force=cfg.force)
        if cfg.check:
            find_saved_model(cfg.check)
            result = check_export(cfg.check, cfg.run_dir, num_images=cfg.num_check_images, tolerance=cfg.tolerance,
                                  force=cfg.force)
            for name, (diff, limit) in result["checks"].items():
                print(f"max abs diff {name}: {diff:.3g} (limit {limit:.3g})")
            failed = [name for name, (diff, limit) in result["checks"].items() if diff > limit]
            print(f"{'OK' if result['ok'] else 'FAIL'}: SavedModel {result['saved_model_dir']} vs Keras models of "
                  f"{cfg.run_dir}: max abs diff {result['max_abs_diff']:.3g}"
                  + (f"; over the limit: {', '.join(failed)}" if failed else ""))
            if not result["ok"]:
                sys.exit(1)
        else:
            meta = export_run(cfg.run_dir, cfg.out, version=cfg.version or None, overwrite=cfg.overwrite,
                              force=cfg.force)
            where = os.path.join(cfg.out, meta["saved_model_dir"]) if cfg.version else cfg.out
            if meta.get("finished_interrupted"):
                print(f"finished the interrupted export of version {cfg.version}: {where} was complete; "
                      f"{os.path.join(cfg.out, BACKBONE_FILE)} and {os.path.join(cfg.out, EXPORT_JSON)} now "
                      "describe it")
            c, (h, w) = meta["channels"], meta["image_size"]
            print(f"SavedModel: {where} ({SIGNATURE}: {INPUT_NAME} uint8 [batch, height, width, {c}] "
                  f"(resampled to {h}x{w}) -> features [batch, {meta['feature_dim']}], embedding "
                  f"[batch, {meta['embedding_dim']}])")
            print(f"backbone for fine-tuning: {os.path.join(cfg.out, BACKBONE_FILE)}; "
                  f"metadata: {os.path.join(cfg.out, EXPORT_JSON)}")
    except (OSError, ValueError, RuntimeError) as e:
        sys.exit(f"error: {_first_line(e)}")


def main(argv):
    from absl import logging

    from uniclr_tf.config import flagutil
    logging.set_verbosity(logging.WARNING)
    run(flagutil.config_or_exit(ExportConfig))


def entry_point():
    """The ``uniclr-export`` console script (pyproject.toml): what ``python -m uniclr_tf.export`` does."""
    from uniclr_tf.config import flagutil
    define_flags()
    flagutil.run_cli(__name__, __doc__, main, groups=flagutil.group_fields(ExportConfig, HELP_GROUPS))


if __name__ == "__main__":
    entry_point()
