"""Time the eigendecompositions of Zero-CL's ZCA whitening, and the ways of computing them.

Zero-CL (``objectives.zero_cl_loss``) whitens each view twice, over the features and over the
instances: four ``n × n`` symmetric eigendecompositions a step (``n`` = batch size = embedding size,
512 in ``configs/methods/zero_cl.flags``). This times, on JAX's default device, the whitening matrix
``U (S + ε)^-½ Uᵀ`` of four such covariances

* as four separate ``eigh`` calls (what the loss does) and as one batched call ``[4, n, n]``;
* with each of JAX's ``eigh`` implementations (the default, QR-based, Jacobi) where the device has it;

and gives each one's error against a float64 NumPy reference. Medians of ``--repeats`` calls, in ms::

    KERAS_BACKEND=jax python -m benchmarks.zca_eigh [--n=512] [--repeats=20]

Needs JAX (any device; the numbers that matter come from a GPU).
"""

import argparse
import time

import numpy as np


def covariances(n, count=4, rank=64, seed=0):
    """``count`` covariances of standardised ``[n, n]`` embeddings of low effective rank plus noise, as
    Zero-CL sees them: float64, symmetric, positive semi-definite."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(count, n, rank)) @ rng.normal(size=(count, rank, n)) + 0.1 * rng.normal(size=(count, n, n))
    z = (z - z.mean(1, keepdims=True)) / z.std(1, keepdims=True)
    return np.einsum("bji,bjk->bik", z, z) / n


def whitening_reference(cov, eps):
    """The float64 ZCA whitening matrices ``U (S + ε)^-½ Uᵀ`` of ``cov [..., n, n]``."""
    values, vectors = np.linalg.eigh(cov)
    return np.einsum("...ij,...j,...kj->...ik", vectors, 1.0 / np.sqrt(np.maximum(values, 0.0) + eps), vectors)


def median_ms(fn, arg, repeats):
    import jax

    jax.block_until_ready(fn(arg))  # compile
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(arg))
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=512, help="size of each covariance (batch = embedding size)")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per variant (the median is given)")
    parser.add_argument("--eps", type=float, default=0.01, help="ε added to the eigenvalues (Zero-CL: 0.01)")
    args = parser.parse_args(argv)
    if args.n < 2 or args.repeats < 1 or args.eps <= 0:
        parser.error("--n must be >= 2, --repeats >= 1 and --eps > 0")

    import jax
    import jax.numpy as jnp
    from jax import lax

    implementations = {"default": None}
    try:  # JAX's choice of algorithm; not every version or device has each
        from jax._src.lax.linalg import EighImplementation

        implementations.update(qr=EighImplementation.QR, jacobi=EighImplementation.JACOBI)
    except ImportError:
        pass

    cov64 = covariances(args.n)
    reference = whitening_reference(cov64, args.eps)
    cov = jnp.asarray(cov64, jnp.float32)

    def whitening(c, implementation):
        kwargs = {} if implementation is None else {"implementation": implementation}
        vectors, values = lax.linalg.eigh(c, **kwargs)
        scale = lax.rsqrt(jnp.maximum(values, 0.0) + args.eps)
        return (vectors * scale[..., None, :]) @ jnp.swapaxes(vectors, -1, -2)

    print(f"device: {jax.devices()[0].device_kind}; four {args.n}x{args.n} covariances, median of {args.repeats}")
    print("| eigh | four calls, ms | one batched call, ms | max error / max entry |")
    print("|---|---|---|---|")
    for name, implementation in implementations.items():
        separate = jax.jit(lambda c, i=implementation: jnp.stack([whitening(c[k], i) for k in range(c.shape[0])]))
        batched = jax.jit(lambda c, i=implementation: whitening(c, i))
        try:
            error = np.max(np.abs(np.asarray(separate(cov), np.float64) - reference)) / np.max(np.abs(reference))
            times = median_ms(separate, cov, args.repeats), median_ms(batched, cov, args.repeats)
        except (NotImplementedError, RuntimeError) as e:  # one this device lacks: say so, time the others
            print(f"| {name} | not available: {type(e).__name__} | | |")
            continue
        print(f"| {name} | {times[0]:.2f} | {times[1]:.2f} | {error:.1e} |")


if __name__ == "__main__":
    main()
