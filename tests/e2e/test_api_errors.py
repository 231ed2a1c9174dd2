#!/usr/bin/env python3
"""tests/e2e/test_api_errors.py: the API behaves as OpenAI's where clients look
(issue 18). Provokes every kind of error the e2e suites provoke (collected
from test_serve, test_sdk_errors, test_http_fuzz, test_hardening,
test_structured, test_responses) and checks each body: {"error": {"message",
"type", "param", "code"}} with code a string or null (never a number), type
OpenAI's ("invalid_request_error", "requests" for 429, "server_error" for
5xx), param the field by name or null. Also: JSON null for an optional
field means absent (functions, audio, prediction, ...)."""
import json
import os
import random
import re
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serverproc  # noqa: E402
from serverproc import Check, Server  # noqa: E402

check = Check()
rng = random.Random(int(os.environ.get("DSV4_TEST_SEED", random.randrange(1 << 30))))
KEY = "sk-api-errors"
AUTH = {"Authorization": "Bearer " + KEY}
msgs = [{"role": "user", "content": "hello %d" % rng.randrange(1000)}]
srv = Server("--api-key", KEY, "--max-model-len", "512", "--max-logprobs", "5")


def req(method, path, body=None, headers=None, raw=None):
    h = dict(AUTH)
    h.update(headers or {})
    return srv.request(method, path, raw if raw is not None else body, headers=h)


def err(status, method, path, body=None, param="any", code="any", needle=None, headers=None, raw=None):
    st, text, hdr = req(method, path, body, headers, raw)
    what = "%s %s %s" % (method, path, json.dumps(body)[:120] if body is not None else repr(raw)[:80])
    check(st == status, "%s -> %d (got %d: %r)" % (what, status, st, text[:300]))
    check(serverproc.check_error_shape(st, text, what), "%s: OpenAI error shape: %r" % (what, text[:300]))
    try:
        e = json.loads(text)["error"]
    except (ValueError, KeyError, TypeError):
        check(False, "%s: error body is JSON: %r" % (what, text[:200]))
        return {}
    check(isinstance(e.get("code"), (str, type(None))), "%s: code is a string or null: %r" % (what, e))
    if param != "any":
        check(e.get("param") == param, "%s: param %r (got %r)" % (what, param, e.get("param")))
    if code != "any":
        check(e.get("code") == code, "%s: code %r (got %r)" % (what, code, e.get("code")))
    if needle:
        check(needle in e.get("message", ""), "%s: message names %r: %r" % (what, needle, e.get("message")))
    return e


C = "/v1/chat/completions"
P = "/v1/completions"


def chat(**kw):
    b = {"messages": msgs, "max_tokens": 2}
    b.update(kw)
    return b


# ---- parameter errors (test_serve, test_sdk_errors, test_http_fuzz) ----
err(400, "POST", C, chat(frobnicate=1), param="frobnicate", code="unknown_parameter")
err(400, "POST", C, chat(use_beam_search=True), param="use_beam_search", code="unknown_parameter")
err(400, "POST", C, chat(temperature=5), param="temperature", code="invalid_value", needle="[0, 2]")
err(400, "POST", C, chat(temperature=-1), param="temperature", code="invalid_value")
err(400, "POST", C, chat(temperature="hot"), param="temperature", code="invalid_type")
# one range message for top_p, whichever side the value is on
for v in (0, -0.5, 1.5, 2):
    err(400, "POST", C, chat(top_p=v), param="top_p", code="invalid_value", needle="(0, 1]")
err(400, "POST", C, chat(repetition_penalty=0), param="repetition_penalty", needle="(0, 2]")
err(400, "POST", C, chat(repetition_penalty=3), param="repetition_penalty", needle="(0, 2]")
err(400, "POST", C, chat(n=0), param="n", code="invalid_value")
err(400, "POST", C, chat(n=1.5), param="n")
err(400, "POST", C, chat(response_format={"type": "xml"}), param="response_format")
err(400, "POST", C, chat(skip_special_tokens="no"), param="skip_special_tokens")
err(400, "POST", C, chat(stop=[1, 2]), param="stop")
err(400, "POST", C, chat(logit_bias={"x": 1}), param="logit_bias")
err(400, "POST", C, chat(top_logprobs=3), param="top_logprobs")
err(400, "POST", C, chat(logprobs=True, top_logprobs=9), param="top_logprobs", needle="--max-logprobs")
err(400, "POST", C, chat(stream_options={"include_usage": True}), param="stream_options")
err(400, "POST", C, chat(min_tokens=5, max_tokens=2), param="min_tokens")
err(400, "POST", C, chat(tool_choice="required"), param="tool_choice")
err(400, "POST", C, {"messages": []}, param="messages")
err(400, "POST", C, {"max_tokens": 2}, param="messages", code="missing_required_parameter")
err(400, "POST", C, {"messages": [{"role": "wizard", "content": "x"}]}, param="messages.role")
err(400, "POST", C, raw=b"{not json", param=None, code="invalid_json")
err(400, "POST", C, raw=b"[1, 2]", param=None, code="invalid_json")
err(400, "POST", C, raw=b'{"messages": [], "x": 1\x00}', param=None, code="invalid_json")
err(400, "POST", C, chat(response_format={"type": "json_schema", "json_schema": {"schema": {"type": "frob"}}}),
    param="response_format")
# context and size limits
e = err(400, "POST", C, chat(max_tokens=20000), param="messages", code="context_length_exceeded")
check("maximum context length" in e.get("message", ""), "context message: %r" % e)
err(400, "POST", C, {"messages": [{"role": "user", "content": "word " * 800}], "max_tokens": 1},
    code="context_length_exceeded")
err(400, "POST", P, {"prompt": "x", "max_tokens": 10 ** 7}, param="prompt", code="context_length_exceeded")
err(400, "POST", P, {"max_tokens": 3}, param="prompt")
err(400, "POST", P, {"prompt": [10 ** 9]}, param="prompt")
err(400, "POST", P, {"prompt": "x", "max_tokens": 0}, param="max_tokens")
err(400, "POST", P, {"prompt": "x", "suffix": "y"}, param="suffix")
err(400, "POST", "/tokenize", {"prompt": "x", "messages": msgs}, param="prompt")
err(400, "POST", "/tokenize", {}, param="prompt")
err(400, "POST", "/detokenize", {"tokens": [-1]}, param="tokens")
err(400, "POST", "/detokenize", {}, param="tokens", code="missing_required_parameter")
err(400, "POST", "/detokenize", {"tokens": [1], "extra": 1}, param="extra", code="unknown_parameter")
err(400, "POST", "/v1/responses", {"input": "x", "frobnicate": 1})

# ---- model, auth, routes (test_serve, test_sdk_errors, test_hardening) ----
err(404, "POST", C, chat(model="gpt-4"), param=None, code="model_not_found", needle="gpt-4")
err(404, "GET", "/v1/models/nope", param=None, code="model_not_found")
for h in ({"Authorization": "Bearer wrong"}, {"Authorization": ""}):
    err(401, "POST", C, chat(), headers=h, param=None, code="invalid_api_key")
err(404, "GET", "/v1/nothing", param=None)
err(405, "GET", C, param=None)
err(405, "POST", "/health", param=None)
err(415, "POST", C, chat(), headers={"Content-Type": "text/plain"}, param=None)
err(404, "GET", "/v1/responses/resp_doesnotexist", param="response_id")

# 413 and 400 from the HTTP layer itself (its own bodies)
for raw_req, status in ((b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 999999999\r\n\r\n{", 413),
                        (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                         b"Content-Length: 3\r\n\r\n{}", 400)):
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.sendall(raw_req)
    s.settimeout(30)
    data = b""
    try:
        while b"}}" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    check(head.startswith(b"HTTP/1.1 %d" % status), "HTTP layer %d: %r" % (status, head[:60]))
    check(serverproc.check_error_shape(status, body, "http %d" % status), "HTTP layer %d shape: %r" % (status, body))

# ---- null means absent ----
for extra in ({"functions": None}, {"audio": None}, {"prediction": None}, {"function_call": None},
              {"temperature": None, "top_p": None, "stop": None, "seed": None, "logit_bias": None},
              {"tools": None, "tool_choice": None, "response_format": None, "stream_options": None},
              {"web_search_options": None, "max_completion_tokens": None, "n": None}):
    st, text, _ = req("POST", C, chat(**extra))
    check(st == 200, "null fields are absent: %r -> %d %r" % (extra, st, text[:200]))
st, text, _ = req("POST", P, {"prompt": "x", "max_tokens": 2, "suffix": None, "echo": None, "best_of": None})
check(st == 200, "completions: null fields are absent: %d %r" % (st, text[:200]))
st, text, _ = req("POST", "/detokenize", {"tokens": [1, 2], "model": None})
check(st == 200, "detokenize: null model is absent: %d %r" % (st, text[:200]))
# a non-null value of a field we do not implement is still refused by name
err(400, "POST", C, chat(functions=[{"name": "f"}]), param="functions")
err(400, "POST", C, chat(audio={"voice": "x"}), param="audio")

# ---- skip_special_tokens / spaces_between_special_tokens (vLLM's) ----
SPECIAL = "<\uff5cplace\u2581holder\u2581no\u25813\uff5c>"  # a special added token of this tokenizer
st, text, _ = req("POST", "/tokenize", {"prompt": "Hello" + SPECIAL + " world", "add_special_tokens": False})
ids = json.loads(text)["tokens"] if st == 200 else []
check(len(ids) >= 3, "tokenize the scripted output: %d %r" % (st, text[:200]))
# the access log (INFO, one line per request): refusals too, with the client's X-Request-Id
rid = "req-%08x" % rng.randrange(1 << 32)
req("POST", C, chat(temperature=9), headers={"X-Request-Id": rid})
for _ in range(300):  # written after the reply's last byte (see below): up to ~30 s
    log = srv.logtext()
    line = [l for l in log.splitlines() if " access: " + rid + " " in l]
    if line:
        break
    time.sleep(0.1)
check(len(line) == 1 and " INFO " in line[0] and "/v1/chat/completions" in line[0] and "status=400" in line[0]
      and "duration_s=" in line[0], "access log line of a refusal: %r" % line)
check(not re.search(r"access: \S+ /health ", log), "/health polls are not logged")
serverproc.stop_and_check(srv, check)

srv = Server("--api-key", KEY, "--max-model-len", "512", "--log-stats-interval", "0.2",
             env={"DSV4_TEST_EXEC_SCRIPT": " ".join(str(i) for i in ids)})
for path, body, get in (
        (P, {"prompt": "x", "max_tokens": len(ids)}, lambda d: d["choices"][0]["text"]),
        (C, chat(max_tokens=len(ids)), lambda d: d["choices"][0]["message"]["content"])):
    outs = {}
    for extra in ({}, {"skip_special_tokens": True}, {"skip_special_tokens": False},
                  {"skip_special_tokens": False, "spaces_between_special_tokens": False},
                  {"skip_special_tokens": False, "spaces_between_special_tokens": True}):
        b = dict(body)
        b.update(extra)
        st, text, _ = req("POST", path, b)
        check(st == 200, "%s %r: %d %r" % (path, extra, st, text[:200]))
        outs[json.dumps(extra)] = get(json.loads(text)) if st == 200 else None
    check(outs["{}"] == "Hello world", "%s: special tokens skipped by default: %r" % (path, outs["{}"]))
    check(outs['{"skip_special_tokens": true}'] == "Hello world", "%s: skip_special_tokens true" % path)
    check(outs['{"skip_special_tokens": false}'] == "Hello" + SPECIAL + " world",
          "%s: skip_special_tokens false keeps the special token's text: %r" % (path, outs['{"skip_special_tokens": false}']))
    check(len(set(v for k, v in outs.items() if "false" in k)) == 1,
          "%s: spaces_between_special_tokens changes nothing with this fast tokenizer, as in vLLM: %r" % (path, outs))
# the access log line of a generation: tokens, finish reason, TTFT, status
rid = "req-%08x" % rng.randrange(1 << 32)
st, text, _ = req("POST", P, {"prompt": "x", "max_tokens": len(ids)}, headers={"X-Request-Id": rid})
usage = json.loads(text)["usage"] if st == 200 else {}
# the line is written when the request's bookkeeping ends, which can follow the last byte the
# client reads (slow under ASan): wait for it, up to ~30 s; no timing is asserted
for _ in range(300):
    m = re.search(r" INFO +access: %s /v1/completions model=tiny-e2e status=200 prompt_tokens=(\d+) "
                  r"output_tokens=(\d+) finish=length ttft_s=[0-9.]+ duration_s=[0-9.]+$" % rid, srv.logtext(), re.M)
    if m:
        break
    time.sleep(0.1)
check(m and int(m.group(1)) == usage.get("prompt_tokens") and int(m.group(2)) == len(ids),
      "access log line of a generation (%r): %r" % (usage, [l for l in srv.logtext().splitlines() if rid in l]))
# streamed: the same text arrives in deltas
st, text, _ = req("POST", P, {"prompt": "x", "max_tokens": len(ids), "stream": True, "skip_special_tokens": False})
pieces = [json.loads(l[6:])["choices"][0]["text"] for l in text.decode().splitlines()
          if l.startswith("data: {") and json.loads(l[6:]).get("choices")]
check("".join(pieces) == "Hello" + SPECIAL + " world", "streamed with special tokens: %r" % pieces)

# vLLM's periodic stats line: INFO while there was work, every --log-stats-interval seconds
stats = []
for _ in range(200):  # up to ~20 s on a loaded machine; no timing is asserted
    stats = re.findall(r" INFO +stats: Avg prompt throughput: ([0-9.]+) tokens/s, Avg generation throughput: "
                       r"([0-9.]+) tokens/s, Running: \d+ reqs, Waiting: \d+ reqs, KV cache usage: [0-9.]+%, "
                       r"Prefix cache hit rate: [0-9.]+%$", srv.logtext(), re.M)
    if any(float(g) > 0 for _, g in stats):
        break
    req("POST", P, {"prompt": "x", "max_tokens": len(ids)})
    time.sleep(0.1)
check(any(float(g) > 0 for _, g in stats), "a stats line shows the generation throughput: %r" % stats[-3:])
serverproc.stop_and_check(srv, check)

# --disable-log-requests: no access line; --disable-log-stats: no stats line
srv = Server("--api-key", KEY, "--disable-log-requests", "--disable-log-stats")
req("POST", P, {"prompt": "x", "max_tokens": 2})
req("POST", C, chat(temperature=9))
time.sleep(0.3)
check(" access: " not in srv.logtext() and " stats: " not in srv.logtext(),
      "--disable-log-requests and --disable-log-stats log neither: %r" % srv.logtext()[-800:])
serverproc.stop_and_check(srv, check)
sys.exit(check.finish())
