"""The one frozen configuration object a run is built from, composed of one small config per concern.

Only the entry points define flags (``uniclr_tf.train``); they turn them into a ``TrainConfig``
and library code takes plain arguments from it. Each sub-config holds one group of settings and
validates its own fields on construction (a bad value stops the run before any data is loaded,
with a message naming the flag); ``TrainConfig`` checks what spans two of them. Every field is a
flag of the same name, declared with :func:`flag` next to its help text; ``--help`` lists the flags
by sub-config (its ``TITLE``)::

    cfg.data.dataset, cfg.network.encoder, cfg.views.num_local_crops, cfg.optim.batch_size,
    cfg.evaluation.knn_k, cfg.system.seed, cfg.invocation.overwrite, cfg.method

On disk a config is flat, one entry per flag (``config.json``: :meth:`TrainConfig.to_flat`,
:meth:`TrainConfig.from_flat`; ``flags.txt``: :meth:`TrainConfig.to_flagfile`), as it always was, so
run folders written before the sub-configs read unchanged. :class:`InvocationConfig` holds what
controls one invocation, not the run: it is not in ``flags.txt`` and not compared on resume.

The method (``--method``, alias ``--objective``) comes from :mod:`uniclr_tf.methods`; its options
(``--temperature``, ``--ema_momentum``, ``--queue_size``, ...) are flags generated from the
registry and are kept here in ``method_options`` (only those given; the rest take the method's
defaults, and :meth:`TrainConfig.resolved` fills them in). An option the method does not take is
an error naming the flag. View fields left at None take the method's augmentation recipe.
"""

import dataclasses
import json
from typing import ClassVar

from uniclr_tf.data.spec import spec_forms
from uniclr_tf.config.errors import UsageError
from uniclr_tf.config.fields import flag, unset  # noqa: F401 - re-exported: config.flag, config.unset

LARS_ETA = 0.001  # uniclr_tf.training.optimizers.LARS_ETA (a test keeps them equal); this module imports no Keras

# encoders.ENCODERS (no import here)
ENCODERS = ("resnet18", "resnet50", "small", "tiny", "vit_tiny", "vit_small", "hub_resnet18", "hub_resnet50")
OPTIMIZERS = ("lars", "sgd", "adamw")
PRECISIONS = ("float32", "bfloat16", "float16")
STRATEGIES = ("default", "mirrored", "multi_worker", "tpu", "data_parallel")
AUGMENT_ON = ("host", "device")
BATCH_NORMS = ("global", "per_device", "global_one_pass")
STATE_LAYOUTS = ("auto", "xla", "default")  # the state's memory layouts between JAX train steps
VIEW_BATCH_NORMS = ("joint", "per_view")  # how batch norm sees the views (UniCLR(view_batch_norm=))
ON_COLLAPSE = ("stop", "warn")

# Fields of earlier versions that are method options now (config.json of older runs).
_LEGACY_OPTION_FIELDS = ("temperature", "gamma", "eps", "whitening_mode", "stop_gradient_cov",
                         "whitening_groups", "symmetric_directions", "ema_momentum", "predictor")


class _Section:
    """What every sub-config shares: ``TITLE`` (its ``--help`` group) and the check naming a flag."""

    TITLE: ClassVar[str] = ""

    def _check(self, ok, field, expected):
        if not ok:
            raise UsageError(f"--{field}: expected {expected}; received {getattr(self, field)!r}")


@dataclasses.dataclass(frozen=True)
class DataConfig(_Section):
    """The dataset and how it is read."""

    TITLE: ClassVar[str] = "data"

    dataset: str = flag("fashion_mnist", f"{spec_forms()} (README, Datasets).")
    data_dir: str = flag("", "TFDS data_dir (tfds: datasets only).")
    image_size: int = flag(0, "Resize images to this square size; 0 keeps the dataset's size.")
    skip_bad_files: bool = flag(False, "folder: and tfrecord: datasets: skip (and count) unreadable images instead "
                                       "of stopping.")
    max_examples: int = flag(0, "Use only the first N images of each split (0: all); for smoke tests.")
    eval_dataset: str = flag("", "The test split of the kNN monitor and final kNN from another dataset spec (its own "
                                 "test split if it has one, else all of it), e.g. --dataset=folder:TRAIN_DIR "
                                 "--eval_dataset=folder:TEST_DIR; --dataset then trains on all its images. Empty: "
                                 "--dataset's own test split.")
    holdout_fraction: float = flag(0.1, "Fraction of the training data (per class for folders) held out as the test "
                                        "split when --dataset has none and no --eval_dataset is given; in (0, 0.5].")
    max_in_memory_mb: int = flag(256, "folder: datasets whose decoded images (N x H x W x 3 bytes) fit in this many "
                                      "MB are decoded into memory at load (faster epochs; needed without TensorFlow); "
                                      "larger ones stream from disk through tf.data. 0: always stream.")
    max_image_pixels: int = flag(0, "folder: datasets: an image file of more pixels (height x width, read from its "
                                    "header before decoding) is a bad file (a decompression bomb); 0: the default, "
                                    "89,478,485.")

    def __post_init__(self):
        from uniclr_tf.data.spec import SPEC_FORMS, is_spec
        check = self._check
        check(is_spec(self.dataset), "dataset", " | ".join(SPEC_FORMS))
        check(not self.eval_dataset or is_spec(self.eval_dataset), "eval_dataset",
              "empty (the dataset's own test split) or " + " | ".join(SPEC_FORMS))
        check(0 < self.holdout_fraction <= 0.5, "holdout_fraction", "a fraction in (0, 0.5]")
        check(self.max_in_memory_mb >= 0, "max_in_memory_mb", "a number of MB >= 0 (0: always stream)")
        check(self.max_image_pixels >= 0, "max_image_pixels", "a number of pixels >= 0 (0: the default)")
        check(self.image_size == 0 or self.image_size >= 16, "image_size",
              "0 (the dataset's size) or an integer >= 16 (the encoders downsample 8 times)")
        check(self.max_examples >= 0, "max_examples", "an integer >= 0")


@dataclasses.dataclass(frozen=True)
class NetworkConfig(_Section):
    """The encoder and the heads (the method decides which heads it uses)."""

    TITLE: ClassVar[str] = "network"

    encoder: str = flag("resnet18", "Backbone architecture.", choices=ENCODERS)
    encoder_width: int = flag(0, "Base width of resnet18/small/tiny (0: 64 for resnet18, 32 for small, 16 for tiny).")
    encoder_stem: str = flag("auto", "resnet18's stem: auto (the CIFAR 3x3 stem below 64 px, the ImageNet 7x7 + "
                                     "max-pool stem from 64 px), cifar or imagenet.")
    projector_dims: tuple = flag((2048, 2048, 256), "Projector layer sizes, e.g. 2048,2048,256 (CIFAR) or "
                                                    "2048,2048,2048 (ImageNet).")
    predictor_hidden: int = flag(512, "Hidden size of the predictor (methods with one: byol, simsiam, moco_v3, or "
                                      "--predictor).")
    view_batch_norm: str = flag("joint", "How batch norm sees the views: joint (same-size views as one batch, as "
                                         "SimCLR's, SwAV's and DINO's code) or per_view (each view its own batch "
                                         "statistics, as BYOL's, SimSiam's, Barlow Twins', VICReg's and MoCo v3's).",
                                choices=VIEW_BATCH_NORMS)

    def __post_init__(self):
        check = self._check
        check(self.encoder in ENCODERS, "encoder", f"one of {ENCODERS}")
        check(self.encoder_width >= 0, "encoder_width", "an integer >= 0")
        check(self.encoder_stem in ("auto", "cifar", "imagenet"), "encoder_stem", "one of auto, cifar, imagenet")
        check(len(self.projector_dims) >= 1 and all(int(d) > 0 for d in self.projector_dims),
              "projector_dims", "a non-empty list of positive integers")
        check(self.predictor_hidden > 0, "predictor_hidden", "a positive integer")
        check(self.view_batch_norm in VIEW_BATCH_NORMS, "view_batch_norm", f"one of {VIEW_BATCH_NORMS}")

    @property
    def embedding_dim(self):
        """The projector's output size (the embedding the objective sees)."""
        return int(self.projector_dims[-1])


@dataclasses.dataclass(frozen=True)
class ViewsConfig(_Section):
    """The views (augmentation): the recipe fields left at None take the method's recipe
    (:data:`uniclr_tf.augment.RECIPES`)."""

    TITLE: ClassVar[str] = "views (augmentation; unset: the method's recipe)"
    #: The fields of the method's view recipe that a flag may override.
    RECIPE_FIELDS: ClassVar[tuple] = ("global_scale", "local_scale", "flip_prob", "color_jitter",
                                      "color_jitter_prob", "grayscale_prob", "blur_prob", "solarize_prob")

    num_local_crops: int = flag(0, "Number of multi-crop local views (0: two global views only).")
    local_size: int = flag(0, "Local crop size; 0: half the global size.")
    global_scale: tuple = unset(float, "RandomResizedCrop area range of global views (unset: the method's recipe).",
                                many=True)
    local_scale: tuple = unset(float, "RandomResizedCrop area range of local views (unset: the method's recipe).",
                               many=True)
    flip_prob: float = unset(float, "Horizontal flip probability (unset: the method's recipe).")
    color_jitter: tuple = unset(float, "Colour jitter strengths brightness,contrast,saturation,hue (unset: the "
                                       "method's recipe).", many=True)
    color_jitter_prob: float = unset(float, "Colour jitter probability (unset: the method's recipe).")
    grayscale_prob: float = unset(float, "Grayscale probability (unset: the method's recipe).")
    blur_prob: tuple = unset(float, "Gaussian blur probability, one or one per global view, e.g. 1.0,0.1 (unset: the "
                                    "method's recipe; blur is off on images of side <= 32 unless given).", many=True)
    solarize_prob: tuple = unset(float, "Solarisation probability, one or one per global view, e.g. 0,0.2 (unset: the "
                                        "method's recipe).", many=True)

    def __post_init__(self):
        check = self._check
        check(self.num_local_crops >= 0, "num_local_crops", "an integer >= 0")
        check(self.local_size >= 0, "local_size", "an integer >= 0")
        for field in ("global_scale", "local_scale"):
            lo_hi = getattr(self, field)
            check(lo_hi is None or (len(lo_hi) == 2 and 0 < lo_hi[0] <= lo_hi[1] <= 1), field,
                  "two numbers 0 < low <= high <= 1")
        for field in ("flip_prob", "color_jitter_prob", "grayscale_prob"):
            value = getattr(self, field)
            check(value is None or 0 <= value <= 1, field, "a probability in [0, 1]")
        for field in ("blur_prob", "solarize_prob"):
            value = getattr(self, field)
            check(value is None or (len(value) in (1, 2) and all(0 <= v <= 1 for v in value)), field,
                  "one probability, or one per global view (two), each in [0, 1]")
        check(self.color_jitter is None or (len(self.color_jitter) == 4 and min(self.color_jitter) >= 0
                                            and self.color_jitter[3] <= 0.5),
              "color_jitter", "four strengths brightness,contrast,saturation,hue >= 0 (hue <= 0.5)")

    def overrides(self):
        """The recipe fields that were given (the others take the method's recipe)."""
        return {f: getattr(self, f) for f in self.RECIPE_FIELDS if getattr(self, f) is not None}


@dataclasses.dataclass(frozen=True)
class OptimConfig(_Section):
    """The optimizer, its schedule and the length of the run."""

    TITLE: ClassVar[str] = "optimisation"

    optimizer: str = flag("lars", "lars (paper), sgd or adamw.", choices=OPTIMIZERS)
    base_learning_rate: float = flag(0.03, "Base learning rate; the peak is batch_size/256 * base.")
    weight_decay: float = flag(1e-6, "Weight decay (LARS/SGD add it to the gradient; biases and BN excluded for "
                                     "LARS).")
    momentum: float = flag(0.9, "Optimizer momentum.")
    lars_eta: float = flag(LARS_ETA, "LARS's trust coefficient (the paper, SimCLR, BYOL: 0.001; solo-learn's CIFAR "
                                  "configs: 0.02 with --lars_clip_lr).")
    lars_clip_lr: bool = flag(False, "LARS with LARC's clipping: an adapted layer moves at min(eta*|w|/|g|, lr) "
                                     "instead of lr*eta*|w|/|g|, the schedule only capping the rate (NVIDIA apex, "
                                     "solo-learn).")
    warmup_epochs: float = flag(10.0, "Linear warm-up epochs before the cosine decay.")
    epochs: int = flag(100, "Training epochs (the length of the learning-rate schedule).")
    stop_at_epoch: int = flag(0, "Train only the first N epochs of the --epochs schedule, then finish the run as "
                                 "usual (final kNN, metrics.json); 0: the whole schedule. For checks of a recipe's "
                                 "early epochs.")
    batch_size: int = flag(512, "Global batch size (images per step, each giving num_views views).")
    steps_per_epoch: int = flag(0, "Steps per epoch; 0: one pass over the training split.")

    def __post_init__(self):
        check = self._check
        check(self.base_learning_rate > 0, "base_learning_rate", "a number > 0")
        check(self.weight_decay >= 0, "weight_decay", "a number >= 0")
        check(0 <= self.momentum < 1, "momentum", "a number in [0, 1)")
        check(self.lars_eta > 0, "lars_eta", "a number > 0")
        lars_only = "a LARS option: --optimizer=lars, or its default"
        check(self.optimizer == "lars" or self.lars_eta == LARS_ETA, "lars_eta", lars_only)
        check(self.optimizer == "lars" or not self.lars_clip_lr, "lars_clip_lr", lars_only)
        check(self.warmup_epochs >= 0, "warmup_epochs", "a number >= 0")
        check(self.epochs >= 1, "epochs", "an integer >= 1")
        check(self.warmup_epochs <= self.epochs, "warmup_epochs", f"at most --epochs={self.epochs}")
        check(0 <= self.stop_at_epoch <= self.epochs, "stop_at_epoch", f"an integer in [0, --epochs={self.epochs}]")
        check(self.batch_size >= 2, "batch_size", "an integer >= 2 (contrastive losses need negatives)")
        check(self.steps_per_epoch >= 0, "steps_per_epoch", "an integer >= 0")

    @property
    def last_epoch(self):
        """The last epoch a run trains to (the schedule stays that of ``epochs``)."""
        return self.stop_at_epoch or self.epochs


@dataclasses.dataclass(frozen=True)
class EvalConfig(_Section):
    """The kNN monitor, the online probe and the collapse detector."""

    TITLE: ClassVar[str] = "evaluation"

    knn_k: int = flag(200, "k of the weighted kNN evaluation.")
    knn_temperature: float = flag(0.1, "Temperature of the weighted kNN evaluation.")
    knn_every: int = flag(1, "Run the kNN monitor every N epochs (0: only the final evaluation).")
    knn_max_train: int = flag(0, "Size of the kNN memory bank drawn from the training split (0: all).")
    online_probe: bool = flag(True, "Train a linear probe on stop-gradient features when labels exist.")
    on_collapse: str = flag("stop", "What a detected collapse does (the embedding std, or the kNN monitor against "
                                    "the raw-pixel baseline, see docs): stop (exit 3, metrics.json status "
                                    "'collapsed', the last healthy backup kept) or warn and go on.")
    collapse_knn_margin: float = flag(0.10, "The collapse detector's kNN signal: a kNN-monitor reading this far "
                                            "below the raw-pixel baseline, after the warm-up (and 5 epochs) or, "
                                            "earlier, once also this far below the run's best reading.")
    collapse_std_fraction: float = flag(0.02, "The collapse detector's std signal: the embedding std (of the "
                                              "l2-normalised projector outputs) below this fraction of the 1/sqrt(D) "
                                              "of spread-out embeddings.")

    def __post_init__(self):
        check = self._check
        check(self.on_collapse in ON_COLLAPSE, "on_collapse", f"one of {ON_COLLAPSE}")
        check(0 < self.collapse_knn_margin < 1, "collapse_knn_margin", "a number in (0, 1)")
        check(0 < self.collapse_std_fraction < 1, "collapse_std_fraction", "a number in (0, 1)")
        check(self.knn_k >= 1, "knn_k", "an integer >= 1")
        check(self.knn_temperature > 0, "knn_temperature", "a number > 0")
        check(self.knn_every >= 0, "knn_every", "an integer >= 0")
        check(self.knn_max_train >= 0, "knn_max_train", "an integer >= 0")


@dataclasses.dataclass(frozen=True)
class SystemConfig(_Section):
    """Devices, precision, distribution, the seed and the run folder's name."""

    TITLE: ClassVar[str] = "system (devices, precision, distribution, run folder)"

    augment_on: str = flag("host", "host: augment in tf.data on the CPU; device: inside the compiled train step.",
                           choices=AUGMENT_ON)
    precision: str = flag("float32", "Compute precision (linear algebra of the objectives always runs in float32).",
                          choices=PRECISIONS)
    strategy: str = flag("default", "default | mirrored (tf.distribute, TF) | multi_worker "
                                    "(MultiWorkerMirroredStrategy from $TF_CONFIG, TF) | tpu (TPUStrategy, TF) | "
                                    "data_parallel (JAX; several processes with --num_processes).",
                         choices=STRATEGIES)
    gather_across_replicas: bool = flag(True, "Gather embeddings across replicas (global negatives/covariance); "
                                              "--nogather_across_replicas keeps them per replica (authors' code).")
    batch_norm: str = flag("global_one_pass", "Batch-norm statistics over the batch: global_one_pass (the default: "
                                     "the whole batch, E[x] and E[x^2] from one pass and a hand-written backward; on "
                                     "JAX one combined all-reduce per BN layer forward and one backward, and fewer "
                                     "passes over the activations: the fastest on GPUs, and as accurate as global "
                                     "over seeds; on TF it is computed as global), global (the whole batch: "
                                     "synchronized BN on TF; on JAX the mean, then the variance) or per_device (each "
                                     "device's share, as PyTorch DDP without SyncBN; no BN traffic between devices). "
                                     "One device: the same statistics.",
                                     choices=BATCH_NORMS)
    tpu: str = flag("", "TPU name or grpc:// address for --strategy=tpu.")
    jit_compile: bool = flag(False, "Compile the train step with XLA on TF (JAX always jits).")
    steps_per_execution: int = flag(1, "Train steps per call of the train function (must divide the steps of an "
                                       "epoch; TF: one in-graph loop; JAX: Keras loops over the compiled step in "
                                       "Python). Callbacks, the progress bar and signal checks then see every K-th "
                                       "step.")
    state_layout: str = flag("auto", "JAX: the memory layouts of the weights and the optimizer's state between "
                                     "train steps: xla (XLA's choice: on a GPU each convolution kernel as cuDNN "
                                     "reads it, not transposed in every step), default (Keras' row-major) or auto "
                                     "(xla on one GPU, else default). The same maths either way.",
                             choices=STATE_LAYOUTS)
    seed: int = flag(0, "Random seed.")
    run_name: str = flag("", "Run folder name inside --run_dir (empty: <method>-<dataset>, so rerunning the same "
                             "command resumes it); a plain name: no '/', '..', absolute path or symbolic link.")

    def __post_init__(self):
        check = self._check
        check(self.precision in PRECISIONS, "precision", f"one of {PRECISIONS}")
        check(self.strategy in STRATEGIES, "strategy", f"one of {STRATEGIES}")
        check(self.augment_on in AUGMENT_ON, "augment_on", f"one of {AUGMENT_ON}")
        check(self.batch_norm in BATCH_NORMS, "batch_norm", f"one of {BATCH_NORMS}")
        check(self.steps_per_execution >= 1, "steps_per_execution", "an integer >= 1")
        check(self.state_layout in STATE_LAYOUTS, "state_layout", f"one of {STATE_LAYOUTS}")
        check(self.strategy != "tpu" or bool(self.tpu), "tpu", "a TPU name or address with --strategy=tpu")


@dataclasses.dataclass(frozen=True)
class InvocationConfig(_Section):
    """What controls this invocation, not the run: not in ``flags.txt``, not compared on resume (a
    resumed run may change them)."""

    TITLE: ClassVar[str] = "this invocation (not part of the run: may change on resume)"

    run_dir: str = flag("runs", "Parent folder of run folders.")
    export: bool = flag(False, "Export a SavedModel of the encoder into <run>/export at the end (TF backend).")
    coordinator_address: str = flag("", "JAX multi-controller job: process 0's HOST:PORT (else "
                                        "$KERAS_DISTRIBUTION_JOB_ADDRESSES).")
    num_processes: int = flag(0, "JAX multi-controller job: number of processes (0: "
                                 "$KERAS_DISTRIBUTION_NUM_PROCESSES or 1).")
    process_id: int = flag(-1, "JAX multi-controller job: this process's index (-1: "
                               "$KERAS_DISTRIBUTION_PROCESS_ID).")
    overwrite: bool = flag(False, "Start the run again in a run folder that holds one (its files are removed first); "
                                  "a folder that holds no run of this tool is never removed.")
    resume_from: str = flag("", "A new run starts from the backup in this folder (its backup/ subfolder: weights, "
                                "optimizer state, step), e.g. RUN/healthy, the last healthy state a collapsed run "
                                "kept; the flags may differ from that run's (the network must be the same). Ignored "
                                "when the run folder already holds a run.")
    stop_after_steps: int = flag(0, "Stop after this many steps of this invocation with a backup, as a preempted job "
                                    "would (exit code 75); rerunning the same command continues. 0: no limit.")
    backup_every_minutes: float = flag(10.0, "Back up (in the background) at least this often, besides every epoch "
                                             "end.")
    verbose: int = flag(0, "0: a progress bar on a terminal, one line per epoch otherwise; 1: progress bar; 2: one "
                           "line per epoch.")
    check_duplicates: bool = flag(True, "folder: and tfrecord: data: hash every image's bytes at load and report the "
                                        "test images that are exact copies of training images (they inflate kNN and "
                                        "linear numbers); --nocheck_duplicates skips this read of every file.")
    pictures: bool = flag(True, "At the end, write views.png (augmented views), neighbours.png (nearest training "
                                "images of test images in feature space) and embedding.png (t-SNE map), and the same "
                                "to TensorBoard.")
    compilation_cache_dir: str = flag("~/.cache/uniclr_tf/xla", "JAX: keep compiled train and evaluation steps in "
                                      "this folder, so a resumed or repeated run skips the XLA compile (tens of "
                                      "seconds on a GPU); empty: off.")
    autotune_table: bool = flag(True, "JAX on a GPU: before the first compile, put the XLA autotuning results shipped "
                                      "for this card and jaxlib (uniclr_tf/training/autotune_tables) in the compilation cache, "
                                      "so a first run does not time every convolution again (most of the first "
                                      "compile of a ResNet step).")
    tensorboard_every_steps: int = flag(10, "Write per-step TensorBoard scalars (step_<name>: the epoch's running "
                                            "means) every N optimizer steps; 0: per-epoch scalars only.")
    profile_steps: tuple = flag((), "FIRST,LAST: trace the device and host work of optimizer steps FIRST..LAST of "
                                    "this invocation (counted from 1) with the backend's profiler into <run>/profile "
                                    "(JAX: a Perfetto trace and TensorBoard's profile; TF: TensorBoard's profile). "
                                    "Empty: off.", kind=int, many=True)

    def __post_init__(self):
        check = self._check
        check(self.profile_steps == () or (len(self.profile_steps) == 2 and 1 <= int(self.profile_steps[0])
                                           <= int(self.profile_steps[1])), "profile_steps",
              "empty, or two step numbers FIRST,LAST with 1 <= FIRST <= LAST")
        check(self.tensorboard_every_steps >= 0, "tensorboard_every_steps", "an integer >= 0")
        check(self.stop_after_steps >= 0, "stop_after_steps", "an integer >= 0 (0: no limit)")
        check(self.num_processes >= 0, "num_processes", "an integer >= 0 (0: from the environment, else 1)")
        check(self.backup_every_minutes > 0, "backup_every_minutes", "a number of minutes > 0")
        check(self.verbose in (0, 1, 2), "verbose", "0 (auto), 1 (progress bar) or 2 (one line per epoch)")


def section(cls):
    """A field of :class:`TrainConfig` holding a sub-config (default: the sub-config's defaults)."""
    return dataclasses.field(default_factory=cls)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Every setting of a pretraining run, by sub-config; ``method`` and ``method_options`` are its own.

    Build one from flat flag names with :meth:`from_flat` (or :meth:`make`, which also takes method
    options); change flat names with :meth:`replace`."""

    data: DataConfig = section(DataConfig)
    network: NetworkConfig = section(NetworkConfig)
    method: str = flag("simtrace", "Self-supervised method (uniclr_tf.methods); its options are the flags below. "
                                   "Alias: --objective.")
    # the options given for the method, ((name, value), ...): flags of their own (methods.option_specs)
    method_options: tuple = dataclasses.field(default=(), metadata={"help": "", "flag": False})
    views: ViewsConfig = section(ViewsConfig)
    optim: OptimConfig = section(OptimConfig)
    evaluation: EvalConfig = section(EvalConfig)
    system: SystemConfig = section(SystemConfig)
    invocation: InvocationConfig = section(InvocationConfig)

    def __post_init__(self):
        from uniclr_tf import methods
        if isinstance(self.method_options, dict):  # accept a dict; store a hashable, ordered tuple
            object.__setattr__(self, "method_options", tuple(sorted(self.method_options.items())))
        for name, cls in self.sections().items():
            if not isinstance(getattr(self, name), cls):
                raise TypeError(f"TrainConfig.{name}: expected a {cls.__name__}; received {getattr(self, name)!r}")
        if self.method not in methods.REGISTRY:
            raise UsageError(f"--method: expected one of {methods.names()}; received {self.method!r}")
        batch_size, num_processes = self.optim.batch_size, self.invocation.num_processes
        check = self.invocation._check  # the checks that span two sub-configs name an invocation flag
        check(num_processes <= 1 or self.system.strategy == "data_parallel", "num_processes",
              "1 unless --strategy=data_parallel (JAX multi-controller)")
        check(num_processes <= 1 or batch_size % num_processes == 0, "num_processes",
              f"a divisor of --batch_size={batch_size} (each process feeds its share of every batch)")
        # The method validates its options (naming the flag) and the batch / embedding sizes.
        self.build_method().check_setup(batch_size, self.network.embedding_dim)

    # --- the sub-configs and the flat (flag) names --------------------------------------------------
    @classmethod
    def sections(cls):
        """``{attribute: sub-config class}`` in declaration order (the order of ``--help``)."""
        return {f.name: f.type for f in dataclasses.fields(cls) if isinstance(f.type, type)
                and issubclass(f.type, _Section)}

    @classmethod
    def flat_names(cls):
        """``{flag name: its sub-config's attribute}`` (None: a field of ``TrainConfig`` itself), in the
        order of ``config.json``."""
        names = {}
        for f in dataclasses.fields(cls):
            if f.name in cls.sections():
                names.update((g.name, f.name) for g in dataclasses.fields(f.type))
            else:
                names[f.name] = None
        return names

    @classmethod
    def field_help(cls, name):
        """The ``--help`` text of the flag of a flat field (declared next to the field)."""
        where = cls.flat_names()[name]
        return next(f for f in dataclasses.fields(cls.sections()[where] if where else cls)
                    if f.name == name).metadata["help"]

    @classmethod
    def from_flat(cls, values):
        """A config from flat flag names (``config.json``'s form; any subset, the rest default). A
        name that is no field is a ``TypeError``, as a dataclass's constructor raises."""
        where = cls.flat_names()
        unknown = sorted(set(values) - set(where))
        if unknown:
            raise TypeError(f"TrainConfig.from_flat: unknown field(s) {', '.join(unknown)}")
        parts = {name: {} for name in cls.sections()}
        top = {}
        for key, value in values.items():
            (parts[where[key]] if where[key] else top)[key] = value
        return cls(**top, **{name: cls.sections()[name](**fields) for name, fields in parts.items()})

    def to_flat(self):
        """``{flag name: value}`` for every field (``method_options`` as a dict): ``config.json``'s form."""
        flat = {}
        for name, where in self.flat_names().items():
            flat[name] = getattr(getattr(self, where), name) if where else getattr(self, name)
        flat["method_options"] = dict(self.method_options)
        return flat

    def replace(self, **values):
        """The same config with the fields named by their flat (flag) names changed."""
        where = self.flat_names()
        changes, parts = {}, {}
        for key, value in values.items():
            if key not in where:
                raise TypeError(f"TrainConfig.replace: unknown field {key!r}")
            if where[key] is None:
                changes[key] = value
            else:
                parts.setdefault(where[key], {})[key] = value
        for name, fields in parts.items():
            changes[name] = dataclasses.replace(getattr(self, name), **fields)
        return dataclasses.replace(self, **changes)

    # --- the method ----------------------------------------------------------------------------
    @property
    def options(self):
        """The method options given explicitly (the others take the method's defaults)."""
        return dict(self.method_options)

    def build_method(self):
        """The :class:`uniclr_tf.methods.Method` this config describes, its options resolved."""
        from uniclr_tf import methods
        return methods.create(self.method, **self.options)

    def option(self, name):
        """The resolved value of a method option (None when the method does not take it)."""
        return self.build_method().options.get(name)

    def resolved(self):
        """The same config with every option of the method written out (its defaults filled in)."""
        return dataclasses.replace(self, method_options=tuple(sorted(self.build_method().options.items())))

    @classmethod
    def make(cls, **kwargs):
        """Builds a config from flat fields and method options mixed (``objective`` and ``gamma`` are
        the older names of ``method`` and ``symmetric_loss_weight``), as code and tests like to write it."""
        fields = cls.flat_names()
        if "objective" in kwargs:
            kwargs["method"] = kwargs.pop("objective")
        options = dict(kwargs.pop("method_options", ()) or ())
        for key in [k for k in kwargs if k not in fields]:
            options["symmetric_loss_weight" if key == "gamma" else key] = kwargs.pop(key)
        return cls.from_flat({**kwargs, "method_options": {k: v for k, v in options.items() if v is not None}})

    # --- serialisation ---------------------------------------------------------------------------
    def flag_items(self, invocation=False):
        """``(flag, value)`` for every field that has a value (the invocation fields only when asked),
        then every method option."""
        where = self.flat_names()
        for name, value in self.to_flat().items():
            if name == "method_options" or value is None:
                continue
            if invocation or where[name] != "invocation":
                yield name, value
        yield from self.method_options

    def differences(self, other):
        """``[(flag, value here, value there)]`` for the run's settings (invocation fields aside)."""
        mine, theirs = dict(self.flag_items()), dict(other.flag_items())
        return [(k, mine.get(k), theirs.get(k)) for k in sorted(set(mine) | set(theirs))
                if mine.get(k) != theirs.get(k)]

    def to_flagfile(self):
        """The run's flags, one ``--name=value`` a line: replaying them repeats (or resumes) the run
        (write ``resolved()``'s to pin the method's defaults). Invocation fields are left out."""
        lines = []
        for name, value in self.flag_items():
            if isinstance(value, bool):
                lines.append(f"--{name}" if value else f"--no{name}")
            elif isinstance(value, (tuple, list)):
                lines.append(f"--{name}={','.join(str(v) for v in value)}")
            else:
                lines.append(f"--{name}={value}")
        return "\n".join(lines) + "\n"

    def to_json(self):
        """``config.json``: the flat form (:meth:`to_flat`)."""
        return json.dumps(self.to_flat(), indent=2)

    @classmethod
    def from_json(cls, text):
        """Reads ``to_json``'s output, and the config.json of earlier versions (``objective`` and the
        UniCLR options as top-level fields); entries that are no field (e.g. ``views``) are ignored."""
        raw = json.loads(text)
        known = cls.flat_names()
        options = dict(raw.get("method_options") or {})
        method = raw.get("method") or raw.get("objective") or "simtrace"
        if "objective" in raw and "method" not in raw:  # an earlier version's run
            from uniclr_tf import methods
            takes = methods.get(method).defaults
            for key in _LEGACY_OPTION_FIELDS:
                name = "symmetric_loss_weight" if key == "gamma" else key
                value = raw.get(key)
                if name in takes and value not in (None, 0, 0.0) or (name == "predictor" and value and name in takes):
                    options[name] = value
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()
                  if k in known and k not in ("method", "method_options")}
        return cls.from_flat({**values, "method": method, "method_options": options})
