"""Unit tests of scripts/tiny_model/formats.py (the generator's encoders and block quantizers)
against the independent bit-level decoders and brute-force encoders of tinyref.py: zeros,
negatives, subnormals, ties, saturation, and fresh random values (the seed is printed)."""

import os
import sys
import time
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tinyref as ref  # noqa: E402

sys.path.insert(0, os.path.join(ref.ROOT, "scripts"))
from tiny_model import formats as fm  # noqa: E402

SEED = int(os.environ.get("TINY_TEST_SEED", time.time_ns() % (1 << 31)))
print(f"seed {SEED} (TINY_TEST_SEED to repeat)", file=sys.stderr)


def rng(k=0):
    return np.random.default_rng([SEED, k])


class E4M3(unittest.TestCase):
    def test_table(self):
        self.assertEqual(ref.e4m3_value(0x7E), 448.0)
        self.assertEqual(ref.e4m3_value(0x01), 2.0 ** -9)
        self.assertEqual(ref.e4m3_value(0x08), 2.0 ** -6)
        self.assertEqual(ref.e4m3_value(0x38), 1.0)
        self.assertTrue(np.isnan(ref.e4m3_value(0x7F)))
        all_codes = np.array([c for c in range(256) if c & 0x7F != 0x7F])
        np.testing.assert_array_equal(fm.e4m3_decode(all_codes), ref.e4m3_value(all_codes))

    def test_special_values(self):
        cases = {
            0.0: 0x00, -0.0: 0x00, 1.0: 0x38, -1.0: 0xB8, 448.0: 0x7E, -448.0: 0xFE,
            449.0: 0x7E, 464.0: 0x7E, 1e6: 0x7E, -1e30: 0xFE,          # saturation, never NaN
            2.0 ** -9: 0x01, -(2.0 ** -9): 0x81, 7 * 2.0 ** -9: 0x07,   # subnormals
            2.0 ** -10: 0x00,              # a tie between 0 and the smallest subnormal: even (0)
            -(2.0 ** -10): 0x00,           # rounds to zero: written as +0
            3 * 2.0 ** -10: 0x02,          # tie between codes 1 and 2: even
            1.0625: 0x38,                  # tie between 1.0 (0x38) and 1.125 (0x39): even
            1.1875: 0x3A,                  # tie between 0x39 and 0x3A: even
            2.0 ** -6 - 2.0 ** -10: 0x08,  # tie between the largest subnormal 0x07 and 0x08
            1e-30: 0x00,
        }
        xs = np.array(list(cases.keys()))
        got = fm.e4m3_encode(xs)
        for x, want, g in zip(xs, cases.values(), got):
            self.assertEqual(int(g), want, f"e4m3({x!r}) = {int(g):#04x}, want {want:#04x}")

    def test_every_code_and_midpoint(self):
        codes = np.arange(127)
        v = ref.e4m3_value(codes)
        np.testing.assert_array_equal(fm.e4m3_encode(v), codes)
        np.testing.assert_array_equal(fm.e4m3_encode(-v[1:]), codes[1:] | 0x80)
        mid = (v[:-1] + v[1:]) / 2
        np.testing.assert_array_equal(fm.e4m3_encode(mid), ref.e4m3_nearest(mid))

    def test_random_against_brute_force(self):
        r = rng(1)
        x = r.standard_normal(20000) * np.exp2(r.uniform(-14, 10, 20000))
        np.testing.assert_array_equal(fm.e4m3_encode(x), ref.e4m3_nearest(x))


class E2M1(unittest.TestCase):
    def test_table(self):
        np.testing.assert_array_equal(ref.e2m1_value(np.arange(8)), [0, .5, 1, 1.5, 2, 3, 4, 6])
        np.testing.assert_array_equal(fm.e2m1_decode(np.arange(16)), ref.e2m1_value(np.arange(16)))

    def test_special_values(self):
        cases = {0.0: 0, -0.0: 0, 0.5: 1, -0.5: 9, 6.0: 7, -6.0: 15, 7.0: 7, 100.0: 7, -1e9: 15,
                 0.25: 0, -0.25: 0, 0.75: 2, 1.25: 2, 1.75: 4, 2.5: 4, 3.5: 6, 5.0: 6, -5.0: 14,
                 0.26: 1, 4.9: 6, 5.1: 7}
        xs = np.array(list(cases.keys()))
        got = fm.e2m1_encode(xs)
        for x, want, g in zip(xs, cases.values(), got):
            self.assertEqual(int(g), want, f"e2m1({x!r}) = {int(g)}, want {want}")

    def test_random_against_brute_force(self):
        x = rng(2).uniform(-7, 7, 20000)
        np.testing.assert_array_equal(fm.e2m1_encode(x), ref.e2m1_nearest(x))

    def test_nibble_order(self):
        codes = rng(3).integers(0, 16, (5, 64)).astype(np.uint8)
        packed = fm.pack_nibbles(codes)
        self.assertEqual(packed.shape, (5, 32))
        np.testing.assert_array_equal(packed[:, 0], codes[:, 0] | (codes[:, 1] << 4))
        np.testing.assert_array_equal(ref.nibbles(packed), codes)


class BF16AndE8M0(unittest.TestCase):
    def test_bf16_rne(self):
        r = rng(4)
        x = (r.standard_normal(50000) * np.exp2(r.uniform(-30, 30, 50000))).astype(np.float32)
        x[:4] = [0.0, -0.0, 1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8]   # ties: down to 1.0, up to 1+2^-6
        bits = fm.bf16_bits(x)
        got = ref.bf16_value(bits).astype(np.float64)
        self.assertEqual(got[2], 1.0)
        self.assertEqual(got[3], 1.0 + 2.0 ** -6)
        # nearest: |x - got| <= half an ulp of got's binade, and the neighbour is not closer
        u = x.view(np.uint32)
        lo = (u & np.uint32(0xFFFF0000)).view(np.float32).astype(np.float64)
        hi = ((u & np.uint32(0xFFFF0000)) + np.uint32(0x10000)).view(np.float32).astype(np.float64)
        xd = x.astype(np.float64)
        best = np.where(np.abs(xd - lo) <= np.abs(hi - xd), lo, hi)
        tie = np.abs(xd - lo) == np.abs(hi - xd)
        even_lo = ((u >> 16) & 1) == 0
        best = np.where(tie, np.where(even_lo, lo, hi), best)
        np.testing.assert_array_equal(got, best)

    def test_e8m0(self):
        np.testing.assert_array_equal(fm.e8m0_decode([127, 0, 254, 120]), ref.e8m0_value([127, 0, 254, 120]))
        amax = np.array([448.0, 448.0 * 1.0001, 447.9, 1.0, 0.02, 3 * 2.0 ** -20])
        k = ref.pow2_ceil_exponent(amax / 448.0)
        np.testing.assert_array_equal(fm.e8m0_for_amax(amax, 448.0), k + 127)
        np.testing.assert_array_equal(fm.e8m0_for_amax(np.array([6.0, 6.5, 0.1]), 6.0),
                                      ref.pow2_ceil_exponent(np.array([1.0, 6.5 / 6, 0.1 / 6])) + 127)


class BlockQuantizers(unittest.TestCase):
    def test_fp8_block(self):
        r = rng(5)
        w = ref.bf16_value(fm.bf16_bits((r.standard_normal((200, 130)) * 0.05).astype(np.float32)))
        w[0:128, 0:128] *= 100                       # one block with a much larger range
        codes, scale = fm.fp8_block_quant(w)
        self.assertEqual(scale.shape, (2, 2))
        for bo in range(2):
            for bi in range(2):
                blk = w[bo * 128:(bo + 1) * 128, bi * 128:(bi + 1) * 128].astype(np.float64)
                k = ref.pow2_ceil_exponent(np.abs(blk).max() / 448.0)
                self.assertEqual(int(scale[bo, bi]), int(k) + 127)
                want = ref.e4m3_nearest(blk / np.exp2(float(k)))
                np.testing.assert_array_equal(codes[bo * 128:(bo + 1) * 128, bi * 128:(bi + 1) * 128], want)
        deq = fm.fp8_block_dequant(codes, scale)
        s = np.kron(ref.e8m0_value(scale), np.ones((128, 128)))[:200, :130]
        np.testing.assert_array_equal(deq, (ref.e4m3_value(codes) * s).astype(np.float32))

    def test_mxfp4(self):
        w = (rng(6).standard_normal((16, 64)) * 0.1).astype(np.float32)
        packed, scale = fm.mxfp4_quant(w)
        self.assertEqual((packed.shape, scale.shape), ((16, 32), (16, 2)))
        blocks = w.astype(np.float64).reshape(16, 2, 32)
        k = ref.pow2_ceil_exponent(np.abs(blocks).max(axis=2) / 6.0)
        np.testing.assert_array_equal(scale, k + 127)
        want = ref.e2m1_nearest(blocks / np.exp2(k)[:, :, None]).reshape(16, 64)
        np.testing.assert_array_equal(ref.nibbles(packed), want)

    def test_nvfp4(self):
        w = (rng(7).standard_normal((8, 64)) * 0.1).astype(np.float32)
        w[3, 16:32] = 0.0                            # an all-zero block
        packed, ws, ws2 = fm.nvfp4_quant(w)
        self.assertEqual((packed.shape, ws.shape), ((8, 32), (8, 4)))
        self.assertEqual(np.float32(ws2), np.float32(np.abs(w).max() / np.float32(2688.0)))
        blocks = w.astype(np.float64).reshape(8, 4, 16)
        want_ws = ref.e4m3_nearest(np.abs(blocks).max(axis=2) / (6.0 * np.float64(ws2)))
        np.testing.assert_array_equal(ws, want_ws)
        self.assertEqual(int(ws[3, 1]), 0)
        s = ref.e4m3_value(ws) * np.float64(ws2)
        want = ref.e2m1_nearest(blocks / np.where(s > 0, s, 1.0)[:, :, None]).reshape(8, 64)
        np.testing.assert_array_equal(ref.nibbles(packed), want)
        deq = fm.nvfp4_dequant(packed, ws, ws2)
        np.testing.assert_array_equal(deq[3, 16:32], 0.0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
