"""Dataset specs, and what loading one gives.

A spec names a dataset in one of :data:`SPEC_FORMS`; ``image_size`` arguments,
``tfds:NAME[:VERSION][:SPLIT]`` and ``tfrecord:TRAIN_GLOB[,TEST_GLOB]`` specs are parsed here.
:class:`DatasetInfo` (shapes, classes, per-channel statistics and the :class:`Split` objects) is
what :func:`~uniclr_tf.data.sources.load_dataset` returns, and :class:`DataError` is the one-line
error of missing, unknown or bad data.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Mapping, Optional, Tuple

import numpy as np

from uniclr_tf.data.lazy_tf import tf

if TYPE_CHECKING:
    from uniclr_tf.data.stream import BadFiles, Stream

@dataclasses.dataclass(frozen=True)
class Source:
    """One dataset source: its ``name``, the ``form`` of its specs (for errors and ``--help``), how a
    spec is recognised (one of ``names``, or starting with ``prefix``), its ``loader``
    (``"module:function"`` in :mod:`uniclr_tf.data.sources`, imported on first use, called as
    ``loader(spec, options)``) and a ``help`` line."""
    name: str
    form: str
    loader: str
    help: str
    names: Tuple[str, ...] = ()
    prefix: str = ""

    def matches(self, spec: str) -> bool:
        return spec in self.names or bool(self.prefix) and spec.startswith(self.prefix)


#: The one table of dataset sources: spec recognition (:func:`source_of`), loading
#: (:func:`uniclr_tf.data.sources.load_dataset`) and every help string (:func:`spec_forms`).
SOURCES = (
    Source("fashion_mnist", "fashion_mnist", "fashion_mnist:_load_fashion_mnist",
           "Keras' copy of Fashion-MNIST, offline, in memory", names=("fashion_mnist", "fashion-mnist")),
    Source("tfds", "tfds:NAME[:SPLIT]", "tfds:_load_tfds", "a TensorFlow Datasets image dataset, streamed",
           prefix="tfds:"),
    Source("folder", "folder:PATH", "folder:_load_folder",
           "image files in class sub-folders (or flat), in memory or streamed", prefix="folder:"),
    Source("tfrecord", "tfrecord:TRAIN_GLOB[,TEST_GLOB]", "tfrecord:_load_tfrecord",
           "tf.train.Example records of encoded images, streamed", prefix="tfrecord:"),
)
#: The spec forms, for error messages and ``--help`` strings.
SPEC_FORMS = tuple(source.form for source in SOURCES)
#: Their prefixes (``fashion_mnist`` is a whole spec).
SPEC_PREFIXES = tuple(source.prefix for source in SOURCES if source.prefix)


def source_of(spec: str) -> Optional[Source]:
    """The :class:`Source` whose specs ``spec`` has the form of, else None (its data is not looked at)."""
    return next((source for source in SOURCES if source.matches(spec)), None)


def is_spec(spec: str) -> bool:
    """Whether ``spec`` has one of the :data:`SPEC_FORMS` (its data is not looked at)."""
    return source_of(spec) is not None


def spec_forms(separator: str = " | ", last: Optional[str] = None) -> str:
    """The spec forms as one string, e.g. ``fashion_mnist | tfds:NAME[:SPLIT] | ...``; with ``last``
    (e.g. ``" or "``), that word joins the last two."""
    if last is None or len(SPEC_FORMS) < 2:
        return separator.join(SPEC_FORMS)
    return separator.join(SPEC_FORMS[:-1]) + last + SPEC_FORMS[-1]


class DataError(ValueError):
    """Bad or missing data; the message is one line naming the culprit (a path or a dataset)."""


@dataclasses.dataclass(frozen=True, eq=False)
class Split:
    """One split of a dataset: either in memory (``images``/``labels``) or streamed (``stream``).

    Attributes:
      name: ``"train"`` or ``"test"``.
      num_examples: number of examples (after ``max_examples`` and the bad files found at load).
      images: uint8 ``[N, H, W, C]`` (read-only) for in-memory splits, else None.
      labels: int64 ``[N]`` (``-1`` when unlabelled, read-only) for in-memory splits, else None.
      stream: a :class:`~uniclr_tf.data.stream.Stream` (records read and decoded inside tf.data)
        for streamed splits, else None.
      fingerprints: uint64 ``[N]``, a hash of each image file's (or record's image) bytes, for the
        report of test images that are copies of training images; None when not computed.
    """

    name: str
    num_examples: int
    images: Optional[np.ndarray] = dataclasses.field(default=None, repr=False)
    labels: Optional[np.ndarray] = dataclasses.field(default=None, repr=False)
    stream: Optional["Stream"] = dataclasses.field(default=None, repr=False)
    fingerprints: Optional[np.ndarray] = dataclasses.field(default=None, repr=False)

    @property
    def in_memory(self) -> bool:
        """True when the split is held as NumPy arrays."""
        return self.images is not None

    @property
    def dataset(self) -> Optional[tf.data.Dataset]:
        """A streamed split as an unbatched ``tf.data.Dataset`` of ``(image uint8 [H, W, C], label
        int64)`` in its fixed order (decoded as it is read); None for in-memory splits."""
        return None if self.stream is None else self.stream.dataset()


@dataclasses.dataclass(frozen=True, eq=False)
class DatasetInfo:
    """What ``load_dataset`` found: the shapes, classes and statistics, and the splits.

    Attributes:
      name: short name (``fashion_mnist``, the TFDS name, or the folder's base name).
      image_shape: ``(H, W, C)`` of every image after resizing, ``C`` in {1, 3}.
      num_classes: number of classes, or None when the data is unlabelled.
      num_train: examples in the train split.
      num_test: examples in the test split (may be 0).
      mean: per-channel mean in [0, 1] units (length ``C``).
      std: per-channel standard deviation in [0, 1] units (length ``C``).
      splits: ``{"train": Split, "test": Split}``.
      spec: the spec string that was loaded.
      class_names: class names in label order, or None.
      num_skipped: bad files skipped at load (``skip_bad_files=True``), else 0.
      eval_spec: the spec the test split came from (``load_dataset(eval_spec=...)``), else "".
      notes: lines worth showing the user (where the test split comes from, what is held out,
        whether a folder streams), also logged.
      bad_files: for streamed splits loaded with ``skip_bad_files``, the records of the images
        found bad while streaming (:class:`~uniclr_tf.data.stream.BadFiles`; see
        :meth:`skipped_while_streaming`).
      test_duplicates: test images whose bytes are those of a training image (``check_duplicates``;
        ``folder:`` and ``tfrecord:`` data), else None (not checked).
    """

    name: str
    image_shape: Tuple[int, int, int]
    num_classes: Optional[int]
    num_train: int
    num_test: int
    mean: Tuple[float, ...]
    std: Tuple[float, ...]
    splits: Mapping[str, Split] = dataclasses.field(repr=False)
    spec: str = ""
    class_names: Optional[Tuple[str, ...]] = None
    num_skipped: int = 0
    eval_spec: str = ""
    notes: Tuple[str, ...] = ()
    bad_files: Tuple["BadFiles", ...] = dataclasses.field(default=(), repr=False)
    test_duplicates: Optional[int] = None

    @property
    def in_memory(self) -> bool:
        """True when every split is held as NumPy arrays (nothing streams)."""
        return all(split.in_memory for split in self.splits.values())

    def skipped_while_streaming(self) -> Tuple[str, ...]:
        """The bad images the streams have dropped so far (``skip_bad_files``), sorted."""
        return tuple(sorted({name for record in self.bad_files for name in record.names()}))

    def split(self, name: str) -> Split:
        """Returns the split called ``name``; a DataError lists the splits there are."""
        if name not in self.splits:
            raise DataError(f"{self.spec or self.name}: no split {name!r}; splits: {sorted(self.splits)}")
        return self.splits[name]


def _normalize_image_size(image_size):
    """``None``, ``S`` or ``(H, W)`` -> ``None`` or ``(H, W)`` of positive ints."""
    if image_size is None:
        return None
    if isinstance(image_size, (int, np.integer)):
        size = (int(image_size), int(image_size))
    else:
        try:
            size = tuple(int(s) for s in image_size)
        except (TypeError, ValueError):
            size = ()
    if len(size) != 2 or min(size) < 1:
        raise ValueError(f"image_size must be a positive int or (height, width); received {image_size!r}")
    return size


_VERSION_RE = re.compile(r"^(\d+\.\d+\.\d+|\d+\.\d+\.\*|\d+\.\*\.\*)(?::(.*))?$")


def _parse_tfds_spec(spec):
    """``tfds:NAME[:VERSION][:SPLIT]`` -> ``(name, split or None)``; the version stays on the name."""
    rest = spec[len("tfds:"):]
    name, _, split = rest.partition(":")
    match = _VERSION_RE.match(split)
    if split and match:
        name, split = f"{name}:{match.group(1)}", match.group(2) or ""
    if not name:
        raise ValueError(f"dataset spec {spec!r} names no TFDS dataset; expected tfds:NAME[:SPLIT], "
                         "e.g. tfds:cifar10 or tfds:imagenette/160px:train")
    return name, split or None
