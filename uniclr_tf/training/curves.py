"""The training curves (``curves.png``) and their drawing in a child process.

:func:`plot_curves` draws a run's history; :func:`start_drawing` has a child Python process draw it, so
that matplotlib's second of work a drawing does not hold the training process's GIL (in a thread it
did: a GPU step of 9.5 ms took 15 ms during the epoch it drew in, the training thread waiting to
launch the next). This module imports only the standard library at its top, so the child starts in
about half a second, matplotlib included.
"""

import json
import os
import subprocess
import sys
import tempfile

# Panels by scale: the loss and its terms; each diagnostic on its own axis; accuracies in [0, 1].
_DIAGNOSTICS = {"symmetry": "‖A − Aᵀ‖_F (unweighted)", "embedding_std": "std of ℓ2-normalised embedding",
                "ema_momentum": "EMA momentum"}


def plot_curves(epochs, path, title="", reference=None):
    """One PNG: the loss terms (linear axis), one panel per diagnostic (symmetry ‖A − Aᵀ‖_F,
    embedding std, EMA momentum) and the accuracies (kNN, probe) with ``reference`` lines.
    Drawn with matplotlib's object API (no pyplot state: safe off the main thread), written atomically."""
    if not epochs:
        return
    try:
        import matplotlib.ticker
        from matplotlib.figure import Figure
    except ImportError:  # the curves are a convenience; history.json has the numbers
        return

    keys = [k for k in dict.fromkeys(k for e in epochs for k in e) if k != "epoch" and not k.endswith("_seconds")]
    acc_keys = [k for k in keys if "top" in k or "accuracy" in k]
    diag_keys = [k for k in keys if k in _DIAGNOSTICS]
    loss_keys = [k for k in keys if k not in acc_keys and k not in diag_keys]
    panels = [(loss_keys, "loss and its terms", "value")]
    panels += [([k], k, _DIAGNOSTICS[k]) for k in diag_keys]
    panels.append((acc_keys, "accuracy (test split)", "top-k accuracy"))
    fig = Figure(figsize=(4.2 * len(panels), 3.8))
    axes = fig.subplots(1, len(panels), squeeze=False)
    for ax, (group, name, ylabel) in zip(axes[0], panels):
        for k in group:
            pts = [(e["epoch"], e[k]) for e in epochs if e.get(k) is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", markersize=3, label=k)
        if group is acc_keys:
            for label, value in (reference or {}).items():
                ax.axhline(value, color="grey", linestyle="--", label=label)
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set_ylabel(ylabel)
        ax.set_title(name)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    from uniclr_tf.training import runs
    runs.atomic_save(path, lambda tmp: fig.savefig(tmp, dpi=100, format="png"))


def start_drawing(epochs, path, title="", reference=None):
    """:func:`plot_curves` in a child process (this interpreter; the folder holding this package first on its
    path unless it is there already); returns its ``subprocess.Popen`` (``poll()`` / ``wait()``), which
    deletes the job file it is given. The child prints a warning and exits 0 when it cannot draw; a child
    that cannot be started draws here instead (None is returned)."""
    fd, job = tempfile.mkstemp(prefix="uniclr-curves-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump({"epochs": epochs, "path": os.path.abspath(path), "title": title, "reference": reference}, f,
                  default=float)  # NumPy scalars as numbers
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = (f"import sys; sys.path[:0] = [] if {root!r} in sys.path else [{root!r}]; "  # a checkout not installed
            "from uniclr_tf.training.curves import main; main(sys.argv[1])")
    try:
        return subprocess.Popen([sys.executable, "-c", code, job], stdin=subprocess.DEVNULL)
    except OSError as e:
        os.remove(job)
        print(f"note: drawing {path} in this process ({type(e).__name__}: {e})", flush=True)
        _draw_quietly(epochs, path, title, reference)
        return None


def _draw_quietly(*args):
    try:
        plot_curves(*args)
    except Exception as e:  # noqa: BLE001 - the curves are a convenience: say so, never stop training for them
        print(f"warning: could not draw the curves: {type(e).__name__}: {e}", flush=True)


def main(job):
    """The child of :func:`start_drawing`: draws the job file's curves, deletes the file. It ignores
    SIGINT and SIGTERM (a signal to the run's process group): the drawing ends in about a second, and
    a child stopped half-way would leave its temporary file in the run folder."""
    import signal
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    try:
        with open(job) as f:
            spec = json.load(f)
        _draw_quietly(spec["epochs"], spec["path"], spec["title"], spec["reference"])
    finally:
        try:
            os.remove(job)
        except OSError:
            pass
