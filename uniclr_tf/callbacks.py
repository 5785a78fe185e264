"""Training callbacks: the kNN monitor and the end-of-training curves plot."""

import json
import os

import keras
import numpy as np

from uniclr_tf.evaluation import knn_eval


class KNNMonitor(keras.callbacks.Callback):
    """Weighted kNN top-1 of the backbone on the test split every ``every`` epochs.

    Writes ``knn_top1``/``knn_top5`` into the epoch logs (so TensorBoard and CSVLogger placed after
    it record them) and keeps the history in ``self.history``.
    """

    def __init__(self, encoder, preprocess, train, test, num_classes, every=1, k=200, temperature=0.1):
        super().__init__()
        self.encoder, self.preprocess = encoder, preprocess
        self.train, self.test, self.num_classes = train, test, num_classes
        self.every, self.k, self.temperature = every, k, temperature
        self.history = []

    def on_epoch_end(self, epoch, logs=None):
        if self.every <= 0 or (epoch + 1) % self.every:
            return
        acc = knn_eval(self.encoder, self.preprocess, self.train, self.test, self.num_classes,
                       self.k, self.temperature)
        self.history.append({"epoch": epoch + 1, **acc})
        if logs is not None:
            logs["knn_top1"], logs["knn_top5"] = acc["top1"], acc["top5"]
        print(f"\nepoch {epoch + 1}: kNN top-1 {acc['top1']:.4f}  top-5 {acc['top5']:.4f}")


class HistoryRecorder(keras.callbacks.Callback):
    """Keeps every epoch's logs (floats), writes ``history.json`` and ``curves.png`` at the end."""

    def __init__(self, run_dir):
        super().__init__()
        self.run_dir = run_dir
        self.epochs = []

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append({"epoch": epoch + 1, **{k: float(np.asarray(v)) for k, v in (logs or {}).items()}})

    def on_train_end(self, logs=None):
        with open(os.path.join(self.run_dir, "history.json"), "w") as f:
            json.dump(self.epochs, f, indent=1)
        plot_curves(self.epochs, os.path.join(self.run_dir, "curves.png"))


def plot_curves(epochs, path):
    """Loss terms, diagnostics (symmetry ‖A − Aᵀ‖_F, embedding std, EMA momentum) and kNN / probe
    accuracy, one panel each, as one PNG."""
    if not epochs:
        return
    try:
        import matplotlib
    except ImportError:  # the curves are a convenience; history.json has the numbers
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted({k for e in epochs for k in e if k != "epoch"})
    acc_keys = [k for k in keys if "top" in k or "accuracy" in k]
    diag_keys = [k for k in keys if k in ("symmetry", "embedding_std", "ema_momentum")]
    loss_keys = [k for k in keys if k not in acc_keys and k not in diag_keys]
    panels = [(loss_keys, "losses"), (diag_keys, "diagnostics"), (acc_keys, "accuracy")]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, (group, title) in zip(axes, panels):
        for k in group:
            pts = [(e["epoch"], e[k]) for e in epochs if k in e]
            ax.plot(*zip(*pts), marker="o", label=k)
        ax.set_xlabel("epoch")
        ax.set_title(title)
        if title == "diagnostics" and group:
            ax.set_yscale("log")
        if group:
            ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
