#!/usr/bin/env python3
"""scripts/golden_logits.py: reference logits of tiny dsv4 checkpoints from
transformers' DeepseekV4ForCausalLM (eager PyTorch, float32, no cache), for
the CPU forward pass to be tested against (tests/model/test_forward_golden.c).

Run where torch and transformers (>= 5.17, with models.deepseek_v4) exist: the
GPU machine (scripts/device_golden does it). Reads bf16 or dequantized (-deq)
tiny checkpoints written by scripts/make_tiny_model, maps the release's tensor
names onto HF's parameter names (dsv4.md §5.2, docs/tiny-model.md; every
checkpoint tensor but mtp.* must be used and every HF parameter filled, or it
stops), runs six seeded prompts and writes per checkpoint tiny-V:

  OUT/golden_V.json  header: versions, probe ids, sketch rule, per prompt its
                     ids, greedy continuation and where its arrays lie in .bin
  OUT/golden_V.bin   raw little-endian arrays, per prompt of n tokens:
                     lse f32[n], norm2 f32[n], top_ids i32[n,32],
                     top_logits f32[n,32], probe_logits f32[n,1024],
                     sketch f32[n,32]

A full logits row is 129280 floats (330 MB for the 640-token prompt), so per
position it keeps: the log-sum-exp of the row and its squared L2 norm (both
accumulated in float64), the top-32 ids and logits (sorted, ties by lower id),
the logits at 1024 fixed probe ids (the same for every position: the special
ids and a seeded spread), and a 32-entry random sign sketch s_j = sum_v
R[j,v] * logit[v] with R[j,v] = +-1 from splitmix64 (see sketch_signs()), so
mean_j (s_j - s_j')^2 is an unbiased estimate of ||row - row'||^2 over the
full row. float32 throughout: float16 probes would carry a relative rounding
of 2^-11 ~ 5e-4 (half the 1e-3 bound; logits of O(10) to 8e-3 absolute),
and float32 keeps one variant at ~4.5 MiB.

Greedy: 32 tokens continued by full recomputation without a cache (argmax of
the last position each time, ties to the lower id), with the margin between
the best and second-best logit of each step so that a near-tie is visible.

--fake runs everything but torch (checkpoint reading, name mapping, writer and
read-back) with a numpy stand-in for the model, to test this script without
transformers; its output is not a reference.

Differences from the DeepSeek reference that HF has (so tolerances must allow
for them, or the C side must run without them): no FP8 / FP4 activation and KV
quantization simulation, no Hadamard rotation in the indexer.
"""
import argparse
import hashlib
import json
import os
import struct
import sys
import time

import numpy as np

DTYPES = {"BF16": np.uint16, "F32": np.float32, "I64": np.int64, "I32": np.int32, "F16": np.float16}

FORMAT = "dsv4-golden-logits/2"
PROMPT_LENGTHS = (("p1", 1), ("p20", 20), ("p48", 48), ("p129", 129), ("p200", 200), ("p640", 640))
TOPK = 32
N_PROBE = 1024
N_SKETCH = 32
SKETCH_SEED = 0x5EED5EED
N_GREEDY = 32
# <bos> <eos> <pad>, then the named added tokens (fim, User, Assistant, think, ...)
SPECIAL_IDS = [0, 1, 2] + list(range(128798, 128830))


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = info["dtype"]
        if dt not in DTYPES:
            raise SystemExit(f"{path}: tensor {name}: dtype {dt} unsupported here "
                             "(use the bf16 or a -deq variant)")
        b, e = info["data_offsets"]
        arr = np.frombuffer(data[base + b:base + e], dtype=DTYPES[dt]).reshape(info["shape"])
        if dt == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        out[name] = arr
    return out


def load_checkpoint(d):
    idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    tensors = {}
    for f in sorted(set(idx["weight_map"].values())):
        tensors.update(read_safetensors(os.path.join(d, f)))
    missing = sorted(set(idx["weight_map"]) - set(tensors))
    if missing:
        raise SystemExit(f"{d}: tensors in the index but not in the files: {missing[:10]}")
    return tensors


def hf_config(cfg):
    from transformers import DeepseekV4Config
    n = cfg["num_hidden_layers"]
    ratios = cfg["compress_ratios"][:n]
    csa = sorted({r for r in ratios if r == 4})
    hca = sorted({r for r in ratios if r not in (0, 4)})
    if len(hca) > 1:
        raise SystemExit(f"one HCA ratio expected, got {hca}")
    types = ["sliding_attention" if r == 0 else
             "compressed_sparse_attention" if r == 4 else
             "heavily_compressed_attention" for r in ratios]
    rs = cfg.get("rope_scaling") or {}
    rope = {"rope_type": rs.get("type", rs.get("rope_type", "default"))}
    for k in ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow"):
        if k in rs:
            rope[k] = float(rs[k]) if k != "original_max_position_embeddings" else int(rs[k])
    return DeepseekV4Config(
        vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
        moe_intermediate_size=cfg["moe_intermediate_size"], num_hidden_layers=n,
        num_attention_heads=cfg["num_attention_heads"],
        num_key_value_heads=cfg["num_key_value_heads"], head_dim=cfg["head_dim"],
        q_lora_rank=cfg["q_lora_rank"], num_experts_per_tok=cfg["num_experts_per_tok"],
        n_routed_experts=cfg["n_routed_experts"], n_shared_experts=cfg["n_shared_experts"],
        scoring_func=cfg["scoring_func"], norm_topk_prob=cfg["norm_topk_prob"],
        routed_scaling_factor=cfg["routed_scaling_factor"],
        max_position_embeddings=cfg["max_position_embeddings"], rope_theta=cfg["rope_theta"],
        layer_types=types,
        compress_rates={"compressed_sparse_attention": csa[0] if csa else 4,
                        "heavily_compressed_attention": hca[0] if hca else 128},
        compress_rope_theta=cfg["compress_rope_theta"], hc_mult=cfg["hc_mult"],
        hc_sinkhorn_iters=cfg["hc_sinkhorn_iters"], hc_eps=cfg["hc_eps"],
        mlp_layer_types=["hash_moe" if i < cfg["num_hash_layers"] else "moe" for i in range(n)],
        swiglu_limit=cfg["swiglu_limit"], sliding_window=cfg["sliding_window"],
        o_groups=cfg["o_groups"], o_lora_rank=cfg["o_lora_rank"],
        index_n_heads=cfg["index_n_heads"], index_head_dim=cfg["index_head_dim"],
        index_topk=cfg["index_topk"], num_nextn_predict_layers=cfg["num_nextn_predict_layers"],
        rms_norm_eps=cfg["rms_norm_eps"], bos_token_id=cfg["bos_token_id"],
        eos_token_id=cfg["eos_token_id"], tie_word_embeddings=False,
        partial_rotary_factor=cfg["qk_rope_head_dim"] / cfg["head_dim"],
        rope_parameters=rope)


def hf_state(cfg, t):
    """Release names -> HF parameter names (and fused experts), as numpy
    arrays (float32, or int64 for tid2eid). Stops when a checkpoint tensor
    other than mtp.* is left unused or a named one is absent."""
    sd = {}
    used = set()

    def get(ours):
        if ours not in t:
            raise SystemExit(f"mapping: checkpoint tensor {ours} not found")
        used.add(ours)
        return t[ours]

    def put(hf, ours):
        if hf in sd:
            raise SystemExit(f"mapping: HF parameter {hf} assigned twice")
        a = get(ours)
        sd[hf] = np.ascontiguousarray(a).astype(np.int64 if a.dtype == np.int64 else np.float32)

    put("model.embed_tokens.weight", "embed.weight")
    put("lm_head.weight", "head.weight")
    put("model.norm.weight", "norm.weight")
    put("model.hc_head.hc_fn", "hc_head_fn")
    put("model.hc_head.hc_base", "hc_head_base")
    put("model.hc_head.hc_scale", "hc_head_scale")
    for L in range(cfg["num_hidden_layers"]):
        p, h = f"layers.{L}.", f"model.layers.{L}."
        put(h + "input_layernorm.weight", p + "attn_norm.weight")
        put(h + "post_attention_layernorm.weight", p + "ffn_norm.weight")
        for site in ("attn", "ffn"):
            for k in ("fn", "base", "scale"):
                put(h + f"{site}_hc.{k}", p + f"hc_{site}_{k}")
        a, ha = p + "attn.", h + "self_attn."
        put(ha + "sinks", a + "attn_sink")
        for ours, hf in (("wq_a", "q_a_proj"), ("wq_b", "q_b_proj"), ("wkv", "kv_proj"),
                         ("wo_a", "o_a_proj"), ("wo_b", "o_b_proj")):
            put(ha + hf + ".weight", a + ours + ".weight")
        put(ha + "q_a_norm.weight", a + "q_norm.weight")
        put(ha + "kv_norm.weight", a + "kv_norm.weight")
        if cfg["compress_ratios"][L]:
            c, hc = a + "compressor.", ha + "compressor."
            put(hc + "kv_proj.weight", c + "wkv.weight")
            put(hc + "gate_proj.weight", c + "wgate.weight")
            put(hc + "position_bias", c + "ape")
            put(hc + "kv_norm.weight", c + "norm.weight")
            if cfg["compress_ratios"][L] == 4:
                i, hi = a + "indexer.", hc + "indexer."
                put(hi + "q_b_proj.weight", i + "wq_b.weight")
                put(hi + "scorer.weights_proj.weight", i + "weights_proj.weight")
                put(hi + "kv_proj.weight", i + "compressor.wkv.weight")
                put(hi + "gate_proj.weight", i + "compressor.wgate.weight")
                put(hi + "position_bias", i + "compressor.ape")
                put(hi + "kv_norm.weight", i + "compressor.norm.weight")
        f, hf_ = p + "ffn.", h + "mlp."
        put(hf_ + "gate.weight", f + "gate.weight")
        if L < cfg["num_hash_layers"]:
            put(hf_ + "gate.tid2eid", f + "gate.tid2eid")
        else:
            put(hf_ + "gate.e_score_correction_bias", f + "gate.bias")
        E = cfg["n_routed_experts"]
        gu = np.stack([np.concatenate([get(f + f"experts.{e}.w1.weight"), get(f + f"experts.{e}.w3.weight")], 0)
                       for e in range(E)])
        dn = np.stack([get(f + f"experts.{e}.w2.weight") for e in range(E)])
        sd[hf_ + "experts.gate_up_proj"] = gu.astype(np.float32)
        sd[hf_ + "experts.down_proj"] = dn.astype(np.float32)
        for ours, hf in (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")):
            put(hf_ + f"shared_experts.{hf}.weight", f + f"shared_experts.{ours}.weight")
    unused = sorted(k for k in t if k not in used and not k.startswith("mtp."))
    if unused:
        raise SystemExit(f"mapping: {len(unused)} checkpoint tensors not mapped: {unused[:10]}")
    return sd


def make_prompts(seed):
    """Fixed lengths, BOS then seeded random ids (one generator, in order)."""
    rng = np.random.default_rng(seed)
    out = []
    for name, n in PROMPT_LENGTHS:
        out.append((name, [0] + [int(x) for x in rng.integers(3, 128000, size=n - 1)]))
    return out


def make_probe(vocab, seed):
    rng = np.random.default_rng(seed + 1)
    special = [i for i in SPECIAL_IDS if i < vocab]
    rest = np.setdiff1d(np.arange(vocab), special)
    pick = rng.choice(rest, size=N_PROBE - len(special), replace=False)
    return sorted(special + [int(x) for x in pick])


def splitmix64(x):
    """Stateless splitmix64 on a uint64 array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def sketch_signs(vocab):
    """R[j, v] = +1 if the top bit of splitmix64(SKETCH_SEED + j * 2^32 + v)
    is 0, else -1; float64 [N_SKETCH, vocab]. The C test computes the same."""
    j = np.arange(N_SKETCH, dtype=np.uint64)[:, None] << np.uint64(32)
    v = np.arange(vocab, dtype=np.uint64)[None, :]
    top = splitmix64(np.uint64(SKETCH_SEED) + j + v) >> np.uint64(63)
    return 1.0 - 2.0 * top.astype(np.float64)


def row_stats(lg, probe, signs):
    """Per-position statistics of float32 logits [n, V]."""
    n, V = lg.shape
    out = {"lse": np.empty(n, np.float32), "norm2": np.empty(n, np.float32),
           "top_ids": np.empty((n, TOPK), np.int32), "top_logits": np.empty((n, TOPK), np.float32),
           "probe_logits": np.empty((n, len(probe)), np.float32),
           "sketch": np.empty((n, N_SKETCH), np.float32)}
    for i in range(n):
        r = lg[i]
        if not np.all(np.isfinite(r)):
            raise SystemExit(f"non-finite logits at position {i}")
        d = r.astype(np.float64)
        m = d.max()
        out["lse"][i] = m + np.log(np.exp(d - m).sum())
        out["norm2"][i] = np.dot(d, d)
        # every id at least the TOPK-th largest value (more on a tie), sorted
        # by value, ties by lower id (lexsort's last key is the primary one)
        kth = np.partition(r, V - TOPK)[V - TOPK]
        cand = np.nonzero(r >= kth)[0]
        order = cand[np.lexsort((cand, -r[cand]))][:TOPK]
        out["top_ids"][i] = order
        out["top_logits"][i] = r[order]
        out["probe_logits"][i] = r[probe]
    for i in range(0, n, 64):
        out["sketch"][i:i + 64] = (lg[i:i + 64].astype(np.float64) @ signs.T).astype(np.float32)
    return out


def argmax_margin(r):
    """argmax (lower id on ties) and best minus second-best."""
    i = int(np.argmax(r))
    second = np.max(np.delete(r, i))
    return i, float(r[i]) - float(second)


ARRAYS = (("lse", "<f4", ()), ("norm2", "<f4", ()), ("top_ids", "<i4", (TOPK,)),
          ("top_logits", "<f4", (TOPK,)), ("probe_logits", "<f4", (N_PROBE,)),
          ("sketch", "<f4", (N_SKETCH,)))


def run_variant(model_dir, out_dir, seed, fwd, fwd_last, meta):
    """fwd(ids) -> float32 numpy [n, V]; fwd_last(ids) -> float32 numpy [V]."""
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    V = cfg["vocab_size"]
    name = os.path.basename(os.path.normpath(model_dir))
    variant = name[5:] if name.startswith("tiny-") else name
    probe = make_probe(V, seed)
    signs = sketch_signs(V)
    head = dict(meta, format=FORMAT, model=name, seed=seed, vocab_size=V, topk=TOPK,
                probe_ids=probe, n_greedy=N_GREEDY,
                sketch={"n": N_SKETCH, "seed": SKETCH_SEED,
                        "rule": "R[j,v] = top bit of splitmix64(seed + j*2^32 + v) ? -1 : +1; "
                                "s_j = sum_v R[j,v] logit[v] (float64)"},
                bin=f"golden_{variant}.bin", prompts=[])
    blob = bytearray()
    for pname, ids in make_prompts(seed):
        t0 = time.time()
        lg = fwd(ids)
        if lg.shape != (len(ids), V) or lg.dtype != np.float32:
            raise SystemExit(f"{name} {pname}: logits {lg.shape} {lg.dtype}, want ({len(ids)}, {V}) float32")
        st = row_stats(lg, probe, signs)
        del lg
        seq, margins = list(ids), []
        for _ in range(N_GREEDY):
            tok, mg = argmax_margin(fwd_last(seq))
            seq.append(tok)
            margins.append(mg)
        arrays = {}
        for key, dt, shape in ARRAYS:
            a = np.ascontiguousarray(st[key], dtype=dt)
            if a.shape != (len(ids),) + shape:
                raise SystemExit(f"{pname} {key}: shape {a.shape}")
            arrays[key] = {"offset": len(blob), "dtype": dt, "shape": list(a.shape)}
            blob += a.tobytes()
        head["prompts"].append({"name": pname, "n_tokens": len(ids), "ids": ids,
                                "greedy": seq[len(ids):], "greedy_margin": margins, "arrays": arrays})
        print(f"{name} {pname}: {len(ids)} tokens, last top1 {int(st['top_ids'][-1, 0])}, "
              f"greedy {seq[len(ids):len(ids) + 8]}..., min margin {min(margins):.3g}, "
              f"{time.time() - t0:.1f} s", file=sys.stderr)
    head["bin_bytes"] = len(blob)
    head["bin_sha256"] = hashlib.sha256(blob).hexdigest()
    jpath = os.path.join(out_dir, f"golden_{variant}.json")
    bpath = os.path.join(out_dir, head["bin"])
    with open(bpath, "wb") as f:
        f.write(blob)
    with open(jpath, "w") as f:
        json.dump(head, f, separators=(",", ":"))
        f.write("\n")
    check_written(jpath)
    print(f"{name}: wrote {jpath} and {bpath} ({len(blob)} bytes)", file=sys.stderr)


def read_golden(jpath):
    """-> (header, {prompt name: {array name: numpy array}}); checks sizes and the hash."""
    head = json.load(open(jpath))
    if head.get("format") != FORMAT:
        raise SystemExit(f"{jpath}: format {head.get('format')}, want {FORMAT}")
    blob = open(os.path.join(os.path.dirname(jpath), head["bin"]), "rb").read()
    if len(blob) != head["bin_bytes"] or hashlib.sha256(blob).hexdigest() != head["bin_sha256"]:
        raise SystemExit(f"{jpath}: {head['bin']} size or sha256 differs from the header")
    out = {}
    for p in head["prompts"]:
        arr = {}
        for key, a in p["arrays"].items():
            cnt = int(np.prod(a["shape"]))
            arr[key] = np.frombuffer(blob, dtype=a["dtype"], count=cnt, offset=a["offset"]).reshape(a["shape"])
        out[p["name"]] = arr
    return head, out


def check_written(jpath):
    head, arrs = read_golden(jpath)
    probe = head["probe_ids"]
    for p in head["prompts"]:
        a = arrs[p["name"]]
        n = p["n_tokens"]
        if len(p["ids"]) != n or len(p["greedy"]) != head["n_greedy"]:
            raise SystemExit(f"{jpath} {p['name']}: ids or greedy length")
        for i in range(n):
            top = dict(zip(a["top_ids"][i].tolist(), a["top_logits"][i].tolist()))
            for k, pid in enumerate(probe):
                if pid in top and top[pid] != float(a["probe_logits"][i, k]):
                    raise SystemExit(f"{jpath} {p['name']} pos {i}: probe {pid} differs from its top entry")
            if not np.all(np.diff(a["top_logits"][i]) <= 0):
                raise SystemExit(f"{jpath} {p['name']} pos {i}: top logits not sorted")
            if not (a["lse"][i] >= a["top_logits"][i, 0]):
                raise SystemExit(f"{jpath} {p['name']} pos {i}: lse below the max logit")


def fake_model(t, cfg):
    """A numpy stand-in with the checkpoint's embedding and head: each
    position's hidden is a decayed sum of the embeddings so far."""
    emb, head = t["embed.weight"], t["head.weight"]

    def hidden(ids):
        e = emb[np.asarray(ids)].astype(np.float64)
        h = np.zeros_like(e)
        acc = np.zeros(e.shape[1])
        for i in range(len(ids)):
            acc = 0.7 * acc + e[i]
            h[i] = np.tanh(acc * 20.0)
        return h

    def fwd(ids):
        return (hidden(ids) @ head.T.astype(np.float64)).astype(np.float32)

    def fwd_last(ids):
        return (hidden(ids)[-1] @ head.T.astype(np.float64)).astype(np.float32)
    return fwd, fwd_last


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, nargs="+", help="tiny checkpoint directories (tiny-V)")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--fake", action="store_true", help="numpy stand-in model (tests this script)")
    a = ap.parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    t_start = time.time()

    if a.fake:
        for d in a.model:
            cfg = json.load(open(os.path.join(d, "config.json")))
            t = load_checkpoint(d)
            hf_state(cfg, t)
            fwd, fwd_last = fake_model(t, cfg)
            run_variant(d, a.out_dir, a.seed, fwd, fwd_last,
                        {"transformers": None, "torch": None, "dtype": "float64-fake", "device": "numpy",
                         "fake": True})
        print(f"done in {time.time() - t_start:.1f} s", file=sys.stderr)
        return

    import torch
    import transformers
    from transformers import DeepseekV4ForCausalLM
    # IEEE float32 GEMMs, no TF32 (torch >= 2.9 refuses mixing the new and the legacy switch)
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        torch.backends.cuda.matmul.fp32_precision = "ieee"
    else:
        torch.backends.cuda.matmul.allow_tf32 = False
    dev = a.device if torch.cuda.is_available() else "cpu"
    for d in a.model:
        cfg = json.load(open(os.path.join(d, "config.json")))
        t = load_checkpoint(d)
        hcfg = hf_config(cfg)
        hcfg._attn_implementation = "eager"
        torch.manual_seed(0)
        model = DeepseekV4ForCausalLM(hcfg).float().eval()
        sd = {k: torch.from_numpy(v) for k, v in hf_state(cfg, t).items()}
        missing, unexpected = model.load_state_dict(sd, strict=False)
        missing = [m for m in missing if "rotary_emb" not in m]
        if missing or unexpected:
            raise SystemExit(f"state dict mismatch: missing {missing[:20]} unexpected {unexpected[:20]}")
        for k, p in model.state_dict().items():
            if p.is_floating_point() and p.dtype != torch.float32:
                raise SystemExit(f"{k}: dtype {p.dtype}, want float32")
        model.to(dev)

        def fwd(ids):
            with torch.no_grad():
                x = torch.tensor([ids], device=dev)
                return model(input_ids=x, use_cache=False).logits[0].float().cpu().numpy()

        def fwd_last(ids):
            with torch.no_grad():
                x = torch.tensor([ids], device=dev)
                return model(input_ids=x, use_cache=False).logits[0, -1].float().cpu().numpy()
        run_variant(d, a.out_dir, a.seed, fwd, fwd_last,
                    {"transformers": transformers.__version__, "torch": torch.__version__,
                     "dtype": "float32", "device": torch.cuda.get_device_name() if dev != "cpu" else "cpu",
                     "attn_implementation": "eager", "use_cache": False})
        del model
    print(f"done in {time.time() - t_start:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
