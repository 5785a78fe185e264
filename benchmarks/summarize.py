"""Prints the Markdown tables of docs/results/speed.md from the JSON files in benchmarks/results/speed/.

    python benchmarks/summarize.py            (no Keras, TensorFlow or JAX needed)
"""

import glob
import json
import os

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "speed")


def load(name):
    path = os.path.join(HERE, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def fmt(x, digits=0):
    return "-" if x is None else f"{x:,.{digits}f}"


def gpu_table(card):
    print(f"\n#### {card.upper()}\n")
    print("| shape | (a) model only | (c) device aug | (c) uint8 on device | (b) host aug | host aug pipeline alone "
          "| c / a | PyTorch peer end-to-end | peer model only | peer loader alone | ours (c) / peer | JSON |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for shape in ("32x32x3", "28x28x1"):
        ours = load(f"{card}-bench-jax-{shape}.json")
        peer = load(f"{card}-torch-peer-{shape}.json")
        if not ours:
            continue
        a = ours["a_model_only"]["images_per_s"]
        c = ours["c_device_aug"]["images_per_s"]
        cr = ours.get("c_device_aug_resident", {}).get("images_per_s")
        b = ours["b_host_aug"]["images_per_s"]
        bp = ours["b_host_aug"]["pipeline"]["images_per_s"]
        pe = peer["end_to_end"]["images_per_s"] if peer else None
        pm = peer["model_only"]["images_per_s"] if peer else None
        pl = peer["loader_only"]["images_per_s"] if peer else None
        print(f"| {shape} | {fmt(a)} | {fmt(c)} | {fmt(cr)} | {fmt(b)} | {fmt(bp)} | {c / a:.3f} | {fmt(pe)} | {fmt(pm)} "
              f"| {fmt(pl)} | {c / pe:.2f}× | `{card}-bench-jax-{shape}.json`, `{card}-torch-peer-{shape}.json` |")


def step_details(card):
    print(f"\n{card.upper()} step details (ms per step, input wait, host CPU per step, compile, memory):\n")
    print("| shape | section | ms/step | images/s min–max | input wait | host CPU ms/step | compile s | device peak MiB | step temp MiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for shape in ("32x32x3", "28x28x1"):
        r = load(f"{card}-bench-jax-{shape}.json")
        if not r:
            continue
        mem = r["memory"]
        peak = mem.get("device_peak_bytes") or 0
        temp = mem["compiled_step"].get("uint8", {}).get("temp_size_in_bytes", 0)
        for key in ("a_model_only", "c_device_aug", "c_device_aug_resident", "b_host_aug"):
            s = r.get(key)
            if not s:
                continue
            wait = f"{100 * s['input_wait_frac']:.1f} %" if "input_wait_frac" in s else "-"
            print(f"| {shape} | {key} | {s['ms_per_step']:.2f} | {fmt(s['images_per_s_min'])}–{fmt(s['images_per_s_max'])} "
                  f"| {wait} | {s['host_cpu_ms_per_step']:.1f} | {fmt(s.get('compile_s'), 1)} | {peak / 2**20:.0f} | {temp / 2**20:.0f} |")


def objective_table(name):
    r = load(name)
    if not r or "d_objective" not in r:
        return
    step = r.get("a_model_only", {}).get("ms_per_step")
    print(f"\n(d) from `{name}` ({r['environment']['device']}; {r['d_objective'][0]['dtype']} inputs, "
          f"forward + backward, ms per call" + (f"; model step {step:.2f} ms" if step else "") + ")\n")
    print("| objective | variant | N | D | ms | % of the model step | value |")
    print("|---|---|---|---|---|---|---|")
    for row in r["d_objective"]:
        frac = f"{100 * row['frac_of_model_step']:.1f} %" if "frac_of_model_step" in row else "-"
        print(f"| {row['objective']} | {row['variant']} | {row['n']} | {row['d']} | {row['ms']:.3f} | {frac} | {row['value']:.4g} |")


def d2048_table():
    rows = [("full whitening (paper)", "h200-bench-jax-d2048-g1-nosg.json"),
            ("stop_gradient_cov", "h200-bench-jax-d2048-g1-sg.json"),
            ("groups=8 (8 × 256)", "h200-bench-jax-d2048-g8-nosg.json")]
    base = load("h200-bench-jax-32x32x3.json")
    print("\nModel step with a 2048-2048-2048 projector (SimTrace, D = 2048), H200, 32x32x3, batch 512, bf16:\n")
    print("| whitening | images/s | ms/step | JSON |")
    print("|---|---|---|---|")
    if base:
        a = base["a_model_only"]
        print(f"| (reference: 2048-2048-256 projector, D = 256, full whitening) | {fmt(a['images_per_s'])} "
              f"| {a['ms_per_step']:.2f} | `h200-bench-jax-32x32x3.json` |")
    for label, name in rows:
        r = load(name)
        if r:
            a = r["a_model_only"]
            print(f"| {label} | {fmt(a['images_per_s'])} | {a['ms_per_step']:.2f} | `{name}` |")


def cpu_table():
    print("\nCPU (TensorFlow backend, float32, 2 cores):\n")
    print("| model | shape | section | images/s | ms/step | input wait | host CPU ms/step | load avg after | JSON |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in sorted(glob.glob(os.path.join(HERE, "cpu-tf-*.json"))):
        r = load(os.path.basename(name))
        cfg = r["config"]
        model = f"{cfg['encoder']} b{cfg['batch_size']}"
        shape = "x".join(str(v) for v in cfg["image_shape"])
        for key in ("a_model_only", "c_device_aug", "b_host_aug"):
            s = r.get(key)
            if not s:
                continue
            wait = f"{100 * s['input_wait_frac']:.1f} %" if "input_wait_frac" in s else "-"
            load_ = f"{s['loadavg_1m_after']:.1f}" if "loadavg_1m_after" in s else "-"
            print(f"| {model} | {shape} | {key} | {fmt(s['images_per_s'], 1)} | {s['ms_per_step']:.1f} | {wait} "
                  f"| {s['host_cpu_ms_per_step']:.1f} | {load_} | `{os.path.basename(name)}` |")
            if key == "b_host_aug":
                p = s["pipeline"]
                print(f"| {model} | {shape} | host pipeline alone (tf.data + ViewAugmenter) | {fmt(p['images_per_s'], 1)} "
                      f"| {p['ms_per_batch']:.1f} | - | - | - | `{os.path.basename(name)}` |")


if __name__ == "__main__":
    print("### GPU: images per second (median of 5 × 20 steps)")
    for card in ("h200", "h100"):
        gpu_table(card)
    for card in ("h200", "h100"):
        step_details(card)
    d2048_table()
    objective_table("h200-bench-jax-32x32x3.json")
    objective_table("h100-bench-jax-32x32x3.json")
    cpu_table()
    objective_table("cpu-tf-quickstart-28x28x1.json")
