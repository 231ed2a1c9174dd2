#!/usr/bin/env python3
"""tests/model/test_inspect.py: `dsv4 inspect` on every tiny checkpoint variant and on broken copies.

The tiny checkpoints come from scripts/make_tiny_model (an independent Python writer of the release
layout), generated into a temporary directory. For each variant the summary must be right (layer map,
tensor count, bytes per dtype checked against the files' own headers, quantization), and `--tensors`
must list exactly the tensors of the shard headers with their dtypes and shapes. Then each variant is
broken in eight ways (truncate a shard, corrupt a header, delete a shard, rename a tensor, change a
dtype, change a shape in config.json, add an unknown tensor, overlap two tensors' offsets) plus a few
index mismatches; each copy must make inspect exit 1 (not crash) with a message naming the file and
the tensor, and with no sanitizer report.

Environment (set by meson): DSV4_BIN, DSV4_SOURCE_ROOT. Exits 77 (skip) when the generator is absent.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

SRC = os.environ.get("DSV4_SOURCE_ROOT", os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("DSV4_BIN", os.path.join(SRC, "build", "server", "dsv4"))
GEN = os.path.join(SRC, "scripts", "make_tiny_model")

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)


def run_inspect(d, *extra):
    env = dict(os.environ)
    env.setdefault("ASAN_OPTIONS", "detect_leaks=1:halt_on_error=1")
    p = subprocess.run([BIN, "inspect", *extra, d], capture_output=True, text=True, env=env, timeout=120)
    return p.returncode, p.stdout, p.stderr


def read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return n, json.loads(f.read(n))


def write_header(path, header):
    """Rewrite path's header (keeping the data section)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        f.seek(8 + n)
        data = f.read()
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    os.unlink(path)  # may be a symlink to the pristine copy
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def shards(d):
    return sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))


def clone(src, dst):
    """A copy whose shards are symlinks; anything to be modified is unlinked first."""
    os.mkdir(dst)
    for f in os.listdir(src):
        s = os.path.join(src, f)
        if f.endswith(".safetensors"):
            os.symlink(s, os.path.join(dst, f))
        elif os.path.isfile(s):
            shutil.copy(s, os.path.join(dst, f))
    return dst


def materialize(path):
    real = os.path.realpath(path)
    os.unlink(path)
    shutil.copy(real, path)


EXPECT = {
    # variant: (tensors, quantization text, routed experts column, main layers / MTP)
    "bf16": (357, "none (BF16 linears)", ("BF16", "BF16")),
    "fp8": (585, "routed experts MXFP4", ("MXFP4", "MXFP4")),
    "nvfp4": (873, "routed experts NVFP4 (MTP MXFP4)", ("NVFP4", "MXFP4")),
    "fp8-deq": (357, "none (dequantized linears)", ("F32", "F32")),
    "nvfp4-deq": (357, "none (dequantized linears)", ("F32", "F32")),
}


def check_valid(name, d):
    rc, out, err = run_inspect(d)
    check(rc == 0, f"{name}: inspect rc {rc}: {err.strip()}")
    if rc != 0:
        return
    n_tensors, quant, (routed_main, routed_mtp) = EXPECT[name]
    for line in ("sliding      0 1 6(mtp.0)", "CSA          2 4", "HCA          3 5",
                 "hash-routed  0 1", "MTP          6(mtp.0)"):
        check(line in out, f"{name}: layer map line '{line}' missing")
    check(f"tensors: {n_tensors} in 3 shards" in out, f"{name}: tensor count")
    check(quant in out, f"{name}: quantization '{quant}'")
    rows = {ln.split()[0]: ln.split() for ln in out.splitlines() if ln.startswith("  ") and ln.split()
            and ln.split()[0].isdigit() and len(ln.split()) == 9}
    check(len(rows) == 7, f"{name}: 7 layer rows, got {len(rows)}")
    if len(rows) == 7:
        check(rows["3"][2] == "HCA" and rows["3"][3] == "8" and rows["2"][2] == "CSA", f"{name}: row kinds")
        check(rows["0"][4] == "hash" and rows["2"][4] == "topk" and rows["6"][1] == "mtp.0", f"{name}: rows")
        check(rows["0"][7] == routed_main and rows["6"][7] == routed_mtp, f"{name}: routed formats")
    # bytes per dtype, from the headers themselves
    per = {}
    total = 0
    names = {}
    for s in shards(d):
        _, h = read_header(os.path.join(d, s))
        for k, v in h.items():
            if k == "__metadata__":
                continue
            b = v["data_offsets"][1] - v["data_offsets"][0]
            cnt, by = per.get(v["dtype"], (0, 0))
            per[v["dtype"]] = (cnt + 1, by + b)
            total += b
            names[k] = (v["dtype"], v["shape"], s)
    check(f"{total} bytes" in out, f"{name}: total bytes {total}")
    for dt, (cnt, by) in per.items():
        want = f"{dt} {cnt} tensors {by} bytes"
        got = [" ".join(ln.split()[:5]) for ln in out.splitlines() if ln.strip().startswith(dt + " ")]
        check(want in got, f"{name}: dtype line '{want}' not in {got}")
    # --tensors lists exactly the header contents
    rc, out, err = run_inspect(d, "--tensors")
    listed = {}
    for ln in out.splitlines():
        if "[" in ln and ".safetensors" in ln:
            nm, dt = ln.split()[:2]
            shape = json.loads(ln[ln.index("["):ln.index("]") + 1])
            listed[nm] = (dt, shape, ln.split()[-2])
    check(rc == 0 and listed == names, f"{name}: --tensors listing differs from the shard headers")


def expect_refused(label, d, *needles):
    rc, out, err = run_inspect(d)
    check(rc == 1, f"{label}: rc {rc} (expected 1): {err.strip()[:300]}")
    for bad in ("AddressSanitizer", "LeakSanitizer", "runtime error", "Segmentation"):
        check(bad not in err, f"{label}: sanitizer/crash output: {err[:500]}")
    check("tensor " in err, f"{label}: message does not name a tensor: {err.strip()}")
    for n in needles:
        check(n in err, f"{label}: message lacks '{n}': {err.strip()}")


def break_all(name, src, tmp):
    sh = shards(src)
    s1, s2, s3 = sh
    n = [0]

    def fresh(what):
        n[0] += 1
        return clone(src, os.path.join(tmp, f"{name}-{n[0]:02d}-{what}"))

    # truncate a shard
    d = fresh("truncate")
    p = os.path.join(d, s2)
    materialize(p)
    os.truncate(p, os.path.getsize(p) - 1000)
    expect_refused(f"{name}/truncate", d, s2, "truncated")

    # corrupt a header (in the middle of the JSON)
    d = fresh("corrupt")
    p = os.path.join(d, s1)
    materialize(p)
    hl, _ = read_header(p)
    with open(p, "r+b") as f:
        f.seek(8 + hl // 2)
        f.write(b"\x00#!{")
    expect_refused(f"{name}/corrupt-header", d, s1, "not valid JSON")

    # delete a shard
    d = fresh("delete")
    os.unlink(os.path.join(d, s3))
    expect_refused(f"{name}/delete-shard", d, s3, "missing shard")

    # rename a tensor (shard and index)
    d = fresh("rename")
    p = os.path.join(d, s1)
    _, h = read_header(p)
    h["layers.1.attn.kv_norm.weight_renamed"] = h.pop("layers.1.attn.kv_norm.weight")
    write_header(p, h)
    ip = os.path.join(d, "model.safetensors.index.json")
    idx = json.load(open(ip))
    idx["weight_map"]["layers.1.attn.kv_norm.weight_renamed"] = idx["weight_map"].pop("layers.1.attn.kv_norm.weight")
    json.dump(idx, open(ip, "w"))
    expect_refused(f"{name}/rename", d, "layers.1.attn.kv_norm.weight", "missing")

    # change a dtype (same width, so only the schema can tell)
    d = fresh("dtype")
    p = os.path.join(d, s2)
    _, h = read_header(p)
    h["layers.4.attn.q_norm.weight"]["dtype"] = "F16"
    write_header(p, h)
    expect_refused(f"{name}/dtype", d, s2, "layers.4.attn.q_norm.weight", "dtype F16, expected BF16")

    # change a shape in config.json
    d = fresh("config-shape")
    cp = os.path.join(d, "config.json")
    cfg = json.load(open(cp))
    cfg["o_lora_rank"] = 16
    json.dump(cfg, open(cp, "w"))
    expect_refused(f"{name}/config-shape", d, s1, "layers.0.attn.wo_a.weight", "expected [64, 128]")

    # add an unknown tensor (to shard 3 and the index)
    d = fresh("unknown")
    p = os.path.join(d, s3)
    materialize(p)
    hl, h = read_header(p)
    size = os.path.getsize(p) - 8 - hl
    h["mtp.0.attn.mystery.weight"] = {"dtype": "F32", "shape": [2], "data_offsets": [size, size + 8]}
    write_header(p, h)
    with open(p, "ab") as f:
        f.write(b"\0" * 8)
    ip = os.path.join(d, "model.safetensors.index.json")
    idx = json.load(open(ip))
    idx["weight_map"]["mtp.0.attn.mystery.weight"] = s3
    idx["metadata"]["total_size"] += 8
    json.dump(idx, open(ip, "w"))
    expect_refused(f"{name}/unknown", d, s3, "mtp.0.attn.mystery.weight", "unknown")

    # overlapping offsets (two tensors of the same size share a range)
    d = fresh("overlap")
    p = os.path.join(d, s1)
    _, h = read_header(p)
    h["layers.0.attn_norm.weight"]["data_offsets"] = list(h["layers.0.ffn_norm.weight"]["data_offsets"])
    write_header(p, h)
    expect_refused(f"{name}/overlap", d, s1, "overlap")

    # the index and the shards disagree
    d = fresh("index-wrong-shard")
    ip = os.path.join(d, "model.safetensors.index.json")
    idx = json.load(open(ip))
    idx["weight_map"]["embed.weight"] = s2
    json.dump(idx, open(ip, "w"))
    expect_refused(f"{name}/index-wrong-shard", d, s1, "embed.weight", "lists it in")

    d = fresh("index-extra")
    ip = os.path.join(d, "model.safetensors.index.json")
    idx = json.load(open(ip))
    idx["weight_map"]["layers.0.ghost"] = s1
    json.dump(idx, open(ip, "w"))
    expect_refused(f"{name}/index-extra", d, s1, "layers.0.ghost", "not in this shard")


def main():
    if not os.path.exists(GEN):
        print("SKIP: scripts/make_tiny_model not found", file=sys.stderr)
        return 77
    if not os.path.exists(BIN):
        print(f"SKIP: {BIN} not built", file=sys.stderr)
        return 77
    tmp = tempfile.mkdtemp(prefix="dsv4-test-inspect-")
    try:
        p = subprocess.run([sys.executable, GEN, "--variant", "all", "--out", os.path.join(tmp, "models")],
                           capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            print(p.stderr, file=sys.stderr)
            check(False, "make_tiny_model failed")
            return 1
        dirs = [ln.strip() for ln in p.stdout.splitlines() if ln.strip()]
        check(len(dirs) == 5, f"make_tiny_model wrote {len(dirs)} directories")
        for d in dirs:
            name = os.path.basename(d).replace("tiny-", "")
            if name not in EXPECT:
                check(False, f"unexpected variant {name}")
                continue
            check_valid(name, d)
            break_all(name, d, tmp)
        # usage errors
        rc, _, _ = run_inspect("--bogus")
        check(rc == 2, "unknown option must be a usage error")
        p = subprocess.run([BIN, "inspect"], capture_output=True, text=True)
        check(p.returncode == 2, "no MODEL_DIR must be a usage error")
        rc, _, err = run_inspect(os.path.join(tmp, "does-not-exist"))
        check(rc == 1 and "not a directory" in err, "a missing directory")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(failures)} failures", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
