"""``train_step`` for the JAX backend: a pure function of the variable values.

The model's stateful Keras code (forward pass, BN moving statistics, seed generators of on-device
augmentation, EMA assignment, metric trackers) runs unchanged inside ``keras.StatelessScope``s that
map every variable to its current value; the new values are read back from the scope. Under
``keras.distribution.DataParallel`` the arrays are global, so no explicit gather is needed.
"""

import jax
import keras
import numpy as np


def _read_back(scope, variables, old_values):
    new_values = []
    for variable, old in zip(variables, old_values):
        value = scope.get_current_value(variable)
        new_values.append(old if value is None else value)
    return new_values


class JaxTrainStep:
    """Mixin: ``jax.value_and_grad`` step. Same contract as ``TensorFlowTrainStep``.
    (:class:`BlockedSteps` puts several of them in one compiled call.)"""

    def train_step(self, state, data):
        trainable_values, non_trainable_values, optimizer_values, metrics_values = state
        trainable = self.trainable_variables
        non_trainable = self.non_trainable_variables
        optimizer_vars = self.optimizer.variables
        metrics_vars = self.metrics_variables

        def loss_fn(tv, ntv):
            mapping = list(zip(trainable, tv)) + list(zip(non_trainable, ntv)) + list(zip(optimizer_vars, optimizer_values))
            with keras.StatelessScope(state_mapping=mapping) as scope:
                loss, logs = self.compute_objective(data, training=True)
                scaled = self.optimizer.scale_loss(loss)
            return scaled, (logs, _read_back(scope, non_trainable, ntv))

        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
        (_, (logs, non_trainable_values)), grads = grad_fn(trainable_values, non_trainable_values)
        trainable_values, optimizer_values = self.optimizer.stateless_apply(optimizer_values, grads, trainable_values)

        mapping = (list(zip(trainable, trainable_values)) + list(zip(non_trainable, non_trainable_values))
                   + list(zip(optimizer_vars, optimizer_values)) + list(zip(metrics_vars, metrics_values)))
        with keras.StatelessScope(state_mapping=mapping) as scope:
            self.update_target()
            logs = self.update_metrics(logs)
        non_trainable_values = _read_back(scope, non_trainable, non_trainable_values)
        metrics_values = _read_back(scope, metrics_vars, metrics_values)
        return logs, (trainable_values, non_trainable_values, optimizer_values, metrics_values)

    def all_gather(self, x):
        return x


class BlockedSteps:
    """Mixin: on JAX, ``steps_per_execution = K > 1`` runs K train steps in ONE compiled call.

    Keras's JAX trainer implements ``steps_per_execution`` as a Python loop around the compiled
    single step, so the host still dispatches every step with the whole model state as arguments
    (~300 arrays, each sharded over the devices under ``DataParallel``): on several GPUs that
    per-step host work, not the GPUs, bounds the step (benchmarks/SCALING.md). Here the K batches
    of a block go into one jitted function that runs the same ``train_step`` K times in a
    ``lax.scan``: one dispatch and one state hand-over per block. Compile time is that of one step
    (the scan compiles its body once).

    Exactly ``steps_per_epoch`` steps run per epoch (Keras would round an epoch up to a multiple
    of K for an endless input): the last block of an epoch takes fewer batches and the scan skips
    the rest (``lax.cond``), so every block has the same shapes and one compilation serves all.
    Callbacks see a batch end every K steps (their logs: those of the block's last step).
    """

    def fit(self, *args, **kwargs):
        self._block_epoch_steps = kwargs.get("steps_per_epoch") or 0
        self._block_done = 0
        return super().fit(*args, **kwargs)

    def make_train_function(self, force=False):
        blocks = self.steps_per_execution
        if blocks <= 1 or self.run_eagerly or not self.jit_compile:
            return super().make_train_function(force)
        if self.train_function is not None and not force:
            return
        out_shardings = None
        if keras.distribution.distribution() is not None:
            out_shardings = (None, self._get_state_sharding_spec())

        def block(state, batches, count):
            logs_spec = jax.eval_shape(lambda s, d: self.train_step(s, d)[0], state, batches[0])
            logs = jax.tree_util.tree_map(lambda a: jax.numpy.zeros(a.shape, a.dtype), logs_spec)
            stacked = jax.tree_util.tree_map(lambda *xs: jax.numpy.stack(xs), *batches)

            def body(carry, inputs):
                index, data = inputs

                def run(carry):
                    new_logs, new_state = self.train_step(carry[0], data)
                    return new_state, new_logs

                return jax.lax.cond(index < count, run, lambda carry: carry, carry), None

            (state, logs), _ = jax.lax.scan(body, (state, logs), (jax.numpy.arange(blocks), stacked))
            return logs, state

        compiled = jax.jit(block, donate_argnums=0, out_shardings=out_shardings)

        def train_function(state, iterator):
            wanted = blocks
            if self._block_epoch_steps:
                wanted = min(blocks, self._block_epoch_steps - self._block_done)
            batches = [next(iterator)]
            try:
                while len(batches) < wanted:
                    batches.append(next(iterator))
            except StopIteration:
                pass
            count = len(batches)
            if self._block_epoch_steps:
                self._block_done = (self._block_done + count) % self._block_epoch_steps
            batches += [batches[-1]] * (blocks - count)  # never trained on: the scan skips them
            return compiled(state, tuple(batches), np.int32(count))

        self.train_function = train_function
