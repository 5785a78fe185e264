"""The package as a user gets it: ``pyproject.toml`` builds a wheel that installs into a bare venv,
whose console scripts run and whose metadata carries the version and the licence; LICENSE and
NOTICE say what they must; and no file of the repository points outside it.

The wheel is built from a copy of the files the package is made of (no build folder or egg-info is
left in the checkout) with this environment's setuptools (``--no-build-isolation``: no download),
then installed with ``--no-deps`` into a venv made with ``python -m venv --without-pip`` (no system
site-packages). The heavy dependencies (TensorFlow, Keras, ...) come from this environment through a
``.pth`` file, which puts them *after* the venv's own site-packages: the installed ``uniclr_tf``
wins over any other copy, and the checkout itself is not on the path.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

import uniclr_tf

SCRIPTS = {"uniclr-train": "uniclr_tf.train", "uniclr-eval": "uniclr_tf.linear_eval",
           "uniclr-finetune": "uniclr_tf.finetune", "uniclr-export": "uniclr_tf.export",
           "uniclr-launch": "uniclr_tf.launch"}
PACKAGE_FILES = ("pyproject.toml", "README.md", "LICENSE", "NOTICE")
MIN_SETUPTOOLS = (77,)  # the SPDX `license = "Apache-2.0"` field of pyproject.toml


def _run(cmd, timeout=180, **kwargs):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kwargs)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    env.update(KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3", PYTHONNOUSERSITE="1", **extra)
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel built from pyproject.toml (in a copy of the package's files)."""
    import setuptools

    version = tuple(int(p) for p in re.findall(r"\d+", setuptools.__version__)[:1])
    if version < MIN_SETUPTOOLS:
        pytest.fail(f"setuptools {setuptools.__version__} in {sys.prefix} is older than 77, which "
                    "pyproject.toml needs: run `make setup` (it upgrades setuptools and installs the package)")
    tmp = tmp_path_factory.mktemp("package")
    src = tmp / "src"
    src.mkdir()
    for name in PACKAGE_FILES:
        shutil.copy2(REPO_ROOT / name, src / name)
    shutil.copytree(REPO_ROOT / "uniclr_tf", src / "uniclr_tf", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
          "-w", dist, src], cwd=tmp, env=_clean_env())
    wheels = list(dist.glob("uniclr_tf-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory):
    """A bare venv with the wheel installed (no dependencies); this environment's site-packages
    appended to its path for TensorFlow, Keras and the rest."""
    root = tmp_path_factory.mktemp("venv") / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", root])
    python = root / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    _run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", wheel],
         env=_clean_env())
    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                   env=_clean_env()).stdout.strip()
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(purelib, "zz_heavy_dependencies.pth").write_text("".join(f"{p}\n" for p in sorted(ours)))
    return root, python


def test_wheel_holds_the_package_its_metadata_and_licence(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        dist_info = f"uniclr_tf-{uniclr_tf.__version__}.dist-info"
        metadata = zf.read(f"{dist_info}/METADATA").decode()
        entry_points = zf.read(f"{dist_info}/entry_points.txt").decode()
        licence_files = {n.rsplit("/", 1)[-1] for n in names if n.startswith(f"{dist_info}/licenses/")}
    top = {n.split("/", 1)[0] for n in names}
    assert top == {"uniclr_tf", dist_info}, top  # no tests/, benchmarks/, export/ or scripts/ packages
    assert "uniclr_tf/objectives/uniclr.py" in names and "uniclr_tf/methods/byol.py" in names
    assert "uniclr_tf/training/autotune_tables/jaxlib-0.11.2.json" in names  # package data: the XLA autotuning table
    assert licence_files == {"LICENSE", "NOTICE"}
    assert re.search(r"^License-Expression: Apache-2\.0$", metadata, re.M), metadata[:2000]
    assert re.search(r"^Requires-Python: >=3\.11$", metadata, re.M)
    assert re.search(r"^Version: " + re.escape(uniclr_tf.__version__) + "$", metadata, re.M)
    for extra in ("jax", "dev"):
        assert re.search(rf"^Provides-Extra: {extra}$", metadata, re.M)
    for script, module in SCRIPTS.items():
        assert f"{script} = {module}:entry_point" in entry_points


def test_installed_version_matches_the_module(venv, tmp_path):
    root, python = venv
    code = ("import importlib.metadata as md, json, uniclr_tf; d = md.distribution('uniclr-tf'); "
            "print(json.dumps({'version': md.version('uniclr-tf'), 'module': uniclr_tf.__version__, "
            "'file': uniclr_tf.__file__, 'dist': str(d.locate_file(''))}))")
    out = json.loads(_run([python, "-c", code], cwd=tmp_path, env=_clean_env()).stdout.strip().splitlines()[-1])
    assert out["version"] == out["module"] == uniclr_tf.__version__
    # the venv's copy, not the checkout's (nor an editable install of it)
    assert Path(out["file"]).resolve().is_relative_to(root.resolve()), out
    assert Path(out["dist"]).resolve().is_relative_to(root.resolve()), out


@pytest.mark.parametrize("script, args, expected", [
    ("uniclr-train", ["--help"], ["--method", "simaffinity", "Pretrain an encoder"]),
    ("uniclr-export", ["--help"], ["--run_dir", "--out", "--check"]),
    ("uniclr-eval", ["--helpfull"], ["--run_dir", "--knn"]),
    ("uniclr-finetune", ["--help"], ["--run_dir", "--label_fraction", "fine-tuning recipe:"]),
    ("uniclr-launch", ["--help"], ["--processes", "--log_dir", "One training job"]),
])
def test_console_scripts_run(venv, tmp_path, script, args, expected):
    """The commands exist in the venv's bin/, run the same program as ``python -m`` and exit 0
    after printing their help (absl itself would exit 1)."""
    root, _ = venv
    exe = root / ("Scripts" if os.name == "nt" else "bin") / script
    assert exe.exists(), sorted(p.name for p in exe.parent.iterdir())
    proc = _run([exe, *args], cwd=tmp_path, env=_clean_env(), timeout=120)
    for text in expected:
        assert text in proc.stdout, proc.stdout[-3000:]


def test_console_script_errors_still_exit_non_zero(venv, tmp_path):
    root, _ = venv
    exe = root / ("Scripts" if os.name == "nt" else "bin") / "uniclr-export"
    proc = subprocess.run([str(exe), f"--run_dir={tmp_path / 'missing'}", f"--out={tmp_path / 'out'}"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env=_clean_env())
    assert proc.returncode == 1, (proc.stdout[-2000:], proc.stderr[-2000:])
    assert "missing" in proc.stderr


def test_a_stray_word_after_the_flags_is_refused_naming_it(tmp_path):
    """A flagfile given without ``--flagfile=`` is a word absl leaves after the flags: every CLI
    (``flagutil.run_cli``) refuses it with a usage error naming it, before anything is written."""
    env = {**_clean_env(), "PYTHONPATH": str(REPO_ROOT), "KERAS_BACKEND": "jax"}
    proc = subprocess.run([sys.executable, "-m", "uniclr_tf.train", "--flagfile=configs/quickstart.flags",
                           "configs/simtrace.flags", f"--run_dir={tmp_path / 'runs'}"],
                          capture_output=True, text=True, timeout=120, cwd=REPO_ROOT, env=env)
    assert proc.returncode == 1, (proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Unexpected arguments: configs/simtrace.flags" in proc.stderr
    assert not (tmp_path / "runs").exists()


CLI_MODULES = ("uniclr_tf.training.cli", "uniclr_tf.evaluation.linear", "uniclr_tf.evaluation.finetune", "uniclr_tf.serving.export",
               "uniclr_tf.training.autotune", "uniclr_tf.serving.release", "uniclr_tf.tools.folder_to_tfrecord")


@pytest.mark.parametrize("module", CLI_MODULES)
def test_every_cli_defines_its_flags_when_asked_into_the_flag_values_given(module):
    """Every ``python -m`` CLI defines its absl flags in ``define_flags(flag_values)``, not on import,
    and into the ``FlagValues`` it is given even when that is empty (an empty one is falsy: ``or``
    would put them in absl's global FLAGS)."""
    import importlib

    from absl import flags

    cli = importlib.import_module(module)
    before = set(flags.FLAGS)
    fv = flags.FlagValues()
    cli.define_flags(fv)
    added = set(flags.FLAGS) - before  # a library imported meanwhile may define its own (TensorFlow's)
    assert len(list(fv)) >= 3 and added.isdisjoint(fv), sorted(added & set(fv))


def test_license_is_apache_2_and_notice_names_the_paper():
    text = (REPO_ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert len(re.findall(r"^\s*\d+\. \w", text, re.M)) >= 9  # the nine numbered sections
    notice = (REPO_ROOT / "NOTICE").read_text(encoding="utf-8")
    assert "2211.14516" in notice and "UniCLR" in notice and "Li" in notice
    assert "independent implementation" in notice and "CC-BY-NC" in notice
    pyproject = (REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'^license = "Apache-2.0"$', pyproject, re.M)


# Built from pieces so that this file does not match its own search.
FORBIDDEN = ["PAPER" + ".md", "STACK" + ".md", "STYLE" + ".md", "../" + "shared", "shared" + "/guide",
             "shared" + "/tools", "<" + "shared>"]


def test_no_file_references_outside_the_repository():
    if not (REPO_ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files are unknown")
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=REPO_ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    hits = []
    for name in filter(None, files):
        path = REPO_ROOT / name
        if not path.is_file():
            continue  # deleted in the working tree
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary
        text = data.decode("utf-8", errors="replace")
        for lineno, line in enumerate(text.splitlines(), 1):
            hits += [f"{name}:{lineno}: {line.strip()[:120]}" for f in FORBIDDEN if f in line]
    assert not hits, "references outside the repository (use docs/ or scripts/):\n" + "\n".join(hits)


def _anchors(markdown):
    """GitHub's heading anchors: lower case, punctuation dropped (but - and _), spaces to -."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", markdown, re.M)}


def test_docs_links_resolve():
    """README, WORKSPACE and every docs/ page: each relative Markdown link (pictures included) and each
    anchor into a Markdown page exist."""
    pages = [REPO_ROOT / "README.md", REPO_ROOT / "WORKSPACE.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]
    assert {"objectives.md", "stack.md", "architecture.md", "speed.md", "reproduction.md"} <= {p.name for p in pages}
    for page in pages:
        text = page.read_text(encoding="utf-8")
        for target, anchor in re.findall(r"\]\(([^)#:]*)(?:#([^)]*))?\)", text):
            path = (page.parent / target).resolve() if target else page
            assert path.exists(), f"{page.relative_to(REPO_ROOT)}: broken link {target}"
            if anchor and path.suffix == ".md":
                assert anchor in _anchors(path.read_text(encoding="utf-8")), \
                    f"{page.relative_to(REPO_ROOT)}: no #{anchor} in {target or page.name}"
    workspace = (REPO_ROOT / "WORKSPACE.md").read_text(encoding="utf-8")
    assert "docs/objectives.md" in workspace and "docs/stack.md" in workspace
