"""tests/e2e/test_http_fuzz.py: at least 1,000 malformed requests against
`dsv4 serve --executor test`; each must get a 4xx (HTTP-level garbage may
instead be closed without an answer; a stalled connection stays open until
the client or the server's timeout ends it), never a 5xx, and the server must
keep serving valid requests in between and afterwards, then exit 0 on SIGTERM
with no sanitizer report.

Kinds (seeded; the seed is printed, DSV4_TEST_SEED repeats a run):
  mutate   random byte mutations of valid chat/completions/tokenize/detokenize
           bodies (flips, inserts of JSON syntax and bad bytes, deletes,
           duplicated spans, truncation). Invalid JSON must be a 400; a mutant
           that is still JSON may be answered (then it must be a short
           request: long generations are re-drawn) or refused with a 4xx.
  retype   one field replaced by a value of the wrong type, a huge or negative
           number, a huge string or array; wrong types and |x| >= 1e19 must be
           4xx, the rest must not be a 5xx.
  fixed    invalid UTF-8 (raw, overlong, surrogates), NUL bytes, deep nesting,
           arrays over the documented limits, bad token ids.
  header   bad Content-Length (non-numeric, negative, two of them, shorter
           than the body), bad Content-Type, oversized and malformed headers,
           bad chunked encoding, bad request lines.
  slow     slowloris connections (headers that never end, bodies that stop
           early) held open while valid requests are served, plus a request
           sent a few bytes at a time that must still be answered; four
           stalled connections (silent, in the headers, in the body, idle
           after a kept-alive answer) must be closed by the server's request
           timeout (30 s), which is why the test takes about 35 s.
Every 25th request is a valid one that must answer 200.
"""
import json
import os
import random
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serverproc import Check, Server, stop_and_check  # noqa: E402

check = Check()
MODEL = "tiny-fuzz"
N_TARGET = 1000
COUNTS = {}
STATUSES = {}


REFUSED = [0]  # malformed requests answered 4xx or closed unanswered (the slow ones apart)


def count(kind, status):
    COUNTS[kind] = COUNTS.get(kind, 0) + 1
    STATUSES[status] = STATUSES.get(status, 0) + 1
    if kind not in ("valid", "slow") and not (isinstance(status, int) and 200 <= status < 300):
        REFUSED[0] += 1


def exchange(port, data, timeout=10.0):
    """Send raw bytes, read to EOF. Returns (status or None, raw response); None status = closed
    without a response; -1 = timeout."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered early (413, 431) and closed
        got = b""
        try:
            while not complete(got):
                c = s.recv(65536)
                if not c:
                    break
                got += c
        except socket.timeout:
            return -1, got
        except ConnectionResetError:
            pass
    finally:
        s.close()
    if not got.startswith(b"HTTP/1."):
        return None, got
    try:
        return int(got[9:12]), got
    except ValueError:
        return None, got


def complete(got):
    """One whole response in got (so that a kept-alive connection need not time out)."""
    head, sep, body = got.partition(b"\r\n\r\n")
    if not sep:
        return False
    h = head.lower()
    if b"\r\ncontent-length:" in h:
        n = int(h.split(b"\r\ncontent-length:", 1)[1].split(b"\r\n", 1)[0])
        return len(body) >= n
    if b"transfer-encoding: chunked" in h:
        return body.endswith(b"0\r\n\r\n")
    return False


def post(path, body, headers=None, extra_head=b""):
    hdr = {"Host": "localhost", "Content-Type": "application/json", "Connection": "close"}
    hdr.update(headers or {})
    head = b"POST %s HTTP/1.1\r\n" % path.encode()
    for k, v in hdr.items():
        if v is not None:
            head += k.encode() + b": " + (v if isinstance(v, bytes) else str(v).encode()) + b"\r\n"
    if "Content-Length" not in hdr:
        head += b"Content-Length: %d\r\n" % len(body)
    return head + extra_head + b"\r\n" + body


def strict_json(b):
    """Python's parser, made as strict as RFC 8259: no NaN/Infinity, valid UTF-8, no lone surrogates."""
    def bad_const(c):
        raise ValueError(c)
    try:
        text = b.decode("utf-8")
        v = json.loads(text, parse_constant=bad_const)
        json.dumps(v, ensure_ascii=False).encode("utf-8")  # lone surrogates fail here
        return True, v
    except (ValueError, UnicodeError, RecursionError):
        return False, None


def is_error_body(raw):
    body = raw.partition(b"\r\n\r\n")[2]
    try:
        e = json.loads(body)["error"]
        return isinstance(e["message"], str) and "type" in e and "code" in e
    except (ValueError, KeyError, TypeError):
        return False


class Fuzzer:
    def __init__(self, srv, rng):
        self.srv = srv
        self.rng = rng
        self.n = 0

    def valid(self):
        r = self.rng
        k = r.randrange(4)
        if k == 0:
            return "/v1/chat/completions", {"model": MODEL, "messages": [
                {"role": "system", "content": "terse"}, {"role": "user", "content": "hi %d" % r.randrange(1000)}],
                "max_tokens": r.randint(1, 3), "temperature": r.choice([0, 0.7]), "stream": r.random() < 0.3,
                "stop": ["\n"], "seed": r.randrange(1 << 31), "top_p": 0.9}
        if k == 1:
            return "/v1/completions", {"model": MODEL, "prompt": r.choice(["abc", ["a", "b"], [1, 2, 3]]),
                                       "max_tokens": r.randint(1, 3), "logprobs": 1, "stream": r.random() < 0.3}
        if k == 2:
            return "/tokenize", {"prompt": "hello world %d" % r.randrange(1000), "return_token_strs": True}
        return "/detokenize", {"tokens": [r.randrange(1, 1000) for _ in range(r.randint(1, 8))]}

    def must_valid(self):
        path, body = self.valid()
        st, raw = exchange(self.srv.port, post(path, json.dumps(body).encode()), timeout=30)
        check(st == 200, "valid %s answers 200 (got %r: %r)" % (path, st, raw[:300]))
        count("valid", st)

    def send(self, kind, data, want, what):
        """want: '4xx' (a 4xx), 'close' (4xx or closed unanswered), 'any' (2xx/4xx), 'answer' (2xx)."""
        self.n += 1
        if self.n % 25 == 0:
            self.must_valid()
        st, raw = exchange(self.srv.port, data)
        count(kind, st)
        ok = {
            "4xx": st is not None and 400 <= st < 500,
            "close": st is None or (400 <= st < 500),
            "any": st is not None and (200 <= st < 300 or 400 <= st < 500),
        }[want]
        if not check(ok, "%s: %s -> want %s, got %r: %r (request %r)" % (kind, what, want, st, raw[:300], data[:300])):
            return st
        if st is not None and 400 <= st < 500 and b"application/json" in raw.partition(b"\r\n\r\n")[0]:
            check(is_error_body(raw), "%s: %s: 4xx JSON is an OpenAI error: %r" % (kind, what, raw[:300]))
        return st

    # ---- mutations of valid bodies ----
    SYNTAX = [b"{", b"}", b"[", b"]", b'"', b",", b":", b"\\", b" ", b"0", b"-", b"e", b"+", b".", b"\x00",
              b"\xff", b"\xc3", b"\x80", b"\xed\xa0\x80", b"null", b"true", b"1e999", b"-0", b"\\u", b"\\ud800"]

    def mutate(self, b):
        r = self.rng
        b = bytearray(b)
        for _ in range(r.randint(1, 4)):
            op = r.randrange(6)
            i = r.randrange(len(b) + 1)
            if op == 0 and b:
                b[min(i, len(b) - 1)] = r.randrange(256)
            elif op == 1:
                b[i:i] = r.choice(self.SYNTAX)
            elif op == 2 and b:
                del b[i:i + r.randint(1, 12)]
            elif op == 3 and b:
                j = r.randrange(len(b))
                b[i:i] = b[j:j + r.randint(1, 20)] * r.randint(1, 4)
            elif op == 4:
                del b[i:]
            else:
                b[i:i] = bytes(r.randrange(32, 127) for _ in range(r.randint(1, 5)))
        return bytes(b)

    def harmless(self, path, v):
        """A still-valid mutant we may let run: short generation only."""
        if path not in ("/v1/chat/completions", "/v1/completions"):
            return True
        if not isinstance(v, dict):
            return True

        def small(x, hi):
            return isinstance(x, int) and not isinstance(x, bool) and x <= hi
        mt = v.get("max_completion_tokens", v.get("max_tokens"))
        if not small(mt, 8) or not small(v.get("n", 1), 2) or not small(v.get("best_of", 1), 2):
            return False
        p = v.get("prompt")
        if isinstance(p, list) and len(p) > 4 and not all(isinstance(x, int) for x in p):
            return False
        return True

    def run_mutations(self, n):
        """Until n mutants have been refused (a still-valid mutant that is answered does not count)."""
        done = 0
        while done < n:
            path, body = self.valid()
            m = self.mutate(json.dumps(body).encode())
            ok, v = strict_json(m)
            if ok and not self.harmless(path, v):
                continue
            st = self.send("mutate", post(path, m), "4xx" if not ok else "any", "%s %r" % (path, m[:120]))
            done += not (isinstance(st, int) and 200 <= st < 300)

    # ---- one field replaced ----
    NUMERIC = ["max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p", "n", "seed",
               "presence_penalty", "frequency_penalty", "repetition_penalty", "top_logprobs", "priority",
               "min_tokens"]
    BOOL = ["stream", "ignore_eos", "include_stop_str_in_output", "skip_special_tokens", "echo"]

    def retype(self, n):
        r = self.rng
        huge = [1e19, -1e19, 2 ** 64, -(2 ** 63) - 1, 1e308, -1e308, 10 ** 30, -(10 ** 40)]
        wrong = [[], {}, [1], {"a": 1}, "x" * r.randint(0, 3000), "12"]
        odd = [None, 0, -1, 1, -2 ** 31, 2 ** 31, 0.5, -0.0, 1e-320, 65537, 2 ** 24 + 1]
        for _ in range(n):
            kind = r.randrange(4)
            if kind == 0:  # numeric field
                chat = r.random() < 0.5
                path = "/v1/chat/completions" if chat else "/v1/completions"
                body = {"model": MODEL, "max_tokens": 2}
                if chat:
                    body["messages"] = [{"role": "user", "content": "x"}]
                else:
                    body["prompt"] = "x"
                f = r.choice(self.NUMERIC)
                if not chat and f == "max_completion_tokens":
                    f = "max_tokens"
                pick = r.randrange(3)
                val = r.choice(huge if pick == 0 else wrong if pick == 1 else odd)
                body[f] = val
                want = "4xx" if pick < 2 else "any"
                if pick == 2 and f in ("max_tokens", "max_completion_tokens", "min_tokens") and \
                        (val is None or (isinstance(val, (int, float)) and val > 8)):
                    body["max_tokens"] = 2  # keep an accepted request short
                    body.pop("max_completion_tokens", None)
                    if f == "min_tokens":
                        body[f] = val
                    if f != "min_tokens" or (isinstance(val, (int, float)) and val > 2):
                        want = "4xx" if f == "min_tokens" else "any"
                if pick == 2 and f == "n" and isinstance(val, (int, float)) and val > 2:
                    want = "4xx" if val > 128 or val != int(val) else "any"
                    if want == "any":
                        body["max_tokens"] = 1
                        body[f] = min(int(val), 4)
            elif kind == 1:  # boolean field
                path = "/v1/completions"
                body = {"model": MODEL, "prompt": "x", "max_tokens": 2, r.choice(self.BOOL): r.choice(
                    [[], {}, "x", [True], {"a": True}])}
                want = "4xx"
            elif kind == 2:  # structure: messages / prompt / stop / logit_bias of the wrong shape
                path = "/v1/chat/completions"
                shapes = [
                    {"messages": "hi"}, {"messages": {"role": "user"}}, {"messages": [1, 2]},
                    {"messages": [{"role": 5, "content": "x"}]}, {"messages": [{"role": "alien", "content": "x"}]},
                    {"messages": [{"role": "user", "content": 5}]},
                    {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]},
                    {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
                    {"messages": [{"role": "user", "content": [5]}]},
                    {"messages": [{"role": "user"}]}, {"messages": [{}]}, {"messages": None},
                    {"messages": [{"role": "user", "content": "x"}], "stop": 5},
                    {"messages": [{"role": "user", "content": "x"}], "stop": [5]},
                    {"messages": [{"role": "user", "content": "x"}], "stop": [""]},
                    {"messages": [{"role": "user", "content": "x"}], "logit_bias": {"x": 1}},
                    {"messages": [{"role": "user", "content": "x"}], "logit_bias": {"5": "x"}},
                    {"messages": [{"role": "user", "content": "x"}], "logit_bias": {"-1": 1}},
                    {"messages": [{"role": "user", "content": "x"}], "logit_bias": {"99999999999": 1}},
                    {"messages": [{"role": "user", "content": "x"}], "logit_bias": {"5": 1e9}},
                    {"messages": [{"role": "user", "content": "x"}], "tools": "x"},
                    {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
                    {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "x", "function": {}}]},
                    {"messages": [{"role": "user", "content": "x"}], "tool_choice": 5},
                    {"messages": [{"role": "user", "content": "x"}], "stream_options": 5},
                    {"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": 5}},
                    {"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": []},
                    {"messages": [{"role": "user", "content": "x"}], "response_format": "json"},
                    {"messages": [{"role": "user", "content": "x"}], "stop_token_ids": [-1]},
                    {"messages": [{"role": "user", "content": "x"}], "stop_token_ids": "x"},
                    {"messages": [{"role": "user", "content": "x"}], "model": 5},
                    {"messages": [{"role": "user", "content": "x"}], "model": "other"},
                    {"messages": [{"role": "assistant", "tool_calls": 5}]},
                    {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": 5}}]}]},
                ]
                body = dict(r.choice(shapes))
                body.setdefault("max_tokens", 2)
                want = "4xx"
            else:  # completions prompt / detokenize tokens of the wrong shape
                shapes = [
                    ("/v1/completions", {"prompt": 5}), ("/v1/completions", {"prompt": None}),
                    ("/v1/completions", {"prompt": [None]}), ("/v1/completions", {"prompt": [[1, "a"]]}),
                    ("/v1/completions", {"prompt": [-1]}), ("/v1/completions", {"prompt": [2 ** 40]}),
                    ("/v1/completions", {"prompt": [10 ** 7]}), ("/v1/completions", {"prompt": []}),
                    ("/v1/completions", {"prompt": [[]]}), ("/v1/completions", {"prompt": {"a": 1}}),
                    ("/v1/completions", {"prompt": [1.5]}), ("/v1/completions", {"prompt": "x", "suffix": "y"}),
                    ("/v1/completions", {"prompt": "x", "best_of": 3}), ("/v1/completions", {"prompt": "x", "max_tokens": 0}),
                    ("/v1/completions", {"prompt": "x", "best_of": 3}), ("/v1/completions", {"prompt": "x", "echo": True, "logprobs": 99}),
                    ("/detokenize", {"tokens": "x"}), ("/detokenize", {"tokens": [-5]}),
                    ("/detokenize", {"tokens": [2 ** 40]}), ("/detokenize", {"tokens": [1.5]}),
                    ("/detokenize", {}), ("/tokenize", {}), ("/tokenize", {"prompt": 5}),
                    ("/tokenize", {"messages": 5}), ("/tokenize", {"prompt": "x", "messages": []}),
                ]
                path, body = r.choice(shapes)
                body = dict(body)
                if path == "/v1/completions":
                    body.setdefault("max_tokens", 2)
                want = "4xx"
            self.send("retype", post(path, json.dumps(body).encode()), want, "%s %r" % (path, body))

    # ---- fixed cases: encoding, nesting, sizes ----
    def fixed(self):
        r = self.rng
        chat = "/v1/chat/completions"

        def chat_with(content_bytes):
            return b'{"model":"' + MODEL.encode() + b'","max_tokens":2,"messages":[{"role":"user","content":"' + \
                content_bytes + b'"}]}'
        bad_utf8 = [b"\xff", b"\xfe\xff", b"\xc0\x80", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
                    b"\xf8\x88\x80\x80\x80", b"a\x80b", b"\xc3\x28", b"\xe0\x80\xaf"]
        for b in bad_utf8:
            self.send("fixed", post(chat, chat_with(b)), "4xx", "raw invalid UTF-8 %r" % b)
            self.send("fixed", post("/tokenize", b'{"prompt":"' + b + b'"}'), "4xx", "tokenize invalid UTF-8 %r" % b)
        for esc in [b"\\ud800", b"\\udfff", b"\\ud800\\u0041", b"\\uDBFF"]:
            self.send("fixed", post(chat, chat_with(esc)), "any", "escaped lone surrogate %r" % esc)
        self.send("fixed", post(chat, chat_with(b"a\x00b")), "4xx", "raw NUL in a string")
        self.send("fixed", post(chat, chat_with(b"a\\u0000b")), "any", "escaped NUL in a string")
        self.send("fixed", post(chat, b'{"model":"x"\x00,"messages":[]}'), "4xx", "NUL between tokens")
        self.send("fixed", post(chat, b"\x00" * 100), "4xx", "all NUL")
        self.send("fixed", post(chat, b""), "4xx", "empty body")
        self.send("fixed", post(chat, b"   "), "4xx", "blank body")
        self.send("fixed", post(chat, b"\xef\xbb\xbf{}"), "4xx", "BOM then {}")
        for top in [b"[]", b"null", b"1", b'"x"', b"true", b"{}", b"{} {}", b'{"messages":[]}x']:
            self.send("fixed", post(chat, top), "4xx", "top level %r" % top)
        for depth in [100, 3000, 100000]:
            self.send("fixed", post(chat, b"[" * depth + b"]" * depth), "4xx", "nested arrays %d" % depth)
            self.send("fixed", post(chat, b'{"a":' * depth + b"1" + b"}" * depth), "4xx", "nested objects %d" % depth)
            nest = b'{"model":"%s","max_tokens":2,"messages":[{"role":"user","content":"x"}],"metadata":' % \
                MODEL.encode() + b"[" * depth + b"]" * depth + b"}"
            self.send("fixed", post(chat, nest), "any" if depth <= 100 else "4xx", "nested ignored field %d" % depth)
            self.send("fixed", post(chat, b"[" * depth), "4xx", "unclosed nesting %d" % depth)
        msgs = [{"role": "user", "content": "x"}] * 4097
        self.send("fixed", post(chat, json.dumps({"messages": msgs, "max_tokens": 1}).encode()), "4xx", "4097 messages")
        self.send("fixed", post(chat, json.dumps({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "x"}] * 1025}], "max_tokens": 1}).encode()), "4xx", "1025 content parts")
        self.send("fixed", post(chat, json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1,
                                                  "stop": ["a"] * 17}).encode()), "4xx", "17 stop strings")
        self.send("fixed", post(chat, json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1,
                                                  "stop": ["a" * 257]}).encode()), "4xx", "257-byte stop string")
        self.send("fixed", post(chat, json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1,
                                                  "stop_token_ids": list(range(1, 66))}).encode()), "4xx", "65 stop ids")
        self.send("fixed", post(chat, json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1,
                                                  "logit_bias": {str(i): 1 for i in range(301)}}).encode()), "4xx",
                  "301 logit_bias entries")
        self.send("fixed", post(chat, json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1,
                                                  "tools": [{"type": "function", "function": {"name": "f%d" % i}}
                                                            for i in range(257)]}).encode()), "4xx", "257 tools")
        self.send("fixed", post(chat, json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1,
                                                  "n": 129}).encode()), "4xx", "n=129")
        self.send("fixed", post(chat, json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1,
                                                  "top_logprobs": 21, "logprobs": True}).encode()), "4xx", "top_logprobs 21")
        self.send("fixed", post("/v1/completions", json.dumps({"prompt": ["a"] * 65, "max_tokens": 1}).encode()),
                  "4xx", "65 prompts")
        self.send("fixed", post("/v1/completions", json.dumps({"prompt": [5] * ((1 << 20) + 1),
                                                               "max_tokens": 1}).encode()), "4xx", "2^20+1 prompt ids")
        self.send("fixed", post("/v1/completions", json.dumps({"prompt": "word " * 200000,
                                                               "max_tokens": 1}).encode()), "4xx",
                  "a prompt over the context")
        self.send("fixed", post("/detokenize", json.dumps({"tokens": [1] * 300000 + [-1]}).encode()), "4xx",
                  "300001 tokens with a bad one")
        self.send("fixed", post(chat, json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1,
                                                  "frobnicate": list(range(100000))}).encode()), "4xx",
                  "unknown field with a huge array")
        key = "k" * 100000
        self.send("fixed", post(chat, ('{"%s": 1}' % key).encode()), "4xx", "100000-byte key")
        for _ in range(10):  # random binary bodies
            n = r.choice([1, 10, 1000, 100000])
            self.send("fixed", post(chat, bytes(r.randrange(256) for _ in range(n))), "4xx", "random bytes %d" % n)

    # ---- headers and framing ----
    def headers(self):
        r = self.rng
        body = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 1}).encode()
        comp = "/v1/completions"
        for cl in [b"abc", b"-1", b"1e3", b"0x10", b" ", b"18446744073709551616", b"99999999999999999999999",
                   b"12abc", b"+5"]:
            self.send("header", post(comp, body, {"Content-Length": cl}), "close", "Content-Length %r" % cl)
        self.send("header", post(comp, body, extra_head=b"Content-Length: 3\r\n"), "close", "two Content-Lengths")
        self.send("header", post(comp, body, {"Content-Length": 5}), "4xx", "Content-Length shorter than the body")
        for ct in [b"text/plain", b"application/x-www-form-urlencoded", b"multipart/form-data; boundary=x",
                   b"application/xml", b"text/html; charset=utf-8", b"image/png", b"application/jsonx", b"appl\xffication/json",
                   b"application/json/x", b"json", b"application/+json", b"*/*"]:
            self.send("header", post(comp, body, {"Content-Type": ct}), "4xx", "Content-Type %r" % ct)
        # (A NUL ends the header value as the server reads it: application/json\x00x is JSON.)
        for ct in [b"application/json", b"application/json; charset=utf-8", b"Application/JSON",
                   b" application/json ;x=y", b"application/vnd.api+json", b"application/json\x00x"]:
            self.send("header", post(comp, body, {"Content-Type": ct}), "any", "good Content-Type %r" % ct)
        self.send("header", post(comp, body, {"Content-Type": None}), "any", "no Content-Type")
        for n in [300000, 1 << 20]:
            self.send("header", post(comp, body, {"X-Big": b"a" * n}), "close", "a %d-byte header" % n)
        self.send("header", post(comp, body, extra_head=b"".join(b"X-%d: y\r\n" % i for i in range(30000))), "close",
                  "30000 headers")
        self.send("header", b"GET /" + b"a" * 300000 + b" HTTP/1.1\r\nHost: localhost\r\n\r\n", "close", "300 KB URL")
        self.send("header", post(comp, body, {"Authorization": b"Bearer " + b"z" * 300000}), "close",
                  "300 KB Authorization")
        self.send("header", post(comp, body, {"X-Request-Id": b"\x01\x02\xff" * 100}), "any", "odd X-Request-Id")
        self.send("header", post(comp, body, extra_head=b"BadHeader\r\n"), "close", "header without a colon")
        self.send("header", post(comp, body, {"Transfer-Encoding": "chunked", "Content-Length": None},
                                 extra_head=b"") .replace(body, b"zz\r\n" + body + b"\r\n0\r\n\r\n"), "close",
                  "bad chunk size")
        self.send("header", post(comp, b"ffffffffffffffffffff\r\nab", {"Transfer-Encoding": "chunked",
                                                                      "Content-Length": None}), "close",
                  "huge chunk size")
        self.send("header", post(comp, b"0\r\n\r\n", {"Transfer-Encoding": "chunked"}), "close",
                  "Transfer-Encoding with Content-Length")
        for te in [b"gzip", b"chunked, gzip", b"identity", b"x"]:
            self.send("header", post(comp, body, {"Transfer-Encoding": te, "Content-Length": None}), "4xx",
                      "Transfer-Encoding %r" % te)
        for line in [b"GARBAGE\r\n\r\n", b"POST\r\n\r\n", b"POST /v1/completions\r\n\r\n",
                     b"POST /v1/completions HTTP/1.1 extra\r\nHost: localhost\r\n\r\n", b"GET  /health  HTTP/1.1\r\n\r\n",
                     b"POST http://[::1 HTTP/1.1\r\nHost: localhost\r\n\r\n", b"GET /%zz HTTP/1.1\r\nHost: localhost\r\n\r\n",
                     bytes(r.randrange(256) for _ in range(2000))]:
            self.send("header", line, "close", "request line %r" % line[:60])
        # libmicrohttpd reads a line holding only a NUL as the end of the headers (its choice).
        self.send("header", b"GET /health HTTP/1.1\r\nHost: localhost\r\n\x00\r\n\r\n", "any", "a NUL header line")
        for meth in [b"PUT", b"DELETE", b"PATCH", b"FOO", b"get"]:
            self.send("header", b"%s /v1/completions HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n" % meth, "4xx",
                      "method %r" % meth)
        # libmicrohttpd answers an unknown HTTP version with 505 (RFC 9110), the one 5xx allowed.
        st, raw = exchange(self.srv.port, b"GET /health HTTP/9.9\r\nHost: localhost\r\n\r\n")
        count("header", st)
        check(st in (400, 505, None), "HTTP/9.9 -> 505 Version Not Supported or 400 (got %r)" % st)

    # ---- slow clients ----
    def slow(self, n_stall):
        r = self.rng
        port = self.srv.port
        stalled = []
        body = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 1}).encode()
        for i in range(n_stall):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            kind = i % 4
            if kind == 0:
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
            elif kind == 1:
                s.sendall(r.choice([b"PO", b"\r\n\r\n\r\n"]))  # empty lines before a request are skipped
            elif kind == 2:
                s.sendall(post("/v1/completions", body)[:-len(body) + 5])  # the body stops early
            else:
                s.sendall(post("/v1/completions", body, {"Transfer-Encoding": "chunked", "Content-Length": None})
                          .replace(body, b"a\r\n{\"mod"))  # a chunk that never ends
            stalled.append(s)
            count("slow", -1)
        # The server keeps serving while they hang.
        for _ in range(10):
            self.must_valid()
        g = self.srv.wait_idle(30.0)  # the gauges trail the last answer by a step or so (polled)
        check(g.get("num_requests_running") == 0 and g.get("num_requests_waiting") == 0,
              "stalled uploads are not requests yet: %r" % g)
        # A client that trickles a valid request a few bytes at a time is still answered.
        data = post("/v1/completions", body)
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        for i in range(0, len(data), 7):
            s.sendall(data[i:i + 7])
            time.sleep(0.002)
        got = b""
        while True:
            c = s.recv(65536)
            if not c:
                break
            got += c
        s.close()
        check(got.startswith(b"HTTP/1.1 200"), "a trickled request is answered: %r" % got[:200])
        count("slow", 200 if got.startswith(b"HTTP/1.1 200") else None)
        # Stalled uploads that give up: the server forgets them and goes on.
        for s in stalled:
            s.close()
        for _ in range(3):
            self.must_valid()


REQUEST_TIMEOUT_S = 30  # server/http.c HTTP_DEFAULT_REQUEST_TIMEOUT_S: idle limit before a request is in


def open_stalled(port):
    """Connections that stall before their request is in: silent, inside the headers, inside the
    body, and idle after a kept-alive answer. The server's request timeout must close them."""
    body = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 1}).encode()
    out = []
    for kind in ("silent", "headers", "body", "keepalive"):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        if kind == "headers":
            s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Slow: a")
        elif kind == "body":
            s.sendall(post("/v1/completions", body, {"Connection": None})[:-10])
        elif kind == "keepalive":
            s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
            got = b""
            while not complete(got):
                got += s.recv(4096)
            check(got.startswith(b"HTTP/1.1 200"), "keep-alive /health answered: %r" % got[:80])
        out.append((kind, s, time.time()))
    return out


def check_closed_by_server(stalled):
    for kind, s, t_open in stalled:
        s.settimeout(max(1.0, t_open + REQUEST_TIMEOUT_S + 20 - time.time()))
        try:
            got = s.recv(65536)
            while got and not got.endswith(b"\r\n\r\n"):  # a 408 / 400 answer before the close is fine
                got = s.recv(65536)
            closed = got == b"" or got.startswith(b"HTTP/1.1 4")
        except socket.timeout:
            closed = False
        except ConnectionResetError:
            closed = True
        waited = time.time() - t_open
        check(closed and waited >= REQUEST_TIMEOUT_S - 2,
              "a stalled connection (%s) is closed by the server's request timeout (%.1f s, closed=%s)" %
              (kind, waited, closed))
        s.close()
        count("slow", None)


def main():
    seed = int(os.environ.get("DSV4_TEST_SEED", random.SystemRandom().randrange(1 << 31)))
    print("seed", seed, "(DSV4_TEST_SEED to repeat)", flush=True)
    rng = random.Random(seed)
    srv = Server("--http-threads", "4", name=MODEL)
    f = Fuzzer(srv, rng)
    t0 = time.time()
    stalled = open_stalled(srv.port)
    f.must_valid()
    f.fixed()
    f.headers()
    # The slowloris connections stay open while the random part runs.
    holder = threading.Thread(target=f.slow, args=(48,))
    holder.start()
    holder.join()
    f.retype(300)
    f.run_mutations(max(0, N_TARGET + 20 - REFUSED[0]))
    f.must_valid()
    check_closed_by_server(stalled)
    f.must_valid()
    total = sum(v for k, v in COUNTS.items() if k != "valid")
    print("%d malformed requests, %d of them refused (%s), %d valid; statuses %s; %.1f s" % (
        total, REFUSED[0], ", ".join("%s %d" % kv for kv in sorted(COUNTS.items()) if kv[0] != "valid"), COUNTS.get("valid", 0),
        sorted(STATUSES.items(), key=lambda kv: str(kv[0])), time.time() - t0), flush=True)
    check(REFUSED[0] >= N_TARGET, "at least %d malformed requests refused (%d)" % (N_TARGET, REFUSED[0]))
    check(not any(isinstance(s, int) and s >= 500 and s != 505 for s in STATUSES), "no 5xx: %r" % STATUSES)
    st, body, _ = srv.get("/health")
    check(st == 200, "/health 200 at the end: %r" % body)
    g = srv.wait_idle(30.0)
    check(g.get("num_requests_running") == 0 and g.get("kv_cache_usage_perc") == 0, "idle at the end: %r" % g)
    stop_and_check(srv, check)
    return check.finish()


if __name__ == "__main__":
    sys.exit(main())
