"""tests/e2e/test_serve.py: the real `dsv4 serve --model tiny` on a free port,
driven with curl, raw sockets and the official OpenAI Python SDK.

Two servers: the main one (the CPU executor on the tiny random checkpoint,
with an API key) for the API surface, and a small one on the scripted test
executor (--max-num-seqs 1 --max-num-queued-reqs 1) for a known DSML tool
call, 429 and the SIGTERM drain.
Few tokens per request: the binary runs under ASan on 2 cores. The process
must exit 0 after SIGTERM, which under ASan also means no leak report.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import openai

BIN = os.environ.get("DSV4_BIN", "build/server/dsv4")
KEY = "sk-e2e-" + os.urandom(4).hex()
FAILS = []
N_CHECKS = [0]


def check(cond, what):
    N_CHECKS[0] += 1
    if not cond:
        FAILS.append(what)
        print("FAIL:", what, file=sys.stderr, flush=True)


class Server:
    def __init__(self, executor, *extra, env=None):
        self.log = open(os.path.join(os.environ.get("TMPDIR", "/tmp"), "dsv4-e2e-%d-%d.log" % (os.getpid(), id(self))), "w+")
        self.p = subprocess.Popen([BIN, "serve", "--model", "tiny", "--port", "0", "--executor", executor,
                                   "--served-model-name", "tiny-e2e", *extra],
                                  stdout=self.log, stderr=subprocess.STDOUT, env=dict(os.environ, **(env or {})))
        self.port = None
        t0 = time.time()
        while time.time() - t0 < 120 and self.p.poll() is None:
            self.log.seek(0)
            m = re.search(r"on http://[0-9.]+:(\d+)", self.log.read())
            if m:
                self.port = int(m.group(1))
                break
            time.sleep(0.1)
        if not self.port:
            self.log.seek(0)
            sys.exit("server did not start:\n" + self.log.read())
        self.url = "http://127.0.0.1:%d" % self.port

    def logtext(self):
        self.log.seek(0)
        return self.log.read()

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        try:
            return self.p.wait(60)
        except subprocess.TimeoutExpired:
            self.p.kill()
            return -9


def http(srv, method, path, body=None, key=KEY, raw=None, headers=None):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(srv.url + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", "Bearer " + key)
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read().decode(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), dict(e.headers)


def curl(srv, path, body, key=KEY):
    out = subprocess.run(["curl", "-sS", "-N", "-H", "Authorization: Bearer " + key, "-H",
                          "Content-Type: application/json", "-d", json.dumps(body), srv.url + path],
                         capture_output=True, timeout=120)
    return out.stdout.decode()


def metric(srv, name):
    _, text, _ = http(srv, "GET", "/metrics")
    total = 0.0
    found = False
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
            found = True
    return total if found else None


def sse_events(text):
    check(text.endswith("data: [DONE]\n\n"), "stream ends with data: [DONE]: %r" % text[-80:])
    evs = []
    for block in text.split("\n\n"):
        if not block or block.startswith(":"):
            continue
        check(block.startswith("data: "), "SSE block starts with 'data: ': %r" % block[:60])
        payload = block[len("data: "):]
        if payload != "[DONE]":
            evs.append(json.loads(payload))
    return evs


def cli_errors():
    for args, want in ((["--bogus"], 2), ([], 2), (["--model", "tiny", "--port", "99999"], 2),
                       (["--model", "tiny", "--max-num-seqs", "0"], 2), (["--model", "tiny", "--executor", "gpu"], 2),
                       (["--model", "tiny", "extra"], 2), (["--model", "tiny", "--port"], 2),
                       (["--model", "/nonexistent/dsv4-model"], 1)):
        p = subprocess.run([BIN, "serve", *args], capture_output=True, timeout=60)
        check(p.returncode == want and p.stderr.strip(), "serve %s -> exit %d with a message (got %d: %r)" % (
            " ".join(args), want, p.returncode, p.stderr[-200:]))
    p = subprocess.run([BIN, "serve", "--help"], capture_output=True, timeout=60)
    check(p.returncode == 0 and b"--served-model-name" in p.stdout, "serve --help")


def tiny_build():
    """--model tiny with $DSV4_TINY_MODEL pointing at an empty place builds the checkpoint there, once."""
    import shutil
    import tempfile
    d = tempfile.mkdtemp(prefix="dsv4-e2e-tiny-")
    where = os.path.join(d, "cache", "tiny")
    try:
        srv = Server("test", env={"DSV4_TINY_MODEL": where})
        check(os.path.exists(os.path.join(where, "config.json")), "--model tiny built the checkpoint")
        st, body, _ = http(srv, "POST", "/v1/completions", {"prompt": "a", "max_tokens": 2}, key=None)
        check(st == 200, "served the freshly built tiny checkpoint: %s" % body[:200])
        check(srv.stop() == 0, "tiny-build server exits 0")
        mtime = os.path.getmtime(os.path.join(where, "config.json"))
        srv = Server("test", env={"DSV4_TINY_MODEL": where})
        check("building the tiny checkpoint" not in srv.logtext() and
              os.path.getmtime(os.path.join(where, "config.json")) == mtime, "second start reuses it")
        check(srv.stop() == 0, "second tiny server exits 0")
    finally:
        shutil.rmtree(d, ignore_errors=True)


def raw_post(srv, path, body, length=None, extra=b""):
    """A POST over a raw socket, so that a check can hang up mid-reply; returns the connected socket."""
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() +
              b"\r\nContent-Type: application/json\r\n" + extra +
              b"Content-Length: %d\r\n\r\n" % (len(body) if length is None else length) + body)
    return s


class NotifyListener:
    """A datagram socket standing in for systemd: collects what the server sends to $NOTIFY_SOCKET."""

    def __init__(self):
        self.path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "dsv4-e2e-notify-%d.sock" % os.getpid())
        if os.path.exists(self.path):
            os.unlink(self.path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.2)
        self.notes = []
        self.stopping = False
        self.thread = threading.Thread(target=self._collect)
        self.thread.start()

    def _collect(self):
        while not self.stopping:
            try:
                self.notes.append(self.sock.recv(4096).decode())
            except socket.timeout:
                pass

    def stop(self):
        """Stops collecting; returns the first line of each message."""
        self.stopping = True
        self.thread.join()
        self.sock.close()
        os.unlink(self.path)
        return [n.split("\n")[0] for n in self.notes]


def check_health_models_metrics(srv, client):
    """/health, the models list and /metrics."""
    st, body, _ = http(srv, "GET", "/health", key=None)
    check(st == 200 and json.loads(body)["status"] == "ready", "/health 200 ready: %s %s" % (st, body))
    models = client.models.list()
    check([m.id for m in models.data] == ["tiny-e2e"], "models list: %r" % models)
    st, body, _ = http(srv, "GET", "/metrics", key=None)
    check(st == 200 and "dsv4:num_requests_running" in body, "/metrics exposes the gauges")
    check('dsv4_kernel_info{layer="0"' in body, "/metrics lists the CPU executor's kernel plan")


def check_chat_streamed(client, msgs):
    """Chat at temperature 0, non-streamed vs streamed; returns the content."""
    r = client.chat.completions.create(model="tiny-e2e", messages=msgs, max_tokens=8, temperature=0)
    c0 = r.choices[0]
    check(r.object == "chat.completion" and r.id.startswith("chatcmpl-"), "chat object/id")
    check(c0.message.role == "assistant" and c0.finish_reason in ("stop", "length", "tool_calls"),
          "chat choice: %r" % c0)
    check(r.usage.completion_tokens >= 1 and r.usage.prompt_tokens > 5 and
          r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, "chat usage: %r" % r.usage)
    text = c0.message.content or ""
    stream = client.chat.completions.create(model="tiny-e2e", messages=msgs, max_tokens=8, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    parts, finish, usage, roles = [], None, None, []
    for ch in stream:
        if ch.usage:
            usage = ch.usage
            check(ch.choices == [], "usage chunk has empty choices")
        for c in ch.choices:
            if c.delta.role:
                roles.append(c.delta.role)
            if c.delta.content:
                parts.append(c.delta.content)
            if c.finish_reason:
                finish = c.finish_reason
    check("".join(parts) == text, "streamed deltas == non-streamed content: %r vs %r" % ("".join(parts), text))
    check(roles == ["assistant"], "one role chunk: %r" % roles)
    check(finish == c0.finish_reason, "same finish reason: %r vs %r" % (finish, c0.finish_reason))
    check(usage is not None and usage.completion_tokens == r.usage.completion_tokens, "final usage chunk: %r" % usage)
    return text


def check_sse_bytes(srv, msgs):
    """The SSE bytes of a streamed chat, read with curl."""
    raw = curl(srv, "/v1/chat/completions", {"model": "tiny-e2e", "messages": msgs, "max_tokens": 3,
                                             "temperature": 0, "stream": True})
    evs = sse_events(raw)
    check(evs and evs[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}, "role chunk first")
    check(all(e["object"] == "chat.completion.chunk" and "usage" not in e for e in evs),
          "no usage key without include_usage")
    check(evs[-1]["choices"][0]["finish_reason"] is not None, "finish chunk last")


def check_thinking_parts(client):
    """Content parts with thinking on: the reasoning is kept out of the content."""
    r = client.chat.completions.create(
        model="tiny-e2e", max_tokens=6, temperature=0,
        messages=[{"role": "user", "content": [{"type": "text", "text": "Think."}]}],
        extra_body={"chat_template_kwargs": {"thinking": True}})
    m = r.choices[0].message
    rc = getattr(m, "reasoning_content", None)
    check(rc is not None or m.content is not None, "thinking answer has reasoning or content")
    check(not (m.content or "").count("</think>"), "no </think> in content")


def check_sampling(client, msgs):
    """n=2, the sampling parameters, and a seed reproducing its output."""
    kw = dict(model="tiny-e2e", messages=msgs, max_tokens=6, n=2, temperature=0.9, top_p=0.9, seed=1234,
              presence_penalty=0.5, frequency_penalty=0.5, logit_bias={"100": 5},
              extra_body={"top_k": 20, "min_p": 0.01, "repetition_penalty": 1.1})
    r1 = client.chat.completions.create(**kw)
    r2 = client.chat.completions.create(**kw)
    check([c.index for c in r1.choices] == [0, 1], "n=2 indices")
    check([c.message.content for c in r1.choices] == [c.message.content for c in r2.choices],
          "same seed, same output")
    check(r1.usage.completion_tokens == sum(r.usage.completion_tokens for r in [r1]) and
          r1.usage.completion_tokens >= 2, "n=2 usage counts both choices: %r" % r1.usage)


def check_completions(srv, client):
    """Completions: a string, token ids, a list, echo, logprobs; returns the greedy text."""
    cr = client.completions.create(model="tiny-e2e", prompt="The capital of France is", max_tokens=6,
                                   temperature=0, logprobs=2)
    ctext = cr.choices[0].text
    lp = cr.choices[0].logprobs
    check(cr.object == "text_completion" and len(lp.tokens) == cr.usage.completion_tokens,
          "completion logprobs per token: %r" % lp)
    check(all(len(t) <= 2 for t in lp.top_logprobs), "top_logprobs <= 2")
    check("".join(lp.tokens) == ctext or cr.choices[0].finish_reason == "stop", "tokens join to text")
    cs = client.completions.create(model="tiny-e2e", prompt="The capital of France is", max_tokens=6,
                                   temperature=0, stream=True)
    check("".join(c.choices[0].text for c in cs if c.choices) == ctext, "streamed completion == non-streamed")
    st, body, _ = http(srv, "POST", "/tokenize", {"prompt": "The capital of France is"})
    ids = json.loads(body)["tokens"]
    ci = client.completions.create(model="tiny-e2e", prompt=ids, max_tokens=6, temperature=0)
    check(ci.choices[0].text == ctext, "token-id prompt == text prompt")
    cl = client.completions.create(model="tiny-e2e", prompt=["one", "two"], max_tokens=2, temperature=0,
                                   echo=True)
    check(len(cl.choices) == 2 and cl.choices[0].text.startswith("one") and cl.choices[1].text.startswith("two"),
          "prompt list + echo: %r" % [c.text for c in cl.choices])
    return ctext


def check_stop_strings(client, ctext):
    """Stop strings (kept or not in the output) and min_tokens."""
    if len(ctext) > 4:
        stop = ctext[2:4]
        sr = client.completions.create(model="tiny-e2e", prompt="The capital of France is", max_tokens=6,
                                       temperature=0, stop=[stop])
        check(sr.choices[0].text == ctext[:ctext.index(stop)] and sr.choices[0].finish_reason == "stop",
              "stop string: %r / %r / %r" % (ctext, stop, sr.choices[0].text))
        si = client.completions.create(model="tiny-e2e", prompt="The capital of France is", max_tokens=6,
                                       temperature=0, stop=[stop], extra_body={"include_stop_str_in_output": True})
        check(si.choices[0].text == ctext[:ctext.index(stop) + len(stop)], "include_stop_str_in_output: %r" %
              si.choices[0].text)
    mt = client.completions.create(model="tiny-e2e", prompt="x", max_tokens=5, temperature=0,
                                   extra_body={"min_tokens": 5})
    check(mt.usage.completion_tokens == 5, "min_tokens: %r" % mt.usage)


def check_chat_logprobs(client, msgs):
    """Chat logprobs and top_logprobs."""
    r = client.chat.completions.create(model="tiny-e2e", messages=msgs, max_tokens=4, temperature=0,
                                       logprobs=True, top_logprobs=3)
    ent = r.choices[0].logprobs.content
    check(len(ent) == r.usage.completion_tokens and all(len(e.top_logprobs) == 3 for e in ent),
          "chat logprobs: %r" % ent)
    check(all(e.logprob <= 0 for e in ent), "logprobs <= 0")


def check_tools(client, tools):
    """Tools: a valid request, whatever the model emits; then a round trip."""
    r = client.chat.completions.create(model="tiny-e2e", messages=[{"role": "user", "content": "Weather in Paris?"}],
                                       tools=tools, tool_choice="auto", max_tokens=8, temperature=0)
    c = r.choices[0]
    check(c.finish_reason in ("stop", "length", "tool_calls"), "tools finish: %r" % c.finish_reason)
    for tc in c.message.tool_calls or []:
        json.loads(tc.function.arguments)
    ts = client.chat.completions.create(model="tiny-e2e", messages=[{"role": "user", "content": "Weather in Paris?"}],
                                        tools=tools, max_tokens=8, temperature=0, stream=True)
    for _ in ts:
        pass
    rt = client.chat.completions.create(model="tiny-e2e", tools=tools, max_tokens=4, temperature=0, messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp_c\": 21}"}])
    check(rt.choices[0].finish_reason in ("stop", "length", "tool_calls"), "tool round trip answered")


def dsml_script_ids(srv):
    """Token ids of a known DSML tool call (then end of sentence), for the scripted server."""
    call_text = ("Let me check.\n\n<\uff5cDSML\uff5ctool_calls>\n<\uff5cDSML\uff5cinvoke name=\"get_weather\">\n"
                 "<\uff5cDSML\uff5cparameter name=\"city\" string=\"true\">Paris</\uff5cDSML\uff5cparameter>\n"
                 "<\uff5cDSML\uff5cparameter name=\"days\" string=\"false\">3</\uff5cDSML\uff5cparameter>\n"
                 "</\uff5cDSML\uff5cinvoke>\n</\uff5cDSML\uff5ctool_calls>")
    st, body, _ = http(srv, "POST", "/tokenize", {"prompt": call_text})
    script_ids = json.loads(body)["tokens"] + [1]  # then <｜end▁of▁sentence｜>
    st, body, _ = http(srv, "POST", "/detokenize", {"tokens": script_ids[:-1]})
    check(json.loads(body)["prompt"] == call_text, "DSML text round-trips through the tokenizer")
    return script_ids


def check_prefix_cache(client):
    """The same long prompt twice reports cached tokens."""
    long_msgs = [{"role": "user", "content": "cache " * 300}]
    client.chat.completions.create(model="tiny-e2e", messages=long_msgs, max_tokens=1, temperature=0)
    r = client.chat.completions.create(model="tiny-e2e", messages=long_msgs, max_tokens=1, temperature=0)
    check(r.usage.prompt_tokens_details.cached_tokens > 0, "cached_tokens: %r" % r.usage)


def check_tokenize(srv, msgs):
    """/tokenize and /detokenize."""
    st, body, _ = http(srv, "POST", "/tokenize", {"prompt": "Hello world", "return_token_strs": True})
    tk = json.loads(body)
    check(st == 200 and tk["count"] == len(tk["tokens"]) and len(tk["token_strs"]) == tk["count"], "tokenize")
    st, body, _ = http(srv, "POST", "/detokenize", {"tokens": tk["tokens"]})
    check(st == 200 and json.loads(body)["prompt"] == "Hello world", "detokenize round trip: %s" % body)
    st, body, _ = http(srv, "POST", "/tokenize", {"messages": msgs})
    check(st == 200 and json.loads(body)["count"] > 5, "chat tokenize")


def check_errors(srv, client, msgs):
    """Refusals in the OpenAI error shape, by status; the SDK sees them; 413 before the body is read."""
    def err(status, method, path, body=None, key=KEY, raw=None, code_field=None):
        st, text, hdr = http(srv, method, path, body, key=key, raw=raw)
        check(st == status, "%s %s -> %d (got %d: %s)" % (method, path, status, st, text[:200]))
        try:
            e = json.loads(text)["error"]
            check(isinstance(e["message"], str) and "type" in e and "param" in e and "code" in e,
                  "OpenAI error shape: %s" % text)
            check(e["code"] is None or isinstance(e["code"], str), "error.code is a string or null: %s" % text)
            return e
        except (ValueError, KeyError):
            check(False, "error body is JSON: %r" % text[:200])
            return {}

    e = err(400, "POST", "/v1/chat/completions", {"messages": msgs, "frobnicate": 1})
    check(e.get("param") == "frobnicate", "unknown field named")
    e = err(400, "POST", "/v1/chat/completions", {"messages": msgs, "response_format": {"type": "xml"}})
    check(e.get("param") == "response_format", "response_format refused by name")
    err(400, "POST", "/v1/chat/completions", {"messages": msgs, "temperature": 5})
    err(400, "POST", "/v1/chat/completions", {"messages": []})
    err(400, "POST", "/v1/chat/completions", raw=b"{not json")
    err(400, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 10 ** 7})
    e = err(400, "POST", "/v1/chat/completions", {"messages": msgs, "max_tokens": 20000})
    check(e.get("code") == "context_length_exceeded" and "maximum context length" in e.get("message", ""),
          "context_length_exceeded: %r" % e)
    e = err(404, "POST", "/v1/chat/completions", {"model": "gpt-4", "messages": msgs})
    check(e.get("code") == "model_not_found", "404 model code")
    err(401, "POST", "/v1/chat/completions", {"messages": msgs}, key=None)
    err(401, "POST", "/v1/chat/completions", {"messages": msgs}, key="wrong")
    err(404, "GET", "/v1/nothing")
    try:
        client.chat.completions.create(model="tiny-e2e", messages=msgs, max_tokens=2,
                                       extra_body={"use_beam_search": True})
        check(False, "SDK sees a 400")
    except openai.BadRequestError as ex:
        check("use_beam_search" in str(ex), "SDK error names the field")
    # 413: a Content-Length over the limit is refused before the body is read.
    s = raw_post(srv, "/v1/chat/completions", b"{", length=999999999)
    s.settimeout(30)
    head = s.recv(4096).decode(errors="replace")
    s.close()
    check(head.startswith("HTTP/1.1 413"), "413 for a huge body: %r" % head[:60])


def check_disconnects(srv, msgs):
    """A client that hangs up mid-stream, or while a non-streamed request waits, frees the request."""
    disc0 = metric(srv, "dsv4:http_requests_client_disconnected_total") or 0
    body = json.dumps({"model": "tiny-e2e", "messages": msgs, "max_tokens": 10000, "ignore_eos": True,
                       "stream": True}).encode()
    s = raw_post(srv, "/v1/chat/completions", body)
    s.settimeout(30)
    got = b""
    while got.count(b"data: ") < 3:
        got += s.recv(4096)
    check(metric(srv, "dsv4:num_requests_running") == 1, "the long request runs")
    s.close()
    t0 = time.time()
    while time.time() - t0 < 20:
        if metric(srv, "dsv4:num_requests_running") == 0 and \
                (metric(srv, "dsv4:http_requests_client_disconnected_total") or 0) > disc0:
            break
        time.sleep(0.2)
    check(metric(srv, "dsv4:num_requests_running") == 0, "disconnect: no request left running")
    check((metric(srv, "dsv4:http_requests_client_disconnected_total") or 0) > disc0, "disconnect counted")
    check(metric(srv, "dsv4:kv_cache_usage_perc") == 0, "disconnect: KV blocks returned")
    # The same for a non-streamed request (the connection is suspended while it waits).
    body = json.dumps({"model": "tiny-e2e", "prompt": "x", "max_tokens": 10000, "ignore_eos": True}).encode()
    s = raw_post(srv, "/v1/completions", body)
    t0 = time.time()
    while metric(srv, "dsv4:num_requests_running") != 1 and time.time() - t0 < 20:
        time.sleep(0.05)
    s.close()
    t0 = time.time()
    while metric(srv, "dsv4:num_requests_running") != 0 and time.time() - t0 < 20:
        time.sleep(0.2)
    check(metric(srv, "dsv4:num_requests_running") == 0 and metric(srv, "dsv4:kv_cache_usage_perc") == 0,
          "non-streamed disconnect frees the request")
    check((metric(srv, "dsv4:request_success_total") or 0) > 0, "request_success counted")


def check_concurrency(srv, client, msgs, text):
    """Streams that finish and streams whose clients vanish, at once; then the output is still the same."""
    import random
    rng = random.Random(os.urandom(8))
    errors = []

    def worker(i):
        try:
            body = json.dumps({"model": "tiny-e2e", "messages": [{"role": "user", "content": "w%d" % i}],
                               "max_tokens": rng.randint(1, 6), "stream": rng.random() < 0.7,
                               "n": rng.choice([1, 1, 2])}).encode()
            s = raw_post(srv, "/v1/chat/completions", body, extra=b"Connection: close\r\n")
            s.settimeout(60)
            if rng.random() < 0.4:
                s.recv(64)
                s.close()
                return
            got = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
            s.close()
            if not got.startswith(b"HTTP/1.1 200") or (b"[DONE]" not in got and b"chat.completion" not in got):
                errors.append(got[:200])
        except Exception as ex:  # noqa: BLE001
            errors.append(repr(ex))
    ths = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in ths:
        t.start()
    for t in ths:
        t.join(120)
    check(not errors, "concurrent requests: %r" % errors[:3])
    t0 = time.time()
    while metric(srv, "dsv4:num_requests_running") != 0 and time.time() - t0 < 30:
        time.sleep(0.2)
    check(metric(srv, "dsv4:num_requests_running") == 0 and metric(srv, "dsv4:num_requests_waiting") == 0 and
          metric(srv, "dsv4:kv_cache_usage_perc") == 0, "concurrency: everything returned")
    r = client.chat.completions.create(model="tiny-e2e", messages=msgs, max_tokens=8, temperature=0)
    check((r.choices[0].message.content or "") == text, "still deterministic after the storm")



def check_scripted_tool_call(sclient, tools):
    """A generated tool call (the scripted DSML) comes back as tool_calls, streamed or not, and round-trips."""
    wmsgs = [{"role": "user", "content": "Weather in Paris?"}]
    r = sclient.chat.completions.create(model="tiny-e2e", messages=wmsgs, tools=tools, max_tokens=200)
    c = r.choices[0]
    check(c.finish_reason == "tool_calls", "finish_reason tool_calls: %r" % c.finish_reason)
    check(c.message.content == "Let me check.", "content before the call: %r" % c.message.content)
    tcs = c.message.tool_calls or []
    check(len(tcs) == 1 and tcs[0].function.name == "get_weather" and tcs[0].type == "function" and
          tcs[0].id.startswith("call_"), "one tool call: %r" % tcs)
    if tcs:
        check(json.loads(tcs[0].function.arguments) == {"city": "Paris", "days": 3},
              "arguments: %r" % tcs[0].function.arguments)
    stream = sclient.chat.completions.create(model="tiny-e2e", messages=wmsgs, tools=tools, max_tokens=200,
                                             stream=True)
    content, args, names, ids_seen, finish = "", {}, {}, {}, None
    for ch in stream:
        for cc in ch.choices:
            d = cc.delta
            content += d.content or ""
            for t in d.tool_calls or []:
                if t.id:
                    ids_seen[t.index] = t.id
                if t.function and t.function.name:
                    names[t.index] = t.function.name
                if t.function and t.function.arguments:
                    args[t.index] = args.get(t.index, "") + t.function.arguments
            finish = cc.finish_reason or finish
    check(finish == "tool_calls" and content == "Let me check." and names == {0: "get_weather"},
          "streamed tool call: %r %r %r" % (finish, content, names))
    check(json.loads(args.get(0, "null")) == {"city": "Paris", "days": 3}, "streamed arguments: %r" % args)
    # The round trip: the call and its result go back in; the server renders them (DSML) and answers.
    if tcs:
        back = wmsgs + [c.message.model_dump(exclude_none=True),
                        {"role": "tool", "tool_call_id": tcs[0].id, "content": "{\"temp_c\": 21}"}]
        rt = sclient.chat.completions.create(model="tiny-e2e", messages=back, tools=tools, max_tokens=3)
        check(rt.choices[0].message is not None, "round trip answered")


def check_429_and_drain(small, sclient):
    """429 when the queue is full; on SIGTERM /health and new requests get 503 while in-flight ones finish, and the server exits 0."""
    results = {}

    def long_req(name, n):
        try:
            r = sclient.completions.create(model="tiny-e2e", prompt="long", max_tokens=n,
                                           extra_body={"ignore_eos": True})
            results[name] = r.usage.completion_tokens
        except Exception as ex:  # noqa: BLE001
            results[name] = ex

    a = threading.Thread(target=long_req, args=("a", 120))
    a.start()
    t0 = time.time()
    while metric(small, "dsv4:num_requests_running") != 1 and time.time() - t0 < 20:
        time.sleep(0.05)
    b = threading.Thread(target=long_req, args=("b", 4))
    b.start()
    t0 = time.time()
    while metric(small, "dsv4:num_requests_waiting") != 1 and time.time() - t0 < 20:
        time.sleep(0.05)
    st, text, hdr = http(small, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 2}, key=None)
    check(st == 429 and "Retry-After" in hdr, "429 with Retry-After when the queue is full: %s %s" % (st, text))
    small.p.send_signal(signal.SIGTERM)
    t0 = time.time()  # the drain lasts while "a" runs (>= 3 s): poll for it (was one look after 0.3 s)
    while True:
        st, text, _ = http(small, "GET", "/health", key=None)
        if st == 503 or time.time() - t0 > 10:
            break
        time.sleep(0.05)
    check(st == 503, "/health 503 while draining: %s %s" % (st, text))
    st, text, _ = http(small, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 2}, key=None)
    check(st == 503, "new requests 503 while draining: %s" % st)
    a.join(120)
    b.join(120)
    check(results.get("a") == 120 and results.get("b") == 4, "in-flight requests finish during drain: %r" % results)
    try:
        rc = small.p.wait(60)
    except subprocess.TimeoutExpired:
        small.p.kill()
        rc = -9
    check(rc == 0, "drained server exits 0: %r\n%s" % (rc, small.logtext()[-3000:]))


def main():
    cli_errors()
    tiny_build()
    # An explicit context limit: the default is the device's (16384 on the CPU, the model's 1M on a GPU),
    # and the context-length check below needs one a request can exceed.
    srv = Server("cpu", "--api-key", KEY, "--max-model-len", "16384")
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key=KEY, max_retries=0)
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello."}]

    check_health_models_metrics(srv, client)
    text = check_chat_streamed(client, msgs)
    check_sse_bytes(srv, msgs)
    check_thinking_parts(client)
    check_sampling(client, msgs)
    ctext = check_completions(srv, client)
    check_stop_strings(client, ctext)
    check_chat_logprobs(client, msgs)
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                               "parameters": {"type": "object", "properties": {
                                                   "city": {"type": "string"}}, "required": ["city"]}}}]
    check_tools(client, tools)
    script_ids = dsml_script_ids(srv)
    check_prefix_cache(client)
    check_tokenize(srv, msgs)
    check_errors(srv, client, msgs)
    check_disconnects(srv, msgs)
    check_concurrency(srv, client, msgs, text)

    rc = srv.stop()
    check(rc == 0, "main server exit status after SIGTERM: %r\n%s" % (rc, srv.logtext()[-3000:]))

    # ---- a one-sequence server on the scripted executor: a known tool call, 429, the SIGTERM drain ----
    notify = NotifyListener()
    small = Server("test", "--max-num-seqs", "1", "--max-num-queued-reqs", "1", "--shutdown-timeout", "60",
                   env={"DSV4_TEST_EXEC_SCRIPT": " ".join(map(str, script_ids)), "NOTIFY_SOCKET": notify.path,
                        "DSV4_TEST_EXEC_STEP_MS": "25",
                        "WATCHDOG_USEC": "400000"})
    sclient = openai.OpenAI(base_url=small.url + "/v1", api_key="x", max_retries=0)
    check_scripted_tool_call(sclient, tools)
    check_429_and_drain(small, sclient)
    kinds = notify.stop()
    check(kinds and kinds[0] == "READY=1", "READY=1 first: %r" % kinds[:3])
    check("WATCHDOG=1" in kinds, "WATCHDOG=1 pings: %r" % sorted(set(kinds)))
    check("STOPPING=1" in kinds and kinds.index("STOPPING=1") > 0, "STOPPING=1 on drain: %r" % sorted(set(kinds)))

    print("%d checks, %d failures" % (N_CHECKS[0], len(FAILS)))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
