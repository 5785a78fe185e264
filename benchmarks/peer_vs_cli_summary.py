"""Table and JSON of ``gpu/peer_vs_cli.sh``: the PyTorch GPU peer against the train CLI (cold and warm
compilation cache) from ``peer.json`` and the CLI runs' ``history.json``.

    python benchmarks/peer_vs_cli_summary.py --peer=peer.json --cold=cli-sgd-cold-history.json \
        --warm=cli-sgd-warm-history.json --steps_per_epoch=117 --batch_size=512 --out=summary.json
    python benchmarks/peer_vs_cli_summary.py --peer=peer.json --cli=table=sgd-table-history.json \
        --cli=no_table=sgd-notable-history.json        # any runs, by name (gpu/first_run.sh)

Training images/s: epochs 2..N over their wall-clock minus the kNN monitor's seconds (the peer's
``training_images_per_s`` is measured the same way); end to end: the training loop's wall-clock,
kNN evaluations and the first epoch's compile included (the CLI's ``wall_seconds`` of its last
epoch, counted from the callbacks' set-up; the peer's ``wall_seconds``).
"""

import argparse
import json
import statistics


def cli_numbers(path, steps, batch):
    with open(path) as f:
        h = json.load(f)
    knn_after = sum(e.get("knn_seconds") or 0.0 for e in h[1:])
    train_wall = h[-1]["wall_seconds"] - h[0]["wall_seconds"] - knn_after
    step_seconds = [e["step_seconds"] for e in h]
    return {"wall_seconds": h[-1]["wall_seconds"], "first_epoch_seconds": h[0]["wall_seconds"],
            "compile_seconds_estimate": step_seconds[0] - statistics.median(step_seconds[1:]),
            "knn_seconds_total": sum(e.get("knn_seconds") or 0.0 for e in h),
            "training_images_per_s": (len(h) - 1) * steps * batch / train_wall,
            "final_knn_top1": h[-1].get("knn_top1"), "epochs": len(h)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--peer", required=True)
    p.add_argument("--cold", default="", help="history.json of the CLI run with an empty compilation cache")
    p.add_argument("--warm", default="", help="history.json of the CLI run with the cache filled")
    p.add_argument("--cli", action="append", default=[], metavar="NAME=HISTORY",
                   help="another CLI run's history.json, shown as cli_NAME (repeatable)")
    p.add_argument("--steps_per_epoch", type=int, default=117)
    p.add_argument("--batch_size", type=int, default=512)
    p.add_argument("--out", default="")
    args = p.parse_args()
    with open(args.peer) as f:
        peer = json.load(f)
    bad = [c for c in args.cli if "=" not in c or not all(c.split("=", 1))]
    if bad:
        p.error(f"--cli={bad[0]}: expected NAME=HISTORY")
    runs = [(n, h) for n, h in [("cli_cold_cache", args.cold), ("cli_warm_cache", args.warm)] if h]
    runs += [("cli_" + c.split("=", 1)[0], c.split("=", 1)[1]) for c in args.cli]
    if not runs:
        p.error("give the CLI runs: --cold/--warm and/or --cli=NAME=HISTORY")
    rows = {"peer": {k: peer[k] for k in ("wall_seconds", "first_epoch_seconds", "knn_seconds_total",
                                          "training_images_per_s", "final_knn_top1", "epochs")}}
    for name, history in runs:
        rows[name] = cli_numbers(history, args.steps_per_epoch, args.batch_size)
    for name, _ in runs:
        rows[name]["speedup_end_to_end"] = peer["wall_seconds"] / rows[name]["wall_seconds"]
        rows[name]["speedup_training_images_per_s"] = rows[name]["training_images_per_s"] / peer["training_images_per_s"]
    print(f"{'':<20} {'wall s':>8} {'1st epoch s':>12} {'kNN s':>7} {'train img/s':>12} {'kNN top-1':>10} "
          f"{'x peer (wall)':>14} {'x peer (img/s)':>15}")
    for name, r in rows.items():
        print(f"{name:<20} {r['wall_seconds']:>8.1f} {r['first_epoch_seconds']:>12.1f} {r['knn_seconds_total']:>7.1f} "
              f"{r['training_images_per_s']:>12,.0f} {r['final_knn_top1'] or 0:>10.4f} "
              f"{r.get('speedup_end_to_end', 1.0):>14.2f} {r.get('speedup_training_images_per_s', 1.0):>15.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({**rows, "gpu": peer.get("gpu")}, f, indent=2)


if __name__ == "__main__":
    main()
