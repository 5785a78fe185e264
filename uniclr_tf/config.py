"""The one frozen configuration object a run is built from.

Only the entry points define flags (``uniclr_tf.train``); they turn them into a ``TrainConfig``
and library code takes plain arguments from it. ``TrainConfig`` validates itself on construction,
so a bad value stops the run before any data is loaded, with a message naming the field.
"""

import dataclasses
import json

OBJECTIVES = ("simaffinity", "simwhitening", "simtrace")
ENCODERS = ("resnet18", "resnet50", "tiny")
OPTIMIZERS = ("lars", "sgd", "adamw")
PRECISIONS = ("float32", "bfloat16", "float16")
STRATEGIES = ("default", "mirrored", "tpu", "data_parallel")
AUGMENT_ON = ("host", "device")
WHITENING_MODES = ("cholesky", "one_sided")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Every setting of a pretraining run. Field names equal the ``train`` flag names."""

    # data
    dataset: str = "fashion_mnist"
    data_dir: str = ""
    image_size: int = 0  # 0: the dataset's own size
    skip_bad_files: bool = False
    max_examples: int = 0  # 0: all
    # network
    encoder: str = "resnet18"
    encoder_width: int = 0  # 0: the architecture's default
    projector_dims: tuple = (2048, 2048, 256)
    predictor: bool = False
    predictor_hidden: int = 512
    # objective (PAPER.md)
    objective: str = "simtrace"
    temperature: float = 0.0  # 0: the objective's default (0.5 SimAffinity, 1.0 SimWhitening)
    gamma: float = 0.01
    eps: float = 1e-4
    whitening_mode: str = "cholesky"
    stop_gradient_cov: bool = False
    whitening_groups: int = 1  # 1: the paper's full whitening; G: G feature groups (cheap at large D)
    symmetric_directions: bool = False
    # tricks (paper Table 1)
    ema_momentum: float = 0.0  # 0: no EMA target
    num_local_crops: int = 0
    local_size: int = 0  # 0: half the global size (96 for 224 px)
    global_scale: tuple = (0.2, 1.0)
    local_scale: tuple = (0.05, 0.2)
    # optimisation
    optimizer: str = "lars"
    base_learning_rate: float = 0.03  # lr = batch_size / 256 * base_learning_rate
    weight_decay: float = 1e-6
    momentum: float = 0.9
    warmup_epochs: float = 10.0
    epochs: int = 100
    batch_size: int = 512
    steps_per_epoch: int = 0  # 0: one pass over the training split
    # evaluation
    knn_k: int = 200
    knn_temperature: float = 0.1
    knn_every: int = 1  # epochs between kNN monitor evaluations; 0: only at the end
    knn_max_train: int = 0  # 0: the whole training split as the kNN memory bank
    online_probe: bool = True
    # system
    augment_on: str = "host"
    precision: str = "float32"
    strategy: str = "default"
    gather_across_replicas: bool = True
    tpu: str = ""
    jit_compile: bool = False
    steps_per_execution: int = 1
    seed: int = 0
    run_dir: str = "runs"
    run_name: str = ""  # empty: <objective>-<dataset>-<timestamp>
    export: bool = False

    def __post_init__(self):
        def check(ok, field, expected):
            if not ok:
                raise ValueError(f"--{field}: expected {expected}; received {getattr(self, field)!r}")

        check(self.dataset == "fashion_mnist" or self.dataset.startswith(("tfds:", "folder:")), "dataset",
              "fashion_mnist, tfds:NAME[:SPLIT] or folder:PATH")
        check(self.objective in OBJECTIVES, "objective", f"one of {OBJECTIVES}")
        check(self.encoder in ENCODERS, "encoder", f"one of {ENCODERS}")
        check(self.optimizer in OPTIMIZERS, "optimizer", f"one of {OPTIMIZERS}")
        check(self.precision in PRECISIONS, "precision", f"one of {PRECISIONS}")
        check(self.strategy in STRATEGIES, "strategy", f"one of {STRATEGIES}")
        check(self.augment_on in AUGMENT_ON, "augment_on", f"one of {AUGMENT_ON}")
        check(self.whitening_mode in WHITENING_MODES, "whitening_mode", f"one of {WHITENING_MODES}")
        check(self.image_size >= 0, "image_size", "an integer >= 0")
        check(self.encoder_width >= 0, "encoder_width", "an integer >= 0")
        check(len(self.projector_dims) >= 1 and all(int(d) > 0 for d in self.projector_dims),
              "projector_dims", "a non-empty list of positive integers")
        check(self.whitening_groups >= 1 and self.projector_dims[-1] % self.whitening_groups == 0,
              "whitening_groups", f"a positive divisor of the embedding size {self.projector_dims[-1]}")
        check(self.predictor_hidden > 0, "predictor_hidden", "a positive integer")
        check(self.temperature >= 0, "temperature", "a number >= 0 (0 for the objective's default)")
        check(self.gamma >= 0, "gamma", "a number >= 0")
        check(self.eps > 0, "eps", "a number > 0 (the covariance ridge keeps Cholesky finite)")
        check(0 <= self.ema_momentum < 1, "ema_momentum", "a number in [0, 1) (0 disables the EMA target)")
        check(self.num_local_crops >= 0, "num_local_crops", "an integer >= 0")
        check(self.local_size >= 0, "local_size", "an integer >= 0")
        for field in ("global_scale", "local_scale"):
            lo_hi = getattr(self, field)
            check(len(lo_hi) == 2 and 0 < lo_hi[0] <= lo_hi[1] <= 1, field, "two numbers 0 < low <= high <= 1")
        check(self.base_learning_rate > 0, "base_learning_rate", "a number > 0")
        check(self.weight_decay >= 0, "weight_decay", "a number >= 0")
        check(0 <= self.momentum < 1, "momentum", "a number in [0, 1)")
        check(self.warmup_epochs >= 0, "warmup_epochs", "a number >= 0")
        check(self.warmup_epochs <= self.epochs, "warmup_epochs", f"at most --epochs={self.epochs}")
        check(self.epochs >= 1, "epochs", "an integer >= 1")
        check(self.batch_size >= 2, "batch_size", "an integer >= 2 (contrastive losses need negatives)")
        check(self.steps_per_epoch >= 0, "steps_per_epoch", "an integer >= 0")
        check(self.knn_k >= 1, "knn_k", "an integer >= 1")
        check(self.knn_temperature > 0, "knn_temperature", "a number > 0")
        check(self.knn_every >= 0, "knn_every", "an integer >= 0")
        check(self.knn_max_train >= 0, "knn_max_train", "an integer >= 0")
        check(self.steps_per_execution >= 1, "steps_per_execution", "an integer >= 1")
        check(self.strategy != "tpu" or bool(self.tpu), "tpu", "a TPU name or address with --strategy=tpu")
        check(self.max_examples >= 0, "max_examples", "an integer >= 0")

    def to_flagfile(self):
        """The resolved flags, one ``--name=value`` a line: replaying them repeats the run."""
        lines = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool):
                lines.append(f"--{f.name}" if value else f"--no{f.name}")
            elif isinstance(value, tuple):
                lines.append(f"--{f.name}={','.join(str(v) for v in value)}")
            else:
                lines.append(f"--{f.name}={value}")
        return "\n".join(lines) + "\n"

    def to_json(self):
        return json.dumps(dataclasses.asdict(self), indent=2)

    @classmethod
    def from_json(cls, text):
        raw = json.loads(text)
        known = {f.name: f for f in dataclasses.fields(cls)}
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k in known})
