#!/usr/bin/env python3
"""tests/server/test_kernels_cli.py: `dsv4 kernels` prints the load-time plan
(CPU device here), refuses bad flags with exit 2, and a simulated GPU gets a
complete plan in a CUDA build (every row a CUDA variant) and fails at load with
a message naming the layer and the op in a CPU-only build (no GPU images).
The real DeepSeek-V4-Flash configs in tests/model/data (config.json only) are
planned from the config alone, on the CPU and on simulated GPUs (12.1: the
acceptance check of the kernel registry issue)."""
import fcntl
import os
import subprocess
import sys

SRC = os.environ["DSV4_SOURCE_ROOT"]
BIN = os.environ["DSV4_BIN"]
failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAIL:", what, file=sys.stderr)


def tiny_dir():
    d = os.environ.get("DSV4_TINY_DIR")
    if d:
        return d
    d = os.path.join(os.environ.get("DSV4_BUILD_ROOT", "/tmp"), "tiny-models")
    stamp = os.path.join(d, "tiny-nvfp4-deq", ".make_tiny_model.stamp")
    if not os.path.exists(stamp):
        with open(d + ".lock", "a+") as lk:  # shared with the forward tests
            fcntl.flock(lk, fcntl.LOCK_EX)
            if not os.path.exists(stamp):
                subprocess.run([sys.executable, os.path.join(SRC, "scripts", "make_tiny_model"), "--variant", "all",
                                "--out", d], check=True, stdout=subprocess.DEVNULL)
    return d


def run(*args, env=None, verbose=True):
    """verbose (the default here): every layer's line and every row, which most checks read."""
    e = dict(os.environ)
    e.pop("DSV4_DISABLED_KERNELS", None)
    e.update(env or {})
    extra = ["--verbose"] if verbose and args else []
    return subprocess.run([BIN, "kernels", *args, *extra], capture_output=True, text=True, timeout=120, env=e)


def is_row(l):
    """A plan row "  LAYER OP KERNEL" (not a --verbose verdict line)."""
    w = l.split()
    return l.startswith("  ") and len(w) == 3 and w[0].lstrip("-").isdigit()


d = tiny_dir()
have_cuda = "cuda: yes" in subprocess.run([BIN, "version"], capture_output=True, text=True).stdout

for v in ("fp8", "nvfp4"):
    m = os.path.join(d, "tiny-" + v)
    p = run(m)
    check(p.returncode == 0, f"{v}: plan on the CPU exits 0 ({p.stderr.strip()[:300]})")
    check("device: cpu" in p.stdout, f"{v}: names the device")
    rows = [l.split() for l in p.stdout.splitlines() if is_row(l)]
    check(len(rows) > 50, f"{v}: per-(layer, op) rows printed ({len(rows)})")
    check(all(r[-1].endswith("cpu_ref") for r in rows), f"{v}: every CPU row is a reference variant")
    want = "moe_gemm[nvfp4]" if v == "nvfp4" else "moe_gemm[mxfp4]"
    check(want in p.stdout, f"{v}: the plan names the routed experts' stored format ({want})")

    for cc in ("8.0", "9.0", "10.0", "12.0", "12.1"):
        p = run(m, "--simulate-cc", cc)
        if have_cuda:
            # every op has a generic CUDA variant: the load must succeed
            rows = [l.split() for l in p.stdout.splitlines() if is_row(l)]
            check(p.returncode == 0 and "plan complete" in p.stdout,
                  f"{v} cc {cc}: complete plan ({p.returncode}: {p.stderr.strip()[:300]})")
            check(rows and not any(r[-1].endswith("cpu_ref") for r in rows),
                  f"{v} cc {cc}: a simulated GPU gets no CPU variant")
        else:
            # Nothing compiled for GPUs: the load fails naming layer and op,
            # exit 1, never a crash.
            check(p.returncode == 1, f"{v} cc {cc}: exit 1 when selection fails (got {p.returncode})")
            check(" op " in p.stderr and "no variant fits" in p.stderr and ("layer" in p.stderr or "head" in p.stderr),
                  f"{v} cc {cc}: the error names the layer (or head), op and reasons ({p.stderr.strip()[:200]})")
        check("(simulated)" in p.stdout, f"{v} cc {cc}: the device line says simulated")

# The real DeepSeek-V4-Flash configs (config.json only, tests/model/data): planned from the
# config alone, 43 layers + MTP; on simulated GPUs (12.1 = GB10: the acceptance check) the plan
# is complete in a CUDA build, and in a CPU-only build the failure names layer and op.
for name, fmt in (("deepseek-v4-flash", "mxfp4"), ("deepseek-v4-flash-nvfp4", "nvfp4")):
    m = os.path.join(SRC, "tests", "model", "data", name)
    p = run(m)
    check(p.returncode == 0 and "checkpoint: none, config.json only" in p.stdout and "plan complete: 43 layers + MTP"
          in p.stdout, f"{name}: CPU plan from config.json alone ({p.stderr.strip()[:300]})")
    check("layer 43 (sliding, MTP):" in p.stdout and "layer 42 (CSA):" in p.stdout and "layer 41 (HCA):" in p.stdout,
          f"{name}: the real layer schedule")
    check(f"moe_gemm[{fmt}]=" in p.stdout and "moe_gemm[mxfp4]=" in p.stdout.split("layer 43 (")[-1],
          f"{name}: routed experts {fmt}, MTP experts mxfp4")
    for cc in ("8.0", "8.9", "9.0", "10.0", "10.3", "12.0", "12.1"):
        p = run(m, "--simulate-cc", cc)
        if have_cuda:
            # every op has a generic CUDA variant: the plan must complete
            rows = [l.split() for l in p.stdout.splitlines() if is_row(l)]
            check(p.returncode == 0 and "plan complete: 43 layers + MTP" in p.stdout,
                  f"{name} cc {cc}: complete plan ({p.returncode}: {p.stderr.strip()[:300]})")
            check(len(rows) > 44 * 15 and not any(r[-1].endswith("cpu_ref") for r in rows),
                  f"{name} cc {cc}: every row a CUDA variant ({len(rows)} rows)")
            check({r[0] for r in rows} == {str(i) for i in range(-1, 44)}, f"{name} cc {cc}: rows for every layer")
        else:
            check(p.returncode == 1 and " op " in p.stderr and "no variant fits" in p.stderr and "layer " in p.stderr,
                  f"{name} cc {cc}: exit 1 naming layer and op ({p.returncode}: {p.stderr.strip()[:300]})")

# The 0731 configs: 46 compress_ratios, three DSpark stages planned after the 43 layers (draft
# experts MXFP4 in both), on every capability the acceptance lists.
for name, fmt in (("deepseek-v4-flash-0731", "mxfp4"), ("deepseek-v4-flash-0731-nvfp4", "nvfp4")):
    m = os.path.join(SRC, "tests", "model", "data", name)
    p = run(m)
    check(p.returncode == 0 and "plan complete: 43 layers + 3 DSpark stages" in p.stdout,
          f"{name}: CPU plan from config.json alone ({p.stderr.strip()[:300]})")
    check("layer 43 (sliding, DSpark):" in p.stdout and "layer 45 (sliding, DSpark):" in p.stdout
          and "MTP" not in p.stdout, f"{name}: the stages, no NextN layer")
    check(f"moe_gemm[{fmt}]=" in p.stdout.split("layer 43 (")[0] and
          "moe_gemm[mxfp4]=" in p.stdout.split("layer 45 (")[-1], f"{name}: routed {fmt}, draft experts mxfp4")
    for cc in ("8.0", "8.9", "9.0", "10.0", "10.3", "12.0", "12.1"):
        p = run(m, "--simulate-cc", cc)
        if have_cuda:
            rows = [l.split() for l in p.stdout.splitlines() if is_row(l)]
            check(p.returncode == 0 and "plan complete: 43 layers + 3 DSpark stages" in p.stdout,
                  f"{name} cc {cc}: complete plan ({p.returncode}: {p.stderr.strip()[:300]})")
            check({r[0] for r in rows} == {str(i) for i in range(-1, 46)} and
                  not any(r[-1].endswith("cpu_ref") for r in rows), f"{name} cc {cc}: CUDA rows for every layer")
        else:
            check(p.returncode == 1 and "no variant fits" in p.stderr, f"{name} cc {cc}: exit 1 ({p.returncode})")

# The default output fits one screen: one line per distinct layer plan naming the layers it
# covers, no rows; refusals say "not compiled" only for a binary without the image.
m = os.path.join(SRC, "tests", "model", "data", "deepseek-v4-flash")
p = run(m, verbose=False)
lines = p.stdout.splitlines()
check(p.returncode == 0 and len(lines) < 24 and not any(l.startswith("  ") for l in lines),
      f"default plan fits a screen, no rows ({len(lines)} lines)")
check("layers 4,6,\u2026,42 (CSA):" in p.stdout and "layers 3,5,\u2026,41 (HCA):" in p.stdout
      and "layer 43 (sliding, MTP):" in p.stdout and "plan complete: 43 layers + MTP" in p.stdout,
      "grouped layer lines name the layers they cover")
p = run(m, "--simulate-cc", "9.0", verbose=False)
if have_cuda:
    check("built without CUDA" not in p.stderr, "a CUDA build never says it was built without CUDA")
else:
    check(p.returncode == 1 and "not compiled" in p.stderr and "built without CUDA" in p.stderr,
          f"CPU-only build: the refusal says not compiled ({p.stderr.strip()[-200:]})")
    p = run(m, "--simulate-cc", "9.0")
    check("not implemented" not in p.stderr, "every op has a CUDA variant: nothing is 'not implemented'")
p = run("tiny", verbose=False, env={"DSV4_TINY_MODEL": os.path.join(d, "tiny-bf16")})
check(p.returncode == 0 and "plan complete" in p.stdout, f"'dsv4 kernels tiny' plans the tiny checkpoint ({p.stderr[-200:]})")
# Decode plans (--max-num-batched-tokens < 64; fp8gemv): on the GB10 and RTX Blackwell parts (12.1, 12.0)
# every FP8 linear of the real configs, MTP and DSpark stages included, runs the portable decode GEMV.
for name in ("deepseek-v4-flash", "deepseek-v4-flash-nvfp4", "deepseek-v4-flash-0731", "deepseek-v4-flash-0731-nvfp4"):
    m = os.path.join(SRC, "tests", "model", "data", name)
    for cc in ("12.0", "12.1"):
        for T in ("1", "32"):
            p = run(m, "--simulate-cc", cc, "--max-num-batched-tokens", T)
            if have_cuda:
                lin = [r for r in (l.split() for l in p.stdout.splitlines() if is_row(l)) if r[1] == "linear"]
                gemv_layers = {r[0] for r in lin if r[2] == "linear_cuda_gemv"}
                layers = {r[0] for r in lin if r[0] != "-1"}
                other = {r[2] for r in lin if r[2] not in ("linear_cuda_gemv", "linear_cuda_gemv_bf16")}
                check(p.returncode == 0 and layers and gemv_layers == layers and not other,
                      f"{name} cc {cc} T {T}: every FP8 linear on linear_cuda_gemv "
                      f"({p.returncode}, {len(gemv_layers)}/{len(layers)} layers, others {sorted(other)})")
                # and the bf16 ones (router gate of every layer, the head: layer -1) on the bf16 GEMV
                bf16_layers = {r[0] for r in lin if r[2] == "linear_cuda_gemv_bf16"}
                check(bf16_layers == layers | {"-1"},
                      f"{name} cc {cc} T {T}: router gates and head on linear_cuda_gemv_bf16 "
                      f"({len(bf16_layers)}/{len(layers) + 1})")
                # and attention runs the portable decode row (attn_decode.cu)
                att = {l.split()[2] for l in p.stdout.splitlines()
                       if l.startswith("  ") and l.split()[1] == "sparse_attn"}
                check(att == {"sparse_attn_cuda_decode"}, f"{name} cc {cc} T {T}: sparse_attn rows {sorted(att)}")
            else:
                check(p.returncode == 1 and "no variant fits" in p.stderr, f"{name} cc {cc} T {T}: exit 1")
m = os.path.join(SRC, "tests", "model", "data", "deepseek-v4-flash")
p = run(m, "--max-num-batched-tokens", "0")
check(p.returncode == 2 and "--max-num-batched-tokens" in p.stderr, "--max-num-batched-tokens 0: exit 2, named")

m = os.path.join(d, "tiny-fp8")
p = run(m, "--simulate-cc", "9")
check(p.returncode == 2 and "MAJOR.MINOR" in p.stderr, "bad --simulate-cc: exit 2 with the expected form")
p = run(m, "--disable-kernel", "no_such_kernel")
check(p.returncode == 2 and "no_such_kernel" in p.stderr, "unknown --disable-kernel name: exit 2, named")
p = run(m, env={"DSV4_DISABLED_KERNELS": "linear_cpu_ref"})
check(p.returncode == 1 and "linear_cpu_ref" in p.stderr and "disabled" in p.stderr,
      "disabling the only CPU linear fails the load, naming the disabled variant")
p = run(os.path.join(d, "does-not-exist"))
check(p.returncode == 1 and "does-not-exist" in p.stderr, "a missing model directory: exit 1, named")
p = run()
check(p.returncode == 2, "no MODEL_DIR: usage, exit 2")


# ---- the same selection in `serve`: the plan in the start-up log, overrides ----
def serve(*args, env=None, wait_for="serving", timeout=240):
    import signal, time
    e = dict(os.environ)
    e.pop("DSV4_DISABLED_KERNELS", None)
    e.update(env or {})
    p = subprocess.Popen([BIN, "serve", "--port", "0", *args], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                         text=True, env=e)
    lines, t0 = [], time.time()
    while time.time() - t0 < timeout:
        line = p.stderr.readline()
        if not line:
            break
        lines.append(line)
        if wait_for in line:
            break
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        lines += p.stderr.read().splitlines(True)
    p.wait(timeout=120)
    return p.returncode, "".join(lines)


m = os.path.join(d, "tiny-fp8")
rc, log = serve("--model", m, "--kernel-selfcheck", "--max-num-batched-tokens", "64")
check(rc == 0, f"serve --kernel-selfcheck starts and drains (rc {rc})")
check("kernels: layers" in log and "moe_gemm=" in log, "the kernel plan is in the start-up log")
check(log.find("kernels: layers") < log.find("serving"), "the plan is logged before the port opens")
rc, log = serve("--model", m, "--disable-kernel", "no_such_kernel")
check(rc == 2 and "no_such_kernel" in log, "serve --disable-kernel with an unknown name exits 2 naming it")
rc, log = serve("--model", m, env={"DSV4_DISABLED_KERNELS": "moe_gemm_cpu_ref"})
check(rc == 1 and "moe_gemm" in log and "no variant fits" in log,
      "serve with the only CPU expert GEMM disabled fails at load naming the op and the reasons")

print(f"{failures} failures", file=sys.stderr)
sys.exit(1 if failures else 0)
