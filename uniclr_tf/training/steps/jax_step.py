"""``train_step`` for the JAX backend: a pure function of the variable values.

The model's stateful Keras code (forward pass, BN moving statistics, seed generators of on-device
augmentation, EMA assignment, metric trackers) runs unchanged inside ``keras.StatelessScope``s that
map every variable to its current value; the new values are read back from the scope. Under
``keras.distribution.DataParallel`` the arrays are global, so no explicit gather is needed.
"""

import jax
import keras


def _read_back(scope, variables, old_values):
    new_values = []
    for variable, old in zip(variables, old_values):
        value = scope.get_current_value(variable)
        new_values.append(old if value is None else value)
    return new_values


class JaxTrainStep:
    """Mixin: ``jax.value_and_grad`` step. Same contract as ``TensorFlowTrainStep``."""

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
