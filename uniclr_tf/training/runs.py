"""The run folder: reading what ``uniclr_tf.train`` wrote, and writing files atomically.

A run folder (``<--run_dir>/<--run_name>``) holds, among others::

    config.json      the pretraining settings (written when the run starts)
    dataset.json     image shape, classes, normalisation statistics (written once the data is loaded)
    encoder.keras    the backbone: normalised float images [B, H, W, C] -> features [B, F]
    projector.keras  the projection head: features [B, F] -> embedding [B, D]
                     (both saved when training finishes; a run stopped earlier has neither)

:class:`RunFolder` reads them for every consumer (``linear_eval``, ``export``) with ONE set of
errors: :class:`RunFolderError`, a ``ValueError`` whose one-line message names the folder and the
missing or unreadable file, and says what writes that file.

``config.json`` is returned as a plain dict: readers must not depend on the exact fields of the
current ``TrainConfig`` (a run written by an older or newer version still reads), e.g. the
objective may be stored as ``objective`` or ``method`` (:attr:`RunFolder.objective` takes either).

:func:`atomic_write_text`, :func:`atomic_write_json` and :func:`atomic_save` write a file so that
a reader (or a crash) sees either the previous file or the complete new one, never a torn one.

Only the standard library and NumPy are imported at module level; Keras is imported when a
model is loaded.
"""

import itertools
import json
import math
import os
import re
import shutil
import socket
import threading
import time

import numpy as np

CONFIG_FILE = "config.json"
#: Written first into every run folder: what ``--overwrite`` recognises as a run of this tool.
MARKER_FILE = ".uniclr_run"
#: Held (``fcntl.flock``) by the one process that trains into the folder; it names that process.
LOCK_FILE = ".lock"
METRICS_FILE = "metrics.json"
DATASET_FILE = "dataset.json"
ENCODER_FILE = "encoder.keras"
PROJECTOR_FILE = "projector.keras"

#: What writes each file of a run folder (said in every error about the file).
PRODUCERS = {
    CONFIG_FILE: "uniclr_tf.train writes it when the run starts",
    DATASET_FILE: "uniclr_tf.train writes it when the run starts, once the data is loaded",
    ENCODER_FILE: ("uniclr_tf.train saves it when training finishes or stops on a signal / --stop_after_steps; "
                   "a killed run has none, but its last backup is in backup/: rerun its training command to "
                   "resume and finish it"),
    PROJECTOR_FILE: ("uniclr_tf.train saves it when training finishes or stops on a signal / --stop_after_steps; "
                     "a killed run has none, but its last backup is in backup/: rerun its training command to "
                     "resume and finish it"),
}


class RunFolderError(ValueError):
    """A run folder, or one of its files, that cannot be used; the message is one line naming
    the folder and the file."""


def _first_line(error):
    text = str(error).strip()
    detail = text.splitlines()[0] if text else ""
    return f"{type(error).__name__}: {detail}" if detail else type(error).__name__


class RunFolder:
    """Read access to a run folder written by ``uniclr_tf.train``.

    Args:
      path: the folder.
      require: file names that must exist (checked at once, all reported together).

    Raises:
      RunFolderError: no such folder, or a required file is missing.

    The JSON files are read (and checked) on first access and cached; models are loaded anew by
    each :meth:`load_encoder` / :meth:`load_projector` call.
    """

    def __init__(self, path, require=()):
        if not path:
            raise RunFolderError("no run folder given (a folder written by uniclr_tf.train, "
                                 "<--run_dir>/<--run_name>)")
        self.path = os.fspath(path)
        if not os.path.isdir(self.path):
            raise RunFolderError(f"run folder {self.path!r} does not exist (uniclr_tf.train creates one "
                                 f"per run: <--run_dir>/<--run_name>)")
        self._config = None
        self._dataset = None
        self.require(*require)

    def __repr__(self):
        return f"RunFolder({self.path!r})"

    # --- files ---------------------------------------------------------------------------------

    def file(self, name):
        """The path of ``name`` inside the folder (whether or not it exists)."""
        return os.path.join(self.path, name)

    def has(self, name):
        return os.path.isfile(self.file(name))

    def require(self, *names):
        """Raises :class:`RunFolderError` naming every file of ``names`` that is missing."""
        missing = [n for n in names if not self.has(n)]
        if missing and self._status() == "diverged":  # rerunning its command would diverge again
            raise RunFolderError(f"run folder {self.path!r}: missing {', '.join(missing)}: the run diverged "
                                 f"({METRICS_FILE}); train it again with a changed flag and --overwrite")
        if missing:
            why = "; ".join(f"{n}: {PRODUCERS[n]}" for n in missing if n in PRODUCERS)
            raise RunFolderError(f"run folder {self.path!r}: missing {', '.join(missing)}"
                                 + (f" ({why})" if why else " (expected a run folder written by uniclr_tf.train)"))

    def _status(self):
        """``metrics.json``'s status, or None when it is missing or unreadable."""
        try:
            with open(self.file(METRICS_FILE)) as f:
                return json.load(f).get("status")
        except (OSError, ValueError, AttributeError):
            return None

    def error(self, name, problem):
        """A :class:`RunFolderError` about file ``name``: ``problem``, plus what writes the file."""
        producer = PRODUCERS.get(name)
        return RunFolderError(f"run folder {self.path!r}: {name} {problem}" + (f" ({producer})" if producer else ""))

    def read_json(self, name):
        """The JSON file ``name`` of the folder, which must hold a JSON object (a dict)."""
        self.require(name)
        try:
            with open(self.file(name)) as f:
                value = json.load(f)
        except (OSError, ValueError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            raise self.error(name, f"is unreadable or corrupt ({_first_line(e)})") from None
        if not isinstance(value, dict):
            raise self.error(name, f"is corrupt: expected a JSON object, found {type(value).__name__}")
        return value

    # --- config.json ----------------------------------------------------------------------------

    @property
    def config(self) -> dict:
        """``config.json`` as a dict (the pretraining settings; no field is assumed)."""
        if self._config is None:
            self._config = self.read_json(CONFIG_FILE)
        return self._config

    @property
    def objective(self):
        """The pretraining objective: ``config.json``'s ``objective`` or ``method`` entry (None if neither)."""
        config = self.config
        return config.get("objective", config.get("method"))

    # --- dataset.json ---------------------------------------------------------------------------

    @property
    def dataset(self) -> dict:
        """``dataset.json`` as a dict, checked: ``image_shape`` ``[H, W, C]`` of positive ints and
        per-channel ``mean``/``std`` lists (1 or C numbers)."""
        if self._dataset is None:
            info = self.read_json(DATASET_FILE)
            shape = info.get("image_shape")
            if not (isinstance(shape, list) and len(shape) == 3
                    and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)):
                raise self.error(DATASET_FILE, f"is corrupt: image_shape must be [H, W, C] of positive ints; "
                                               f"found {shape!r}")
            for key in ("mean", "std"):
                value = info.get(key)
                if not (isinstance(value, list) and len(value) in (1, shape[-1])
                        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
                    raise self.error(DATASET_FILE, f"is corrupt: {key} must be a list of 1 or {shape[-1]} "
                                                   f"numbers; found {value!r}")
            if any(not s > 0 for s in info["std"]):
                raise self.error(DATASET_FILE, f"is corrupt: std must be positive; found {info['std']!r}")
            self._dataset = info
        return self._dataset

    @property
    def image_shape(self):
        return tuple(int(d) for d in self.dataset["image_shape"])

    @property
    def num_classes(self):
        """Number of classes, or None for an unlabelled dataset."""
        return self.dataset.get("num_classes") or None

    @property
    def mean(self):
        return tuple(float(m) for m in self.dataset["mean"])

    @property
    def std(self):
        return tuple(float(s) for s in self.dataset["std"])

    @property
    def dataset_spec(self):
        """The dataset spec the run trained on (``config.json``, else ``dataset.json``), or None."""
        spec = self.config.get("dataset") if self.has(CONFIG_FILE) else None
        return spec or self.dataset.get("dataset")

    def eval_preprocess(self):
        """The run's :class:`uniclr_tf.augment.EvalPreprocess` (training size, its mean/std)."""
        from uniclr_tf.augment import EvalPreprocess

        height, width, _ = self.image_shape
        return EvalPreprocess((height, width), mean=self.mean, std=self.std)

    # --- models ---------------------------------------------------------------------------------

    def _load_model(self, name, what):
        self.require(name)
        import keras

        # Registers the custom layers a run's models may hold (GroupBatchNormalization, saved by
        # --batch_norm=per_device runs): without it their files do not load in a process that has not
        # imported the module (export, linear_eval, release).
        import uniclr_tf.nets.encoders  # noqa: F401

        try:
            return keras.saving.load_model(self.file(name), compile=False)
        except Exception as e:  # a corrupt, truncated or foreign file: say which, in one line
            raise self.error(name, f"cannot be loaded as the {what} ({_first_line(e)})") from None

    def load_encoder(self):
        """``encoder.keras`` (not compiled), checked to map ``[B, H, W, C]`` images to ``[B, F]``
        features with the channel count of ``dataset.json`` (when that file exists)."""
        encoder = self._load_model(ENCODER_FILE, "encoder")
        if len(encoder.output_shape) != 2:
            raise self.error(ENCODER_FILE, f"is not an encoder with features [B, F]: its output shape is "
                                           f"{encoder.output_shape}")
        if self.has(DATASET_FILE) and len(encoder.input_shape) == 4:
            channels = self.image_shape[-1]
            if encoder.input_shape[-1] not in (None, channels):
                raise self.error(ENCODER_FILE, f"takes {encoder.input_shape[-1]} channels but dataset.json says "
                                               f"image_shape {list(self.image_shape)}")
        return encoder

    def load_projector(self, feature_dim=None):
        """``projector.keras`` (not compiled); with ``feature_dim``, checked to take features of that size."""
        projector = self._load_model(PROJECTOR_FILE, "projector")
        if feature_dim is not None and projector.input_shape[-1] != int(feature_dim):
            raise self.error(PROJECTOR_FILE, f"takes {projector.input_shape[-1]}-d inputs but the encoder gives "
                                             f"{int(feature_dim)}-d features")
        return projector


# ---------------------------------------------------------------------------------------------
# Where a run lives, whose it is, and who holds it


def run_folder_path(run_dir, run_name):
    """``<run_dir>/<run_name>``, refusing a name that would leave ``run_dir``: ``..``, an absolute
    path, a path with a separator, or a symbolic link (so nothing outside ``run_dir`` is ever
    written to, or removed by ``--overwrite``)."""
    if (not run_name or run_name in (".", "..") or os.path.isabs(run_name)
            or "/" in run_name or (os.altsep and os.altsep in run_name) or "\0" in run_name):
        raise RunFolderError(f"--run_name={run_name}: expected a plain folder name inside --run_dir "
                             "(no '/', '..' or absolute path)")
    path = os.path.join(run_dir, run_name)
    if os.path.islink(path):
        raise RunFolderError(f"--run_name={run_name}: {path} is a symbolic link; a run folder must be a real "
                             "folder inside --run_dir")
    return path


def is_run_folder(path):
    """Whether ``path`` holds a run of this tool: its marker file, or (runs written before the marker)
    both ``config.json`` and ``flags.txt``."""
    has = lambda name: os.path.isfile(os.path.join(path, name))  # noqa: E731
    return has(MARKER_FILE) or (has(CONFIG_FILE) and has("flags.txt"))


def clear_run_folder(path):
    """Empties the run folder ``path`` for ``--overwrite`` (its lock file stays: it is held), refusing
    (one line) a folder that holds no run of this tool."""
    if not is_run_folder(path):
        raise RunFolderError(f"--overwrite: {path} holds no run of uniclr_tf.train ({MARKER_FILE} or config.json + "
                             "flags.txt missing); refusing to delete it: remove it yourself or choose another "
                             "--run_name")
    for name in os.listdir(path):
        if name == LOCK_FILE:
            continue
        entry = os.path.join(path, name)
        if os.path.isdir(entry) and not os.path.islink(entry):
            shutil.rmtree(entry)
        else:
            os.remove(entry)


def mark_run_folder(path):
    """Writes the marker that makes ``path`` a run folder of this tool (for ``--overwrite``)."""
    if not os.path.isfile(os.path.join(path, MARKER_FILE)):
        atomic_write_text(os.path.join(path, MARKER_FILE), "uniclr_tf.train run folder\n")


class RunLock:
    """An exclusive ``fcntl.flock`` on ``<folder>/.lock``: one process trains into a run folder at a
    time. The kernel drops the lock when its process ends, however it ends (``kill -9`` included), so
    a crash never leaves it stuck. The file names its holder (pid, host, start time) for the refusal
    message. ``release`` (or leaving the ``with`` block) unlocks; the file stays."""

    def __init__(self, folder):
        import fcntl
        self.path = os.path.join(folder, LOCK_FILE)
        os.makedirs(folder, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = self._holder()
            os.close(self._fd)
            self._fd = None
            raise RunFolderError(f"run folder {folder!r} is in use by {holder} ({self.path}); wait for it to end "
                                 "or stop it, or choose another --run_name") from None
        os.ftruncate(self._fd, 0)
        os.write(self._fd, (f"pid {os.getpid()} on {socket.gethostname()}, "
                            f"since {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n").encode())

    def _holder(self):
        try:
            text = os.pread(self._fd, 512, 0).decode(errors="replace").strip()
        except OSError:
            text = ""
        return f"another process ({text})" if text else "another process"

    def release(self):
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
        return False


# ---------------------------------------------------------------------------------------------
# Atomic writes


_COUNTER = itertools.count()
_COUNTER_LOCK = threading.Lock()


def _temp_path(path):
    """``<folder>/<stem>.tmp-<pid>-<n><suffix>``: same folder (so ``os.replace`` is atomic) and the
    same suffix (Keras checks for ``.keras`` / ``.weights.h5``)."""
    folder, base = os.path.split(os.path.abspath(path))
    if base.endswith(".weights.h5"):
        stem, suffix = base[:-len(".weights.h5")], ".weights.h5"
    else:
        stem, suffix = os.path.splitext(base)
    with _COUNTER_LOCK:
        n = next(_COUNTER)
    return os.path.join(folder, f"{stem}.tmp-{os.getpid()}-{n}{suffix}")


_TEMP_NAME = re.compile(r"\.tmp-\d+-\d+")  # what _temp_path names
#: The temporary folders of a folder write (``export.staging_folder``: ``.NAME.tmp-<12 hex>``; and the
#: ``.NAME.old-<12 hex>`` that ``export.replace_dir`` moves an old folder to).
_TEMP_DIR_NAME = re.compile(r"^\..+\.(tmp|old)-[0-9a-f]{12}$")


def remove_temporaries(folder):
    """Removes the temporary files and folders that writes of an earlier process, killed mid-write,
    left in ``folder`` and below (a resumed run's folder, before anything writes to it); returns
    their paths."""
    removed = []
    for root, dirs, files in os.walk(folder):
        for name in list(dirs):
            if _TEMP_DIR_NAME.match(name):
                dirs.remove(name)
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)
                removed.append(os.path.join(root, name))
        for name in files:
            if _TEMP_NAME.search(name):
                path = os.path.join(root, name)
                try:
                    os.remove(path)
                    removed.append(path)
                except OSError:
                    pass
    return removed


def _fsync_path(path, directory=False):
    try:
        fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0))
    except OSError:
        return  # e.g. folders cannot be opened on some platforms: best effort
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_save(path, save_fn):
    """Writes ``path`` through ``save_fn(tmp_path)``, then moves the result into place atomically.

    ``save_fn`` writes the complete file to the temporary path it is given (e.g.
    ``lambda tmp: model.save(tmp)``), which lies in the same folder and ends with the same suffix
    (``.keras``, ``.weights.h5``, ...). The temporary file is flushed to disk and renamed over
    ``path`` with ``os.replace``; if ``save_fn`` raises, it is removed and ``path`` is untouched.
    Creates the folder if needed. Returns ``path``. An ``OSError`` (e.g. a full disk) is raised
    again with ``path`` as its file name.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = _temp_path(path)
    try:
        save_fn(tmp)
        if not os.path.isfile(tmp):
            raise RuntimeError(f"atomic_save: the save function did not write a file to {tmp}")
        _fsync_path(tmp)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.remove(tmp)
        except OSError:
            pass
        if isinstance(e, OSError) and e.errno is not None:  # name the file the caller asked for
            raise OSError(e.errno, e.strerror, path) from e
        raise
    _fsync_path(folder, directory=True)
    return path


def atomic_write_text(path, text):
    """Writes the string ``text`` to ``path`` atomically (see :func:`atomic_save`)."""
    def write(tmp):
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())

    return atomic_save(path, write)


def to_strict_json(value):
    """``value`` with NaN/±inf floats replaced by None, tuples by lists, NumPy scalars/arrays by
    Python numbers/lists: something ``json.dumps(..., allow_nan=False)`` accepts."""
    if isinstance(value, dict):
        return {k: to_strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_strict_json(v) for v in value]
    if isinstance(value, np.ndarray):
        return to_strict_json(value.tolist())
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else None
    return value


def atomic_write_json(path, obj, indent=2):
    """Writes ``obj`` as strict JSON (NaN and infinities as ``null``, never bare ``NaN``) to ``path``
    atomically. Raises ``TypeError`` (before touching ``path``) for values JSON cannot hold."""
    text = json.dumps(to_strict_json(obj), indent=indent, allow_nan=False) + "\n"
    return atomic_write_text(path, text)
