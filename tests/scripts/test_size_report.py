"""tests/scripts/test_size_report.py: scripts/size_report on a throwaway git
checkout with random sizes: files and C / Python functions over the limits
are listed with their lengths, those at or under are not, a 'size_report:'
note moves one to the explained list, and the script exits 0 either way."""
import os
import random
import subprocess
import sys
import tempfile

ROOT = os.environ.get("DSV4_SOURCE_ROOT", os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "scripts", "size_report")
rng = random.Random()
seed = rng.randrange(1 << 30)
rng.seed(seed)
print("seed", seed)
failed = 0


def check(cond, what):
    global failed
    if not cond:
        failed += 1
        print("FAIL:", what)


def c_func(name, body_lines, note=False):
    head = ["/* size_report: one table, kept whole. */"] if note else ["/* a function */"]
    return head + [f"static int {name}(int a,", "\t\tint b)", "{"] + ["\ta += b;"] * body_lines + ["\treturn a;", "}", ""]


with tempfile.TemporaryDirectory() as d:
    subprocess.run(["git", "init", "-q", d], check=True)
    lim = rng.randrange(20, 60)
    long_n, short_n, note_n = lim + rng.randrange(1, 30), lim - 5 - rng.randrange(0, 10), lim + 10
    lines = ["/* x.c: test */"] + c_func("long_one", long_n) + c_func("short_one", short_n) + c_func("noted", note_n, True)
    with open(os.path.join(d, "x.c"), "w") as f:
        f.write("\n".join(lines) + "\n")
    py_n = lim + rng.randrange(1, 20)
    with open(os.path.join(d, "y.py"), "w") as f:
        f.write('"""y.py"""\n\n\ndef big(x):\n' + "    x += 1\n" * py_n + "    return x\n\n\ndef small():\n    return 1\n")
    file_lim = len(lines) - 1
    r = subprocess.run([sys.executable, SCRIPT, "--root", d, "--file-lines", str(file_lim), "--function-lines", str(lim)],
                       capture_output=True, text=True)
    out = r.stdout
    print(out)
    check(r.returncode == 0, "exit status 0")
    check(f"{len(lines):6d}  x.c" in out, "x.c listed as a long file with its length")
    check(f"{long_n + 5:6d}  x.c:3  long_one" in out, "long_one listed with its length and line")
    check("short_one" not in out, "short_one not listed")
    noted = [ln for ln in out.splitlines() if "noted" in ln]
    check(len(noted) == 1 and out.index("explained functions") < out.index(noted[0]), "noted is explained")
    check(f"{py_n + 2:6d}  y.py:4  big" in out, "the Python function listed")
    check("small" not in out, "the short Python function not listed")
    check("1 files and 2 functions over the limits without a reason (1 explained)" in out, "the summary line")
print("failed", failed)
sys.exit(1 if failed else 0)
