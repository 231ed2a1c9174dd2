"""tests/model/dspark_ref.py: a NumPy transcription, in float32, of the DSpark drafter's forward
(steps 1-4 of issue 16) for the tiny 0731 checkpoints: the oracle of tests/model/test_dspark_ref.py.

What it follows. The step list is the one gathered in /work/shared/docs/dsv4-0731.md "DSpark forward"
(itself drawn from vLLM's `vllm/model_executor/models/nvidia/dspark.py` and
`vllm/v1/spec_decode/dspark/speculator.py`, PRs 46995 / 47513, and hipfire's
`docs/design/2026-06-28-dspark-deepseek4-forward-spec.md`); the V4 block it runs per stage is
DeepSeek's reference `inference/model.py` `Block.forward` as transcribed in /work/shared/docs/dsv4.md
§3.1-3.5 and §3.9-3.10 (hyper-connections with col-first Sinkhorn, q/kv paths, interleaved RoPE on the
last rope dims, sink, inverse RoPE, grouped wo_a, sqrt-softplus routing with bias, clamped SwiGLU with
the routing weight before w2, sigmoid HC head). No source of DeepSeek's 0731 inference code could be
fetched in this session, so no commit of it is cited; the transcription is of the documented steps,
written independently of model/dspark.c. float32 semantics: weights dequantized exactly (FP8 e4m3 x
E8M0 per 128x128, MXFP4 e2m1 x E8M0 per 32, bf16), no activation quantization simulation, no bf16
rounding of activations (the C side runs with --precision fp32, which turns both off).

  1. main_x = main_norm(main_proj(captures)), captures = the target layers' outputs averaged over the
     hc streams, concatenated (given: they come from the main model, which other tests cover).
  2. per stage: ctx = RoPE_pos(kv_norm(wkv(main_x))) of the last `sliding_window` positions.
  3. block ids [anchor, noise x (B-1)] at positions P+1 .. P+B, embedded, repeated over the hc streams;
     stages 0..S-1 as V4 blocks whose attention sees ctx + all B block rows (non-causal), theta 1e4.
  4. logits = head(norm(hc_head(x))) of the last stage; Markov head: prev = anchor;
     logits_i += w2 . w1[prev]; d_i = argmax; prev = d_i.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import tinyref  # noqa: E402


class Weights:
    def __init__(self, d):
        self.cfg = tinyref.load_json(os.path.join(d, "config.json"))
        self.hdr, self.arr = tinyref.load(d)

    def f32(self, name):
        a = self.arr[name]
        dt = self.hdr[name]["dtype"]
        if dt == "BF16":
            return tinyref.bf16_value(a).astype(np.float32)
        if dt == "F32":
            return np.asarray(a, dtype=np.float32)
        raise ValueError(f"{name}: {dt}")

    def linear(self, prefix):
        """[out, in] float32 of a linear stored as bf16, FP8 (+ E8M0 128x128) or MXFP4 (+ E8M0 per 32)."""
        w = self.arr[prefix + ".weight"]
        dt = self.hdr[prefix + ".weight"]["dtype"]
        if dt == "BF16" or dt == "F32":
            return self.f32(prefix + ".weight")
        sc = tinyref.e8m0_value(self.arr[prefix + ".scale"])
        if dt == "F8_E4M3":
            v = tinyref.e4m3_value(w)
            o, i = v.shape
            s = np.repeat(np.repeat(sc, 128, axis=0), 128, axis=1)[:o, :i]
            return (v * s).astype(np.float32)
        if dt in ("I8", "U8"):
            v = tinyref.e2m1_value(tinyref.nibbles(w))
            s = np.repeat(sc, 32, axis=1)[:, :v.shape[1]]
            return (v * s).astype(np.float32)
        raise ValueError(f"{prefix}: {dt}")


def rmsnorm(x, w, eps):
    x = x.astype(np.float32)
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y * w if w is not None else y


def rope(x, pos, rd, theta, inverse=False):
    """Interleaved pairs on the last rd dims of x [..., T, dim] at positions pos [T]."""
    x = x.copy()
    om = theta ** (-np.arange(0, rd, 2, dtype=np.float64) / rd)
    ang = np.asarray(pos, dtype=np.float64)[:, None] * om[None, :]
    if inverse:
        ang = -ang
    c, s = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    r = x[..., -rd:]
    a, b = r[..., 0::2].copy(), r[..., 1::2].copy()
    r[..., 0::2] = a * c - b * s
    r[..., 1::2] = a * s + b * c
    return x


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def hc_pre(X, fn, base, scale, cfg):
    """X [T, n, D] -> u [T, D], post [T, n], comb [T, n, n]."""
    T, n, D = X.shape
    v = X.reshape(T, n * D)
    rho = 1.0 / np.sqrt(np.mean(v * v, axis=1, keepdims=True) + cfg["rms_norm_eps"])
    m = (v @ fn.T) * rho
    eps = cfg["hc_eps"]
    pre = sigmoid(scale[0] * m[:, :n] + base[:n]) + eps
    post = 2.0 * sigmoid(scale[1] * m[:, n:2 * n] + base[n:2 * n])
    C = scale[2] * m[:, 2 * n:].reshape(T, n, n) + base[2 * n:].reshape(n, n)
    P = np.exp(C - C.max(axis=2, keepdims=True))
    P = P / P.sum(axis=2, keepdims=True) + eps
    P = P / (P.sum(axis=1, keepdims=True) + eps)
    for _ in range(cfg["hc_sinkhorn_iters"] - 1):
        P = P / (P.sum(axis=2, keepdims=True) + eps)
        P = P / (P.sum(axis=1, keepdims=True) + eps)
    u = np.einsum("tj,tjd->td", pre, X)
    return u.astype(np.float32), post, P


def hc_post(f, X, post, comb):
    return (post[:, :, None] * f[:, None, :] + np.einsum("tjk,tjd->tkd", comb, X)).astype(np.float32)


def hc_head(X, fn, base, scale, cfg):
    T, n, D = X.shape
    v = X.reshape(T, n * D)
    rho = 1.0 / np.sqrt(np.mean(v * v, axis=1, keepdims=True) + cfg["rms_norm_eps"])
    m = (v @ fn.T) * rho
    pre = sigmoid(scale[0] * m + base) + cfg["hc_eps"]
    return np.einsum("tj,tjd->td", pre, X).astype(np.float32)


class Stage:
    def __init__(self, W, k):
        p = f"mtp.{k}."
        self.p = p
        g = W.linear
        self.wq_a, self.wq_b, self.wkv = g(p + "attn.wq_a"), g(p + "attn.wq_b"), g(p + "attn.wkv")
        self.wo_a, self.wo_b = g(p + "attn.wo_a"), g(p + "attn.wo_b")
        self.q_norm, self.kv_norm = W.f32(p + "attn.q_norm.weight"), W.f32(p + "attn.kv_norm.weight")
        self.sink = W.f32(p + "attn.attn_sink")
        self.attn_norm, self.ffn_norm = W.f32(p + "attn_norm.weight"), W.f32(p + "ffn_norm.weight")
        self.hc = {s: (W.f32(p + f"hc_{s}_fn"), W.f32(p + f"hc_{s}_base"), W.f32(p + f"hc_{s}_scale"))
                   for s in ("attn", "ffn")}
        self.gate, self.bias = W.f32(p + "ffn.gate.weight"), W.f32(p + "ffn.gate.bias")
        E = W.cfg["n_routed_experts"]
        self.experts = [(g(p + f"ffn.experts.{e}.w1"), g(p + f"ffn.experts.{e}.w3"), g(p + f"ffn.experts.{e}.w2"))
                        for e in range(E)]
        self.shared = (g(p + "ffn.shared_experts.w1"), g(p + "ffn.shared_experts.w3"), g(p + "ffn.shared_experts.w2"))

    def kv(self, x, pos, cfg):
        kv = rmsnorm(x @ self.wkv.T, self.kv_norm, cfg["rms_norm_eps"])
        return rope(kv, pos, cfg["qk_rope_head_dim"], cfg["rope_theta"])

    def attention(self, x, pos, ctx, cfg):
        """x [B, D] block rows of one sequence; ctx [c, d] its context rows."""
        H, d, rd, eps = cfg["num_attention_heads"], cfg["head_dim"], cfg["qk_rope_head_dim"], cfg["rms_norm_eps"]
        qr = rmsnorm(x @ self.wq_a.T, self.q_norm, eps)
        q = (qr @ self.wq_b.T).reshape(-1, H, d)
        q = rmsnorm(q, None, eps)
        q = rope(q.transpose(1, 0, 2), pos, rd, cfg["rope_theta"]).transpose(1, 0, 2)
        keys = np.concatenate([ctx, self.kv(x, pos, cfg)], axis=0)  # [c + B, d]
        s = np.einsum("thd,kd->thk", q, keys) / np.sqrt(d)
        mx = np.maximum(s.max(axis=2), self.sink[None, :])
        e = np.exp(s - mx[:, :, None])
        den = e.sum(axis=2) + np.exp(self.sink[None, :] - mx)
        o = np.einsum("thk,kd->thd", e, keys) / den[:, :, None]
        o = rope(o.transpose(1, 0, 2), pos, rd, cfg["rope_theta"], inverse=True).transpose(1, 0, 2)
        G, R = cfg["o_groups"], cfg["o_lora_rank"]
        og = o.reshape(o.shape[0], G, (H // G) * d)
        z = np.einsum("tgi,gri->tgr", og, self.wo_a.reshape(G, R, -1))
        return (z.reshape(o.shape[0], G * R) @ self.wo_b.T).astype(np.float32)

    def moe(self, y, cfg):
        lim = cfg["swiglu_limit"]

        def expert(w, x, weight):
            w1, w3, w2 = w
            gt = np.minimum(x @ w1.T, lim)
            up = np.clip(x @ w3.T, -lim, lim)
            a = gt / (1.0 + np.exp(-gt)) * up * weight
            return a @ w2.T

        lg = y @ self.gate.T
        sc = np.sqrt(np.log1p(np.exp(lg)))
        K = cfg["num_experts_per_tok"]
        out = np.zeros_like(y)
        for t in range(y.shape[0]):
            sel = np.argsort(-(sc[t] + self.bias), kind="stable")[:K]
            wts = sc[t, sel] / sc[t, sel].sum() * cfg["routed_scaling_factor"]
            for e, wt in zip(sel, wts):
                out[t] += expert(self.experts[e], y[t:t + 1], wt)[0]
        return (out + expert(self.shared, y, 1.0)).astype(np.float32)

    def block(self, X, pos, ctx, cfg):
        eps = cfg["rms_norm_eps"]
        u, post, comb = hc_pre(X, *self.hc["attn"], cfg)
        X = hc_post(self.attention(rmsnorm(u, self.attn_norm, eps), pos, ctx, cfg), X, post, comb)
        u, post, comb = hc_pre(X, *self.hc["ffn"], cfg)
        return hc_post(self.moe(rmsnorm(u, self.ffn_norm, eps), cfg), X, post, comb)


def draft(ckpt_dir, captures, anchor, n_ctx_positions, K):
    """captures [N, n_targets*D] of positions 0..N-1; returns (logits [K, V] after Markov, drafts [K])."""
    W = Weights(ckpt_dir)
    cfg = W.cfg
    n_stages = 1 + max(int(k.split(".")[1]) for k in W.hdr if k.startswith("mtp."))
    stages = [Stage(W, k) for k in range(n_stages)]
    N = captures.shape[0]
    eps = cfg["rms_norm_eps"]
    main_x = rmsnorm(captures @ W.linear("mtp.0.main_proj").T, W.f32("mtp.0.main_norm.weight"), eps)
    c0 = max(0, N - n_ctx_positions)
    pos_ctx = np.arange(c0, N)
    ctxs = [s.kv(main_x[c0:], pos_ctx, cfg) for s in stages]
    B = cfg["dspark_block_size"]
    ids = np.array([anchor] + [cfg["dspark_noise_token_id"]] * (B - 1))
    pos = np.arange(N, N + B)
    emb = W.f32("embed.weight")[ids]
    X = np.repeat(emb[:, None, :], cfg["hc_mult"], axis=1).astype(np.float32)
    for s, ctx in zip(stages, ctxs):
        X = s.block(X, pos, ctx, cfg)
    last = f"mtp.{n_stages - 1}."
    h = hc_head(X, W.f32(last + "hc_head_fn"), W.f32(last + "hc_head_base"), W.f32(last + "hc_head_scale"), cfg)
    h = rmsnorm(h, W.f32(last + "norm.weight"), eps)
    logits = h @ W.f32("head.weight").T
    w1 = W.f32(last + "markov_head.markov_w1.weight")
    w2 = W.f32(last + "markov_head.markov_w2.weight")
    prev, out, drafts = anchor, [], []
    for i in range(K):
        row = logits[i] + w2 @ w1[prev]
        d = int(np.argmax(row))
        out.append(row)
        drafts.append(d)
        prev = d
    return np.array(out, dtype=np.float32), drafts


if __name__ == "__main__":
    print(json.dumps({"usage": "imported by tests/model/test_dspark_ref.py"}))
