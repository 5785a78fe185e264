r"""Device memory of the real training step against the batch size, and the largest batch that fits.

    KERAS_BACKEND=jax python -m benchmarks.memory_probe --encoder=resnet50 --image_size=224 \
        --batches=32,64,128,256 --out=/tmp/memory-r50.json [--device_memory_gib=G] [--verify]

JAX backend only. The training model is built exactly as ``benchmarks/bench.py`` builds it
(``bench.build_training_model``: ``train.build_model`` + ``build_optimizer`` + ``build_augmenter`` from a
``TrainConfig``; method simaffinity, LARS, bf16 mixed precision, augmentation inside the step) for
synthetic uint8 images of ``--image_size`` pixels. For each batch size the step (``model.train_step``
jitted with the state donated, as Keras's JAX trainer and the bench do) is lowered on abstract inputs
and compiled, never run; XLA's buffer assignment (``compiled.memory_analysis()``) gives the bytes of the
arguments (weights, optimizer and metric state, the uint8 batch), the outputs, the outputs aliased to
donated arguments, the temporaries (activations kept for the backward pass, workspaces) and the
generated code. ``total = argument + temp + output - alias`` is what the step needs on the device at
once; a least-squares line ``total = a + b * batch`` over the batches predicts the largest batch that
fits ``--device_memory_gib`` (default: ``bytes_limit`` of the device's ``memory_stats()``, the memory
this JAX process may use: 75 % of the GPU under JAX's default preallocation; else 80 GiB).

``--verify`` then runs one real step at the predicted largest batch rounded down to a multiple of 32,
and at 1.1x that batch, each from a fresh copy of the state, and reports success or OOM and the
allocator's ``peak_bytes_in_use`` (the process's peak so far, so the smaller batch runs first).

The JSON is rewritten after every batch, so a time limit that stops the probe keeps what it measured.
Note: ``resnet18`` here is the paper's CIFAR ResNet-18 (3x3 stride-1 stem, no max-pool): at 224 px its
first stage works at 224x224, about 16x the activations of the ImageNet ResNet-18 stem.
"""

import argparse
import datetime
import json
import math
import os
import platform
import sys
import time

import numpy as np

PROJECTORS = {"resnet18": "2048,2048,256", "resnet50": "2048,2048,2048", "tiny": "64,64,32"}
FIELDS = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes",
          "generated_code_size_in_bytes", "peak_memory_in_bytes")
GIB, MIB = 2.0 ** 30, 2.0 ** 20


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--encoder", default="resnet18", choices=sorted(PROJECTORS))
    p.add_argument("--encoder_width", type=int, default=0, help="Base width (0: the architecture's default).")
    p.add_argument("--image_size", type=int, default=224, help="Square image side in pixels.")
    p.add_argument("--channels", type=int, default=3, choices=(1, 3))
    p.add_argument("--batches", default="64,128,256,512", help="Batch sizes (images per step) to compile.")
    p.add_argument("--projector_dims", default="",
                   help="Projector sizes (default: 2048,2048,256 for resnet18, 2048,2048,2048 for resnet50).")
    p.add_argument("--method", default="simaffinity")
    p.add_argument("--optimizer", default="lars", choices=("lars", "sgd", "adamw"))
    p.add_argument("--precision", default="bfloat16", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--device_memory_gib", type=float, default=0.0,
                   help="Memory to fit the step in (0: the device's bytes_limit, else 80 GiB).")
    p.add_argument("--verify", action="store_true",
                   help="Run one real step at the predicted largest batch (a multiple of 32) and at 1.1x it.")
    p.add_argument("--order", default="spread", choices=("spread", "given"),
                   help="spread: smallest and largest batch first (a line from two points if time runs out).")
    p.add_argument("--autotune_level", type=int, default=-1,
                   help="XLA GPU autotuning level for the compiles (-1: XLA's default; 0 compiles faster, "
                        "with heuristic convolution algorithms and workspaces).")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="", help="Write the JSON here.")
    args = p.parse_args(argv)
    args.batch_list = sorted({int(b) for b in args.batches.split(",") if b.strip()})
    if not args.batch_list or min(args.batch_list) < 1:
        p.error(f"--batches: positive integers expected; received {args.batches!r}")
    args.projector_dims = args.projector_dims or PROJECTORS[args.encoder]
    return args


def spread(batches):
    """Smallest, largest, then the rest (ascending)."""
    if len(batches) <= 2:
        return list(batches)
    return [batches[0], batches[-1]] + list(batches[1:-1])


def memory_dict(compiled):
    m = compiled.memory_analysis()
    out = {}
    for k in FIELDS:
        v = getattr(m, k, None)
        if v is not None:
            out[k.replace("_size_in_bytes", "").replace("_in_bytes", "")] = int(v)
    out["total"] = out["argument"] + out["temp"] + out["output"] - out.get("alias", 0)
    return out


def fit_line(rows, limit=None):
    """Least squares ``total = a + b * batch``; None with fewer than two batches. With a ``limit``, over
    the batches whose total is within it when there are at least two (XLA's scheduler works to a memory
    limit, so steps larger than the device may not grow linearly), else over all."""
    pts = [(r["batch"], r["memory"]["total"]) for r in rows if "memory" in r]
    if len(pts) < 2:
        return None
    within = [p for p in pts if limit is None or p[1] <= limit]
    used = "batches within the limit" if len(within) >= 2 else "all batches"
    pts = within if len(within) >= 2 else pts
    x = np.array([p[0] for p in pts], np.float64)
    y = np.array([p[1] for p in pts], np.float64)
    A = np.stack([np.ones_like(x), x], 1)
    (a, b), *_ = np.linalg.lstsq(A, y, rcond=None)
    pred = a + b * x
    ss_res = float(((y - pred) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum())
    return {"a_bytes": float(a), "b_bytes_per_image": float(b), "a_gib": float(a) / GIB,
            "b_mib_per_image": float(b) / MIB, "points": len(pts), "batches": [p[0] for p in pts], "over": used,
            "r2": 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0,
            "max_abs_residual_mib": float(np.abs(y - pred).max()) / MIB}


def predict(fit, limit_bytes):
    if not fit or fit["b_bytes_per_image"] <= 0:
        return None
    batch = (limit_bytes - fit["a_bytes"]) / fit["b_bytes_per_image"]
    return int(math.floor(batch)) if batch >= 1 else 0


def device_limit(jax, override_gib):
    stats = {}
    try:
        stats = jax.devices()[0].memory_stats() or {}
    except Exception:  # not every platform reports it (CPU: None)
        pass
    if override_gib > 0:
        return int(override_gib * GIB), "--device_memory_gib", stats
    if stats.get("bytes_limit"):
        return int(stats["bytes_limit"]), "memory_stats()['bytes_limit']", stats
    return int(80 * GIB), "default 80 GiB (the device reports no bytes_limit)", stats


def is_oom(error):
    text = f"{type(error).__name__}: {error}"
    return any(s in text for s in ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory", "OOM", "Resource exhausted"))


class Probe:
    def __init__(self, args):
        self.args = args
        self.result = {}

    def save(self):
        if not self.args.out:
            return
        os.makedirs(os.path.dirname(os.path.abspath(self.args.out)), exist_ok=True)
        tmp = self.args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.result, f, indent=1, default=str)
        os.replace(tmp, self.args.out)

    def build(self):
        """The bench's training model (its absl flags set from ours) and its jitted step."""
        args = self.args
        from benchmarks import bench

        bench.define_flags()
        bench.FLAGS([
            "memory_probe", f"--encoder={args.encoder}", f"--encoder_width={args.encoder_width}",
            f"--projector_dims={args.projector_dims}", f"--objective={args.method}",
            f"--optimizer={args.optimizer}", f"--precision={args.precision}",
            f"--batch_size={max(args.batch_list)}", f"--seed={args.seed}"])
        shape = (args.image_size, args.image_size, args.channels)
        sample = bench.load_images("synthetic", shape, 64, args.seed)
        mean, std = bench.channel_stats(sample)
        t = time.perf_counter()
        cfg, model, _ = bench.build_training_model(shape, mean, std)
        self.stepper = bench.JaxStepper(model)
        self.shape = shape
        return cfg, model, time.perf_counter() - t

    def lower_compile(self, batch, state):
        import jax
        import jax.numpy as jnp

        data = jax.ShapeDtypeStruct((batch,) + self.shape, jnp.uint8)
        t = time.perf_counter()
        lowered = self.stepper.jitted.lower(state, data)
        lower_s = time.perf_counter() - t
        t = time.perf_counter()
        compiled = lowered.compile()
        return compiled, lower_s, time.perf_counter() - t

    def run(self):
        args = self.args
        if args.autotune_level >= 0:
            os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                       f" --xla_gpu_autotune_level={args.autotune_level}").strip()
        import jax
        import keras

        if keras.backend.backend() != "jax":
            sys.exit(f"memory_probe needs KERAS_BACKEND=jax (the backend is {keras.backend.backend()!r})")
        dev = jax.devices()[0]
        limit, limit_source, stats = device_limit(jax, args.device_memory_gib)
        self.result = {
            "environment": {"jax": jax.__version__, "keras": keras.__version__, "python": platform.python_version(),
                            "platform": dev.platform, "device": str(getattr(dev, "device_kind", dev)),
                            "devices": len(jax.devices()), "memory_stats_at_start": stats,
                            "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
                            "XLA_PYTHON_CLIENT_MEM_FRACTION": os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", ""),
                            "XLA_PYTHON_CLIENT_PREALLOCATE": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", ""),
                            "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
                            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                            "command": "python -m benchmarks.memory_probe " + " ".join(sys.argv[1:])},
            "config": {"encoder": args.encoder, "encoder_width": args.encoder_width,
                       "image_shape": [args.image_size, args.image_size, args.channels],
                       "projector_dims": args.projector_dims, "method": args.method, "optimizer": args.optimizer,
                       "precision": args.precision, "augment_on": "device", "data": "synthetic uint8",
                       "batches": args.batch_list, "autotune_level": args.autotune_level},
            "device_memory_limit_bytes": limit, "device_memory_limit_gib": limit / GIB,
            "device_memory_limit_source": limit_source,
            "total_definition": "argument + temp + output - alias (XLA buffer assignment of the compiled step)",
            "rows": [], "fit": None, "predicted_max_batch": None, "verify": None,
        }
        print(f"memory_probe: {args.encoder} {args.image_size}x{args.image_size}x{args.channels}, projector "
              f"{args.projector_dims}, {args.method}, {args.precision}, on {self.result['environment']['device']}; "
              f"limit {limit / GIB:.2f} GiB ({limit_source})", flush=True)
        self.save()
        cfg, model, build_s = self.build()
        params = int(sum(np.prod(v.shape) for v in model.trainable_variables))
        self.result["config"].update(model_params=params, build_s=build_s)
        print(f"  model: {params:,} trainable parameters, built in {build_s:.1f} s", flush=True)
        self.save()
        # Abstract state (shapes, dtypes, shardings): the compiles allocate nothing for it.
        abstract_state = jax.tree_util.tree_map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
            self.stepper.state)
        order = spread(args.batch_list) if args.order == "spread" else list(args.batch_list)
        for batch in order:
            row = {"batch": batch}
            try:
                compiled, lower_s, compile_s = self.lower_compile(batch, abstract_state)
                row.update(lower_s=lower_s, compile_s=compile_s, memory=memory_dict(compiled))
                del compiled
            except Exception as e:  # e.g. a compile that runs out of memory while autotuning
                row["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            self.result["rows"].append(row)
            self.result["rows"].sort(key=lambda r: r["batch"])
            self._update_fit(limit)
            self.save()
            m = row.get("memory")
            print(f"  batch {batch:>5}: " + (f"total {m['total'] / GIB:7.2f} GiB (temp {m['temp'] / GIB:.2f}, "
                                             f"arguments {m['argument'] / GIB:.2f}), compile {row['compile_s']:.1f} s"
                                             if m else row["error"]), flush=True)
        if args.verify:
            self.verify(limit)
        self.print_table()
        if args.out:
            print(f"wrote {args.out}")
        return self.result

    def _update_fit(self, limit):
        fit = fit_line(self.result["rows"], limit)
        self.result["fit"] = fit
        best = predict(fit, limit)
        self.result["predicted_max_batch"] = best
        self.result["predicted_max_batch_multiple_of_32"] = (best // 32) * 32 if best is not None else None

    def verify(self, limit):
        """One real step at the predicted largest batch (a multiple of 32) and at 1.1x it."""
        import jax

        best = self.result.get("predicted_max_batch_multiple_of_32")
        if not best:
            self.result["verify"] = {"skipped": f"no prediction (predicted largest batch: "
                                                f"{self.result.get('predicted_max_batch')})"}
            self.save()
            print("  verify: skipped (no prediction of at least 32 images)")
            return
        larger = max(best + 32, int(round(1.1 * best / 32)) * 32)
        host_state = jax.device_get(self.stepper.state)
        shardings = jax.tree_util.tree_map(lambda x: x.sharding, self.stepper.state)
        rng = np.random.default_rng(self.args.seed)
        out = {"batches": [best, larger], "note": "peak_bytes_in_use is the process's peak so far"}
        self.result["verify"] = out
        for batch in (best, larger):
            entry = {"batch": batch, "predicted_total_gib": (self.result["fit"]["a_bytes"] +
                                                            self.result["fit"]["b_bytes_per_image"] * batch) / GIB}
            state = data = logs = None
            try:
                state = jax.device_put(host_state, shardings)
                data = jax.device_put(rng.integers(0, 256, (batch,) + self.shape, dtype=np.uint8))
                t = time.perf_counter()
                compiled = self.stepper.jitted.lower(state, data).compile()
                entry["compile_s"] = time.perf_counter() - t
                try:
                    entry["memory"] = memory_dict(compiled)
                except Exception:
                    pass
                t = time.perf_counter()
                logs, state = compiled(state, data)
                jax.block_until_ready(state)
                entry["step_s"] = time.perf_counter() - t
                entry["loss"] = float(np.asarray(logs["loss"]))
                entry["status"] = "ok"
            except Exception as e:
                entry["status"] = "oom" if is_oom(e) else "error"
                entry["error"] = f"{type(e).__name__}: {str(e)[:600]}"
            del state, data, logs
            try:
                stats = jax.devices()[0].memory_stats() or {}
            except Exception:
                stats = {}
            entry["peak_bytes_in_use"] = stats.get("peak_bytes_in_use")
            entry["bytes_in_use_after"] = stats.get("bytes_in_use")
            out[str(batch)] = entry
            self.save()
            peak = entry["peak_bytes_in_use"]
            print(f"  verify batch {batch}: {entry['status']}"
                  + (f", peak {peak / GIB:.2f} GiB" if peak else "")
                  + (f" ({entry['error'][:160]})" if "error" in entry else ""), flush=True)

    def print_table(self):
        r = self.result
        print(f"\nmemory of the compiled train step | {r['config']['encoder']} {r['config']['image_shape']} | "
              f"{r['environment']['device']} | GiB")
        head = f"{'batch':>6} {'argument':>9} {'output':>8} {'alias':>8} {'temp':>8} {'code':>7} {'total':>8} {'compile s':>9}"
        print(head)
        print("-" * len(head))
        for row in r["rows"]:
            m = row.get("memory")
            if not m:
                print(f"{row['batch']:>6} {row.get('error', '')[:80]}")
                continue
            print(f"{row['batch']:>6} {m['argument'] / GIB:>9.3f} {m['output'] / GIB:>8.3f} {m.get('alias', 0) / GIB:>8.3f} "
                  f"{m['temp'] / GIB:>8.3f} {m.get('generated_code', 0) / GIB:>7.3f} {m['total'] / GIB:>8.3f} "
                  f"{row['compile_s']:>9.1f}")
        fit = r["fit"]
        if fit:
            print(f"fit: total = {fit['a_gib']:.3f} GiB + {fit['b_mib_per_image']:.2f} MiB x batch "
                  f"(R^2 {fit['r2']:.5f}, batches {fit['batches']}); limit {r['device_memory_limit_gib']:.2f} GiB "
                  f"({r['device_memory_limit_source']}) -> largest batch {r['predicted_max_batch']} "
                  f"({r['predicted_max_batch_multiple_of_32']} as a multiple of 32)")
        v = r.get("verify") or {}
        for key in [k for k in v if k.isdigit()]:
            e = v[key]
            peak = e.get("peak_bytes_in_use")
            print(f"verify batch {key}: {e['status']}" + (f", peak_bytes_in_use {peak / GIB:.2f} GiB" if peak else "")
                  + f", predicted total {e['predicted_total_gib']:.2f} GiB")


def main(argv=None):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    args = parse_args(argv)
    return Probe(args).run()


if __name__ == "__main__":
    main()
