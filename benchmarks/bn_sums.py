"""Time batch norm's per-channel sums: XLA's reduce fusion against a Pallas (Triton) kernel.

Batch norm's memory-bound work is two reductions over an activation ``x [M, C]`` (M = images × pixels,
bfloat16): in the forward pass Σx and Σx², in the backward pass Σg and Σg·x̂ with ``g`` the output's gradient
through the ReLU after it (``g = dy`` where ``x̂·γ + β > 0``, else 0). This times both, on the shapes of
ResNet-50's batch norms at 224 px (2 × 128 views) and of ResNet-18's at 28 px (2 × 512 views):

* **XLA**: the sums as ``jax.numpy`` reductions (what ``GroupBatchNormalization`` computes), one fusion;
* **Pallas**: a Triton kernel over ``[bm, bc]`` tiles, each program summing a run of row tiles into float32
  partial sums, the partials added by XLA; the fastest of a few tilings.

Each call is timed inside a compiled loop whose every iteration depends on the previous one (medians of 5
repetitions of ``--iters`` calls, in µs), and each Pallas result is checked against XLA's::

    KERAS_BACKEND=jax python -m benchmarks.bn_sums [--out=FILE.json]

Needs JAX with a GPU for the timings (about 3 minutes on an H200); ``--interpret`` runs the kernels in Pallas'
interpreter on any device (tiny shapes, to check them).
"""

import argparse
import functools
import json
import time

# (rows M, channels C) of batch-norm inputs: ResNet-50 at 224 px over 2 x 128 views, then ResNet-18 (CIFAR
# stem) at 28 px over 2 x 512 views
SHAPES = [(256 * 112 * 112, 64), (256 * 56 * 56, 64), (256 * 56 * 56, 256), (256 * 28 * 28, 128),
          (256 * 28 * 28, 512), (256 * 14 * 14, 256), (256 * 14 * 14, 1024), (256 * 7 * 7, 512),
          (256 * 7 * 7, 2048), (1024 * 28 * 28, 64), (1024 * 14 * 14, 128), (1024 * 7 * 7, 256)]
TILINGS = [dict(bm=64, bc=64, warps=4), dict(bm=128, bc=64, warps=4), dict(bm=32, bc=128, warps=4),
           dict(bm=128, bc=128, warps=8), dict(bm=64, bc=64, warps=4, programs=2112)]


def pallas_sums(x, shift, relu=None, *, bm=64, bc=64, programs=1056, warps=4, interpret=False):
    """The per-channel sums of ``x [M, C]`` (+ the scalar ``shift``) as two float32 ``[C]`` arrays: Σx and
    Σx², or, with ``relu = (dy, mean, inv_std, gamma, beta)``, the backward pass's Σg and Σg·x̂."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl

    m, c = x.shape
    bc = min(bc, c)
    if m % bm or c % bc:
        raise ValueError(f"pallas_sums: [{m}, {c}] does not tile into [{bm}, {bc}]")
    tiles, column_blocks = m // bm, c // bc
    runs = max(1, min(tiles, programs // column_blocks))
    per_run = -(-tiles // runs)
    runs = -(-tiles // per_run)
    backward = relu is not None

    def kernel(*refs):
        x_ref, shift_ref, *params, sum_ref, second_ref = refs
        col, run = pl.program_id(0), pl.program_id(1)
        cols = pl.ds(pl.multiple_of(col * bc, bc), bc)
        if backward:
            dy_ref, mean, inv, gamma, beta = params[0], *(ref[cols][None] for ref in params[1:])

        def body(i, carry):
            first, second = carry
            tile = run * per_run + i
            rows = pl.ds(pl.multiple_of(jnp.minimum(tile, tiles - 1) * bm, bm), bm)
            v = x_ref[rows, cols].astype(jnp.float32) + shift_ref[0]
            if backward:
                x_hat = (v - mean) * inv
                g = jnp.where((x_hat * gamma + beta > 0) & (tile < tiles), dy_ref[rows, cols].astype(jnp.float32), 0.0)
                return first + g.sum(0), second + (g * x_hat).sum(0)
            v = jnp.where(tile < tiles, v, 0.0)
            return first + v.sum(0), second + (v * v).sum(0)

        zero = jnp.zeros((bc,), jnp.float32)
        first, second = lax.fori_loop(0, per_run, body, (zero, zero))
        sum_ref[run, cols] = first
        second_ref[run, cols] = second

    options = {}
    if not interpret:
        from jax.experimental.pallas import triton as plgpu
        options["compiler_params"] = plgpu.CompilerParams(num_warps=warps, num_stages=3)
    partials = pl.pallas_call(kernel, grid=(column_blocks, runs),
                              out_shape=[jax.ShapeDtypeStruct((runs, c), jnp.float32)] * 2,
                              interpret=interpret, **options)(x, jnp.reshape(shift, (1,)).astype(jnp.float32),
                                                              *(relu or ()))
    return partials[0].sum(0), partials[1].sum(0)


def xla_sums(x, shift, relu=None):
    """The same sums as :func:`pallas_sums`, as XLA fuses them."""
    import jax.numpy as jnp

    v = x.astype(jnp.float32) + shift
    if relu is None:
        return v.sum(0), (v * v).sum(0)
    dy, mean, inv, gamma, beta = relu
    x_hat = (v - mean) * inv
    g = jnp.where(x_hat * gamma + beta > 0, dy.astype(jnp.float32), 0.0)
    return g.sum(0), (g * x_hat).sum(0)


def seconds_per_call(fn, x, relu, iters):
    """Median over 5 repetitions of ``iters`` dependent calls of ``fn(x, shift, relu)`` in one program."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    @jax.jit
    def loop(x, relu):
        def body(_, carry):
            shift, total = carry
            first, second = fn(x, shift, relu)
            return first[0] * 0.0, total + first + second  # the next call waits for this one
        return lax.fori_loop(0, iters, body, (jnp.float32(0), jnp.zeros(x.shape[1], jnp.float32)))[1]

    loop(x, relu).block_until_ready()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        loop(x, relu).block_until_ready()
        times.append(time.perf_counter() - start)
    return sorted(times)[2] / iters


def measure(shape, tilings, iters, interpret=False):
    """One shape's row: XLA's and the fastest Pallas tiling's µs a call, forward and backward, the GB/s of
    the bytes read, and the Pallas results' largest error relative to XLA's."""
    import jax
    import jax.numpy as jnp

    m, c = shape
    x = jax.random.normal(jax.random.PRNGKey(0), (m, c), jnp.bfloat16)
    dy = jax.random.normal(jax.random.PRNGKey(1), (m, c), jnp.bfloat16)
    per_channel = jax.random.normal(jax.random.PRNGKey(2), (4, c), jnp.float32)
    relu = (dy, 0.1 * per_channel[0], 1.0 + 0.1 * jnp.abs(per_channel[1]), per_channel[2], 0.1 * per_channel[3])
    row = {"rows": m, "channels": c, "mb": m * c * 2 / 1e6}
    for kind, params in (("forward", None), ("backward", relu)):
        row[f"xla_{kind}_us"] = 1e6 * seconds_per_call(xla_sums, x, params, iters)
        want = xla_sums(x, jnp.float32(0), params)
        best = None
        for tiling in tilings:
            if m % tiling["bm"]:
                continue
            fn = functools.partial(pallas_sums, **tiling, interpret=interpret)
            got = jax.jit(lambda x, p, fn=fn: fn(x, jnp.float32(0), p))(x, params)
            error = max(float(jnp.max(jnp.abs(g - w)) / (1.0 + jnp.max(jnp.abs(w)))) for g, w in zip(got, want))
            us = 1e6 * seconds_per_call(fn, x, params, iters)
            if best is None or us < best[0]:
                best = (us, tiling, error)
        row[f"pallas_{kind}_us"], row[f"pallas_{kind}_tiling"], row[f"pallas_{kind}_error"] = best
        read = row["mb"] * (1 if kind == "forward" else 2) / 1e3  # GB
        row[f"xla_{kind}_gbps"] = read / (row[f"xla_{kind}_us"] * 1e-6)
        row[f"pallas_{kind}_gbps"] = read / (row[f"pallas_{kind}_us"] * 1e-6)
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="", help="write the rows and the device as JSON to this file")
    parser.add_argument("--iters", type=int, default=50, help="dependent calls a timed repetition")
    parser.add_argument("--interpret", action="store_true", help="Pallas' interpreter on tiny shapes (any device)")
    args = parser.parse_args(argv)
    import jax

    shapes, tilings = (SHAPES, TILINGS) if not args.interpret else ([(64 * 7, 64), (128 * 3, 128)], TILINGS[:1])
    iters = args.iters if not args.interpret else 2
    rows = []
    print("| rows x channels | MB | forward: XLA GB/s | Pallas GB/s | backward: XLA GB/s | Pallas GB/s |")
    print("|---|---|---|---|---|---|")
    for shape in shapes:
        row = measure(shape, tilings, iters, interpret=args.interpret)
        rows.append(row)
        print(f"| {row['rows']} x {row['channels']} | {row['mb']:.0f} | {row['xla_forward_gbps']:.0f} | "
              f"{row['pallas_forward_gbps']:.0f} | {row['xla_backward_gbps']:.0f} | {row['pallas_backward_gbps']:.0f} |",
              flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": jax.devices()[0].device_kind, "jax": jax.__version__, "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
