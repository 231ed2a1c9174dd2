#!/usr/bin/env python3
"""tests/model/test_dspark_ref.py: the DSpark drafter's forward (model/dspark.c through
tests/model/dspark_dump.c, the CPU executor at --precision fp32) against the NumPy transcription
tests/model/dspark_ref.py, on the tiny 0731 FP8 checkpoint: the drafter's logits after the Markov
head for K = 5 slots, with fresh random prompts and anchors, once with fewer context positions
than the ring holds and once past a wrap of the ring. Tolerance: fp32 (max |diff| <= 2e-5 of the
row's largest |logit|, plus 1e-5); drafts equal unless the reference's top-2 margin is within it.

  test_dspark_ref.py DSPARK_DUMP_BINARY
"""
import fcntl
import os
import random
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dspark_ref  # noqa: E402

SRC = os.environ.get("DSV4_SOURCE_ROOT") or os.path.dirname(os.path.dirname(HERE))
BLD = os.environ.get("DSV4_BUILD_ROOT")


def tiny_0731(variant):
    """<build>/tiny-models-0731/tiny-0731-<variant>, generated under the lock tests/model/fwd_harness.h takes too."""
    top = os.path.join(BLD or tempfile.gettempdir(), "tiny-models-0731")
    out = os.path.join(top, "tiny-0731-" + variant)
    with open(top + ".lock", "a+") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        subprocess.run([sys.executable, os.path.join(SRC, "scripts", "make_tiny_model"), "--release", "0731",
                        "--variant", variant, "--out", out], capture_output=True, text=True, check=True)
    return out


def read_dump(path):
    raw = open(path, "rb").read()
    N, D, nt, V, K = np.frombuffer(raw, np.int32, 5)
    o = 20
    ids = np.frombuffer(raw, np.int32, N + 1, o); o += 4 * (N + 1)
    cap = np.frombuffer(raw, np.float32, N * nt * D, o).reshape(N, nt * D); o += 4 * N * nt * D
    drafts = np.frombuffer(raw, np.int32, K, o); o += 4 * K
    logits = np.frombuffer(raw, np.float32, K * V, o).reshape(K, V); o += 4 * K * V
    assert o == len(raw), (o, len(raw))
    return ids, cap, drafts, logits


def main():
    dump = sys.argv[1]
    ck = tiny_0731("fp8")
    window = dspark_ref.tinyref.load_json(os.path.join(ck, "config.json"))["sliding_window"]
    bad = 0
    with tempfile.TemporaryDirectory() as td:
        for N in (random.randint(3, window - 6), random.randint(window + 6, 2 * window + 10)):
            seed = random.randrange(1 << 30)
            out = os.path.join(td, f"d{N}.bin")
            subprocess.run([dump, ck, out, str(N), str(seed)], check=True)
            ids, cap, drafts, logits = read_dump(out)
            ref, ref_drafts = dspark_ref.draft(ck, cap.astype(np.float32), int(ids[N]), window, len(drafts))
            for i in range(len(drafts)):
                scale = float(np.abs(ref[i]).max())
                err = float(np.abs(ref[i] - logits[i]).max())
                tol = 2e-5 * scale + 1e-5
                top = np.sort(ref[i])[-2:]
                tie = top[1] - top[0] <= 2 * tol
                ok = err <= tol and (drafts[i] == ref_drafts[i] or tie)
                print(f"N={N} seed={seed} slot {i}: max|diff| {err:.3g} (tol {tol:.3g}), draft {drafts[i]} "
                      f"ref {ref_drafts[i]}{' (near tie)' if tie else ''} {'ok' if ok else 'MISMATCH'}")
                bad += not ok
    print("FAIL" if bad else "PASS")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
