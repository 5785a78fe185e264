r"""kNN-vs-epoch curves of study runs (benchmarks/study.py results), one figure per question.

    python benchmarks/study_plots.py --out=benchmarks/results/recipe/recipe-200.png --title="..." \
        runs/study-results/recipe/sgd-t0.2-e200 [LABEL=]FOLDER ...
    python benchmarks/study_plots.py --out=X.png --metric=effective_rank FOLDER ...

Each FOLDER holds a run's ``history.json`` (what study.py copies into ``OUT/NAME/``); ``LABEL=``
names its curve (default: the folder's name). ``LABEL=FOLDER1,FOLDER2,...`` (the seeds of one
configuration) draws their mean over the epochs all of them have, with a band of ± one sample std. ``--metric`` is any per-epoch key of the history
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


def mean_curve(folders, metric):
    """``(epochs, mean, std)`` over the runs in ``folders`` at the epochs every one of them logged
    (sample std, ddof 1; zeros for a single run)."""
    curves = [dict(zip(*curve(folder, metric))) for folder in folders]
    epochs = sorted(set.intersection(*(set(c) for c in curves)))
    if not epochs:
        raise SystemExit(f"{', '.join(folders)}: no epoch where every run has {metric!r}")
    means, stds = [], []
    for epoch in epochs:
        values = [c[epoch] for c in curves]
        mean = sum(values) / len(values)
        means.append(mean)
        stds.append((sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5 if len(values) > 1 else 0.0)
    return epochs, means, stds


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="[LABEL=]FOLDER with a history.json")
    parser.add_argument("--out", required=True)
    parser.add_argument("--metric", default="knn_top1")
    parser.add_argument("--title", default="")
    parser.add_argument("--reference", type=float, default=None, help="a horizontal line (e.g. raw-pixel kNN)")
    parser.add_argument("--reference_label", default="raw pixels")
    parser.add_argument("--ylim", default="", help="LOW,HIGH of the y axis (default: all the points)")
    args = parser.parse_args(argv)

    outside = len(args.runs) > 6  # a long legend goes beside the axes, not over the curves
    figure = Figure(figsize=(9.5 if outside else 7, 4.5), dpi=110)
    axes = figure.subplots()
    for index, spec in enumerate(args.runs):
        # the colour cycle has 10 colours: the 11th curve on repeats them, dashed, so no two curves look alike
        style = {"marker": ".", "linestyle": ("-", "--", ":")[index // 10 % 3]}
        label, _, folder = spec.rpartition("=") if "=" in spec else ("", "", spec)
        folders = folder.split(",")
        label = label or os.path.basename(folders[0].rstrip("/"))
        if len(folders) == 1:
            epochs, values = curve(folder, args.metric)
            axes.plot(list(epochs), list(values), label=label, **style)
            continue
        epochs, means, stds = mean_curve(folders, args.metric)
        line, = axes.plot(epochs, means, label=f"{label} ({len(folders)} seeds)", **style)
        axes.fill_between(epochs, [m - s for m, s in zip(means, stds)], [m + s for m, s in zip(means, stds)],
                          color=line.get_color(), alpha=0.2, linewidth=0)
    if args.reference is not None:
        axes.axhline(args.reference, color="grey", linestyle="--", linewidth=1, label=args.reference_label)
    if args.ylim:
        axes.set_ylim(*(float(v) for v in args.ylim.split(",")))
    axes.set_xlabel("epoch")
    axes.set_ylabel({"knn_top1": "kNN top-1 (k 200, T 0.1, 60k bank)", "effective_rank": "effective rank",
                     "embedding_std": "embedding std"}.get(args.metric, args.metric))
    axes.set_title(args.title, fontsize=10)
    axes.grid(alpha=0.3)
    if outside:
        axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        axes.legend(fontsize=8)
    figure.tight_layout()
    tmp = args.out + ".tmp.png"
    figure.savefig(tmp)
    os.replace(tmp, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
