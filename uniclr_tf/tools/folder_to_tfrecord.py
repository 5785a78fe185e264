r"""Write an image folder as TFRecord shards for ``--dataset=tfrecord:TRAIN_GLOB,TEST_GLOB``.

    python -m uniclr_tf.tools.folder_to_tfrecord --folder=PATH --out=PREFIX [--shards=N]

The folder is read as ``--dataset=folder:PATH`` reads it: class sub-folders (labels: the sorted
names) or flat (unlabelled, -1); ``train/`` and ``test/`` (or ``val/`` / ``validation/``)
sub-folders give the splits, else ``--holdout_fraction`` of each class is held out for test (the
same files ``folder:`` holds out). Every file is checked as ``folder:`` checks a streamed folder
(its header and its end; a doubtful file is decoded in full): a bad one stops the tool naming it,
or is skipped and counted with ``--skip_bad_files``.

Written: ``PREFIX-train-00000-of-0000N.tfrecord`` ... and ``PREFIX-test-...`` (the file bytes as
they are, no re-encoding; records in a deterministic shuffled order, dealt round-robin over the
shards), with the features of :mod:`uniclr_tf.data.sources.tfrecord` (``image/encoded``,
``image/class/label``, ``image/height``, ``image/width``, ``image/filename``, ``image/format``),
and ``PREFIX.json``: the class names, channels, the image size (when all agree), and per split the
shard names, the count and the count per class. The tool prints the ``--dataset`` spec to train on.
"""

import collections
import dataclasses
import glob
import json
import math
import os
import sys

from absl import logging

from uniclr_tf.config.errors import UsageError
from uniclr_tf.config.fields import check_field, flag, unset

_SHARD_BYTES = 128 * 2 ** 20


def _check(files, labels, skip_bad_files):
    """``(files, labels, headers, skipped)``: every file's header checked (one-line error or skip)."""
    from uniclr_tf.data.sources.folder import _BadImage, _read_header
    from uniclr_tf.data.spec import DataError

    kept, kept_labels, headers, skipped = [], [], [], []
    for path, label in zip(files, labels):
        try:
            headers.append(_read_header(path))
        except _BadImage as e:
            if not skip_bad_files:
                raise DataError(f"{path}: {e.args[0]}") from None
            skipped.append(path)
            print(f"warning: skipping {path}: {e.args[0]}", file=sys.stderr)
            continue
        kept.append(path)
        kept_labels.append(label)
    return kept, kept_labels, headers, skipped


def convert(folder, out, shards=0, holdout_fraction=0.1, skip_bad_files=False, overwrite=False):
    """Writes ``folder`` as TFRecord shards and a JSON under the prefix ``out``; returns the JSON
    dict (its ``spec`` entry is the ``--dataset`` spec). See the module docstring."""
    import tensorflow as tf

    from uniclr_tf.data.sources.common import LoadOptions
    from uniclr_tf.data.sources.folder import _hash_order, _list_splits
    from uniclr_tf.data.sources.tfrecord import JSON_FORMAT, encode_example
    from uniclr_tf.data.spec import DataError

    root = os.path.abspath(os.path.expanduser(folder))
    if not os.path.isdir(root):
        raise DataError(f"--folder={folder}: no such folder")
    if not 0 < holdout_fraction <= 0.5:
        raise UsageError(f"--holdout_fraction: expected a number in (0, 0.5]; received {holdout_fraction}")
    if shards < 0:
        raise UsageError(f"--shards: expected an integer >= 0; received {shards}")
    prefix = os.path.abspath(os.path.expanduser(out))
    earlier = sorted(glob.glob(glob.escape(prefix) + "-*.tfrecord")) + (
        [prefix + ".json"] if os.path.exists(prefix + ".json") else [])
    if earlier and not overwrite:
        raise UsageError(f"--out={out}: {earlier[0]} exists (an earlier conversion?); pass --overwrite to replace "
                         "it, or another --out")
    for path in earlier:
        os.remove(path)
    os.makedirs(os.path.dirname(prefix), exist_ok=True)

    notes = []
    train_files, train_labels, test_files, test_labels, class_names = _list_splits(
        root, LoadOptions(holdout_fraction=holdout_fraction), f"folder:{root}", notes)
    for note in notes:
        print(note)
    splits, skipped, all_headers = {}, [], []
    for name, files, labels in (("train", train_files, train_labels), ("test", test_files, test_labels)):
        files, labels, headers, bad = _check(files, labels, skip_bad_files)
        order = _hash_order(files, root)
        splits[name] = ([files[i] for i in order], [labels[i] for i in order], [headers[i] for i in order])
        skipped += bad
        all_headers += headers
    if not splits["train"][0]:
        raise DataError(f"{root}: no readable images found under {root} ({len(skipped)} bad file(s) skipped)")

    sizes = {h.shape[:2] for h in all_headers}
    meta = {"format": JSON_FORMAT, "name": os.path.basename(root), "source": root,
            "class_names": list(class_names) if class_names else None,
            "channels": 1 if all(h.shape[-1] == 1 for h in all_headers) else 3,
            "image_size": list(sizes.pop()) if len(sizes) == 1 else None,
            "num_skipped": len(skipped), "splits": {}}
    train_bytes = sum(os.path.getsize(f) for f in splits["train"][0])
    train_shards = shards or max(1, math.ceil(train_bytes / _SHARD_BYTES))
    for name, (files, labels, headers) in splits.items():
        if not files:
            continue
        count = train_shards if name == "train" else max(1, round(train_shards * len(files) / len(splits["train"][0])))
        count = min(count, len(files))
        paths = [f"{prefix}-{name}-{i:05d}-of-{count:05d}.tfrecord" for i in range(count)]
        writers = [tf.io.TFRecordWriter(p) for p in paths]
        try:
            for i, (path, label, header) in enumerate(zip(files, labels, headers)):
                with open(path, "rb") as f:
                    raw = f.read()
                writers[i % count].write(encode_example(raw, label, *header.shape[:2], os.path.relpath(path, root),
                                                        header.format.lower()))
        finally:
            for writer in writers:
                writer.close()
        per_class = collections.Counter(labels)
        meta["splits"][name] = {
            "files": [os.path.basename(p) for p in paths], "count": len(files),
            "class_counts": ({c: per_class.get(i, 0) for i, c in enumerate(class_names)} if class_names
                             else None)}
    globs = [f"{prefix}-{name}-*.tfrecord" for name in ("train", "test") if name in meta["splits"]]
    meta["spec"] = "tfrecord:" + ",".join(globs)
    with open(prefix + ".json", "w") as f:
        json.dump(meta, f, indent=2)
    return meta


@dataclasses.dataclass(frozen=True)
class FolderToTFRecordConfig:
    """Every setting of one ``python -m uniclr_tf.tools.folder_to_tfrecord`` invocation. Each field is a
    flag of the same name, declared with its help (:func:`uniclr_tf.config.fields.flag`); the order is
    ``--help``'s (:data:`HELP_GROUPS`)."""

    folder: str = unset(str, "The image folder (as for --dataset=folder:PATH).")
    holdout_fraction: float = flag(0.1, "Fraction of each class held out for test when the folder has no test "
                                        "sub-folder, in (0, 0.5].")
    skip_bad_files: bool = flag(False, "Skip (and count) unreadable images instead of stopping.")
    out: str = unset(str, "Output prefix, e.g. /data/pets: writes /data/pets-train-*.tfrecord, "
                          "/data/pets-test-*.tfrecord and /data/pets.json.")
    shards: int = flag(0, "Shards of the train split (the test split gets its share, at least 1); 0: one per "
                          "128 MiB of image files.")
    overwrite: bool = flag(False, "Replace the shards and JSON of an earlier conversion to the same --out.")

    def __post_init__(self):
        check_field(self, bool(self.folder), "folder", "the image folder to convert (as for --dataset=folder:PATH)")
        check_field(self, 0 < self.holdout_fraction <= 0.5, "holdout_fraction", "a number in (0, 0.5]")
        check_field(self, bool(self.out), "out", "the output prefix of the shards and JSON")
        check_field(self, self.shards >= 0, "shards", "an integer >= 0")


#: ``--help``'s groups: ``(title, first field)`` (:func:`uniclr_tf.config.flagutil.group_fields`).
HELP_GROUPS = [("input (read as --dataset=folder: reads it)", "folder"), ("output", "out")]


def define_flags(flag_values=None):
    """One flag per ``FolderToTFRecordConfig`` field, same name, same default, the help next to the
    field (defined when the tool runs, not when the module is imported)."""
    from uniclr_tf.config import flagutil
    flagutil.define_flags(FolderToTFRecordConfig, flag_values=flag_values)


def config_from_flags(flag_values=None) -> FolderToTFRecordConfig:
    from uniclr_tf.config import flagutil
    return flagutil.config_from_flags(FolderToTFRecordConfig, flag_values)


def run(cfg: FolderToTFRecordConfig):
    """Converts as ``cfg`` says and prints the ``--dataset`` spec to train on; bad data or a refused
    ``--out`` stops with one ``error:`` line."""
    from uniclr_tf.data.spec import DataError
    try:
        meta = convert(cfg.folder, cfg.out, cfg.shards, cfg.holdout_fraction, cfg.skip_bad_files, cfg.overwrite)
    except (DataError, ValueError) as e:
        sys.exit(f"error: {e}")
    parts = ", ".join(f"{s['count']} {name} images in {len(s['files'])} shard(s)" for name, s in meta["splits"].items())
    skipped = f" ({meta['num_skipped']} bad file(s) skipped)" if meta["num_skipped"] else ""
    print(f"wrote {parts}{skipped} and {cfg.out}.json\ntrain with --dataset={meta['spec']}")


def main(argv):
    from uniclr_tf.config import flagutil
    cfg = flagutil.config_or_exit(FolderToTFRecordConfig)
    logging.set_verbosity(logging.WARNING)  # the notes are printed
    run(cfg)


def entry_point():
    """What ``python -m uniclr_tf.tools.folder_to_tfrecord`` does."""
    from uniclr_tf.config import flagutil
    define_flags()
    flagutil.run_cli(__name__, __doc__, main, groups=flagutil.group_fields(FolderToTFRecordConfig, HELP_GROUPS))


if __name__ == "__main__":
    entry_point()
