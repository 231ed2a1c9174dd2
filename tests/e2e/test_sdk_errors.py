#!/usr/bin/env python3
"""tests/e2e/test_sdk_errors.py: every error the server sends reaches the
official OpenAI Python SDK as its typed exception, with the server's message:
401 AuthenticationError, 404 NotFoundError (unknown model, unknown route),
400 BadRequestError (bad value, unknown field, context too long), 429
RateLimitError (queue full), 503 InternalServerError (draining), and
APIConnectionError once the server is gone."""
import os
import signal
import sys
import threading
import time

import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serverproc import Check, Server  # noqa: E402

check = Check()
KEY = "sk-sdk-errors"
msgs = [{"role": "user", "content": "hello"}]

# The test executor, slowed down so that one long request fills the only running slot
# and a queue of one, to provoke 429 and to have something in flight while draining.
srv = Server("--api-key", KEY, "--max-model-len", "4096", "--max-num-seqs", "1", "--max-num-queued-reqs", "1", "--shutdown-timeout", "20",
             env={"DSV4_TEST_EXEC_STEP_MS": "20"})
client = openai.OpenAI(base_url=srv.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def expect(exc_type, what, fn, needle=None):
    try:
        fn()
        check(False, f"{what}: no exception")
    except exc_type as ex:
        check(needle is None or needle in str(ex), f"{what}: message names '{needle}' ({ex})")
        code = getattr(ex, "code", None)
        check(code is None or isinstance(code, str), f"{what}: error.code is a string or null ({code!r})")
        return ex
    except Exception as ex:  # the wrong type
        check(False, f"{what}: {type(ex).__name__} instead of {exc_type.__name__}: {ex}")


def chat(**kw):
    args = dict(model="tiny-e2e", messages=msgs, max_tokens=2)
    args.update(kw)
    return client.chat.completions.create(**args)


bad_key = openai.OpenAI(base_url=srv.url + "/v1", api_key="wrong", max_retries=0)
ex = expect(openai.AuthenticationError, "wrong key", lambda: bad_key.chat.completions.create(
    model="tiny-e2e", messages=msgs, max_tokens=2))
check(ex is not None and ex.status_code == 401, "401 status on the exception")
expect(openai.NotFoundError, "unknown model", lambda: chat(model="gpt-4"), "gpt-4")
expect(openai.NotFoundError, "unknown model in /v1/models/ID", lambda: client.models.retrieve("nope"), "nope")
expect(openai.BadRequestError, "temperature out of range", lambda: chat(temperature=-1), "temperature")
expect(openai.BadRequestError, "unknown field", lambda: chat(extra_body={"no_such_field": 1}), "no_such_field")
expect(openai.BadRequestError, "n out of range", lambda: chat(n=0), "n")
ex = expect(openai.BadRequestError, "prompt over max_model_len",
            lambda: chat(messages=[{"role": "user", "content": "word " * 6000}], max_tokens=1))
check(ex is not None and getattr(ex, "code", None) == "context_length_exceeded", "context_length_exceeded code")
ok = chat()
check(ok.choices and ok.choices[0].finish_reason in ("length", "stop"), "a valid request still answers")

# 429: one request running, one waiting, a third refused.
hold = []


def long_request():
    try:
        hold.append(chat(max_tokens=200, extra_body={"ignore_eos": True}))
    except Exception as e:  # noqa: BLE001 - recorded for the check below
        hold.append(e)


def wait_gauge(name, want, timeout_s=60):
    """Poll /metrics until the gauge reads want (a fixed sleep raced a slow start under ASan)."""
    t0 = time.time()
    while time.time() - t0 < timeout_s:
        if srv.gauges().get(name) == want:
            return True
        time.sleep(0.02)
    return False


# each long request runs >= 4 s (200 steps of >= 20 ms): the 429 below is sent while the first runs
threads = [threading.Thread(target=long_request) for _ in range(2)]
threads[0].start()
check(wait_gauge("num_requests_running", 1), "the first long request runs")
threads[1].start()
check(wait_gauge("num_requests_waiting", 1), "the second long request waits")
ex = expect(openai.RateLimitError, "queue full", lambda: chat())
check(ex is not None and ex.status_code == 429, "429 status")

# 503 while draining: SIGTERM with requests in flight; new requests are refused.
srv.p.send_signal(signal.SIGTERM)
t0 = time.time()
seen_503 = False
while time.time() - t0 < 15 and not seen_503:
    try:
        chat()
    except openai.InternalServerError as e:
        seen_503 = e.status_code == 503
    except openai.RateLimitError:
        pass  # the queue may still be full for a moment
    except openai.APIConnectionError:
        break
    time.sleep(0.1)
check(seen_503, "503 InternalServerError while draining")
for t in threads:
    t.join(60)
check(len(hold) == 2 and all(not isinstance(h, Exception) for h in hold),
      f"requests in flight at SIGTERM complete ({[type(h).__name__ for h in hold]})")
rc = srv.stop()
check(rc == 0, f"drained and exited 0 (rc {rc})")
check(not srv.sanitizer_report(), "no sanitizer report: " + srv.sanitizer_report())
expect(openai.APIConnectionError, "server gone", lambda: chat())
sys.exit(check.finish())
