"""benchmarks/study.py (plans, the command each run gets, resuming, generated plans, packing) and the study
report of benchmarks/report.py (seeds, failures, figures) on small run folders and the curated results."""

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

from benchmarks import report, study  # noqa: E402


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
    # --only starts its runs in the order it names them, not the plan's
    study.main([f"--plan={plan}", f"--out={tmp_path / 'out'}", "--gpus=0", "--dry_run", "--only=b,a"])
    out = capsys.readouterr().out
    assert 0 <= out.index("train b") < out.index("train a")


def _run(folder, history=(), **metrics):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "history.json").write_text(json.dumps(list(history)))
    if metrics:
        (folder / "metrics.json").write_text(json.dumps(metrics))
    return folder


def test_report_groups_seeds_counts_failures_and_reads_linear_and_exit_codes(tmp_path):
    """Runs NAME, NAME-s1, ... are one configuration: mean and sample std over the seeds that finished;
    collapsed, diverged, a failed phase and a finish below raw pixels are failures; a SIGTERM (a time limit)
    leaves a run unfinished, not failed, unless only its linear evaluation was stopped (kNN, no linear)."""
    out = tmp_path / "out"
    curve = [{"epoch": e, "knn_top1": 0.80 + e / 1000} for e in (25, 50)]
    _run(out / "a", curve, status="finished", knn_top1=0.85, raw_pixel_knn_top1=0.79, epochs=50)
    (out / "a" / "linear_eval.json").write_text(json.dumps({"linear[fashion_mnist, labels=100%]": {"top1": 0.91}}))
    _run(out / "a-s1", curve, status="finished", knn_top1=0.87, raw_pixel_knn_top1=0.79, epochs=50)
    _run(out / "a-s2", curve[:1], status="collapsed", epoch=12, raw_pixel_knn_top1=0.79)
    _run(out / "a-s3", curve, status="finished", knn_top1=0.70, raw_pixel_knn_top1=0.79, below_raw_pixel_baseline=True)
    _run(out / "a-s4", curve[:1])  # started, stopped: unfinished
    (out / "a-s4" / "exits.json").write_text(json.dumps({"train": 143}))
    _run(out / "a-s5", curve, status="finished", knn_top1=0.86, raw_pixel_knn_top1=0.79, epochs=50)
    (out / "a-s5" / "exits.json").write_text(json.dumps({"train": 0, "linear_eval": -15}))  # trained; linear stopped
    _run(out / "b", curve, status="finished", knn_top1=0.8)
    (out / "b" / "exits.json").write_text(json.dumps({"train": 0, "linear_eval": 1}))
    tables, runs = report.study([str(out)], at=(25,), per_run=True)
    rows = {r["configuration"]: r for r in tables[0]["rows"]}
    a = rows["a"]
    assert (a["n"], a["failed"], a["unfinished"]) == (5, 2, 1)
    assert a["knn"]["mean"] == pytest.approx(0.86) and a["knn"]["std"] == pytest.approx(0.01, abs=1e-6)
    assert a["knn@25"]["mean"] == pytest.approx(0.825) and a["linear"] == {"mean": 0.91, "std": None, "n": 1,
                                                                          "min": 0.91, "max": 0.91}
    assert a["why"] == "a-s2: collapsed @12; a-s3: below raw pixels (0.7000)"
    assert rows["b"]["failed"] == 1 and rows["b"]["why"] == "b: linear_eval exit 1"
    per_run = {r["name"]: r["status"] for r in tables[1]["rows"]}
    assert per_run["a-s4"] == "train exit 143" and per_run["a"] == "finished"
    text = report.markdown(tables)
    assert "| a | " in text and "0.8600 ± 0.0100" in text and "a-s2: collapsed @12" in text


def test_report_gives_each_configuration_its_wall_clock_and_images_a_second(tmp_path):
    """The wall clock is the sum of the epochs' (over the calls that resumed a run); images a second the
    median over the epochs after the first of steps per epoch x batch / the epoch's step clock."""
    out = tmp_path / "out"
    clocks = [(30.0, 28.0), (10.0, 8.0), (12.0, 10.0), (11.0, 9.0)]  # (epoch_seconds, step_seconds): epoch 1 compiles
    for name, scale in (("a", 1.0), ("a-s1", 2.0)):
        history = [{"epoch": i + 1, "knn_top1": 0.8, "epoch_seconds": e * scale, "step_seconds": t * scale}
                   for i, (e, t) in enumerate(clocks)]
        _run(out / name, history, status="finished", knn_top1=0.85, epochs=4, steps=40)
        (out / name / "config.json").write_text(json.dumps({"batch_size": 64}))
    _run(out / "b", [{"epoch": 1, "knn_top1": 0.8}], status="finished", knn_top1=0.8, epochs=1, steps=10)  # no clocks
    packed = report.pack_run(str(out / "a"))
    assert packed["seconds"] == 63.0 and packed["images_per_s"] == pytest.approx(10 * 64 / 9.0, abs=0.05)
    rows = {r["configuration"]: r for r in report.study([str(out)])[0][0]["rows"]}
    assert rows["a"]["minutes"]["mean"] == pytest.approx((63 + 126) / 2 / 60)
    assert rows["a"]["images_per_s"]["mean"] == pytest.approx((640 / 9 + 640 / 18) / 2, abs=0.05)
    assert rows["b"]["minutes"] is None and rows["b"]["images_per_s"] is None
    text = report.markdown(report.study([str(out)])[0])
    assert "wall clock, min" in text and "images/s" in text and "| 1.6 ± 0.7 |" in text
    assert "runs a GPU" not in text  # no run says it shared its GPU
    (out / "a-s1" / "shared.json").write_text(json.dumps({"train": 3}))
    rows = {r["configuration"]: r for r in report.study([str(out)])[0][0]["rows"]}
    assert rows["a"]["gpu_share"] == "3" and rows["b"]["gpu_share"] is None
    assert "runs a GPU" in report.markdown(report.study([str(out)])[0])


def test_report_reads_several_results_and_keeps_a_finished_run_over_an_unfinished_one(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    _run(old / "a", [{"epoch": 50, "knn_top1": 0.80}], status="finished", knn_top1=0.80)
    _run(new / "a", [{"epoch": 20, "knn_top1": 0.7}])  # a rerun still going
    _run(new / "a-s1", [{"epoch": 50, "knn_top1": 0.82}], status="finished", knn_top1=0.82)
    packed = tmp_path / "packed.json"
    packed.write_text(json.dumps({"plan": "p.plan", "date": "2026-11-27",
                                  "runs": {"a-s2": report.pack_run(str(_run(tmp_path / "x" / "a-s2", [
                                      {"epoch": 50, "knn_top1": 0.84}], status="finished", knn_top1=0.84)), "H200")}}))
    tables, _ = report.study([str(new), str(old), str(packed)])
    row = tables[0]["rows"][0]
    assert row["n"] == 3 and row["knn"]["mean"] == pytest.approx(0.82) and row["knn"]["std"] == pytest.approx(0.02)
    assert row["card"] == "H200" and row["date"] == "2026-11-27"


def test_per_gpu_runs_share_a_gpu_at_once_with_a_memory_share(tmp_path):
    """--per_gpu=2 on one GPU: two runs overlap in time, each told to take 0.45 of the GPU's memory, and each
    records that it shared its GPU with another."""
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
    shares = {name: json.loads((tmp_path / "out" / name / "shared.json").read_text())["train"] for name in "abc"}
    assert shares["a"] == shares["b"] == 2 and shares["c"] in (1, 2)
    assert report.pack_run(str(tmp_path / "out" / "a"))["gpu_share"] == 2
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [r["status"] for r in summary["tables"][-1]["rows"]] == ["not started"] * 3  # no history written


def test_mean_curve_over_the_seeds_that_finished_at_the_epochs_all_of_them_have():
    runs = {"a": {"status": "finished", "metrics": {}, "history": [{"epoch": 1, "knn_top1": 0.5},
                                                                 {"epoch": 2, "knn_top1": 0.6}, {"epoch": 3, "knn_top1": 0.9}]},
            "a-s1": {"status": "finished", "metrics": {}, "history": [{"epoch": 1, "knn_top1": 0.7},
                                                                    {"epoch": 2, "knn_top1": 0.8}]},
            "a-s2": {"status": "diverged", "metrics": {}, "history": [{"epoch": 1, "knn_top1": 0.1}]}}
    epochs, means, stds, seeds = report.curve(runs, "a", "knn_top1")
    assert epochs == [1, 2] and seeds == 2
    assert means == pytest.approx([0.6, 0.7]) and stds == pytest.approx([0.1414214] * 2)
    assert report.curve(runs, "a", "knn_top1", one=True)[0] == [1, 2, 3]
    assert report.curve(runs, "zz", "knn_top1") is None


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
    assert summary["tables"][-1]["rows"][0]["status"] == "linear_eval exit 3"


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
    assert [r["name"] for r in summary["tables"][-1]["rows"]] == ["a", "b"]  # c: no folder, not asked for
    assert not [p.name for p in out.iterdir() if ".tmp-" in p.name]
    # --summary_only with --only still gives exactly the runs asked for
    study.main([f"--plan={plan}", f"--out={out}", "--only=b", "--summary_only"])
    assert [r["name"] for r in json.loads((out / "summary.json").read_text())["tables"][-1]["rows"]] == ["b"]


def _stand_in_python(path, calls, body):
    """A stand-in for the runs' interpreter: records each call (one line in ``calls``), sets ``$d`` and ``$n``
    from its --run_dir and --run_name, then runs the shell ``body``."""
    path.write_text(f"#!/bin/sh\necho \"$*\" >> {calls}\n"
                    "for a in \"$@\"; do case $a in --run_dir=*) d=${a#--run_dir=} ;; --run_name=*) n=${a#--run_name=} ;; "
                    "esac; done\n" + body)
    path.chmod(0o755)
    return path


def _recording_python(path, calls):
    """A stand-in for the figures' interpreter: records each call (arguments split by \\x1f) and draws nothing."""
    path.write_text(f"#!/bin/sh\n{{ printf '%s\\037' \"$@\"; echo; }} >> {calls}\n")
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("kind", ["robustness", "full_schedule"])
def test_the_generated_plans_are_current_and_cover_every_shipped_gpu_config(kind):
    """benchmarks/study/robustness.plan and full_schedule.plan are what `python -m benchmarks.study plan KIND`
    prints from configs/ now: every shipped GPU config (not the CPU quickstarts), a config that only points
    to another sharing that one's runs."""
    assert (REPO_ROOT / "benchmarks" / "study" / f"{kind}.plan").read_text() == study.generated_plan(kind)
    configs = study.shipped_configs()
    assert "configs/simaffinity.flags" in configs and not any("quickstart" in c for c in configs)
    assert len(configs) == len(set(configs)) >= 18
    _, runs = study.read_plan(REPO_ROOT / "benchmarks" / "study" / f"{kind}.plan")
    names = {name for name, _ in runs}
    assert study.alias_of("configs/methods/simaffinity.flags", configs) == "configs/simaffinity.flags"
    assert not any("methods.simaffinity-" in n for n in names)  # its runs are configs/simaffinity.flags'
    assert len(runs) == study.SEEDS[kind] * sum(1 for c in configs if not study.alias_of(c, configs))
    assert study.run_name("configs/paper/fashion_mnist_simtrace.flags", 2) == "paper.fashion_mnist_simtrace-s2"
    with pytest.raises(SystemExit, match="one of"):
        study.generated_plan("nope")


def test_the_robustness_report_counts_each_config_s_failures(tmp_path):
    """The robustness check's table: per config, the seeds run and failed (collapsed, below raw pixels), a
    run stopped by the time limit not counted."""
    config = "configs/simaffinity.flags"
    written = {0: {"status": "finished", "knn_top1": 0.86}, 1: {"status": "collapsed", "epoch": 10},
               2: {"status": "finished", "knn_top1": 0.70, "below_raw_pixel_baseline": True},
               3: {"status": "interrupted", "epoch": 12}}  # the time limit: resumes on the next call
    for seed, metrics in written.items():
        _run(tmp_path / study.run_name(config, seed), [{"epoch": 5, "knn_top1": 0.8}], raw_pixel_knn_top1=0.7881,
             **metrics)
    tables, _ = report.study([str(tmp_path)])
    row = tables[0]["rows"][0]
    assert (row["configuration"], row["n"], row["failed"], row["unfinished"]) == ("simaffinity", 3, 2, 1)
    assert row["why"] == "simaffinity-s1: collapsed @10; simaffinity-s2: below raw pixels (0.7000)"
    assert row["knn"]["mean"] == 0.86 and row["knn"]["n"] == 1


def test_pack_keeps_a_plan_s_runs_small_and_the_report_reads_them_as_it_reads_the_folders(tmp_path):
    plan = write(tmp_path / "p.plan", "a --seed=0\na-s1 --seed=1\nb --seed=2\n")
    early, late = tmp_path / "h200-early", tmp_path / "late"
    _run(early / "a", [{"epoch": 5, "knn_top1": 0.7, "effective_rank": 10.0, "loss": 3.0}], status="finished",
         knn_top1=0.7, raw_pixel_knn_top1=0.6, seconds={"fit": 9.0})
    _run(late / "a", [{"epoch": 2, "knn_top1": 0.5}])  # stopped: the finished one above is kept
    _run(late / "a-s1", [{"epoch": 5, "knn_top1": 0.8}], status="finished", knn_top1=0.8, raw_pixel_knn_top1=0.6)
    (late / "a-s1" / "linear_eval.json").write_text(json.dumps({"linear[x, labels=100%]": {"top1": 0.9, "n": 1}}))
    out = tmp_path / "packed.json"
    study.main(["pack", f"--plan={plan}", f"--out={out}", str(late), str(early)])
    packed = json.loads(out.read_text())
    assert set(packed["runs"]) == {"a", "a-s1"} and packed["plan"].endswith("p.plan") and packed["date"]
    a = packed["runs"]["a"]
    assert a["card"] == "H200" and a["history"] == [{"epoch": 5, "knn_top1": 0.7, "effective_rank": 10.0}]
    assert "seconds" not in a["metrics"] and packed["runs"]["a-s1"]["linear"] == {"linear[x, labels=100%]": {"top1": 0.9}}
    from_folders, _ = report.study([str(early), str(late)], only={"a", "a-s1"})
    from_packed, _ = report.study([str(out)])
    strip = lambda rows: [{k: v for k, v in r.items() if k not in ("card", "date")} for r in rows]
    assert strip(from_packed[0]["rows"]) == strip(from_folders[0]["rows"])


def test_pack_adds_new_runs_to_an_earlier_pack_and_can_leave_out_stopped_ones(tmp_path):
    """A plan's results add up over calls: an earlier pack keeps its runs and their dates, a finished run
    replaces a stopped one of the same name, and ``--ended`` leaves out runs a time limit stopped."""
    plan = write(tmp_path / "p.plan", "a --seed=0\nb --seed=1\nc --seed=2\n")
    first, second = tmp_path / "first", tmp_path / "second"
    _run(first / "a", [{"epoch": 5, "knn_top1": 0.7}], status="finished", knn_top1=0.7, raw_pixel_knn_top1=0.6)
    _run(first / "b", [{"epoch": 2, "knn_top1": 0.5}], status="interrupted", epoch=2)
    earlier = tmp_path / "earlier.json"
    study.main(["pack", f"--plan={plan}", f"--out={earlier}", str(first)])
    data = json.loads(earlier.read_text())
    data["runs"]["a"]["date"] = "2000-01-01"  # packed on another day
    earlier.write_text(json.dumps({**data, "date": "2000-01-01"}))
    _run(second / "b", [{"epoch": 5, "knn_top1": 0.8}], status="finished", knn_top1=0.8, raw_pixel_knn_top1=0.6)
    _run(second / "c", [{"epoch": 1, "knn_top1": 0.4}], status="interrupted", epoch=1)
    out = tmp_path / "out.json"
    study.main(["pack", f"--plan={plan}", f"--out={out}", "--ended", str(earlier), str(second)])
    runs = json.loads(out.read_text())["runs"]
    assert list(runs) == ["a", "b"]  # c was stopped: left out
    assert runs["a"]["date"] == "2000-01-01" and runs["a"]["metrics"]["knn_top1"] == 0.7
    assert runs["b"]["status"] == "finished" and runs["b"]["metrics"]["knn_top1"] == 0.8
    study.main(["pack", f"--plan={plan}", f"--out={out}", str(earlier), str(second)])
    assert list(json.loads(out.read_text())["runs"]) == ["a", "b", "c"]
    other = write(tmp_path / "other.plan", "a --seed=0\n")
    with pytest.raises(SystemExit, match="not .*other.plan"):
        study.main(["pack", f"--plan={other}", f"--out={out}", str(earlier)])


PICTURES = {"recipe-mc4-seeds.png", "claim-a-methods-200-zoom.png", "claim-a-ema-seeds-200.png",
            "claim-bc-simaffinity.png", "knn-new-methods.png"}


def test_the_curated_results_draw_every_figure_of_the_reproduction_page(tmp_path):
    """benchmarks/results/study/*.json (one per plan, packed): each is the plan it names and holds only its
    runs; the report draws every figure docs/results/reproduction.md shows from them, and the page shows
    the pictures kept beside them."""
    curated = sorted((REPO_ROOT / "benchmarks" / "results" / "study").glob("*.json"))
    assert len(curated) >= 8
    for path in curated:
        data = json.loads(path.read_text())
        assert data["plan"] == f"benchmarks/study/{path.stem}.plan" and data["date"], path.name
        _, runs = study.read_plan(REPO_ROOT / data["plan"])
        assert set(data["runs"]) <= {name for name, _ in runs}, path.name
    pytest.importorskip("matplotlib")
    drawn = report.plots(report.load_runs([str(p) for p in curated]), str(tmp_path))
    assert {Path(p).name for p in drawn} == set(report.FIGURES) == PICTURES
    reproduction = (REPO_ROOT / "docs" / "results" / "reproduction.md").read_text()
    for name in PICTURES:
        assert (REPO_ROOT / "benchmarks" / "results" / "study" / name).exists(), name
        assert f"(../../benchmarks/results/study/{name})" in reproduction, name


def test_every_config_the_full_schedule_covers_quotes_its_numbers_in_its_header_and_the_readme():
    """A config whose 3 seeds of full_schedule.json all finished quotes their kNN and linear top-1 (mean ± std)
    in its own header and in README's results table (with its wall clock and images/s), so neither drifts
    from the curated results."""
    tables, _ = report.study([str(REPO_ROOT / "benchmarks" / "results" / "study" / "full_schedule.json")])
    readme = (REPO_ROOT / "README.md").read_text()
    quoted = 0
    for row in tables[0]["rows"]:
        if row["n"] < 3 or row["failed"] or row["unfinished"]:
            continue
        config = "configs/" + row["configuration"].removeprefix("full.").replace(".", "/") + ".flags"
        header = "".join(line for line in (REPO_ROOT / config).read_text().splitlines(True) if line.startswith("#"))
        header = " ".join(header.replace("#", " ").split())
        line = next((l for l in readme.splitlines() if l.startswith(f"| `{config.removeprefix('configs/')}`")), "")
        for key in ("knn", "linear"):
            mean, std = row[key]["mean"], row[key]["std"]
            assert f"{mean:.4f} +- {std:.4f}" in header, (config, key)
            assert f"| {mean:.4f} ± {std:.4f} |" in line, (config, key, line)
        assert f"| {row['epochs']} |" in line
        # and its wall clock and images/s, with how many runs shared the GPU when more than one did
        share = "" if row["gpu_share"] == "1" else f" ({row['gpu_share']} a GPU)"
        assert f"| {row['minutes']['mean']:.1f} | {row['images_per_s']['mean']:,.0f}{share} |" in line, line
        quoted += 1
    assert quoted >= 1


def test_reproduce_runs_every_plan_then_the_tables_and_the_plots_from_its_own_results(tmp_path):
    """benchmarks/study/reproduce.sh with a stand-in interpreter whose "training" writes a finished run:
    every run of the three plans trains once and is evaluated, each plan gets its report with seeds, the
    figures are drawn from the new results folders, not the curated ones; a second call starts nothing
    again; with no time left, nothing starts and the exit status says runs remain; a generated plan runs
    without linear evaluation when asked, or only the runs named."""
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
    env = {k: v for k, v in os.environ.items() if k not in ("T", "MIN_START", "LINEAR_EVAL", "DIRS", "PLOTS", "ONLY")}
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
        tables = json.loads((res / plan / "summary.json").read_text())["tables"]
        assert {r["name"]: r["status"] for r in tables[-1]["rows"]} == {name: "finished" for name, _ in runs}
        assert json.loads((res / plan / runs[0][0] / "exits.json").read_text()) == {"train": 0, "linear_eval": 0}
        assert f"{res / plan}/summary.md (0 runs of {plan} not finished)" in first.stdout
    seeds = {r["configuration"]: r["n"] for r in json.loads((res / "claims" / "summary.json").read_text())["tables"][0]["rows"]}
    assert seeds["aff-t0.1-g0.01"] == 3 and seeds["whiten-t1-g0"] == 3
    drawn = [line.split("\x1f")[:-1] for line in plot_calls.read_text().splitlines() if "benchmarks.report" in line]
    assert len(drawn) == 1 and f"--plots={res}/plots" in drawn[0]
    assert [w for w in drawn[0] if w.startswith(str(res)) and "plots" not in w] == [str(res / p) for p in plans]

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
    # the robustness check: a generated plan, two runs a GPU slot, no linear evaluation
    before = len(calls.read_text().splitlines())
    checked = reproduce(tmp_path / "robust", PLANS="robustness", PER_GPU="2", LINEAR_EVAL="none")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    new = calls.read_text().splitlines()[before:]
    assert len(new) == len(study.read_plan(REPO_ROOT / "benchmarks" / "study" / "robustness.plan")[1])
    assert not any("uniclr_tf.linear_eval" in line for line in new)
    # some runs of a plan only: those two train and are evaluated, and the status says runs remain
    before = len(calls.read_text().splitlines())
    some = reproduce(tmp_path / "some", PLANS="full_schedule", ONLY="full.methods.swav-s0,full.methods.swav-s2")
    new = calls.read_text().splitlines()[before:]
    assert some.returncode == 3, some.stdout + some.stderr
    assert sorted(line.split("--run_name=")[1].split()[0] for line in new if "uniclr_tf.train" in line) == \
        ["full.methods.swav-s0", "full.methods.swav-s2"]
    assert sum("uniclr_tf.linear_eval" in line for line in new) == 2
    assert reproduce(tmp_path / "nope", PLANS="nope").returncode == 2


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
