"""Time the ResNet stem's max-pool gradient alone: ours fenced, ours fused into its consumers, Keras' own.

The stem of ResNet-50 at 224 px ends in batch norm, ReLU and a 3 × 3 / 2 max pool over ``[B, 112, 112, 64]``.
In the backward pass the pool's input gradient goes through the ReLU's mask into batch norm's two sums. This
times that chain (forward and backward, then Σg and Σg·x as batch norm's backward takes them) for:

* ``fenced``: :class:`uniclr_tf.nets.pooling.MaxPooling2D`'s gather gradient, written out whole (the default);
* ``fused``: the same gather, which XLA may fuse into the ReLU's gradient and the sums (``fence=False``);
* ``keras``: XLA's reduce-window max pool, differentiated by JAX (Keras' ``MaxPooling2D`` on JAX).

Each variant's gradient is checked against ``fenced``'s (``max_error``; Keras' may differ where a window's
maximum is tied, as after the ReLU). Medians of 5 repetitions of 20 calls, in ms::

    KERAS_BACKEND=jax python -m benchmarks.pool_grad [--images=256,512] [--out=FILE.json]

256 and 512 images are the ResNet-50 step's 2 × 128 and 2 × 256 views. Needs JAX with a GPU for the timings
(about a minute on an H200); ``--images=2 --size=16`` runs it anywhere.
"""

import argparse
import datetime
import json
import pathlib
import time

VARIANTS = ("fenced", "fused", "keras")


def chain(variant, size):
    """The compiled ``(x, scale, shift, dy) -> (dx, Σg, Σg·x)`` of one variant at ``size × size`` inputs."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    from uniclr_tf.nets import pooling

    if variant == "keras":
        pool = lambda y: lax.reduce_window(y, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "VALID")  # noqa: E731
    else:
        pool = pooling._max_pool_fn((3, 3), (2, 2), (size + 2, size + 2), fence=variant == "fenced")

    def forward(x, scale, shift):
        y = jax.nn.relu(x.astype(jnp.float32) * scale + shift).astype(jnp.bfloat16)
        return pool(jnp.pad(y, ((0, 0), (1, 1), (1, 1), (0, 0))))  # ResNet-50's ZeroPadding2D(1)

    @jax.jit
    def step(x, scale, shift, dy):
        _, vjp = jax.vjp(lambda x: forward(x, scale, shift), x)
        (dx,) = vjp(dy)
        g = dx.astype(jnp.float32)
        return dx, g.sum((0, 1, 2)), (g * x.astype(jnp.float32)).sum((0, 1, 2))

    return step


def measure(images, size=112, channels=64, reps=5, calls=20):
    """One row a variant: median ms a call, and the largest difference of its gradient from ``fenced``'s."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(images, size, size, channels)), jnp.bfloat16)
    scale = jnp.asarray(1 + rng.random(channels), jnp.float32)
    shift = jnp.asarray(0.1 * rng.normal(size=channels), jnp.float32)
    dy = jnp.asarray(rng.normal(size=(images, size // 2, size // 2, channels)), jnp.bfloat16)
    rows, reference = [], None
    for variant in VARIANTS:
        step = chain(variant, size)
        dx = jax.block_until_ready(step(x, scale, shift, dy))[0].astype(jnp.float32)
        reference = dx if reference is None else reference
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            for _ in range(calls):
                out = step(x, scale, shift, dy)
            jax.block_until_ready(out)
            times.append((time.perf_counter() - start) / calls * 1e3)
        rows.append({"images": images, "size": size, "channels": channels, "variant": variant,
                     "ms": round(float(np.median(times)), 4), "min_ms": round(min(times), 4),
                     "max_ms": round(max(times), 4),
                     "max_error": float(jnp.max(jnp.abs(dx - reference)))})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", default="256,512", help="comma-separated batch sizes (images, not samples)")
    parser.add_argument("--size", type=int, default=112, help="the pool's input height and width before padding")
    parser.add_argument("--out", help="write the rows and the device to this JSON file")
    args = parser.parse_args(argv)
    import jax

    rows = [row for n in args.images.split(",") for row in measure(int(n), size=args.size)]
    result = {"device": jax.devices()[0].device_kind, "jax": jax.__version__,
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
              "command": "KERAS_BACKEND=jax python -m benchmarks.pool_grad --out=FILE.json", "rows": rows}
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
