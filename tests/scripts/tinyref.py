"""Independent reference code for the tiny-model tests: a safetensors reader, bit-level decoders
(e4m3fn, e2m1, e8m0, bf16), brute-force nearest-value encoders, and the expected tensor table
written out from docs/tiny-model.md. Nothing here imports scripts/tiny_model, so the tests check
the generator against a second reading of the contract.
"""

import json
import os
import struct

import numpy as np

ROOT = os.environ.get("DSV4_SOURCE_ROOT") or os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "make_tiny_model")

NP = {"BF16": "<u2", "F32": "<f4", "F8_E4M3": "u1", "F8_E8M0": "u1", "I8": "i1", "U8": "u1",
      "I64": "<i8"}


def load_json(path):
    with open(path) as f:
        return json.load(f)


def read_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        raw = f.read(n)
    return n, json.loads(raw), raw


def read_tensors(path):
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack_from("<Q", buf, 0)
    header = json.loads(buf[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, h in header.items():
        b, e = h["data_offsets"]
        out[name] = np.frombuffer(buf[8 + n + b:8 + n + e], dtype=NP[h["dtype"]]).reshape(h["shape"])
    return header, out


def load(d):
    idx = load_json(os.path.join(d, "model.safetensors.index.json"))
    hdr, arr = {}, {}
    for f in sorted(set(idx["weight_map"].values())):
        h, a = read_tensors(os.path.join(d, f))
        hdr.update(h)
        arr.update(a)
    return hdr, arr


# ---- decoders from the bit layouts ----

def e4m3_value(code):
    """float8_e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa; 0x7F/0xFF are NaN; no infinities."""
    code = np.asarray(code, dtype=np.int64)
    s = np.where(code & 0x80, -1.0, 1.0)
    e = (code >> 3) & 0xF
    m = code & 0x7
    v = np.where(e == 0, m * 2.0 ** -9, (8 + m) * np.exp2(e - 10.0))
    v = np.where((e == 15) & (m == 7), np.nan, v)
    return s * v


def e2m1_value(code):
    """e2m1: bit 3 sign, bits 2-1 exponent (bias 1), bit 0 mantissa."""
    code = np.asarray(code, dtype=np.int64)
    s = np.where(code & 0x8, -1.0, 1.0)
    e = (code >> 1) & 0x3
    m = code & 0x1
    return s * np.where(e == 0, m * 0.5, (2 + m) * np.exp2(e - 2.0))


def e8m0_value(byte):
    return np.exp2(np.asarray(byte, dtype=np.float64) - 127.0)


def bf16_value(bits):
    return (np.asarray(bits, dtype=np.uint32) << 16).view(np.float32)


def nibbles(packed):
    """[r, c] bytes -> [r, 2c] codes; the low nibble is the even element."""
    p = np.asarray(packed).view(np.uint8)
    out = np.empty((p.shape[0], 2 * p.shape[1]), dtype=np.uint8)
    out[:, 0::2] = p & 0xF
    out[:, 1::2] = p >> 4
    return out


# ---- brute-force encoders: nearest finite value, ties to the even code, saturating ----

def _nearest(x, values, sign_bit, chunk=1 << 15):
    """values: magnitudes of codes 0..N-1 (ascending). Returns codes, sign_bit set for x < 0."""
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    n = len(values)
    a = np.minimum(np.abs(x), values[-1])
    out = np.empty(x.shape, dtype=np.int64)
    for i in range(0, len(x), chunk):
        d = np.abs(a[i:i + chunk, None] - values[None, :])
        k = np.argmin(d, axis=1)                      # the first of equal distances
        nxt = np.minimum(k + 1, n - 1)
        tie = (d[np.arange(len(k)), nxt] == d[np.arange(len(k)), k]) & (nxt != k) & (k % 2 == 1)
        out[i:i + chunk] = np.where(tie, nxt, k)
    neg = (x < 0) & (out != 0)
    return np.where(neg, out | sign_bit, out)


E4M3_MAGS = e4m3_value(np.arange(127))               # 0x00..0x7E
E2M1_MAGS = e2m1_value(np.arange(8))


def e4m3_nearest(x):
    return _nearest(x, E4M3_MAGS, 0x80).astype(np.uint8).reshape(np.shape(x))


def e2m1_nearest(x):
    return _nearest(x, E2M1_MAGS, 0x8).astype(np.uint8).reshape(np.shape(x))


def pow2_ceil_exponent(r):
    """Smallest k with 2^k >= r (r > 0), by exact search in float64."""
    r = np.asarray(r, dtype=np.float64)
    k = np.floor(np.log2(r)).astype(np.int64)
    k = np.where(np.exp2(k) < r, k + 1, k)
    k = np.where(np.exp2(k - 1) >= r, k - 1, k)
    return k


# ---- the expected tensor table, from docs/tiny-model.md ----

def expected_tensors(variant):
    """{name: (dtype, shape)} of a variant: 'bf16', 'fp8', 'nvfp4', 'fp8-deq' or 'nvfp4-deq'."""
    D, V, H, d, E, I, n = 64, 129280, 8, 64, 8, 32, 4
    deq = variant.endswith("-deq")
    base = variant.split("-")[0]
    t = {}

    def plain(name, dt, shape):
        t[name] = (dt, list(shape))

    def fp8lin(name, o, i):
        if base == "bf16":
            plain(name + ".weight", "BF16", (o, i))
        elif deq:
            plain(name + ".weight", "F32", (o, i))
        else:
            plain(name + ".weight", "F8_E4M3", (o, i))
            plain(name + ".scale", "F8_E8M0", (-(-o // 128), -(-i // 128)))

    def expert(name, o, i, mtp):
        if base == "bf16":
            plain(name + ".weight", "BF16", (o, i))
        elif deq:
            plain(name + ".weight", "F32", (o, i))
        elif base == "nvfp4" and not mtp:
            plain(name + ".weight", "U8", (o, i // 2))
            plain(name + ".weight_scale", "F8_E4M3", (o, i // 16))
            plain(name + ".weight_scale_2", "F32", ())
            plain(name + ".input_scale", "F32", ())
        else:
            plain(name + ".weight", "I8", (o, i // 2))
            plain(name + ".scale", "F8_E8M0", (o, i // 32))

    def hc_head(p):
        plain(p + "hc_head_fn", "F32", (4, 256))
        plain(p + "hc_head_base", "F32", (4,))
        plain(p + "hc_head_scale", "F32", (1,))

    def layer(p, kind, hashed, mtp):
        plain(p + "attn_norm.weight", "BF16", (D,))
        plain(p + "ffn_norm.weight", "BF16", (D,))
        for s in ("attn", "ffn"):
            plain(p + f"hc_{s}_fn", "F32", (24, 256))
            plain(p + f"hc_{s}_base", "F32", (24,))
            plain(p + f"hc_{s}_scale", "F32", (3,))
        plain(p + "attn.attn_sink", "F32", (H,))
        fp8lin(p + "attn.wq_a", 64, 64)
        fp8lin(p + "attn.wq_b", 512, 64)
        fp8lin(p + "attn.wkv", 64, 64)
        fp8lin(p + "attn.wo_a", 128, 128)
        fp8lin(p + "attn.wo_b", 64, 128)
        plain(p + "attn.q_norm.weight", "BF16", (64,))
        plain(p + "attn.kv_norm.weight", "BF16", (64,))
        if kind == "csa":
            plain(p + "attn.compressor.wkv.weight", "BF16", (128, 64))
            plain(p + "attn.compressor.wgate.weight", "BF16", (128, 64))
            plain(p + "attn.compressor.ape", "F32", (4, 128))
            plain(p + "attn.compressor.norm.weight", "BF16", (64,))
            fp8lin(p + "attn.indexer.wq_b", 128, 64)
            plain(p + "attn.indexer.weights_proj.weight", "BF16", (4, 64))
            plain(p + "attn.indexer.compressor.wkv.weight", "BF16", (64, 64))
            plain(p + "attn.indexer.compressor.wgate.weight", "BF16", (64, 64))
            plain(p + "attn.indexer.compressor.ape", "F32", (4, 64))
            plain(p + "attn.indexer.compressor.norm.weight", "BF16", (32,))
        elif kind == "hca":
            plain(p + "attn.compressor.wkv.weight", "BF16", (64, 64))
            plain(p + "attn.compressor.wgate.weight", "BF16", (64, 64))
            plain(p + "attn.compressor.ape", "F32", (8, 64))
            plain(p + "attn.compressor.norm.weight", "BF16", (64,))
        plain(p + "ffn.gate.weight", "BF16", (E, D))
        if hashed:
            plain(p + "ffn.gate.tid2eid", "I64", (V, 2))
        else:
            plain(p + "ffn.gate.bias", "F32", (E,))
        fp8lin(p + "ffn.shared_experts.w1", I, D)
        fp8lin(p + "ffn.shared_experts.w3", I, D)
        fp8lin(p + "ffn.shared_experts.w2", D, I)
        for e in range(E):
            expert(p + f"ffn.experts.{e}.w1", I, D, mtp)
            expert(p + f"ffn.experts.{e}.w3", I, D, mtp)
            expert(p + f"ffn.experts.{e}.w2", D, I, mtp)

    plain("embed.weight", "BF16", (V, D))
    plain("head.weight", "BF16", (V, D))
    plain("norm.weight", "BF16", (D,))
    hc_head("")
    kinds = ["swa", "swa", "csa", "hca", "csa", "hca"]
    for L, k in enumerate(kinds):
        layer(f"layers.{L}.", k, L < 2, False)
    fp8lin("mtp.0.e_proj", D, D)
    fp8lin("mtp.0.h_proj", D, D)
    for nm in ("enorm", "hnorm", "norm"):
        plain(f"mtp.0.{nm}.weight", "BF16", (D,))
    hc_head("mtp.0.")
    layer("mtp.0.", "swa", False, True)
    return t


def expected_shard(name):
    if name.startswith("mtp."):
        return 3
    if name.startswith("embed.") or (name.startswith("layers.") and int(name.split(".")[1]) <= 2):
        return 1
    return 2
