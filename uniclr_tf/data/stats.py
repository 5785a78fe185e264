"""Per-channel mean and standard deviation of uint8 images, in [0, 1] units (NumPy, host side)."""

from __future__ import annotations

import numpy as np

_STATS_SAMPLE = 10_000       # images used for the per-channel mean / std of in-memory data


def _channel_stats(batches, channels):
    """Per-channel mean and std (in [0, 1] units) over an iterable of uint8 ``[n, H, W, C]``."""
    total = np.zeros(channels, np.float64)
    total_sq = np.zeros(channels, np.float64)
    count = 0
    for batch in batches:
        x = np.asarray(batch, np.float64).reshape(-1, channels) / 255.0
        total += x.sum(0)
        total_sq += np.square(x).sum(0)
        count += len(x)
    if count == 0:
        return (0.5,) * channels, (0.5,) * channels
    mean = total / count
    std = np.sqrt(np.maximum(total_sq / count - np.square(mean), 0.0))
    # A constant channel would divide by zero when normalising; floor at one grey level.
    return tuple(mean), tuple(np.maximum(std, 1.0 / 255.0))


def _array_stats(images):
    """Statistics of a strided sample of at most ``_STATS_SAMPLE`` in-memory images."""
    stride = max(1, len(images) // _STATS_SAMPLE)
    sample = images[::stride][:_STATS_SAMPLE]
    return _channel_stats((sample[i:i + 256] for i in range(0, len(sample), 256)), images.shape[-1])
