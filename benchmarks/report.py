r"""The one report over benchmark results: Markdown tables on stdout, the same tables as JSON with ``--out``.

    python -m benchmarks.report speed RESULT.json ...                 the bench, the PyTorch peers, the CLI
    python -m benchmarks.report scaling RESULT.json|RUNS_DIR ...      step time and weak scaling, collectives, memory
    python -m benchmarks.report study RESULTS ... [--at=50,100] [--runs] [--plots=DIR]
    python -m benchmarks.report trace TRACE [--compare=OTHER]         a traced step, device by device
    python -m benchmarks.report roofline TRACE HLO [--bench=JSON]     a traced step against its memory floor

Standard library only (``--plots`` needs matplotlib). Every kind prints one or more tables; a cell with
several measurements is ``mean ± sample std`` and the table says ``n``. The JSON (``--out``) is
``{"kind", "inputs", "tables": [{"title", "columns", "rows"}]}``, each row a dict of the raw values
(``{"mean", "std", "n", "min", "max"}`` where several runs went into a cell).

**speed**: files written by ``benchmarks.bench`` (sections a, b, c, d), ``benchmarks/torch_peer.py``,
``benchmarks/torch_r50_peer.py``, ``benchmarks.cli_vs_bench`` and ``benchmarks/torch_gpu_peer.py``, or a
JSON list of such results (a curated bundle, each item may add ``card`` and ``date``). Results of the same
card and configuration are one row: the mean ± std of their medians, n the number of runs.

**scaling**: a ``RUNS_DIR`` written by ``benchmarks/scaling.sh`` (one folder per variant and repeat), or
JSON it wrote (``{"card", "date", "variants": {...}}``; a list of them), or files of
``benchmarks.spmd_collectives`` and ``benchmarks.memory_probe``. Per variant: ms a step (each repeat the
median of its timed epochs), images/s, weak-scaling efficiency against the one-GPU variant of the same
job at the same images per GPU, the epoch end's share of the wall clock, failed repeats.

**study**: folders written by ``benchmarks/study.py --out`` (one sub-folder per run) or the packed
``results/study/*.json`` (``python -m benchmarks.study pack``). Runs ``NAME``, ``NAME-s1``, ``NAME-s2`` ...
are the seeds of configuration ``NAME``. A run *failed* when it collapsed, diverged, a phase exited
non-zero, or it finished below the raw-pixel kNN; a run stopped by a time limit is *unfinished* and not
counted. ``--at`` adds kNN at those epochs; ``--runs`` a row per run; ``--plots=DIR`` draws the figures of
docs/results/reproduction.md (``FIGURES``) whose runs are among the inputs.

**trace**: the Perfetto trace that ``--profile_steps`` writes (``RUN/profile``): each device's kernels cut
into steps where it idled more than ``--gap_ms``; per step the span, compute and NCCL kernel time, idle
time, collectives; the host's enqueue time per step; kernel time by kind, and with ``--compare`` the
difference to another trace by kind and by kernel. A PyTorch profiler trace (``.json``) is read too.

**roofline**: a trace and the optimised HLO of the same step (``bench --profile_dir --hlo_out``): kernel time
by kind, the bytes each fusion reads and writes by the HLO's shapes, the achieved GB/s, and the step's floor
with its memory-bound kernels at the card's peak bandwidth; ``--bench`` adds the convolutions' TFLOP/s.
"""

import argparse
import collections
import datetime
import glob
import gzip
import json
import os
import re
import statistics
import sys

SEED_SUFFIX = re.compile(r"-s[0-9]+$")
RAW_PIXEL_KNN = 0.7881  # Fashion-MNIST, weighted kNN k 200, T 0.1, the 60k bank (the studies' protocol)


# ------------------------------------------------------------------------------------------------
# One format: tables of rows (dicts), rendered as Markdown


def stats(values):
    """``{"mean", "std", "n", "min", "max"}`` of the numbers in ``values`` (sample std; None for one value)."""
    values = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if not values:
        return None
    mean = sum(values) / len(values)
    std = statistics.stdev(values) if len(values) > 1 else None
    return {"mean": mean, "std": std, "n": len(values), "min": min(values), "max": max(values)}


def table(title, columns, rows):
    """``columns``: ``[(key, header, format)]``; format a ``format()`` spec, ``%`` (a share, as percent) or ``""``."""
    return {"title": title, "columns": [{"key": k, "header": h, "format": f} for k, h, f in columns], "rows": rows}


def cell(value, fmt):
    if value is None:
        return ""
    if isinstance(value, dict) and "mean" in value:
        text = cell(value["mean"], fmt)
        return text if value.get("std") is None else f"{text} ± {cell(value['std'], fmt)}"
    if isinstance(value, (list, tuple)):
        return ", ".join(cell(v, fmt) for v in value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if fmt == "%":
        return f"{100 * value:.1f} %"
    return format(value, fmt) if fmt else (f"{value:.4g}" if isinstance(value, float) else str(value))


def markdown(tables):
    out = []
    for t in tables:
        cols = t["columns"]
        out += [f"### {t['title']}", "", "| " + " | ".join(c["header"] for c in cols) + " |",
                "|" + "---|" * len(cols)]
        out += ["| " + " | ".join(cell(r.get(c["key"]), c["format"]).replace("|", "/") for c in cols) + " |"
                for r in t["rows"]]
        out.append("")
    return "\n".join(out)


def _load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _items(paths):
    """``(path, result)`` for each JSON file, a list in a file giving one item per element."""
    for path in paths:
        data = _load(path)
        if data is None:
            raise SystemExit(f"{path}: not a readable JSON file")
        for item in data if isinstance(data, list) else [data]:
            yield path, item


def _day(value):
    return str(value)[:10] if value else None


def _join(values):
    seen = []
    for v in values:
        if v and v not in seen:
            seen.append(v)
    return ", ".join(seen) if seen else None


# ------------------------------------------------------------------------------------------------
# speed


def _card(result):
    env = result.get("environment") or {}
    return result.get("card") or env.get("device") or result.get("gpu")


#: XLA flags about the files XLA keeps, writes or reads, not what it compiles (with every ``--xla_dump_*``
#: flag): left out of a run's options.
_XLA_FILES = ("--xla_gpu_per_fusion_autotune_cache_dir", "--xla_gpu_dump_autotune_results_to",
              "--xla_gpu_load_autotune_results_from")


def _xla_options(flags):
    """The compile options of an ``XLA_FLAGS`` string: every flag but the dumps and those of :data:`_XLA_FILES`."""
    names = ((f, f.split("=", 1)[0]) for f in (flags or "").split())
    return " ".join(f for f, name in names if not name.startswith("--xla_dump_") and name not in _XLA_FILES)


def speed(paths):
    bench, peers, cli = collections.OrderedDict(), collections.OrderedDict(), []
    objective, process = [], []
    for path, r in _items(paths):
        card, date = _card(r), _day(r.get("date") or (r.get("environment") or {}).get("date"))
        cfg = r.get("config") or {}
        if "a_model_only" in r or "c_device_aug" in r:  # benchmarks.bench
            env = r.get("environment") or {}
            shape = "x".join(str(v) for v in cfg.get("image_shape", []))
            model = f"{cfg.get('encoder')}, {'-'.join(map(str, cfg.get('projector_dims', [])))}, {cfg.get('objective')}"
            if cfg.get("whitening_groups", 1) != 1:
                model += f", groups={cfg['whitening_groups']}"
            if cfg.get("stop_gradient_cov"):
                model += ", stop_gradient_cov"
            if cfg.get("batch_norm", "global") != "global":
                model += f", --batch_norm={cfg['batch_norm']}"
            options = _xla_options(env.get("xla_flags"))
            if options:
                model += f", XLA_FLAGS={options}"
            devices = cfg.get("devices") or env.get("devices") or 1
            key = (card, env.get("backend"), model, shape, cfg.get("batch_size"), cfg.get("precision"), devices,
                   cfg.get("processes", 1))
            row = bench.setdefault(key, {"card": card, "backend": env.get("backend"), "model": model, "shape": shape,
                                         "batch": cfg.get("batch_size"), "precision": cfg.get("precision"),
                                         "devices": devices, "dates": [], "runs": collections.defaultdict(list)})
            row["dates"].append(date)
            for section in ("a_model_only", "c_device_aug", "b_host_aug"):
                if isinstance(r.get(section), dict) and "images_per_s" in r[section]:
                    row["runs"][section].append(r[section]["images_per_s"])
                    row["runs"][section + "_ms"].append(r[section].get("ms_per_step"))
            if isinstance(r.get("b_host_aug"), dict) and "pipeline" in r["b_host_aug"]:
                row["runs"]["pipeline"].append(r["b_host_aug"]["pipeline"]["images_per_s"])
            if isinstance(r.get("a_model_only"), dict) and "mfu" in r["a_model_only"]:
                row["runs"]["mfu"].append(r["a_model_only"]["mfu"])
            for d in r.get("d_objective") or []:
                objective.append({"card": card, "date": date, "objective": d["objective"], "variant": d["variant"],
                                  "n": d["n"], "d": d["d"], "dtype": d.get("dtype"), "ms": d["ms"],
                                  "share": d.get("frac_of_model_step")})
        elif "end_to_end" in r or "model_only" in r or ("images_per_s" in r and "config" in r):  # PyTorch peers
            if "images_per_s" in r:  # torch_r50_peer: one number a run
                runner = "torch.compile" if cfg.get("compile") else "eager"
                what, shape = "torchvision resnet50, 2048-2048-256, simaffinity", f"{cfg.get('image_size')} px"
                values = {"model_only": r["images_per_s"]}
            else:
                runner = "DataLoader, %s workers" % cfg.get("workers")
                what, shape = cfg.get("model", "torchvision resnet18").split(",")[0], "x".join(map(str, cfg.get("image_shape", [])))
                values = {k: (r.get(k) or {}).get("images_per_s") for k in ("model_only", "loader_only", "end_to_end")}
            key = (card, what, runner, shape, cfg.get("batch_size"))
            row = peers.setdefault(key, {"card": card, "peer": f"{what} ({runner})", "shape": shape,
                                         "batch": cfg.get("batch_size"), "dates": [],
                                         "runs": collections.defaultdict(list)})
            row["dates"].append(date)
            for k, v in values.items():
                row["runs"][k].append(v)
        elif "cli_training_images_per_s" in r:  # benchmarks.cli_vs_bench
            for label, res in [("", r)] + ([(" (rerun, warm cache)", r["warm_cache_rerun"])]
                                           if "warm_cache_rerun" in r else []):
                if res.get("process_phases_seconds"):
                    process.append({"card": card, "date": date, "run": (r.get("label") or "train CLI") + label,
                                    "process": res.get("cli_process_seconds"), **res["process_phases_seconds"]})
                cli.append({"card": card, "date": date, "run": (r.get("label") or "train CLI") + label,
                            "bench": res["bench_model_only_images_per_s"], "cli": res["cli_training_images_per_s"],
                            "ratio": res["ratio_cli_to_bench"], "fit_s": res["cli_fit_wall_seconds"],
                            "first_epoch_s": res["first_epoch_seconds"], "compile_s": res.get("compile_seconds_estimate"),
                            "outside": res.get("share_outside_training_steps_measured",
                                               res.get("share_outside_training_steps")),
                            "knn": res.get("final_knn_top1"), "process_s": res.get("cli_process_seconds")})
        elif "training_images_per_s" in r:  # torch_gpu_peer (or a CLI run measured the same way): a whole run
            cli.append({"card": card, "date": date, "run": r.get("label") or "PyTorch peer, GPU augmentation",
                        "cli": r["training_images_per_s"], "fit_s": r.get("wall_seconds"),
                        "first_epoch_s": r.get("first_epoch_seconds"), "compile_s": r.get("compile_seconds_estimate"),
                        "knn": r.get("final_knn_top1"), "process_s": r.get("process_seconds")})
        else:
            raise SystemExit(f"{path}: not a result of the bench, a peer or cli_vs_bench")
    tables = []
    rows = []
    for row in bench.values():
        runs = row.pop("runs")
        a, c = stats(runs["a_model_only"]), stats(runs["c_device_aug"])
        rows.append({**row, "date": _join(row.pop("dates")), "a": a, "c": stats(runs["c_device_aug"]),
                     "b": stats(runs["b_host_aug"]), "pipeline": stats(runs["pipeline"]),
                     "ms": stats(runs["a_model_only_ms"]), "mfu": stats(runs["mfu"]),
                     "c_over_a": c["mean"] / a["mean"] if a and c else None, "n": a["n"] if a else (c or {}).get("n")})
    # data-parallel rows: weak-scaling efficiency against the one-device row at the same images per device
    for row in rows:
        if row["devices"] > 1 and row["a"]:
            one = next((o for o in rows if o["devices"] == 1 and o["card"] == row["card"] and o["a"]
                        and o["shape"] == row["shape"] and o["model"] == row["model"].split(", --batch_norm")[0]
                        and o["batch"] * row["devices"] == row["batch"]), None)
            row["weak"] = row["a"]["mean"] / (row["devices"] * one["a"]["mean"]) if one else None
    if rows:
        tables.append(table("The bench: images/s (an image = two views), each run the median of its timed repetitions", [
            ("card", "card", ""), ("date", "date", ""), ("model", "model", ""), ("shape", "shape", ""),
            ("batch", "batch", ""), ("devices", "GPUs", ""), ("a", "(a) model step", ",.0f"),
            ("c", "(c) + augmentation on the device", ",.0f"), ("b", "(b) + augmentation on the host", ",.0f"),
            ("c_over_a", "(c) / (a)", ".3f"), ("pipeline", "host pipeline alone", ",.0f"),
            ("ms", "(a) ms / step", ".2f"), ("mfu", "MFU", "%"), ("weak", "weak eff.", ".3f"), ("n", "n", "")], rows))
    prow = []
    for row in peers.values():
        runs = row.pop("runs")
        prow.append({**row, "date": _join(row.pop("dates")), **{k: stats(v) for k, v in runs.items()},
                     "n": max(len(v) for v in runs.values())})
    if prow:
        tables.append(table("PyTorch peers: images/s", [
            ("card", "card", ""), ("date", "date", ""), ("peer", "peer", ""), ("shape", "shape", ""),
            ("batch", "batch", ""), ("model_only", "model step", ",.0f"), ("loader_only", "loader alone", ",.0f"),
            ("end_to_end", "end to end", ",.0f"), ("n", "n", "")], prow))
    if cli:
        tables.append(table("The train CLI against the bench's model step (one run each)", [
            ("card", "card", ""), ("date", "date", ""), ("run", "run", ""), ("fit_s", "fit wall s", ".1f"),
            ("first_epoch_s", "first epoch s", ".1f"), ("compile_s", "compile s (est.)", ".1f"),
            ("cli", "training images/s after epoch 1", ",.0f"), ("bench", "bench images/s", ",.0f"),
            ("ratio", "CLI / bench", ".3f"), ("outside", "fit outside training steps", "%"),
            ("knn", "final kNN", ".4f"), ("process_s", "process s", ".1f")], cli))
    if process:
        tables.append(table("The train CLI's process by phase, s (its metrics.json; process: timed from outside)", [
            ("card", "card", ""), ("date", "date", ""), ("run", "run", ""), ("start_up", "start-up", ".1f"),
            ("set_up", "set-up", ".1f"), ("data", "data", ".1f"), ("model", "model", ".1f"),
            ("raw_pixel_knn", "raw-pixel kNN", ".1f"), ("training", "training", ".1f"), ("saving", "saving", ".1f"),
            ("final_knn", "final kNN", ".1f"), ("wall", "wall", ".1f"), ("process", "process", ".1f")], process))
    if objective:
        tables.append(table("(d) the objective alone, forward + backward, ms a call", [
            ("card", "card", ""), ("objective", "objective", ""), ("variant", "variant", ""), ("n", "N", ""),
            ("d", "D", ""), ("dtype", "dtype", ""), ("ms", "ms", ".3f"), ("share", "of the model step", "%")],
            objective))
    return tables


# ------------------------------------------------------------------------------------------------
# scaling

LAYOUTS = {  # scaling.sh's run kinds (a variant's ``run``): GPUs, processes, what it is
    "g1": "1 GPU", "g2": "1 process x 2 GPUs", "g4": "1 process x 4 GPUs",
    "l2": "2 processes x 1 GPU (python -m uniclr_tf.launch)", "l4": "4 processes x 1 GPU (python -m uniclr_tf.launch)",
    "i2": "2 independent one-GPU runs at once (GPU 0's)", "i4": "4 independent one-GPU runs at once (GPU 0's)",
    "s1": "1 GPU at the multi-GPU global batch",
}


def collect_runs(runs_dir, first_epoch=3):
    """The variants of a ``benchmarks/scaling.sh`` RUNS_DIR: ``RUNS_DIR/VARIANT.json`` names the variant's run
    kind, GPUs and images per GPU; ``RUNS_DIR/VARIANT-rN/`` is repeat N's run folder (``history.json``,
    ``config.json``, ``metrics.json``) and ``VARIANT-rN.status`` its exit code. Each repeat's ms a step is
    the median over epochs ``first_epoch``.. of ``step_seconds`` / steps; the epoch end is an epoch's wall
    clock outside its steps."""
    env = _load(os.path.join(runs_dir, "environment.json")) or {}
    variants = collections.OrderedDict()
    for spec_path in sorted(glob.glob(os.path.join(runs_dir, "*.json")), key=os.path.getmtime):
        spec = _load(spec_path)
        if not isinstance(spec, dict) or "variant" not in spec:
            continue
        name = spec["variant"]
        repeat_ms, ends, shares, final_knn, failed = [], [], [], [], 0
        for folder in sorted(glob.glob(os.path.join(runs_dir, f"{glob.escape(name)}-r[0-9]*"))):
            if not os.path.isdir(folder):
                continue
            status = (open(folder + ".status").read().strip() if os.path.exists(folder + ".status") else "rc=?")
            if "rc=0" not in status.split():
                failed += 1
                continue
            history = _load(os.path.join(folder, "history.json")) or []
            config = _load(os.path.join(folder, "config.json")) or {}
            steps = config.get("steps_per_epoch")
            timed = [e for e in history if e.get("epoch", 0) >= first_epoch and "step_seconds" in e]
            if not steps or not timed:
                failed += 1
                continue
            repeat_ms.append(statistics.median(1000 * e["step_seconds"] / steps for e in timed))
            pairs = [(p, e) for p, e in zip(history, history[1:]) if e in timed and "wall_seconds" in e]
            if pairs:
                wall = sum(e["wall_seconds"] - p["wall_seconds"] for p, e in pairs)
                outside = wall - sum(e["step_seconds"] for _, e in pairs)
                ends.append(1000 * outside / len(pairs))
                shares.append(outside / wall)
            seconds = (_load(os.path.join(folder, "metrics.json")) or {}).get("seconds", {})
            if "final_knn" in seconds:
                final_knn.append(seconds["final_knn"])
        variants[name] = {"run": spec.get("run"), "layout": spec.get("layout") or LAYOUTS.get(spec.get("run")),
                          "gpus": spec.get("gpus", 1), "batch_per_gpu": spec.get("batch_per_gpu"),
                          "repeat_medians_ms": repeat_ms, "epoch_end_ms": ends, "epoch_end_share_of_wall": shares,
                          "final_knn_seconds": final_knn, "failed": failed}
    return {"card": env.get("card"), "date": env.get("date"), "software": env.get("software"),
            "job": f"{env['card']}, {env.get('date')}" if env.get("card") else None,
            "command": env.get("command"), "variants": variants}


def _bench_variant(jobs, r):
    """A run of the bench's model step (section a; ``--devices``, ``--num_processes``, ``--batch_norm``) or of
    ``torch_r50_peer.py`` as one repeat of a variant of the job of its card and day: ``g1``, ``base``
    (1 process x N devices), ``pN`` (N processes), ``+onepass`` / ``+perdev``; the peers ``torch.compile`` / ``eager``."""
    cfg, env = r.get("config") or {}, r.get("environment") or {}
    card, date = _card(r), _day(r.get("date") or env.get("date"))
    if "a_model_only" in r:
        devices, procs = cfg.get("devices") or 1, cfg.get("processes") or 1
        name = "g1" if devices == 1 else (f"p{procs}" if procs > 1 else "base")
        bn = cfg.get("batch_norm") or "global"
        step = r["a_model_only"]
        layout = "1 GPU" if devices == 1 else (f"{procs} processes x 1 GPU" if procs > 1 else f"1 process x {devices} GPUs")
        spec = {"run": name, "gpus": devices, "batch_per_gpu": cfg["batch_size"] // devices, "batch_norm": bn,
                "layout": f"{layout}, --batch_norm={bn}"}
        ms = 1000 * cfg["batch_size"] / step["images_per_s"]
        name = f"{name} b{spec['batch_per_gpu']} {bn}"
    else:
        name = "torch.compile" if cfg.get("compile") else "eager"
        spec = {"run": "torch", "gpus": 1, "batch_per_gpu": cfg.get("batch_size"), "peer": True,
                "layout": f"PyTorch, {name}, 1 GPU"}
        ms = 1000 * cfg["batch_size"] / r["images_per_s"]
        name = f"{name} b{cfg.get('batch_size')}"
    job = jobs.setdefault((card, date), {"card": card, "date": date, "job": f"{card}, {date}", "variants": {}})
    variant = job["variants"].setdefault(name, {**spec, "repeat_medians_ms": []})
    variant["repeat_medians_ms"].append(ms)
    mfu = (r.get("a_model_only") or r).get("mfu")
    if mfu is not None:  # model FLOPs utilisation, each side by its own FLOP count
        variant.setdefault("mfu", []).append(mfu)


def scaling(paths, first_epoch=3):
    jobs, collectives, memory, bench_jobs = [], [], [], collections.OrderedDict()
    for path in paths:
        if os.path.isdir(path):
            jobs.append((path, collect_runs(path, first_epoch)))
            continue
        for _, r in _items([path]):
            if "variants" in r:
                jobs.append((path, r))
            elif "a_model_only" in r or ("images_per_s" in r and "config" in r):
                _bench_variant(bench_jobs, r)
            elif "counts" in r and "groups" in r:
                collectives.append((path, r))
            elif "rows" in r and "fit" in r:
                memory.append((path, r))
            else:
                raise SystemExit(f"{path}: not a result of scaling.sh, the bench, spmd_collectives or memory_probe")
    jobs += [("bench", job) for job in bench_jobs.values()]
    tables, rows = [], []
    for path, job in jobs:
        job_rows = []
        for name, v in job["variants"].items():
            ms = stats(v.get("repeat_medians_ms", []))
            per_gpu, gpus = v.get("batch_per_gpu") or 512, v.get("gpus", 1)
            job_rows.append({"card": job.get("card"), "date": _day(job.get("date")),
                             "job": job.get("job") or os.path.basename(path.rstrip("/")), "variant": name,
                             "layout": v.get("layout") or LAYOUTS.get(v.get("run"), v.get("run")), "gpus": gpus,
                             "batch_per_gpu": per_gpu, "ms": ms,
                             "images_per_s": gpus * per_gpu * 1000 / ms["mean"] if ms else None,
                             "n": ms["n"] if ms else 0, "failed": v.get("failed", 0),
                             "epoch_end": stats(v.get("epoch_end_share_of_wall", [])), "mfu": stats(v.get("mfu", [])),
                             "_peer": v.get("peer", False), "_run": v.get("run"), "_bn": v.get("batch_norm"),
                             "_options": name.split("+", 1)[1] if "+" in name else ""})
        timed = [o for o in job_rows if o["images_per_s"] and not o["_peer"]]
        for row in job_rows:
            # weak scaling: the per-GPU rate over the one-GPU run's (g1; with the same scaling.sh options, e.g.
            # launch+spe over g1+spe, or the same batch norm where the runs say, when the job has it) at the same
            # images per GPU; strong: over GPUs x s1's, s1 being one GPU at this global batch
            ones = [o for o in timed if o["gpus"] == 1 and o["_run"] == "g1" and o["batch_per_gpu"] == row["batch_per_gpu"]]
            ref = next((o for o in ones if o["_options"] == row["_options"] and o["_bn"] == row["_bn"]),
                       next((o for o in ones if o["_bn"] == row["_bn"] and not o["_options"]), ones[0] if ones else None))
            ok = row["images_per_s"] and not row["_peer"] and row["_run"] != "s1"
            row["weak"] = row["images_per_s"] / row["gpus"] / ref["images_per_s"] if ok and ref else None
            s1 = next((o for o in timed if o["_run"] == "s1" and o["batch_per_gpu"] == row["gpus"] * row["batch_per_gpu"]), None)
            row["strong"] = row["images_per_s"] / (row["gpus"] * s1["images_per_s"]) if ok and s1 and row["gpus"] > 1 else None
            peers = [o for o in job_rows if o["_peer"] and o["images_per_s"] and o["batch_per_gpu"] == row["batch_per_gpu"]]
            row["vs_peer"] = row["images_per_s"] / peers[0]["images_per_s"] if peers and row["gpus"] == 1 else None
        for row in job_rows:
            row.pop("_peer"), row.pop("_run"), row.pop("_bn"), row.pop("_options")
        rows += job_rows
    if rows:
        tables.append(table("Step time over GPUs: each repeat the median ms a step of its timed epochs", [
            ("card", "card", ""), ("date", "date", ""), ("job", "job", ""), ("variant", "variant", ""),
            ("layout", "layout", ""), ("gpus", "GPUs", ""), ("batch_per_gpu", "images per GPU", ""),
            ("ms", "ms / step", ".2f"), ("images_per_s", "images/s", ",.0f"), ("weak", "weak eff.", ".3f"),
            *([("strong", "strong eff.", ".3f")] if any(r["strong"] for r in rows) else []),
            *([("vs_peer", "vs PyTorch", ".2f")] if any(r["vs_peer"] for r in rows) else []),
            *([("mfu", "MFU", "%")] if any(r["mfu"] for r in rows) else []),
            *([("epoch_end", "epoch end, share of wall", "%")] if any(r["epoch_end"] for r in rows) else []),
            ("n", "n", ""), ("failed", "failed", "")], rows))
    commands = [{"job": job.get("job") or os.path.basename(path.rstrip("/")), "card": job.get("card"),
                 "command": job["command"]} for path, job in jobs if job.get("command")]
    if commands:
        tables.append(table("The command that measured each job", [
            ("job", "job", ""), ("card", "card", ""), ("command", "command", "")], commands))
    crow = []
    for path, r in collectives:
        counts = r["counts"]
        bn = next((a.split("=", 1)[1] for a in r.get("train_args", []) if a.startswith("--batch_norm=")), "global")
        outside = sum(g.get("bytes", 0) for g in r["groups"] if g.get("op") != "all-reduce")
        crow.append({"batch_norm": r.get("label") or bn, "devices": r.get("devices"), "batch": r.get("batch_size"),
                     "total": sum(counts.values()), **{k: counts.get(k, 0) for k in (
                         "all-to-all", "collective-permute", "all-gather", "all-reduce")},
                     "outside_mib": outside / 2 ** 20})
    if crow:
        tables.append(table("Collectives XLA compiles into the data-parallel train step", [
            ("batch_norm", "--batch_norm", ""), ("devices", "devices", ""), ("batch", "global batch", ""),
            ("total", "collectives", ""), ("all-to-all", "all-to-all", ""), ("collective-permute", "permute", ""),
            ("all-gather", "all-gather", ""), ("all-reduce", "all-reduce", ""),
            ("outside_mib", "MiB outside the all-reduces", ".1f")], crow))
    mrow = []
    for path, r in memory:
        cfg, fit = r.get("config") or {}, r.get("fit") or {}
        mrow.append({"card": (r.get("environment") or {}).get("device"), "encoder": cfg.get("encoder"),
                     "image_size": (cfg.get("image_shape") or [None])[0], "mib_per_image": fit.get("b_mib_per_image"),
                     "fixed_gib": fit.get("a_gib"), "limit_gib": r.get("device_memory_limit_gib"),
                     "max_batch": r.get("predicted_max_batch")})
    if mrow:
        tables.append(table("Device memory of the train step (XLA's buffer assignment)", [
            ("card", "card", ""), ("encoder", "encoder", ""), ("image_size", "px", ""),
            ("mib_per_image", "MiB an image", ".1f"), ("fixed_gib", "fixed GiB", ".2f"),
            ("limit_gib", "memory JAX may use, GiB", ".1f"), ("max_batch", "largest batch (predicted)", "")], mrow))
    return tables


# ------------------------------------------------------------------------------------------------
# study

CURVES = ("knn_top1", "effective_rank", "embedding_std")
KEPT_METRICS = ("status", "method", "epoch", "epochs", "steps", "knn_top1", "knn_top5", "effective_rank",
                "raw_pixel_knn_top1", "below_raw_pixel_baseline", "knn_memory_bank", "knn_test")


def _card_of(folder):
    found = re.search(r"\b(h100|h200)", folder)
    return found.group(1).upper() if found else None


def pack_run(folder, card=None):
    """One run folder (as ``study.py`` copies it into ``--out``) as a small dict: status, card, final numbers,
    linear top-1 and the per-epoch curves."""
    metrics = _load(os.path.join(folder, "metrics.json")) or {}
    history = _load(os.path.join(folder, "history.json")) or []
    linear = _load(os.path.join(folder, "linear_eval.json")) or {}
    sections = {k: v for k, v in linear.items() if k.startswith("linear[") and isinstance(v, dict)}
    exits = _load(os.path.join(folder, "exits.json")) or {}
    shared = (_load(os.path.join(folder, "shared.json")) or {}).get("train")
    failed = {phase: code for phase, code in exits.items() if code not in (0, None)}
    status = metrics.get("status") or ("stopped" if history else "not started")
    if failed:
        status = ", ".join(f"{phase} exit {code}" for phase, code in failed.items())
    curves = [{"epoch": int(e["epoch"]), **{k: round(float(e[k]), 6) for k in CURVES if e.get(k) is not None}}
              for e in history if any(e.get(k) is not None for k in CURVES)]
    return {"status": status, "card": card or _card_of(folder), "epochs_done": len(history),
            "metrics": {k: metrics[k] for k in KEPT_METRICS if k in metrics},
            "linear": {k: {m: v[m] for m in ("top1", "top5") if m in v} for k, v in sections.items()},
            "history": curves, **_speed(history, metrics, _load(os.path.join(folder, "config.json")) or {}),
            **({"gpu_share": shared} if shared else {})}


def _speed(history, metrics, config):
    """``seconds``: the training's wall clock, the sum of every epoch's (steps, kNN evaluation, callbacks;
    not the start-up nor the final evaluation), over the calls that resumed it. ``images_per_s``: training
    images a second of the step clock, the median over the epochs after the first (which compiles). Both
    None where the history lacks the clocks. Runs that shared a GPU (``--per_gpu``) count their share."""
    out = {}
    if history and all(isinstance(e.get("epoch_seconds"), (int, float)) for e in history):
        out["seconds"] = round(sum(e["epoch_seconds"] for e in history), 1)
    steps, epochs, batch = metrics.get("steps"), metrics.get("epochs"), config.get("batch_size")
    timed = [e["step_seconds"] for e in history[1:] if isinstance(e.get("step_seconds"), (int, float))
             and e["step_seconds"] > 0]
    if steps and epochs and batch and timed:
        out["images_per_s"] = round(steps / epochs * batch / statistics.median(timed), 1)
    return out


def load_runs(paths, only=None):
    """``{name: packed run}`` over study ``--out`` folders and packed JSON files (only the runs named, if
    ``only``); a name found twice keeps its first finished run. Each run gets ``date`` from its packed file
    when the file has one."""
    runs = collections.OrderedDict()
    for path in paths:
        if os.path.isdir(path):
            found = {n: pack_run(os.path.join(path, n)) for n in sorted(os.listdir(path))
                     if os.path.isdir(os.path.join(path, n))}
            date = None
        else:
            data = _load(path)
            if not isinstance(data, dict) or "runs" not in data:
                raise SystemExit(f"{path}: not a study folder or a packed study (python -m benchmarks.study pack)")
            found, date = data["runs"], data.get("date")
        for name, run in found.items():
            if only is not None and name not in only:
                continue
            if name not in runs or (runs[name]["status"] != "finished" and run["status"] == "finished"):
                runs[name] = {**run, "date": run.get("date", date)}
    return runs


def _knn_at(run, epoch):
    return next((e["knn_top1"] for e in run["history"] if e["epoch"] == epoch and "knn_top1" in e), None)


def outcome(run):
    """``("finished" | "failed" | "unfinished", why)``."""
    status, metrics = run["status"], run["metrics"]
    if status in ("collapsed", "diverged"):
        return "failed", f"{status} @{metrics.get('epoch', run.get('epochs_done'))}"
    if status.endswith((" exit 143", " exit -15")):  # SIGTERM: a time limit stopped it, it resumes
        if not (status.startswith("linear_eval") and metrics.get("status") == "finished"):
            return "unfinished", status
        status = "finished"  # the training ended; only its linear evaluation was stopped: kNN, no linear
    if " exit " in status:
        return "failed", status
    if status != "finished":
        return "unfinished", status
    raw, knn = metrics.get("raw_pixel_knn_top1"), metrics.get("knn_top1")
    if metrics.get("below_raw_pixel_baseline") or (raw is not None and knn is not None and knn < raw):
        return "failed", f"below raw pixels ({knn:.4f})" if knn is not None else "below raw pixels"
    return "finished", ""


def _linear(run):
    values = [v["top1"] for v in run.get("linear", {}).values() if "top1" in v]
    return values[0] if values else None


def study(paths, at=(), per_run=False, only=None):
    runs = load_runs(paths, only)
    groups = collections.OrderedDict()
    for name, run in runs.items():
        groups.setdefault(SEED_SUFFIX.sub("", name), []).append((name, run))
    rows = []
    for config, members in groups.items():
        done = [(n, r) for n, r in members if outcome(r)[0] == "finished"]
        failed = [(n, outcome(r)[1]) for n, r in members if outcome(r)[0] == "failed"]
        finished = [r for _, r in done]
        row = {"configuration": config, "card": _join(r.get("card") for _, r in members),
               "date": _join(_day(r.get("date")) for _, r in members), "n": len(done) + len(failed),
               "failed": len(failed), "why": "; ".join(f"{n}: {w}" for n, w in failed) or None,
               "unfinished": sum(1 for _, r in members if outcome(r)[0] == "unfinished"),
               "epochs": _join(str(r["metrics"].get("epochs") or r.get("epochs_done")) for r in finished),
               "knn": stats(r["metrics"].get("knn_top1") for r in finished),
               "linear": stats(_linear(r) for r in finished),
               "minutes": stats(r["seconds"] / 60 for r in finished if r.get("seconds") is not None),
               "images_per_s": stats(r.get("images_per_s") for r in finished),
               "gpu_share": _join(str(r["gpu_share"]) for r in finished if r.get("gpu_share"))}
        row["knn_min"] = row["knn"]["min"] if row["knn"] else None
        for epoch in at:
            row[f"knn@{epoch}"] = stats(_knn_at(r, epoch) for r in finished)
        rows.append(row)
    marks = [(f"knn@{e}", f"kNN @{e}", ".4f") for e in at]
    columns = [("configuration", "configuration", ""), ("card", "card", ""), ("date", "date", ""),
               ("n", "n", ""), ("failed", "failed", ""), *marks, ("knn", "final kNN top-1", ".4f"),
               ("knn_min", "min", ".4f"), ("linear", "linear top-1", ".4f"), ("epochs", "epochs", ""),
               ("minutes", "wall clock, min", ".1f"), ("images_per_s", "images/s", ".0f")]
    if any(r["gpu_share"] for r in rows):  # how many runs shared a GPU: images/s is a run's share
        columns.append(("gpu_share", "runs a GPU", ""))
    if any(r["unfinished"] for r in rows):
        columns.append(("unfinished", "unfinished", ""))
    if any(r["why"] for r in rows):
        columns.append(("why", "failures", ""))
    tables = [table("Per configuration: mean ± std over the seeds that finished; failed: collapsed, diverged, "
                    "a phase failed, or below raw pixels", columns, rows)]
    if per_run:
        tables.append(table("Per run", [
            ("name", "run", ""), ("card", "card", ""), ("status", "status", ""), ("epochs", "epochs", ""),
            *marks, ("knn", "final kNN top-1", ".4f"), ("linear", "linear top-1", ".4f"),
            ("rank", "effective rank", ".0f"), ("std", "embedding std", ".4f")],
            [{"name": n, "card": r.get("card"), "status": r["status"], "epochs": r.get("epochs_done"),
              **{f"knn@{e}": _knn_at(r, e) for e in at}, "knn": r["metrics"].get("knn_top1"), "linear": _linear(r),
              "rank": (r["history"] or [{}])[-1].get("effective_rank"),
              "std": (r["history"] or [{}])[-1].get("embedding_std")} for n, r in runs.items()]))
    return tables, runs


# The figures of docs/results/reproduction.md: name -> (title, metric, y range, raw-pixel line, curves); a curve
# is (label, configuration) - the mean of its finished seeds with a band of one std - or (label, run, "one").
FIGURES = {
    "recipe-mc4-seeds.png": (
        "SimAffinity, 200 epochs: the default recipe (4 local crops) against two views", "knn_top1", None, True,
        [("SimAffinity + 4 local crops", "sgd-t0.2-e200-mc4"), ("SimAffinity two views τ 0.2", "sgd-t0.2-e200")]),
    "claim-a-methods-200-zoom.png": (
        "200 epochs, two views, SGD 0.06 / wd 5e-4 for every method (seed 0)", "knn_top1", (0.82, 0.905), False,
        [("SimAffinity τ0.1 γ0.01", "sgd-t0.1-e200", "one"), ("SimAffinity τ0.1 γ0", "aff-t0.1-g0-e200", "one"),
         ("SimWhitening τ0.2 γ0.01", "simwhitening-sgd-t0.2-e200", "one"), ("SimTrace", "simtrace-sgd-e200", "one"),
         ("SimTrace+pred+EMA", "simtrace-tricks-e200", "one"), ("SimCLR", "simclr-e200", "one"),
         ("MoCo v2", "moco_v2-e200", "one"), ("MoCo v3", "moco_v3-e200", "one"), ("CO2", "co2-e200", "one"),
         ("BYOL", "byol-e200", "one"), ("Barlow Twins", "barlow_twins-e200", "one"), ("VICReg", "vicreg-e200", "one")]),
    "claim-a-ema-seeds-200.png": (
        "200 epochs: the methods with an EMA target (mean of 3 seeds, band: ± one std)", "knn_top1", (0.80, 0.905),
        False, [("SimAffinity τ0.2 γ0.01", "sgd-t0.2-e200"), ("SimAffinity + EMA + predictor", "simaffinity-ema-pred-e200"),
                ("BYOL", "byol-e200"), ("MoCo v2", "moco_v2-e200"), ("MoCo v3", "moco_v3-e200"), ("CO2", "co2-e200")]),
    "claim-bc-simaffinity.png": (
        "(b, c) SimAffinity with and without τ and γ, 50 epochs (mean of 3 seeds ± std)", "knn_top1", (0.79, 0.87),
        False, [("τ 0.1, γ 0.01", "aff-t0.1-g0.01"), ("τ 0.1, γ 0", "aff-t0.1-g0"), ("τ 1, γ 0.01", "aff-t1-g0.01"),
                ("τ 1, γ 0", "aff-t1-g0")]),
    "knn-new-methods.png": (
        "SwAV, DINO, Zero-CL and a ViT-Tiny, 100 epochs (mean of the seeds ± std)", "knn_top1", None, True,
        [("SwAV", "swav"), ("SwAV + 6 local crops", "swav-mc"), ("DINO", "dino"), ("DINO + 6 local crops", "dino-mc"),
         ("Zero-CL", "zero_cl"), ("ViT-Tiny/4 + SimAffinity (1 run, stopped)", "vit_tiny-simaffinity", "one")]),
}


def curve(runs, name, metric, one=False):
    """``(epochs, means, stds, seeds)`` of configuration ``name`` (its finished seeds; or run ``name`` alone)."""
    members = [runs[name]] if one and name in runs else [
        r for n, r in runs.items() if SEED_SUFFIX.sub("", n) == name and outcome(r)[0] == "finished"]
    series = [{e["epoch"]: e[metric] for e in r["history"] if metric in e} for r in members]
    series = [s for s in series if s]
    if not series:
        return None
    epochs = sorted(set.intersection(*(set(s) for s in series)))
    means = [statistics.fmean(s[e] for s in series) for e in epochs]
    stds = [statistics.stdev(s[e] for s in series) if len(series) > 1 else 0.0 for e in epochs]
    return epochs, means, stds, len(series)


def plots(runs, folder):
    """Draws every figure of FIGURES with at least one curve among ``runs``; returns the files written."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    os.makedirs(folder, exist_ok=True)
    written = []
    for name, (title, metric, ylim, raw, curves) in FIGURES.items():
        drawn = [(spec[0], curve(runs, spec[1], metric, len(spec) > 2)) for spec in curves]
        drawn = [(label, c) for label, c in drawn if c]
        if not drawn:
            continue
        figure = Figure(figsize=(9.5 if len(drawn) > 6 else 7, 4.5), dpi=110)
        axes = figure.subplots()
        for index, (label, (epochs, means, stds, seeds)) in enumerate(drawn):
            line, = axes.plot(epochs, means, marker=".", linestyle=("-", "--", ":")[index // 10 % 3],
                              label=label + (f" ({seeds} seeds)" if seeds > 1 else ""))
            if seeds > 1:
                axes.fill_between(epochs, [m - s for m, s in zip(means, stds)], [m + s for m, s in zip(means, stds)],
                                  color=line.get_color(), alpha=0.2, linewidth=0)
        if raw:
            axes.axhline(RAW_PIXEL_KNN, color="grey", linestyle="--", linewidth=1, label="raw pixels")
        if ylim:
            axes.set_ylim(*ylim)
        axes.set_xlabel("epoch")
        axes.set_ylabel({"knn_top1": "kNN top-1 (k 200, T 0.1, 60k bank)"}.get(metric, metric))
        axes.set_title(title, fontsize=10)
        axes.grid(alpha=0.3)
        if len(drawn) > 6:
            axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        else:
            axes.legend(fontsize=8)
        figure.tight_layout()
        path = os.path.join(folder, name)
        figure.savefig(path + ".tmp.png")
        os.replace(path + ".tmp.png", path)
        written.append(path)
    return written


# ------------------------------------------------------------------------------------------------
# trace


def load_trace(path):
    """The events of a trace: a folder (its newest ``perfetto_trace.json.gz``, as JAX's profiler writes),
    a ``.json.gz`` or a ``.json`` file. A PyTorch profiler trace (``export_chrome_trace``: kernels are
    events of category ``kernel``) becomes one device, ``/device:GPU:0``, holding its kernels."""
    if os.path.isdir(path):
        found = sorted(glob.glob(os.path.join(path, "**", "perfetto_trace.json.gz"), recursive=True))
        if not found:
            raise SystemExit(f"{path}: no perfetto_trace.json.gz below it (was the run traced with --profile_steps?)")
        path = found[-1]
    try:
        with (gzip.open(path) if path.endswith(".gz") else open(path, "rb")) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit(f"{path}: not a readable trace ({type(e).__name__}: {e})") from None
    if isinstance(data, dict) and "traceEvents" not in data:
        raise SystemExit(f"{path}: not a trace (no traceEvents)")
    events = data["traceEvents"] if isinstance(data, dict) else data
    kernels = [e for e in events if e.get("cat") == "kernel" and e.get("ph") == "X"]
    if kernels:  # PyTorch's profiler
        return [{"ph": "M", "name": "process_name", "pid": "torch-gpu", "args": {"name": "/device:GPU:0"}}] + [
            {**e, "pid": "torch-gpu"} for e in kernels]
    return events


def busy(events):
    """Microseconds during which at least one of ``events`` ran (the union of their intervals)."""
    total, start, end = 0.0, None, None
    for e in sorted(events, key=lambda e: e["ts"]):
        s, t = e["ts"], e["ts"] + e.get("dur", 0)
        if end is None or s > end:
            total += 0 if end is None else end - start
            start, end = s, t
        else:
            end = max(end, t)
    return total + (0 if end is None else end - start)


def _is_nccl(event):
    return "nccl" in event["name"].lower()


def _device_steps(kernels, gap_us):
    kernels = sorted(kernels, key=lambda e: e["ts"])
    steps = [[kernels[0]]] if kernels else []
    for before, e in zip(kernels, kernels[1:]):
        if e["ts"] - (before["ts"] + before.get("dur", 0)) > gap_us:
            steps.append([])
        steps[-1].append(e)
    return steps


CONV_KEYS = ("xmma", "cutlass", "cudnn", "gemm", "nvjet", "wgrad", "dgrad", "fprop", "implicit", "conv", "triton_tem")
COPY_KEYS = ("transpose", "copy", "memcpy", "memset")
XLA_FUSION_PREFIXES = ("loop_", "input_", "wrapped_")  # XLA's kernels of a fusion (wrapped_: of one op)


def kernel_kind(name):
    """A kernel's kind: nccl, conv/matmul (cuDNN, cuBLAS, CUTLASS, XLA's and Inductor's GEMM kernels),
    transpose/copy, reduce fusion (XLA's reductions, Inductor's ``triton_red``/``triton_per``), other fusion
    (XLA's loop fusions, Inductor's ``triton_poi``) or other. A fusion named after a ``convert`` is a fusion."""
    low = name.lower()
    if "nccl" in low:
        return "nccl"
    if low.startswith(("triton_red", "triton_per")):
        return "reduce fusion"
    if low.startswith("triton_poi"):
        return "other fusion"
    fusion = ("fusion" in low or low.startswith(XLA_FUSION_PREFIXES)) and not any(k in low for k in ("gemm", "dot"))
    if not fusion and any(k in low.replace("convert", "") for k in CONV_KEYS):
        return "conv/matmul"
    if any(k in low for k in COPY_KEYS):
        return "transpose/copy"
    if "reduce" in low:
        return "reduce fusion"
    return "other fusion" if fusion else "other"


def device_step_count(clusters, host_steps=0):
    """How many steps a device ran in a trace, from its own kernels: the count most kernel names share (XLA
    names each fusion of a program apart, and a program runs each once a step). Without kernels, the host's
    count ``host_steps``, else the number of clusters (0 for none). The host's enqueues can miss a step
    whose enqueue began before the trace did."""
    counts = collections.Counter(e["name"] for kernels in clusters for e in kernels)
    if not counts:
        return host_steps or len(clusters)
    shared = collections.Counter(counts.values())
    return max(shared, key=lambda n: (shared[n], n))


def _per_step_times(clusters, steps, top=25):
    kinds, names = collections.Counter(), collections.Counter()
    for kernels in clusters:
        for e in kernels:
            kinds[kernel_kind(e["name"])] += e.get("dur", 0) / 1e3
            names[e["name"].split("(")[0][:120]] += e.get("dur", 0) / 1e3
    n = max(1, steps)
    return ({k: round(v / n, 4) for k, v in kinds.most_common()},
            {k: round(v / n, 4) for k, v in names.most_common(top)})


def _step_row(kernels):
    span = kernels[-1]["ts"] + kernels[-1].get("dur", 0) - kernels[0]["ts"]
    nccl = [e for e in kernels if _is_nccl(e)]
    compute = [e for e in kernels if not _is_nccl(e)]
    kinds = collections.Counter(e["name"].split("(")[0].replace("ncclDevKernel_", "") for e in nccl)
    return {"kernels": len(kernels), "span_ms": span / 1e3, "compute_ms": busy(compute) / 1e3,
            "nccl_ms": busy(nccl) / 1e3, "idle_ms": (span - busy(kernels)) / 1e3, "collectives": dict(kinds)}


def _devices_and_steps(events, gap_ms, min_kernels):
    """What the trace reports share: ``(devices, enqueue, host, steps_traced)``, ``devices`` each GPU's or
    TPU's steps (clusters of at least ``min_kernels`` kernels between idle gaps over ``gap_ms``) by name,
    ``enqueue`` the host's ms to enqueue each step by device index (``GpuExecutable::ExecuteThunks``),
    ``host`` the host's events, ``steps_traced`` the most steps one device was given (0 without them)."""
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    spans = [e for e in events if e.get("ph") == "X"]
    host = [e for e in spans if names.get(e["pid"], "").startswith("/host")]
    enqueue = collections.defaultdict(list)
    for e in host:
        if e["name"].endswith("GpuExecutable::ExecuteThunks"):
            device = e["name"].split("]")[0].lstrip("[") if e["name"].startswith("[") else "0"
            enqueue[device].append(e["dur"] / 1e3)
    devices = {name: [s for s in _device_steps([e for e in spans if e["pid"] == pid], gap_ms * 1e3)
                      if len(s) >= min_kernels]
               for pid, name in sorted(names.items()) if "GPU" in name or "TPU" in name}
    return devices, enqueue, host, max((len(v) for v in enqueue.values()), default=0)


def summarise_trace(events, gap_ms=2.5, min_kernels=100):
    """Per device its steps (``_step_row``), kernel ms a step by kind and by kernel; the host's enqueue ms a
    step per device (``GpuExecutable::ExecuteThunks``) and CUDA-graph launches a device-step."""
    devices, enqueue, host, steps_traced = _devices_and_steps(events, gap_ms, min_kernels)
    out = {"devices": {}, "host": {}, "kinds_ms_per_step": {}, "top_kernels_ms_per_step": {},
           "busy_ms_per_step": {}, "steps_traced": steps_traced, "steps_by_kernels": {}}
    for name, clusters in devices.items():
        out["devices"][name] = [_step_row(s) for s in clusters]
        n = out["steps_by_kernels"][name] = device_step_count(clusters, steps_traced)
        out["kinds_ms_per_step"][name], out["top_kernels_ms_per_step"][name] = _per_step_times(clusters, steps=n)
        out["busy_ms_per_step"][name] = round(sum(busy(c) for c in clusters) / 1e3 / max(1, n), 4)
    out["host"]["enqueue_ms_per_step"] = {d: statistics.median(v) for d, v in sorted(enqueue.items())}
    graphs = sum(1 for e in host if e["name"] == "command_buffer::execute")
    out["host"]["graph_launches_per_device_step"] = graphs / max(1, steps_traced * max(1, len(enqueue)))
    out["host"]["python_events"] = sum(1 for e in host if e["name"].startswith("$"))
    return out


def _first(per_device):
    return next(iter(per_device.values()), {}) if per_device else {}


def _steps_said(summary):
    """The steps a summary's per-step times are divided by, and the host's count where it differs."""
    n = _first(summary["steps_by_kernels"]) or 0
    host = summary["steps_traced"]
    return f"{n} steps by its kernels" + (f", {host} enqueued by the host" if host and host != n else "")


#: the kind table's last row: the time a step has at least one kernel running (kernels on several streams
#: overlap, so it can be less than their summed time)
BUSY = "time with a kernel running"


def trace(path, compare=None, gap_ms=2.5, min_kernels=100):
    summary = summarise_trace(load_trace(path), gap_ms, min_kernels)
    enqueue = summary["host"]["enqueue_ms_per_step"]
    rows = []
    for device, steps in summary["devices"].items():
        index = device.rsplit(":", 1)[-1]
        rows.append({"device": device, "steps": len(steps), **{k: stats(s[k] for s in steps) for k in (
            "kernels", "span_ms", "compute_ms", "nccl_ms", "idle_ms")},
            "collectives": ", ".join(f"{k} {v}" for k, v in sorted(collections.Counter(
                {k: v for s in steps[:1] for k, v in s["collectives"].items()}).items())) or None,
            "enqueue_ms": enqueue.get(index, enqueue.get("0") if len(enqueue) == 1 else None)})
    tables = [table(f"Traced steps by device ({os.path.basename(path.rstrip('/'))}; CUDA-graph launches a "
                    f"device-step: {summary['host']['graph_launches_per_device_step']:.0f}"
                    + (f"; {summary['host']['python_events']} Python events: the Python tracer was on"
                       if summary["host"]["python_events"] else "") + ")", [
        ("device", "device", ""), ("steps", "steps", ""), ("kernels", "kernels", ".0f"), ("span_ms", "span ms", ".2f"),
        ("compute_ms", "compute ms", ".2f"), ("nccl_ms", "NCCL ms", ".2f"), ("idle_ms", "idle ms", ".2f"),
        ("enqueue_ms", "host enqueue ms", ".2f"), ("collectives", "collectives of a step", "")], rows)]
    ka = _first(summary["kinds_ms_per_step"])
    if compare is None:
        rows = [{"kind": k, "a": v} for k, v in ka.items()] + [
            {"kind": BUSY, "a": _first(summary["busy_ms_per_step"]) or 0}]
        tables.append(table(f"Kernel ms a step by kind (first device; {_steps_said(summary)})",
                            [("kind", "kind", ""), ("a", "ms", ".3f")], rows))
        return tables, summary
    other = summarise_trace(load_trace(compare), gap_ms, min_kernels)
    kb = _first(other["kinds_ms_per_step"])
    kinds = sorted(set(ka) | set(kb), key=lambda k: -max(ka.get(k, 0), kb.get(k, 0)))
    rows = [{"kind": k, "a": ka.get(k, 0), "b": kb.get(k, 0), "diff": kb.get(k, 0) - ka.get(k, 0)} for k in kinds]
    rows.append({"kind": "total", "a": sum(ka.values()), "b": sum(kb.values()), "diff": sum(kb.values()) - sum(ka.values())})
    ba, bb = _first(summary["busy_ms_per_step"]) or 0, _first(other["busy_ms_per_step"]) or 0
    rows.append({"kind": BUSY, "a": ba, "b": bb, "diff": bb - ba})
    ta, tb = _first(summary["top_kernels_ms_per_step"]), _first(other["top_kernels_ms_per_step"])
    diffs = sorted(set(ta) | set(tb), key=lambda k: -abs(tb.get(k, 0) - ta.get(k, 0)))[:15]
    tables += [table(f"Kernel ms a step by kind (first device): A = {path} ({_steps_said(summary)}), "
                     f"B = {compare} ({_steps_said(other)})", [
        ("kind", "kind", ""), ("a", "A", ".3f"), ("b", "B", ".3f"), ("diff", "B − A", "+.3f")], rows),
        table("Kernels whose ms a step differ most (absent from one side's top 25: 0 there)", [
            ("kernel", "kernel", ""), ("a", "A", ".3f"), ("b", "B", ".3f"), ("diff", "B − A", "+.3f")],
            [{"kernel": k[:100], "a": ta.get(k, 0), "b": tb.get(k, 0), "diff": tb.get(k, 0) - ta.get(k, 0)} for k in diffs])]
    return tables, summary


# ------------------------------------------------------------------------------------------------
# roofline: a traced step's kernels against the bytes XLA's HLO says they move

DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2,
               "f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8, "c64": 8, "c128": 16}
PEAK_HBM_GBPS = {"H200": 4800.0, "H100": 3350.0}  # NVIDIA's data sheets (SXM)
_SHAPE = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s+([a-z][\w\-]*)\((.*?)\)(.*)$")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")


def type_bytes(text):
    """Bytes of an HLO type (``bf16[256,56,56,64]{3,2,1,0}`` or a tuple of them)."""
    total = 0
    for dtype, dims in _SHAPE.findall(text):
        n = 1
        for d in filter(None, dims.split(",")):
            n *= int(d)
        total += DTYPE_BYTES.get(dtype, 0) * n
    return total


def kernel_key(name):
    return re.sub(r"[.\-]", "_", name.split("(")[0].strip())


def hlo_fusion_bytes(text):
    """``{kernel name: bytes read and written}`` of the fusions of an optimised HLO module (``compiled.as_text()``,
    ``bench --hlo_out``): each fusion's operands plus its results, outside the computations fusions call. A
    fusion that reads a slice of an operand is counted with all of it (an upper bound)."""
    called = set(re.findall(r"calls=%?([\w.\-]+)", text))
    sizes, out, current = {}, {}, None
    for line in text.splitlines():
        m = _COMPUTATION.match(line) if line[:1] not in ("", " ", "\t") else None
        if m:
            current = m.group(1)
            for name, typ in re.findall(r"([\w.\-]+):\s*([^,()]+(?:\([^)]*\))?)", line.split("->")[0]):
                sizes[name] = type_bytes(typ)
            continue
        m = _INSTRUCTION.match(line)
        if not m or current in called:
            continue
        name, typ, op, operands = m.group(1), m.group(2), m.group(3), m.group(4)
        sizes[name] = type_bytes(typ)
        if op == "fusion":
            out[kernel_key(name)] = sizes[name] + sum(sizes.get(o, 0) for o in re.findall(r"%([\w.\-]+)", operands))
    return out


def roofline(trace_path, hlo_path, bench_path=None, peak_gbps=0.0, gap_ms=2.5, min_kernels=100):
    """Kernel time a step by kind against the bytes the fusions move (from the HLO) and the FLOPs of the
    convolutions and matmuls (``flops_per_image`` × batch of the bench's JSON): achieved GB/s and TFLOP/s,
    and the time the memory-bound kernels would take at the card's peak HBM bandwidth."""
    devices, _, _, steps_traced = _devices_and_steps(load_trace(trace_path), gap_ms, min_kernels)
    steps = next((clusters for name, clusters in devices.items() if "GPU" in name), None)
    if steps is None:
        raise SystemExit(f"{trace_path}: no GPU device in the trace")
    if not steps:
        raise SystemExit(f"{trace_path}: no step of {min_kernels} kernels or more")
    try:
        with open(hlo_path) as f:
            fusion_bytes = hlo_fusion_bytes(f.read())
    except OSError as e:
        raise SystemExit(f"{hlo_path}: cannot read the HLO ({e.strerror})") from None
    if not fusion_bytes:
        raise SystemExit(f"{hlo_path}: no fusion in it (is it `bench --hlo_out`'s optimised HLO?)")
    bench = _load(bench_path) if bench_path else {}
    a = bench.get("a_model_only", {}) if isinstance(bench, dict) else {}
    device = str(bench.get("environment", {}).get("device", "")) if isinstance(bench, dict) else ""
    peak = peak_gbps or next((v for k, v in PEAK_HBM_GBPS.items() if k in device), 0.0)
    step_flops = a.get("flops_per_image", 0) * bench.get("config", {}).get("batch_size", 0) if a else 0
    n = device_step_count(steps, steps_traced)  # back-to-back steps make one cluster
    kinds = collections.defaultdict(lambda: {"kernels": 0, "ms": 0.0, "bytes": 0, "matched_ms": 0.0})
    per_kernel = collections.defaultdict(lambda: {"ms": 0.0, "bytes": 0, "calls": 0})
    for kernels in steps:
        for e in kernels:  # each kernel's share of one step
            key, ms = kernel_key(e["name"]), e.get("dur", 0) / 1e3 / n
            k = kinds[kernel_kind(e["name"])]
            k["kernels"] += 1 / n
            k["ms"] += ms
            if key in fusion_bytes:
                k["bytes"] += fusion_bytes[key] / n
                k["matched_ms"] += ms
                pk = per_kernel[key]
                pk["ms"] += ms
                pk["bytes"] += fusion_bytes[key] / n
                pk["calls"] += 1 / n
    total = sum(k["ms"] for k in kinds.values())
    rows = []
    for kind, k in sorted(kinds.items(), key=lambda kv: -kv[1]["ms"]):
        row = {"kind": kind, "kernels": k["kernels"], "ms": k["ms"], "share": k["ms"] / total if total else None}
        if k["bytes"]:
            row.update(gb=k["bytes"] / 1e9, gbps=k["bytes"] / 1e6 / k["matched_ms"] if k["matched_ms"] else None,
                       floor_ms=k["bytes"] / 1e6 / peak if peak else None, matched=k["matched_ms"] / k["ms"])
        if kind == "conv/matmul" and step_flops:
            row["tflops"] = step_flops / 1e9 / k["ms"]
        rows.append(row)
    memory = [r for r in rows if r["kind"] not in ("conv/matmul", "nccl") and r.get("gb")]
    mem_ms = sum(r["ms"] for r in memory)
    mem_floor = sum(r["floor_ms"] or 0 for r in memory) if peak else None
    conv_ms = kinds["conv/matmul"]["ms"] if "conv/matmul" in kinds else 0.0
    rest = round(total - mem_ms - conv_ms, 9)  # kernels of no fusion in the HLO and no convolution
    summary = {"steps": n, "kernel_ms": total, "conv_ms": conv_ms, "memory_bound_ms": mem_ms, "rest_ms": rest,
               "memory_bound_gb": sum(r["gb"] for r in memory), "peak_gbps": peak or None,
               "memory_floor_ms": mem_floor, "step_flops": step_flops or None,
               "conv_tflops": step_flops / 1e9 / conv_ms if step_flops and conv_ms else None,
               "floor_ms": conv_ms + rest + mem_floor if mem_floor is not None else None,
               "bench_ms_per_step": a.get("ms_per_step")}
    top = sorted(per_kernel.items(), key=lambda kv: -kv[1]["ms"])[:15]
    tables = [
        table(f"Kernel time a step by kind ({n} traced steps; GB: the fusions' operands and results in the HLO; "
              f"floor: those bytes at {peak:.0f} GB/s)" if peak else f"Kernel time a step by kind ({n} traced steps)", [
            ("kind", "kind", ""), ("kernels", "kernels", ".0f"), ("ms", "ms", ".2f"), ("share", "share", "%"),
            ("gb", "GB", ".2f"), ("gbps", "GB/s", ".0f"), ("floor_ms", "ms at peak bandwidth", ".2f"),
            ("matched", "time matched to the HLO", "%"), ("tflops", "TFLOP/s", ".0f")], rows),
        table("The step against its floor (convolutions as measured, the memory-bound kernels at peak bandwidth)", [
            ("what", "", ""), ("value", "", "")],
            [{"what": k.replace("_", " "), "value": v} for k, v in summary.items() if v is not None]),
        table("Memory-bound kernels taking the most time a step", [
            ("kernel", "kernel", ""), ("calls", "calls", ".0f"), ("ms", "ms", ".3f"), ("mb", "MB", ".1f"),
            ("gbps", "GB/s", ".0f")],
            [{"kernel": k[:80], "calls": v["calls"], "ms": v["ms"], "mb": v["bytes"] / 1e6,
              "gbps": v["bytes"] / 1e6 / v["ms"] if v["ms"] else None} for k, v in top]),
    ]
    return tables, summary


# ------------------------------------------------------------------------------------------------


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=("speed", "scaling", "study", "trace", "roofline"))
    parser.add_argument("results", nargs="+")
    parser.add_argument("--out", default="", help="also write the tables as JSON here")
    parser.add_argument("--at", default="", help="study: kNN at these epochs too (comma-separated)")
    parser.add_argument("--runs", action="store_true", help="study: a row per run too")
    parser.add_argument("--plots", default="", help="study: draw the figures (FIGURES) into this folder")
    parser.add_argument("--compare", default=None, help="trace: another trace, kernel time against this one")
    parser.add_argument("--gap_ms", type=float, default=2.5, help="trace: device idle time between two steps")
    parser.add_argument("--min_kernels", type=int, default=100, help="trace: fewer kernels than this is not a step")
    parser.add_argument("--first_epoch", type=int, default=3, help="scaling: a RUNS_DIR's runs are timed from this epoch on")
    parser.add_argument("--bench", default=None, help="roofline: the bench's JSON of the traced step (FLOPs, card)")
    parser.add_argument("--peak_gbps", type=float, default=0.0, help="roofline: the card's HBM GB/s (0: from --bench's card)")
    args = parser.parse_args(argv)
    extra = {}
    if args.kind == "speed":
        tables = speed(args.results)
    elif args.kind == "scaling":
        tables = scaling(args.results, args.first_epoch)
    elif args.kind == "study":
        tables, runs = study(args.results, [int(e) for e in args.at.split(",") if e], args.runs)
        if args.plots:
            extra["plots"] = plots(runs, args.plots)
    elif args.kind == "roofline":
        if len(args.results) != 2:
            parser.error("roofline: a trace and the HLO of its step (bench --hlo_out)")
        tables, extra["summary"] = roofline(*args.results, args.bench, args.peak_gbps, args.gap_ms, args.min_kernels)
    else:
        if len(args.results) != 1:
            parser.error("trace: one trace (and --compare=OTHER)")
        tables, extra["summary"] = trace(args.results[0], args.compare, args.gap_ms, args.min_kernels)
    print(markdown(tables))
    for path in extra.get("plots", []):
        print(f"wrote {path}")
    if args.out:
        result = {"kind": args.kind, "inputs": args.results,
                  "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                  "tables": tables, **extra}
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1)
        os.replace(tmp, args.out)
        print(f"wrote {args.out}")
    return tables


if __name__ == "__main__":
    sys.exit(0 if main() is not None else 1)
