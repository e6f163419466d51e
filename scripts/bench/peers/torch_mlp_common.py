"""What the PyTorch peers of the Fashion-MNIST MLP share: the data, read as
../shared/peers/torch_fashion_mnist.py reads it (Debian's dataset-fashion-mnist, pixels
/ 255), and the model, examples/fashion_mnist's MLP (Linears with a ReLU between)."""
import gzip
import struct

import numpy as np
import torch
import torch.nn as nn

DATA = "/usr/share/datasets/fashion-mnist"


def idx(path):
    """An IDX file's array."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(split, limit=0):
    """(images as float32 rows of 784, labels) of "train" or "t10k"; `limit`: only the first N."""
    x = idx(f"{DATA}/{split}-images-idx3-ubyte.gz").reshape(-1, 784)
    y = idx(f"{DATA}/{split}-labels-idx1-ubyte.gz").astype(np.int64)
    if limit:
        x, y = x[:limit], y[:limit]
    x = x.astype(np.float32)
    x /= 255.0  # in place: the same values as "/ 255.0" without a second 188 MB copy in peak RSS
    return torch.from_numpy(x), torch.from_numpy(y)


def mlp(dims):
    """nn.Sequential of Linear(dims[i], dims[i+1]) with a ReLU after each but the last."""
    layers = []
    for i in range(len(dims) - 1):
        layers.append(nn.Linear(dims[i], dims[i + 1]))
        if i < len(dims) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)
