r"""A study: many runs of the train CLI from one plan file, one run per GPU at a time, resumable.

    python -m benchmarks.study --plan=benchmarks/study/recipe.plan --out=OUT [--gpus=0,1,2,3]
        [--runs_dir=/tmp/uniclr-study] [--time_limit=540] [--only=NAME,...] [--linear_eval="--augment_on=device"]
    python -m benchmarks.study --plan=... --out=OUT --summary_only      # the table of what OUT holds
    python -m benchmarks.study plan robustness|full_schedule           # a plan generated from configs/
    python -m benchmarks.study pack --plan=PLAN --out=FILE.json [--card=H200] [--ended] DIR|JSON ...  # curated runs

The plan is a text file, one run per line: a name, then the train flags of that run. ``common:``
lines give flags every run of the plan takes. ``#`` starts a comment; a line ending in ``\``
continues on the next::

    common: --augment_on=device --epochs=100 --knn_every=10
    sgd-t0.2   --flagfile=configs/simaffinity.flags --optimizer=sgd --temperature=0.2

Runs ``NAME``, ``NAME-s1``, ``NAME-s2`` ... are the seeds of one configuration (``benchmarks.report``).
Each run is ``python -m uniclr_tf.train RUN_FLAGFILES COMMON RUN_FLAGS --run_dir=RUNS_DIR
--run_name=NAME --verbose=2 --nopictures`` (later flags win: a run's ``--flagfile=`` goes first, so
the common flags override the flagfile, and the run's other flags override both), in its own process,
with ``CUDA_VISIBLE_DEVICES`` set to one of ``--gpus`` (``cpu``: no GPU). As many runs go at once as GPUs
are named, times ``--per_gpu``. The train CLI itself makes the study resumable: a run folder that exists
continues from its last backup, a finished one exits at once, and a folder whose flags differ is refused
(its error ends in the run's log). A run that finished (and was evaluated, if ``--linear_eval`` asks)
with the same command as its last launch is not started at all. So rerunning the same command after a
time limit or a kill continues every unfinished run, as long as ``--runs_dir`` survives. At
``--time_limit`` seconds, no new run starts after the limit minus ``--min_start``, and those still
running get SIGTERM: they save a backup at the next step and exit, resumable.

After a run ends well, ``--linear_eval FLAGS`` runs ``python -m uniclr_tf.linear_eval
--run_dir=RUN FLAGS`` on the same GPU (``--augment_on=device`` on a machine without TensorFlow).

``OUT/NAME/`` gets a copy of the run's small files (history.json, metrics.json, flags.txt,
linear_eval.json, config.json), its logs, ``exits.json`` (each phase's exit code) and ``shared.json``
(``{"train": N}``: the most processes of the study on the run's GPU at once while it trained, itself
included; its images a second are its share of the GPU);
``OUT/summary.md`` and ``OUT/summary.json`` the study report (``python -m benchmarks.report study OUT``):
per configuration the seeds run and failed, kNN and linear top-1 as mean ± std, the training's wall clock
and images a second (a run's share of its GPU under ``--per_gpu``), and a row per run.

``plan robustness`` is every shipped GPU config (``configs/*.flags`` but the CPU quickstarts,
``configs/paper/fashion_mnist_*.flags``, ``configs/methods/*.flags``) x 5 seeds x the first 30 epochs of
its own schedule; ``plan full_schedule`` the same configs x 3 seeds x their whole schedule, each to be run
with ``--linear_eval``. A config that only points to another (``--flagfile=OTHER`` and nothing else) is
that recipe and shares its runs. ``pack`` keeps the small part of run folders (status, card, final
numbers, the per-epoch kNN, effective rank and embedding std) in one JSON per plan, what
``benchmarks/results/study/`` holds; given that JSON too, it adds the new runs to it.
"""

import argparse
import collections
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


def _json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


CONFIGS_EPOCHS = {"robustness": 30}  # generated plans: epochs of each schedule run (None: the whole schedule)
SEEDS = {"robustness": 5, "full_schedule": 3}


def shipped_configs():
    """The shipped GPU configs, the UniCLR ones first: configs/*.flags (not the CPU quickstarts),
    configs/paper/fashion_mnist_*.flags, configs/methods/*.flags (paths relative to the repository)."""
    import glob
    top = [p for p in sorted(glob.glob(os.path.join(ROOT, "configs", "*.flags")))
           if not os.path.basename(p).startswith("quickstart")]
    paper = sorted(glob.glob(os.path.join(ROOT, "configs", "paper", "fashion_mnist_*.flags")))
    methods = sorted(glob.glob(os.path.join(ROOT, "configs", "methods", "*.flags")))
    return [os.path.relpath(p, ROOT) for p in top + paper + methods]


def alias_of(config, checked):
    """The config that ``config`` only points to (its one setting is ``--flagfile=OTHER``), when OTHER is
    among ``checked`` too: the same recipe, whose runs it shares. None for a config of its own."""
    with open(os.path.join(ROOT, config)) as f:
        settings = [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]
    if len(settings) == 1 and settings[0].startswith("--flagfile="):
        target = os.path.normpath(settings[0].split("=", 1)[1])
        if target in checked:
            return target
    return None


def run_name(config, seed, prefix=""):
    """``configs/paper/fashion_mnist_simtrace.flags``, seed 0 -> ``paper.fashion_mnist_simtrace-s0``."""
    stem = os.path.splitext(os.path.relpath(config, "configs"))[0].replace(os.sep, ".")
    return f"{prefix}{stem}-s{seed}"


def generated_plan(kind):
    """The text of ``benchmarks/study/KIND.plan``: every shipped GPU config x the kind's seeds."""
    if kind not in SEEDS:
        raise SystemExit(f"plan: one of {', '.join(SEEDS)}; received {kind!r}")
    checked, seeds, epochs = shipped_configs(), SEEDS[kind], CONFIGS_EPOCHS.get(kind)
    if epochs:
        what, common, prefix = f"the first {epochs} epochs of each schedule", \
            f"--augment_on=device --stop_at_epoch={epochs} --knn_every=5", ""
        how = "no linear evaluation"
    else:
        what, common, prefix = "each whole schedule", "--augment_on=device", "full."
        how = 'run with --linear_eval="--augment_on=device --batch_size=512"'
    lines = [f"# Generated by `python -m benchmarks.study plan {kind}`: {len(checked)} configs x {seeds} seeds, "
             f"{what}; {how}.", f"common: {common}"]
    for config in checked:
        same = alias_of(config, checked)
        if same:
            lines.append(f"# {config}: the recipe of {same} (its runs)")
            continue
        lines += [f"{run_name(config, seed, prefix)}  --flagfile={config} --seed={seed}" for seed in range(seeds)]
    return "\n".join(lines) + "\n"


def pack(plan, paths, card=None, ended=False):
    """The runs of ``plan`` found in ``paths``: study ``--out`` folders (each run packed by
    ``benchmarks.report.pack_run``) or earlier packs of the plan, so that a plan's results add up over
    several calls or machines. A name found twice keeps its first finished run, else its first found.
    Runs from a pack keep their date, those from a folder get today's. ``ended``: leave out the runs a
    time limit stopped (where their backups are gone, they cannot resume)."""
    from benchmarks import report
    _, runs = read_plan(plan)
    today = time.strftime("%Y-%m-%d", time.gmtime())

    def finished(run):  # trained to its end (a stopped linear evaluation still leaves its kNN)
        return report.outcome(run)[0] == "finished"

    found = {}
    for path in paths:
        if os.path.isdir(path):
            here = {name: {**report.pack_run(os.path.join(path, name), card), "date": today}
                    for name, _flags in runs if os.path.isdir(os.path.join(path, name))}
        else:
            data = _json(path)
            if not isinstance(data, dict) or "runs" not in data:
                raise SystemExit(f"pack: {path} is neither a study folder nor a packed study")
            if os.path.normpath(data.get("plan", "")) != os.path.relpath(os.path.abspath(plan), ROOT):
                raise SystemExit(f"pack: {path} packs {data.get('plan')!r}, not {plan}")
            here = {name: {**run, "date": run.get("date", data.get("date"))} for name, run in data["runs"].items()}
        for name, run in here.items():
            if name not in found or (not finished(found[name]) and finished(run)):
                found[name] = run
    names = [name for name, _flags in runs if name in found
             and not (ended and report.outcome(found[name])[0] == "unfinished")]
    return {"plan": os.path.relpath(os.path.abspath(plan), ROOT), "date": today,
            "runs": {name: found[name] for name in names}}


def write_summary(out, names=None):
    """``OUT/summary.md`` and ``OUT/summary.json``: the study report of the runs in ``out`` (those named)."""
    from benchmarks import report
    tables, _ = report.study([out], per_run=True, only=names)
    text = report.markdown(tables)
    # atomic: a reader, or another study process writing the same summary, never sees half a file
    atomic_write_text(os.path.join(out, "summary.json"), json.dumps({"kind": "study", "tables": tables}, indent=1))
    atomic_write_text(os.path.join(out, "summary.md"), text)
    return text


def collect(run_folder, out_folder):
    os.makedirs(out_folder, exist_ok=True)
    for name in COPIED:
        source = os.path.join(run_folder, name)
        if os.path.exists(source):
            shutil.copyfile(source, os.path.join(out_folder, name))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["plan"]:
        if len(argv) != 2:
            raise SystemExit("usage: python -m benchmarks.study plan robustness|full_schedule")
        sys.stdout.write(generated_plan(argv[1]))
        return
    if argv[:1] == ["pack"]:
        parser = argparse.ArgumentParser(prog="python -m benchmarks.study pack")
        parser.add_argument("paths", nargs="+", help="study --out folders holding run folders NAME/, or earlier "
                            "packs of the plan (its runs add up)")
        parser.add_argument("--plan", required=True)
        parser.add_argument("--out", required=True)
        parser.add_argument("--card", default=None, help="the GPU (default: h100/h200 read from each folder's path)")
        parser.add_argument("--ended", action="store_true", help="leave out runs a time limit stopped")
        args = parser.parse_args(argv[1:])
        text = json.dumps(pack(args.plan, args.paths, args.card, args.ended), separators=(",", ":")).replace('},"', '},\n"')
        atomic_write_text(args.out, text + "\n")
        return
    parser = argparse.ArgumentParser(prog="python -m benchmarks.study", description=__doc__.split("\n\n")[0],
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
    parser.add_argument("--only", default="", help="comma-separated run names, started in that order")
    parser.add_argument("--linear_eval", default=None, help="flags of a linear evaluation after each run")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--summary_only", action="store_true")
    parser.add_argument("--dry_run", action="store_true", help="print the commands only")
    args = parser.parse_args(argv)

    common, plan_runs = read_plan(args.plan)
    runs = plan_runs
    if args.only:
        wanted = args.only.split(",")
        unknown = sorted(set(wanted) - {n for n, _ in runs})
        if unknown:
            raise SystemExit(f"--only: not in {args.plan}: {', '.join(unknown)}")
        by_name = dict(runs)
        runs = [(name, by_name[name]) for name in dict.fromkeys(wanted)]  # in the order named
    os.makedirs(args.out, exist_ok=True)
    if not args.summary_only:
        run_all(args, common, runs)
        # Several study processes may share --out (one per GPU, each with its own --only): each one's
        # summary covers every plan run with a folder there, so the last to finish leaves them all.
        runs = [r for r in plan_runs if r in runs or os.path.isdir(os.path.join(args.out, r[0]))]
    print(write_summary(args.out, [name for name, _ in runs]), flush=True)


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
    peers = {}  # a training run -> the most study processes on its GPU at once, itself included

    def note_peers():
        on_gpu = collections.Counter(slot[0] for slot in busy)
        for slot, (name, _process, phase, _log) in busy.items():
            if phase == "train":
                peers[name] = max(peers.get(name, 0), on_gpu[slot[0]])

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
        note_peers()
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
            if phase == "train" and name in peers:  # over the calls that resumed it: the most
                shared_path = os.path.join(args.out, name, "shared.json")
                before = (_json(shared_path) or {}).get("train", 0)
                atomic_write_text(shared_path, json.dumps({"train": max(before, peers.pop(name))}))
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
