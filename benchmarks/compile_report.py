r"""Where a JAX run's compile time goes, from a log written with ``JAX_LOG_COMPILES=1``.

    JAX_LOG_COMPILES=1 KERAS_BACKEND=jax python -m uniclr_tf.train ... > run.log 2>&1
    python benchmarks/compile_report.py run.log [--json=OUT.json] [--top=15]

JAX logs one line per stage of every compilation: tracing (Python to jaxpr), lowering (jaxpr to
MLIR) and the XLA compilation itself. This sums each stage per compiled function, splits the
functions into the model build (before fit's "Epoch 1/") and the fit, and into *named* ones (a ``jax.jit`` of our code: the train step, the kNN features, the backup
pack) and *op-by-op* ones (a single ``keras.ops`` / ``jax.numpy`` call run outside any jit, which
JAX compiles on its own: ``jit(multiply)``, ``jit(_reduce_sum)``), and prints a table of the
costliest. Persistent-cache hits show as compilations of a few milliseconds.
"""

import argparse
import collections
import json
import re
import sys

STAGES = {
    "Finished tracing": "trace",
    "Finished jaxpr to MLIR module conversion": "lower",
    "Finished XLA compilation of": "compile",
}
LINE = re.compile(r"(Finished tracing|Finished jaxpr to MLIR module conversion|Finished XLA compilation of) "
                  r"(?:jit\((?P<name>[^)]*)\)|(?P<other>\S+)).* in (?P<seconds>[0-9.eE+-]+) sec")
# The train CLI prints "Epoch 1/N" when fit starts: compilations before it belong to the model build.
FIT_START = re.compile(r"^Epoch 1/")
# op-by-op compilations are named after the jax.numpy / lax / random / nn function that ran outside a jit
# (``jit(_reduce_sum)``); our own jitted functions after their Python function (``jit(train_step)``)
PRIMITIVES = {"reduce_sum", "reduce_max", "reduce_min", "one_hot", "uniform", "truncated_normal", "normal",
              "where", "take", "mean", "pad", "flip", "einsum", "broadcast_in_dim", "convert_element_type",
              "dynamic_slice", "concatenate", "true_divide", "multiply", "add", "subtract", "matmul", "transpose"}


def _primitive(name):
    bare = name.lstrip("_")
    if bare in PRIMITIVES:
        return True
    try:
        import jax
        import jax.numpy as jnp
        return any(hasattr(module, bare) for module in (jnp, jax.lax, jax.random, jax.nn))
    except ImportError:
        return False


def parse(lines):
    """``{(phase, name): {trace, lower, compile, count}}``, phase ``build`` (before fit) or ``fit``."""
    per = collections.defaultdict(lambda: {"trace": 0.0, "lower": 0.0, "compile": 0.0, "count": 0})
    phase = "build"
    for line in lines:
        if FIT_START.match(line):
            phase = "fit"
        match = LINE.search(line)
        if not match:
            continue
        stage = STAGES[match.group(1)]
        name = match.group("name") or match.group("other")
        entry = per[(phase, name)]
        entry[stage] += float(match.group("seconds"))
        if stage == "compile":
            entry["count"] += 1
    return dict(per)


def kind(name):
    return "op-by-op" if _primitive(name) else "named"


def report(per, top=15):
    rows = sorted(per.items(), key=lambda item: -(item[1]["compile"] + item[1]["lower"] + item[1]["trace"]))
    totals = collections.defaultdict(lambda: {"trace": 0.0, "lower": 0.0, "compile": 0.0, "count": 0})
    for (phase, name), entry in per.items():
        for key in ("trace", "lower", "compile", "count"):
            totals[f"{phase}, {kind(name)}"][key] += entry[key]
    return {
        "totals": {k: {s: round(v, 3) for s, v in t.items()} for k, t in totals.items()},
        "all_seconds": round(sum(t["trace"] + t["lower"] + t["compile"] for t in totals.values()), 3),
        "functions": [{"phase": p, "name": n, "kind": kind(n), **{s: round(v, 3) for s, v in e.items()}}
                      for (p, n), e in rows[:top]],
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log")
    parser.add_argument("--json", default=None)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)
    with open(args.log, errors="replace") as f:
        result = report(parse(f), args.top)
    result["log"] = args.log
    print(f"{args.log}: {result['all_seconds']:.1f} s in tracing + lowering + XLA compilation")
    print("| phase, kind | compilations | trace s | lower s | compile s |\n|---|---|---|---|---|")
    for name, t in sorted(result["totals"].items()):
        print(f"| {name} | {t['count']} | {t['trace']:.2f} | {t['lower']:.2f} | {t['compile']:.2f} |")
    print("\n| phase | function | kind | compilations | trace s | lower s | compile s |\n|---|---|---|---|---|---|---|")
    for f in result["functions"]:
        print(f"| {f['phase']} | {f['name']} | {f['kind']} | {f['count']} | {f['trace']:.2f} | {f['lower']:.2f} "
              f"| {f['compile']:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
