"""tests/e2e/serverproc.py: start `dsv4 serve` on a free port for the e2e stress
tests, wait until it is ready, stop it with SIGTERM and check how it ended.

The approach is tests/e2e/test_serve.py's: `--port 0`, the port read from the
log line `serving ... on http://HOST:PORT`, then /health polled until 200.
stop() returns the exit status; sanitizer_report() returns the first lines of
an AddressSanitizer / LeakSanitizer / UBSan report in the log, or "".
"""
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

BIN = os.environ.get("DSV4_BIN", "build/server/dsv4")

# Every OpenAI-shaped error body a Server.request() saw whose "code" is not a
# string or null, or whose "type" / "param" is not what OpenAI sends (issue 18:
# one error.code type everywhere); Check.finish() fails on any.
ERROR_SHAPE_FAILS = []
OPENAI_ERROR_TYPES = ("invalid_request_error", "server_error", "requests")


def check_error_shape(status, body, where=""):
    """Record a non-OpenAI error body (status >= 400). Anthropic-shaped bodies
    ({"type": "error", ...}) are the Messages API's and are skipped."""
    if status < 400:
        return True
    try:
        d = json.loads(body)
    except ValueError:
        return True  # not JSON (e.g. a connection-level refusal): not an OpenAI error body
    if not isinstance(d, dict) or "error" not in d or d.get("type") == "error":
        return True
    e = d["error"]
    ok = (isinstance(e, dict) and isinstance(e.get("message"), str)
          and (e.get("code") is None or isinstance(e.get("code"), str))
          and (e.get("param") is None or isinstance(e.get("param"), str))
          and e.get("type") in OPENAI_ERROR_TYPES
          and (e.get("type") == "server_error") == (status >= 500))
    if not ok:
        ERROR_SHAPE_FAILS.append("%s %d %r" % (where, status, body[:300]))
    return ok


SANITIZER_MARKS = ("AddressSanitizer", "LeakSanitizer", "runtime error:", "UndefinedBehaviorSanitizer",
                   "ThreadSanitizer")


class Check:
    """Counts checks and failures; every failure is printed at once."""

    def __init__(self):
        self.n = 0
        self.fails = []

    def __call__(self, cond, what):
        self.n += 1
        if not cond:
            self.fails.append(what)
            print("FAIL:", what, file=sys.stderr, flush=True)
        return cond

    def finish(self):
        if ERROR_SHAPE_FAILS:
            self(False, "error bodies not in OpenAI's shape (code a string or null): %r" % ERROR_SHAPE_FAILS[:5])
        print("%d checks, %d failures" % (self.n, len(self.fails)), flush=True)
        return 1 if self.fails else 0


class Server:
    def __init__(self, *args, executor="test", model="tiny", name="tiny-e2e", env=None, start_timeout_s=120):
        fd, self.log_path = tempfile.mkstemp(prefix="dsv4-stress-", suffix=".log",
                                             dir=os.environ.get("TMPDIR", "/tmp"))
        os.close(fd)
        self.log = open(self.log_path, "w+")
        cmd = [BIN, "serve", "--model", model, "--port", "0", "--executor", executor,
               "--served-model-name", name, *args]
        self.p = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  env=dict(os.environ, **(env or {})))
        self.port = None
        t0 = time.time()
        while time.time() - t0 < start_timeout_s and self.p.poll() is None:
            m = re.search(r"on http://[0-9.]+:(\d+)", self.logtext())
            if m:
                self.port = int(m.group(1))
                break
            time.sleep(0.05)
        if not self.port:
            self.kill()
            sys.exit("server did not start: %s\n%s" % (" ".join(cmd), self.logtext()[-4000:]))
        self.url = "http://127.0.0.1:%d" % self.port
        while time.time() - t0 < start_timeout_s:
            try:
                if self.get("/health")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.05)
        else:
            self.kill()
            sys.exit("server never became ready:\n" + self.logtext()[-4000:])

    def logtext(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def request(self, method, path, body=None, headers=None, timeout=60):
        """One request on a fresh connection: (status, body bytes, headers dict)."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
            h = {"Content-Type": "application/json"} if data is not None else {}
            h.update(headers or {})
            c.request(method, path, body=data, headers=h)
            r = c.getresponse()
            out = r.status, r.read(), dict(r.getheaders())
            if "json" in out[2].get("Content-Type", ""):
                check_error_shape(out[0], out[1], "%s %s" % (method, path))
            return out
        finally:
            c.close()

    def get(self, path, timeout=60):
        return self.request("GET", path, timeout=timeout)

    def metrics_text(self):
        st, body, _ = self.get("/metrics")
        if st != 200:
            raise RuntimeError("/metrics answered %d" % st)
        return body.decode()

    def gauges(self):
        """running, waiting, kv usage (simple line parse; the metrics test uses the real parser)."""
        out = {}
        for line in self.metrics_text().splitlines():
            for name in ("dsv4:num_requests_running", "dsv4:num_requests_waiting", "dsv4:kv_cache_usage_perc"):
                if line.startswith(name + "{"):
                    out[name.split(":")[1]] = float(line.rsplit(" ", 1)[1])
        return out

    def wait_idle(self, timeout_s=10.0):
        """Poll until running == waiting == kv usage == 0; returns the last gauges seen."""
        t0 = time.time()
        g = {}
        while time.time() - t0 < timeout_s:
            g = self.gauges()
            if g.get("num_requests_running") == 0 and g.get("num_requests_waiting") == 0 and \
                    g.get("kv_cache_usage_perc") == 0:
                return g
            time.sleep(0.1)
        return g

    def stop(self, timeout_s=60):
        if self.p.poll() is not None:
            return self.p.returncode
        self.p.send_signal(signal.SIGTERM)
        try:
            return self.p.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            return -9

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()

    def sanitizer_report(self):
        text = self.logtext()
        for mark in SANITIZER_MARKS:
            i = text.find(mark)
            if i >= 0:
                return text[max(0, i - 200):i + 3000]
        return ""

    def cleanup(self):
        self.kill()
        self.log.close()
        try:
            os.unlink(self.log_path)
        except OSError:
            pass


def stop_and_check(srv, check, what="server"):
    """SIGTERM, exit 0, no sanitizer report; keeps the log on failure."""
    rc = srv.stop()
    rep = srv.sanitizer_report()
    check(rc == 0, "%s exits 0 after SIGTERM (got %r); log %s:\n%s" % (what, rc, srv.log_path, srv.logtext()[-3000:]))
    check(not rep, "%s: no sanitizer report; log %s:\n%s" % (what, srv.log_path, rep))
    if rc == 0 and not rep:
        srv.cleanup()
    return rc


# ---- helpers the API front-end tests share (test_anthropic.py, test_responses.py) ----

def expect_raises(check, exc_type, what, fn, needle=None):
    """fn() raises exc_type whose text names needle; returns the exception."""
    try:
        fn()
        check(False, f"{what}: no exception")
    except exc_type as ex:
        check(needle is None or needle in str(ex), f"{what}: message names '{needle}' ({ex})")
        return ex
    except Exception as ex:  # noqa: BLE001 (the wrong type)
        check(False, f"{what}: {type(ex).__name__} instead of {exc_type.__name__}: {ex}")


def sse_events(raw):
    """(event name, data) of each SSE event in raw bytes; comment lines (': ping')
    and blocks without data (a cut stream's last) are passed over."""
    out = []
    for block in raw.decode().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n") if ": " in line and not line.startswith(":"))
        if "data" in lines:
            out.append((lines.get("event"), json.loads(lines["data"])))
    return out


# A scripted answer for the test executor: reasoning, text, then two DSML
# calls of a get_weather(city, days) tool (Paris 3, Oslo 1).
DSML_WEATHER_ANSWER = (
    "I should look it up.</think>Let me check.\n\n<\uff5cDSML\uff5ctool_calls>\n"
    "<\uff5cDSML\uff5cinvoke name=\"get_weather\">\n"
    "<\uff5cDSML\uff5cparameter name=\"city\" string=\"true\">Paris</\uff5cDSML\uff5cparameter>\n"
    "<\uff5cDSML\uff5cparameter name=\"days\" string=\"false\">3</\uff5cDSML\uff5cparameter>\n"
    "</\uff5cDSML\uff5cinvoke>\n<\uff5cDSML\uff5cinvoke name=\"get_weather\">\n"
    "<\uff5cDSML\uff5cparameter name=\"city\" string=\"true\">Oslo</\uff5cDSML\uff5cparameter>\n"
    "<\uff5cDSML\uff5cparameter name=\"days\" string=\"false\">1</\uff5cDSML\uff5cparameter>\n"
    "</\uff5cDSML\uff5cinvoke>\n</\uff5cDSML\uff5ctool_calls>")


def script_ids(srv, text, key):
    """The token ids of text (srv's /tokenize) and EOS (1): a DSV4_TEST_EXEC_SCRIPT."""
    _, body, _ = srv.request("POST", "/tokenize", {"prompt": text}, headers={"Authorization": "Bearer " + key})
    return json.loads(body)["tokens"] + [1]


def check_abandoned_stream(srv, check, path, body, headers):
    """A client that reads the start of a stream on path and goes away: the
    request is counted as aborted and its memory freed."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    conn.request("POST", path, body=json.dumps(body), headers=dict(headers, **{"Content-Type": "application/json"}))
    resp = conn.getresponse()
    first = resp.read1(64)
    conn.close()
    g = srv.wait_idle(20)
    # the counter is written when the request's bookkeeping ends, which can follow
    # the running gauge's drop to 0: give it up to 20 s (a loaded ASan machine)
    for _ in range(200):
        aborted = re.search(r'^dsv4:request_success_total\{[^}]*finished_reason="abort"[^}]*\} (\S+)',
                            srv.metrics_text(), re.M)
        if aborted and float(aborted.group(1)) >= 1:
            break
        time.sleep(0.1)
    check(first and aborted and float(aborted.group(1)) >= 1, "an abandoned stream is counted as aborted")
    check(g.get("num_requests_running") == 0 and g.get("kv_cache_usage_perc") == 0,
          "an abandoned stream is freed: %r" % g)


def stream_cut_by_shutdown(srv, path, body, headers):
    """Start a long stream on path, stop the server once it runs (SIGTERM; the
    drain time passes), and return the bytes the stream got."""
    import threading
    got = {}

    def reader():
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
        c.request("POST", path, body=json.dumps(body), headers=dict(headers, **{"Content-Type": "application/json"}))
        r = c.getresponse()
        try:
            got["raw"] = r.read()
        except http.client.IncompleteRead as ex:
            got["raw"] = ex.partial
    th = threading.Thread(target=reader)
    th.start()
    for _ in range(600):  # up to 30 s
        if srv.gauges().get("num_requests_running", 0) >= 1:
            break
        time.sleep(0.05)
    srv.stop()
    th.join(60)
    return got.get("raw", b"")
