#!/usr/bin/env python3
"""tests/kernels/ref_mops.py: numpy references for the trickier model ops.

Usage: ref_mops.py OP TEST_BINARY
Writes fresh random inputs and the numpy-computed expected outputs of OP to a
temporary golden file (format: "name count" then the values), then runs
`TEST_BINARY FILE`, which runs the C reference on the inputs and compares.
The numpy code is written from dsv4.md (sections cited per op), independently
of the C code. Exit status is the binary's.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np


def put(f, name, arr):
    arr = np.asarray(arr, dtype=np.float64).ravel()
    f.write(f"{name} {arr.size}\n")
    f.write(" ".join(repr(float(v)) for v in arr))
    f.write("\n")


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def hc(f, rng):
    """dsv4.md §3.2 steps 2-8: split of the prenorm mixes, col-norm-first Sinkhorn."""
    n, iters, D = 4, 20, 64
    k = n * D
    T = 7
    mix = rng.uniform(-20, 20, size=(T, (2 + n) * n)).astype(np.float32)
    sq = rng.uniform(1, 2000, size=(T,)).astype(np.float32)
    scale = rng.uniform(0.1, 2.0, size=(3,)).astype(np.float32)
    base = rng.uniform(-1, 1, size=((2 + n) * n,)).astype(np.float32)
    eps = 1e-6
    m = mix.astype(np.float64) / np.sqrt(sq.astype(np.float64)[:, None] / k + 1e-6)
    pre = sigmoid(scale[0] * m[:, :n] + base[:n]) + eps
    post = 2 * sigmoid(scale[1] * m[:, n:2 * n] + base[n:2 * n])
    logits = (scale[2] * m[:, 2 * n:] + base[2 * n:]).reshape(T, n, n)
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p = e / e.sum(axis=-1, keepdims=True) + eps
    p = p / (p.sum(axis=-2, keepdims=True) + eps)
    for _ in range(iters - 1):
        p = p / (p.sum(axis=-1, keepdims=True) + eps)
        p = p / (p.sum(axis=-2, keepdims=True) + eps)
    for name, v in [("n", n), ("iters", iters), ("k", k), ("mix", mix), ("sqr_sum", sq),
                    ("scale", scale), ("base", base), ("pre", pre), ("post", post), ("comb", p)]:
        put(f, name, v)


OPS = {"hc": hc}


def main():
    op, binary = sys.argv[1], sys.argv[2]
    seed = int(os.environ.get("DSV4_TEST_SEED", np.random.SeedSequence().entropy % (1 << 63)))
    print(f"ref_mops {op}: seed {seed}", file=sys.stderr)
    rng = np.random.default_rng(seed)
    with tempfile.NamedTemporaryFile("w", suffix=".golden", delete=False) as f:
        OPS[op](f, rng)
        path = f.name
    try:
        r = subprocess.run([binary, path])
    finally:
        os.unlink(path)
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())
