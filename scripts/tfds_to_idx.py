"""Fallback for machines without apt: fetch Fashion-MNIST with TFDS and write Keras's IDX files."""

import gzip
import os
import struct
import sys

import numpy as np
import tensorflow_datasets as tfds


def write_idx(path, array):
    array = np.ascontiguousarray(array, dtype=np.uint8)
    code = 0x0801 if array.ndim == 1 else 0x0803
    with gzip.open(path, "wb") as f:
        f.write(struct.pack(">I", code) + b"".join(struct.pack(">I", d) for d in array.shape))
        f.write(array.tobytes())


def main(dest):
    os.makedirs(dest, exist_ok=True)
    for split, prefix in (("train", "train"), ("test", "t10k")):
        images, labels = tfds.as_numpy(tfds.load("fashion_mnist", split=split, batch_size=-1, as_supervised=True))
        write_idx(os.path.join(dest, f"{prefix}-images-idx3-ubyte.gz"), images[..., 0])
        write_idx(os.path.join(dest, f"{prefix}-labels-idx1-ubyte.gz"), labels)


if __name__ == "__main__":
    main(sys.argv[1])
