"""PyTorch peer of the bench's model step (section a) at ImageNet shapes: ResNet-50, 224 px, two views.

A plain PyTorch script of the same model and loss as

    KERAS_BACKEND=jax python -m benchmarks.bench --sections=a --encoder=resnet50 --image_shape=224,224,3 \\
        --data=synthetic --objective=simaffinity --optimizer=sgd --batch_size=128

* torchvision's ResNet-50 (the ImageNet stem, random init, no classifier: 2048-d pooled features), the
  same network as ``keras.applications.ResNet50`` up to the padding of its strided convolutions;
* the projector of ``uniclr_tf.nets.heads.projector``: Linear (no bias)-BN-ReLU, Linear (no bias)-BN-ReLU,
  Linear-BN without affine, 2048-2048-256;
* SimAffinity (``objectives.sim_affinity_loss``): the mean cross-entropy of the rows of
  ``A = n(z1) n(z2)ᵀ / τ`` against their diagonal, plus ``γ‖A − Aᵀ‖_F`` (τ 0.2, γ 0.01), in float32;
* SGD with momentum 0.9 and weight decay 5e-4 in the gradient (``--optimizer=sgd``);
* bf16 autocast, channels_last, cudnn.benchmark; ``--compile`` wraps the model and loss in
  ``torch.compile`` (default mode; ``--compile_mode`` for others).

The views are device-resident random images (two ``[B, 3, 224, 224]`` tensors, a few batches rotated),
so only the training step is timed: warm-up (and the compile), then ``--reps`` repetitions of
``--steps`` steps, each closed by ``torch.cuda.synchronize``; the median images/s (an image = one
sample of two views) is reported with min and max. ``flops_per_image`` is PyTorch's own count
(``torch.utils.flop_counter``) of one forward and backward of the eager step divided by the batch;
``mfu`` is images/s × that over ``--peak_tflops`` (default: the dense bf16 peak of an H100 / H200).

    python benchmarks/torch_r50_peer.py --batch_size 128 --compile --out torch-r50.json [--profile trace.json]
"""

import argparse
import datetime
import json
import platform
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

PEAK_BF16_TFLOPS = {"H100": 989.4, "H200": 989.4}  # dense, NVIDIA's data sheets (as benchmarks/bench.py)


class Projector(nn.Sequential):
    def __init__(self, dims=(2048, 2048, 256), input_dim=2048):
        layers, width = [], input_dim
        for d in dims[:-1]:
            layers += [nn.Linear(width, d, bias=False), nn.BatchNorm1d(d, momentum=0.1, eps=1e-5), nn.ReLU()]
            width = d
        layers += [nn.Linear(width, dims[-1]), nn.BatchNorm1d(dims[-1], affine=False, momentum=0.1, eps=1e-5)]
        super().__init__(*layers)


class TwoViewModel(nn.Module):
    """Encoder + projector on the two views (one forward over both, as the Keras model does), and the loss."""

    def __init__(self, temperature=0.2, gamma=0.01):
        super().__init__()
        import torchvision
        self.encoder = torchvision.models.resnet50(weights=None)
        self.encoder.fc = nn.Identity()
        self.projector = Projector()
        self.temperature, self.gamma = temperature, gamma

    def forward(self, view1, view2):
        z = self.projector(self.encoder(torch.cat([view1, view2])))
        z1, z2 = (F.normalize(t.float(), dim=1) for t in z.chunk(2))
        a = z1 @ z2.T / self.temperature
        labels = torch.arange(a.shape[0], device=a.device)
        return F.cross_entropy(a, labels) + self.gamma * torch.linalg.matrix_norm(a - a.T)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch_size", type=int, default=128, help="images per step (each gives two views)")
    p.add_argument("--image_size", type=int, default=224)
    p.add_argument("--steps", type=int, default=20, help="steps per timed repetition")
    p.add_argument("--reps", type=int, default=5, help="timed repetitions (the median is reported)")
    p.add_argument("--warmup_steps", type=int, default=5, help="untimed steps (after the compile)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model and loss")
    p.add_argument("--compile_mode", default=None, help="torch.compile mode (default, max-autotune, ...)")
    p.add_argument("--precision", choices=["bfloat16", "float32"], default="bfloat16")
    p.add_argument("--peak_tflops", type=float, default=0.0, help="for the MFU (0: an H100 / H200's dense bf16 peak)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", default="", help="after the timed steps, trace 5 more with torch.profiler into this "
                   "Chrome-trace JSON (`python -m benchmarks.report trace` reads it; steps 10 ms apart)")
    p.add_argument("--out", default="")
    args = p.parse_args(argv)

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    model = TwoViewModel().to(device).to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.06 * args.batch_size / 256, momentum=0.9,
                                weight_decay=5e-4)
    shape = (args.batch_size, 3, args.image_size, args.image_size)
    batches = [tuple(torch.randn(shape, device=device).contiguous(memory_format=torch.channels_last)
                     for _ in range(2)) for _ in range(3)]
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bfloat16")

    def step(forward, views):
        with autocast:
            loss = forward(*views)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss

    def sync():
        if on_gpu:
            torch.cuda.synchronize(device)

    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as counter:  # one eager forward + backward, before any compile
        with autocast:
            loss = model(*batches[0])
        loss.backward()
    optimizer.zero_grad(set_to_none=True)
    flops_per_image = counter.get_total_flops() / args.batch_size

    forward = torch.compile(model, mode=args.compile_mode) if args.compile else model
    t = time.perf_counter()
    step(forward, batches[0])
    sync()
    first_step_s = time.perf_counter() - t
    for i in range(args.warmup_steps):
        step(forward, batches[i % len(batches)])
    sync()
    rates = []
    for _ in range(args.reps):
        t = time.perf_counter()
        for i in range(args.steps):
            loss = step(forward, batches[i % len(batches)])
        sync()
        rates.append(args.steps * args.batch_size / (time.perf_counter() - t))
    final_loss = float(loss.detach())
    if args.profile:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for i in range(5):
                step(forward, batches[i % len(batches)])
                sync()
                time.sleep(0.01)  # an idle gap that separates the steps in the trace
        prof.export_chrome_trace(args.profile)

    name = torch.cuda.get_device_name(device) if on_gpu else platform.processor() or "cpu"
    peak = args.peak_tflops or next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), 0.0)
    images_per_s = statistics.median(rates)
    result = {
        "config": {k: v for k, v in vars(args).items() if k != "out"}, "date": datetime.date.today().isoformat(),
        "environment": {"device": name, "torch": torch.__version__, "python": platform.python_version()},
        "images_per_s": images_per_s, "images_per_s_min": min(rates), "images_per_s_max": max(rates),
        "ms_per_step": 1000 * args.batch_size / images_per_s, "first_step_s": first_step_s,
        "flops_per_image": flops_per_image, "final_loss": final_loss,
    }
    if peak:
        result.update(peak_tflops=peak, mfu=images_per_s * flops_per_image / (peak * 1e12))
    print(f"{'torch.compile' if args.compile else 'eager'} ResNet-50 {args.image_size} px, batch {args.batch_size} "
          f"on {name}: {images_per_s:.0f} images/s ({min(rates):.0f}-{max(rates):.0f}), "
          f"{flops_per_image / 1e9:.1f} GFLOP an image" + (f", MFU {result['mfu']:.3f}" if peak else ""), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
