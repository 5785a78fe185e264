"""Generic tensor helpers shared by the objectives and the whitening maths (pure ``keras.ops``).

Conventions: embeddings are rank-2 ``[N, D]`` tensors whose rows are samples. Losses compute in
float32, or in float64 when any input is float64; bfloat16 / float16 inputs are upcast to float32
before any arithmetic (:func:`compute_dtype`, :func:`check_embedding_pair`). Argument checks raise a
``ValueError`` that names the argument and quotes the value received.
"""

import keras
from keras import ops

__all__ = [
    "as_dtype",
    "compiled",
    "check_embedding",
    "check_embedding_pair",
    "check_non_negative",
    "check_positive",
    "check_same_feature_size",
    "compute_dtype",
    "static_shape",
    "to_device",
]

_WIDE_DTYPES = ("float64",)


def static_shape(x):
    """The static shape of ``x`` as a tuple (``None`` for unknown dims); ``None`` if the rank is unknown."""
    shape = getattr(x, "shape", None)
    if shape is None:
        return None
    if hasattr(shape, "rank"):  # tf.TensorShape
        if shape.rank is None:
            return None
    return tuple(None if d is None else int(d) for d in shape)


def compute_dtype(*tensors):
    """The dtype the objectives compute in: ``float64`` if any input is float64, else ``float32``."""
    for t in tensors:
        if keras.backend.standardize_dtype(t.dtype) in _WIDE_DTYPES:
            return "float64"
    return "float32"


def check_embedding(z, name="z"):
    """Converts ``z`` to a tensor and checks it is a floating-point rank-2 ``[N, D]`` tensor (rows are samples)."""
    z = ops.convert_to_tensor(z)
    shape = static_shape(z)
    if shape is not None and len(shape) != 2:
        raise ValueError(
            f"`{name}` must be a rank-2 tensor of shape [N, D] (rows are samples); "
            f"received {name}.shape={shape}")
    if not keras.backend.is_float_dtype(z.dtype):
        raise ValueError(f"`{name}` must be a floating-point tensor; received dtype {z.dtype}")
    return z


def check_embedding_pair(z1, z2, names=("z1", "z2")):
    """Converts both views to tensors, checks ranks and that the shapes agree, upcasts to float32+.

    Args:
        z1, z2: the two ``[N, D]`` tensors.
        names: the argument names used in error messages (e.g. ``("p", "z")``).

    Returns:
        ``(z1, z2, dtype)`` with both tensors cast to ``dtype`` (see :func:`compute_dtype`).
    """
    n1, n2 = names
    z1 = check_embedding(z1, n1)
    z2 = check_embedding(z2, n2)
    s1, s2 = static_shape(z1), static_shape(z2)
    if s1 is not None and s2 is not None:
        if any(a is not None and b is not None and a != b for a, b in zip(s1, s2)):
            raise ValueError(
                f"`{n1}` and `{n2}` must have the same shape [N, D] (two views of the same batch); "
                f"received {n1}.shape={s1} and {n2}.shape={s2}")
    dtype = compute_dtype(z1, z2)
    return ops.cast(z1, dtype), ops.cast(z2, dtype), dtype


def check_same_feature_size(z, other, name, other_name):
    """Checks that two ``[·, D]`` tensors have the same (static) feature size ``D``."""
    s, o = static_shape(z), static_shape(other)
    if s is not None and o is not None and s[-1] is not None and o[-1] is not None and s[-1] != o[-1]:
        raise ValueError(
            f"`{name}` must have the feature size D={o[-1]} of `{other_name}`; "
            f"received {name}.shape={s} and {other_name}.shape={o}")


def as_dtype(value, dtype):
    """``value`` (a Python number or a tensor) as a tensor of ``dtype``.

    Python numbers are converted straight to ``dtype``: ``ops.cast(0.01, "float64")`` would go
    through float32 first and be off by 2e-9 relative.
    """
    if isinstance(value, (int, float)):
        return ops.convert_to_tensor(value, dtype=dtype)
    return ops.cast(value, dtype)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_positive(value, name):
    """Raises ``ValueError`` if the Python number ``value`` is not ``> 0`` (tensors are not checked)."""
    if _is_number(value) and not value > 0:
        raise ValueError(f"`{name}` must be > 0; received {name}={value!r}")


def check_non_negative(value, name):
    """Raises ``ValueError`` if the Python number ``value`` is not ``>= 0`` (tensors are not checked)."""
    if _is_number(value) and not value >= 0:
        raise ValueError(f"`{name}` must be >= 0; received {name}={value!r}")


def compiled(fn):
    """``fn`` (a function of backend tensors made of ``keras.ops``) as one compiled program on JAX:
    ``jax.jit(fn)``, traced and compiled once per input shape. Outside a jitted step, every
    ``keras.ops`` call on JAX is an XLA compile of its own the first time it meets a shape (tens to
    hundreds of ms each on a GPU); an evaluation's maths made of twenty ops is then twenty compiles.
    Other backends: ``fn`` itself (TensorFlow runs eager ops without compiling anything).

    Keep the result (e.g. in a ``functools.lru_cache`` keyed by the closure's constants): a new
    ``jax.jit`` object traces and compiles again."""
    if keras.backend.backend() == "jax":
        import jax
        return jax.jit(fn)
    return fn


def to_device(array):
    """A NumPy array as a backend tensor on the default device. On JAX ``jax.device_put``: a copy,
    where ``ops.convert_to_tensor`` (``jnp.asarray``) compiles a staging program per shape."""
    if keras.backend.backend() == "jax":
        import jax
        import numpy as np
        return jax.device_put(np.asarray(array))
    return ops.convert_to_tensor(array)
