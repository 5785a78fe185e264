"""The curated per-run data of a study: one JSON per plan with each run's status, card, final numbers and
its per-epoch curves (kNN top-1, effective rank, embedding std), small enough to keep in git.

    python benchmarks/study_runs.py pack --plan=benchmarks/study/recipe.plan --out=runs.json [--card=H100] DIR ...
    python benchmarks/study_runs.py unpack benchmarks/results/recipe/runs.json --to=/tmp/runs

``pack`` reads run folders ``DIR/NAME/`` (``history.json``, ``metrics.json``, ``linear_eval.json``; what
benchmarks/study.py copies into its ``--out``) for every run of the plan: the first DIR holding a finished
run NAME, else the first holding any of its files (a diverged or stopped run keeps its status). ``--card``
names the GPU (default: read from each DIR's path, ``h100``/``h200``). ``unpack`` writes the folders back
(``NAME/history.json`` with the kept keys, ``NAME/metrics.json``, ``NAME/linear_eval.json``, ``NAME/exits.json``
for a failed phase), which is
what benchmarks/study/plots.sh and ``study.py --summary_only`` read.
"""

import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import study  # noqa: E402

CURVES = ("knn_top1", "effective_rank", "embedding_std")
METRICS = ("status", "method", "epochs", "steps", "knn_top1", "knn_top5", "effective_rank", "raw_pixel_knn_top1",
           "knn_memory_bank", "knn_test")


_json = study._json  # a JSON file's content, or None when missing or unreadable


def _card(folder):
    found = re.search(r"\b(h100|h200)", folder)
    return found.group(1).upper() if found else None


def pack_run(folder, card=None):
    metrics = _json(os.path.join(folder, "metrics.json")) or {}
    history = _json(os.path.join(folder, "history.json")) or []
    linear = _json(os.path.join(folder, "linear_eval.json")) or {}
    sections = {k: v for k, v in linear.items() if k.startswith("linear[") and isinstance(v, dict)}
    exits = _json(os.path.join(folder, "exits.json")) or {}  # study.py's: a failed phase is the status, as in its summary
    failed = {phase: code for phase, code in exits.items() if code not in (0, None)}
    status = metrics.get("status") or ("stopped" if history else "not started")
    if failed:
        status = ", ".join(f"{phase} exit {code}" for phase, code in failed.items())
    curves = [{"epoch": int(e["epoch"]), **{k: round(float(e[k]), 6) for k in CURVES if e.get(k) is not None}}
              for e in history if any(e.get(k) is not None for k in CURVES)]
    return {"status": status,
            "card": card or _card(folder), "epochs_done": len(history),
            "metrics": {k: metrics[k] for k in METRICS if k in metrics},
            "linear": {k: {m: v[m] for m in ("top1", "top5") if m in v} for k, v in sections.items()},
            "history": curves}


def pack(plan, dirs, card=None):
    _, runs = study.read_plan(plan)
    packed = {}
    for name, _flags in runs:
        present = [d for d in dirs if os.path.isdir(os.path.join(d, name))]
        finished = [d for d in present
                    if (_json(os.path.join(d, name, "metrics.json")) or {}).get("status") == "finished"]
        if finished or present:
            packed[name] = pack_run(os.path.join((finished or present)[0], name), card)
    return {"plan": os.path.relpath(plan, study.ROOT), "runs": packed}


def unpack(path, to):
    with open(path) as f:
        data = json.load(f)
    for name, run in data["runs"].items():
        folder = os.path.join(to, name)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "history.json"), "w") as f:
            json.dump(run["history"], f)
        with open(os.path.join(folder, "metrics.json"), "w") as f:
            json.dump(run["metrics"], f, indent=1)
        exits = dict(part.split(" exit ") for part in run["status"].split(", ") if " exit " in part)
        if exits:  # a failed phase (study.py's exits.json), as the summary shows it
            with open(os.path.join(folder, "exits.json"), "w") as f:
                json.dump({phase: int(code) for phase, code in exits.items()}, f)
        if run.get("linear"):
            with open(os.path.join(folder, "linear_eval.json"), "w") as f:
                json.dump(run["linear"], f, indent=1)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack")
    p.add_argument("dirs", nargs="+")
    p.add_argument("--plan", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--card", default=None)
    u = sub.add_parser("unpack")
    u.add_argument("file")
    u.add_argument("--to", required=True)
    args = parser.parse_args(argv)
    if args.command == "pack":
        data = pack(args.plan, args.dirs, args.card)
        text = json.dumps(data, separators=(",", ":")).replace('},"', '},\n"')
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        unpack(args.file, args.to)


if __name__ == "__main__":
    main()
