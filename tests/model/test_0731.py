#!/usr/bin/env python3
"""tests/model/test_0731.py: the 0731 release's layout (three DSpark draft stages) end to end.

scripts/make_tiny_model --release 0731 writes tiny FP8 and NVFP4 checkpoints in the 0731 layout with
the same main weights as the June-layout ones. Checked here:
- `dsv4 inspect` accepts them and reports the draft model (dspark, 3 stages, MXFP4 draft experts);
- `dsv4 generate` gives the same greedy tokens as the June-layout checkpoint of the same format
  (the draft stages do not touch plain generation), and so does `dsv4 serve` over HTTP;
- broken copies are refused with a message naming the file and the tensor or field: a draft stage
  missing a tensor, main_proj with the wrong shape, NVFP4 (E4M3) scales on a draft expert,
  dspark_target_layer_ids out of range, DSpark tensors under a June config;
- configs as transformers' DeepseekV4Config writes them (save_pretrained of a fresh config and a
  from_pretrained/save_pretrained round trip of the tiny and the real configs) are accepted by
  `dsv4 kernels` and `dsv4 inspect`, with the same generation (transformers is pinned in
  scripts/requirements.txt: its absence is a failure);
- without speculative decoding (no --speculative-config) `dsv4 serve` never reads the draft stages'
  weights (the shard holding only mtp.* tensors stays unmapped but for its header: /proc/PID/smaps)
  yet validates them (a draft stage missing a tensor stops serve at load).

Environment (set by meson): DSV4_BIN, DSV4_SOURCE_ROOT.
"""
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile

SRC = os.environ.get("DSV4_SOURCE_ROOT", os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("DSV4_BIN", os.path.join(SRC, "build", "server", "dsv4"))
GEN = os.path.join(SRC, "scripts", "make_tiny_model")
sys.path.insert(0, os.path.join(SRC, "tests", "e2e"))

failures = []
n_checks = [0]


def check(cond, what):
    n_checks[0] += 1
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr, flush=True)
    return cond


def run(*args, timeout=300):
    env = dict(os.environ)
    env.setdefault("ASAN_OPTIONS", "detect_leaks=1:halt_on_error=1")
    p = subprocess.run([BIN, *args], capture_output=True, text=True, env=env, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def make(out, release, variant):
    args = [GEN, "--variant", variant, "--out", out]
    if release == "0731":
        args += ["--release", "0731"]
    subprocess.run(args, check=True, capture_output=True, timeout=300)
    return out


def output_ids(model_dir, prompt):
    rc, out, err = run("generate", model_dir, "--prompt-ids", ",".join(map(str, prompt)), "-n", "6")
    if not check(rc == 0, f"generate {model_dir}: rc {rc}: {err[-2000:]}"):
        return None
    for line in out.splitlines():
        if line.startswith("output_ids:"):
            return line.split(":", 1)[1].split()
    check(False, f"generate {model_dir}: no output_ids line")
    return None


# ---- copies to break ----

def copy_ckpt(src, dst):
    """Shards symlinked to the pristine copy (rewritten ones are replaced), the rest copied."""
    os.mkdir(dst)
    for name in os.listdir(src):
        s = os.path.join(src, name)
        if name.endswith(".safetensors"):
            os.symlink(s, os.path.join(dst, name))
        else:
            shutil.copyfile(s, os.path.join(dst, name))
    return dst


def shard_of(d, tensor):
    with open(os.path.join(d, "model.safetensors.index.json")) as f:
        return json.load(f)["weight_map"][tensor]


def edit_header(d, tensor, fn):
    """Apply fn(header dict) to the header of the shard holding tensor; the data section is kept."""
    path = os.path.join(d, shard_of(d, tensor))
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    fn(header)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    os.unlink(path)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def rename_tensor(d, old, new):
    def fn(h):
        h[new] = h.pop(old)
    edit_header(d, old, fn)
    ip = os.path.join(d, "model.safetensors.index.json")
    with open(ip) as f:
        idx = json.load(f)
    idx["weight_map"][new] = idx["weight_map"].pop(old)
    with open(ip, "w") as f:
        json.dump(idx, f)


def edit_config(d, fn):
    p = os.path.join(d, "config.json")
    with open(p) as f:
        c = json.load(f)
    fn(c)
    with open(p, "w") as f:
        json.dump(c, f, indent=2)


def expect_refused(d, what, *needles):
    rc, out, err = run("inspect", d)
    check(rc == 1, f"{what}: inspect exit {rc}, expected 1 ({err[-500:]})")
    for n in needles:
        check(n in err, f"{what}: message lacks {n!r}: {err[-1000:]}")
    check("Sanitizer" not in err and "runtime error" not in err, f"{what}: sanitizer report")


def refusals(tmp, base):
    rng = random.Random()
    stage = rng.randrange(3)
    t = f"mtp.{stage}.attn.wkv.scale"
    d = copy_ckpt(base, os.path.join(tmp, "missing"))
    rename_tensor(d, t, t + "_x")
    expect_refused(d, "draft stage missing a tensor", t, "missing", "model.safetensors.index.json")

    d = copy_ckpt(base, os.path.join(tmp, "markov"))
    rename_tensor(d, "mtp.2.markov_head.markov_w2.weight", "mtp.2.markov_head.markov_w3.weight")
    expect_refused(d, "markov head missing", "mtp.2.markov_head.markov_w2.weight")

    d = copy_ckpt(base, os.path.join(tmp, "shape"))
    # same element count, other shape: [64, 192] -> [96, 128]
    edit_header(d, "mtp.0.main_proj.weight",
                lambda h: h["mtp.0.main_proj.weight"].__setitem__("shape", [96, 128]))
    expect_refused(d, "main_proj shape", "mtp.0.main_proj.weight", "shape [96, 128]", "[64, 192]",
                   ".safetensors")

    e = rng.randrange(8)
    t = f"mtp.{stage}.ffn.experts.{e}.w1.scale"
    d = copy_ckpt(base, os.path.join(tmp, "nvfp4-draft"))
    edit_header(d, t, lambda h: h[t].__setitem__("dtype", "F8_E4M3"))
    expect_refused(d, "NVFP4 scales on a draft expert", t, "F8_E4M3", "F8_E8M0", ".safetensors")

    d = copy_ckpt(base, os.path.join(tmp, "quantized-mtp"))

    def nvfp4_mtp(c):
        q = c["quantization_config"]
        q["quantized_layers"] = q["quantized_layers"] + ["mtp.*.ffn.experts"]
        q["ignore"] = [p for p in q["ignore"] if p != "mtp.*"]
    edit_config(d, nvfp4_mtp)
    expect_refused(d, "quantized_layers lists the draft experts", "tensor mtp.0.ffn.experts.0.w1.weight",
                   "stored as MXFP4", "quantized_layers")

    d = copy_ckpt(base, os.path.join(tmp, "targets"))
    edit_config(d, lambda c: c.__setitem__("dspark_target_layer_ids", [3, 4, 6]))
    expect_refused(d, "target layer out of range", "config.json", "field dspark_target_layer_ids[2]")

    d = copy_ckpt(base, os.path.join(tmp, "june-config"))

    def june(c):
        for k in ("dspark_block_size", "dspark_noise_token_id", "dspark_target_layer_ids", "dspark_markov_rank"):
            del c[k]
        c["compress_ratios"] = c["compress_ratios"][:7]
    edit_config(d, june)
    expect_refused(d, "DSpark tensors under a June config", "mtp.0.main_proj.weight", "dspark")

    # the target model alone (no mtp.* at all) loads: the draft model is optional
    d = os.path.join(tmp, "no-draft")
    os.mkdir(d)
    for name in os.listdir(base):
        if not name.endswith(".safetensors") and name != "model.safetensors.index.json":
            shutil.copyfile(os.path.join(base, name), os.path.join(d, name))
    with open(os.path.join(base, "model.safetensors.index.json")) as f:
        idx = json.load(f)
    idx["weight_map"] = {k: v for k, v in idx["weight_map"].items() if not k.startswith("mtp.")}
    del idx["metadata"]
    kept = set(idx["weight_map"].values())
    for s in kept:
        os.symlink(os.path.join(base, s), os.path.join(d, s))
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump(idx, f)
    rc, out, err = run("inspect", d)
    if check(rc == 0, f"no draft tensors: inspect rc {rc}: {err[-1000:]}"):
        check("draft: none" in out, "no draft tensors: inspect says draft: none")


def serve_ids(model_dir, prompt):
    from serverproc import Server
    srv = Server(executor="model", model=model_dir, name="tiny-0731")
    try:
        st, body, _ = srv.request("POST", "/v1/completions",
                                  {"model": "tiny-0731", "prompt": prompt, "max_tokens": 6, "temperature": 0,
                                   "logprobs": 0})
        check(st == 200, f"serve {model_dir}: status {st} {body[:300]!r}")
        if st != 200:
            return None
        ch = json.loads(body)["choices"][0]
        # the text and the sampled tokens (logprobs 0: the tokens without alternatives)
        return ch["text"], (ch.get("logprobs") or {}).get("tokens")
    finally:
        rc = srv.stop()
        check(rc == 0, f"serve {model_dir}: exit {rc}")
        check(not srv.sanitizer_report(), f"serve {model_dir}: sanitizer report")
        srv.cleanup()


def draft_not_read(tmp, base):
    """serve without speculative decoding: mtp.* validated at load, their bytes never touched."""
    import re
    from serverproc import Server
    with open(os.path.join(base, "model.safetensors.index.json")) as f:
        wm = json.load(f)["weight_map"]
    draft_shards = {v for k, v in wm.items() if k.startswith("mtp.")}
    main_shards = {v for k, v in wm.items() if not k.startswith("mtp.")}
    if not check(draft_shards and not draft_shards & main_shards,
                 f"tiny 0731: the draft stages have shards of their own ({draft_shards} / {main_shards})"):
        return
    draft_bytes = sum(os.path.getsize(os.path.join(base, s)) for s in draft_shards)
    srv = Server(executor="model", model=base, name="tiny-0731")
    try:
        st, body, _ = srv.request("POST", "/v1/completions",
                                  {"model": "tiny-0731", "prompt": [0, 5, 6, 7], "max_tokens": 4, "temperature": 0})
        check(st == 200, f"draft not read: completion status {st} {body[:300]!r}")
        rss = {}
        cur = None
        with open(f"/proc/{srv.p.pid}/smaps") as f:
            for ln in f:
                m = re.match(r"^[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ \S+\s*(\S.*)?$", ln)
                if m:
                    cur = os.path.basename(m.group(1) or "")
                elif ln.startswith("Rss:") and cur:
                    rss[cur] = rss.get(cur, 0) + int(ln.split()[1]) * 1024
        main_rss = sum(rss.get(s, 0) for s in main_shards)
        draft_rss = sum(rss.get(s, 0) for s in draft_shards)
        # the header and the kernel's fault-around (64 KiB) at most; the main weights are resident
        check(draft_rss <= 256 * 1024, f"draft not read: {draft_rss} of {draft_bytes} draft shard bytes resident")
        check(main_rss > draft_bytes, f"draft not read: the smaps probe sees the main weights ({main_rss} bytes)")
    finally:
        rc = srv.stop()
        check(rc == 0, f"draft not read: serve exit {rc}")
        check(not srv.sanitizer_report(), "draft not read: sanitizer report")
        srv.cleanup()
    # ... and validated: a draft stage missing a tensor stops serve at load, naming it
    d = copy_ckpt(base, os.path.join(tmp, "serve-missing"))
    t = f"mtp.{random.randrange(3)}.ffn.shared_experts.w2.weight"
    rename_tensor(d, t, t + "_x")
    env = dict(os.environ)
    env.setdefault("ASAN_OPTIONS", "detect_leaks=1:halt_on_error=1")
    p = subprocess.run([BIN, "serve", "--model", d, "--port", "0", "--executor", "model"], capture_output=True,
                       text=True, env=env, timeout=120)
    check(p.returncode == 1 and t in p.stderr and "missing" in p.stderr,
          f"serve with {t} missing: exit {p.returncode}, expected 1 naming it: {p.stderr[-800:]}")


def transformers_configs(tmp, base_0731, june_fp8, ids_0731):
    try:
        from transformers import DeepseekV4Config
    except ImportError:
        # pinned in scripts/requirements.txt: a venv without it is a broken setup, not a skip
        check(False, "transformers (scripts/requirements.txt) is not importable: its configs are not checked")
        return
    # a fresh config, no weights: what save_pretrained writes (no architectures, layer_types, ...)
    d = os.path.join(tmp, "hf-fresh")
    DeepseekV4Config(vocab_size=129280, hidden_size=64, num_hidden_layers=6, num_attention_heads=8, head_dim=64,
                     q_lora_rank=64, o_groups=4, o_lora_rank=32, moe_intermediate_size=32, n_routed_experts=8,
                     num_experts_per_tok=2, index_n_heads=4, index_head_dim=32, index_topk=16,
                     sliding_window=32).save_pretrained(d)
    rc, out, err = run("kernels", d)
    check(rc == 0 and "plan complete: 6 layers" in out, f"transformers fresh config: kernels rc {rc}: {err[-800:]}")

    # the real configs, loaded and written back by transformers
    for name in ("deepseek-v4-flash", "deepseek-v4-flash-nvfp4", "deepseek-v4-flash-0731",
                 "deepseek-v4-flash-0731-nvfp4"):
        d = os.path.join(tmp, "hf-" + name)
        DeepseekV4Config.from_pretrained(os.path.join(SRC, "tests", "model", "data", name)).save_pretrained(d)
        with open(os.path.join(d, "config.json")) as f:
            written = json.load(f)
        check("layer_types" in written and "rope_parameters" in written and "compress_ratios" not in written,
              f"{name}: transformers wrote its own key set")
        rc, out, err = run("kernels", d)
        want = "43 layers + 3 DSpark stages" if "0731" in name else "43 layers + MTP"
        check(rc == 0 and want in out, f"{name} via transformers: kernels rc {rc}, want {want!r}: {err[-800:]}")

    # the tiny 0731 checkpoint with its config rewritten by transformers: same load, same tokens
    d = copy_ckpt(base_0731, os.path.join(tmp, "hf-tiny-0731"))
    with open(os.path.join(base_0731, "config.json")) as f:
        raw = json.load(f)
    # transformers maps only the real ratios (4, 128) from compress_ratios: give the tiny HCA
    # ratio 8 its own way, through layer_types + compress_rates
    kinds = {0: "sliding_attention", 4: "compressed_sparse_attention", 8: "heavily_compressed_attention"}
    raw["layer_types"] = [kinds[r] for r in raw.pop("compress_ratios")]
    raw["compress_rates"] = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8}
    DeepseekV4Config.from_dict(raw).save_pretrained(d)
    rc, out, err = run("inspect", d)
    if check(rc == 0, f"tiny 0731 with transformers' config: inspect rc {rc}: {err[-800:]}"):
        check("draft: dspark, 3 stages" in out, "transformers config: draft stages")
        check("yarn factor 16" in out, "transformers config: yarn from rope_parameters.compress")
    check(output_ids(d, [0, 5, 6, 7]) == ids_0731, "transformers config: same greedy tokens")


def main():
    if not os.path.exists(GEN) or not os.path.exists(BIN):
        print("generator or binary missing")
        return 77
    tmp = tempfile.mkdtemp(prefix="dsv4-0731-")
    try:
        prompt = [0] + [random.randrange(2, 129280) for _ in range(5)]
        dirs = {}
        for variant in ("fp8", "nvfp4"):
            june = make(os.path.join(tmp, "tiny-" + variant), "june", variant)
            r0731 = make(os.path.join(tmp, "tiny-0731-" + variant), "0731", variant)
            dirs[variant] = (june, r0731)
            rc, out, err = run("inspect", r0731)
            if check(rc == 0, f"inspect 0731 {variant}: rc {rc}: {err[-2000:]}"):
                check("draft: dspark, 3 stages (mtp.0-mtp.2), block 5, noise token 128799" in out,
                      f"0731 {variant}: draft line\n{out[:1500]}")
                check("layers 6 + 3 DSpark" in out, f"0731 {variant}: layer count")
                check("6(mtp.0) 7(mtp.1) 8(mtp.2)" in out, f"0731 {variant}: stages are sliding")
                rows = [ln.split() for ln in out.splitlines() if ln.strip().startswith(("6 ", "7 ", "8 "))]
                check(len(rows) == 3 and all(r[7] == "MXFP4" for r in rows),
                      f"0731 {variant}: draft experts MXFP4: {rows}")
                check(len(rows) == 3 and rows[0][8] == "FP8" and rows[1][8] == "-",
                      f"0731 {variant}: main_proj FP8 on mtp.0 only: {rows}")
            a, b = output_ids(june, prompt), output_ids(r0731, prompt)
            check(a is not None and a == b, f"{variant}: June {a} vs 0731 {b} greedy tokens")
        ids_0731 = output_ids(dirs["fp8"][1], [0, 5, 6, 7])
        text = "The quick brown fox"
        for variant in ("fp8", "nvfp4"):
            ja, jb = serve_ids(dirs[variant][0], text), serve_ids(dirs[variant][1], text)
            check(ja is not None and ja[1] and ja == jb, f"serve {variant}: June {ja!r} vs 0731 {jb!r}")
        rc, out, err = run("inspect", dirs["fp8"][0])
        if check(rc == 0, f"inspect June fp8: rc {rc}: {err[-1000:]}"):
            check("draft: mtp (NextN), 1 layer" in out and "MTP          6(mtp.0)" in out,
                  f"June layout: the NextN draft layer\n{out[:1500]}")
        rc, out, err = run("inspect", dirs["nvfp4"][1])
        check(rc == 0 and "DSpark       6(mtp.0) 7(mtp.1) 8(mtp.2)" in out, f"0731: the DSpark layer row\n{out[:1500]}")
        draft_not_read(tmp, dirs["fp8"][1])
        os.mkdir(os.path.join(tmp, "broken"))
        refusals(os.path.join(tmp, "broken"), dirs["nvfp4"][1])
        transformers_configs(tmp, dirs["fp8"][1], dirs["fp8"][0], ids_0731)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{n_checks[0]} checks, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
