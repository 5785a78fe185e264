"""The repository as a reader finds it: plain words in every tracked file, and a map (WORKSPACE.md) that
names every module of the package."""

import re
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
THIS = Path(__file__).resolve().relative_to(REPO_ROOT).as_posix()

# Words that belong to a tracker or to the environment a change was made in, not to the software: a reader
# has neither. Each pattern is (regex, what it is); the ones matched case-sensitively say so with (?-i).
WORDS = [
    (r"(?-i:\bIssue) #?\d+|\bissue #?\d+\b", "a tracker's issue number"),
    (r"\b(?:pull request|PR) #\d+(?![\w/])", "a tracker's pull request number"),
    (r"\blent\b", "the lending of machines"),
    (r"\bdevice (?:call|command|tool|machine)s?\b", "the tool that ran the GPU jobs"),
    (r"(?-i:\$OUT)\b", "the GPU tool's output folder (use OUT_DIR=)"),
    (r"\bcarr(?:y|ied)(?: list| path)s?\b", "the GPU tool's carried paths"),
    (r"\bfiles_at\b|\bbudget_left|\bwarm machine|\bheld machine", "the GPU tool's vocabulary"),
    (r"(?-i:\bthe CEO\b)", "the environment's roles"),
    (r"\bhelper session|\b(?:this|a later|an earlier|the next|the previous) session\b", "a work session"),
    (r"\b(?:last|this|next|previous|earlier|a later|second|third) round\b|\bround-?\d", "a round of work"),
    (r"\bthe (?:lent )?GPU machines?\b", "the machines the project was built on (say what a machine needs)"),
    (r"\bset-up line\b", "the GPU tool's set-up line"),
]
PATTERN = re.compile("|".join(f"(?:{p})" for p, _ in WORDS), re.IGNORECASE)
BINARY = (".png", ".jpg", ".jpeg", ".gz", ".npz", ".h5", ".keras", ".pb", ".whl", ".ico")


def tracked_text_files():
    names = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True,
                           text=True).stdout.split("\0")
    for name in names:
        path = REPO_ROOT / name
        if name and name != THIS and not name.endswith(BINARY) and path.is_file():
            try:
                yield name, path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue


def offenders():
    found = []
    for name, text in tracked_text_files():
        for number, line in enumerate(text.splitlines(), 1):
            match = PATTERN.search(line)
            if match:
                why = next(w for p, w in WORDS if re.search(p, match.group(0), re.IGNORECASE))
                found.append(f"{name}:{number}: {match.group(0)!r} ({why})")
    return found


def test_the_patterns_catch_what_they_are_for_and_leave_plain_words_alone():
    caught = ["Issue 24: why", "see issue #12", "on the lent GPU", "one device call", "files land in $OUT",
              "the carried paths", "the last round", "round2-v0.json", "budget_left_s", "a later session",
              "on the GPU machines", "the gpu-prep set-up line"]
    plain = ["an open Keras issue, keras-team/keras#23553", "rounding differences", "round(x, 2)", "$OUT_DIR",
             "OUT_DIR=runs/x", "a session of its own (setsid)", 'scope="session"', "carry the state",
             "a helper for the statistics", "a machine with 4 GPUs", "lentils", "on a GPU machine with JAX"]
    assert [text for text in caught if not PATTERN.search(text)] == []
    assert [text for text in plain if PATTERN.search(text)] == []


def test_tracked_files_use_the_words_of_the_software():
    """No tracker numbers and no vocabulary of the environment the project was built in, anywhere in the tree
    (code, tests, scripts, docs, configs, results)."""
    found = offenders()
    assert not found, f"{len(found)} lines:\n" + "\n".join(found)


def package_modules():
    """(dotted name, path) of every tracked module and package of uniclr_tf/ (what a clone holds)."""
    names = subprocess.run(["git", "ls-files", "-z", "uniclr_tf"], cwd=REPO_ROOT, capture_output=True, check=True,
                           text=True).stdout.split("\0")
    for name in sorted(n for n in names if n.endswith(".py")):
        relative = Path(name)
        parts = list(relative.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), relative


def named_in(text, dotted, path):
    """Whether the map names the module: its dotted name, its path, or (in the layout) its file name and
    the folder it is in (``data/`` ... ``sources/`` ... ``folder.py``)."""
    if dotted in text or path.as_posix() in text:
        return True
    folders = path.parts[1:-1]
    if path.name == "__init__.py":
        return bool(folders) and all(f"{folder}/" in text for folder in folders) or not folders
    return re.search(rf"(?<![\w/.]){re.escape(path.name)}\b", text) is not None and all(
        f"{folder}/" in text for folder in folders)


def test_every_module_of_the_package_is_named_in_the_map():
    text = (REPO_ROOT / "WORKSPACE.md").read_text()
    missing = [dotted for dotted, path in package_modules() if not named_in(text, dotted, path)]
    assert len(list(package_modules())) > 60
    assert not missing, "WORKSPACE.md does not name: " + ", ".join(missing)


def test_the_map_check_notices_a_module_it_does_not_name():
    text = "uniclr_tf/\n  nets/  encoders.py heads.py\n  data/ sources/ (folder.py)\n"
    assert named_in(text, "uniclr_tf.nets.encoders", Path("uniclr_tf/nets/encoders.py"))
    assert named_in(text, "uniclr_tf.data.sources.folder", Path("uniclr_tf/data/sources/folder.py"))
    assert not named_in(text, "uniclr_tf.nets.model", Path("uniclr_tf/nets/model.py"))
    assert not named_in(text, "uniclr_tf.training.cli", Path("uniclr_tf/training/cli.py"))
    assert named_in("see uniclr_tf.training.cli", "uniclr_tf.training.cli", Path("uniclr_tf/training/cli.py"))


@pytest.mark.parametrize("page", ["reproduction", "full_schedule", "speed", "scaling"])
def test_each_results_page_is_short_and_says_how_to_regenerate_its_tables(page):
    text = (REPO_ROOT / "docs" / "results" / f"{page}.md").read_text()
    assert len(text.splitlines()) <= 250, page
    assert f"python -m benchmarks.report {'study' if page in ('reproduction', 'full_schedule') else page}" in text
    for linked in re.findall(r"\]\((\.\./\.\./[^)#]+)\)", text):
        assert (REPO_ROOT / "docs" / "results" / linked).resolve().exists(), linked
