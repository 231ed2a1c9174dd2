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


def bf16(x):
    """Round float64 values to bf16 (via float32, round to nearest even)."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


def yarn_omega(rd, theta, factor, L0, beta_fast, beta_slow):
    """dsv4.md §3.4: θ^(-2i/rd), YaRN blend between floor(corr(β_fast)) and ceil(corr(β_slow))."""
    i = np.arange(rd // 2, dtype=np.float64)
    w = theta ** (-2.0 * i / rd)
    corr = lambda b: rd * np.log(L0 / (2 * np.pi * b)) / (2 * np.log(theta))
    low = max(np.floor(corr(beta_fast)), 0)
    high = min(np.ceil(corr(beta_slow)), rd - 1)
    if high == low:
        high += 0.001
    ramp = np.clip((i - low) / (high - low), 0, 1)
    return w * (1 - ramp) + w / factor * ramp


def pow2_ceil(r):
    return 2.0 ** np.ceil(np.log2(r))


def fp8_qdq(x, block):
    """dsv4.md §2.2: e4m3 with ue8m0 block scales, amax floor 1e-4."""
    x = x.copy()
    for b in range(0, x.size, block):
        v = x[b:b + block]
        s = pow2_ceil(max(np.abs(v).max(), 1e-4) / 448)
        q = np.clip(v / s, -448, 448)
        e = np.floor(np.log2(np.maximum(np.abs(q), 2.0 ** -6)))
        step = 2.0 ** (e - 3)
        x[b:b + block] = np.minimum(np.abs(np.round(q / step) * step), 448) * np.sign(q) * s
    return x


def fp4_qdq(x, block):
    """dsv4.md §2.2: e2m1 grid, ties to the even code, ue8m0 block scales."""
    grid = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])
    x = x.copy()
    for b in range(0, x.size, block):
        v = x[b:b + block]
        s = pow2_ceil(max(np.abs(v).max(), 6 * 2.0 ** -126) / 6)
        q = np.clip(np.abs(v / s), 0, 6)
        d = np.abs(q[:, None] - grid[None, :])
        best = np.argmin(d + (np.arange(8) % 2)[None, :] * 1e-12, axis=1)
        x[b:b + block] = grid[best] * np.sign(v) * s
    return x


def hadamard(n):
    h = np.array([[1.0]])
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


def compressor(f, rng):
    """dsv4.md §3.6 in bulk (prefill from position 0), then norm, rope at w·m, quant."""
    kind = rng.integers(0, 3)
    m, d, rd, overlap, post = [(4, 64, 16, 1, 0), (8, 64, 16, 0, 0), (4, 32, 16, 1, 1)][kind]
    c = 2 if overlap else 1
    L = int(rng.integers(m, 6 * m + 3))
    K = rng.uniform(-2, 2, size=(L, c * d)).astype(np.float32).astype(np.float64)
    Z = rng.uniform(-3, 3, size=(L, c * d)).astype(np.float32).astype(np.float64)
    ape = rng.uniform(-1, 1, size=(m, c * d)).astype(np.float32).astype(np.float64)
    nw = bf16(rng.uniform(0.5, 1.5, size=(d,)))
    yarn = (160000.0, 16.0, 65536.0, 32.0, 1.0)
    om = yarn_omega(rd, *yarn).astype(np.float32).astype(np.float64)
    S = Z + ape[np.arange(L) % m]
    E = L // m
    pooled = np.zeros((E, d))
    entries = np.zeros((E, d))
    for w in range(E):
        if overlap:
            cur_k, cur_s = K[w * m:(w + 1) * m, d:], S[w * m:(w + 1) * m, d:]
            if w > 0:
                prev_k, prev_s = K[(w - 1) * m:w * m, :d], S[(w - 1) * m:w * m, :d]
            else:
                prev_k, prev_s = np.zeros((m, d)), np.full((m, d), -np.inf)
            kk, ss = np.concatenate([prev_k, cur_k]), np.concatenate([prev_s, cur_s])
        else:
            kk, ss = K[w * m:(w + 1) * m], S[w * m:(w + 1) * m]
        p = np.exp(ss - ss.max(axis=0))
        pooled[w] = (p * kk).sum(axis=0) / p.sum(axis=0)
        x = bf16(pooled[w])
        x = bf16(x / np.sqrt(np.mean(x * x) + 1e-6) * nw)
        z = (x[d - rd::2] + 1j * x[d - rd + 1::2]) * np.exp(1j * (w * m) * om)
        x[d - rd::2], x[d - rd + 1::2] = bf16(z.real), bf16(z.imag)
        if post == 0:
            x[:d - rd] = fp8_qdq(x[:d - rd], 64)
        else:
            x = fp4_qdq(bf16(hadamard(d) @ x), 32)
        entries[w] = x
    for name, v in [("m", m), ("d", d), ("rd", rd), ("overlap", overlap), ("post", post), ("L", L),
                    ("K", K), ("Z", Z), ("ape", ape), ("norm_w", nw), ("omega", om), ("yarn", yarn),
                    ("pooled", pooled), ("entries", entries)]:
        put(f, name, v)


OPS = {"hc": hc, "compressor": compressor}


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
