r"""A study: many runs of the train CLI from one plan file, one run per GPU at a time, resumable.

    python benchmarks/study.py --plan=benchmarks/study/recipe.plan --out=OUT [--gpus=0,1,2,3]
        [--runs_dir=/tmp/uniclr-study] [--time_limit=540] [--only=NAME,...] [--linear_eval="--augment_on=device"]
    python benchmarks/study.py --plan=... --out=OUT --summary_only      # the table of what OUT holds

The plan is a text file, one run per line: a name, then the train flags of that run. ``common:``
lines give flags every run of the plan takes. ``#`` starts a comment; a line ending in ``\``
continues on the next::

    common: --augment_on=device --epochs=100 --knn_every=10
    sgd-t0.2   --flagfile=configs/simaffinity.flags --optimizer=sgd --temperature=0.2

Each run is ``python -m uniclr_tf.train RUN_FLAGFILES COMMON RUN_FLAGS --run_dir=RUNS_DIR
--run_name=NAME --verbose=2 --nopictures`` (later flags win: a run's ``--flagfile=`` goes first, so
the common flags override the flagfile, and the run's other flags override both), in its own process, with ``CUDA_VISIBLE_DEVICES`` set to one of ``--gpus`` (``cpu``:
no GPU). As many runs go at once as GPUs are named, times ``--per_gpu``. The train CLI itself makes the study resumable:
a run folder that exists continues from its last backup, a finished one exits at once, and a folder
whose flags differ is refused (its error ends in the run's log). A run that finished (and was evaluated, if
``--linear_eval`` asks) with the same command as its last launch is not started at all. So rerunning the same command
after a time limit or a kill continues every unfinished run, on the same machine (``--runs_dir`` must
survive; a GPU job's /tmp does not survive the machine, but does survive between calls while it is
held). At ``--time_limit`` seconds, no new run starts after the limit minus ``--min_start``, and
those still running get SIGTERM: they save a backup at the next step and exit, resumable.

After a run ends well, ``--linear_eval FLAGS`` runs ``python -m uniclr_tf.linear_eval
--run_dir=RUN FLAGS`` on the same GPU (``--augment_on=device`` on a machine without TensorFlow).

``OUT/NAME/`` gets a copy of the run's small files (history.json, metrics.json, flags.txt,
linear_eval.json) and its logs; ``OUT/summary.json`` and ``OUT/summary.md`` the table: kNN top-1 at
epochs 25/50/100/200 (from the kNN monitor), the final kNN, the linear top-1, the embedding std at
the end, wall-clock and training images/s (epochs 2.., kNN excluded), for every run the plan names. A run
resumed across calls counts the wall-clock of all its invocations, and its images/s leaves out the first
epoch of each (the compile).
"""

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run as `python benchmarks/study.py` from a checkout: the package beside it
    sys.path.insert(0, ROOT)
from uniclr_tf.training.runs import atomic_write_text  # noqa: E402  (standard library and NumPy only)

COPIED = ("history.json", "metrics.json", "flags.txt", "linear_eval.json", "config.json")
EPOCH_MARKS = (10, 25, 50, 100, 200)  # kNN monitor epochs the table shows (knn_every must hit them)


def read_plan(path):
    """``(common_flags, [(name, flags), ...])`` from a plan file."""
    common, runs, names = [], [], set()
    with open(path) as f:
        text = f.read().replace("\\\n", " ")
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("common:"):
            common += shlex.split(line[len("common:"):])
            continue
        name, *flags = shlex.split(line)
        if name in names or not all(c.isalnum() or c in "-_." for c in name):
            raise SystemExit(f"{path}:{number}: run name {name!r} repeated or not of [A-Za-z0-9-_.]")
        names.add(name)
        runs.append((name, flags))
    if not runs:
        raise SystemExit(f"{path}: no run in the plan")
    return common, runs


def _history(folder):
    try:
        with open(os.path.join(folder, "history.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return []


def _json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _flag(flags, name, default=None):
    value = default
    for flag in flags:
        if flag.startswith(f"--{name}="):
            value = flag.split("=", 1)[1]
    return value


def summarise(out, runs, also=()):
    """One row per run of the plan from what ``out/NAME/`` holds (else the first ``also/NAME/`` that exists)."""
    rows = []
    for name, flags in runs:
        folder = os.path.join(out, name)
        for other in also:
            if not os.path.isdir(folder) and os.path.isdir(os.path.join(other, name)):
                folder = os.path.join(other, name)
        history = _history(folder)
        metrics = _json(os.path.join(folder, "metrics.json")) or {}
        linear = _json(os.path.join(folder, "linear_eval.json")) or {}
        knn = {int(e["epoch"]): e["knn_top1"] for e in history if "knn_top1" in e}
        exits = _json(os.path.join(folder, "exits.json")) or {}
        status = metrics.get("status") or ("stopped" if history else "not started")
        failed = {phase: code for phase, code in exits.items() if code not in (0, None)}
        if failed:
            status = ", ".join(f"{phase} exit {code}" for phase, code in failed.items())
        row = {"name": name, "flags": " ".join(flags), "epochs_done": len(history), "status": status}
        for mark in EPOCH_MARKS:
            row[f"knn@{mark}"] = knn.get(mark)
        row["knn_final"] = metrics.get("knn_top1")
        row["raw_pixel_knn"] = metrics.get("raw_pixel_knn_top1")
        sections = [v for k, v in linear.items() if k.startswith("linear[") and isinstance(v, dict)]
        row["linear_top1"] = sections[0].get("top1") if sections else None
        row["embedding_std_final"] = history[-1].get("embedding_std") if history else None
        # a resumed run's history continues, but ``wall_seconds`` counts from each invocation's start: an
        # invocation ends where the next entry's is smaller. Wall-clock sums the invocations; images/s
        # leaves out each invocation's first epoch (its compile), as it leaves out a single run's epoch 1.
        starts = [0] + [i for i in range(1, len(history))
                        if history[i].get("wall_seconds", 0.0) < history[i - 1].get("wall_seconds", 0.0)]
        ends = [i - 1 for i in starts[1:]] + [len(history) - 1]
        row["invocations"] = len(starts) if history else 0
        row["wall_seconds"] = (round(sum(history[i]["wall_seconds"] for i in ends), 1)
                               if history and all("wall_seconds" in history[i] for i in ends) else None)
        later = [e for i, e in enumerate(history) if i not in starts]
        steps = metrics.get("steps", 0) / max(len(history), 1)
        batch = int(_flag(flags, "batch_size", 0) or (_json(os.path.join(folder, "config.json")) or {}).get("batch_size", 0))
        seconds = sum(e.get("step_seconds", 0.0) for e in later)
        row["images_per_second"] = round(len(later) * steps * batch / seconds) if seconds and batch else None
        rows.append(row)
    return rows


def markdown(rows):
    cols = ["name", "epochs_done"] + [f"knn@{m}" for m in EPOCH_MARKS] + [
        "knn_final", "linear_top1", "embedding_std_final", "wall_seconds", "images_per_second", "status"]
    fmt = lambda v: "" if v is None else (f"{v:.4f}" if isinstance(v, float) and v < 1.5 else str(v))
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


SEED_SUFFIX = re.compile(r"-s[0-9]+$")
AGGREGATED = [f"knn@{m}" for m in EPOCH_MARKS] + ["knn_final", "linear_top1", "embedding_std_final",
                                                    "images_per_second"]


def aggregate(rows):
    """Mean and sample std over the seeds of a configuration: runs ``NAME``, ``NAME-s1``, ``NAME-s2``...

    Only runs that finished count; ``seeds`` is how many did."""
    groups = {}
    for row in rows:
        if row["status"] == "finished":
            groups.setdefault(SEED_SUFFIX.sub("", row["name"]), []).append(row)
    out = []
    for name, members in groups.items():
        entry = {"name": name, "seeds": len(members), "runs": [r["name"] for r in members]}
        for column in AGGREGATED:
            values = [r[column] for r in members if r.get(column) is not None]
            if values:
                mean = sum(values) / len(values)
                std = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5 if len(values) > 1 else None
                entry[column] = {"mean": mean, "std": std, "n": len(values)}
        out.append(entry)
    return out


def markdown_seeds(entries):
    cols = [c for c in AGGREGATED if any(c in e for e in entries)]

    def fmt(cell, column):
        if cell is None:
            return ""
        digits = 0 if column == "images_per_second" else 4
        text = f"{cell['mean']:.{digits}f}"
        return text + (f" ± {cell['std']:.{digits}f}" if cell["std"] is not None else "") + f" ({cell['n']})"

    lines = ["| name | seeds | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 2)]
    lines += [f"| {e['name']} | {e['seeds']} | " + " | ".join(fmt(e.get(c), c) for c in cols) + " |" for e in entries]
    return "\n".join(lines)


def collect(run_folder, out_folder):
    os.makedirs(out_folder, exist_ok=True)
    for name in COPIED:
        source = os.path.join(run_folder, name)
        if os.path.exists(source):
            shutil.copyfile(source, os.path.join(out_folder, name))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plan", required=True)
    parser.add_argument("--out", required=True, help="results folder (copies, logs, summary)")
    parser.add_argument("--gpus", default="", help="comma-separated GPU ids, or 'cpu'; default: every GPU nvidia-smi lists")
    parser.add_argument("--per_gpu", type=int, default=1,
                        help="runs sharing each GPU at once (each gets 0.9/N of its memory through "
                             "XLA_PYTHON_CLIENT_MEM_FRACTION; small models leave a GPU partly idle)")
    parser.add_argument("--runs_dir", default="/tmp/uniclr-study")
    parser.add_argument("--time_limit", type=float, default=0.0, help="seconds (0: none)")
    parser.add_argument("--min_start", type=float, default=60.0,
                        help="no run starts later than time_limit minus this many seconds")
    parser.add_argument("--only", default="", help="comma-separated run names")
    parser.add_argument("--linear_eval", default=None, help="flags of a linear evaluation after each run")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--summary_only", action="store_true")
    parser.add_argument("--also", default="",
                        help="comma-separated earlier OUT folders: a run missing from --out is read from there")
    parser.add_argument("--seeds", action="store_true",
                        help="also a table of mean +- std over seeds (runs NAME, NAME-s1, NAME-s2, ...)")
    parser.add_argument("--dry_run", action="store_true", help="print the commands only")
    args = parser.parse_args(argv)

    common, plan_runs = read_plan(args.plan)
    runs = plan_runs
    if args.only:
        wanted = args.only.split(",")
        unknown = sorted(set(wanted) - {n for n, _ in runs})
        if unknown:
            raise SystemExit(f"--only: not in {args.plan}: {', '.join(unknown)}")
        runs = [r for r in runs if r[0] in wanted]
    os.makedirs(args.out, exist_ok=True)
    if not args.summary_only:
        run_all(args, common, runs)
        # Several study processes may share --out (one per GPU, each with its own --only): each one's
        # summary covers every plan run with a folder there, so the last to finish leaves them all.
        runs = [r for r in plan_runs if r in runs or os.path.isdir(os.path.join(args.out, r[0]))]
    rows = summarise(args.out, runs, [d for d in args.also.split(",") if d])
    table = markdown(rows)
    result = {"plan": os.path.relpath(args.plan, ROOT), "common": common, "rows": rows}
    if args.seeds:
        result["seeds"] = aggregate(rows)
        table += "\n\nMean ± std over seeds (finished runs; the count in brackets):\n\n" + markdown_seeds(result["seeds"])
    # atomic: a reader, or another study process writing the same summary, never sees half a file
    atomic_write_text(os.path.join(args.out, "summary.json"), json.dumps(result, indent=1))
    atomic_write_text(os.path.join(args.out, "summary.md"), table + "\n")
    print(table, flush=True)


def _gpus(spec):
    if spec:
        return spec.split(",")
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True).stdout
        count = sum(1 for line in listing.splitlines() if line.startswith("GPU "))
    except (OSError, subprocess.CalledProcessError):
        count = 0
    return [str(i) for i in range(count)] or ["cpu"]


def train_flags(common, name, flags, runs_dir):
    """The train CLI's flags for run ``name``: its flagfiles, then the plan's common flags, then its own
    (absl lets a later flag win), then the run folder."""
    flagfiles = [f for f in flags if f.startswith("--flagfile=")]
    own = [f for f in flags if not f.startswith("--flagfile=")]
    return [*flagfiles, *common, *own, f"--run_dir={runs_dir}", f"--run_name={name}", "--verbose=2", "--nopictures"]


def launch_line(gpu, command):
    """The line a phase's log gets at each launch; ``LAUNCH_LINE`` reads the command back from it."""
    return f"# {time.strftime('%Y-%m-%d %H:%M:%S')} gpu {gpu}: {shlex.join(command)}"


LAUNCH_LINE = re.compile(r"# \d{4}-\d\d-\d\d \d\d:\d\d:\d\d gpu [^:]+: (.*)$")


def done_before(args, name, command):
    """Whether run ``name`` finished (and was evaluated, if asked) in an earlier call with this very command:
    then it is not started again. The train CLI would exit at once too, but only after reading the data and
    building the model (seconds to a minute per run, for every run of a plan at each call). A run whose
    command changed is started, and the CLI refuses it if its flags differ from its folder's."""
    folder = os.path.join(args.runs_dir, name)
    if (_json(os.path.join(folder, "metrics.json")) or {}).get("status") != "finished":
        return False
    if args.linear_eval is not None and not _json(os.path.join(folder, "linear_eval.json")):
        return False
    try:
        with open(os.path.join(args.out, name, "train.log")) as f:
            launched = [m.group(1) for m in map(LAUNCH_LINE.match, f) if m]
    except OSError:
        return False
    return bool(launched) and launched[-1] == shlex.join(command)


def run_all(args, common, runs):
    start = time.time()
    deadline = start + args.time_limit if args.time_limit else None
    queue = list(runs)
    if args.per_gpu < 1:
        raise SystemExit("--per_gpu must be >= 1")
    # a slot is (gpu, k): per_gpu runs share each GPU
    free, busy = [(g, k) for k in range(args.per_gpu) for g in _gpus(args.gpus)], {}  # busy: slot -> (...)

    def launch(slot, name, phase, command):
        gpu = slot[0]
        env = dict(os.environ)
        env["CUDA_VISIBLE_DEVICES"] = "" if gpu == "cpu" else gpu
        if args.per_gpu > 1 and gpu != "cpu":
            env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{0.9 / args.per_gpu:.2f}")
        folder = os.path.join(args.out, name)
        os.makedirs(folder, exist_ok=True)
        log = open(os.path.join(folder, f"{phase}.log"), "a")
        log.write(f"\n{launch_line(gpu, command)}\n")
        log.flush()
        print(f"[{time.time() - start:6.0f}s] gpu {gpu}: {phase} {name}", flush=True)
        if args.dry_run:
            print("   ", shlex.join(command))
            free.append(slot)
            return
        busy[slot] = (name, subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT),
                     phase, log)

    stopping = False
    while queue or busy:
        now = time.time()
        if deadline and not stopping and now >= deadline:
            stopping = True
            for name, process, phase, _ in busy.values():
                print(f"[{now - start:6.0f}s] time limit: SIGTERM to {phase} {name}", flush=True)
                process.send_signal(signal.SIGTERM)
        can_start = not stopping and (deadline is None or now < deadline - args.min_start)
        while free and queue and can_start:
            name, flags = queue.pop(0)
            command = [args.python, "-m", "uniclr_tf.train", *train_flags(common, name, flags, args.runs_dir)]
            if done_before(args, name, command):
                print(f"[{time.time() - start:6.0f}s] {name}: finished in an earlier call, not relaunched", flush=True)
                collect(os.path.join(args.runs_dir, name), os.path.join(args.out, name))
                continue
            launch(free.pop(0), name, "train", command)
        for slot, (name, process, phase, log) in list(busy.items()):
            gpu = slot[0]
            code = process.poll()
            if code is None:
                if stopping and time.time() > deadline + 90:
                    process.kill()
                continue
            log.close()
            del busy[slot]
            run_folder = os.path.join(args.runs_dir, name)
            collect(run_folder, os.path.join(args.out, name))
            exits_path = os.path.join(args.out, name, "exits.json")
            atomic_write_text(exits_path, json.dumps({**(_json(exits_path) or {}), phase: code}))
            print(f"[{time.time() - start:6.0f}s] gpu {gpu}: {phase} {name} exit {code}", flush=True)
            if phase == "train" and code == 0 and args.linear_eval is not None and not stopping:
                done = _json(os.path.join(run_folder, "linear_eval.json"))
                if not done:
                    launch(slot, name, "linear_eval", [args.python, "-m", "uniclr_tf.linear_eval",
                                                      f"--run_dir={run_folder}", *shlex.split(args.linear_eval)])
                    continue
            free.append(slot)
        if not can_start and not busy:
            break
        if busy:
            time.sleep(0.5)  # a poll: cheap, and a short run is seen at once
    if queue:
        print(f"not started (time limit): {', '.join(n for n, _ in queue)}", flush=True)


if __name__ == "__main__":
    main()
