r"""kNN-vs-epoch curves of study runs (benchmarks/study.py results), one figure per question.

    python benchmarks/study_plots.py --out=benchmarks/study/recipe-200.png --title="..." \
        benchmarks/study/h100x4-call2/e200/sgd-t0.2-e200 [LABEL=]FOLDER ...
    python benchmarks/study_plots.py --out=X.png --metric=effective_rank FOLDER ...

Each FOLDER holds a run's ``history.json`` (what study.py copies into ``OUT/NAME/``); ``LABEL=``
names its curve (default: the folder's name). ``--metric`` is any per-epoch key of the history
(``knn_top1`` by default; ``effective_rank`` and ``embedding_std`` show collapse). Points are the
epochs where the history has the key (the kNN monitor's epochs for ``knn_top1``).
"""

import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402


def curve(folder, metric):
    with open(os.path.join(folder, "history.json")) as f:
        history = json.load(f)
    points = [(int(e["epoch"]), float(e[metric])) for e in history if e.get(metric) is not None]
    if not points:
        raise SystemExit(f"{folder}: history.json has no {metric!r}")
    return zip(*points)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="[LABEL=]FOLDER with a history.json")
    parser.add_argument("--out", required=True)
    parser.add_argument("--metric", default="knn_top1")
    parser.add_argument("--title", default="")
    parser.add_argument("--reference", type=float, default=None, help="a horizontal line (e.g. raw-pixel kNN)")
    parser.add_argument("--reference_label", default="raw pixels")
    args = parser.parse_args(argv)

    figure = Figure(figsize=(7, 4.5), dpi=110)
    axes = figure.subplots()
    for spec in args.runs:
        label, _, folder = spec.rpartition("=") if "=" in spec else ("", "", spec)
        epochs, values = curve(folder, args.metric)
        axes.plot(list(epochs), list(values), marker=".", label=label or os.path.basename(folder.rstrip("/")))
    if args.reference is not None:
        axes.axhline(args.reference, color="grey", linestyle="--", linewidth=1, label=args.reference_label)
    axes.set_xlabel("epoch")
    axes.set_ylabel({"knn_top1": "kNN top-1 (k 200, T 0.1, 60k bank)"}.get(args.metric, args.metric))
    axes.set_title(args.title, fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    tmp = args.out + ".tmp.png"
    figure.savefig(tmp)
    os.replace(tmp, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
