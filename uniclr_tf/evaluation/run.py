"""A run folder as the evaluations read it: its encoder (:func:`load_run`), the checked folder
(:func:`check_run_dir`, cheap: no Keras import) and the labelled data it is evaluated on
(:func:`load_run_data`: its own dataset as pretraining saw it, or another one, a transfer), shared
by linear evaluation, kNN and fine-tuning (:mod:`uniclr_tf.evaluation.linear`,
:mod:`uniclr_tf.evaluation.finetune`).
"""

import dataclasses
from typing import Optional

from uniclr_tf.training import runs
from uniclr_tf.training.runs import RunFolderError

#: The files an evaluation reads from a run folder.
RUN_FILES = (runs.ENCODER_FILE, runs.DATASET_FILE, runs.CONFIG_FILE)


class RunError(RunFolderError):
    """A run that cannot be evaluated (e.g. unlabelled data); the message is one line naming the
    culprit. Problems with the run folder's files raise its base, :class:`uniclr_tf.training.runs.RunFolderError`."""


# ---------------------------------------------------------------------------------------------
# The run folder


@dataclasses.dataclass(frozen=True, eq=False)
class Run:
    """What :func:`load_run` found in a run folder.

    Attributes:
      folder: the :class:`uniclr_tf.training.runs.RunFolder`.
      encoder: the backbone (``keras.Model``), loaded without compiling.
      projector: the projection head (``keras.Model``) when asked for, else None.
    """

    folder: runs.RunFolder
    encoder: object = dataclasses.field(repr=False)
    projector: object = dataclasses.field(default=None, repr=False)

    @property
    def run_dir(self):
        return self.folder.path

    @property
    def dataset(self) -> dict:
        """``dataset.json`` as a dict."""
        return self.folder.dataset

    @property
    def config(self) -> dict:
        """``config.json`` (the pretraining settings) as a dict."""
        return self.folder.config

    @property
    def image_shape(self):
        return self.folder.image_shape

    @property
    def num_classes(self):
        return self.folder.num_classes

    @property
    def mean(self):
        return self.folder.mean

    @property
    def std(self):
        return self.folder.std


def check_run_dir(run_dir: str, require=RUN_FILES, refuse_collapsed: str = "") -> runs.RunFolder:
    """The :class:`~uniclr_tf.training.runs.RunFolder` of ``run_dir``; raises :class:`RunFolderError` (one
    line) unless it holds ``require`` (default: the files an evaluation reads). With
    ``refuse_collapsed`` (the rest of the message: what the run's encoder would do, how to go on
    anyway), also when its ``metrics.json`` says the run collapsed. Cheap: no Keras import."""
    folder = runs.RunFolder(run_dir, require=require)
    if (refuse_collapsed and folder.has("metrics.json")
            and folder.read_json("metrics.json").get("status") == "collapsed"):
        raise folder.error("metrics.json", "says the run collapsed: " + refuse_collapsed)
    return folder


def load_run(run_dir: str, require_labels: bool = True, require=RUN_FILES, projector: bool = False) -> Run:
    """Loads ``encoder.keras``, ``dataset.json`` and ``config.json`` (when in ``require``) of a
    ``uniclr_tf.train`` run, and ``projector.keras`` with ``projector``.

    Raises:
      RunFolderError: missing folder or file (of ``require``), unreadable file, or an encoder that
        does not map images to ``[B, F]`` features (a projector that does not take them).
      RunError: an unlabelled dataset (with ``require_labels``).
    """
    folder = check_run_dir(run_dir, require)
    dataset = folder.dataset  # read (and checked) before the slow model load, as config.json
    if runs.CONFIG_FILE in require:
        folder.config
    if require_labels and not folder.num_classes:
        raise RunError(f"run folder {folder.path!r}: dataset {dataset.get('dataset')!r} is unlabelled "
                       f"(num_classes {dataset.get('num_classes')!r} in dataset.json); linear and kNN "
                       f"evaluation need labels")
    encoder = folder.load_encoder()
    return Run(folder=folder, encoder=encoder,
               projector=folder.load_projector(feature_dim=encoder.output_shape[-1]) if projector else None)


def load_run_data(run, max_examples: Optional[int] = None, dataset: str = "", data_dir: str = ""):
    """The labelled dataset a run is evaluated on: its own (as pretraining saw it: same spec, eval
    spec, hold-out, data_dir, image_size), or another one (transfer).

    Args:
      run: a :class:`Run` (:func:`load_run`) or its :class:`uniclr_tf.training.runs.RunFolder`
        (:func:`check_run_dir`: the data can be loaded and checked before the encoder).
      max_examples: cap EACH split at this many examples; None: for the run's own dataset its
        pretraining ``max_examples`` (0 there: all), for another dataset all.
      dataset: the ``--dataset`` spec. Empty, or the run's own spec: the pretraining dataset as
        pretraining saw it (same spec, data_dir, image_size). Another spec: loaded from ``data_dir``
        (empty: its source's default) at the encoder's input size (``dataset.json``'s image shape).
      data_dir: the data directory of ``dataset`` (ignored for the run's own dataset).

    Returns:
      A :class:`uniclr_tf.data.DatasetInfo` of the run's image shape, with labels and a test split.

    Raises:
      RunError: the run's own dataset reloads differently from ``dataset.json``, or is unusable.
      uniclr_tf.data.DataError: another dataset that cannot be loaded or used (unknown spec,
        missing data, other channel count, no labels, no test split); one line starting with
        ``--dataset=SPEC:``.
    """
    from uniclr_tf import data

    folder = run.folder if isinstance(run, Run) else run
    cfg, own = folder.config, folder.dataset_spec
    if dataset and dataset != own:
        return _load_transfer_data(folder, dataset, data_dir, max_examples)
    if not own:
        raise folder.error(runs.CONFIG_FILE, "names no dataset (nor does dataset.json)")
    cap = max_examples if max_examples else (cfg.get("max_examples") or None)
    info = data.load_dataset(own, image_size=cfg.get("image_size") or None, data_dir=cfg.get("data_dir") or None,
                             skip_bad_files=bool(cfg.get("skip_bad_files", False)), max_examples=cap,
                             eval_spec=cfg.get("eval_dataset") or None,
                             holdout_fraction=cfg.get("holdout_fraction") or 0.1,
                             max_in_memory_mb=cfg.get("max_in_memory_mb", 256))
    if tuple(info.image_shape) != folder.image_shape:
        raise RunError(f"run folder {folder.path!r}: {own} reloads as images {tuple(info.image_shape)} but "
                       f"dataset.json says {folder.image_shape}")
    if not info.num_classes:
        raise RunError(f"run folder {folder.path!r}: dataset {own!r} is unlabelled; linear and kNN evaluation "
                       f"need labels")
    if info.num_test == 0:
        raise RunError(f"run folder {folder.path!r}: dataset {own!r} has an empty test split")
    return info


def _load_transfer_data(folder, dataset, data_dir, max_examples):
    """:func:`load_run_data` of another dataset than the run's: every error is one ``DataError``
    line naming ``--dataset``."""
    from uniclr_tf import data

    where = f"--dataset={dataset}"
    height, width, channels = folder.image_shape
    try:
        info = data.load_dataset(dataset, image_size=(height, width), data_dir=data_dir or None,
                                 max_examples=max_examples or None)
    except ValueError as e:  # DataError, or a malformed spec
        raise data.DataError(f"{where}: {e}") from None
    if info.image_shape[-1] != channels:
        raise data.DataError(f"{where}: its images have {info.image_shape[-1]} channel(s) but the encoder of "
                             f"{folder.path!r} takes {channels} (dataset.json image_shape "
                             f"{list(folder.image_shape)}); evaluate on a dataset with {channels} channel(s)")
    if not info.num_classes:
        raise data.DataError(f"{where}: the dataset is unlabelled; evaluation needs labels (a folder: one "
                             f"sub-folder per class)")
    if info.num_test == 0:
        raise data.DataError(f"{where}: the test split is empty")
    return info


def split_source(info, split: str, batch_size: int):
    """What :func:`uniclr_tf.evaluation.extract_features` reads for a split: its ``(images,
    labels)`` arrays when in memory (no TensorFlow needed), else the streamed split batched
    through ``uniclr_tf.data.eval_dataset`` (uint8, file order)."""
    from uniclr_tf import data

    part = info.split(split)
    if part.in_memory:
        return part.images, part.labels
    return data.eval_dataset(info, split, batch_size)


def check_labels(labels, num_classes, split):
    """Raises :class:`RunError` unless every label of ``split`` lies in ``[0, num_classes)``."""
    if labels.min() < 0 or labels.max() >= num_classes:
        raise RunError(f"split {split!r} has labels outside [0, {num_classes}) (range [{labels.min()}, "
                       f"{labels.max()}]; -1 means unlabelled)")
