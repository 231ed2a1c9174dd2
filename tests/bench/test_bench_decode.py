"""`dsv4 bench decode` on the tiny checkpoint (CPU): the output is well formed, not fast.

Runs two contexts x a random pair of batch sizes with a fresh seed, and checks the JSON
(one result per configuration, positive times, bytes that add up, distinct experts per
layer between top_k and min(batch * top_k, experts), a profile with one routing call and
two mHC posts per layer), the markdown table (a row per configuration), the per-op profile
print (--profile), and that bad arguments are usage errors (exit 2).

`--device cuda` (the gpu suite: bench_decode_tiny_gpu) runs the same on the GPU, where the timed
steps are CUDA graphs and the profiled ones run on a second, eager executor; it skips (77)
without a GPU.
"""
import json
import os
import random
import subprocess
import sys
import tempfile

SRC = os.environ.get("DSV4_SOURCE_ROOT", os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(SRC, "tests"))
from tiny_dir import tiny_dir  # noqa: E402

BIN = os.environ.get("DSV4_BIN", "build/server/dsv4")
FAILS = []


def check(cond, what):
    if not cond:
        FAILS.append(what)
        print("FAIL:", what, file=sys.stderr)
    return cond


def main():
    device = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cpu"
    if device != "cpu":
        try:
            ok = subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0
        except OSError:
            ok = False
        if not ok:
            print("skip: no GPU")
            sys.exit(77)
    model = os.path.join(tiny_dir(), "tiny-nvfp4")
    cfg = json.load(open(os.path.join(model, "config.json")))
    L, E, K = cfg["num_hidden_layers"], cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    seed = random.randrange(1 << 30)
    batches = sorted(random.sample([1, 2, 3, 4, 5], 2))
    contexts = [256, 300]  # 300 is rounded up to a multiple of the block size
    out = tempfile.mktemp(suffix=".json")
    cmd = [BIN, "bench", "decode", "--model", model, "--device", device, "--contexts", ",".join(map(str, contexts)),
           "--batches", ",".join(map(str, batches)), "--steps", "2", "--warmup", "1", "--prefixes", "2",
           "--chunk", "256", "--bw-mib", "16", "--seed", str(seed), "--json", out, "--profile"]
    print("seed", seed, "batches", batches, flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    check(p.returncode == 0, "exit %d: %s" % (p.returncode, p.stderr[-2000:]))
    if p.returncode:
        return
    j = json.load(open(out))
    os.unlink(out)
    check(j["benchmark"] == "decode" and j["layers_measured"] == L and j["layers_full"] == L, "header %r" % j)
    check(j["read_bw_gbps"] > 0, "read bandwidth %r" % j["read_bw_gbps"])
    B = j["block_tokens"]
    res = j["results"]
    check(len(res) == len(contexts) * len(batches), "%d results" % len(res))
    want = [((c + B - 1) // B * B, b) for c in contexts for b in batches]
    check([(r["context"], r["batch"]) for r in res] == want, "configurations %r" % [(r["context"], r["batch"]) for r in res])
    for r in res:
        tag = "ctx %d batch %d" % (r["context"], r["batch"])
        check("skipped" not in r, tag + " skipped")
        if "skipped" in r:
            continue
        check(0 < r["ms_per_step_min"] <= r["ms_per_step_median"], tag + " times")
        check(abs(r["tokens_per_s"] - r["batch"] / (r["ms_per_step_median"] / 1e3)) < 1e-6 * r["tokens_per_s"] + 1e-9,
              tag + " tokens/s")
        by = r["bytes_per_step"]
        check(all(by[k] > 0 for k in ("layer_weights", "routed_experts", "head_embed", "state")), tag + " bytes %r" % by)
        check(by["total"] == by["layer_weights"] + by["routed_experts"] + by["head_embed"] + by["state"],
              tag + " bytes add up")
        d = r["distinct_experts_per_layer"]
        check(K <= d <= min(E, r["batch"] * K), tag + " distinct experts %r" % d)
        if r["batch"] == 1:
            check(d == K, tag + " one token picks top_k experts")
        check(abs(r["achieved_gbps"] - by["total"] / (r["ms_per_step_median"] / 1e3) / 1e9) < 1e-6 * r["achieved_gbps"],
              tag + " GB/s")
        check(abs(r["fraction_of_read_bw"] - r["achieved_gbps"] / j["read_bw_gbps"]) < 1e-6, tag + " fraction")
        full = r["full_model_derived"]
        check(full["ms_per_step"] > 0 and full["bytes_per_step"] > 0, tag + " derived")
        # the full model is the measured one here: its bytes are the measured bytes
        check(abs(full["bytes_per_step"] - by["total"]) <= 0.02 * by["total"], tag + " derived bytes %r vs %r"
              % (full["bytes_per_step"], by["total"]))
        g = r["gb10_tp2_projected"]
        check(g["tokens_per_s"] > 0 and g["vllm_tokens_per_s"] == 26.4, tag + " projection")
        check(full["state_bytes_per_step"] < g["bytes_per_rank_per_step"] < full["bytes_per_step"], tag + " rank bytes")
        prof = r["profile"]
        calls = {}
        for o in prof["ops"]:
            calls[o["op"]] = calls.get(o["op"], 0) + o["calls"]
        check(calls.get("route") == L and calls.get("hc_post") == 2 * L and calls.get("embed") == 1,
              tag + " profile calls %r" % calls)
        check(len(prof["us_embed_layers_head"]) == L + 2, tag + " per-layer profile")
        check(abs(sum(prof["us_embed_layers_head"]) - prof["total_us"]) < 1e-3 * prof["total_us"] + 1e-6,
              tag + " profile sums")
    rows = [l for l in p.stdout.splitlines() if l.startswith("| %d |" % want[0][0]) or l.startswith("| %d |" % want[-1][0])]
    check(len(rows) >= len(res), "table rows: %d" % len(rows))
    check(p.stdout.count("#### per-op profile") == len(res), "profile sections")
    for bad in (["--batches", "0"], ["--batches", "1,x"], ["--steps", "-1"], ["--frobnicate", "1"]):
        q = subprocess.run([BIN, "bench", "decode", "--model", model, *bad], capture_output=True, text=True, timeout=60)
        check(q.returncode == 2, "%r: exit %d" % (bad, q.returncode))
    q = subprocess.run([BIN, "bench", "nosuch"], capture_output=True, text=True, timeout=60)
    check(q.returncode == 2, "unknown benchmark: exit %d" % q.returncode)


if __name__ == "__main__":
    main()
    print("%d failures" % len(FAILS))
    sys.exit(1 if FAILS else 0)
