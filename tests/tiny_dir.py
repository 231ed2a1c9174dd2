"""The tiny checkpoints the Python model-level tests use (the Python side of tests/tiny_dir.h).

tiny_dir() is the directory holding tiny-{bf16,fp8,nvfp4,fp8-deq,nvfp4-deq}: $DSV4_TINY_DIR when set,
else $DSV4_BUILD_ROOT/tiny-models (or /tmp/tiny-models), generated once by scripts/make_tiny_model
--variant all under the same file lock as the C tests, since meson runs tests in parallel.
Import it with the tests folder on sys.path: `sys.path.insert(0, os.path.join(SRC, "tests"))`.
"""
import fcntl
import os
import subprocess
import sys

SRC = os.environ.get("DSV4_SOURCE_ROOT", os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def tiny_dir():
    d = os.environ.get("DSV4_TINY_DIR")
    if d:
        return d
    d = os.path.join(os.environ.get("DSV4_BUILD_ROOT", "/tmp"), "tiny-models")
    stamp = os.path.join(d, "tiny-nvfp4-deq", ".make_tiny_model.stamp")
    if not os.path.exists(stamp):
        # the C forward tests share this directory and lock (tests/tiny_dir.h)
        with open(d + ".lock", "a+") as lk:
            fcntl.flock(lk, fcntl.LOCK_EX)
            if not os.path.exists(stamp):
                subprocess.run([sys.executable, os.path.join(SRC, "scripts", "make_tiny_model"), "--variant", "all",
                                "--out", d], check=True, stdout=subprocess.DEVNULL)
    return d
