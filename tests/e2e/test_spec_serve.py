"""tests/e2e/test_spec_serve.py: `dsv4 serve --speculative-config` end to end
on the tiny June checkpoint, CPU (docs/speculation.md).

The same completions (greedy and seeded-sampled, streamed and not, one with
a stop string taken from the plain answer) from a plain server and from one
speculating with MTP, K = 2: identical text and finish reasons. /metrics,
read by prometheus-client's parser, has the spec-decode counters (drafts
and draft tokens moved, accepted <= draft tokens, one per-position series
per draft), and the periodic stats line shows the acceptance rate.
A speculating server with --tensor-parallel-size 2 (fp32) gives the answers
of a plain one-rank fp32 server and counts its drafts. `"method": "dspark"`
on the June checkpoint and an unknown key are refused at start with the
reason.
"""
import json
import os
import subprocess
import sys
import time

from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serverproc import BIN, Check, Server, stop_and_check  # noqa: E402

check = Check()
K = 2
PROMPTS = ["The quick brown fox", "Speculative decoding verifies", "1, 2, 3, 4,", "Once upon a time"]


def complete(srv, prompt, temperature, seed, stream, stop=None):
    body = {"model": "tiny-e2e", "prompt": prompt, "max_tokens": 12, "temperature": temperature, "seed": seed,
            "stream": stream}
    if stop:
        body["stop"] = [stop]
    st, raw, _ = srv.request("POST", "/v1/completions", body, timeout=300)
    check(st == 200, "completion %r: status %d %r" % (prompt, st, raw[:200]))
    if st != 200:
        return None
    if not stream:
        d = json.loads(raw)
        return d["choices"][0]["text"], d["choices"][0]["finish_reason"]
    text, reason = "", None
    for line in raw.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            c = json.loads(line[6:])["choices"]
            if c:
                text += c[0].get("text") or ""
                reason = c[0].get("finish_reason") or reason
    return text, reason


def answers(srv, stops=None):
    out = []
    for i, p in enumerate(PROMPTS):
        out.append(complete(srv, p, 0.0 if i % 2 == 0 else 0.9, 100 + i, i >= 2, stops[i] if stops else None))
    return out


def metrics(srv):
    fams = {}
    for f in text_string_to_metric_families(srv.metrics_text()):
        for s in f.samples:
            fams.setdefault(s.name, []).append(s)
    return fams


common = ["--executor", "model", "--device", "cpu", "--max-num-seqs", "4"]
# the build's tiny checkpoint when the unit tests made it (tests/tiny_dir.h), else --model tiny's own
tm = os.path.join(os.environ.get("DSV4_BUILD_ROOT", ""), "tiny-models", "tiny-bf16")
ENV = {"DSV4_TINY_MODEL": tm} if os.path.isfile(os.path.join(tm, "config.json")) else {}
plain = Server(*common, model="tiny", env=ENV)
ref = answers(plain)
# a stop string from the middle of each plain answer: the cut must land on the same token
stops = [a[0][len(a[0]) // 2:len(a[0]) // 2 + 2] if a and len(a[0]) >= 4 else None for a in ref]
ref_stop = answers(plain, stops)
check("spec_decode" not in plain.metrics_text(), "no spec-decode metrics without speculation")
stop_and_check(plain, check, "plain server")
plain.cleanup()

spec = Server(*common, "--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": K}),
              model="tiny", env=dict(ENV, DSV4_LOG_STATS_INTERVAL="0.5"))
got = answers(spec)
got_stop = answers(spec, stops)
for i in range(len(PROMPTS)):
    check(got[i] == ref[i], "prompt %d: speculative %r, plain %r" % (i, got[i], ref[i]))
    check(got_stop[i] == ref_stop[i], "prompt %d with stop %r: speculative %r, plain %r" %
          (i, stops[i], got_stop[i], ref_stop[i]))
m = metrics(spec)
drafts = sum(s.value for s in m.get("dsv4:spec_decode_num_drafts_total", []))
draft_toks = sum(s.value for s in m.get("dsv4:spec_decode_num_draft_tokens_total", []))
acc = sum(s.value for s in m.get("dsv4:spec_decode_num_accepted_tokens_total", []))
per_pos = m.get("dsv4:spec_decode_num_accepted_tokens_per_pos_total", [])
check(drafts > 0 and draft_toks >= drafts, "drafts %s, draft tokens %s" % (drafts, draft_toks))
check(0 <= acc <= draft_toks, "accepted %s of %s" % (acc, draft_toks))
check(sorted(s.labels.get("position") for s in per_pos) == [str(i) for i in range(K)],
      "per-position series: %r" % [s.labels for s in per_pos])
check(sum(s.value for s in per_pos) == acc, "per position sums to accepted")
# the periodic stats line (every 0.5 s here) carries the acceptance: polled, up to 30 s (a fixed 1.5 s
# sleep raced a loaded ASan machine)
t0 = time.time()
while "Draft acceptance rate:" not in spec.logtext() and time.time() - t0 < 30:
    time.sleep(0.1)
check("Draft acceptance rate:" in spec.logtext(), "the stats line shows the draft acceptance rate")
stop_and_check(spec, check, "speculating server")
spec.cleanup()

# tensor parallelism: two ranks (threads), fp32 (where world size 2 gives world size 1's numbers), MTP K = 2;
# the answers of a plain one-rank fp32 server
fp32 = ["--precision", "fp32"]
plain32 = Server(*common, *fp32, model="tiny", env=ENV)
ref32 = answers(plain32)
stops32 = [a[0][len(a[0]) // 2:len(a[0]) // 2 + 2] if a and len(a[0]) >= 4 else None for a in ref32]
ref32_stop = answers(plain32, stops32)
stop_and_check(plain32, check, "plain fp32 server")
plain32.cleanup()
tp = Server(*common, *fp32, "--tensor-parallel-size", "2", "--speculative-config",
            json.dumps({"method": "mtp", "num_speculative_tokens": K}), model="tiny", env=ENV)
got = answers(tp)
got_stop = answers(tp, stops32)
for i in range(len(PROMPTS)):
    check(got[i] == ref32[i], "TP=2 prompt %d: speculative %r, plain TP=1 %r" % (i, got[i], ref32[i]))
    check(got_stop[i] == ref32_stop[i], "TP=2 prompt %d with stop %r: speculative %r, plain TP=1 %r" %
          (i, stops32[i], got_stop[i], ref32_stop[i]))
m = metrics(tp)
drafts = sum(s.value for s in m.get("dsv4:spec_decode_num_drafts_total", []))
acc = sum(s.value for s in m.get("dsv4:spec_decode_num_accepted_tokens_total", []))
draft_toks = sum(s.value for s in m.get("dsv4:spec_decode_num_draft_tokens_total", []))
check(drafts > 0 and 0 <= acc <= draft_toks, "TP=2: drafts %s, accepted %s of %s" % (drafts, acc, draft_toks))
stop_and_check(tp, check, "speculating TP=2 server")
tp.cleanup()

# refusals at start
for cfg, want in ((json.dumps({"method": "dspark"}), "dspark"), ('{"method": "mtp", "k": 1}', '"k"')):
    r = subprocess.run([BIN, "serve", "--model", "tiny", "--port", "0", "--device", "cpu", "--speculative-config",
                        cfg], capture_output=True, text=True, timeout=300, env=dict(os.environ, **ENV))
    check(r.returncode != 0 and want in r.stderr, "--speculative-config %s: rc %d, %s" %
          (cfg, r.returncode, r.stderr[-500:]))
sys.exit(check.finish())
