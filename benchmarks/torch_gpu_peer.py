"""The strongest ordinary PyTorch set-up, as the train CLI's peer: a whole Fashion-MNIST run on a GPU.

What a careful PyTorch user writes today (as kornia / DALI users do): the uint8 images resident on
the GPU, per-sample augmentation on whole batches on the GPU, bf16 autocast, channels_last,
cudnn.benchmark, and the same model and objective as ``configs/paper/fashion_mnist_simaffinity.flags``:

* ResNet-18 with the CIFAR stem (3×3 conv, stride 1, no max-pool), projector 2048-2048-256
  (Linear-BN-ReLU ×2, Linear-BN without affine), SimAffinity (cross-entropy over the rows of
  ``n(z1) n(z2)ᵀ / τ`` plus ``γ‖A − Aᵀ‖_F``, τ 0.5, γ 0.01), batch 512, SGD with momentum 0.9 and
  a linear warm-up + cosine learning rate (LARS's extra per-layer norms are a small share of a step);
* views: RandomResizedCrop (scale 0.2–1, ratio 3/4–4/3) and horizontal flip as one batched
  ``affine_grid`` + ``grid_sample``; colour jitter with p 0.8 (brightness and contrast 0.4; saturation
  and hue do nothing on grey images) and grayscale p 0.2 (a no-op on grey) — the recipe of
  ``uniclr_tf.augment`` for 28-px images (no blur);
* weighted kNN (k 200, T 0.1) on the GPU on the 60k training bank every ``--knn_every`` epochs.

Reports the wall-clock of the run, the training wall-clock from the end of the first epoch (kNN
excluded), images/s over it, and the kNN accuracies.

    python benchmarks/torch_gpu_peer.py --epochs 100 --knn_every 25 --out peer.json

(The network is ``torch_peer``'s: ResNet-18 with the CIFAR stem and the 2048-2048-256 projector.)
"""

import argparse
import gzip
import json
import math
import os
import platform
import time

import numpy as np
import torch
import torch.nn.functional as F
import torchvision

try:  # the same network as the DataLoader peer (python -m benchmarks.torch_gpu_peer, or run from benchmarks/)
    from benchmarks.torch_peer import projector, resnet18_cifar
except ImportError:
    from torch_peer import projector, resnet18_cifar


def load_fashion_mnist(folder):
    def read(name, offset, shape):
        with gzip.open(os.path.join(folder, name), "rb") as f:
            return np.frombuffer(f.read(), np.uint8, offset=offset).reshape(shape)
    x = read("train-images-idx3-ubyte.gz", 16, (-1, 1, 28, 28))
    y = read("train-labels-idx1-ubyte.gz", 8, (-1,))
    xt = read("t10k-images-idx3-ubyte.gz", 16, (-1, 1, 28, 28))
    yt = read("t10k-labels-idx1-ubyte.gz", 8, (-1,))
    return x, y, xt, yt


def augment(x, mean, std, scale=(0.2, 1.0), ratio=(3 / 4, 4 / 3), jitter=0.4, p_jitter=0.8):
    """Per-sample views of a uint8 batch ``[B, C, H, W]`` on the GPU."""
    b, device = x.shape[0], x.device
    x = x.float() / 255.0
    area = torch.empty(b, device=device).uniform_(*scale)
    log_r = torch.empty(b, device=device).uniform_(math.log(ratio[0]), math.log(ratio[1]))
    r = torch.exp(log_r)
    w = torch.sqrt(area * r).clamp(max=1.0)
    h = torch.sqrt(area / r).clamp(max=1.0)
    cx = (torch.rand(b, device=device) * (1 - w) + w / 2) * 2 - 1
    cy = (torch.rand(b, device=device) * (1 - h) + h / 2) * 2 - 1
    flip = torch.where(torch.rand(b, device=device) < 0.5, -1.0, 1.0)
    theta = torch.zeros(b, 2, 3, device=device)
    theta[:, 0, 0], theta[:, 0, 2] = w * flip, cx
    theta[:, 1, 1], theta[:, 1, 2] = h, cy
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    x = F.grid_sample(x, grid, mode="bilinear", padding_mode="reflection", align_corners=False)
    apply = (torch.rand(b, 1, 1, 1, device=device) < p_jitter).float()
    brightness = torch.empty(b, 1, 1, 1, device=device).uniform_(1 - jitter, 1 + jitter)
    contrast = torch.empty(b, 1, 1, 1, device=device).uniform_(1 - jitter, 1 + jitter)
    jittered = (x * brightness).clamp(0, 1)
    mean_pix = jittered.mean(dim=(1, 2, 3), keepdim=True)
    jittered = ((jittered - mean_pix) * contrast + mean_pix).clamp(0, 1)
    x = apply * jittered + (1 - apply) * x
    return ((x - mean) / std).contiguous(memory_format=torch.channels_last)


def sim_affinity(z1, z2, tau=0.5, gamma=0.01):
    a = F.normalize(z1.float(), dim=1) @ F.normalize(z2.float(), dim=1).T / tau
    ce = F.cross_entropy(a, torch.arange(len(a), device=a.device))
    return ce + gamma * torch.linalg.norm(a - a.T)


@torch.no_grad()
def knn_eval(encoder, x, y, xt, yt, mean, std, k=200, t=0.1, batch=1024):
    encoder.eval()

    def feats(images):
        out = []
        for i in range(0, len(images), batch):
            v = ((images[i:i + batch].float() / 255.0 - mean) / std).contiguous(memory_format=torch.channels_last)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out.append(F.normalize(encoder(v).float(), dim=1))
        return torch.cat(out)

    bank, test = feats(x), feats(xt)
    correct = 0
    for i in range(0, len(test), batch):
        sim = test[i:i + batch] @ bank.T
        top, idx = sim.topk(k, dim=1)
        votes = torch.zeros(len(top), 10, device=sim.device)
        votes.scatter_add_(1, y[idx], torch.exp((top - 1) / t))
        correct += (votes.argmax(1) == yt[i:i + batch]).sum().item()
    encoder.train()
    return correct / len(test)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=os.path.expanduser("~/.keras/datasets/fashion-mnist"))
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--batch_size", type=int, default=512)
    p.add_argument("--knn_every", type=int, default=25)
    p.add_argument("--base_lr", type=float, default=0.06, help="lr = base * batch / 256")
    p.add_argument("--warmup_epochs", type=float, default=10)
    p.add_argument("--out", default="")
    args = p.parse_args()

    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dev = torch.device("cuda")
    x, y, xt, yt = load_fashion_mnist(args.data)
    x, y = torch.from_numpy(x.copy()).to(dev), torch.from_numpy(y.astype(np.int64)).to(dev)
    xt, yt = torch.from_numpy(xt.copy()).to(dev), torch.from_numpy(yt.astype(np.int64)).to(dev)
    mean, std = float(x.float().mean() / 255), float(x.float().std() / 255)

    encoder = resnet18_cifar(1).to(dev).to(memory_format=torch.channels_last)
    head = projector().to(dev)
    params = list(encoder.parameters()) + list(head.parameters())
    opt = torch.optim.SGD(params, lr=args.base_lr * args.batch_size / 256, momentum=0.9, weight_decay=5e-4,
                          foreach=True)
    steps = len(x) // args.batch_size
    total, warm = args.epochs * steps, int(args.warmup_epochs * steps)
    peak = args.base_lr * args.batch_size / 256
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: peak * (s / max(warm, 1) if s < warm else
                                              0.5 * (1 + math.cos(math.pi * (s - warm) / max(total - warm, 1)))) / peak)

    history, knn_seconds = [], 0.0
    torch.cuda.synchronize()
    start = time.perf_counter()
    for epoch in range(args.epochs):
        order = torch.randperm(len(x), device=dev)
        for s in range(steps):
            batch = x[order[s * args.batch_size:(s + 1) * args.batch_size]]
            v1, v2 = augment(batch, mean, std), augment(batch, mean, std)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                z = head(encoder(torch.cat([v1, v2])))
            z1, z2 = z.float().chunk(2)
            loss = sim_affinity(z1, z2)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
        entry = {"epoch": epoch + 1, "loss": float(loss)}  # float() synchronises once per epoch
        if args.knn_every and (epoch + 1) % args.knn_every == 0:
            t0 = time.perf_counter()
            entry["knn_top1"] = knn_eval(encoder, x, y, xt, yt, mean, std)
            entry["knn_seconds"] = time.perf_counter() - t0
            knn_seconds += entry["knn_seconds"]
        torch.cuda.synchronize()
        entry["wall_seconds"] = time.perf_counter() - start
        history.append(entry)
        print(json.dumps(entry), flush=True)
    wall = time.perf_counter() - start
    knn_after_first = sum(e.get("knn_seconds", 0.0) for e in history[1:])
    train_wall = history[-1]["wall_seconds"] - history[0]["wall_seconds"] - knn_after_first
    rate = (len(history) - 1) * steps * args.batch_size / train_wall
    result = {"peer": "torch_gpu_peer", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "wall_seconds": wall, "process_seconds": process_seconds(),
              "first_epoch_seconds": history[0]["wall_seconds"],
              "training_images_per_s": rate, "knn_seconds_total": knn_seconds,
              "final_knn_top1": next((e["knn_top1"] for e in reversed(history) if "knn_top1" in e), None),
              "epochs": args.epochs, "steps_per_epoch": steps, "batch_size": args.batch_size,
              "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "torchvision": torchvision.__version__, "python": platform.python_version(), "history": history}
    print(f"\ntorch GPU peer: {args.epochs} epochs in {wall:.1f} s (first epoch {history[0]['wall_seconds']:.1f} s, "
          f"kNN {knn_seconds:.1f} s), {rate:,.0f} images/s after epoch 1, final kNN top-1 {result['final_knn_top1']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


def process_seconds():
    """Seconds since this process started (Linux: its start in /proc; elsewhere None): the run's
    wall clock with the interpreter's start, the imports and the data, as the CLI's is timed."""
    try:
        with open("/proc/self/stat") as f:
            started_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return uptime - started_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


if __name__ == "__main__":
    main()
