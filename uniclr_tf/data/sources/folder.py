"""``folder:PATH``: image files, in class sub-folders or flat (unlabelled).

A folder with ``train`` and ``test`` (or ``val`` / ``validation``) sub-folders gives those splits;
otherwise a deterministic ``holdout_fraction`` (default 10 %) of each class is held out for test.
Labels are the sorted class sub-folder names; a flat folder is unlabelled (-1).

How the images are read depends on their decoded size, ``N x H x W x 3`` bytes (``H x W``: the
``image_size``, else the first image's):

* up to ``max_in_memory_mb`` (default 256 MB: e.g. 20k images of 64x64): every file is decoded
  (:func:`~uniclr_tf.data.decode.decode_image`) and checked once, eagerly, then held in memory
  (this also works without TensorFlow). A bad file stops loading with a one-line
  :class:`DataError` naming it, or is skipped and counted with ``skip_bad_files``.
* above it: the split streams from disk through tf.data (:mod:`uniclr_tf.data.stream`; needs
  TensorFlow). What is checked when:

  - at load, every file: :func:`~uniclr_tf.data.decode.image_header` (the header and the end of
    the file; a file whose header or end does not look right is decoded in full) gives its
    size and channels, so an undecodable or truncated file, or one of another size without
    ``image_size``, stops loading naming it (or is skipped and counted, ``num_skipped``);
  - at load, the first :data:`STREAM_STATS_SAMPLE` training files in the stream's order are
    decoded in full (the per-channel mean / std are theirs): a failure there is handled the same;
  - while streaming, each file is decoded when it is read; one that fails then (damage in the
    middle of a file whose header and end are intact) stops the pipeline with an error naming it
    (:func:`~uniclr_tf.data.stream.bad_file_message`), or with ``skip_bad_files`` is dropped,
    named on stderr and recorded in ``DatasetInfo.bad_files``.

  A streamed split's order is a deterministic shuffle of its files (a hash of their relative
  paths), so its first ``N`` images are a sample of every class.

Channels: grey everywhere stays grey; any colour image makes the whole dataset RGB (from the
decoded images, or from every file's header when streaming).

Each file is listed once: files that are not regular files (a FIFO, a device, a link to one) are
skipped by their type before anything opens them, and paths to the same file (hard links: the same
device and inode) are counted once, under the first path listed (train before test), each group
named in one warning. With ``check_duplicates`` every file's bytes are hashed and exact copies of
training images in the test split are reported (:func:`~uniclr_tf.data.sources.load_dataset`).
"""

from __future__ import annotations

import collections
import hashlib
import os
import stat

import numpy as np
from absl import logging

from uniclr_tf.data.decode import ImageDecodeError, decode_image, image_header
from uniclr_tf.data.decode import read_image_file as read_file
from uniclr_tf.data.lazy_tf import have_tensorflow, tf
from uniclr_tf.data.resize import resize_uint8
from uniclr_tf.data.sources.common import (_empty_split, _fingerprint, _make_info, _memory_split, _note, _percent,
                                          _with_fingerprints)
from uniclr_tf.data.spec import DataError, Split
from uniclr_tf.data.stats import _array_stats, _channel_stats
from uniclr_tf.data.stream import BadFiles, Stream, bad_file_message, decode_records, list_records

#: File name endings (lower case) that ``folder:`` specs read; other files are ignored.
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")
_TEST_DIR_NAMES = ("test", "val", "validation")


class _Shape(collections.namedtuple("_Shape", ["shape"])):
    """Internal: a header's shape where :func:`_keep_majority_size` expects an array."""


class _BadImage(Exception):
    """Internal: one image file cannot be used; ``args[0]`` is the reason."""


def _is_hidden(name):
    return name.startswith(".") or name.startswith("__")


class _Seen(set):
    """What a listing has met: the real paths that symbolic links led to (the set itself), the
    ``(device, inode)`` of every file listed (``files``: the first path of each), and the paths
    left out as ``hard_links`` (``(path, first path)``) or as ``special`` files (``(path, kind)``)."""

    def __init__(self):
        super().__init__()
        self.files, self.hard_links, self.special = {}, [], []

    def admit(self, path):
        """Whether to list the file ``path``: a regular file (after symbolic links) not listed yet
        under another path. Only ``stat`` is called: nothing is opened."""
        try:
            info = os.stat(path)
        except OSError as e:
            self.special.append((path, f"cannot be read ({e.strerror or e})"))
            return False
        if not stat.S_ISREG(info.st_mode):
            self.special.append((path, _file_kind(info.st_mode)))
            return False
        key = (info.st_dev, info.st_ino)
        if key in self.files:
            self.hard_links.append((path, self.files[key]))
            return False
        self.files[key] = path
        return True

    def report(self, notes):
        """One warning per kind of file left out (and a note for the user)."""
        if self.special:
            path, kind = self.special[0]
            _note(notes, f"warning: skipped {len(self.special)} path(s) that are not regular files, never opened "
                         f"(first: {path}, {kind})")
        if self.hard_links:
            path, first = self.hard_links[0]
            _note(notes, f"warning: {len(self.hard_links)} path(s) are hard links to files already listed (the same "
                         f"device and inode; first: {path} = {first}); each file is counted once, under its first "
                         "path")


def _file_kind(mode):
    for test, kind in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return kind
    return "not a regular file"


def _inside(path, folder):
    """Whether the real path ``path`` is ``folder`` or lies below it."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _link_problem(path, dataset_root, seen):
    """Why the symbolic link ``path`` is not followed (None: follow it). A link back into the dataset
    root (``a/self -> .``, ``a/loop -> ..``, ``a/x.png -> ../b/y.png``) would list files twice, under
    another class or in both splits, or loop; a link to a folder holding the root loops too; a
    target already listed is listed once."""
    target = os.path.realpath(path)
    if _inside(target, dataset_root):
        return "it points back into the dataset"
    if _inside(dataset_root, target):
        return "it points to a folder holding the dataset (a loop)"
    if target in seen:
        return "its target is already listed"
    return None


def _image_files(directory, dataset_root=None, seen=None):
    """Sorted image files under ``directory`` (recursive) and the count of other files ignored.

    Symbolic links are followed only out of ``dataset_root`` (default ``directory``), each target
    once (``seen``: the real paths listed so far, shared by the caller between folders); the others
    are skipped with a warning naming them (see :func:`_link_problem`)."""
    dataset_root = os.path.realpath(dataset_root or directory)
    seen = _Seen() if seen is None else seen
    found, ignored = [], 0

    def followed(path):
        if not os.path.islink(path):
            return True
        problem = _link_problem(path, dataset_root, seen)
        if problem is None and _inside(os.path.realpath(os.path.dirname(path)), os.path.realpath(path)):
            problem = "it points to a folder holding it (a loop)"
        if problem:
            logging.warning("%s: symbolic link not followed: %s", path, problem)
            return False
        seen.add(os.path.realpath(path))
        return True

    seen.add(os.path.realpath(directory))
    for root, dirs, files in os.walk(directory, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not _is_hidden(d) and followed(os.path.join(root, d)))
        seen.update(os.path.realpath(os.path.join(root, d)) for d in dirs)
        for f in sorted(files):
            if _is_hidden(f):
                continue
            if f.lower().endswith(IMAGE_EXTENSIONS):
                if followed(os.path.join(root, f)) and seen.admit(os.path.join(root, f)):
                    found.append(os.path.join(root, f))
            else:
                ignored += 1
    return found, ignored


def _list_folder(directory, class_names=None, labelled=None, dataset_root=None, seen=None):
    """``(files, labels, class_names)`` of one folder: class sub-folders, or flat (label -1).

    ``class_names``/``labelled`` come from the train folder when listing its test folder, whose
    layout and classes must agree with it. Symbolic links: see :func:`_image_files` (``dataset_root``,
    ``seen``).
    """
    dataset_root = dataset_root or directory
    seen = _Seen() if seen is None else seen
    entries = sorted(e for e in os.listdir(directory) if not _is_hidden(e))
    real_root = os.path.realpath(dataset_root)
    entries = [e for e in entries if not os.path.islink(os.path.join(directory, e))
               or not _warn_link(os.path.join(directory, e), real_root, seen)]
    subdirs = [e for e in entries if os.path.isdir(os.path.join(directory, e))]
    has_classes = bool(subdirs)
    if labelled is not None and entries and has_classes != labelled:
        layout = "class sub-folders" if labelled else "flat (no sub-folders)"
        raise DataError(f"{directory}: layout differs from the train folder, which is {layout}")
    files, labels, ignored = [], [], 0
    if has_classes:
        if class_names is None:
            class_names = tuple(subdirs)
        index = {c: i for i, c in enumerate(class_names)}
        for name in subdirs:
            if name not in index:
                raise DataError(f"{os.path.join(directory, name)}: class {name!r} is not among the "
                                f"train classes {list(class_names)}")
            found, skipped = _image_files(os.path.join(directory, name), dataset_root, seen)
            files += found
            labels += [index[name]] * len(found)
            ignored += skipped
        loose = [e for e in entries if e not in subdirs]
        if loose:
            logging.warning("%s: ignoring %d file(s) beside the class sub-folders (e.g. %s)",
                            directory, len(loose), loose[0])
    else:
        for name in entries:
            if name.lower().endswith(IMAGE_EXTENSIONS):
                if seen.admit(os.path.join(directory, name)):
                    files.append(os.path.join(directory, name))
            else:
                ignored += 1
        labels = [-1] * len(files)
    if ignored:
        logging.info("%s: ignored %d file(s) without an image extension %s", directory, ignored,
                     IMAGE_EXTENSIONS)
    return files, labels, (class_names if has_classes else None)


def _warn_link(path, real_root, seen):
    """True (and a warning) when the link ``path`` beside the class folders is not to be followed."""
    problem = _link_problem(path, real_root, seen)
    if problem:
        logging.warning("%s: symbolic link not followed: %s", path, problem)
        return True
    seen.add(os.path.realpath(path))
    return False


def _hash_order(paths, root):
    """Indices of ``paths`` ordered by a hash of their relative path: a deterministic shuffle."""
    key = lambda i: hashlib.md5(os.path.relpath(paths[i], root).encode()).hexdigest()  # noqa: E731
    return sorted(range(len(paths)), key=key)


def _holdout(files, labels, root, fraction):
    """Deterministic ``fraction`` of each class for test (at least one image of a class that has two)."""
    groups = {}
    for i, label in enumerate(labels):
        groups.setdefault(label, []).append(i)
    test_idx = set()
    for label in sorted(groups):
        members = groups[label]
        n = len(members)
        k = max(1, int(round(fraction * n))) if n >= 2 else 0
        order = _hash_order([files[i] for i in members], root)
        test_idx.update(members[j] for j in order[:k])
    train = [i for i in range(len(files)) if i not in test_idx]
    test = sorted(test_idx)
    return ([files[i] for i in train], [labels[i] for i in train],
            [files[i] for i in test], [labels[i] for i in test])


def _subsample(files, labels, max_examples, root):
    """A deterministic subset of at most ``max_examples`` files, kept in file order."""
    if not max_examples or len(files) <= max_examples:
        return files, labels
    keep = sorted(_hash_order(files, root)[:max_examples])
    return [files[i] for i in keep], [labels[i] for i in keep]


def read_image_file(path, max_pixels=None):
    """:func:`~uniclr_tf.data.decode.read_image_file` (a regular file within the pixel budget's
    size, opened without blocking); raises _BadImage."""
    try:
        return read_file(path, max_pixels)
    except OSError as e:
        raise _BadImage(f"cannot read file ({e.strerror or e})")
    except ImageDecodeError as e:
        raise _BadImage(e.args[0]) from None


def _decode_file(path, max_pixels=None):
    """Decodes one file with :func:`decode_image` (uint8 ``[H, W, C]``, C in {1, 3}); raises _BadImage."""
    raw = read_image_file(path, max_pixels)
    try:
        return decode_image(raw, max_pixels=max_pixels)
    except ImageDecodeError as e:
        raise _BadImage(e.args[0]) from None


def _read_header(path, max_pixels=None):
    """:func:`image_header` of one file (its ``.shape`` is ``(H, W, C)``); raises _BadImage."""
    try:
        return image_header(path, max_pixels)
    except OSError as e:
        raise _BadImage(f"cannot read file ({e.strerror or e})")
    except ImageDecodeError as e:
        raise _BadImage(e.args[0]) from None


def _decode_files(files, size, skip_bad_files, read=_decode_file, max_pixels=None):
    """Reads and checks every file with ``read`` (:func:`_decode_file`: the decoded image, resized
    to ``size``; :func:`_read_header`: its header), refusing files of more than ``max_pixels``
    pixels before decoding them; returns ``(results, kept indices, skipped paths)``. Without
    ``size``, the images' sizes are checked after (:func:`_keep_majority_size`)."""
    results, kept, skipped = [], [], []
    for i, path in enumerate(files):
        try:
            result = read(path, max_pixels)
            if size is not None and read is _decode_file and tuple(result.shape[:2]) != tuple(size):
                result = resize_uint8(result, size).numpy()
        except _BadImage as e:
            _bad(path, e.args[0], skip_bad_files, skipped)
            continue
        results.append(result)
        kept.append(i)
        if (i + 1) % 10_000 == 0:
            logging.info("%s %d / %d images", "decoded" if read is _decode_file else "checked", i + 1, len(files))
    return results, kept, skipped


def _bad(path, reason, skip_bad_files, skipped):
    """A bad file: a DataError naming it, or (``skip_bad_files``) recorded in ``skipped``."""
    if not skip_bad_files:
        raise DataError(f"{path}: {reason}")
    skipped.append(path)
    if len(skipped) <= 10:
        logging.warning("skipping %s: %s", path, reason)


def _keep_majority_size(splits, skip_bad_files, skipped):
    """Without ``image_size`` every image must have one size: the most common one among all the
    splits' images (not the first file's, which may be the odd one). ``splits`` is a list of
    ``(files, results, kept)``; returns them with the others dropped (``skip_bad_files``: recorded in
    ``skipped``), else raises a DataError naming the first one; and the size ``(H, W)``."""
    sizes = collections.Counter(tuple(r.shape[:2]) for _, results, _ in splits for r in results)
    if not sizes:
        return splits, None
    (height, width), count = sizes.most_common(1)[0]
    total = sum(sizes.values())
    out = []
    for files, results, kept in splits:
        keep = [j for j, r in enumerate(results) if tuple(r.shape[:2]) == (height, width)]
        for j in sorted(set(range(len(results))) - set(keep)):
            h, w = results[j].shape[:2]
            _bad(files[kept[j]], f"image is {h}x{w} but most images ({count} of {total}) are {height}x{width}; "
                                 "pass image_size (--image_size) to resize", skip_bad_files, skipped)
        out.append((files, [results[j] for j in keep], [kept[j] for j in keep]))
    return out, (height, width)


def _stack(images, channels):
    """Stacks decoded images into ``[N, H, W, channels]``; grey images are repeated to RGB."""
    if not images:
        return None
    out = np.empty((len(images), *images[0].shape[:2], channels), np.uint8)
    for i, image in enumerate(images):
        out[i] = image  # broadcasts [H, W, 1] over 3 channels
    return out


#: Training files decoded at load for the mean / std of a streamed folder (and checked in full).
STREAM_STATS_SAMPLE = 2_000


def _list_splits(root, opts, spec, notes):
    """``(train files, train labels, test files, test labels, class names)`` of the folder, as
    ``opts.splits`` asks (see :data:`~uniclr_tf.data.sources.common.SPLITS`)."""
    train_dir = os.path.join(root, "train")
    test_dir = next((os.path.join(root, d) for d in _TEST_DIR_NAMES
                     if os.path.isdir(os.path.join(root, d))), None)
    has_splits = os.path.isdir(train_dir) and test_dir is not None
    seen = _Seen()  # the real paths that symbolic links led to, the files listed: each listed once
    try:
        return _list_splits_seen(root, opts, spec, notes, train_dir, test_dir, has_splits, seen)
    finally:
        seen.report(notes)


def _list_splits_seen(root, opts, spec, notes, train_dir, test_dir, has_splits, seen):
    """:func:`_list_splits` with what the listing meets kept in ``seen``."""
    if opts.splits == "test":  # the test split of another spec's training data
        directory = test_dir if has_splits else root
        labelled = None if opts.class_names is None else True
        files, labels, class_names = _list_folder(directory, opts.class_names, labelled=labelled,
                                                  dataset_root=root, seen=seen)
        if not files:
            raise DataError(f"{directory}: no images found under {directory} (extensions "
                            f"{', '.join(IMAGE_EXTENSIONS)})")
        return [], [], files, labels, class_names
    if has_splits:
        train_files, train_labels, class_names = _list_folder(train_dir, dataset_root=root, seen=seen)
        if not train_files:
            raise DataError(f"{train_dir}: no images found under {train_dir}")
        if opts.splits == "train":
            return train_files, train_labels, [], [], class_names
        test_files, test_labels, _ = _list_folder(test_dir, class_names, labelled=class_names is not None,
                                                  dataset_root=root, seen=seen)
        logging.info("%s: using %s and %s as the train and test splits", root, train_dir, test_dir)
        return train_files, train_labels, test_files, test_labels, class_names
    files, labels, class_names = _list_folder(root, dataset_root=root, seen=seen)
    if not files:
        raise DataError(f"{root}: no images found under {root} (extensions {', '.join(IMAGE_EXTENSIONS)})")
    if opts.splits == "train":
        return files, labels, [], [], class_names
    train_files, train_labels, test_files, test_labels = _holdout(files, labels, root, opts.holdout_fraction)
    _note(notes, f"{spec}: no test split; holding out {_percent(opts.holdout_fraction)} ({len(test_files)} "
                 f"images) {'per class ' if class_names else ''}as test")
    return train_files, train_labels, test_files, test_labels, class_names


def _load_folder(spec, opts):
    """Image files in class sub-folders (labels = sorted names) or flat (unlabelled, -1); decoded
    into memory, or streamed when larger than ``opts.max_in_memory_mb`` (see the module docstring)."""
    path = os.path.expanduser(spec[len("folder:"):])
    if not path:
        raise ValueError(f"dataset spec {spec!r} names no folder; expected folder:PATH")
    root = os.path.abspath(path)
    if not os.path.isdir(root):
        raise DataError(f"{root}: no such folder")
    notes = []
    train_files, train_labels, test_files, test_labels, class_names = _list_splits(root, opts, spec, notes)
    train_files, train_labels = _subsample(train_files, train_labels, opts.max_examples, root)
    test_files, test_labels = _subsample(test_files, test_labels, opts.max_examples, root)

    fingerprints = {}
    if opts.check_duplicates and (test_files if opts.splits == "all" else True):
        fingerprints = {"train": _file_fingerprints(train_files, opts), "test": _file_fingerprints(test_files, opts)}
    count = len(train_files) + len(test_files)
    height, width = opts.size or _first_size(train_files + test_files)
    megabytes = count * height * width * 3 / 2 ** 20
    if megabytes <= opts.max_in_memory_mb:
        logging.info("%s: %d images, %.1f MB decoded <= %g MB: decoded into memory", spec, count, megabytes,
                     opts.max_in_memory_mb)
        return _with_fingerprints(_folder_in_memory(spec, root, opts, notes, class_names, train_files,
                                                    train_labels, test_files, test_labels), **fingerprints)
    message = (f"{spec}: {count} images, {megabytes:.0f} MB decoded > {opts.max_in_memory_mb:g} MB "
               f"(max_in_memory_mb)")
    if not have_tensorflow():
        raise DataError(f"{message}: streaming it needs tf.data, and TensorFlow is not installed here; raise "
                        "max_in_memory_mb (--max_in_memory_mb) to decode it into memory")
    _note(notes, f"{message}: streamed from disk through tf.data")
    return _with_fingerprints(_folder_streamed(spec, root, opts, notes, class_names, train_files, train_labels,
                                               test_files, test_labels), **fingerprints)


def _file_fingerprints(files, opts):
    """uint64 hashes of the bytes of ``files`` (those that cannot be read are left out: loading
    names them)."""
    out = []
    for path in files:
        try:
            out.append(_fingerprint(read_image_file(path, opts.max_image_pixels)))
        except _BadImage:
            continue
    return np.asarray(out, np.uint64)


def _first_size(files, tries=10):
    """``(H, W)`` of the first readable file among the first ``tries`` (``(0, 0)``: none; the
    checks that follow report them)."""
    for path in files[:tries]:
        try:
            return _read_header(path).shape[:2]
        except _BadImage:
            continue
    return 0, 0


def _channels(opts, files, counts):
    """The dataset's channels from each file's (``counts``): grey everywhere stays grey, any colour
    image makes the whole dataset RGB. The test split of another spec's training data takes the
    training channels (``opts.channels``): grey images are repeated to RGB, colour ones refused."""
    channels = 1 if all(c == 1 for c in counts) else 3
    if opts.channels == 1 and channels == 3:
        colour = next(f for f, c in zip(files, counts) if c == 3)
        raise DataError(f"{colour}: colour image, but the training images are grey")
    return opts.channels or channels


def _folder_in_memory(spec, root, opts, notes, class_names, train_files, train_labels, test_files,
                      test_labels):
    """Every file decoded and checked now, the splits held as arrays."""
    train_images, train_kept, train_skipped = _decode_files(train_files, opts.size, opts.skip_bad_files,
                                                            max_pixels=opts.max_image_pixels)
    test_images, test_kept, test_skipped = _decode_files(test_files, opts.size, opts.skip_bad_files,
                                                         max_pixels=opts.max_image_pixels)
    skipped = train_skipped + test_skipped
    if opts.size is None:
        ((_, train_images, train_kept), (_, test_images, test_kept)), _ = _keep_majority_size(
            [(train_files, train_images, train_kept), (test_files, test_images, test_kept)], opts.skip_bad_files,
            skipped)
    if skipped:
        logging.warning("%s: skipped %d bad image file(s) of %d (first: %s)", root, len(skipped),
                        len(train_files) + len(test_files), skipped[0])
    if not (test_images if opts.splits == "test" else train_images):
        raise DataError(f"{root}: no readable images found under {root} ({len(skipped)} bad file(s) skipped)")
    channels = _channels(opts, [train_files[i] for i in train_kept] + [test_files[i] for i in test_kept],
                         [im.shape[-1] for im in train_images + test_images])
    height, width = (train_images or test_images)[0].shape[:2]
    x_train = _stack(train_images, channels)
    del train_images
    x_test = _stack(test_images, channels)
    y_train = np.asarray([train_labels[i] for i in train_kept], np.int64)
    y_test = np.asarray([test_labels[i] for i in test_kept], np.int64)
    train = (_memory_split("train", x_train, y_train) if x_train is not None
             else _empty_split("train", (height, width, channels)))
    test = (_memory_split("test", x_test, y_test) if x_test is not None
            else _empty_split("test", (height, width, channels)))
    if x_test is None and opts.splits == "all":
        logging.warning("%s: the test split is empty", root)
    mean, std = _array_stats(x_train) if x_train is not None else ((0.5,) * channels, (0.5,) * channels)
    return _make_info(name=os.path.basename(root) or root, spec=spec, train=train, test=test,
                      num_classes=len(class_names) if class_names else None, class_names=class_names,
                      mean=mean, std=std, num_skipped=len(skipped), image_shape=(height, width, channels),
                      notes=notes)


def _file_stream(files, labels, image_shape, resize, bad_files, max_pixels=None):
    """A :class:`Stream` of image files: shuffled as a list of names, each decoded when read (the
    pixel budget checked from its header first)."""
    def load(path, label):
        return tf.io.read_file(path), label, path

    def describe(path, label):
        return label, path

    return Stream(list_records(list(files), np.asarray(labels, np.int64)),
                  lambda records: decode_records(records, load, describe, image_shape, resize, bad_files,
                                                 max_pixels=max_pixels))


def _folder_streamed(spec, root, opts, notes, class_names, train_files, train_labels, test_files,
                     test_labels):
    """Every file's header checked now; the splits streamed (decoded as they are read)."""
    total = len(train_files) + len(test_files)
    train_headers, train_kept, train_skipped = _decode_files(train_files, opts.size, opts.skip_bad_files,
                                                             read=_read_header, max_pixels=opts.max_image_pixels)
    test_headers, test_kept, test_skipped = _decode_files(test_files, opts.size, opts.skip_bad_files,
                                                          read=_read_header, max_pixels=opts.max_image_pixels)
    skipped = train_skipped + test_skipped
    majority = None
    if opts.size is None:
        ((_, train_headers, train_kept), (_, test_headers, test_kept)), majority = _keep_majority_size(
            [(train_files, [_Shape(h.shape) for h in train_headers], train_kept),
             (test_files, [_Shape(h.shape) for h in test_headers], test_kept)], opts.skip_bad_files, skipped)
    if not (test_headers if opts.splits == "test" else train_headers):
        raise DataError(f"{root}: no readable images found under {root} ({len(skipped)} bad file(s) skipped)")
    channels = _channels(opts, [train_files[i] for i in train_kept] + [test_files[i] for i in test_kept],
                         [h.shape[-1] for h in train_headers + test_headers])
    height, width = opts.size or majority
    image_shape = (height, width, channels)

    def ordered(files, labels, kept):  # the stream's order: a deterministic shuffle of the files
        files, labels = [files[i] for i in kept], [labels[i] for i in kept]
        order = _hash_order(files, root)
        return [files[i] for i in order], [labels[i] for i in order]

    train_files, train_labels = ordered(train_files, train_labels, train_kept)
    test_files, test_labels = ordered(test_files, test_labels, test_kept)
    resize = opts.size is not None
    mean, std = (0.5,) * channels, (0.5,) * channels
    if train_files:  # decode a sample in full: the statistics, and a closer look at those files
        sample = BadFiles() if opts.skip_bad_files else None
        stream = _file_stream(train_files[:STREAM_STATS_SAMPLE], train_labels[:STREAM_STATS_SAMPLE], image_shape,
                              resize, sample, opts.max_image_pixels)
        try:
            mean, std = _channel_stats((x.numpy() for x, _ in stream.dataset().batch(64)), channels)
        except tf.errors.OpError as e:
            raise DataError(bad_file_message(e) or f"{root}: {e.message.splitlines()[0]}") from None
        if sample is not None and sample.names():
            bad = set(sample.names())
            skipped += sorted(bad)
            keep = [i for i, f in enumerate(train_files) if f not in bad]
            train_files, train_labels = [train_files[i] for i in keep], [train_labels[i] for i in keep]
    if skipped:
        logging.warning("%s: skipped %d bad image file(s) of %d (first: %s)", root, len(skipped), total, skipped[0])
    bad_files = BadFiles() if opts.skip_bad_files else None
    train = Split("train", len(train_files), stream=_file_stream(train_files, train_labels, image_shape, resize,
                                                                 bad_files, opts.max_image_pixels))
    test = Split("test", len(test_files), stream=_file_stream(test_files, test_labels, image_shape, resize,
                                                              bad_files, opts.max_image_pixels))
    return _make_info(name=os.path.basename(root) or root, spec=spec, train=train, test=test,
                      num_classes=len(class_names) if class_names else None, class_names=class_names,
                      mean=mean, std=std, num_skipped=len(skipped), image_shape=image_shape, notes=notes,
                      bad_files=bad_files)
