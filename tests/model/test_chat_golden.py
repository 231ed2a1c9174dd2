#!/usr/bin/env python3
"""tests/model/test_chat_golden.py: the committed golden file is current.

Regenerates tests/model/data/chat_golden.json with scripts/gen_chat_golden.py
and DeepSeek's encoder, and demands the same cases. The encoder is not part
of the repository: point $DSV4_CHAT_ENCODER at encoding_dsv4.py (default
/tmp/encoding_dsv4.py); without it the test is skipped (exit 77).
"""
import json
import os
import subprocess
import sys
import tempfile

root = os.environ.get("DSV4_SOURCE_ROOT", os.path.join(os.path.dirname(__file__), "..", ".."))
encoder = os.environ.get("DSV4_CHAT_ENCODER", "/tmp/encoding_dsv4.py")
if not os.path.isfile(encoder):
    print(f"SKIP: no DeepSeek encoder at {encoder} (set DSV4_CHAT_ENCODER)", file=sys.stderr)
    sys.exit(77)

golden = os.path.join(root, "tests", "model", "data", "chat_golden.json")
with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "chat_golden.json")
    subprocess.run([sys.executable, os.path.join(root, "scripts", "gen_chat_golden.py"),
                    "--encoder", encoder, "--out", out], check=True)
    with open(out, encoding="utf-8") as f:
        fresh = json.load(f)
with open(golden, encoding="utf-8") as f:
    committed = json.load(f)

bad = 0
fresh_by_name = {c["name"]: c for c in fresh["cases"]}
for c in committed["cases"]:
    f = fresh_by_name.get(c["name"])
    if f != c:
        bad += 1
        print(f"case {c['name']}: differs from a fresh run of the generator", file=sys.stderr)
if len(fresh["cases"]) != len(committed["cases"]):
    bad += 1
    print("the number of cases differs", file=sys.stderr)
print(f"{len(committed['cases'])} cases checked, {bad} differ", file=sys.stderr)
sys.exit(1 if bad else 0)
