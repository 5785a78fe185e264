"""benchmarks/study.py: the plan format, the command each run gets, and the table from run files."""

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
import study  # noqa: E402


def write(path, text):
    path.write_text(text)
    return path


def test_plan_common_flags_order_and_errors(tmp_path, capsys):
    plan = write(tmp_path / "p.plan", "# comment\ncommon: --epochs=5 \\\n  --knn_every=5\n"
                 "a  --flagfile=configs/simtrace.flags --epochs=7  # own flags win\nb --seed=1\n")
    common, runs = study.read_plan(plan)
    assert common == ["--epochs=5", "--knn_every=5"]
    assert runs == [("a", ["--flagfile=configs/simtrace.flags", "--epochs=7"]), ("b", ["--seed=1"])]
    study.main([f"--plan={plan}", f"--out={tmp_path / 'out'}", "--gpus=0,1", "--dry_run", "--python=py"])
    out = capsys.readouterr().out
    # flagfile first, then the common flags, then the run's own (later flags win in absl)
    assert ("py -m uniclr_tf.train --flagfile=configs/simtrace.flags --epochs=5 --knn_every=5 --epochs=7 "
            f"--run_dir=/tmp/uniclr-study --run_name=a --verbose=2 --nopictures") in out
    assert "gpu 1: train b" in out or "gpu 0: train b" in out
    with pytest.raises(SystemExit, match="repeated"):
        study.read_plan(write(tmp_path / "bad.plan", "a --x=1\na --x=2\n"))
    with pytest.raises(SystemExit, match="no run"):
        study.read_plan(write(tmp_path / "empty.plan", "common: --epochs=1\n"))
    with pytest.raises(SystemExit, match="not in"):
        study.main([f"--plan={plan}", f"--out={tmp_path / 'out'}", "--only=zz", "--dry_run"])


def test_summary_reads_history_metrics_linear_and_exit_codes(tmp_path):
    out = tmp_path / "out"
    done, failed = out / "done", out / "failed"
    done.mkdir(parents=True)
    failed.mkdir()
    history = [{"epoch": e, "step_seconds": 2.0 if e > 1 else 30.0, "embedding_std": 0.06, "wall_seconds": 10.0 * e,
                **({"knn_top1": round(0.8 + e / 1000, 3)} if e % 25 == 0 else {})} for e in range(1, 51)]
    (done / "history.json").write_text(json.dumps(history))
    (done / "metrics.json").write_text(json.dumps({"status": "finished", "steps": 50 * 10, "knn_top1": 0.85}))
    (done / "linear_eval.json").write_text(json.dumps({"linear[fashion_mnist, labels=100%]": {"top1": 0.91}}))
    (done / "exits.json").write_text(json.dumps({"train": 0, "linear_eval": 0}))
    (failed / "exits.json").write_text(json.dumps({"train": 1}))
    rows = study.summarise(str(out), [("done", ["--batch_size=512"]), ("failed", []), ("never", [])])
    row = rows[0]
    assert (row["knn@25"], row["knn@50"], row["knn@100"]) == (0.825, 0.85, None)
    assert row["knn_final"] == 0.85 and row["linear_top1"] == 0.91 and row["status"] == "finished"
    assert row["images_per_second"] == round(49 * 10 * 512 / (49 * 2.0))  # epochs 2.. only
    assert row["wall_seconds"] == 500.0
    assert rows[1]["status"] == "train exit 1" and rows[2]["status"] == "not started"
    table = study.markdown(rows)
    assert table.splitlines()[2].startswith("| done | 50 |") and "0.8250" in table


def test_summary_of_a_resumed_run_sums_its_invocations(tmp_path):
    """A run stopped at epoch 30 and resumed: ``wall_seconds`` restarts with the second process."""
    folder = tmp_path / "out" / "resumed"
    folder.mkdir(parents=True)
    first = [{"epoch": e, "step_seconds": 30.0 if e == 1 else 2.0, "wall_seconds": 10.0 * e} for e in range(1, 31)]
    second = [{"epoch": e, "step_seconds": 25.0 if e == 31 else 4.0, "wall_seconds": 12.0 * (e - 30)}
              for e in range(31, 51)]
    (folder / "history.json").write_text(json.dumps(first + second))
    (folder / "metrics.json").write_text(json.dumps({"status": "finished", "steps": 50 * 10}))
    row = study.summarise(str(tmp_path / "out"), [("resumed", ["--batch_size=100"])])[0]
    assert row["invocations"] == 2 and row["epochs_done"] == 50
    assert row["wall_seconds"] == 300.0 + 240.0
    # epochs 2-30 (29 x 2 s) and 32-50 (19 x 4 s): the two compiles left out
    assert row["images_per_second"] == round(48 * 10 * 100 / (29 * 2.0 + 19 * 4.0))


def test_per_gpu_runs_share_a_gpu_at_once_with_a_memory_share(tmp_path):
    """--per_gpu=2 on one GPU: two runs overlap in time, each told to take 0.45 of the GPU's memory."""
    fake = tmp_path / "fake-python"  # stands in for the interpreter: records its env and a time span
    fake.write_text("#!/bin/sh\nname=$(echo \"$@\" | sed 's/.*--run_name=\\([a-z]*\\).*/\\1/')\n"
                    f"echo \"$CUDA_VISIBLE_DEVICES $XLA_PYTHON_CLIENT_MEM_FRACTION $(date +%s.%N)\" > {tmp_path}/$name.start\n"
                    f"sleep 1.5; date +%s.%N > {tmp_path}/$name.end\n")
    fake.chmod(0o755)
    plan = write(tmp_path / "p.plan", "a --seed=1\nb --seed=2\nc --seed=3\n")
    study.main([f"--plan={plan}", f"--out={tmp_path / 'out'}", "--gpus=0", "--per_gpu=2", f"--python={fake}",
                f"--runs_dir={tmp_path / 'runs'}"])
    spans = {}
    for name in "abc":
        gpu, fraction, start = (tmp_path / f"{name}.start").read_text().split()
        assert (gpu, fraction) == ("0", "0.45")
        spans[name] = (float(start), float((tmp_path / f"{name}.end").read_text()))
    assert spans["b"][0] < spans["a"][1] and spans["a"][0] < spans["b"][1]  # a and b at once
    assert spans["c"][0] >= min(spans["a"][1], spans["b"][1]) - 0.05  # c waits for a free slot
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [r["status"] for r in summary["rows"]] == ["not started"] * 3  # no run folder written: no history


def test_seeds_aggregate_mean_and_sample_std_of_finished_runs(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    for folder, name, knn in ((old, "a", 0.80), (new, "a-s1", 0.82), (new, "a-s2", 0.84), (new, "b", 0.7)):
        (folder / name).mkdir(parents=True)
        (folder / name / "history.json").write_text(json.dumps([{"epoch": 50, "knn_top1": knn}]))
        (folder / name / "metrics.json").write_text(json.dumps({"status": "finished", "knn_top1": knn}))
    (new / "a-s3").mkdir()  # started, never finished: not counted
    (new / "a-s3" / "history.json").write_text(json.dumps([{"epoch": 1}]))
    plan = write(tmp_path / "p.plan", "a --seed=0\na-s1 --seed=1\na-s2 --seed=2\na-s3 --seed=3\nb --x=1\n")
    study.main([f"--plan={plan}", f"--out={new}", f"--also={old}", "--summary_only", "--seeds"])
    entries = {e["name"]: e for e in json.loads((new / "summary.json").read_text())["seeds"]}
    a = entries["a"]
    assert a["seeds"] == 3 and a["runs"] == ["a", "a-s1", "a-s2"]  # seed 0 read from --also
    assert a["knn@50"]["mean"] == pytest.approx(0.82) and a["knn@50"]["std"] == pytest.approx(0.02)
    assert entries["b"]["knn_final"]["std"] is None and entries["b"]["seeds"] == 1
    assert "0.8200 ± 0.0200 (3)" in (new / "summary.md").read_text()


def test_study_plots_mean_curve_over_seeds(tmp_path):
    import study_plots
    folders = []
    for i, values in enumerate(([0.5, 0.6, 0.7], [0.7, 0.8, 0.9])):
        folder = tmp_path / f"s{i}"
        folder.mkdir()
        history = [{"epoch": e + 1, **({"knn_top1": v} if v is not None else {})} for e, v in enumerate(values)]
        history.append({"epoch": 4, "knn_top1": 0.95} if i == 0 else {"epoch": 4})  # epoch 4: one run only
        (folder / "history.json").write_text(json.dumps(history))
        folders.append(str(folder))
    epochs, means, stds = study_plots.mean_curve(folders, "knn_top1")
    assert epochs == [1, 2, 3]
    assert means == pytest.approx([0.6, 0.7, 0.8]) and stds == pytest.approx([0.1414214] * 3)
    out = tmp_path / "plot.png"
    study_plots.main([f"--out={out}", "A=" + ",".join(folders), f"B={folders[0]}"])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_exit_codes_of_training_and_linear_evaluation_are_both_kept(tmp_path):
    """exits.json holds every phase's code: the linear evaluation's did overwrite the training's."""
    fake = tmp_path / "fake-python"  # "-m uniclr_tf.train": exits 0; "-m uniclr_tf.linear_eval": exits 3
    fake.write_text("#!/bin/sh\ncase \"$2\" in *linear_eval) exit 3;; esac\nexit 0\n")
    fake.chmod(0o755)
    plan = write(tmp_path / "p.plan", "a --seed=1\n")
    study.main([f"--plan={plan}", f"--out={tmp_path / 'out'}", "--gpus=cpu", f"--python={fake}",
                f"--runs_dir={tmp_path / 'runs'}", "--linear_eval=--augment_on=device"])
    assert json.loads((tmp_path / "out" / "a" / "exits.json").read_text()) == {"train": 0, "linear_eval": 3}
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["rows"][0]["status"] == "linear_eval exit 3"


@pytest.mark.parametrize("plan", sorted((REPO_ROOT / "benchmarks" / "study").glob("*.plan")), ids=lambda p: p.name)
def test_every_row_of_a_shipped_plan_is_a_train_command_the_cli_accepts(plan, monkeypatch):
    """A typo or an option its method does not take in a plan row would only show on the GPU, after the
    rows before it had trained: each row's flags are parsed, resolved and checked here as train.run does."""
    from absl import flags
    from uniclr_tf.training import cli as train
    monkeypatch.chdir(REPO_ROOT)  # the rows' flagfiles are relative to the repository
    common, runs = study.read_plan(plan)
    for name, own in runs:
        fv = flags.FlagValues()
        train.define_flags(fv)
        fv(["train", *study.train_flags(common, name, own, "/tmp/unused")])
        cfg = train.config_from_flags(fv).resolved()
        cfg.build_method().check_setup(cfg.optim.batch_size, cfg.network.projector_dims[-1])
        assert cfg.system.run_name == name


def test_a_study_sharing_its_out_folder_with_another_summarises_both(tmp_path):
    """Per-GPU chains: two study processes, each with its own --only, write one --out; the summary each
    leaves covers every plan run with a folder there, not only its own."""
    fake = tmp_path / "fake-python"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    plan = write(tmp_path / "p.plan", "a --seed=1\nb --seed=2\nc --seed=3\n")
    out = tmp_path / "out"
    for name in ("a", "b"):  # as two chains would, one after the other
        study.main([f"--plan={plan}", f"--out={out}", "--gpus=0", f"--python={fake}", f"--only={name}",
                    f"--runs_dir={tmp_path / 'runs'}"])
    summary = json.loads((out / "summary.json").read_text())
    assert [r["name"] for r in summary["rows"]] == ["a", "b"]  # c: no folder, not asked for
    assert not [p.name for p in out.iterdir() if ".tmp-" in p.name]
    # --summary_only with --only still gives exactly the runs asked for
    study.main([f"--plan={plan}", f"--out={out}", "--only=b", "--summary_only"])
    assert [r["name"] for r in json.loads((out / "summary.json").read_text())["rows"]] == ["b"]


def test_study_chains_run_each_gpus_runs_in_order_and_skip_what_the_time_left_cannot_start(tmp_path):
    """benchmarks/study_chains.sh: one chain per line, its runs one after the other on its GPU (a fake
    interpreter records each call), every run of both chains in the shared summary; with less time left
    than MIN_START, nothing starts and each chain says so."""
    import os
    import re
    import subprocess
    calls = tmp_path / "calls.txt"
    fake = tmp_path / "fake-python"
    fake.write_text(f"#!/bin/sh\necho \"$CUDA_VISIBLE_DEVICES $*\" >> {calls}\n")
    fake.chmod(0o755)
    plan = write(tmp_path / "p.plan", "a --seed=1\nb --seed=2\nc --seed=3\n")
    chains = write(tmp_path / "chains.txt", f"# gpu, then its runs\n0 {plan}:a {plan}:b\n1 {plan}:c  # one run\n")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", STUDY_PYTHON=str(fake),
               RES=str(tmp_path / "res"), RUNS_DIR=str(tmp_path / "runs"), T="600")
    env.pop("OUT", None)

    def chains_call(**extra):
        subprocess.run(["bash", "benchmarks/study_chains.sh", str(chains)], cwd=REPO_ROOT, env={**env, **extra},
                       check=True, capture_output=True, timeout=120)
        lines = calls.read_text().splitlines() if calls.exists() else []
        trains = [(line.split()[0], re.search(r"--run_name=(\w+)", line).group(1)) for line in lines
                  if "uniclr_tf.train" in line]
        return trains, sum("uniclr_tf.linear_eval" in line for line in lines)

    trains, linear = chains_call()
    assert [t for t in trains if t[0] == "0"] == [("0", "a"), ("0", "b")]  # a, then b, on GPU 0
    assert [t for t in trains if t[0] == "1"] == [("1", "c")]
    assert linear == 3  # each run followed by its linear evaluation
    summary = json.loads((tmp_path / "res" / "p" / "summary.json").read_text())
    assert sorted(r["name"] for r in summary["rows"]) == ["a", "b", "c"]  # both chains' runs
    assert (tmp_path / "res" / "gpu-call1.txt").exists()
    # a second call with less time left than MIN_START: nothing starts, each chain says so
    assert chains_call(T="50") == (trains, linear)
    log0 = (tmp_path / "res" / "chain0.log").read_text()
    assert "call 2, gpu 0: a not started" in log0 and "call 2, gpu 0: b not started" in log0


@pytest.mark.parametrize("chains", sorted((REPO_ROOT / "benchmarks" / "study").rglob("*.chains"))
                         + sorted((REPO_ROOT / "benchmarks" / "study").rglob("chains.txt")), ids=lambda p: p.name)
def test_every_item_of_a_shipped_chains_file_is_a_run_of_its_plan(chains):
    for line in chains.read_text().splitlines():
        words = line.split("#")[0].split()
        for item in words[1:]:
            plan, name = item.split(":")
            _, runs = study.read_plan(REPO_ROOT / "benchmarks" / "study" / f"{plan}.plan")
            assert name in dict(runs), (chains.name, item)


def _stand_in_python(path, calls, body):
    """A stand-in for the runs' interpreter: records each call (one line in ``calls``), sets ``$d`` and ``$n``
    from its --run_dir and --run_name, then runs the shell ``body``."""
    path.write_text(f"#!/bin/sh\necho \"$*\" >> {calls}\n"
                    "for a in \"$@\"; do case $a in --run_dir=*) d=${a#--run_dir=} ;; --run_name=*) n=${a#--run_name=} ;; "
                    "esac; done\n" + body)
    path.chmod(0o755)
    return path


def _recording_python(path, calls):
    """A stand-in for the plots' interpreter: records each study_plots.py call (one line) and draws nothing."""
    path.write_text(f"#!/bin/sh\n{{ printf '%s\\037' \"$@\"; echo; }} >> {calls}\n")  # arguments split by \\x1f
    path.chmod(0o755)
    return path


def _plot_calls(calls):
    """``{picture name: [curve spec, ...]}`` from the recorded study_plots.py calls."""
    plots = {}
    for line in calls.read_text().splitlines():
        words = line.split("\x1f")[:-1]
        out = next((w for w in words if w.startswith("--out=")), None)
        if out is None:  # reproduce.sh's check for matplotlib
            continue
        plots[Path(out.split("=", 1)[1]).name] = [w for w in words[1:] if not w.startswith("--")]
    return plots


PICTURES = {"recipe-200.png", "recipe-mc4-seeds.png", "claim-a-methods-200.png", "claim-a-methods-200-zoom.png",
            "claim-a-seeds-200.png", "claim-a-ema-seeds-200.png", "claim-uniclr-seeds-200.png", "claim-a-methods.png",
            "claim-bc-simaffinity.png", "claim-b-simclr.png", "claim-c-simwhitening.png", "claim-d-simtrace.png",
            "claim-d-rank.png", "claim-d-std.png"}


def test_plots_script_finds_every_curve_of_the_reproduction_page_among_the_kept_runs(tmp_path):
    """benchmarks/study/plots.sh over the curated runs (benchmarks/results/*/runs.json): every picture
    docs/results/reproduction.md shows is drawn, no configuration is missing, a seed that did not finish is
    left out of its mean."""
    import os
    import subprocess
    calls = tmp_path / "calls.txt"
    env = dict(os.environ, PYTHON=str(_recording_python(tmp_path / "py", calls)), PLOTS=str(tmp_path / "plots"))
    env.pop("DIRS", None)
    result = subprocess.run(["bash", "benchmarks/study/plots.sh"], cwd=REPO_ROOT, env=env, capture_output=True,
                            text=True, timeout=120, check=True)
    assert result.stderr == ""  # no "no finished run of ..."
    plots = _plot_calls(calls)
    assert set(plots) == PICTURES
    reproduction = (REPO_ROOT / "docs" / "results" / "reproduction.md").read_text()
    for path in sorted((REPO_ROOT / "benchmarks" / "results").glob("*/*.png")):
        if path.name in PICTURES:
            assert f"(../../benchmarks/results/{path.parent.name}/{path.name})" in reproduction, path.name
    assert {p.name for p in (REPO_ROOT / "benchmarks" / "results").glob("*/*.png")} >= PICTURES
    curves = dict(spec.split("=", 1) for spec in plots["claim-d-simtrace.png"])
    assert len(curves["SimTrace alone"].split(",")) == 3
    tricks = curves["+ predictor + EMA"].split(",")  # seed 2 diverged: two folders, neither of them its own
    assert len(tricks) == 2 and not any(t.endswith("simtrace-tricks-s2") for t in tricks)
    one_seed = dict(spec.split("=", 1) for spec in plots["claim-a-methods-200.png"])
    assert all("," not in folders for folders in one_seed.values())


def test_curated_runs_unpack_to_the_summaries_kept_beside_them(tmp_path):
    """benchmarks/results/STUDY/runs.json (the per-run curves the plots read) agrees with the summary.json
    beside it: the same runs, statuses, final kNN and linear top-1; pack(unpack(x)) gives x back."""
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    import study_runs
    for name, plan in (("recipe", "recipe"), ("methods", "methods200"), ("ablations", "claims")):
        folder = REPO_ROOT / "benchmarks" / "results" / name
        kept = json.loads((folder / "runs.json").read_text())
        assert kept["plan"] == f"benchmarks/study/{plan}.plan"
        rows = {r["name"]: r for r in json.loads((folder / "summary.json").read_text())["rows"]}
        for run, data in kept["runs"].items():
            assert rows[run]["status"] == data["status"], run
            assert rows[run]["knn_final"] == data["metrics"].get("knn_top1"), run
            linear = [v["top1"] for v in data["linear"].values()]
            assert rows[run]["linear_top1"] == (linear[0] if linear else None), run
        study_runs.unpack(folder / "runs.json", tmp_path / name)
        again = study_runs.pack(str(REPO_ROOT / kept["plan"]), [str(tmp_path / name)])
        assert {k: {**v, "card": None} for k, v in again["runs"].items()} == \
            {k: {**v, "card": None, "epochs_done": again["runs"][k]["epochs_done"]} for k, v in kept["runs"].items()}


def test_reproduce_runs_every_plan_then_the_tables_and_the_plots_from_its_own_results(tmp_path):
    """benchmarks/study/reproduce.sh with a stand-in interpreter whose "training" writes a finished run:
    every run of the three plans trains once and is evaluated, each plan gets its table with seeds, the
    plots read the new results folder, not the kept runs; a second call starts nothing again; with no time
    left, nothing starts and the exit status says runs remain."""
    import os
    import subprocess
    calls, plot_calls = tmp_path / "calls.txt", tmp_path / "plot-calls.txt"
    trains = (
        "mkdir -p \"$d/$n\"\n"
        "echo '[{\"epoch\": 5, \"knn_top1\": 0.8, \"effective_rank\": 100.0, \"embedding_std\": 0.06},"
        " {\"epoch\": 10, \"knn_top1\": 0.85, \"effective_rank\": 120.0, \"embedding_std\": 0.06}]' > \"$d/$n/history.json\"\n"
        "echo '{\"status\": \"finished\", \"knn_top1\": 0.85, \"steps\": 10}' > \"$d/$n/metrics.json\"\n")
    evaluates = "case \"$*\" in *uniclr_tf.linear_eval*) echo '{\"linear\": {\"top1\": 0.9}}' > \"$d/linear_eval.json\"; exit 0 ;; esac\n"
    fake = _stand_in_python(tmp_path / "fake-python", calls, evaluates + trains)
    env = {k: v for k, v in os.environ.items() if k not in ("T", "MIN_START", "LINEAR_EVAL", "DIRS", "PLOTS")}
    env.update(PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", STUDY_PYTHON=str(fake),
               RUNS_DIR=str(tmp_path / "runs"), GPUS=",".join(str(i) for i in range(32)),
               PYTHON=str(_recording_python(tmp_path / "py", plot_calls)))

    def reproduce(res, **extra):
        return subprocess.run(["bash", "benchmarks/study/reproduce.sh"], cwd=REPO_ROOT, text=True, timeout=300,
                              env={**env, "RES": str(res), **extra}, capture_output=True)

    res = tmp_path / "res"
    first = reproduce(res)
    assert first.returncode == 0, first.stdout + first.stderr
    plans = {plan: study.read_plan(REPO_ROOT / "benchmarks" / "study" / f"{plan}.plan")[1]
             for plan in ("recipe", "methods200", "claims")}
    lines = calls.read_text().splitlines()
    trained = [line for line in lines if "uniclr_tf.train" in line]
    assert len(trained) == sum(len(runs) for runs in plans.values())  # each run once
    assert sum("uniclr_tf.linear_eval" in line for line in lines) == len(trained)
    for plan, runs in plans.items():
        summary = json.loads((res / plan / "summary.json").read_text())
        assert {r["name"]: r["status"] for r in summary["rows"]} == {name: "finished" for name, _ in runs}
        assert json.loads((res / plan / runs[0][0] / "exits.json").read_text()) == {"train": 0, "linear_eval": 0}
        assert f"{res / plan}/summary.md (0 runs of {plan} not finished)" in first.stdout
    seeds = {e["name"]: e["seeds"] for e in json.loads((res / "claims" / "summary.json").read_text())["seeds"]}
    assert seeds["aff-t0.1-g0.01"] == 3 and seeds["whiten-t1-g0"] == 3
    plots = _plot_calls(plot_calls)
    assert set(plots) == PICTURES
    folders = [f for specs in plots.values() for spec in specs for f in spec.split("=", 1)[1].split(",")]
    assert folders and all(f.startswith(str(res)) for f in folders)

    # again: every run finished with the same command, so nothing is launched
    again = reproduce(res)
    assert again.returncode == 0 and calls.read_text().splitlines() == lines
    assert "finished in an earlier call, not relaunched" in (res / "claims.log").read_text()
    # no time left, into a new results folder: no plan starts, no table, and the status says runs remain
    late = reproduce(tmp_path / "late", T="50")
    assert late.returncode == 3 and "recipe not started" in late.stdout and calls.read_text().splitlines() == lines
    assert reproduce(tmp_path / "bad", T="1.5").returncode == 2
    # a run that fails (as one that diverges does) is named, and the status says runs remain
    failing = _stand_in_python(tmp_path / "failing-python", calls, evaluates + "case $n in simclr) exit 1 ;; esac\n" + trains)
    failed = reproduce(tmp_path / "fail", STUDY_PYTHON=str(failing))
    assert failed.returncode == 3 and "reproduce: simclr: train exit 1" in failed.stdout, failed.stdout


def test_a_finished_run_is_not_relaunched_unless_its_command_changed(tmp_path):
    """study.py skips a run that finished with the same train command (and has its linear evaluation when
    one is asked); a changed command, or a missing evaluation, launches it again (the CLI then decides)."""
    calls = tmp_path / "calls.txt"
    fake = _stand_in_python(tmp_path / "fake-python", calls, "case \"$*\" in *uniclr_tf.train*) mkdir -p \"$d/$n\"; "
                            "echo '{\"status\": \"finished\"}' > \"$d/$n/metrics.json\" ;; esac\n")
    out, runs = tmp_path / "out", tmp_path / "runs"

    def study_call(plan_text, *extra):
        plan = write(tmp_path / "p.plan", plan_text)
        study.main([f"--plan={plan}", f"--out={out}", "--gpus=0", f"--python={fake}", f"--runs_dir={runs}", *extra])
        return calls.read_text().splitlines()

    assert len(study_call("a --seed=1\n")) == 1
    assert len(study_call("a --seed=1\n")) == 1            # the same command: not launched
    assert len(study_call("a --seed=2\n")) == 2            # changed: launched (the CLI would refuse it)
    assert len(study_call("a --seed=2\n", "--linear_eval=--augment_on=device")) == 4  # no evaluation yet: train, then it
