"""PyTorch peer of ``python -m benchmarks.bench``: SimCLR the way lightly / solo-learn users train it.

ResNet-18 from torchvision with the CIFAR stem (3×3 conv, stride 1, no max-pool), projector
2048-2048-256 (Linear-BN-ReLU, Linear-BN-ReLU, Linear-BN), NT-Xent (SimCLR) loss at τ = 0.5, SGD with
momentum, bf16 autocast, channels_last, cudnn.benchmark. Two views per image made by a
``DataLoader`` (``--workers`` processes, pinned memory, persistent workers) applying
torchvision.transforms.v2 to each uint8 image tensor: RandomResizedCrop(scale 0.2–1), horizontal
flip, ColorJitter(0.4, 0.4, 0.2, 0.1) with p 0.8, RandomGrayscale p 0.2, then float + Normalize —
the recipe of ``uniclr_tf.augment.ViewAugmenter`` for images of side ≤ 32 (no blur).

The images are the same as the bench's: Fashion-MNIST train images (28×28×1), zero-padded and
channel-repeated for a 32×32×3 shape, or synthetic uint8.

Measured (images per second, an image being one sample of two views; median of timed windows
after warm-up, each window closed by ``torch.cuda.synchronize``):

* ``model_only``: the training step on device-resident, already augmented views;
* ``loader_only``: the DataLoader alone (views reaching pinned host memory);
* ``end_to_end``: DataLoader + copy + training step, the usual training loop.

    python benchmarks/torch_peer.py --image_shape 32,32,3 --out peer.json
"""

import argparse
import datetime
import gzip
import json
import os
import platform
import statistics
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from torchvision.transforms import v2


def load_images(name, shape, num_images, seed=0):
    """The bench's images (see ``benchmarks.bench.load_images``), read without Keras."""
    h, w, c = shape
    if name == "synthetic":
        n = num_images or 10_000
        return np.random.default_rng(seed).integers(0, 256, (n, h, w, c), dtype=np.uint8)
    folder = os.path.expanduser(os.environ.get("FMNIST_DIR", "~/.keras/datasets/fashion-mnist"))
    with gzip.open(os.path.join(folder, "train-images-idx3-ubyte.gz"), "rb") as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28)
    if num_images:
        x = x[:num_images]
    top, left = (h - 28) // 2, (w - 28) // 2
    x = np.pad(x, ((0, 0), (top, h - 28 - top), (left, w - 28 - left)))[..., None]
    return np.ascontiguousarray(np.repeat(x, c, axis=-1)).astype(np.uint8)


class TwoViews(torch.utils.data.Dataset):
    """uint8 ``[N, H, W, C]`` images → two independently augmented float views per image."""

    def __init__(self, images, mean, std):
        self.images = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()  # N, C, H, W
        h, w = images.shape[1:3]
        self.transform = v2.Compose([
            v2.RandomResizedCrop((h, w), scale=(0.2, 1.0), antialias=True),
            v2.RandomHorizontalFlip(),
            v2.RandomApply([v2.ColorJitter(0.4, 0.4, 0.2, 0.1)], p=0.8),
            v2.RandomGrayscale(p=0.2),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(mean, std),
        ])

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        x = self.images[i]
        return self.transform(x), self.transform(x)


def resnet18_cifar(channels):
    net = torchvision.models.resnet18()
    net.conv1 = nn.Conv2d(channels, 64, 3, 1, 1, bias=False)
    net.maxpool = nn.Identity()
    net.fc = nn.Identity()
    return net


def projector(dims=(2048, 2048, 256), in_dim=512):
    layers, d = [], in_dim
    for i, out in enumerate(dims):
        layers.append(nn.Linear(d, out, bias=False))
        last = i == len(dims) - 1
        layers.append(nn.BatchNorm1d(out, affine=not last))
        if not last:
            layers.append(nn.ReLU(inplace=True))
        d = out
    return nn.Sequential(*layers)


def nt_xent(z1, z2, temperature=0.5):
    """SimCLR's NT-Xent over the 2N views (positives: the other view of the same image)."""
    z = F.normalize(torch.cat([z1, z2]).float(), dim=1)
    n = z1.shape[0]
    sim = z @ z.t() / temperature
    sim.fill_diagonal_(float("-inf"))
    targets = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)]).to(z.device)
    return F.cross_entropy(sim, targets)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="fashion_mnist", choices=["fashion_mnist", "synthetic"])
    p.add_argument("--image_shape", default="32,32,3")
    p.add_argument("--num_images", type=int, default=0)
    p.add_argument("--batch_size", type=int, default=512)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--warmup_steps", type=int, default=10)
    p.add_argument("--steps", type=int, default=20, help="steps per timed window")
    p.add_argument("--reps", type=int, default=5, help="timed windows")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--precision", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--compile", action="store_true", help="torch.compile the model (not the default of those libraries)")
    p.add_argument("--sections", default="model_only,loader_only,end_to_end")
    p.add_argument("--out", default="")
    args = p.parse_args()
    shape = tuple(int(v) for v in args.image_shape.split(","))
    sections = args.sections.split(",")
    dev = torch.device(args.device)
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)

    images = load_images(args.data, shape, args.num_images)
    x = images[:10_000].reshape(-1, shape[-1]).astype(np.float64) / 255.0
    mean, std = x.mean(0).tolist(), np.maximum(x.std(0), 1 / 255).tolist()
    dataset = TwoViews(images, mean, std)

    model = nn.Sequential(resnet18_cifar(shape[-1]), projector()).to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.06 * args.batch_size / 256, momentum=0.9, weight_decay=5e-4)
    step_model = torch.compile(model) if args.compile else model
    amp = dict(device_type=dev.type, dtype=torch.bfloat16, enabled=args.precision == "bfloat16")

    def step(v1, v2):
        v1 = v1.to(dev, non_blocking=True).contiguous(memory_format=torch.channels_last)
        v2 = v2.to(dev, non_blocking=True).contiguous(memory_format=torch.channels_last)
        with torch.autocast(**amp):
            z = step_model(torch.cat([v1, v2]))
            z1, z2 = z.chunk(2)
        loss = nt_xent(z1, z2)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def windows(next_batch, run):
        for _ in range(args.warmup_steps):
            run(*next_batch())
        sync()
        rates, loss = [], None
        for _ in range(args.reps):
            t = time.perf_counter()
            for _ in range(args.steps):
                loss = run(*next_batch())
            sync()
            rates.append(args.steps * args.batch_size / (time.perf_counter() - t))
        out = {"images_per_s": statistics.median(rates), "images_per_s_min": min(rates),
               "images_per_s_max": max(rates), "ms_per_step": 1e3 * args.batch_size / statistics.median(rates),
               "reps": args.reps, "steps_per_rep": args.steps, "batch_size": args.batch_size}
        if loss is not None and torch.is_tensor(loss):
            out["final_loss"] = float(loss)
        return out

    result = {"environment": {
        "torch": torch.__version__, "torchvision": torchvision.__version__, "python": platform.python_version(),
        "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu", "cpu_count": os.cpu_count(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": "python benchmarks/torch_peer.py " + " ".join(os.sys.argv[1:])},
        "config": dict(vars(args), image_shape=list(shape), num_images=len(images),
                       model="torchvision resnet18, CIFAR stem, projector 2048-2048-256, NT-Xent tau 0.5, SGD momentum",
                       transforms=str(dataset.transform))}
    print(f"torch peer: {result['environment']['device']}, {len(images)} images {shape}, batch {args.batch_size}, "
          f"{args.workers} workers", flush=True)

    if "model_only" in sections:
        g = torch.Generator().manual_seed(1)
        resident = []
        for _ in range(4):
            idx = torch.randint(len(dataset), (args.batch_size,), generator=g)
            pairs = [dataset[int(i)] for i in idx]
            resident.append(tuple(torch.stack([p[k] for p in pairs]).to(dev) for k in (0, 1)))
        it = iter(range(1 << 30))
        result["model_only"] = windows(lambda: resident[next(it) % len(resident)], step)
        print(f"model_only: {result['model_only']['images_per_s']:.0f} images/s", flush=True)

    if "loader_only" in sections or "end_to_end" in sections:
        loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True,
                                             num_workers=args.workers, pin_memory=dev.type == "cuda",
                                             persistent_workers=args.workers > 0)

        def forever():
            while True:
                yield from loader

        batches = forever()
        if "loader_only" in sections:
            result["loader_only"] = windows(lambda: next(batches), lambda v1, v2: None)
            print(f"loader_only: {result['loader_only']['images_per_s']:.0f} images/s", flush=True)
        if "end_to_end" in sections:
            result["end_to_end"] = windows(lambda: next(batches), step)
            print(f"end_to_end: {result['end_to_end']['images_per_s']:.0f} images/s", flush=True)
    if dev.type == "cuda":
        result["peak_memory_bytes"] = torch.cuda.max_memory_allocated()
    if "model_only" in result and "end_to_end" in result:
        result["end_to_end_over_model_only"] = result["end_to_end"]["images_per_s"] / result["model_only"]["images_per_s"]
    out = args.out or f"benchmarks/torch-peer-{'x'.join(map(str, shape))}.json"
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps({k: v for k, v in result.items() if k not in ("environment", "config")}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
