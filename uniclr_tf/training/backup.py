"""Backups, resume, interruption and divergence: what lets a training run be left running.

A run folder keeps its backup in ``backup/``::

    backup/state.json              {"epoch": completed epochs, "step": optimizer steps done,
                                    "weights": "weights-<step>.npz", "reason": ..., "time": ...}
    backup/weights-<step>.npz      the value of every variable of the model (online and target networks,
                                   BN statistics, the method's state such as MoCo's queue, the probe, the
                                   device augmenter's random state) and of the optimizer (its step counter
                                   and momenta), by variable path, so the LR and EMA schedules, functions of
                                   the step, continue where they were

Keras's ``BackupAndRestore`` writes ``save_weights`` synchronously from the live variables, at epoch
ends or every N steps, in place. Here the values are copied to the host once (consistent: between
two steps), checked for NaN, and written by a background thread, so the training step does not
wait for the disk; the write is atomic (a new file through a temporary name, then ``state.json``
replaced, then older weight files deleted), so a ``kill -9`` at any instant leaves a consistent
pair. A backup is taken at every epoch end and at step boundaries: every ``every_s`` seconds, on
SIGTERM / SIGINT, and after ``stop_after_steps`` steps of this invocation; the data stream is
deterministic given the seed and is skipped to the backed-up step on resume. The processes of a JAX
multi-process job stop on a signal at one step, agreed through the job's coordinator
(:class:`StopAgreement`), and the workers of a TensorFlow ``--strategy=multi_worker`` job through a
small all-reduce every 16 steps (:class:`CollectiveStopAgreement`): each process's step is a
collective, so a process stopping a step earlier than another would leave it waiting for ever.

Exactness of a resume: the weights, optimizer, EMA target and its schedule, the step counter, the
data order (the stream is deterministic given the seed and skipped to the backed-up step) and the
views: on the JAX backend the device augmenter's random state is a model variable and restored; the
views made in ``tf.data`` (host) are drawn from ``(seed, batch index)`` and those of a TensorFlow
train step (device, TF backend) from ``(seed, step, replica)``, statelessly, so nothing needs
restoring. The epoch-mean metrics of an epoch resumed mid-way cover the steps after the resume.
"""

import errno
import json
import math
import os
import re
import signal
import sys
import time

import keras
import numpy as np

from uniclr_tf.training import runs
from uniclr_tf.training import stop_signals

BACKUP_DIR = "backup"
STATE_FILE = "state.json"
STATE_KEY = "__state__"  # a weight file's own copy of its state (a resume without state.json)

EXIT_PAUSED = 75  # EX_TEMPFAIL: stopped on purpose (--stop_after_steps); rerun the same command to continue


class TrainingStopped(Exception):
    """Training stopped before its end, with a backup saved; ``exit_code`` says why."""

    def __init__(self, message, exit_code):
        super().__init__(message)
        self.exit_code = exit_code


class TrainingDiverged(Exception):
    """A loss term or a weight became non-finite; the last finite backup is kept."""


def state_path(run_dir):
    return os.path.join(run_dir, BACKUP_DIR, STATE_FILE)


def latest(run_dir):
    """The last intact backup's state dict, or None when the folder holds no backup at all.

    ``state.json`` is checked against its schema (:func:`check_state`: types, ranges, and the step
    its weight file is named after); the newest backup (``state.json``'s ``weights``) is checked
    (every array's CRC) and must agree with the state its weight file records of itself; when it is
    damaged the one before (``previous``) is used, with one line saying so. A missing, unreadable or
    invalid ``state.json`` beside weight files is recovered from the newest intact weight file's own
    record (one line), never taken for a fresh start. What cannot be used is a
    :class:`runs.RunFolderError` naming the file. :func:`restore` then checks the arrays against
    the model (and falls back the same way)."""
    folder = os.path.join(run_dir, BACKUP_DIR)
    path = state_path(run_dir)
    weights = _weight_files(folder)
    if not os.path.exists(path):
        return _recover_without_state(run_dir, weights) if weights else None
    where = f"run folder {run_dir!r}: {BACKUP_DIR}/{STATE_FILE}"
    try:
        with open(path) as f:
            state = json.load(f)
        check_state(state)
        own = _embedded_state(os.path.join(folder, state["weights"]))
        if own is not None and (own["epoch"], own["step"]) != (state["epoch"], state["step"]):
            raise ValueError(f"it says epoch {state['epoch']}, step {state['step']}, but {state['weights']} records "
                             f"epoch {own['epoch']}, step {own['step']}")
    except (OSError, ValueError) as e:
        recovered = _recover_without_state(run_dir, weights, f"unreadable ({e})") if weights else None
        if recovered is None:
            raise runs.RunFolderError(f"{where} is unreadable ({e}); pass --overwrite to start the run "
                                      "again") from None
        return recovered
    problem = _damage(os.path.join(folder, state["weights"]))
    if problem is None:
        return state
    previous = state.get("previous")
    if previous and _damage(os.path.join(folder, previous["weights"])) is None:
        print(f"warning: {BACKUP_DIR}/{state['weights']} is {problem}; resuming from the backup before it, "
              f"{previous['weights']} (epoch {previous['epoch'] + 1}, step {previous['step']})", flush=True)
        return {**previous, "previous": None}
    raise runs.RunFolderError(f"run folder {run_dir!r}: {BACKUP_DIR}/{state['weights']} is {problem}, and no "
                              "earlier backup is intact; pass --overwrite to start the run again")


_WEIGHTS_NAME = re.compile(r"^weights-(\d{1,18})\.npz$")
#: The most steps a state may record (more is no run of this tool: a damaged file).
MAX_STEP = 10 ** 15


def check_state(state, nested=False):
    """Raises ValueError (saying which entry) unless ``state`` is a backup state a resume can use:
    a JSON object with ``epoch`` and ``step`` integers (not booleans, not floats) in range, a
    ``weights`` file name ``weights-<step>.npz`` of that step, an optional string ``reason`` and a
    ``previous`` state of the same schema (or null)."""
    if not isinstance(state, dict):
        raise ValueError("not a JSON object")
    for key in ("epoch", "step", "weights"):
        if key not in state:
            raise ValueError(f"no {key!r} entry")
    for key in ("epoch", "step"):
        value = state[key]
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{key!r} is {value!r}, not an integer")
        if not 0 <= value <= MAX_STEP:
            raise ValueError(f"{key!r} is {value}, out of range")
    if state["epoch"] > state["step"]:
        raise ValueError(f"epoch {state['epoch']} is more than its step {state['step']}")
    match = _WEIGHTS_NAME.match(state["weights"]) if isinstance(state["weights"], str) else None
    if match is None:
        raise ValueError(f"bad 'weights' entry {state['weights']!r}")
    if int(match.group(1)) != state["step"]:
        raise ValueError(f"'weights' {state['weights']!r} is not the weight file of step {state['step']}")
    if "reason" in state and not isinstance(state["reason"], str):
        raise ValueError(f"'reason' is {state['reason']!r}, not a string")
    previous = state.get("previous")
    if previous is not None:
        if nested:
            raise ValueError("a 'previous' entry inside 'previous'")
        try:
            check_state(previous, nested=True)
        except ValueError as e:
            raise ValueError(f"'previous': {e}") from None



def check_progress(state, steps_per_epoch, total_steps):
    """Why ``state`` cannot be a backup of this run (its epoch is not its step's, or its step lies
    past the run's ``total_steps``), or None."""
    if steps_per_epoch and state["epoch"] != state["step"] // steps_per_epoch:
        return (f"records epoch {state['epoch']} at step {state['step']}, but this run's epochs are "
                f"{steps_per_epoch} steps")
    if total_steps and state["step"] > total_steps:
        return f"records step {state['step']}, past this run's {total_steps} steps"
    return None


def _damage(path):
    """Why the weight file at ``path`` cannot be restored (missing, empty, truncated, a bad CRC), or
    None when it is intact. Reads the whole file (every member's CRC is checked)."""
    import zipfile
    if not os.path.exists(path):
        return "missing"
    if os.path.getsize(path) == 0:
        return "empty (0 bytes)"
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
        if bad is not None:
            return f"damaged (bad CRC in {bad})"
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        return f"damaged ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    return None


def _embedded_state(path):
    """The state a weight file records of itself (``__state__``), or None (older files have none)."""
    try:
        with np.load(path) as data:
            if STATE_KEY not in data.files:
                return None
            state = json.loads(str(data[STATE_KEY]))
        check_state(state)
        return state
    except Exception:  # a damaged file: not usable
        return None


def _recover_without_state(run_dir, weights, why="missing"):
    """The newest intact weight file's own record when ``state.json`` is ``why`` (one line), else
    a RunFolderError naming the file."""
    for path in reversed(weights):
        state = _embedded_state(path) if _damage(path) is None else None
        if state is not None:
            print(f"warning: {BACKUP_DIR}/{STATE_FILE} is {why}; resuming from {os.path.basename(path)} (epoch "
                  f"{state['epoch'] + 1}, step {state['step']}), which records its own state", flush=True)
            return {**state, "weights": os.path.basename(path), "previous": None}
    raise runs.RunFolderError(f"run folder {run_dir!r}: {BACKUP_DIR}/{STATE_FILE} is {why} and no weight file in "
                              f"{BACKUP_DIR}/ records its own state; pass --overwrite to start the run again")


def _variables(model):
    """Everything a backup holds, in a fixed order: the model's variables and the optimizer's."""
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    return list(model.trainable_variables) + list(model.non_trainable_variables) + list(model.optimizer.variables)


def snapshot(model):
    """Every backed-up variable's value, still on the device: a copy the training steps cannot touch
    (on JAX, the next step donates the state's buffers; on TF a read, which resource variables keep
    intact under later writes). :func:`to_host` fetches it.

    On JAX the copy is one compiled call (with several processes, on this process's copy of the
    replicated values) that packs the values into flat pieces of at
    most :data:`CHUNK_BYTES` per dtype (:class:`Packed`), fetched later piece by piece: fetching
    hundreds of arrays one by one holds the GIL, and fetching one large array holds up the next epoch's
    first step, time the training thread would wait for at every epoch end."""
    variables = _variables(model)
    if keras.backend.backend() == "jax":
        import jax
        values = [v.value for v in variables]
        if jax.process_count() > 1:
            # A compiled call on the job's arrays would need every process (only this one backs up), so pack
            # this process's own copy of each: DataParallel replicates every variable, and a copy on this
            # process's device is packed and fetched as in one process, while the training goes on (fetching
            # it at once would hold up each epoch end).
            if not all(getattr(x, "is_fully_replicated", False) for x in values):  # sharded: fetch now
                return list(zip((v.path for v in variables), jax.device_get(values)))
            values = [x.addressable_data(0) for x in values]
        return Packed([v.path for v in variables], values)
    return [(v.path, v.value) for v in variables]


#: The size of a piece of a backup fetched from an accelerator at once (JAX; on a CPU a backup is
#: one piece). While a piece is being fetched, the training thread's next device work waits for it, so
#: a piece must be short next to the work queued on the device. Between two pieces the writer sleeps
#: :data:`FETCH_PAUSE_S`.
CHUNK_BYTES = 4 << 20
FETCH_PAUSE_S = 0.002


class Packed:
    """Values packed on the device (JAX): per dtype, one flat vector cut into pieces of at most
    ``chunk_bytes`` (the last one padded), and where each value lies in it."""

    def __init__(self, paths, values, chunk_bytes=None):
        self.paths = list(paths)
        self.layout = [(str(v.dtype), tuple(v.shape)) for v in values]
        groups = {}
        for i, (dtype, _) in enumerate(self.layout):
            groups.setdefault(dtype, []).append(i)
        self.groups = {d: tuple(idx) for d, idx in groups.items()}
        if chunk_bytes is None:  # on a CPU the "transfer" is a copy in memory: one piece
            chunk_bytes = CHUNK_BYTES if _platform(values) != "cpu" else 1 << 62
        self.chunk = {d: max(min(int(chunk_bytes) // np.dtype(d).itemsize, sum(self.sizes(d))), 1)
                      for d in self.groups}
        self.pieces = _packer(tuple(self.groups.items()), tuple(sorted(self.chunk.items())))(tuple(values))

    def sizes(self, dtype):
        return [int(np.prod(self.layout[i][1], dtype=np.int64)) for i in self.groups[dtype]]

    def fetch(self, pause=0.0):
        """``{dtype: flat NumPy vector}``, fetched one piece at a time, ``pause`` seconds between two."""
        import jax
        flat, fetched = {}, 0

        def get(piece):
            nonlocal fetched
            if pause and fetched:
                time.sleep(pause)  # the training thread's turn
            fetched += 1
            return np.asarray(jax.device_get(piece))

        for dtype, pieces in self.pieces.items():
            total, chunk = sum(self.sizes(dtype)), self.chunk[dtype]
            if len(pieces) == 1:  # no copy
                flat[dtype] = get(pieces[0])[:total]
                continue
            out = np.empty(len(pieces) * chunk, dtype=pieces[0].dtype)
            for k, piece in enumerate(pieces):
                out[k * chunk:(k + 1) * chunk] = get(piece)
            flat[dtype] = out[:total]
        return flat

    def unpack(self, flat):
        """``[(path, NumPy array)]`` from the fetched flat arrays (views, no copies)."""
        out = [None] * len(self.paths)
        for dtype, idx in self.groups.items():
            offset = 0
            for i, n in zip(idx, self.sizes(dtype)):
                out[i] = (self.paths[i], flat[dtype][offset:offset + n].reshape(self.layout[i][1]))
                offset += n
        return out


def _platform(values):
    try:
        return next(iter(values[0].devices())).platform
    except (AttributeError, IndexError, StopIteration):
        return "cpu"


_PACKERS = {}


def _packer(groups, chunks):
    """A jitted ``values -> {dtype: (piece, ...)}`` for one grouping (compiled once per model)."""
    key = (groups, chunks)
    if key not in _PACKERS:
        import jax
        import jax.numpy as jnp
        chunk = dict(chunks)

        def pack(values):
            out = {}
            for d, idx in groups:
                flat = jnp.concatenate([jnp.ravel(values[i]) for i in idx])
                pieces = -(-flat.shape[0] // chunk[d])
                flat = jnp.pad(flat, (0, pieces * chunk[d] - flat.shape[0])).reshape(pieces, chunk[d])
                out[d] = tuple(flat[k] for k in range(pieces))
            return out
        _PACKERS[key] = jax.jit(pack)
    return _PACKERS[key]


def to_host(values, pause=0.0):
    """A snapshot's values as ``[(path, NumPy array)]``; on JAX fetched in pieces, ``pause`` seconds
    apart (the writer thread's courtesy to the training thread)."""
    if isinstance(values, Packed):
        return values.unpack(values.fetch(pause))
    if keras.backend.backend() == "jax":
        import jax
        arrays = jax.device_get([value for _, value in values])
    else:
        arrays = [keras.ops.convert_to_numpy(value) for _, value in values]
    return [(path, np.array(array)) for (path, _), array in zip(values, arrays)]


_WEIGHT_FILE = re.compile(r"weights-\d+\.npz")


def _weight_files(folder):
    """The backups' weight files in ``folder``, oldest first (full paths): ``weights-<step>.npz`` only,
    not the temporary files a write in progress or a killed one leaves (``weights-<step>.tmp-….npz``)."""
    names = os.listdir(folder) if os.path.isdir(folder) else []
    return [os.path.join(folder, n) for n in sorted(names) if _WEIGHT_FILE.fullmatch(n)]


def write(run_dir, values, epoch, step, reason):
    """Writes a snapshot as the run's backup, atomically; returns its state dict.

    The new weight file is read back and checked before ``state.json`` names it; the backup before
    it stays on disk (``state.json``'s ``previous``) until a newer one replaces it, so a damaged
    latest file still leaves one to resume from. Older weight files are removed last."""
    folder = os.path.join(run_dir, BACKUP_DIR)
    os.makedirs(folder, exist_ok=True)
    name = f"weights-{step:09d}.npz"
    state = {"epoch": int(epoch), "step": int(step), "weights": name, "reason": reason,
             "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}

    def save_npz(tmp):
        arrays = {f"{i:05d}|{path}": value for i, (path, value) in enumerate(values)}
        with open(tmp, "wb") as f:
            np.savez(f, **arrays, **{STATE_KEY: np.array(json.dumps(state))})
        problem = _damage(tmp)
        if problem is not None:  # never name a file that does not read back
            raise OSError(errno.EIO, f"the backup read back {problem}", tmp)

    runs.atomic_save(os.path.join(folder, name), save_npz)
    previous = _previous_backup(run_dir, name)
    runs.atomic_write_json(os.path.join(folder, STATE_FILE), {**state, "previous": previous})
    keep = {name, previous["weights"] if previous else None}
    for old in _weight_files(folder):
        if os.path.basename(old) not in keep:
            os.remove(old)
    return state


def _previous_backup(run_dir, name):
    """The state (without its own ``previous``) of the backup that ``state.json`` names now, if it is
    another intact file: the one kept besides the new ``name``."""
    try:
        with open(state_path(run_dir)) as f:
            state = json.load(f)
        check_state(state)
    except (OSError, ValueError):
        return None
    if _damage(os.path.join(run_dir, BACKUP_DIR, state["weights"])) is not None:  # the one before it, if intact
        state = state.get("previous") or {}
        if "weights" not in state or _damage(os.path.join(run_dir, BACKUP_DIR, state["weights"])) is not None:
            return None
    if state["weights"] == name:
        return None
    return {k: state[k] for k in ("epoch", "step", "weights", "reason") if k in state}


def restore(model, run_dir, state, steps_per_epoch=None, total_steps=None):
    """Loads a backup into a compiled ``model`` (its optimizer is built first, so its state loads);
    returns the state it restored.

    Every array is read and checked before any is assigned: its name, shape and dtype must be those
    of the model's variable, its values finite; with ``steps_per_epoch`` / ``total_steps`` the
    state's epoch and step must fit this run (:func:`check_progress`). A backup that fails is not
    used: the one before it (``previous``) is tried, with one line saying so; when neither is usable
    a :class:`runs.RunFolderError` names both and what is wrong with each."""
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    variables = _variables(model)
    problems = []
    for candidate in (state, state.get("previous")):
        if not candidate:
            continue
        path = os.path.join(run_dir, BACKUP_DIR, candidate["weights"])
        problem = check_progress(candidate, steps_per_epoch, total_steps) or _damage(path)
        arrays = None
        if problem is None:
            arrays, problem = _read_arrays(path, variables)
        if problem is None:
            for variable, array in zip(variables, arrays):
                variable.assign(array)
            if problems:
                print(f"warning: {problems[0]}; resuming from the backup before it, {candidate['weights']} (epoch "
                      f"{candidate['epoch'] + 1}, step {candidate['step']})", flush=True)
                return {**candidate, "previous": None}
            return candidate
        problems.append(f"{BACKUP_DIR}/{candidate['weights']} {problem}")
    raise runs.RunFolderError(f"run folder {run_dir!r}: no usable backup: {'; '.join(problems)}; pass --overwrite "
                              "to start the run again")


def _read_arrays(path, variables):
    """``(arrays in the order of variables, None)``, or ``(None, why the file does not fit them)``:
    the names, shapes and dtypes of the model's variables, and finite values."""
    try:
        with np.load(path, allow_pickle=False) as data:
            keys = sorted(k for k in data.files if k != STATE_KEY)
            saved = [k.split("|", 1)[-1] for k in keys]
            if saved != [v.path for v in variables]:
                differ = next((f"{a} != {b}" for a, b in zip(saved, (v.path for v in variables)) if a != b),
                              f"{len(saved)} saved, {len(variables)} in the model")
                return None, f"does not match the model these flags build ({differ})"
            arrays = []
            for variable, key in zip(variables, keys):
                array = data[key]
                want = np.dtype(keras.backend.standardize_dtype(variable.dtype))
                if tuple(array.shape) != tuple(variable.shape):
                    return None, (f"does not fit the model: {variable.path} is saved with shape {tuple(array.shape)}, "
                                  f"the model's is {tuple(variable.shape)}")
                if array.dtype.kind not in "biuf" or not np.can_cast(array.dtype, want, "same_kind"):
                    return None, f"does not fit the model: {variable.path} is saved as {array.dtype}, not {want}"
                if array.dtype.kind == "f" and not np.all(np.isfinite(array)):
                    return None, f"is damaged: {variable.path} holds non-finite values"
                arrays.append(array)
    except Exception as e:  # noqa: BLE001 - whatever a damaged file raises: it is not used
        return None, f"cannot be read ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    return arrays, None


class Writer:
    """Fetches snapshots to the host, checks them for NaN / infinity and writes them, from a background
    thread, one at a time; an error (a full disk, non-finite weights) is raised by the next call.
    ``wait`` blocks until the last write is on disk."""

    def __init__(self, run_dir, method=None, enabled=True, last=None):
        """``last``: the state of the backup the run resumed from (None: a new run)."""
        self.run_dir, self.method, self.enabled = run_dir, method, enabled
        self._thread = None
        self._error = None
        self.last = last

    def _run(self, values, epoch, step, reason, after=None, pause=0.0):
        try:
            if after is not None:  # e.g. the history files of the backed-up epochs are on disk first
                after()
            values = to_host(values, pause)
            bad = non_finite_weights(values)
            if bad:  # never replace the last finite backup
                raise TrainingDiverged(divergence_message(epoch + 1, step, [], bad, self.method))
            self.last = write(self.run_dir, values, epoch, step, reason)
        except BaseException as e:  # re-raised in the training thread
            self._error = e

    def wait(self, raise_error=True):
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None and raise_error:
            error, self._error = self._error, None
            raise error

    @property
    def busy(self):
        """True while a background write is still going on."""
        return self._thread is not None and self._thread.is_alive()

    def submit(self, values, epoch, step, reason, background=True, after=None):
        """Writes a :func:`snapshot` as the backup of ``step`` (``epoch`` epochs complete), in the
        background unless ``background`` is False; ``after`` (a callable) runs first, in the same thread."""
        if not self.enabled:  # another process of a multi-process job writes the backups
            return
        self.wait()
        if not background:
            self._run(values, epoch, step, reason, after)
            return self.wait()
        import threading
        self._thread = threading.Thread(target=self._run, args=(values, epoch, step, reason, after, FETCH_PAUSE_S),
                                        daemon=False)
        self._thread.start()


def non_finite_weights(values):
    """Paths in a snapshot whose values hold NaN or infinity."""
    return [path for path, value in values
            if np.issubdtype(value.dtype, np.floating) and not np.all(np.isfinite(value))]


def non_finite_logs(logs):
    bad = []
    for key, value in (logs or {}).items():
        try:
            if not math.isfinite(float(np.asarray(value))):
                bad.append(key)
        except (TypeError, ValueError):
            continue
    return bad


def divergence_message(epoch, step, terms, weights=(), method=None):
    what = ", ".join(terms) if terms else "weights " + ", ".join(weights[:3]) + (" ..." if len(weights) > 3 else "")
    hint = "a learning rate too high for this batch (--base_learning_rate)"
    if method in ("simwhitening", "simtrace", "wmse"):
        hint += ", or a covariance ridge too small for the Cholesky factorisation (--eps)"
    return (f"training diverged at epoch {epoch}, step {step}: non-finite {what}. Likely cause: {hint}. "
            "The last finite backup is kept; rerun with a changed flag and --overwrite")


class Interrupted(BaseException):
    """Raised by :class:`Interrupts` where waiting for a step boundary is not possible: outside
    training (``immediate``), or on a second SIGINT. A ``BaseException``, as ``KeyboardInterrupt``,
    so that no ``except Exception`` on the way swallows it. ``exit_code`` is 128 + the signal."""

    def __init__(self, signum, twice=False):
        self.signum, self.twice = signum, twice
        self.exit_code = 128 + int(signum)
        super().__init__(signal.Signals(signum).name + (" twice" if twice else ""))


#: What a stop outside training leaves (said by the train CLI's line); set by ``train.run`` as it goes.
_phase = {"where": "before training started; nothing was saved by this invocation"}


def set_phase(where):
    """Says what a signal arriving now would leave behind (the train CLI prints it)."""
    _phase["where"] = where


def phase():
    return _phase["where"]


def _say_now(text):
    """``text`` on stdout from a signal handler. Not by ``print``: the handler runs between two bytecodes
    of the main thread, which may be inside a write to the same buffered stdout (a progress bar), and
    a second write into it raises RuntimeError ("reentrant call"). Straight to the file descriptor
    instead (text the buffer still holds comes after it); through ``print`` only where stdout has none."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        print(text, end="", flush=True)
        return
    try:
        os.write(fd, text.encode(getattr(sys.stdout, "encoding", None) or "utf-8", errors="replace"))
    except OSError:
        pass   # stdout closed: nothing to tell


class Interrupts:
    """Turns SIGTERM and SIGINT into a request to stop at the next step boundary (a second SIGINT
    raises :class:`Interrupted` at once). With ``immediate``, every such signal raises
    :class:`Interrupted` at once (outside training: loading, building, the final evaluation). A
    context manager; handlers are installed in the main thread only, and the previous ones restored.
    What counts as a second Ctrl-C, and what as the first signal delivered again:
    :mod:`uniclr_tf.training.stop_signals`."""

    def __init__(self, immediate=False):
        self.immediate = immediate
        self._previous = {}
        self._first = stop_signals.FirstSignal()

    @property
    def signal(self):
        """The first SIGTERM / SIGINT received, else None."""
        return self._first.signum

    def _handle(self, signum, frame):
        if self.immediate:
            raise Interrupted(signum)
        seen = self._first.receive(signum)
        if seen == "again":
            raise Interrupted(signum, twice=True)
        if seen is None:
            return
        _say_now(f"\nreceived {signal.Signals(signum).name}: saving a backup at the next step boundary "
                 "(Ctrl-C again to stop at once)\n")

    def __enter__(self):
        try:
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)
        except ValueError:  # not the main thread
            self._previous.clear()
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        return False


class StopAgreement:
    """One stop step for every process of a JAX multi-process job, through the coordinator's key-value
    store: the first process to want to stop (a signal at its step boundary ``k``) publishes
    ``k + margin``; every process looks the key up at every ``check_every``-th step boundary (a lookup
    costs ~0.1-0.4 ms: too much for every step) and stops at that step.

    Why ``margin`` steps are enough: a host dispatches steps without waiting for its device, but at
    most ``max_inflight_computations`` (32, XLA's GPU and CPU clients) ahead of it, and no device gets
    a step ahead of another (every step holds collectives). When the step is published, no host is
    past ``k + 33``, and each learns of it within ``check_every`` more of its own steps: ``margin`` >
    33 + ``check_every``. A process that learns of the step after passing it says so and stops at
    once (its peers would then wait for it). Polling from a background thread was tried and is not
    enough: a host dispatches several steps in the poll's interval, however short."""

    KEY = "uniclr_tf/stop_at"

    def __init__(self, client, margin=64, check_every=16, process_id=0):
        self.client, self.margin, self.check_every, self.process_id = client, int(margin), int(check_every), process_id
        self.stop_at = self.reason = None

    @classmethod
    def for_job(cls):
        """An agreement among the processes of this JAX job, or None (another backend, whose install
        may lack JAX; one process; no coordinator)."""
        if keras.backend.backend() != "jax":
            return None
        import jax
        if jax.process_count() <= 1:
            return None
        from jax._src import distributed
        client = distributed.global_state.client
        return cls(client, process_id=jax.process_index()) if client is not None else None

    def _agree(self, value):
        step, _, reason = str(value).partition(":")
        self.reason, self.stop_at = reason or "stop", int(step)

    def request(self, step, reason):
        """This process wants to stop at step boundary ``step``: publishes ``step + margin`` unless
        another process already did (then that step holds). Returns the agreed step."""
        if self.stop_at is None:
            value = f"{int(step) + self.margin}:{reason}"
            try:
                self.client.key_value_set(self.KEY, value)  # fails if another process published first
            except Exception:
                value = self.client.blocking_key_value_get(self.KEY, 60_000)
            self._agree(value)
            print(f"process {self.process_id}: the job stops at step {self.stop_at} ({self.reason}), "
                  "one step for all its processes", flush=True)
        return self.stop_at

    def due(self, step):
        """The reason to stop before step ``step`` (the agreed step is reached), else None; looks the
        agreed step up every ``check_every`` steps until there is one."""
        if self.stop_at is None and step % self.check_every == 0:
            try:
                self._agree(self.client.key_value_try_get(self.KEY))
            except Exception:  # not published (NOT_FOUND)
                return None
        if self.stop_at is None or step < self.stop_at:
            return None
        if step > self.stop_at:
            print(f"process {self.process_id}: learned of the job's stop at step {self.stop_at} only at step "
                  f"{step}; stopping now (the other processes may wait for this one)", flush=True)
        return self.reason


class CollectiveStopAgreement:
    """One stop step for every worker of a TensorFlow ``--strategy=multi_worker`` job (the interface
    of :class:`StopAgreement`). At every ``check_every``-th step boundary each worker all-reduces which
    signal it got, as a one-hot vector over signal numbers (zeros: none); a non-zero sum stops every
    worker at that boundary, with the lowest-numbered signal any worker got. The workers run their
    steps in lockstep (each step holds collectives), so they make the same checks at the same steps;
    a signal waits at most ``check_every`` steps, and a check is one small all-reduce (a sync of host
    and device). Without it, workers signalled a step apart stopped at different steps, and the
    later one waited in its step's collectives for ever."""

    def __init__(self, strategy, check_every=16, process_id=0):
        self.strategy, self.check_every, self.process_id = strategy, int(check_every), process_id
        self.stop_at = self.reason = None
        self._wanted = 0  # the signal this worker got (0: none)

    @classmethod
    def for_strategy(cls, strategy):
        """An agreement among the workers of a multi-worker ``tf.distribute`` strategy, else None."""
        if keras.backend.backend() != "tensorflow" or strategy is None:
            return None
        from uniclr_tf.training import distribute
        index, count = distribute.worker_info(strategy)
        return cls(strategy, process_id=index) if count > 1 else None

    def request(self, step, reason):
        """This worker got signal ``reason`` (its name) at step boundary ``step``: the next check
        tells every worker. Returns the agreed step (None until that check)."""
        self._wanted = int(getattr(signal.Signals, str(reason), signal.SIGTERM))
        return self.stop_at

    def _agreed_signal(self):
        import tensorflow as tf

        from uniclr_tf.training import distribute
        onehot = np.zeros(int(max(signal.Signals)) + 1, np.float32)
        if self._wanted:
            onehot[self._wanted] = 1.0
        got = np.flatnonzero(distribute.replica_sum(self.strategy)(tf.constant(onehot)).numpy() > 0)
        return int(got[0]) if got.size else 0

    def due(self, step):
        """The reason to stop before step ``step``, else None; all-reduces the workers' signals every
        ``check_every`` steps until one of them got one."""
        if self.stop_at is None and step % self.check_every == 0:
            agreed = self._agreed_signal()
            if agreed:
                self.stop_at, self.reason = int(step), signal.Signals(agreed).name
                print(f"worker {self.process_id}: the job stops at step {self.stop_at} ({self.reason}), "
                      "one step for all its workers", flush=True)
        if self.stop_at is None or step < self.stop_at:
            return None
        return self.reason


class Progress:
    """Where training is: the optimizer steps done (counted on the host, no device sync)."""

    def __init__(self, steps_per_epoch, initial_step=0):
        self.steps_per_epoch = int(steps_per_epoch)
        self.initial_step = int(initial_step)
        self.step = int(initial_step)
        self.epoch = self.step // self.steps_per_epoch


def _local_values(variable, model):
    """A Keras variable's values on this process's devices, as NumPy arrays, read without a collective:
    under a TF multi-worker strategy a tracker is a per-replica (sync-on-read) variable, whose plain
    read would all-reduce across the workers (and fails outside the step)."""
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf
        value = variable.value
        if isinstance(value, tf.distribute.DistributedValues):
            return [np.asarray(v) for v in model.distribute_strategy.experimental_local_results(value)]
    return [keras.ops.convert_to_numpy(variable.value)]


class StopTraining(Exception):
    """Raised by :class:`BackupCallback` between two steps, after its backup: stops ``fit`` there."""

    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason


class BackupCallback(keras.callbacks.Callback):
    """Backs up at every epoch end and between steps (every ``every_s`` seconds, on a signal, or after
    ``stop_after_steps`` steps of this invocation; the last two then raise :class:`StopTraining`, so no
    further step runs); stops on a non-finite loss or weight.

    It works in ``on_train_batch_begin`` (steps before this batch are done) and counts steps itself:
    a callback with ``on_train_batch_end`` makes Keras convert the step's logs to Python numbers every
    step, a device synchronisation that serialises host and device work; and on JAX, ``self.model`` copies the state back from the device, so it is touched
    only to back up.

    ``before_write``: optional, called in the training thread at each backup; the callable it returns
    (if any) runs in the writer's thread before the backup is written. The run gives
    :meth:`uniclr_tf.training.callbacks.HistoryRecorder.pending_write`, so the history of every backed-up epoch
    is on disk before the backup is.
    """

    #: Divergence inside an epoch: the epoch's running loss means are read every this many steps, at
    #: most every :attr:`check_min_s` seconds (a host fetch of a few scalars: never one per step).
    check_every_steps = 10
    check_min_s = 0.5
    lockstep_check_every_steps = 50

    def __init__(self, writer, progress, every_s=600.0, stop_after_steps=0, interrupts=None, method=None,
                 before_write=None, agreement=None):
        super().__init__()
        self.agreement = agreement  # a StopAgreement: several processes stop on a signal at one step
        self._last_check = time.monotonic()
        self.writer, self.progress = writer, progress
        self.before_write = before_write
        self.every_s, self.stop_after_steps = float(every_s), int(stop_after_steps)
        self.interrupts, self.method = interrupts, method
        self._last_save = time.monotonic()
        self._epoch_begin_step = progress.initial_step

    def on_epoch_begin(self, epoch, logs=None):
        p = self.progress
        p.epoch = epoch
        p.step = self._epoch_begin_step = max(epoch * p.steps_per_epoch, p.initial_step)

    def _backup(self, reason, background=True):
        p = self.progress
        if (not self.writer.enabled or p.step == p.initial_step
                or (self.writer.last is not None and self.writer.last["step"] == p.step)):
            return  # not this process's job; no step yet in this invocation; or this step is backed up
        try:
            values = snapshot(self.model)  # self.model synchronises the state on JAX
        except Exception as e:
            # A scheduler's SIGTERM reaches the whole process group: a compiler the snapshot's first
            # compile had started (XLA's ptxas on GPUs) dies with it, and the compile fails. The signal
            # has been delivered, so compiling again works, and the backup the signal asks for is saved.
            if self.interrupts is None or self.interrupts.signal is None:
                raise
            print(f"the backup's compile failed as the signal arrived ({str(e).splitlines()[0][:200]}); "
                  "compiling it again", flush=True)
            values = snapshot(self.model)
        completed = p.step // p.steps_per_epoch
        after = self.before_write() if self.before_write is not None else None
        self.writer.submit(values, completed, p.step, reason, background=background, after=after)
        self._last_save = time.monotonic()

    def on_train_batch_begin(self, batch, logs=None):
        p = self.progress
        p.step = self._epoch_begin_step + batch  # steps done before this batch
        reason = self._signal_stop(p.step)
        if reason is None and self.stop_after_steps and p.step - p.initial_step >= self.stop_after_steps:
            reason = "stop_after_steps"
        if reason is None:
            self._check_divergence(batch)
            if time.monotonic() - self._last_save >= self.every_s and not self.writer.busy:
                self._backup("time")
            return
        self._backup(reason, background=False)
        raise StopTraining(reason)

    def _signal_stop(self, step):
        """The signal's name when training must stop before ``step``: at once in one process; with
        several, at the step the job agreed on (:class:`StopAgreement`), whichever process was signalled."""
        signalled = self.interrupts is not None and self.interrupts.signal is not None
        if self.agreement is None:
            return signal.Signals(self.interrupts.signal).name if signalled else None
        if signalled and self.agreement.stop_at is None:
            self.agreement.request(step, signal.Signals(self.interrupts.signal).name)
        return self.agreement.due(step)

    def _check_divergence(self, batch):
        """Raises :class:`TrainingDiverged` when the epoch's running mean of a loss term is non-finite
        (one non-finite step makes it so), every :attr:`check_every_steps` steps. Reads the metric
        trackers' ``total`` variables on the host (no ``keras.ops``: no compile on JAX), this process's
        copies only (no collective). In a job of several processes the checks fall on the same steps
        in every process, every :attr:`lockstep_check_every_steps` (not by each host's clock): a
        process stopping on its own would leave the others waiting in the next step for ever."""
        if not batch:
            return
        if self.agreement is not None:
            if batch % self.lockstep_check_every_steps:
                return
        elif batch % self.check_every_steps or time.monotonic() - self._last_check < self.check_min_s:
            return
        self._last_check = time.monotonic()
        model = self.model
        bad = [m.name for m in model.metrics
               if hasattr(m, "total") and not all(np.all(np.isfinite(v)) for v in _local_values(m.total, model))]
        if bad:
            p = self.progress
            raise TrainingDiverged(divergence_message(p.epoch + 1, p.step, bad, method=self.method))

    def on_epoch_end(self, epoch, logs=None):
        p = self.progress
        p.step = (epoch + 1) * p.steps_per_epoch
        bad = non_finite_logs(logs)
        if bad:
            raise TrainingDiverged(divergence_message(epoch + 1, p.step, bad, method=self.method))
        # An epoch-end backup never makes the step wait: while the previous write is still going on
        # (short epochs, a slow disk) this one is skipped; the next epoch end writes a newer one.
        # The last epoch's is always written.
        if not self.writer.busy or epoch + 1 >= int((self.params or {}).get("epochs", 0)):
            self._backup("epoch")
