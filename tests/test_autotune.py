"""The shipped XLA autotuning table (uniclr_tf/training/autotune.py): collect, seed, the shipped file, the CLI."""

import base64
import json
import os
import sys

import pytest
from tests import warm

from uniclr_tf.training import autotune

SHIPPED = autotune.table_path("0.11.2")


def _cache(root, folder, files):
    """A JAX compilation cache with XLA's per-fusion autotune folder ``folder`` holding ``files``."""
    d = os.path.join(root, autotune.SUBDIR, folder)
    os.makedirs(d, exist_ok=True)
    for name, data in files.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    return root


def test_collect_then_seed_gives_back_every_file_of_the_card(tmp_path):
    h100 = {"a1.pb": b"\x0a\x01h100-a", "b2.pb": bytes(range(256))}
    h200 = {"c3.pb": b"h200-c"}
    c1 = _cache(str(tmp_path / "c1"), "dev100", dict(h100, **{"a1.pb.tmp-x": b"partial"}))
    c2 = _cache(str(tmp_path / "c2"), "dev200", h200)
    table = str(tmp_path / "tables" / "jaxlib-9.9.9.json")
    assert autotune.collect([c1], table, "NVIDIA H100", ["cfg-a"]) == (2, 2)  # XLA's temporary file skipped
    assert autotune.collect([c2], table, "NVIDIA H200", ["cfg-b"]) == (1, 3)
    assert autotune.collect([c1], table, "NVIDIA H100", ["cfg-c"]) == (0, 3)  # nothing new
    loaded = autotune.load(table)
    assert loaded["jaxlib"] == "9.9.9"
    assert loaded["cards"]["dev100"]["configs"] == ["cfg-a", "cfg-c"]

    target = str(tmp_path / "fresh")
    lines = []
    assert autotune.seed(target, "NVIDIA H100", table, log=lines.append) == 2
    root = os.path.join(target, autotune.SUBDIR)
    assert sorted(os.listdir(root)) == ["dev100"]  # only the card in use
    for name, data in h100.items():
        with open(os.path.join(root, "dev100", name), "rb") as f:
            assert f.read() == data
    assert len(lines) == 1 and "2 results for NVIDIA H100" in lines[0]
    assert autotune.seed(target, "NVIDIA H100", table, log=lines.append) == 0  # already there: nothing, no line
    assert len(lines) == 1


def test_seed_never_replaces_a_file_xla_wrote(tmp_path):
    table = str(tmp_path / "t.json")
    autotune.collect([_cache(str(tmp_path / "c"), "dev", {"k.pb": b"shipped", "m.pb": b"other"})], table, "GPU")
    target = _cache(str(tmp_path / "cache"), "dev", {"k.pb": b"tuned here"})
    assert autotune.seed(target, "GPU", table, log=None) == 1
    with open(os.path.join(target, autotune.SUBDIR, "dev", "k.pb"), "rb") as f:
        assert f.read() == b"tuned here"
    assert not [n for n in os.listdir(os.path.join(target, autotune.SUBDIR, "dev")) if ".tmp" in n]


def test_seed_without_table_or_card_writes_nothing(tmp_path):
    table = str(tmp_path / "t.json")
    autotune.collect([_cache(str(tmp_path / "c"), "dev", {"k.pb": b"x"})], table, "NVIDIA H200")
    assert autotune.seed(str(tmp_path / "a"), "NVIDIA A100", table) == 0
    assert autotune.seed(str(tmp_path / "b"), "NVIDIA H200", str(tmp_path / "missing.json")) == 0
    assert not os.path.exists(tmp_path / "a") and not os.path.exists(tmp_path / "b")


def test_collect_refuses_a_folder_of_another_card_and_a_folder_without_results(tmp_path):
    table = str(tmp_path / "t.json")
    cache = _cache(str(tmp_path / "c"), "dev", {"k.pb": b"x"})
    autotune.collect([cache], table, "NVIDIA H100")
    with pytest.raises(ValueError, match="recorded for 'NVIDIA H100', not 'NVIDIA H200'"):
        autotune.collect([cache], table, "NVIDIA H200")
    with pytest.raises(FileNotFoundError, match=autotune.SUBDIR):
        autotune.collect([str(tmp_path)], table, "NVIDIA H100")


def test_a_table_of_another_format_is_refused(tmp_path):
    path = tmp_path / "t.json"
    path.write_text('{"format": 99, "cards": {}, "entries": {}}')
    with pytest.raises(ValueError, match="format 99"):
        autotune.load(str(path))


def test_the_shipped_table_is_consistent():
    """Every entry belongs to a recorded card, and XLA's key inside each result names its own folder and file."""
    table = autotune.load(SHIPPED)
    assert table["jaxlib"] == "0.11.2"
    names = {c["name"] for c in table["cards"].values()}
    assert {"NVIDIA H100 80GB HBM3", "NVIDIA H200"} <= names
    for key, data in table["entries"].items():
        folder, file = key.split("/")
        assert folder in table["cards"] and file.endswith(".pb")
        assert folder.encode() in data and file[:-len(".pb")].encode() in data, key
    for folder, card in table["cards"].items():
        assert "paper-simaffinity" in card["configs"]
        assert sum(k.startswith(folder + "/") for k in table["entries"]) > 300


def test_the_shipped_table_round_trips_byte_for_byte(tmp_path):
    table = autotune.load(SHIPPED)
    out = str(tmp_path / "copy.json")
    autotune.save(table, out)
    with open(SHIPPED) as a, open(out) as b:
        assert a.read() == b.read()  # sorted, stable: a rerun of collect with the same results changes nothing
    with open(SHIPPED) as f:
        raw = json.load(f)
    first = next(iter(raw["entries"]))
    assert base64.b64decode(raw["entries"][first]) == table["entries"][first]


def _cli(*args):
    return warm.run([sys.executable, "-m", "uniclr_tf.training.autotune", *args], capture_output=True, text=True,
                    env=dict(os.environ, JAX_PLATFORMS="cpu"))


def test_cli_list_and_collect(tmp_path):
    out = _cli("list", f"--table={SHIPPED}")
    assert out.returncode == 0, out.stderr
    assert "NVIDIA H200:" in out.stdout and "NVIDIA H100 80GB HBM3:" in out.stdout
    cache = _cache(str(tmp_path / "c"), "dev", {"k.pb": b"x"})
    table = str(tmp_path / "jaxlib-1.2.3.json")
    out = _cli("collect", cache, f"--table={table}")  # no GPU here and no --card: refused, nothing written
    assert out.returncode == 2 and "--card" in out.stderr and not os.path.exists(table)
    out = _cli("collect", cache, f"--table={table}", "--card=NVIDIA H200", "--configs=a,b")
    assert out.returncode == 0, out.stderr
    assert "1 new entries for NVIDIA H200, 1 in all" in out.stdout
    assert _cli("list", f"--table={tmp_path / 'none.json'}").returncode == 1


def test_no_seeding_off_gpus(tmp_path):
    pytest.importorskip("jax")
    assert autotune.seed_for_jax(str(tmp_path)) == 0  # the test machine's JAX runs on its CPU
    assert os.listdir(tmp_path) == []


def test_convolution_graphs_are_read_from_xla_flags():
    from uniclr_tf.training.cli import wants_convolution_graphs as wants
    assert wants("--xla_gpu_enable_command_buffer=+CONVOLUTION")
    assert wants("--xla_dump_to=/tmp/x --xla_gpu_enable_command_buffer=FUSION,convolution")
    assert not wants("--xla_gpu_enable_command_buffer=FUSION,CUBLAS")
    assert not wants("--xla_gpu_enable_command_buffer=-CONVOLUTION")
    assert not wants("--xla_gpu_enable_command_buffer=+CONVOLUTION --xla_gpu_enable_command_buffer=")  # the last
    assert not wants("") and not wants(None)


def test_no_priming_off_gpus(monkeypatch):
    from uniclr_tf.training.cli import prime_cudnn_for_graphs
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_command_buffer=+CONVOLUTION")
    assert prime_cudnn_for_graphs() == 0
