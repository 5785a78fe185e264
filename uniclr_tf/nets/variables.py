"""Variables' initial values from a few compiled programs, compiled side by side (JAX).

Keras on JAX computes each new variable's initial value when the variable is made: each initialiser runs
as eager JAX operations, and XLA compiles a small program for every shape and distribution among them (a
ResNet-18 with its heads and optimizer: about 60 programs, one after the other). On an H200 that is about
8 seconds before training on every run that does not find them in the compilation cache
(docs/results/speed.md).
:func:`batched_initialisers` defers those initialisers while a model is built (the train CLI's model and
optimizer; ``build_encoder``, ``UniCLR`` and the optimizer ``UniCLR.fit`` builds, always), then traces
them into a few ``jax.jit`` programs and compiles those on several threads at once (XLA releases the
GIL). A deferred variable read before the block ends gets the deferred values computed first, so code
that copies weights during construction (an EMA target) sees the final values.
"""

import contextlib
import functools
import os

__all__ = ["batched_initialisers", "with_batched_initialisers"]


def with_batched_initialisers(function):
    """``function`` run inside :func:`batched_initialisers` (a builder: ``build_encoder``, ``UniCLR``)."""
    @functools.wraps(function)
    def batched(*args, **kwargs):
        with batched_initialisers():
            return function(*args, **kwargs)
    return batched


@contextlib.contextmanager
def batched_initialisers(programs=None):
    """Within the block, new Keras variables on JAX take their initial values from a few compiled programs.

    ``programs``: how many programs to split the initialisers into and compile at once (default: half the
    CPU cores, at most 8; 1 makes one program; 0 keeps Keras's own initialisation, one compile after
    another, for the builders inside the block too: a reference). The values are those of the same
    initialisers with the same seeds as without the block: the random bits are the same, and a float
    transform may differ in its last bit where XLA fuses it. They are computed when the block ends, or
    earlier when a deferred variable is read outside a trace (``get_weights``, ``numpy()``, an operation on
    it); a variable assigned before then keeps the assigned value. An initialiser that cannot be traced (one
    computing in NumPy) runs as Keras runs it. In a nested block the outer one computes them. Another
    backend, or Keras with Flax NNX variables: the block does nothing.
    """
    import keras
    if keras.backend.backend() != "jax" or keras.config.is_nnx_enabled():
        yield
        return
    from uniclr_tf.augment._private import jax_variables
    cls = jax_variables()[0]
    if getattr(cls, "_uniclr_deferred", None) is not None:  # nested: the outer block computes them
        yield
        return
    if programs == 0:  # Keras's own: nested blocks (the builders') see one active and do nothing
        cls._uniclr_deferred = ()
        try:
            yield
        finally:
            del cls._uniclr_deferred
        return
    if programs is None:
        programs = max(1, min(8, (os.cpu_count() or 2) // 2))
    pending = []
    keras_init = cls._initialize_with_initializer
    keras_value = cls.value  # the property KerasVariable defines
    own = {name: cls.__dict__.get(name) for name in ("_initialize_with_initializer", "value")}

    def deferred_init(self, initializer):
        self._initialize_layout()
        if not _defers(self, initializer):
            return keras_init(self, initializer)
        self._value = None
        self._initializer = initializer
        pending.append(self)

    def value(self):
        if self._value is None and self._initializer is not None and not _tracing():
            _compute(pending, keras_init, programs)
        return keras_value.fget(self)

    cls._uniclr_deferred = pending
    cls._initialize_with_initializer = deferred_init
    cls.value = property(value)
    try:
        yield
    finally:
        del cls._uniclr_deferred
        for name, attribute in own.items():  # the class's own methods back, or the inherited ones
            if attribute is None:
                delattr(cls, name)
            else:
                setattr(cls, name, attribute)
    _compute(pending, keras_init, programs)


def _defers(variable, initializer):
    """Whether Keras would compute this variable's value as a plain array and place it after: no layout,
    or one whose initialiser neither takes a layout nor shards at creation (those stay Keras's)."""
    import inspect
    from uniclr_tf.augment._private import jax_variables
    if variable._layout is None:
        return True
    layout = getattr(variable._layout, "backend_layout", variable._layout)
    return ("layout" not in inspect.signature(initializer).parameters
            and not jax_variables()[1](layout, variable._shape))


def _tracing():
    """Inside a JAX trace (``eval_shape`` of a symbolic call, a ``jit``): a value there is abstract."""
    from uniclr_tf.augment._private import jax_variables
    _, _, in_stateless_scope, in_jax_trace = jax_variables()
    return in_stateless_scope() or in_jax_trace()


def _split(variables, programs):
    """``variables`` dealt into at most ``programs`` groups, the largest random ones first (their
    programs take longest to compile), so the groups take about as long as each other."""
    import math
    order = sorted(variables, key=lambda v: (not hasattr(v._initializer, "seed"), -math.prod(v._shape)))
    groups = [order[i::programs] for i in range(min(programs, len(order)))]
    return [g for g in groups if g]


def _compute(pending, keras_init, programs):
    """The deferred variables still without a value, initialised: traced and lowered here, compiled on
    ``programs`` threads, run here. Where tracing fails, each variable of that group as Keras does."""
    import concurrent.futures
    import jax
    todo = [v for v in pending if v._value is None and v._initializer is not None]
    pending.clear()
    if not todo:
        return
    groups, lowered = _split(todo, programs), []
    for group in groups:  # tracing reads Keras's thread-local scopes: on this thread
        initialisers = [(v._initializer, v._shape, v._dtype) for v in group]
        def initial_values(inits=initialisers):  # the programs' name in JAX's compile log
            return [f(s, dtype=d) for f, s, d in inits]
        try:
            lowered.append(jax.jit(initial_values).lower())
        except Exception:  # e.g. an initialiser computing in NumPy
            lowered.append(None)
    with concurrent.futures.ThreadPoolExecutor(len(groups)) as pool:
        compiled = list(pool.map(lambda low: low.compile() if low is not None else None, lowered))
    for group, program in zip(groups, compiled):
        values = program() if program is not None else [None] * len(group)
        for v, array in zip(group, values):
            initializer, v._initializer = v._initializer, None
            if array is None:
                keras_init(v, initializer)
            else:
                v._initialize(v._convert_to_tensor(array))
