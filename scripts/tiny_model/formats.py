"""Number formats of the DeepSeek-V4 checkpoints, encoders and decoders (numpy, vectorised).

Owns the bit-exact rules the tiny checkpoint is written with (docs/tiny-model.md, dsv4.md 2.1, 5.4):
bf16 round-to-nearest-even, FP8 e4m3fn with saturation, e2m1 (FP4), E8M0 power-of-two scales, and
the three block quantizers built from them: FP8 128x128 block-scaled, MXFP4 (1x32, E8M0) and
ModelOpt NVFP4 (1x16, e4m3 scale times an fp32 global scale). Encoders round to the nearest
representable magnitude with ties to the even code (the even mantissa), clamp to the largest
finite value, and write +0 for anything that rounds to zero.
"""

import numpy as np

E4M3_MAX = 448.0
E2M1_MAX = 6.0
NVFP4_BLOCK = 16
MXFP4_BLOCK = 32
FP8_BLOCK = 128


# ---- bf16 ----

def bf16_bits(x):
    """fp32 -> bf16 bit patterns (uint16), round to nearest even. Inputs are finite."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    u = u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
    return (u >> np.uint32(16)).astype(np.uint16)


def bf16_to_f32(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def bf16_round(x):
    """fp32 values rounded to the nearest bf16, as fp32."""
    return bf16_to_f32(bf16_bits(x))


# ---- value tables (magnitudes, indexed by code) ----

def _e4m3_magnitudes():
    out = np.zeros(127, dtype=np.float64)           # codes 0x00..0x7E; 0x7F is NaN
    for c in range(127):
        e, m = c >> 3, c & 7
        out[c] = m / 8.0 * 2.0 ** -6 if e == 0 else (1.0 + m / 8.0) * 2.0 ** (e - 7)
    return out


E4M3_MAG = _e4m3_magnitudes()
E2M1_MAG = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float64)


def _round_to_table(a, mags):
    """Index of the nearest entry of the ascending table mags for magnitudes a (already clamped to
    [0, mags[-1]]), ties to the even index (= even code = even mantissa)."""
    hi = np.searchsorted(mags, a, side="left")
    hi = np.minimum(hi, len(mags) - 1)
    lo = np.maximum(hi - 1, 0)
    d_lo = a - mags[lo]
    d_hi = mags[hi] - a
    take_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    return np.where(take_hi, hi, lo).astype(np.uint8)


def _encode(x, mags, sign_bit):
    x = np.asarray(x, dtype=np.float64)
    a = np.minimum(np.abs(x), mags[-1])
    code = _round_to_table(a, mags)
    neg = (x < 0) & (code != 0)
    return (code | np.where(neg, np.uint8(sign_bit), np.uint8(0))).astype(np.uint8)


def e4m3_encode(x):
    """Values -> float8_e4m3fn codes (uint8). RNE, saturating to +-448, never NaN."""
    return _encode(x, E4M3_MAG, 0x80)


def e4m3_decode(codes):
    codes = np.asarray(codes, dtype=np.uint8)
    mag = np.append(E4M3_MAG, np.nan)[codes & 0x7F]
    return np.where(codes & 0x80, -mag, mag)


def e2m1_encode(x):
    """Values -> e2m1 codes (uint8 0..15, bit 3 = sign). RNE, saturating to +-6."""
    return _encode(x, E2M1_MAG, 0x8)


def e2m1_decode(codes):
    codes = np.asarray(codes, dtype=np.uint8)
    mag = E2M1_MAG[codes & 0x7]
    return np.where(codes & 0x8, -mag, mag)


# ---- E8M0 ----

def e8m0_for_amax(amax, max_code_value):
    """E8M0 byte of s = 2^ceil(log2(amax / max_code_value)); amax 0 gives s = 1."""
    r = np.asarray(amax, dtype=np.float64) / max_code_value
    m, e = np.frexp(r)                               # r = m * 2^e, m in [0.5, 1)
    k = np.where(m == 0.5, e - 1, e)
    k = np.where(r == 0, 0, k)
    return np.clip(k + 127, 0, 254).astype(np.uint8)


def e8m0_decode(byte):
    return np.ldexp(1.0, np.asarray(byte, dtype=np.int64) - 127)


# ---- block quantizers (input: fp32 values, normally already bf16-rounded) ----

def fp8_block_quant(w):
    """[out, in] -> (e4m3 codes uint8 [out, in], e8m0 scales uint8 [ceil(out/128), ceil(in/128)])."""
    w = np.asarray(w, dtype=np.float64)
    n_out, n_in = w.shape
    ob, ib = -(-n_out // FP8_BLOCK), -(-n_in // FP8_BLOCK)
    pad = np.zeros((ob * FP8_BLOCK, ib * FP8_BLOCK))
    pad[:n_out, :n_in] = w
    blocks = pad.reshape(ob, FP8_BLOCK, ib, FP8_BLOCK)
    amax = np.abs(blocks).max(axis=(1, 3))
    scale = e8m0_for_amax(amax, E4M3_MAX)
    s = e8m0_decode(scale)[:, None, :, None]
    codes = e4m3_encode(blocks / s).reshape(ob * FP8_BLOCK, ib * FP8_BLOCK)[:n_out, :n_in]
    return np.ascontiguousarray(codes), scale


def fp8_block_dequant(codes, scale):
    """Exact dequantized fp32 values."""
    n_out, n_in = codes.shape
    s = e8m0_decode(scale)
    s = np.repeat(np.repeat(s, FP8_BLOCK, axis=0), FP8_BLOCK, axis=1)[:n_out, :n_in]
    return (e4m3_decode(codes) * s).astype(np.float32)


def pack_nibbles(codes):
    """[out, in] 4-bit codes -> [out, in/2] bytes, low nibble = even element."""
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)


def unpack_nibbles(packed):
    packed = np.asarray(packed).view(np.uint8)
    out = np.empty((packed.shape[0], packed.shape[1] * 2), dtype=np.uint8)
    out[:, 0::2] = packed & 0xF
    out[:, 1::2] = packed >> 4
    return out


def mxfp4_quant(w):
    """[out, in] -> (packed e2m1 uint8 [out, in/2], e8m0 scales uint8 [out, in/32])."""
    w = np.asarray(w, dtype=np.float64)
    n_out, n_in = w.shape
    assert n_in % MXFP4_BLOCK == 0
    blocks = w.reshape(n_out, n_in // MXFP4_BLOCK, MXFP4_BLOCK)
    scale = e8m0_for_amax(np.abs(blocks).max(axis=2), E2M1_MAX)
    codes = e2m1_encode(blocks / e8m0_decode(scale)[:, :, None]).reshape(n_out, n_in)
    return pack_nibbles(codes), scale


def mxfp4_dequant(packed, scale):
    codes = unpack_nibbles(packed)
    s = np.repeat(e8m0_decode(scale), MXFP4_BLOCK, axis=1)
    return (e2m1_decode(codes) * s).astype(np.float32)


def nvfp4_quant(w):
    """ModelOpt NVFP4: [out, in] -> (packed e2m1 uint8 [out, in/2], weight_scale e4m3 uint8
    [out, in/16], weight_scale_2 fp32 scalar). weight_scale_2 = amax(w)/(448*6) in fp32,
    weight_scale = e4m3(amax_block/(6*weight_scale_2)), codes = e2m1(w/(weight_scale*weight_scale_2))."""
    w = np.asarray(w, dtype=np.float64)
    n_out, n_in = w.shape
    assert n_in % NVFP4_BLOCK == 0
    amax = np.float32(np.abs(w).max())
    ws2 = np.float32(amax / np.float32(E4M3_MAX * E2M1_MAX))
    blocks = w.reshape(n_out, n_in // NVFP4_BLOCK, NVFP4_BLOCK)
    amax_b = np.abs(blocks).max(axis=2)
    if ws2 > 0:
        ws = e4m3_encode(amax_b / (E2M1_MAX * np.float64(ws2)))
    else:
        ws = np.zeros(amax_b.shape, dtype=np.uint8)
    s = e4m3_decode(ws) * np.float64(ws2)           # exact in fp64 (4 x 24 significant bits)
    safe = np.where(s > 0, s, 1.0)[:, :, None]
    codes = np.where(s[:, :, None] > 0, e2m1_encode(blocks / safe), np.uint8(0)).astype(np.uint8)
    return pack_nibbles(codes.reshape(n_out, n_in)), ws, ws2


def nvfp4_dequant(packed, ws, ws2):
    """fp32((e2m1 * e4m3(weight_scale)) * weight_scale_2): the first product is exact in fp32, so
    this is one fp32 rounding. (e2m1 * (e4m3 * ws2)) can differ in the last bit."""
    codes = unpack_nibbles(packed)
    scale = np.repeat(e4m3_decode(ws), NVFP4_BLOCK, axis=1).astype(np.float32)
    return (e2m1_decode(codes).astype(np.float32) * scale) * np.float32(ws2)
