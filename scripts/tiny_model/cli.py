"""Command line of scripts/make_tiny_model: parses options, builds directories, prints each path."""

import argparse
import os
import sys

from . import build, model

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="make_tiny_model",
        description="Write a deterministic tiny DeepSeek-V4 checkpoint (docs/tiny-model.md) and "
                    "print its directory.")
    ap.add_argument("--variant", choices=("bf16", "fp8", "nvfp4", "all"), default="bf16",
                    help="checkpoint format; 'all' writes bf16, fp8, nvfp4, fp8-deq and nvfp4-deq")
    ap.add_argument("--dequantized", action="store_true",
                    help="store the quantized values dequantized (F32, bf16 layout); fp8 and nvfp4 only")
    ap.add_argument("--release", choices=model.RELEASES, default="june",
                    help="checkpoint layout: june (NextN MTP layer) or 0731 (three DSpark draft stages, "
                         "same main weights); 0731 takes --variant bf16, fp8, nvfp4 or all")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", metavar="DIR",
                    help="output directory (default models/tiny-<variant>[-deq] in the repository); "
                         "with --variant all, the parent of the tiny-<variant> directories")
    a = ap.parse_args(argv)
    if a.seed < 0:
        ap.error("--seed must be >= 0")
    if a.dequantized and a.variant not in ("fp8", "nvfp4"):
        ap.error("--dequantized applies to --variant fp8 or nvfp4")
    if a.release == "0731" and a.dequantized:
        ap.error("--dequantized applies to --release june")

    if a.release == "0731":
        names = model.VARIANTS_0731 if a.variant == "all" else ("0731-" + a.variant,)
        if a.variant == "all":
            parent = a.out or os.path.join(REPO, "models")
            jobs = [(v, os.path.join(parent, "tiny-" + v)) for v in names]
        else:
            jobs = [(names[0], a.out or os.path.join(REPO, "models", "tiny-" + names[0]))]
    elif a.variant == "all":
        parent = a.out or os.path.join(REPO, "models")
        jobs = [(v, os.path.join(parent, "tiny-" + v)) for v in model.VARIANTS]
    else:
        v = a.variant + ("-deq" if a.dequantized else "")
        jobs = [(v, a.out or os.path.join(REPO, "models", "tiny-" + v))]

    cache = {}

    def master():
        if "m" not in cache:
            cfg = model.config_for("0731-bf16") if a.release == "0731" else model.CONFIG
            cache["m"] = model.master_weights(a.seed, cfg)
        return cache["m"]

    try:
        for v, path in jobs:
            print(build.build(path, v, a.seed, master), flush=True)
    except BrokenPipeError:                          # stdout closed early (| head): not an error here
        sys.stderr.close()
        return 1
    except (OSError, RuntimeError) as exc:
        print(f"make_tiny_model: {exc}", file=sys.stderr)
        return 1
    return 0
