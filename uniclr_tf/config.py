"""The one frozen configuration object a run is built from.

Only the entry points define flags (``uniclr_tf.train``); they turn them into a ``TrainConfig``
and library code takes plain arguments from it. ``TrainConfig`` validates itself on construction,
so a bad value stops the run before any data is loaded, with a message naming the flag.

The method (``--method``, alias ``--objective``) comes from :mod:`uniclr_tf.methods`; its options
(``--temperature``, ``--ema_momentum``, ``--queue_size``, ...) are flags generated from the
registry and are kept here in ``method_options`` (only those given; the rest take the method's
defaults, and :meth:`TrainConfig.resolved` fills them in). An option the method does not take is
an error naming the flag. View fields left at None take the method's augmentation recipe.
"""

import dataclasses
import json

from uniclr_tf.errors import UsageError

ENCODERS = ("resnet18", "resnet50", "small", "tiny", "vit_tiny", "vit_small")  # encoders.ENCODERS (no import here)
OPTIMIZERS = ("lars", "sgd", "adamw")
PRECISIONS = ("float32", "bfloat16", "float16")
STRATEGIES = ("default", "mirrored", "multi_worker", "tpu", "data_parallel")
AUGMENT_ON = ("host", "device")
BATCH_NORMS = ("global", "per_device")
ON_COLLAPSE = ("stop", "warn")

# Fields of earlier versions that are method options now (config.json of older runs).
_LEGACY_OPTION_FIELDS = ("temperature", "gamma", "eps", "whitening_mode", "stop_gradient_cov",
                         "whitening_groups", "symmetric_directions", "ema_momentum", "predictor")


#: ``--help`` groups of the train flags: (title, the group's first field in TrainConfig).
HELP_GROUPS = (("data", "dataset"), ("network", "encoder"), ("method", "method"),
               ("views (augmentation; unset: the method's recipe)", "num_local_crops"),
               ("optimisation", "optimizer"), ("evaluation", "knn_k"),
               ("system (devices, precision, distribution, run folder)", "augment_on"),
               ("this invocation (not part of the run: may change on resume)", "coordinator_address"))


def unset(kind, many=False):
    """A field whose default None means "the method's (or recipe's) value"; ``kind`` is the type of
    its flag (of each element when ``many``)."""
    return dataclasses.field(default=None, metadata={"kind": kind, "many": many})


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Every setting of a pretraining run. Field names equal the ``train`` flag names."""

    # data
    dataset: str = "fashion_mnist"
    data_dir: str = ""
    image_size: int = 0  # 0: the dataset's own size
    skip_bad_files: bool = False
    max_examples: int = 0  # 0: all
    eval_dataset: str = ""  # the test split from another spec ("": the dataset's own)
    holdout_fraction: float = 0.1  # held out for test when there is no test split nor --eval_dataset
    max_in_memory_mb: int = 256  # folder: decoded into memory up to this size, streamed above (0: always)
    max_image_pixels: int = 0  # folder: a file of more pixels is a bad file (0: data.decode.MAX_PIXELS)
    # network
    encoder: str = "resnet18"
    encoder_width: int = 0  # 0: the architecture's default
    encoder_stem: str = "auto"  # resnet18: auto (CIFAR stem below 64 px, ImageNet stem above) | cifar | imagenet
    projector_dims: tuple = (2048, 2048, 256)
    predictor_hidden: int = 512
    # method (uniclr_tf.methods) and the options given for it: ((name, value), ...)
    method: str = "simtrace"
    method_options: tuple = ()
    # views (None: the method's recipe, uniclr_tf.augment.RECIPES)
    num_local_crops: int = 0
    local_size: int = 0  # 0: half the global size (96 for 224 px)
    global_scale: tuple = unset(float, many=True)
    local_scale: tuple = unset(float, many=True)
    flip_prob: float = unset(float)
    color_jitter: tuple = unset(float, many=True)
    color_jitter_prob: float = unset(float)
    grayscale_prob: float = unset(float)
    blur_prob: tuple = unset(float, many=True)
    solarize_prob: tuple = unset(float, many=True)
    # optimisation
    optimizer: str = "lars"
    base_learning_rate: float = 0.03  # lr = batch_size / 256 * base_learning_rate
    weight_decay: float = 1e-6
    momentum: float = 0.9
    warmup_epochs: float = 10.0
    epochs: int = 100
    stop_at_epoch: int = 0  # 0: train the whole schedule; N: the first N epochs of the --epochs schedule
    batch_size: int = 512
    steps_per_epoch: int = 0  # 0: one pass over the training split
    # evaluation
    knn_k: int = 200
    knn_temperature: float = 0.1
    knn_every: int = 1  # epochs between kNN monitor evaluations; 0: only at the end
    knn_max_train: int = 0  # 0: the whole training split as the kNN memory bank
    online_probe: bool = True
    on_collapse: str = "stop"  # stop | warn (uniclr_tf.callbacks.CollapseDetector)
    collapse_knn_margin: float = 0.10  # the kNN signal: this far below raw pixels (and below the run's best)
    collapse_std_fraction: float = 0.02  # the std signal: embedding std below this fraction of 1/sqrt(D)
    # system
    augment_on: str = "host"
    precision: str = "float32"
    strategy: str = "default"
    gather_across_replicas: bool = True
    batch_norm: str = "global"  # per_device: statistics of each device's share of the batch
    tpu: str = ""
    jit_compile: bool = False
    steps_per_execution: int = 1
    seed: int = 0
    run_dir: str = "runs"
    run_name: str = ""  # empty: <method>-<dataset>
    export: bool = False
    # this invocation only (not part of the run: a resumed run may change them)
    coordinator_address: str = ""  # JAX multi-controller: process 0's HOST:PORT
    num_processes: int = 0  # 0: $KERAS_DISTRIBUTION_NUM_PROCESSES or 1
    process_id: int = -1  # -1: $KERAS_DISTRIBUTION_PROCESS_ID
    overwrite: bool = False
    resume_from: str = ""  # a new run starts from this folder's backup/ (e.g. a collapsed run's RUN/healthy)
    stop_after_steps: int = 0  # 0: no limit
    backup_every_minutes: float = 10.0
    verbose: int = 0  # 0: a progress bar on a terminal, one line per epoch otherwise
    pictures: bool = True  # views.png, neighbours.png, embedding.png (+ TensorBoard) at the end
    compilation_cache_dir: str = "~/.cache/uniclr_tf/xla"  # JAX: compiled steps kept across runs ("": off)
    autotune_table: bool = True  # JAX on a GPU: seed the cache with the shipped autotuning results (autotune.py)
    tensorboard_every_steps: int = 10  # per-step TensorBoard scalars every N steps (0: per epoch only)
    profile_steps: tuple = dataclasses.field(default=(), metadata={"kind": int, "many": True})  # (first, last): trace these steps of this invocation into RUN/profile

    # Fields that control one invocation, not the run: not in flags.txt, not compared on resume.
    INVOCATION_FIELDS = ("run_dir", "export", "overwrite", "resume_from", "stop_after_steps", "backup_every_minutes", "verbose",
                         "coordinator_address", "num_processes", "process_id", "pictures", "compilation_cache_dir",
                         "autotune_table", "tensorboard_every_steps", "profile_steps")

    VIEW_FIELDS = ("global_scale", "local_scale", "flip_prob", "color_jitter", "color_jitter_prob",
                   "grayscale_prob", "blur_prob", "solarize_prob")

    def __post_init__(self):
        def check(ok, field, expected):
            if not ok:
                raise UsageError(f"--{field}: expected {expected}; received {getattr(self, field)!r}")

        from uniclr_tf import methods
        if isinstance(self.method_options, dict):  # accept a dict; store a hashable, ordered tuple
            object.__setattr__(self, "method_options", tuple(sorted(self.method_options.items())))
        from uniclr_tf.data.spec import SPEC_FORMS, is_spec
        check(is_spec(self.dataset), "dataset", " | ".join(SPEC_FORMS))
        check(not self.eval_dataset or is_spec(self.eval_dataset), "eval_dataset",
              "empty (the dataset's own test split) or " + " | ".join(SPEC_FORMS))
        check(0 < self.holdout_fraction <= 0.5, "holdout_fraction", "a fraction in (0, 0.5]")
        check(self.max_in_memory_mb >= 0, "max_in_memory_mb", "a number of MB >= 0 (0: always stream)")
        check(self.max_image_pixels >= 0, "max_image_pixels", "a number of pixels >= 0 (0: the default)")
        check(self.method in methods.REGISTRY, "method", f"one of {methods.names()}")
        check(self.encoder in ENCODERS, "encoder", f"one of {ENCODERS}")
        check(self.optimizer in OPTIMIZERS, "optimizer", f"one of {OPTIMIZERS}")
        check(self.precision in PRECISIONS, "precision", f"one of {PRECISIONS}")
        check(self.strategy in STRATEGIES, "strategy", f"one of {STRATEGIES}")
        check(self.augment_on in AUGMENT_ON, "augment_on", f"one of {AUGMENT_ON}")
        check(self.batch_norm in BATCH_NORMS, "batch_norm", f"one of {BATCH_NORMS}")
        check(self.image_size == 0 or self.image_size >= 16, "image_size",
              "0 (the dataset's size) or an integer >= 16 (the encoders downsample 8 times)")
        check(self.encoder_width >= 0, "encoder_width", "an integer >= 0")
        check(self.encoder_stem in ("auto", "cifar", "imagenet"), "encoder_stem", "one of auto, cifar, imagenet")
        check(len(self.projector_dims) >= 1 and all(int(d) > 0 for d in self.projector_dims),
              "projector_dims", "a non-empty list of positive integers")
        check(self.predictor_hidden > 0, "predictor_hidden", "a positive integer")
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
        check(self.base_learning_rate > 0, "base_learning_rate", "a number > 0")
        check(self.weight_decay >= 0, "weight_decay", "a number >= 0")
        check(0 <= self.momentum < 1, "momentum", "a number in [0, 1)")
        check(self.warmup_epochs >= 0, "warmup_epochs", "a number >= 0")
        check(self.epochs >= 1, "epochs", "an integer >= 1")
        check(self.warmup_epochs <= self.epochs, "warmup_epochs", f"at most --epochs={self.epochs}")
        check(0 <= self.stop_at_epoch <= self.epochs, "stop_at_epoch", f"an integer in [0, --epochs={self.epochs}]")
        check(self.on_collapse in ON_COLLAPSE, "on_collapse", f"one of {ON_COLLAPSE}")
        check(0 < self.collapse_knn_margin < 1, "collapse_knn_margin", "a number in (0, 1)")
        check(0 < self.collapse_std_fraction < 1, "collapse_std_fraction", "a number in (0, 1)")
        check(self.batch_size >= 2, "batch_size", "an integer >= 2 (contrastive losses need negatives)")
        check(self.steps_per_epoch >= 0, "steps_per_epoch", "an integer >= 0")
        check(self.knn_k >= 1, "knn_k", "an integer >= 1")
        check(self.knn_temperature > 0, "knn_temperature", "a number > 0")
        check(self.knn_every >= 0, "knn_every", "an integer >= 0")
        check(self.knn_max_train >= 0, "knn_max_train", "an integer >= 0")
        check(self.steps_per_execution >= 1, "steps_per_execution", "an integer >= 1")
        check(self.profile_steps == () or (len(self.profile_steps) == 2 and 1 <= int(self.profile_steps[0])
                                           <= int(self.profile_steps[1])), "profile_steps",
              "empty, or two step numbers FIRST,LAST with 1 <= FIRST <= LAST")
        check(self.tensorboard_every_steps >= 0, "tensorboard_every_steps", "an integer >= 0")
        check(self.strategy != "tpu" or bool(self.tpu), "tpu", "a TPU name or address with --strategy=tpu")
        check(self.max_examples >= 0, "max_examples", "an integer >= 0")
        check(self.stop_after_steps >= 0, "stop_after_steps", "an integer >= 0 (0: no limit)")
        check(self.num_processes >= 0, "num_processes", "an integer >= 0 (0: from the environment, else 1)")
        check(self.num_processes <= 1 or self.strategy == "data_parallel", "num_processes",
              "1 unless --strategy=data_parallel (JAX multi-controller)")
        check(self.num_processes <= 1 or self.batch_size % self.num_processes == 0, "num_processes",
              f"a divisor of --batch_size={self.batch_size} (each process feeds its share of every batch)")
        check(self.backup_every_minutes > 0, "backup_every_minutes", "a number of minutes > 0")
        check(self.verbose in (0, 1, 2), "verbose", "0 (auto), 1 (progress bar) or 2 (one line per epoch)")
        # The method validates its options (naming the flag) and the batch / embedding sizes.
        self.build_method().check_setup(self.batch_size, int(self.projector_dims[-1]))

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

    def view_overrides(self):
        """The view fields that were given (the others take the method's recipe)."""
        return {f: getattr(self, f) for f in self.VIEW_FIELDS if getattr(self, f) is not None}

    @classmethod
    def make(cls, **kwargs):
        """Builds a config from fields and method options mixed (``objective`` and ``gamma`` are the
        older names of ``method`` and ``symmetric_loss_weight``), as code and tests like to write it."""
        fields = {f.name for f in dataclasses.fields(cls)}
        if "objective" in kwargs:
            kwargs["method"] = kwargs.pop("objective")
        options = dict(kwargs.pop("method_options", ()) or ())
        for key in [k for k in kwargs if k not in fields]:
            options["symmetric_loss_weight" if key == "gamma" else key] = kwargs.pop(key)
        return cls(method_options={k: v for k, v in options.items() if v is not None}, **kwargs)

    # --- serialisation ---------------------------------------------------------------------------
    def flag_items(self, invocation=False):
        """``(flag, value)`` for every field that has a value (the invocation fields only when asked),
        then every method option."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "method_options" or value is None:
                continue
            if invocation or f.name not in self.INVOCATION_FIELDS:
                yield f.name, value
        yield from self.method_options

    def differences(self, other):
        """``[(flag, value here, value there)]`` for the run's settings (invocation fields aside)."""
        mine, theirs = dict(self.flag_items()), dict(other.flag_items())
        return [(k, mine.get(k), theirs.get(k)) for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k)]

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

    def to_dict(self):
        raw = dataclasses.asdict(self)
        raw["method_options"] = dict(self.method_options)
        return raw

    def to_json(self):
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text):
        """Reads ``to_json``'s output, and the config.json of earlier versions (``objective`` and the
        UniCLR options as top-level fields)."""
        raw = json.loads(text)
        known = {f.name for f in dataclasses.fields(cls)}
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
        return cls(method=method, method_options=options, **values)
