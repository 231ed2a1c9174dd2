#!/usr/bin/env python3
"""tests/model/test_chat_golden.py: the committed golden file is current.

Regenerates tests/model/data/chat_golden.json with scripts/gen_chat_golden.py
and compares it case by case with the committed one:

- always (CI included): every case's inputs (messages, tools, options, names,
  their number), which the generator writes without DeepSeek's encoder; so a
  changed generator whose golden was not regenerated fails here, and the
  committed "expected" strings are checked to be there and plausible (each a
  non-empty prompt starting with the BOS token; tests/model/test_chat.c
  checks that model_chat_encode() reproduces them byte for byte);
- with $DSV4_CHAT_ENCODER pointing at DeepSeek's encoding_dsv4.py (not in
  this repository: it is DeepSeek's code): the "expected" strings too.
"""
import json
import os
import subprocess
import sys
import tempfile

root = os.environ.get("DSV4_SOURCE_ROOT", os.path.join(os.path.dirname(__file__), "..", ".."))
encoder = os.environ.get("DSV4_CHAT_ENCODER", "")
if encoder and not os.path.isfile(encoder):
    sys.exit(f"DSV4_CHAT_ENCODER={encoder}: no such file")

golden = os.path.join(root, "tests", "model", "data", "chat_golden.json")
with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "chat_golden.json")
    cmd = [sys.executable, os.path.join(root, "scripts", "gen_chat_golden.py"), "--out", out]
    if encoder:
        cmd += ["--encoder", encoder]
    subprocess.run(cmd, check=True)
    with open(out, encoding="utf-8") as f:
        fresh = json.load(f)
with open(golden, encoding="utf-8") as f:
    committed = json.load(f)

BOS = "<\uff5cbegin\u2581of\u2581sentence\uff5c>"
bad = 0
fresh_by_name = {c["name"]: c for c in fresh["cases"]}
for c in committed["cases"]:
    f = fresh_by_name.get(c["name"])
    want = c if encoder else {k: v for k, v in c.items() if k != "expected"}
    if f != want:
        bad += 1
        print(f"case {c['name']}: differs from a fresh run of the generator", file=sys.stderr)
    e = c.get("expected")
    if not isinstance(e, str) or not e.startswith(BOS):
        bad += 1
        print(f"case {c['name']}: no expected prompt starting with BOS", file=sys.stderr)
if len(fresh["cases"]) != len(committed["cases"]):
    bad += 1
    print("the number of cases differs", file=sys.stderr)
print(f"{len(committed['cases'])} cases checked ({'inputs and expected prompts' if encoder else 'inputs; the expected prompts need $DSV4_CHAT_ENCODER'}), {bad} differ", file=sys.stderr)
sys.exit(1 if bad else 0)
