"""DINO (Caron et al., ICCV 2021, arXiv 2104.14294): self-distillation with no labels.

A student (encoder + DINO head) and an EMA teacher (0.996 rising to 1 on a cosine); the head is an
MLP to a 256-d bottleneck, ℓ2 normalisation and a weight-normalised linear layer to K outputs
(``heads.dino_head``; ``--projector_dims`` gives its hidden sizes and bottleneck, ``--num_prototypes``
K). The teacher's outputs are centred (a running mean of its batch outputs, momentum 0.9, over the
global batch) and sharpened (temperature T_t), the student's softened (T_s = ``--temperature``,
0.1); the loss ``objectives.dino_loss`` is averaged over the pairs of different views (each global
view teaches the other, and with multi-crop every local crop; the teacher sees the global views
only). T_t warms up linearly per epoch from ``--warmup_teacher_temperature`` to
``--teacher_temperature`` over ``--warmup_teacher_temperature_epochs`` (DINO's 0.04 → 0.07 over 30
epochs); without the model's ``steps_per_epoch`` it is ``--teacher_temperature`` throughout.

Not implemented: freezing the head's last layer during the first epoch and gradient clipping
(DINO's ViT stabilisers), the per-parameter weight-decay schedule.
"""

from keras import ops

from uniclr_tf import objectives
from uniclr_tf.nets import heads
from uniclr_tf.methods.base import Method, Option


def teacher_temperature(step, steps_per_epoch, warmup, final, warmup_epochs):
    """DINO's schedule: ``linspace(warmup, final, warmup_epochs)`` indexed by the epoch, then ``final``."""
    if not steps_per_epoch or warmup_epochs <= 0:
        return final
    epoch = ops.cast(ops.floor_divide(ops.cast(step, "int64"), int(steps_per_epoch)), "float32")
    fraction = ops.minimum(epoch / max(float(warmup_epochs) - 1.0, 1.0), 1.0)
    value = warmup + (final - warmup) * fraction
    return ops.where(epoch < warmup_epochs, value, ops.cast(final, "float32"))


class DINO(Method):
    name, family = "dino", "asymmetric"
    paper = "Caron et al. 2021, arXiv 2104.14294"
    terms = ("cross_entropy",)
    target = "ema"
    projector_last_bn = False
    views = "byol"  # DINO's global views are BYOL's (blur 1.0 / 0.1, solarisation 0 / 0.2)
    defaults = {"temperature": 0.1, "ema_momentum": 0.996, "num_prototypes": 4096, "teacher_temperature": 0.07,
                "warmup_teacher_temperature": 0.04, "warmup_teacher_temperature_epochs": 30, "center_momentum": 0.9}
    option_specs = {
        "teacher_temperature": Option(float, "DINO: teacher temperature T_t after the warm-up.", lambda v: v > 0,
                                      "a number > 0"),
        "warmup_teacher_temperature": Option(float, "DINO: teacher temperature at the first epoch.",
                                             lambda v: v > 0, "a number > 0"),
        "warmup_teacher_temperature_epochs": Option(int, "DINO: epochs of the linear teacher-temperature warm-up.",
                                                    lambda v: v >= 0, "an integer >= 0"),
        "center_momentum": Option(float, "DINO: momentum of the teacher-output centre.", lambda v: 0 <= v < 1,
                                  "a number in [0, 1)"),
    }

    def build_projector(self, input_dim, dims, norm=None):
        return heads.dino_head(input_dim, dims, num_prototypes=int(self.options["num_prototypes"]),
                               norm=norm)

    def build_state(self, model, embedding_dim):
        center = model.add_weight(shape=(int(embedding_dim),), initializer="zeros", trainable=False,
                                  name="dino_center", dtype="float32")
        return {"center": center}

    def current_teacher_temperature(self, state):
        o = self.options
        return teacher_temperature(state.get("step", 0), state.get("steps_per_epoch"),
                                   float(o["warmup_teacher_temperature"]), float(o["teacher_temperature"]),
                                   int(o["warmup_teacher_temperature_epochs"]))

    def pair_loss(self, online, target, state):
        return objectives.dino_loss(online, target, state["center"], student_temperature=self.options["temperature"],
                                    teacher_temperature=self.current_teacher_temperature(state), return_terms=True)

    def update_state(self, state, targets):
        """The centre follows the mean teacher output of every global view of the (global) batch."""
        center = state["center"]
        batch = ops.mean(ops.cast(ops.stop_gradient(ops.concatenate(list(targets), axis=0)), "float32"), axis=0)
        m = float(self.options["center_momentum"])
        center.assign(ops.convert_to_tensor(center) * m + batch * (1.0 - m))
