"""Learning-rate and EMA-momentum schedules, in ``keras.ops`` (the step may be a tensor).

``WarmupCosine`` is SimCLR's schedule (paper §4.1): the peak rate is scaled linearly with the
batch size, ``peak = batch_size / 256 · base_learning_rate``; a linear warm-up from 0 reaches it
at ``warmup_steps``, then a cosine decays it to ``end_learning_rate`` at ``total_steps``, where it
stays.

``momentum_schedule`` is BYOL's cosine schedule for the target network's EMA coefficient,
``τ = 1 − (1 − τ_base)·(cos(π·step/total) + 1)/2``, rising from ``τ_base`` to 1.
"""

import math
import numbers

import keras
import numpy as np
from keras import ops


def _check_int(arg, value, minimum):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value != int(value):
        raise ValueError(f"`{arg}` must be an integer. Received: {arg}={value!r}")
    if value < minimum:
        raise ValueError(f"`{arg}` must be >= {minimum}. Received: {arg}={value!r}")
    return int(value)


def _check_float(arg, value, minimum, strict=False):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value):
        raise ValueError(f"`{arg}` must be a float. Received: {arg}={value!r}")
    if value < minimum or (strict and value == minimum):
        raise ValueError(
            f"`{arg}` must be {'>' if strict else '>='} {minimum}. Received: {arg}={value!r}")
    return float(value)


@keras.saving.register_keras_serializable(package="uniclr_tf")
class WarmupCosine(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up to ``batch_size / reference_batch · base_learning_rate``, then cosine decay.

    Args:
        base_learning_rate: float > 0, the rate for a batch of ``reference_batch`` (0.05 ImageNet,
            0.03 CIFAR in the paper).
        batch_size: int > 0, the global batch size.
        total_steps: int > 0, optimizer steps of the whole run (warm-up included).
        warmup_steps: int in [0, total_steps].
        end_learning_rate: float >= 0, the absolute rate reached at ``total_steps`` and kept after.
        reference_batch: int > 0, the batch size ``base_learning_rate`` refers to (256).

    With ``s`` the step (the optimizer's ``iterations``, i.e. 0 for the first update)::

        s <  warmup_steps:         lr = peak · s / warmup_steps
        warmup_steps <= s <= total: lr = end + (peak − end)·(1 + cos(π·p))/2,
                                        p = (s − warmup_steps) / (total_steps − warmup_steps)
        s >  total_steps:          lr = end

    Examples:
        >>> schedule = WarmupCosine(0.3, batch_size=512, total_steps=1000, warmup_steps=100)
        >>> schedule.peak_learning_rate, round(schedule.host_value(50), 4), schedule.host_value(1000)
        (0.6, 0.3, 0.0)
    """

    def __init__(self, base_learning_rate, batch_size, total_steps, warmup_steps,
                 end_learning_rate=0.0, reference_batch=256, name="warmup_cosine"):
        super().__init__()
        self.base_learning_rate = _check_float("base_learning_rate", base_learning_rate, 0.0,
                                               strict=True)
        self.batch_size = _check_int("batch_size", batch_size, 1)
        self.total_steps = _check_int("total_steps", total_steps, 1)
        self.warmup_steps = _check_int("warmup_steps", warmup_steps, 0)
        if self.warmup_steps > self.total_steps:
            raise ValueError("`warmup_steps` must be <= `total_steps`. Received: "
                             f"warmup_steps={warmup_steps!r}, total_steps={total_steps!r}")
        self.end_learning_rate = _check_float("end_learning_rate", end_learning_rate, 0.0)
        self.reference_batch = _check_int("reference_batch", reference_batch, 1)
        self.name = name

    @property
    def peak_learning_rate(self):
        """``batch_size / reference_batch · base_learning_rate`` (a Python float)."""
        return self.batch_size / self.reference_batch * self.base_learning_rate

    def __call__(self, step):
        step = ops.cast(ops.convert_to_tensor(step), "float32")
        peak = ops.cast(self.peak_learning_rate, "float32")
        end = ops.cast(self.end_learning_rate, "float32")
        warmup = float(self.warmup_steps)
        decay_steps = float(max(self.total_steps - self.warmup_steps, 1))

        warmup_lr = peak * step / max(warmup, 1.0)
        progress = ops.clip((step - warmup) / decay_steps, 0.0, 1.0)
        cosine_lr = end + (peak - end) * 0.5 * (1.0 + ops.cos(math.pi * progress))
        lr = ops.where(step < warmup, warmup_lr, cosine_lr)
        return ops.where(step > float(self.total_steps), end, lr)

    def host_value(self, step):
        """The rate at ``step`` (a Python int), in NumPy float32 with ``__call__``'s formula: for
        logging on the host (the TensorBoard callback), where ``__call__``'s ``keras.ops`` would each
        be an XLA compile on JAX. Equal to ``__call__`` up to float32 rounding (``cos``)."""
        f32 = np.float32
        step = f32(step)
        peak, end = f32(self.peak_learning_rate), f32(self.end_learning_rate)
        warmup = f32(self.warmup_steps)
        decay_steps = f32(max(self.total_steps - self.warmup_steps, 1))
        if step > f32(self.total_steps):
            return float(end)
        if step < warmup:
            return float(peak * step / max(warmup, f32(1.0)))
        progress = np.clip((step - warmup) / decay_steps, f32(0.0), f32(1.0))
        return float(end + (peak - end) * f32(0.5) * (f32(1.0) + np.cos(f32(math.pi) * progress)))

    def get_config(self):
        return {
            "base_learning_rate": self.base_learning_rate,
            "batch_size": self.batch_size,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
            "end_learning_rate": self.end_learning_rate,
            "reference_batch": self.reference_batch,
            "name": self.name,
        }


def momentum_schedule(step, total_steps, base=0.99):
    """BYOL's EMA coefficient ``τ = 1 − (1 − base)·(cos(π·step/total_steps) + 1)/2``.

    ``base`` at step 0, rising monotonically to 1 at ``total_steps``; steps beyond ``total_steps``
    are clipped (τ stays 1). ``step`` may be a Python number or a tensor; returns a float32 tensor.
    """
    total_steps = _check_int("total_steps", total_steps, 1)
    base = _check_float("base", base, 0.0)
    if base > 1.0:
        raise ValueError(f"`base` must be in [0, 1]. Received: base={base!r}")
    step = ops.cast(ops.convert_to_tensor(step), "float32")
    progress = ops.clip(step / float(total_steps), 0.0, 1.0)
    return 1.0 - (1.0 - base) * (ops.cos(math.pi * progress) + 1.0) / 2.0
