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
import glob
import json
import math
import os
import sys

from absl import flags, logging

from uniclr_tf.errors import UsageError

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


def define_flags(flag_values=None):
    """The tool's flags (defined when it runs, not when the module is imported)."""
    fv = flags.FLAGS if flag_values is None else flag_values  # an empty FlagValues is falsy
    flags.DEFINE_string("folder", None, "The image folder (as for --dataset=folder:PATH).", flag_values=fv)
    flags.DEFINE_string("out", None, "Output prefix, e.g. /data/pets: writes /data/pets-train-*.tfrecord, "
                                     "/data/pets-test-*.tfrecord and /data/pets.json.", flag_values=fv)
    flags.DEFINE_integer("shards", 0, "Shards of the train split (the test split gets its share, at least 1); "
                                      "0: one per 128 MiB of image files.", flag_values=fv)
    flags.DEFINE_float("holdout_fraction", 0.1, "Fraction of each class held out for test when the folder has no "
                                                "test sub-folder, in (0, 0.5].", flag_values=fv)
    flags.DEFINE_bool("skip_bad_files", False, "Skip (and count) unreadable images instead of stopping.",
                      flag_values=fv)
    flags.DEFINE_bool("overwrite", False, "Replace the shards and JSON of an earlier conversion to the same --out.",
                      flag_values=fv)


def main(argv):
    fv = flags.FLAGS
    if not fv.folder or not fv.out:
        sys.exit("error: --folder and --out are required")
    from uniclr_tf.data.spec import DataError
    logging.set_verbosity(logging.WARNING)  # the notes are printed
    try:
        meta = convert(fv.folder, fv.out, fv.shards, fv.holdout_fraction, fv.skip_bad_files,
                       fv.overwrite)
    except (DataError, ValueError) as e:
        sys.exit(f"error: {e}")
    parts = ", ".join(f"{s['count']} {name} images in {len(s['files'])} shard(s)" for name, s in meta["splits"].items())
    skipped = f" ({meta['num_skipped']} bad file(s) skipped)" if meta["num_skipped"] else ""
    print(f"wrote {parts}{skipped} and {fv.out}.json\ntrain with --dataset={meta['spec']}")


def entry_point():
    """What ``python -m uniclr_tf.tools.folder_to_tfrecord`` does."""
    from uniclr_tf import flagutil
    define_flags()
    flagutil.run_cli(__name__, __doc__, main)


if __name__ == "__main__":
    entry_point()
