"""The tiny DeepSeek-V4 checkpoint: config, tensor list, fp32 master weights and the variants.

docs/tiny-model.md is the contract. The master weights are fp32 draws from numpy, one independent
stream per tensor (seeded by (seed, crc32(name))), so a tensor's values depend only on the seed and
its name. Every variant starts from the bf16-rounded master: the bf16 variant stores it, the
quantized variants quantize it, the dequantized variants store the quantized values back as fp32.

Scales are chosen so that a forward pass stays O(1): linears have std gain/sqrt(in) (gain 1, so a
RMS-1 input gives RMS-1 outputs), norm weights 1 + 0.1 N, hc_*_fn std 0.05 (the mixing logits are
O(0.5)), hc bases near 0 with the comb base favouring the diagonal, attn_sink in [-1, 2), gate
bias std 0.1, and logits of std ~3. Routed expert 7 has a 5x larger w1/w3 (and a 25x smaller w2)
so that swiglu_limit's clamp is exercised.
"""

import zlib

import numpy as np

from . import formats as fm
from .st_io import Tensor

VARIANTS = ("bf16", "fp8", "nvfp4", "fp8-deq", "nvfp4-deq")
# The 0731 release's layout (../shared/docs/dsv4-0731.md): the same main model (the same tensor names,
# so the same master values), with three DSpark draft stages mtp.0..2 in place of the NextN layer.
RELEASES = ("june", "0731")
VARIANTS_0731 = ("0731-bf16", "0731-fp8", "0731-nvfp4")

CONFIG = {
    "architectures": ["DeepseekV4ForCausalLM"],
    "model_type": "deepseek_v4",
    "vocab_size": 129280,
    "hidden_size": 64,
    "num_hidden_layers": 6,
    "num_attention_heads": 8,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "qk_rope_head_dim": 16,
    "q_lora_rank": 64,
    "o_groups": 4,
    "o_lora_rank": 32,
    "moe_intermediate_size": 32,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "num_hash_layers": 2,
    "scoring_func": "sqrtsoftplus",
    "topk_method": "noaux_tc",
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.5,
    "swiglu_limit": 10.0,
    "hidden_act": "silu",
    "sliding_window": 32,
    "compress_ratios": [0, 0, 4, 8, 4, 8, 0],
    "compress_rope_theta": 160000,
    "rope_theta": 10000,
    "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                     "beta_fast": 32, "beta_slow": 1},
    "max_position_embeddings": 1048576,
    "index_n_heads": 4,
    "index_head_dim": 32,
    "index_topk": 16,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "rms_norm_eps": 1e-6,
    "num_nextn_predict_layers": 1,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "transformers_version": "4.57.1",
}

_FP8_QCONFIG = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
_NVFP4_QCONFIG = dict(_FP8_QCONFIG, quant_algo="MIXED_PRECISION", moe_quant_algo="NVFP4",
                      group_size=16, quantized_layers=["layers.*.ffn.experts.*"],
                      ignore=["*.attn.*", "*.ffn.shared_experts.*", "head", "mtp.*"])

# NVFP4 activation global scales (input_scale = plausible amax / (448 * 6)), per projection.
_INPUT_AMAX = {"w1": 8.0, "w3": 8.0, "w2": 16.0}
_CLAMP_EXPERT, _CLAMP_GAIN = 7, 5.0


# The 0731 keys at tiny scale: 46 -> 6 + 3 compress_ratios, the last three sliding draft stages fed
# by the last three main layers; num_nextn_predict_layers stays 1, as in the release (a leftover).
DSPARK_0731 = {"dspark_block_size": 5, "dspark_noise_token_id": 128799,
               "dspark_target_layer_ids": [3, 4, 5], "dspark_markov_rank": 16}
N_DSPARK_STAGES = 3


def split_variant(variant):
    """"0731-nvfp4" -> ("0731", "nvfp4"); "fp8-deq" -> ("june", "fp8-deq")."""
    if variant.startswith("0731-"):
        return "0731", variant[len("0731-"):]
    return "june", variant


def config_for(variant):
    release, variant = split_variant(variant)
    cfg = dict(CONFIG)
    if release == "0731":
        cfg["compress_ratios"] = CONFIG["compress_ratios"][:CONFIG["num_hidden_layers"]] + [0] * N_DSPARK_STAGES
        cfg.update(DSPARK_0731)
    if variant in ("fp8", "nvfp4"):
        cfg["quantization_config"] = dict(_FP8_QCONFIG if variant == "fp8" else _NVFP4_QCONFIG)
        cfg["expert_dtype"] = "fp4"
    return cfg


# ---- the logical tensor list ----
# kind: "bf16" | "f32" | "i64"  (stored as such in every variant)
#       "linear"                (FP8 linear: name is the module, the tensor is name + ".weight")
#       "expert" / "expert_mtp" (routed expert projection, module name as for linear)
# init: (distribution, parameters); see _draw.

class Spec:
    __slots__ = ("name", "kind", "shape", "init")

    def __init__(self, name, kind, shape, init):
        self.name, self.kind, self.shape, self.init = name, kind, tuple(shape), init


def tensor_specs(cfg=CONFIG):
    D, V = cfg["hidden_size"], cfg["vocab_size"]
    H, d = cfg["num_attention_heads"], cfg["head_dim"]
    ql, og, ol = cfg["q_lora_rank"], cfg["o_groups"], cfg["o_lora_rank"]
    E, I, K = cfg["n_routed_experts"], cfg["moe_intermediate_size"], cfg["num_experts_per_tok"]
    n = cfg["hc_mult"]
    ih, idim = cfg["index_n_heads"], cfg["index_head_dim"]
    n_layers, n_hash = cfg["num_hidden_layers"], cfg["num_hash_layers"]
    ratios = cfg["compress_ratios"]
    nhc = (2 + n) * n
    specs = []

    def add(name, kind, shape, init):
        specs.append(Spec(name, kind, shape, init))

    def lin(name, n_out, n_in, kind="linear", gain=1.0):
        add(name, kind, (n_out, n_in), ("normal", 0.0, gain / np.sqrt(n_in)))

    def norm(name, dim):
        add(name, "bf16", (dim,), ("normal", 1.0, 0.1))

    def hc_head(p):
        add(p + "hc_head_fn", "f32", (n, n * D), ("normal", 0.0, 0.05))
        add(p + "hc_head_base", "f32", (n,), ("normal", 0.0, 0.5))
        add(p + "hc_head_scale", "f32", (1,), ("uniform", 0.5, 1.5))

    def block(p, ratio, hashed, mtp):
        norm(p + "attn_norm.weight", D)
        norm(p + "ffn_norm.weight", D)
        for site in ("attn", "ffn"):
            add(p + f"hc_{site}_fn", "f32", (nhc, n * D), ("normal", 0.0, 0.05))
            add(p + f"hc_{site}_base", "f32", (nhc,), ("hc_base", n))
            add(p + f"hc_{site}_scale", "f32", (3,), ("uniform", 0.5, 1.5))
        a = p + "attn."
        add(a + "attn_sink", "f32", (H,), ("uniform", -1.0, 2.0))
        lin(a + "wq_a", ql, D)
        norm(a + "q_norm.weight", ql)
        lin(a + "wq_b", H * d, ql)
        lin(a + "wkv", d, D)
        norm(a + "kv_norm.weight", d)
        lin(a + "wo_a", og * ol, (H // og) * d)
        lin(a + "wo_b", D, og * ol)
        if ratio:
            c = 2 if ratio == 4 else 1               # CSA (ratio 4) overlaps two windows
            for w in ("wkv", "wgate"):
                lin(a + f"compressor.{w}.weight", c * d, D, kind="bf16")
            add(a + "compressor.ape", "f32", (ratio, c * d), ("normal", 0.0, 0.5))
            norm(a + "compressor.norm.weight", d)
            if ratio == 4:
                x = a + "indexer."
                lin(x + "wq_b", ih * idim, ql)
                lin(x + "weights_proj.weight", ih, D, kind="bf16")
                for w in ("wkv", "wgate"):
                    lin(x + f"compressor.{w}.weight", 2 * idim, D, kind="bf16")
                add(x + "compressor.ape", "f32", (ratio, 2 * idim), ("normal", 0.0, 0.5))
                norm(x + "compressor.norm.weight", idim)
        f = p + "ffn."
        lin(f + "gate.weight", E, D, kind="bf16")
        if hashed:
            add(f + "gate.tid2eid", "i64", (V, K), ("tid2eid", E))
        else:
            add(f + "gate.bias", "f32", (E,), ("normal", 0.0, 0.1))
        for e in range(E):
            g = _CLAMP_GAIN if e == _CLAMP_EXPERT else 1.0
            kind = "expert_mtp" if mtp else "expert"
            lin(f + f"experts.{e}.w1", I, D, kind=kind, gain=g)
            lin(f + f"experts.{e}.w2", D, I, kind=kind, gain=1.0 / (g * g) if g != 1.0 else 1.0)
            lin(f + f"experts.{e}.w3", I, D, kind=kind, gain=g)
        lin(f + "shared_experts.w1", I, D)
        lin(f + "shared_experts.w2", D, I)
        lin(f + "shared_experts.w3", I, D)

    add("embed.weight", "bf16", (V, D), ("normal", 0.0, 1.0))
    for L in range(n_layers):
        block(f"layers.{L}.", ratios[L], L < n_hash, False)
    add("head.weight", "bf16", (V, D), ("normal", 0.0, 3.0 / np.sqrt(D)))
    norm("norm.weight", D)
    hc_head("")
    if "dspark_target_layer_ids" in cfg:
        n_stages = len(ratios) - n_layers
        r = cfg["dspark_markov_rank"]
        for m in range(n_stages):
            p = f"mtp.{m}."
            block(p, 0, False, True)                 # a sliding V4 block, experts MXFP4 as in the release
            if m == 0:
                lin(p + "main_proj", D, D * len(cfg["dspark_target_layer_ids"]))
                norm(p + "main_norm.weight", D)
            if m == n_stages - 1:
                norm(p + "norm.weight", D)
                hc_head(p)
                add(p + "markov_head.markov_w1.weight", "bf16", (V, r), ("normal", 0.0, 1.0))
                add(p + "markov_head.markov_w2.weight", "bf16", (V, r), ("normal", 0.0, 1.0 / np.sqrt(r)))
                add(p + "confidence_head.proj.weight", "bf16", (1, D + r), ("normal", 0.0, 1.0 / np.sqrt(D + r)))
        return specs
    for m in range(cfg["num_nextn_predict_layers"]):
        p = f"mtp.{m}."
        lin(p + "e_proj", D, D)
        lin(p + "h_proj", D, D)
        norm(p + "enorm.weight", D)
        norm(p + "hnorm.weight", D)
        norm(p + "norm.weight", D)
        hc_head(p)
        block(p, ratios[n_layers + m], False, True)
    return specs


def shard_of(name, cfg=CONFIG):
    """1: embed and the first half of the layers; 2: the rest, head, norm, hc_head; 3: mtp."""
    if name.startswith("mtp."):
        return 3
    if name.startswith("embed."):
        return 1
    if name.startswith("layers."):
        return 1 if int(name.split(".")[1]) < -(-cfg["num_hidden_layers"] // 2) else 2
    return 2


# ---- master weights ----

def _draw(spec, seed):
    rng = np.random.default_rng([seed, zlib.crc32(spec.name.encode())])
    kind, *par = spec.init
    shape = spec.shape
    if kind == "normal":
        mean, std = par
        x = rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
        return x + np.float32(mean) if mean else x
    if kind == "uniform":
        lo, hi = par
        return rng.uniform(lo, hi, shape).astype(np.float32)
    if kind == "hc_base":                            # [pre n | post n | comb n*n]
        (n,) = par
        x = rng.normal(0.0, 0.5, shape)
        x[2 * n:] = rng.normal(0.0, 0.3, n * n) + 1.5 * np.eye(n).reshape(-1)
        return x.astype(np.float32)
    if kind == "tid2eid":                            # distinct expert ids per row
        (E,) = par
        V, K = shape
        ids = np.argsort(rng.random((V, E)), axis=1)[:, :K]
        return ids.astype(np.int64)
    raise ValueError(kind)


def master_weights(seed, cfg=CONFIG):
    """{name: fp32 (or int64) array} at the logical shapes; floats already rounded to bf16."""
    out = {}
    for s in tensor_specs(cfg):
        x = _draw(s, seed)
        out[s.name] = x if s.kind in ("i64", "f32") else fm.bf16_round(x)
    return out


# ---- variants ----

def _expert_proj(name):
    return name.rsplit(".", 1)[1]


def variant_tensors(variant, master, cfg=None):
    """The stored tensors of a variant: list of Tensor, in tensor_specs order."""
    cfg = cfg or config_for(variant)
    variant = split_variant(variant)[1]
    base, deq = variant.split("-")[0], variant.endswith("-deq")
    out = []
    for s in tensor_specs(cfg):
        x = master[s.name]
        if s.kind == "i64":
            out.append(Tensor(s.name, "I64", x))
        elif s.kind == "f32":
            out.append(Tensor(s.name, "F32", x))
        elif s.kind == "bf16":
            out.append(Tensor(s.name, "BF16", fm.bf16_bits(x)))
        elif base == "bf16":
            out.append(Tensor(s.name + ".weight", "BF16", fm.bf16_bits(x)))
        elif s.kind == "linear":
            q, sc = fm.fp8_block_quant(x)
            if deq:
                out.append(Tensor(s.name + ".weight", "F32", fm.fp8_block_dequant(q, sc)))
            else:
                out.append(Tensor(s.name + ".weight", "F8_E4M3", q))
                out.append(Tensor(s.name + ".scale", "F8_E8M0", sc))
        elif base == "nvfp4" and s.kind == "expert":
            q, ws, ws2 = fm.nvfp4_quant(x)
            if deq:
                out.append(Tensor(s.name + ".weight", "F32", fm.nvfp4_dequant(q, ws, ws2)))
            else:
                amax = _INPUT_AMAX[_expert_proj(s.name)]
                out.append(Tensor(s.name + ".weight", "U8", q))
                out.append(Tensor(s.name + ".weight_scale", "F8_E4M3", ws))
                out.append(Tensor(s.name + ".weight_scale_2", "F32", np.float32(ws2)))
                out.append(Tensor(s.name + ".input_scale", "F32",
                                  np.float32(amax / (fm.E4M3_MAX * fm.E2M1_MAX))))
        else:                                        # MXFP4 experts (fp8 variant, MTP of nvfp4)
            q, sc = fm.mxfp4_quant(x)
            if deq:
                out.append(Tensor(s.name + ".weight", "F32", fm.mxfp4_dequant(q, sc)))
            else:
                out.append(Tensor(s.name + ".weight", "I8", q.view(np.int8)))
                out.append(Tensor(s.name + ".scale", "F8_E8M0", sc))
    return out
