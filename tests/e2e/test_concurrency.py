"""tests/e2e/test_concurrency.py: 64 concurrent streaming clients, a random part
of which go away mid-stream in different ways, must leave the server healthy
and empty, and the process must exit 0 without a sanitizer report.

`dsv4 serve --executor test` (the HTTP, SSE and scheduler paths are the point).
Per round, 64 threads each stream one chat or completions request; each
client either reads its stream to [DONE] and checks it (one finish chunk,
usage == max_tokens with ignore_eos), or hangs up: right after sending,
after the headers, after k events, with a reset (SO_LINGER 0), or after
half-closing its side; some go through the OpenAI SDK and break out of the
iteration. A thread scrapes /metrics throughout. After each round: running,
waiting and KV usage back to 0 within a few seconds, /health 200, and a
greedy request answers as before the storm. Last, 16 streams still running
at SIGTERM with --shutdown-timeout 1: they end (finish_reason "abort" or
complete) and the process exits 0. Then a smaller round (24 clients, a few
tokens) against the real CPU executor on the tiny checkpoint, whose
per-sequence state must come back too. Seeded; the seed is printed.
"""
import json
import os
import random
import socket
import struct
import sys
import threading
import time

import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serverproc import Check, Server, stop_and_check  # noqa: E402

check = Check()
N_CLIENTS = 64
MODEL = "tiny-e2e"


def raw_request(port, path, body):
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    s.sendall(b"POST %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nConnection: close\r\n"
              b"Content-Length: %d\r\n\r\n" % (path.encode(), len(data)) + data)
    return s


def read_until(s, pred, limit_bytes=1 << 24):
    got = b""
    while not pred(got) and len(got) < limit_bytes:
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def dechunk(raw):
    """HTTP/1.1 response bytes -> (status line, body) with chunked transfer decoded."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].decode()
    if b"transfer-encoding: chunked" not in head.lower():
        return status, rest
    body = b""
    while rest:
        line, _, rest = rest.partition(b"\r\n")
        n = int(line.split(b";")[0], 16)
        if n == 0:
            break
        body += rest[:n]
        rest = rest[n + 2:]
    return status, body


def sse_events(body):
    evs, done = [], False
    for block in body.decode().split("\n\n"):
        if not block or block.startswith(":"):
            continue
        if block == "data: [DONE]":
            done = True
            continue
        evs.append(json.loads(block[len("data: "):]))
    return evs, done


class Round:
    def __init__(self, srv, rng, n_clients=N_CLIENTS, max_tokens=30, max_events=30):
        self.srv = srv
        self.rng = rng
        self.n_clients = n_clients
        self.max_tokens = max_tokens
        self.max_events = max_events
        self.errors = []
        self.lock = threading.Lock()
        self.n_complete = 0
        self.n_hangups = 0

    def err(self, what):
        with self.lock:
            self.errors.append(what)

    def client(self, i, seed):
        rng = random.Random(seed)
        kind = rng.choice(["chat", "completions"])
        path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
        hang = rng.random() < 0.5
        n_tok = rng.randint(2000, 8000) if hang else rng.randint(1, self.max_tokens)
        body = {"model": MODEL, "max_tokens": n_tok, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}, "temperature": rng.choice([0, 0.8])}
        if kind == "chat":
            body["messages"] = [{"role": "user", "content": "client %d %x" % (i, rng.getrandbits(32))}]
        else:
            body["prompt"] = "client %d %x" % (i, rng.getrandbits(32))
        try:
            if not hang:
                self.complete(path, body, n_tok)
            else:
                self.hangup(path, body, rng, kind)
        except Exception as ex:  # noqa: BLE001
            self.err("client %d (%s, hang=%s): %r" % (i, kind, hang, ex))

    def complete(self, path, body, n_tok):
        s = raw_request(self.srv.port, path, body)
        raw = read_until(s, lambda g: False)
        s.close()
        status, payload = dechunk(raw)
        if not status.startswith("HTTP/1.1 200"):
            self.err("status %s: %r" % (status, payload[:200]))
            return
        evs, done = sse_events(payload)
        finishes = [c["finish_reason"] for e in evs for c in e.get("choices", []) if c.get("finish_reason")]
        usage = [e["usage"] for e in evs if e.get("usage")]
        if not done or finishes != ["length"] or len(usage) != 1 or usage[0]["completion_tokens"] != n_tok:
            self.err("stream: done=%s finishes=%r usage=%r" % (done, finishes, usage))
        with self.lock:
            self.n_complete += 1

    def hangup(self, path, body, rng, kind):
        how = rng.choice(["after_send", "after_headers", "after_events", "after_events", "reset", "half_close",
                          "sdk"])
        with self.lock:
            self.n_hangups += 1
        if how == "sdk":
            c = openai.OpenAI(base_url=self.srv.url + "/v1", api_key="x", max_retries=0, timeout=60)
            extra = {"ignore_eos": True}
            if kind == "chat":
                st = c.chat.completions.create(model=MODEL, messages=body["messages"], max_tokens=body["max_tokens"],
                                               stream=True, extra_body=extra)
            else:
                st = c.completions.create(model=MODEL, prompt=body["prompt"], max_tokens=body["max_tokens"],
                                          stream=True, extra_body=extra)
            k = rng.randint(1, self.max_events)
            for j, _ in enumerate(st):
                if j >= k:
                    break
            st.close()
            c.close()
            return
        s = raw_request(self.srv.port, path, body)
        if how == "after_send":
            pass
        elif how == "after_headers":
            read_until(s, lambda g: b"\r\n\r\n" in g)
        elif how in ("after_events", "reset"):
            k = rng.randint(1, self.max_events)
            read_until(s, lambda g: g.count(b"data: ") >= k)
            if how == "reset":
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        elif how == "half_close":
            s.shutdown(socket.SHUT_WR)
            k = rng.randint(0, self.max_events)
            s.settimeout(10)
            try:
                read_until(s, lambda g: g.count(b"data: ") >= k)
            except socket.timeout:
                pass
        s.close()

    def run(self, seed):
        rng = random.Random(seed)
        stop = threading.Event()
        scrapes = [0]

        def scraper():
            while not stop.is_set():
                try:
                    self.srv.metrics_text()
                    scrapes[0] += 1
                except Exception as ex:  # noqa: BLE001
                    self.err("/metrics during the storm: %r" % ex)
                time.sleep(0.05)
        sc = threading.Thread(target=scraper)
        sc.start()
        ths = [threading.Thread(target=self.client, args=(i, rng.getrandbits(64))) for i in range(self.n_clients)]
        for t in ths:
            t.start()
        for t in ths:
            t.join(120)
        stop.set()
        sc.join()
        check(not any(t.is_alive() for t in ths), "every client thread ended")
        check(scrapes[0] > 0, "/metrics answered during the storm")
        return self.errors


def greedy(srv):
    st, body, _ = srv.request("POST", "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0})
    check(st == 200, "a normal request answers: %d %r" % (st, body[:200]))
    return json.loads(body)["choices"][0]["message"]["content"] if st == 200 else None


def main():
    seed = int(os.environ.get("DSV4_TEST_SEED", random.SystemRandom().randrange(1 << 31)))
    print("seed", seed, "(DSV4_TEST_SEED to repeat)", flush=True)
    rng = random.Random(seed)
    srv = Server("--shutdown-timeout", "1", "--http-threads", "4")
    before = greedy(srv)
    for rnd in range(2):
        r = Round(srv, rng)
        t0 = time.time()
        errors = r.run(rng.getrandbits(64))
        print("round %d: %d complete, %d hang-ups, %.1f s" % (rnd, r.n_complete, r.n_hangups, time.time() - t0),
              flush=True)
        check(not errors, "round %d: %d client errors: %s" % (rnd, len(errors), "\n".join(errors[:5])))
        g = srv.wait_idle(30.0)  # polled: returns as soon as it is idle
        check(g.get("num_requests_running") == 0 and g.get("num_requests_waiting") == 0 and
              g.get("kv_cache_usage_perc") == 0, "round %d: idle within 30 s: %r" % (rnd, g))
        st, body, _ = srv.get("/health")
        check(st == 200 and json.loads(body).get("status") == "ready", "round %d: /health 200: %r" % (rnd, body))
        check(greedy(srv) == before, "round %d: greedy answer unchanged after the storm" % rnd)
    text = srv.metrics_text()
    disc = [float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
            if ln.startswith("dsv4:http_requests_client_disconnected_total{")]
    check(disc and disc[0] >= 1, "disconnects counted: %r" % disc)

    # Streams still running at SIGTERM: drained for 1 s, then aborted; the process exits 0.
    socks = []
    for i in range(16):
        socks.append(raw_request(srv.port, "/v1/completions", {
            "model": MODEL, "prompt": "late %d" % i, "max_tokens": 8000, "ignore_eos": True, "stream": True}))
    for s in socks:
        read_until(s, lambda g: g.count(b"data: ") >= 2)
    srv.p.send_signal(15)
    ends = []
    for s in socks:
        s.settimeout(60)
        try:
            raw = read_until(s, lambda g: g.endswith(b"0\r\n\r\n"), limit_bytes=1 << 30)
        except socket.timeout:
            raw = b""
        s.close()
        tail = raw[-4000:]
        ends.append(b'"finish_reason":"abort"' in tail and b"data: [DONE]" in tail)
    check(all(ends), "every running stream ended with finish_reason abort and [DONE] at shutdown: %r" % ends)
    stop_and_check(srv, check)

    # The same with the real CPU executor on the tiny checkpoint (its per-sequence state must
    # be released on every kind of hang-up too): fewer clients and tokens, ASan is slow.
    cpu = Server("--shutdown-timeout", "1", executor="cpu")
    before = greedy(cpu)
    r = Round(cpu, rng, n_clients=24, max_tokens=8, max_events=6)
    t0 = time.time()
    errors = r.run(rng.getrandbits(64))
    print("cpu executor: %d complete, %d hang-ups, %.1f s" % (r.n_complete, r.n_hangups, time.time() - t0), flush=True)
    check(not errors, "cpu executor: %d client errors: %s" % (len(errors), "\n".join(errors[:5])))
    g = cpu.wait_idle(60.0)
    check(g.get("num_requests_running") == 0 and g.get("num_requests_waiting") == 0 and
          g.get("kv_cache_usage_perc") == 0, "cpu executor: idle after the storm: %r" % g)
    check(greedy(cpu) == before, "cpu executor: greedy answer unchanged after the storm")
    stop_and_check(cpu, check, "cpu-executor server")
    return check.finish()


if __name__ == "__main__":
    sys.exit(main())
