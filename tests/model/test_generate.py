"""`dsv4 generate` on the tiny checkpoints (tests of the forward-pass component).

- greedy (temperature 0) at fp32 precision continues golden_bf16's short prompts (<= 64 tokens; the C
  test covers the long ones) exactly as transformers' full recomputation (`greedy`, or `greedy_nocache`
  in the earlier golden format), for the bf16 and (read in its own formats) fp8 checkpoints, the first
  12 tokens;
- `generate MODEL_DIR -p TEXT -n N` and the spellings `--model`, `--prompt`, `--max-tokens` go through
  the tokenizer (BOS in front), produce N ids, the text, and prefill/decode lines with tokens/s;
- a seeded sampled run repeats itself, and a different seed (normally) differs;
- --kernel-plan prints the head and one line per layer with its kind and the chosen variants;
- bad arguments are usage errors (exit 2).
The tiny checkpoints are generated once into $DSV4_BUILD_ROOT/tiny-models (or $DSV4_TINY_DIR).
"""
import json
import os
import re
import subprocess
import sys

SRC = os.environ.get("DSV4_SOURCE_ROOT", os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(SRC, "tests"))
from tiny_dir import tiny_dir  # noqa: E402

BIN = os.environ.get("DSV4_BIN", os.path.join(SRC, "build", "server", "dsv4"))
FAILS = []


def check(cond, what):
    if not cond:
        FAILS.append(what)
        print("FAIL:", what, file=sys.stderr)


def gen(*args):
    p = subprocess.run([BIN, "generate", *args], capture_output=True, text=True, timeout=240)
    out = {}
    for line in p.stdout.splitlines():
        k, _, v = line.partition(":")
        out[k] = v.strip()
    return p, out


def ids_of(s):
    return [int(x) for x in s.split()] if s else []


def main():
    d = tiny_dir()
    gold = json.load(open(os.path.join(SRC, "tests", "model", "data", "golden", "golden_bf16.json")))
    fp8 = json.load(open(os.path.join(SRC, "tests", "model", "data", "golden", "golden_fp8-deq.json")))
    n_checked = 0
    for variant, g in (("bf16", gold), ("fp8", fp8)):
        for pr in g["prompts"]:
            if len(pr["ids"]) > 64:
                continue  # the C test covers it; keep this one fast
            want = pr["greedy_nocache"] if "greedy_nocache" in pr else pr["greedy"]  # format 1 or 2
            want = want[:12]
            p, out = gen(os.path.join(d, "tiny-" + variant), "--prompt-ids",
                         ",".join(map(str, pr["ids"])), "-n", str(len(want)), "--precision", "fp32")
            check(p.returncode == 0, f"{variant} {pr['name']}: exit {p.returncode}: {p.stderr[-500:]}")
            got = ids_of(out.get("output_ids", ""))
            print(f"{variant} {pr['name']}: {got} vs golden greedy {want}", file=sys.stderr)
            check(got == want, f"{variant} {pr['name']} greedy continuation")
            n_checked += 1
    check(n_checked >= 4, f"{n_checked} golden prompts checked")

    m = os.path.join(d, "tiny-nvfp4")
    for args in ((m, "-p", "Hello, world", "-n", "5"), ("--model", m, "--prompt", "Hello, world", "--max-tokens", "5")):
        p, out = gen(*args)
        check(p.returncode == 0, f"{args}: exit {p.returncode}: {p.stderr[-500:]}")
        pids = ids_of(out.get("prompt_ids", ""))
        check(len(pids) >= 2 and pids[0] == 0, f"{args}: prompt ids {pids} (BOS first)")
        check(len(ids_of(out.get("output_ids", ""))) == 5, f"{args}: 5 tokens")
        check("text" in out, f"{args}: text line")
        pre = re.fullmatch(r"(\d+) tokens in ([\d.]+) s, ([\d.]+) tokens/s, cpu ([\d.]+) s", out.get("prefill", ""))
        dec = re.fullmatch(r"(\d+) tokens in ([\d.]+) s, ([\d.]+) tokens/s, cpu ([\d.]+) s", out.get("decode", ""))
        check(pre and int(pre[1]) == len(pids) and float(pre[3]) > 0, f"{args}: prefill line {out.get('prefill')}")
        check(dec and int(dec[1]) == 4 and float(dec[3]) > 0, f"{args}: decode line {out.get('decode')}")
        print(f"{args}: prefill {out.get('prefill')}, decode {out.get('decode')}", file=sys.stderr)
    p, _ = gen(m, "--model", m, "-p", "x")
    check(p.returncode == 2, f"two model directories: exit {p.returncode}")

    runs = [gen("--model", m, "--prompt-ids", "0,5,6,7", "--max-tokens", "6", "--temperature", "1.0", "--seed", s)[1]
            .get("output_ids") for s in ("11", "11", "12")]
    check(runs[0] == runs[1] and runs[0], f"seeded sampling repeats: {runs}")
    check(runs[0] != runs[2], f"another seed differs: {runs}")

    p, _ = gen("--model", m, "--kernel-plan")
    lines = p.stdout.splitlines()
    check(p.returncode == 0 and lines and lines[0].startswith("head:"), f"--kernel-plan: {p.stdout[:200]}")
    layers = [l for l in lines if l.startswith("layer ")]
    check(len(layers) == 6, f"{len(layers)} layer lines")
    check(any("(CSA)" in l and "indexer_topk=" in l for l in layers), "CSA line with the indexer")
    check(any("(HCA)" in l and "compressor=" in l for l in layers), "HCA line with the compressor")
    check(all("moe_gemm[nvfp4]=" in l for l in layers), "NVFP4 experts in the plan")

    for bad in (["--model", m], ["--model", m, "--prompt-ids", "1,x"], ["--model", m, "--prompt-ids", "1",
                                                                         "--temperature", "-1"]):
        p, _ = gen(*bad)
        check(p.returncode == 2, f"{bad}: exit {p.returncode}")
    p, _ = gen("--model", os.path.join(d, "missing"), "--prompt-ids", "1")
    check(p.returncode == 1, f"missing model: exit {p.returncode}")

    if FAILS:
        print(f"{len(FAILS)} failures", file=sys.stderr)
        return 1
    print("ok", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
