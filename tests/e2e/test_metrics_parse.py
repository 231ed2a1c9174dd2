"""tests/e2e/test_metrics_parse.py: /metrics read by prometheus-client's text
parser, completely, and the counters moving as requests are made.

`dsv4 serve --executor test --api-key K` (the metrics are the point, not the
model). Every non-comment line of /metrics must come back as a sample of a
family with a # TYPE, with no duplicates. Then a seeded random mix of
requests (chat and completions, streamed or not, greedy so that a stop string
taken from an earlier answer really stops; 400s, 401s, 404s; one client that
hangs up mid-stream) and the deltas must match what the clients saw:
http_requests_total by route and status, prompt/generation tokens (the usage
the answers reported), request_success_total by finished_reason, the TTFT
and e2e histogram counts and the per-request token histograms.
"""
import json
import os
import random
import socket
import sys
import time
from collections import Counter

from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serverproc import Check, Server, stop_and_check  # noqa: E402

KEY = "sk-metrics-" + os.urandom(4).hex()
AUTH = {"Authorization": "Bearer " + KEY}
check = Check()

REQUIRED = {
    "dsv4:num_requests_running": "gauge", "dsv4:num_requests_waiting": "gauge",
    "dsv4:kv_cache_usage_perc": "gauge", "dsv4:prefix_cache_queries": "counter",
    "dsv4:prefix_cache_hits": "counter", "dsv4:num_preemptions": "counter",
    "dsv4:prompt_tokens": "counter", "dsv4:generation_tokens": "counter",
    "dsv4:request_success": "counter", "dsv4:time_to_first_token_seconds": "histogram",
    "dsv4:inter_token_latency_seconds": "histogram", "dsv4:e2e_request_latency_seconds": "histogram",
    "dsv4:request_queue_time_seconds": "histogram", "dsv4:request_prefill_time_seconds": "histogram",
    "dsv4:request_decode_time_seconds": "histogram", "dsv4:request_inference_time_seconds": "histogram",
    "dsv4:request_prompt_tokens": "histogram", "dsv4:request_generation_tokens": "histogram",
    "dsv4:http_request_duration_seconds": "histogram", "dsv4:http_requests": "counter",
    "dsv4:http_requests_client_disconnected": "counter",
}


def scrape(srv):
    """Parse /metrics; check it is complete and well formed; return {(name, labels): value}."""
    text = srv.metrics_text()
    fams = list(text_string_to_metric_families(text))
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    n_samples = sum(len(f.samples) for f in fams)
    check(n_samples == len(lines), "every sample line parsed: %d samples for %d lines" % (n_samples, len(lines)))
    check(all(f.type != "unknown" for f in fams),
          "every family has a # TYPE: %r" % [f.name for f in fams if f.type == "unknown"])
    types = {f.name: f.type for f in fams}
    for name, typ in REQUIRED.items():
        check(types.get(name) == typ, "family %s is a %s (got %r)" % (name, typ, types.get(name)))
    out = {}
    for f in fams:
        for s in f.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            check(key not in out, "no duplicate sample %r" % (key,))
            check(s.labels.get("model_name", "tiny-metrics") == "tiny-metrics" or s.name == "dsv4_kernel_info",
                  "model_name label: %r" % (s.labels,))
            out[key] = s.value
        if f.type == "histogram":
            check_histogram(f)
    return out


def check_histogram(f):
    buckets = [(s.labels["le"], s.value) for s in f.samples if s.name == f.name + "_bucket"]
    count = [s.value for s in f.samples if s.name == f.name + "_count"]
    check(buckets and buckets[-1][0] == "+Inf", "%s ends with le=+Inf" % f.name)
    les = [float(le) for le, _ in buckets]
    check(les == sorted(les) and len(set(les)) == len(les), "%s bucket bounds increase" % f.name)
    vals = [v for _, v in buckets]
    check(vals == sorted(vals), "%s buckets are cumulative: %r" % (f.name, vals))
    check(len(count) == 1 and buckets and count[0] == buckets[-1][1], "%s _count == +Inf bucket" % f.name)


def val(m, name, **labels):
    labels.setdefault("model_name", "tiny-metrics")
    return m.get((name, tuple(sorted(labels.items()))), 0.0)


def delta(m0, m1, name, **labels):
    return val(m1, name, **labels) - val(m0, name, **labels)


def sse_json(body):
    evs = []
    for block in body.decode().split("\n\n"):
        if block.startswith("data: ") and block != "data: [DONE]":
            evs.append(json.loads(block[6:]))
    return evs


class Tally:
    """What the clients saw: HTTP statuses by route, finish reasons, the usage the answers reported."""

    def __init__(self):
        self.http_seen = Counter()   # (route, status) -> n
        self.reasons = Counter()     # finished_reason -> n
        self.prompt_tokens = self.gen_tokens = 0
        self.n_requests = 0          # scheduler requests that produced a first token
        self.gen_per_request = []

    def account(self, usage, finish):
        self.prompt_tokens += usage["prompt_tokens"]
        self.gen_tokens += usage["completion_tokens"]
        self.reasons[finish] += 1
        self.n_requests += 1
        self.gen_per_request.append(usage["completion_tokens"])


WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]


def random_prompt(rng):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 30))) + " %x" % rng.getrandbits(64)


def baseline(srv):
    """The first scrape, once the readiness probe's /health is counted (its connection may complete
    after the client saw the answer)."""
    t0 = time.time()
    while True:
        m0 = scrape(srv)
        if val(m0, "dsv4:http_requests_total", route="/health", status="200") >= 1 or time.time() - t0 > 10:
            break
        time.sleep(0.05)
    check(val(m0, "dsv4:num_requests_running") == 0 and val(m0, "dsv4:kv_cache_usage_perc") == 0, "idle at start")
    return m0


def generate(srv, rng, tally):
    """One random chat or completion, streamed or not; sometimes stopped by a string taken from its
    greedy answer. Returns its route."""
    kind = rng.choice(["chat", "completions"])
    route = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    stream = rng.random() < 0.5
    body = {"model": "tiny-metrics", "max_tokens": rng.randint(1, 12), "temperature": 0}
    if kind == "chat":
        body["messages"] = [{"role": "user", "content": random_prompt(rng)}]
    else:
        body["prompt"] = random_prompt(rng)
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    want_stop = rng.random() < 0.4 and body["max_tokens"] >= 4
    if want_stop:  # the greedy answer first, then the same request stopped inside it
        first = dict(body, stream=False)
        first.pop("stream_options", None)
        st, raw, _ = srv.request("POST", route, first, AUTH)
        check(st == 200, "%s 200: %s" % (route, raw[:200]))
        tally.http_seen[(route, 200)] += 1
        ans = json.loads(raw)
        text = ans["choices"][0]["message"]["content"] if kind == "chat" else ans["choices"][0]["text"]
        tally.account(ans["usage"], ans["choices"][0]["finish_reason"])
        # two characters the model wrote, from the second on: not U+FFFD, which stands in the text for
        # bytes that are not UTF-8 (random token ids often end mid-character) and which a stop string
        # does not match (5 of 1,500 stop strings cut at text[1:3] held one and did not stop)
        at = next((i for i in range(1, len(text or "") - 1) if "\ufffd" not in text[i:i + 2]), None)
        if at is not None:
            body["stop"] = [text[at:at + 2]]
    st, raw, _ = srv.request("POST", route, body, AUTH)
    check(st == 200, "%s 200: %s" % (route, raw[:200]))
    tally.http_seen[(route, 200)] += 1
    if stream:
        evs = sse_json(raw)
        usage = evs[-1]["usage"]
        finish = [c["finish_reason"] for e in evs for c in e["choices"] if c.get("finish_reason")]
        check(len(finish) == 1, "one finish reason in the stream: %r" % finish)
        tally.account(usage, finish[0] if finish else None)
    else:
        ans = json.loads(raw)
        tally.account(ans["usage"], ans["choices"][0]["finish_reason"])
    if "stop" in body:
        check(tally.reasons["stop"] > 0, "a stop string taken from the greedy answer stops it")
    return route


def refused_or_other(srv, rng, tally, route, i):
    """Something in between the generations: bad JSON, a bad value, no key, an unknown route, /health."""
    r = rng.random()
    if r < 0.3:
        st, _, _ = srv.request("POST", route, b"{not json", AUTH)
        check(st == 400, "bad JSON 400 (got %d)" % st)
        tally.http_seen[(route, 400)] += 1
    elif r < 0.5:
        st, _, _ = srv.request("POST", route, {"prompt": "x", "messages": [], "temperature": 9}, AUTH)
        check(st == 400, "bad value 400 (got %d)" % st)
        tally.http_seen[(route, 400)] += 1
    elif r < 0.7:
        st, _, _ = srv.request("POST", route, {"prompt": "x"})
        check(st == 401, "no key 401 (got %d)" % st)
        tally.http_seen[("unauthorized", 401)] += 1
    elif r < 0.85:
        st, _, _ = srv.request("GET", "/v1/nothing-%d" % i, None, AUTH)
        check(st == 404, "unknown route 404 (got %d)" % st)
        tally.http_seen[("other", 404)] += 1
    else:
        st, _, _ = srv.get("/health")
        check(st == 200, "/health 200")
        tally.http_seen[("/health", 200)] += 1


def hang_up_mid_stream(srv, rng, tally):
    """One client that goes away mid-stream: an abort, a 499, a disconnect."""
    body = json.dumps({"model": "tiny-metrics", "prompt": random_prompt(rng), "max_tokens": 1000000 // 100,
                       "ignore_eos": True, "stream": True}).encode()
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() +
              b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    s.settimeout(30)
    got = b""
    while got.count(b"data: ") < 3:
        chunk = s.recv(4096)
        if not chunk:
            break
        got += chunk
    s.close()
    check(got.startswith(b"HTTP/1.1 200"), "the long stream started: %r" % got[:80])
    tally.http_seen[("/v1/completions", 499)] += 1
    tally.reasons["abort"] += 1
    tally.n_requests += 1


def settled(srv, m0, tally):
    """The scrape once the last completion callback has run (or after 20 s)."""
    t0 = time.time()
    while True:
        m1 = scrape(srv)
        done = val(m1, "dsv4:num_requests_running") == 0 and \
            delta(m0, m1, "dsv4:request_success_total", finished_reason="abort") >= 1 and \
            delta(m0, m1, "dsv4:http_requests_client_disconnected_total") >= 1 and \
            sum(delta(m0, m1, "dsv4:http_requests_total", route=r, status=str(s)) for (r, s) in tally.http_seen) >= \
            sum(tally.http_seen.values())
        if done or time.time() - t0 > 20:
            return m1
        time.sleep(0.1)


def check_requests_and_reasons(m0, m1, tally):
    """http_requests_total by route and status, the disconnect, request_success_total by reason."""
    # The scrape of /metrics itself shows up too; only what we made is compared here.
    for (route, status), n in sorted(tally.http_seen.items()):
        d = delta(m0, m1, "dsv4:http_requests_total", route=route, status=str(status))
        check(d == n, "http_requests_total{route=%s,status=%d} +%d (got +%g)" % (route, status, n, d))
    check(delta(m0, m1, "dsv4:http_requests_total", route="/metrics", status="200") >= 1, "/metrics counts itself")
    check(delta(m0, m1, "dsv4:http_requests_client_disconnected_total") == 1, "one disconnect counted")
    reasons = tally.reasons
    for reason in set(reasons) | {"stop", "length", "abort"}:
        d = delta(m0, m1, "dsv4:request_success_total", finished_reason=reason)
        check(d == reasons[reason], "request_success_total{finished_reason=%s} +%d (got +%g)" %
              (reason, reasons[reason], d))
    check(reasons["length"] > 0, "some requests ended by length: %r" % reasons)


def check_token_counters(m0, m1, tally):
    """Prompt and generation token counters against the usage the answers reported."""
    prompt_tokens, gen_tokens = tally.prompt_tokens, tally.gen_tokens
    dp = delta(m0, m1, "dsv4:prompt_tokens_total")
    aborted_prompt = delta(m0, m1, "dsv4:request_prompt_tokens_sum") - prompt_tokens
    check(aborted_prompt > 0, "the aborted request's prompt is in request_prompt_tokens_sum")
    check(dp == prompt_tokens + aborted_prompt, "prompt_tokens_total +%d (got +%g)" % (prompt_tokens + aborted_prompt, dp))
    dg = delta(m0, m1, "dsv4:generation_tokens_total")
    dgh = delta(m0, m1, "dsv4:request_generation_tokens_sum")
    # The aborted stream: the scheduler may have made a few tokens after the last one the job saw.
    check(dgh >= gen_tokens + 2 and dgh <= dg <= dgh + 16,
          "generation_tokens_total: the answers' %d plus the aborted stream's (got +%g, "
          "request_generation_tokens_sum +%g)" % (gen_tokens, dg, dgh))


def check_histogram_counts(m0, m1, tally):
    """The per-request token and timing histograms count the requests made."""
    n_requests = tally.n_requests
    for h in ("request_prompt_tokens", "request_generation_tokens"):
        d = delta(m0, m1, "dsv4:%s_count" % h)
        check(d == n_requests, "%s_count +%d (got +%g)" % (h, n_requests, d))
    # The timing histograms are observed from the FINISH event's timestamps; a request whose
    # client went away never gets one, so the aborted stream is not in them.
    for h in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds",
              "request_prefill_time_seconds"):
        d = delta(m0, m1, "dsv4:%s_count" % h)
        check(d == n_requests - 1, "%s_count +%d (got +%g)" % (h, n_requests - 1, d))
    ttft_sum = delta(m0, m1, "dsv4:time_to_first_token_seconds_sum")
    check(0 < ttft_sum < 60 * n_requests, "TTFT sum is a time: %g" % ttft_sum)
    # One generated token lands in le=1, so the le=1 bucket of the token histogram counts the
    # one-token answers.
    le1 = [dict(k[1])["le"] for k in m1 if k[0] == "dsv4:request_generation_tokens_bucket" and
           float(dict(k[1])["le"]) == 1.0]
    d1 = delta(m0, m1, "dsv4:request_generation_tokens_bucket", le=le1[0] if le1 else "1")
    check(d1 == sum(1 for g in tally.gen_per_request if g <= 1), "request_generation_tokens le=1 bucket: +%g for %r" %
          (d1, tally.gen_per_request))
    ditl = delta(m0, m1, "dsv4:inter_token_latency_seconds_count")
    check(ditl > 0, "inter-token latency observed")
    dhttp = delta(m0, m1, "dsv4:http_request_duration_seconds_count")
    check(dhttp >= sum(tally.http_seen.values()), "http_request_duration_seconds_count covers the requests")


def main():
    seed = int(os.environ.get("DSV4_TEST_SEED", random.SystemRandom().randrange(1 << 31)))
    print("seed", seed, "(DSV4_TEST_SEED to repeat)", flush=True)
    rng = random.Random(seed)
    srv = Server("--api-key", KEY, name="tiny-metrics")
    m0 = baseline(srv)
    tally = Tally()
    for i in range(rng.randint(12, 20)):
        route = generate(srv, rng, tally)
        refused_or_other(srv, rng, tally, route, i)
    hang_up_mid_stream(srv, rng, tally)
    m1 = settled(srv, m0, tally)
    check_requests_and_reasons(m0, m1, tally)
    check_token_counters(m0, m1, tally)
    check_histogram_counts(m0, m1, tally)
    check(val(m1, "dsv4:kv_cache_usage_perc") == 0 and val(m1, "dsv4:num_requests_waiting") == 0, "idle at the end")

    stop_and_check(srv, check)
    return check.finish()


if __name__ == "__main__":
    sys.exit(main())
