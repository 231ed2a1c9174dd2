"""tests/e2e/test_tp_serve.py: tensor-parallel serving, end to end, through HTTP.

1. `dsv4 serve --model tiny --precision fp32` (TP=1) and the same with `--tensor-parallel-size 2`
   (two ranks as threads) give the same greedy completions of fresh random prompts: the same tokens
   with logprobs within LP_TOL (fp32 sums in another order), except after a near tie (TP=1's top two
   within LP_TOL), where the texts may legitimately part. In the default reference precision each
   rank rounds its partial sums to bf16, which moves the tiny random model's logprobs by ~0.2, so
   that comparison would not be exact.
2. Two processes on loopback (`--nnodes 2 --node-rank 0` and `--node-rank 1 --master-addr
   127.0.0.1`): the bootstrap handshake runs, the TCP data channel carries the collectives, and
   the completions equal the threads' TP=2 exactly (both sum in rank order). SIGTERM on rank 0
   stops both with exit 0. A SIGSTOPped worker makes /health 503 within seconds (not after
   --tp-timeout) and SIGCONT brings it back. Both share a --tp-secret-file; a stray HTTP request at the bootstrap
   port before the worker comes is dropped (rank 0 used to exit on it). The same pair speculating
   (MTP, K = 2, fp32; the worker is told the method by rank 0) gives the plain TP=2 threads' answers.
3. Failures, each a non-zero exit with a clear message and no hang: a worker with another
   checkpoint (the tiny model with another seed) -> both name the fingerprint; a worker that never
   comes -> rank 0 gives up after --tp-timeout; kill -9 of the worker mid-request -> rank 0's
   /health answers 503, the request ends, rank 0 exits non-zero; kill -9 of rank 0 -> the worker
   exits non-zero. Every log, the failing processes' too, must be sanitizer-clean.
"""
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

BIN = os.environ.get("DSV4_BIN", "build/server/dsv4")
ROOT = os.environ.get("DSV4_SOURCE_ROOT", ".")
TMP = tempfile.mkdtemp(prefix="dsv4-tp-")
LP_TOL = 2e-3
FAILS = []
N_CHECKS = [0]


def check(cond, what):
    N_CHECKS[0] += 1
    if not cond:
        FAILS.append(what)
        print("FAIL:", what, file=sys.stderr, flush=True)


def free_port():
    """A free port below the kernel's ephemeral range. A port from bind(0) is in that range, and rank 0
    binds its HTTP port (--port 0) before it listens on the master port: that bind(0) hands out the port
    just freed again 7e-5 of the time (measured: 69 in 988,795), so with 5 pairs a run failed ~3.5e-4 of
    the time. Below the range no bind(0) (nor a connect()'s source port) can take it."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        lo = 32768
    pick = random.SystemRandom()
    for _ in range(1000):
        p = pick.randrange(max(1024, lo // 2), max(lo, 1025))
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", p))
            return p
        except OSError:
            continue
        finally:
            s.close()
    sys.exit("no free port below the ephemeral range (%d)" % lo)


class Proc:
    def __init__(self, name, *args):
        self.name = name
        self.logpath = os.path.join(TMP, name + ".log")
        self.log = open(self.logpath, "w+")
        self.p = subprocess.Popen([BIN, "serve", *args], stdout=self.log, stderr=subprocess.STDOUT)
        self.port = None

    def text(self):
        self.log.flush()
        with open(self.logpath) as f:
            return f.read()

    def wait_http(self, timeout=120):
        t0 = time.time()
        while time.time() - t0 < timeout and self.p.poll() is None:
            m = re.search(r"on http://[0-9.]+:(\d+)", self.text())
            if m:
                self.port = int(m.group(1))
                return True
            time.sleep(0.1)
        print("%s did not start:\n%s" % (self.name, self.text()), file=sys.stderr)
        return False

    def wait_exit(self, timeout):
        try:
            return self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


def post(port, body, timeout=120):
    req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % port, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")
    except (urllib.error.URLError, ConnectionError, socket.timeout) as e:
        return 0, {"error": str(e)}


def health(port):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, ConnectionError, socket.timeout):
        return 0


WORDS = ["the", "cat", "river", "seven", "quantum", "blue", "mountain", "code", "hello", "world", "apple",
         "light", "music", "engine", "paper", "storm", "garden", "silver", "north", "window"]
rng = random.Random(int(os.environ.get("DSV4_TEST_SEED", str(time.time_ns()))))
PROMPTS = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9))) for _ in range(3)]
N_TOK = 8
print("prompts:", PROMPTS, flush=True)


def completions(port):
    out = []
    for p in PROMPTS:
        st, body = post(port, {"model": "tiny", "prompt": p, "max_tokens": N_TOK, "temperature": 0,
                               "logprobs": 2, "ignore_eos": True})
        check(st == 200, "completion status %s: %s" % (st, body))
        if st != 200:
            out.append(None)
            continue
        lp = body["choices"][0]["logprobs"]
        out.append((body["choices"][0]["text"], lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]))
    return out


def serve_tiny(name, *extra):
    s = Proc(name, "--model", "tiny", "--port", "0", *extra)
    return s if s.wait_http() else None


def stop(s, what, want_rc=0):
    s.p.send_signal(signal.SIGTERM)
    rc = s.wait_exit(60)
    check(rc == want_rc, "%s: exit %s after SIGTERM (want %s)\n%s" % (what, rc, want_rc, s.text()[-3000:]))


# ---- 1. TP=1 vs TP=2 threads ----
s1 = serve_tiny("tp1", "--precision", "fp32")
ref = completions(s1.port) if s1 else []
if s1:
    stop(s1, "TP=1")
s2 = serve_tiny("tp2", "--tensor-parallel-size", "2", "--precision", "fp32")
tp2_fp32 = completions(s2.port) if s2 else []
if s2:
    check("2 ranks as threads" in s2.text(), "TP=2 log does not mention the two rank threads")
    stop(s2, "TP=2 threads")
def compare(ref, got, what):
    """Greedy completions of one fp32 run vs another that sums in another order: the same tokens with
    logprobs within LP_TOL, up to a near tie (ref's top two within LP_TOL), after which they may part."""
    n_cmp = n_tot = 0
    for i, (a, b) in enumerate(zip(ref, got)):
        if not a or not b:
            check(False, "%s: prompt %d has no completion" % (what, i))
            continue
        n_tot += len(a[1])
        for k in range(len(a[1])):
            if k < len(b[1]) and a[1][k] == b[1][k]:
                check(abs(a[2][k] - b[2][k]) < LP_TOL,
                      "%s: prompt %d token %d: logprob %.4f vs %.4f" % (what, i, k, a[2][k], b[2][k]))
                n_cmp += 1
                continue
            top = sorted(a[3][k].values(), reverse=True)
            gap = top[0] - top[1] if len(top) > 1 else 99
            check(gap < LP_TOL, "%s: prompt %d token %d: %r vs %r but the reference's top-2 gap is %.3f "
                  "(not a near tie)" % (what, i, k, a[1][k], b[1][k:k + 1], gap))
            print("%s: prompt %d: near tie at token %d (gap %.3f)" % (what, i, k, gap), flush=True)
            break
    print("%s: %d of %d tokens compared equal" % (what, n_cmp, n_tot), flush=True)
    check(n_tot > 0 and n_cmp * 2 >= n_tot, "%s: only %d of %d tokens comparable" % (what, n_cmp, n_tot))


compare(ref, tp2_fp32, "TP=1 vs TP=2")

# the reference of the two-process run: TP=2 threads in the default (reference) precision
s2 = serve_tiny("tp2-ref", "--tensor-parallel-size", "2")
tp2 = completions(s2.port) if s2 else []
if s2:
    stop(s2, "TP=2 threads, reference precision")


SECRET = os.path.join(TMP, "tp-secret")
with open(os.open(SECRET, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
    f.write(os.urandom(32).hex() + "\n")


def stray_packet(mport):
    """An HTTP request at the bootstrap port (issue 17: rank 0 exited on it); returns once dropped."""
    for _ in range(600):
        try:
            c = socket.create_connection(("127.0.0.1", mport), timeout=10)
        except OSError:  # rank 0 still loading: not listening yet
            time.sleep(0.1)
            continue
        with c:
            try:
                c.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                while c.recv(4096):
                    pass
            except ConnectionResetError:  # dropped with our bytes unread
                pass
            except OSError:
                return False
        return True
    return False


def pair(name, worker_model="tiny", timeout_s="30", start_worker=True, stray=False, rank0_args=()):
    mport = free_port()
    m = Proc(name + "-rank0", "--model", "tiny", "--port", "0", "--nnodes", "2", "--node-rank", "0",
             "--master-addr", "127.0.0.1", "--master-port", str(mport), "--tp-timeout", timeout_s,
             "--tp-secret-file", SECRET, *rank0_args)
    if stray:
        check(stray_packet(mport), "%s: could not reach the bootstrap port %d" % (name, mport))
    w = None
    if start_worker:
        w = Proc(name + "-rank1", "--model", worker_model, "--nnodes", "2", "--node-rank", "1",
                 "--master-addr", "127.0.0.1", "--master-port", str(mport), "--tp-timeout", timeout_s,
                 "--tp-secret-file", SECRET)
    return m, w


# ---- 2. two processes (a stray HTTP request at the bootstrap port first: dropped, the group forms) ----
m, w = pair("pair", stray=True)
if m.wait_http():
    got = completions(m.port)
    for i, (a, b) in enumerate(zip(tp2, got)):
        check(a is not None and b is not None and a[0] == b[0] and a[2] == b[2],
              "prompt %d: two processes %r differ from TP=2 threads %r" % (i, b and b[0], a and a[0]))
    check("worker rank 1 joined" in m.text(), "rank 0 log lacks the bootstrap join")
    check("running rank 0's step plans" in w.text(), "worker log lacks its start")
    check("on http://" not in w.text(), "the worker started an HTTP server")
    # issue 17: a stopped worker (SIGSTOP) turns /health to 503 within seconds, not after --tp-timeout;
    # SIGCONT before the timeout: 200 again, the group goes on
    check(health(m.port) == 200, "pair: /health 200 before SIGSTOP")
    # (the stall limit is 10 s for a group (server/cmd_serve.c health_stall_s); 503 came after ~12 s on a
    # loaded machine, so the poll runs to 25 s: still short of the 30 s --tp-timeout it must beat)
    w.p.send_signal(signal.SIGSTOP)
    t0 = time.time()
    while time.time() - t0 < 25 and health(m.port) != 503:
        time.sleep(0.5)
    t_503 = time.time() - t0
    check(t_503 < 25, "SIGSTOPped worker: /health still not 503 after %.0f s" % t_503)
    w.p.send_signal(signal.SIGCONT)
    t1 = time.time()
    while time.time() - t1 < 20 and health(m.port) != 200:
        time.sleep(0.5)
    check(health(m.port) == 200, "SIGCONT: /health back to 200")
    print("SIGSTOP worker: /health 503 after %.1f s, 200 again %.1f s after SIGCONT" % (t_503, time.time() - t1),
          flush=True)
    stop(m, "two processes: rank 0")
    rc = w.wait_exit(30)
    check(rc == 0, "two processes: worker exit %s after rank 0's shutdown\n%s" % (rc, w.text()[-3000:]))
    print("two processes: completions equal TP=2 threads; clean shutdown", flush=True)
m.kill()
w.kill()

# ---- 2b. two processes speculating (MTP, K = 2, fp32): the worker learns the method and the precision
# from rank 0 and wraps its executor the same way; the answers equal the plain TP=2 threads' in fp32 ----
m, w = pair("pair-spec", rank0_args=("--precision", "fp32", "--speculative-config",
                                     json.dumps({"method": "mtp", "num_speculative_tokens": 2})))
if m.wait_http():
    # a verify step scores several positions in one forward: fp32 sums in another order than decoding
    compare(tp2_fp32, completions(m.port), "plain TP=2 threads vs two speculating processes")
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % m.port, timeout=10) as r:
            mtext = r.read().decode()
    except (urllib.error.URLError, ConnectionError, socket.timeout) as e:
        mtext = str(e)
    drafts = re.search(r"^dsv4:spec_decode_num_drafts_total(?:\{[^}]*\})? ([0-9.e+]+)$", mtext, re.M)
    check(drafts is not None and float(drafts.group(1)) > 0, "two speculating processes: no drafts in /metrics")
    check("running rank 0's step plans" in w.text(), "speculating worker log lacks its start")
    stop(m, "two speculating processes: rank 0")
    rc = w.wait_exit(30)
    check(rc == 0, "two speculating processes: worker exit %s after rank 0's shutdown\n%s" % (rc, w.text()[-3000:]))
    print("two speculating processes: %s drafts" %
          (drafts.group(1) if drafts else "no"), flush=True)
m.kill()
w.kill()

# ---- 3a. another checkpoint on the worker ----
other = os.path.join(TMP, "tiny-other-seed")
py = os.path.join(ROOT, ".venv", "bin", "python3")
r = subprocess.run([py if os.path.exists(py) else sys.executable, os.path.join(ROOT, "scripts", "make_tiny_model"),
                    "--variant", "bf16", "--seed", str(rng.randint(1000, 10**6)), "--out", other],
                   capture_output=True, text=True)
check(r.returncode == 0, "make_tiny_model --seed failed: %s" % r.stderr[-2000:])
if r.returncode == 0:
    m, w = pair("fingerprint", worker_model=other, timeout_s="20")
    rcm, rcw = m.wait_exit(60), w.wait_exit(60)
    check(rcm not in (0, None), "fingerprint mismatch: rank 0 exit %s" % rcm)
    check(rcw not in (0, None), "fingerprint mismatch: worker exit %s" % rcw)
    check("fingerprint differs" in m.text(), "rank 0 does not name the fingerprint:\n" + m.text()[-2000:])
    check("fingerprint differs" in w.text(), "worker does not name the fingerprint:\n" + w.text()[-2000:])
    print("fingerprint mismatch:", [l for l in w.text().splitlines() if "fingerprint" in l][-1:], flush=True)
    m.kill()
    w.kill()

# ---- 3b. the worker never comes ----
m, _ = pair("nobody", timeout_s="2", start_worker=False)
t0 = time.time()
rc = m.wait_exit(60)
check(rc not in (0, None), "no worker: rank 0 exit %s" % rc)
check("timed out" in m.text() and "waiting for worker" in m.text(), "no worker: message:\n" + m.text()[-2000:])
print("no worker: rank 0 exit %s after %.1f s" % (rc, time.time() - t0), flush=True)
m.kill()

# ---- 3c. kill -9 the worker mid-request ----
m, w = pair("kill")
if m.wait_http():
    res = {}

    def long_request():
        res["r"] = post(m.port, {"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 2000, "temperature": 0,
                                 "ignore_eos": True}, timeout=60)

    th = threading.Thread(target=long_request)
    th.start()
    time.sleep(1.0)
    w.p.kill()
    saw503 = False
    t0 = time.time()
    while time.time() - t0 < 15 and m.p.poll() is None:
        if health(m.port) == 503:
            saw503 = True
            break
        time.sleep(0.05)
    check(saw503, "kill -9 worker: rank 0 never answered /health 503")
    rc = m.wait_exit(30)
    check(rc not in (0, None), "kill -9 worker: rank 0 exit %s (want non-zero)" % rc)
    th.join(30)
    check(not th.is_alive(), "kill -9 worker: the in-flight request hangs")
    st, body = res.get("r", (None, None))
    finished = st == 200 and "choices" in body and body["choices"][0]["finish_reason"] == "length" and \
        body["usage"]["completion_tokens"] == 2000
    check(not finished, "kill -9 worker: the request finished normally after its worker died")
    check("closed the connection" in m.text(), "rank 0 does not say the worker went away:\n" + m.text()[-2000:])
    print("kill -9 worker: /health 503, rank 0 exit %s, request ended with %s %s" % (rc, st, json.dumps(body)[:200]),
          flush=True)
m.kill()
w.kill()

# ---- 3d. kill -9 rank 0: the worker exits non-zero ----
m, w = pair("killmaster")
if m.wait_http():
    m.p.kill()
    rc = w.wait_exit(30)
    check(rc not in (0, None), "kill -9 rank 0: worker exit %s (want non-zero)" % rc)
    check("closed the connection" in w.text(), "worker does not say rank 0 went away:\n" + w.text()[-2000:])
    print("kill -9 rank 0: worker exit %s" % rc, flush=True)
m.kill()
w.kill()

# every process, including those that exit 1 on purpose, must be sanitizer-clean
for name in sorted(os.listdir(TMP)):
    if name.endswith(".log"):
        with open(os.path.join(TMP, name)) as f:
            t = f.read()
        check("Sanitizer" not in t and "runtime error:" not in t, "%s: sanitizer report:\n%s" % (name, t[-3000:]))

print("%d checks, %d failed" % (N_CHECKS[0], len(FAILS)))
sys.exit(1 if FAILS else 0)
