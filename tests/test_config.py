"""TrainConfig: sub-configs, their flags and --help groups, and the flat on-disk forms of earlier runs."""

import dataclasses
import json
import re

import pytest
from absl import flags

from uniclr_tf import methods
from uniclr_tf.config import flagutil
from uniclr_tf.training import runs
from uniclr_tf.training import cli as train
from uniclr_tf.config.train_config import TrainConfig
from uniclr_tf.config.errors import UsageError

# A run folder's files as the flat TrainConfig wrote them before the sub-configs (configs/quickstart.flags,
# resolved): written out by hand, so that a change of the on-disk layout shows here.
FLAT_FLAGS_TXT = """--dataset=fashion_mnist
--data_dir=
--image_size=0
--noskip_bad_files
--max_examples=0
--eval_dataset=
--holdout_fraction=0.1
--max_in_memory_mb=256
--max_image_pixels=0
--encoder=tiny
--encoder_width=32
--encoder_stem=auto
--projector_dims=512,512,128
--predictor_hidden=512
--method=simtrace
--num_local_crops=0
--local_size=0
--optimizer=sgd
--base_learning_rate=0.12
--weight_decay=0.0005
--momentum=0.9
--warmup_epochs=0.5
--epochs=4
--stop_at_epoch=0
--batch_size=256
--steps_per_epoch=150
--knn_k=200
--knn_temperature=0.1
--knn_every=2
--knn_max_train=20000
--online_probe
--on_collapse=stop
--collapse_knn_margin=0.1
--collapse_std_fraction=0.02
--augment_on=host
--precision=float32
--strategy=default
--gather_across_replicas
--batch_norm=global
--tpu=
--nojit_compile
--steps_per_execution=1
--seed=0
--run_name=
--ema_momentum=0.0
--eps=0.0001
--nopredictor
--nostop_gradient_cov
--whitening_groups=1
"""

FLAT_CONFIG_JSON = {
    "dataset": "fashion_mnist", "data_dir": "", "image_size": 0, "skip_bad_files": False, "max_examples": 0,
    "eval_dataset": "", "holdout_fraction": 0.1, "max_in_memory_mb": 256, "max_image_pixels": 0,
    "encoder": "tiny", "encoder_width": 32, "encoder_stem": "auto", "projector_dims": [512, 512, 128],
    "predictor_hidden": 512, "method": "simtrace",
    "method_options": {"ema_momentum": 0.0, "eps": 0.0001, "predictor": False, "stop_gradient_cov": False,
                       "whitening_groups": 1},
    "num_local_crops": 0, "local_size": 0, "global_scale": None, "local_scale": None, "flip_prob": None,
    "color_jitter": None, "color_jitter_prob": None, "grayscale_prob": None, "blur_prob": None,
    "solarize_prob": None, "optimizer": "sgd", "base_learning_rate": 0.12, "weight_decay": 0.0005,
    "momentum": 0.9, "warmup_epochs": 0.5, "epochs": 4, "stop_at_epoch": 0, "batch_size": 256,
    "steps_per_epoch": 150, "knn_k": 200, "knn_temperature": 0.1, "knn_every": 2, "knn_max_train": 20000,
    "online_probe": True, "on_collapse": "stop", "collapse_knn_margin": 0.1, "collapse_std_fraction": 0.02,
    "augment_on": "host", "precision": "float32", "strategy": "default", "gather_across_replicas": True,
    "batch_norm": "global", "tpu": "", "jit_compile": False, "steps_per_execution": 1, "seed": 0,
    "run_dir": "runs", "run_name": "", "export": False, "coordinator_address": "", "num_processes": 0,
    "process_id": -1, "overwrite": False, "resume_from": "", "stop_after_steps": 0, "backup_every_minutes": 10.0,
    "verbose": 0, "pictures": True, "compilation_cache_dir": "~/.cache/uniclr_tf/xla", "autotune_table": True,
    "tensorboard_every_steps": 10, "profile_steps": [],
    "views": {"global_size": [28, 28], "num_local": 0},  # the augmenter's config, written beside the fields
}


def _flag_values(*argv):
    fv = flags.FlagValues()
    train.define_flags(fv)
    fv(["train", *argv])
    return fv


def test_help_lists_every_flag_under_its_sub_config():
    """--help has one group per sub-config (its TITLE) holding exactly that sub-config's fields, --method
    and the method options in the method's place, and every flag of the train CLI once."""
    fv = _flag_values()
    text = flagutil.grouped_help("doc", train.help_groups(), flag_values=fv)
    group_of, title = {}, None
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            title = line[:-1]
        match = re.match(r"  --(\w+)=", line)
        if match:
            assert match.group(1) not in group_of, match.group(1)  # listed once
            group_of[match.group(1)] = title
    for name, cls in TrainConfig.sections().items():
        fields = [f.name for f in dataclasses.fields(cls)]
        assert fields and all(group_of[f] == cls.TITLE for f in fields), (name, cls.TITLE)
    assert group_of["method"] == "method"
    assert all(group_of[o].startswith("method options") for o in methods.option_specs())
    assert set(group_of) == set(TrainConfig.flat_names()) - {"method_options"} | set(methods.option_specs())
    titles = list(dict.fromkeys(group_of.values()))
    assert titles[:3] == ["data", "network", "method"] and titles[-1].startswith("this invocation")
    for name in TrainConfig.flat_names():  # each flag's help is the one declared next to its field
        if name != "method_options":
            assert fv[name].help.endswith(TrainConfig.field_help(name)), name  # (an enum's starts <a|b>: )


def test_invocation_fields_are_the_invocation_sub_config():
    """What is left out of flags.txt and of the resume comparison is exactly InvocationConfig."""
    cfg = TrainConfig.make(run_dir="elsewhere", overwrite=True, profile_steps=(2, 3), verbose=2, export=True)
    invocation = {f.name for f in dataclasses.fields(TrainConfig.sections()["invocation"])}
    assert {"run_dir", "export", "profile_steps", "resume_from"} <= invocation
    assert not invocation & {name for name, _ in cfg.flag_items()}
    assert invocation <= {name for name, _ in cfg.flag_items(invocation=True)}
    assert cfg.differences(TrainConfig.make()) == []
    assert "--profile_steps" not in cfg.to_flagfile() and "--run_dir" not in cfg.to_flagfile()
    assert cfg.replace(batch_size=1024).optim.batch_size == 1024 and cfg.replace(seed=3).system.seed == 3


def test_sub_configs_validate_their_own_fields_and_train_config_the_shared_ones():
    from uniclr_tf.config.train_config import OptimConfig, SystemConfig
    with pytest.raises(UsageError, match=r"--warmup_epochs: expected at most --epochs=2; received 5"):
        OptimConfig(epochs=2, warmup_epochs=5)
    with pytest.raises(UsageError, match=r"--stop_at_epoch: expected an integer in \[0, --epochs=2\]"):
        TrainConfig.make(epochs=2, warmup_epochs=0, stop_at_epoch=3)
    with pytest.raises(UsageError, match="--tpu: expected a TPU name"):
        SystemConfig(strategy="tpu")
    with pytest.raises(UsageError, match="--num_processes: expected 1 unless --strategy=data_parallel"):
        TrainConfig.make(num_processes=2)
    with pytest.raises(UsageError, match="--num_processes: expected a divisor of --batch_size=6"):
        TrainConfig.make(num_processes=4, strategy="data_parallel", batch_size=6, method="simclr")
    with pytest.raises(TypeError, match="no_such_field"):
        TrainConfig.from_flat({"no_such_field": 1})
    with pytest.raises(UsageError, match=r"--lars_eta: expected a number > 0; received 0.0"):
        OptimConfig(lars_eta=0.0)
    for field, value in (("lars_eta", 0.02), ("lars_clip_lr", True)):
        with pytest.raises(UsageError, match=rf"--{field}: expected a LARS option: --optimizer=lars"):
            OptimConfig(optimizer="sgd", **{field: value})


def test_a_flat_config_json_and_flags_txt_written_before_still_load_and_resume(tmp_path):
    """A run folder of the flat TrainConfig: config.json reads into the sub-configs, flags.txt replays
    to the same config, and rerunning its flags resumes the run (other flags are refused)."""
    run_dir = tmp_path / "runs" / "simtrace-fashion_mnist"  # the default --run_name
    run_dir.mkdir(parents=True)
    (run_dir / "flags.txt").write_text(FLAT_FLAGS_TXT)
    (run_dir / "config.json").write_text(json.dumps(FLAT_CONFIG_JSON, indent=2))
    old = TrainConfig.from_json((run_dir / "config.json").read_text())
    assert (old.data.dataset, old.network.encoder, old.network.projector_dims) == ("fashion_mnist", "tiny",
                                                                                   (512, 512, 128))
    assert (old.optim.batch_size, old.optim.warmup_epochs, old.evaluation.knn_max_train) == (256, 0.5, 20000)
    assert old.options == FLAT_CONFIG_JSON["method_options"] and old.invocation.profile_steps == ()
    # the same flags.txt and config.json are written, with the settings added since at their defaults
    assert "--momentum=0.9\n" in FLAT_FLAGS_TXT
    assert old.to_flagfile() == FLAT_FLAGS_TXT.replace("--momentum=0.9\n", "--momentum=0.9\n--lars_eta=0.001\n"
                                                       "--nolars_clip_lr\n").replace(
        "--predictor_hidden=512\n", "--predictor_hidden=512\n--view_batch_norm=joint\n").replace(
        "--steps_per_execution=1\n", "--steps_per_execution=1\n--state_layout=auto\n")
    added = {"check_duplicates": True, "lars_eta": 0.001, "lars_clip_lr": False, "view_batch_norm": "joint",
             "state_layout": "auto"}
    assert {k: v for k, v in json.loads(old.to_json()).items()} == {
        **{k: v for k, v in FLAT_CONFIG_JSON.items() if k != "views"}, **added}
    replayed = train.config_from_flags(_flag_values(f"--flagfile={run_dir / 'flags.txt'}",
                                                    f"--run_dir={tmp_path / 'runs'}"))
    assert replayed.differences(old) == []
    assert train.run_path(replayed) == str(run_dir)
    assert train.prepare_run_folder(replayed, str(run_dir)) == ("resume", None)  # no backup yet: step 0
    # as the CLI checks it: every method option written out, options added since (l2_first) at their default
    assert "l2_first" not in old.options and replayed.resolved().options["l2_first"] is False
    assert train.prepare_run_folder(replayed.resolved(), str(run_dir)) == ("resume", None)
    with pytest.raises(UsageError, match=r"--l2_first: False in the folder, True now"):
        train.prepare_run_folder(replayed.replace(method_options={**replayed.options, "l2_first": True}), str(run_dir))
    changed = replayed.replace(batch_size=128)
    with pytest.raises(UsageError, match=r"--batch_size: 256 in the folder, 128 now"):
        train.prepare_run_folder(changed, str(run_dir))
    folder = runs.RunFolder(str(run_dir))  # what evaluation and export read of it
    assert folder.objective == "simtrace" and folder.config["batch_size"] == 256


def test_a_run_made_before_a_default_changed_resumes_with_its_own_value(tmp_path, capsys):
    """--batch_norm's default became global_one_pass: a run folder made with the old default (global)
    resumes with global, says so in one line, and is not refused for other flags; a value given that
    differs from both still is, and --overwrite starts over with the new default."""
    from uniclr_tf.training import cli
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    old = TrainConfig().replace(batch_norm="global")
    (run_dir / "config.json").write_text(old.to_json())
    kept = cli.keep_changed_defaults(TrainConfig(), str(run_dir))
    assert kept.system.batch_norm == "global" and not kept.differences(old)
    assert "started with --batch_norm=global" in capsys.readouterr().out
    other = TrainConfig().replace(batch_norm="per_device")
    assert cli.keep_changed_defaults(other, str(run_dir)).differences(old) == [("batch_norm", "per_device", "global")]
    fresh = TrainConfig().replace(overwrite=True)
    assert cli.keep_changed_defaults(fresh, str(run_dir)).system.batch_norm == "global_one_pass"
    assert cli.keep_changed_defaults(TrainConfig(), str(tmp_path / "none")).system.batch_norm == "global_one_pass"


def test_view_batch_norm_reaches_the_model():
    """``--view_batch_norm=per_view`` builds a model that runs each view alone; joint is the default."""
    from uniclr_tf.data import load_dataset
    info = load_dataset("fashion_mnist", max_examples=64)
    for given, want in (([], "joint"), (["--view_batch_norm=per_view"], "per_view")):
        cfg = train.config_from_flags(_flag_values("--method=simclr", "--encoder=tiny", "--projector_dims=16,8",
                                                   *given))
        assert cfg.network.view_batch_norm == want
        assert train.build_model(cfg, info).view_batch_norm == want
    with pytest.raises(flags.IllegalFlagValueError, match="--view_batch_norm=each: value should be one of"):
        _flag_values("--view_batch_norm=each")
