"""``folder:PATH``: image files, in class sub-folders or flat (unlabelled).

Every file is decoded (:func:`~uniclr_tf.data.decode.decode_image`) and checked once, eagerly,
then held in memory; a bad file stops loading with a :class:`DataError` naming it, or is skipped
and counted with ``skip_bad_files``. A folder with ``train`` and ``test`` (or ``val`` /
``validation``) sub-folders gives those splits; otherwise a deterministic ~10 % per class is held
out for test.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
from absl import logging

from uniclr_tf.data.decode import ImageDecodeError, decode_image
from uniclr_tf.data.sources.common import (_HOLDOUT_FRACTION, _make_info, _memory_split,
                                           _resize_uint8)
from uniclr_tf.data.spec import DataError
from uniclr_tf.data.stats import _array_stats

#: File name endings (lower case) that ``folder:`` specs read; other files are ignored.
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")
_TEST_DIR_NAMES = ("test", "val", "validation")


class _BadImage(Exception):
    """Internal: one image file cannot be used; ``args[0]`` is the reason."""


def _is_hidden(name):
    return name.startswith(".") or name.startswith("__")


def _image_files(directory):
    """Sorted image files under ``directory`` (recursive) and the count of other files ignored."""
    found, ignored = [], 0
    for root, dirs, files in os.walk(directory, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not _is_hidden(d))
        for f in sorted(files):
            if _is_hidden(f):
                continue
            if f.lower().endswith(IMAGE_EXTENSIONS):
                found.append(os.path.join(root, f))
            else:
                ignored += 1
    return found, ignored


def _list_folder(directory, class_names=None, labelled=None):
    """``(files, labels, class_names)`` of one folder: class sub-folders, or flat (label -1).

    ``class_names``/``labelled`` come from the train folder when listing its test folder, whose
    layout and classes must agree with it.
    """
    entries = sorted(e for e in os.listdir(directory) if not _is_hidden(e))
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
            found, skipped = _image_files(os.path.join(directory, name))
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
                files.append(os.path.join(directory, name))
            else:
                ignored += 1
        labels = [-1] * len(files)
    if ignored:
        logging.info("%s: ignored %d file(s) without an image extension %s", directory, ignored,
                     IMAGE_EXTENSIONS)
    return files, labels, (class_names if has_classes else None)


def _hash_order(paths, root):
    """Indices of ``paths`` ordered by a hash of their relative path: a deterministic shuffle."""
    key = lambda i: hashlib.md5(os.path.relpath(paths[i], root).encode()).hexdigest()  # noqa: E731
    return sorted(range(len(paths)), key=key)


def _holdout(files, labels, root):
    """Deterministic ~10% per class for test (at least one image of a class that has two)."""
    groups = {}
    for i, label in enumerate(labels):
        groups.setdefault(label, []).append(i)
    test_idx = set()
    for label in sorted(groups):
        members = groups[label]
        n = len(members)
        k = max(1, int(round(_HOLDOUT_FRACTION * n))) if n >= 2 else 0
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


def _decode_file(path):
    """Decodes one file with :func:`decode_image` (uint8 ``[H, W, C]``, C in {1, 3}); raises _BadImage."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise _BadImage(f"cannot read file ({e.strerror or e})")
    try:
        return decode_image(raw)
    except ImageDecodeError as e:
        raise _BadImage(e.args[0]) from None


def _decode_files(files, size, skip_bad_files, reference):
    """Decodes and checks every file; returns ``(images, kept indices, skipped paths)``.

    ``reference`` is a one-element list holding ``(path, (H, W))`` of the first good image, shared
    between the splits so that both must match it when ``size`` is None.
    """
    images, kept, skipped = [], [], []
    for i, path in enumerate(files):
        try:
            image = _decode_file(path)
            if size is not None:
                if tuple(image.shape[:2]) != tuple(size):
                    image = _resize_uint8(image, size).numpy()
            elif not reference:
                reference.append((path, tuple(image.shape[:2])))
            elif tuple(image.shape[:2]) != reference[0][1]:
                (first, (h, w)) = reference[0]
                raise _BadImage(f"image is {image.shape[0]}x{image.shape[1]} but the first image "
                                f"({first}) is {h}x{w}; pass image_size to resize")
        except _BadImage as e:
            if not skip_bad_files:
                raise DataError(f"{path}: {e.args[0]}") from None
            skipped.append(path)
            if len(skipped) <= 10:
                logging.warning("skipping %s: %s", path, e.args[0])
            continue
        images.append(image)
        kept.append(i)
        if (i + 1) % 10_000 == 0:
            logging.info("decoded %d / %d images", i + 1, len(files))
    return images, kept, skipped


def _stack(images, channels):
    """Stacks decoded images into ``[N, H, W, channels]``; grey images are repeated to RGB."""
    if not images:
        return None
    out = np.empty((len(images), *images[0].shape[:2], channels), np.uint8)
    for i, image in enumerate(images):
        out[i] = image  # broadcasts [H, W, 1] over 3 channels
    return out


def _load_folder(spec, size, skip_bad_files, max_examples):
    """Image files in class sub-folders (labels = sorted names) or flat (unlabelled, -1)."""
    path = os.path.expanduser(spec[len("folder:"):])
    if not path:
        raise ValueError(f"dataset spec {spec!r} names no folder; expected folder:PATH")
    root = os.path.abspath(path)
    if not os.path.isdir(root):
        raise DataError(f"{root}: no such folder")

    train_dir = os.path.join(root, "train")
    test_dir = next((os.path.join(root, d) for d in _TEST_DIR_NAMES
                     if os.path.isdir(os.path.join(root, d))), None)
    if os.path.isdir(train_dir) and test_dir is not None:
        train_files, train_labels, class_names = _list_folder(train_dir)
        if not train_files:
            raise DataError(f"{train_dir}: no images found under {train_dir}")
        test_files, test_labels, _ = _list_folder(test_dir, class_names, labelled=class_names is not None)
        logging.info("%s: using %s and %s as the train and test splits", root, train_dir, test_dir)
    else:
        files, labels, class_names = _list_folder(root)
        if not files:
            raise DataError(f"{root}: no images found under {root} (extensions {', '.join(IMAGE_EXTENSIONS)})")
        train_files, train_labels, test_files, test_labels = _holdout(files, labels, root)
    train_files, train_labels = _subsample(train_files, train_labels, max_examples, root)
    test_files, test_labels = _subsample(test_files, test_labels, max_examples, root)

    reference = []
    train_images, train_kept, train_skipped = _decode_files(train_files, size, skip_bad_files, reference)
    test_images, test_kept, test_skipped = _decode_files(test_files, size, skip_bad_files, reference)
    skipped = train_skipped + test_skipped
    if skipped:
        logging.warning("%s: skipped %d bad image file(s) of %d (first: %s)", root, len(skipped),
                        len(train_files) + len(test_files), skipped[0])
    if not train_images:
        raise DataError(f"{root}: no readable images found under {root} ({len(skipped)} bad file(s) skipped)")
    # Grey everywhere stays grey; any colour image makes the whole dataset RGB.
    channels = 1 if all(im.shape[-1] == 1 for im in train_images + test_images) else 3
    height, width = train_images[0].shape[:2]
    x_train = _stack(train_images, channels)
    del train_images
    x_test = _stack(test_images, channels)
    if x_test is None:
        x_test = np.zeros((0, height, width, channels), np.uint8)
        logging.warning("%s: the test split is empty", root)
    y_train = np.asarray([train_labels[i] for i in train_kept], np.int64)
    y_test = np.asarray([test_labels[i] for i in test_kept], np.int64)
    mean, std = _array_stats(x_train)
    return _make_info(name=os.path.basename(root) or root, spec=spec,
                      train=_memory_split("train", x_train, y_train),
                      test=_memory_split("test", x_test, y_test),
                      num_classes=len(class_names) if class_names else None,
                      class_names=class_names, mean=mean, std=std, num_skipped=len(skipped))
