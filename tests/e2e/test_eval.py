"""tests/e2e/test_eval.py: evaluate the served tiny model as users do (docs/eval.md).

`dsv4 serve --model tiny --executor model --precision fp32 --max-logprobs 5`, then:
  1. prompt log-probabilities, three ways, on token-id prompts (the golden prompts of
     tests/model/data/golden plus fresh random ones): /v1/completions echo + logprobs k
     (max_tokens 1), vLLM's prompt_logprobs k with max_tokens 0, and the same in a
     batched request; every position agrees to 1e-5 across them (null first entry,
     same tokens and top ids, rank 1 is the top entry, text_offset are the pieces'
     running byte counts). Against transformers (the goldens, float32): the top-1
     logprob at every position, and the prompt token's where the golden kept its
     logit (top-32 or probe ids), to 3e-4 (the forward tests' logit 1e-4 + lse 1e-4).
  1a. The same prompts through the forward pass run directly (`dsv4 generate --prompt-logprobs`:
      no scheduler, no token_logprobs op): equal to the server's to 1e-5.
  1b. The same prompts on a TP=2 server (ranks as threads): equal to TP=1 to 1e-5 (1 + |lp|/10).
  2. Bad input: logprobs / prompt_logprobs above --max-logprobs are a 400 naming
     the limit; max_tokens 0 without echo or prompt_logprobs is a 400.
  3. GET /tokenizer_info has the special tokens and model_max_length.
  4. lm-evaluation-harness from PyPI (lm-eval[api]), offline, through scripts/eval:
     a log-likelihood task (local-completions, remote tokenizer, batch 2, two
     requests in flight) and a generative one (local-chat-completions) on data this
     test writes as local JSON files. Every per-example log-likelihood the harness
     logged equals the sum over the continuation of the server's prompt_logprobs for
     the same tokens (1e-5), its is_greedy flag agrees, and the generative samples
     equal the server's own greedy answer to the same chat request.
Skips (77) when lm_eval is not installed (part 4 only needs it).
"""
import json
import math
import os
import random
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serverproc  # noqa: E402

ROOT = os.environ.get("DSV4_SOURCE_ROOT") or os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
GOLDEN = os.path.join(ROOT, "tests", "model", "data", "golden", "golden_bf16")
TOL = 1e-5
TOL_REF = 3e-4


def post(srv, path, body):
    st, data, _ = srv.request("POST", path, body, timeout=300)
    try:
        return st, json.loads(data)
    except ValueError:
        return st, {"raw": data.decode(errors="replace")}


def golden_prompts():
    import numpy as np
    h = json.load(open(GOLDEN + ".json"))
    raw = open(GOLDEN + ".bin", "rb").read()
    out = []
    for p in h["prompts"]:
        if not 2 <= p["n_tokens"] <= 200:
            continue
        arr = {}
        for k in ("lse", "top_ids", "top_logits", "probe_logits"):
            a = p["arrays"][k]
            n = int(np.prod(a["shape"]))
            arr[k] = np.frombuffer(raw, dtype=a["dtype"], count=n, offset=a["offset"]).reshape(a["shape"])
        out.append((p["name"], p["ids"], arr, h["probe_ids"]))
    return out


def scored(srv, ids, k, check, what):
    """The three forms for one prompt: lists (token_logprobs, top dicts by id) per position."""
    st, echo = post(srv, "/v1/completions", {"model": "tiny-e2e", "prompt": ids, "echo": True, "logprobs": k,
                                             "max_tokens": 1, "temperature": 0})
    st2, plp = post(srv, "/v1/completions", {"model": "tiny-e2e", "prompt": ids, "prompt_logprobs": k,
                                             "max_tokens": 0})
    if not check(st == 200 and st2 == 200, "%s: echo %d, prompt_logprobs %d: %s %s" % (what, st, st2, echo, plp)):
        return None
    ch = echo["choices"][0]
    lp = ch["logprobs"]
    n = len(ids)
    check(len(lp["token_logprobs"]) == n + 1 and len(lp["tokens"]) == n + 1, "%s: echo has %d entries for %d + 1"
          % (what, len(lp["token_logprobs"]), n))
    check(lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None, "%s: first prompt entry not null" % what)
    check(lp["text_offset"][0] == 0 and all(a <= b for a, b in zip(lp["text_offset"], lp["text_offset"][1:])),
          "%s: text_offset %s" % (what, lp["text_offset"][:8]))
    check(echo["usage"]["completion_tokens"] == 1 and ch["finish_reason"] == "length", "%s: echo usage %s" %
          (what, echo["usage"]))
    pc = plp["choices"][0]
    check(pc["text"] == "" and plp["usage"]["completion_tokens"] == 0 and pc["finish_reason"] == "length",
          "%s: max_tokens 0 generated something: %s" % (what, pc))
    pl = pc["prompt_logprobs"]
    check(len(pl) == n and pl[0] is None, "%s: prompt_logprobs has %d entries" % (what, len(pl)))
    worst = 0.0
    for p in range(1, min(n, len(pl))):
        e = pl[p]
        tok = e.get(str(ids[p]))
        if not check(tok is not None, "%s: position %d lacks the prompt token %d" % (what, p, ids[p])):
            break
        worst = max(worst, abs(tok["logprob"] - lp["token_logprobs"][p]))
        r1 = [v for v in e.values() if v["rank"] == 1]
        echo_top = lp["top_logprobs"][p]
        if not check(r1 and echo_top and len(echo_top) <= k, "%s: position %d: no rank-1 entry or %d top entries"
                     % (what, p, len(echo_top or {}))):
            break
        best = max(echo_top.values())
        worst = max(worst, abs(r1[0]["logprob"] - best))
        check((tok["rank"] == 1) == (tok["logprob"] >= best), "%s: position %d: rank %d, logprob %g, top %g"
              % (what, p, tok["rank"], tok["logprob"], best))
    check(worst <= TOL, "%s: echo and prompt_logprobs differ by %.3g" % (what, worst))
    return lp["token_logprobs"][1:n], pl


def part_logprobs(srv, check, seen):
    rng = random.Random(int(os.environ.get("DSV4_TEST_SEED", "0")) or None)
    gp = golden_prompts()
    for name, ids, arr, probes in gp:
        r = scored(srv, ids, 3, check, "golden " + name)
        if not r:
            continue
        tl, pl = r
        seen.append((ids, tl))
        pos = {int(i): j for j, i in enumerate(probes)}
        worst, n_tok = 0.0, 0
        for p in range(1, len(ids)):
            lse = float(arr["lse"][p - 1])
            ref_top1 = float(arr["top_logits"][p - 1][0]) - lse
            ours_top1 = max(v["logprob"] for v in pl[p].values())
            worst = max(worst, abs(ours_top1 - ref_top1))
            t = ids[p]
            row_ids = [int(x) for x in arr["top_ids"][p - 1]]
            ref = None
            if t in row_ids:
                ref = float(arr["top_logits"][p - 1][row_ids.index(t)]) - lse
            elif t in pos:
                ref = float(arr["probe_logits"][p - 1][pos[t]]) - lse
            if ref is not None:
                n_tok += 1
                worst = max(worst, abs(tl[p - 1] - ref))
        check(worst <= TOL_REF, "golden %s: prompt logprobs differ from transformers by %.3g" % (name, worst))
        print("golden %s: %d positions (%d prompt tokens with a stored logit), largest difference %.3g"
              % (name, len(ids) - 1, n_tok, worst), flush=True)
    # fresh random prompts, one batched request against the single ones
    prompts = [[rng.randrange(100, 100000) for _ in range(rng.randrange(2, 90))] for _ in range(3)]
    single = [scored(srv, ids, 2, check, "random %d" % i) for i, ids in enumerate(prompts)]
    seen.extend((ids, r[0]) for ids, r in zip(prompts, single) if r)
    st, b = post(srv, "/v1/completions", {"model": "tiny-e2e", "prompt": prompts, "echo": True, "logprobs": 2,
                                          "max_tokens": 1, "temperature": 0})
    if check(st == 200 and len(b.get("choices", [])) == 3, "batched echo: %d %s" % (st, str(b)[:300])):
        for ch in b["choices"]:
            i = ch["index"]
            got = ch["logprobs"]["token_logprobs"][1:len(prompts[i])]
            if single[i]:
                d = max([abs(x - y) for x, y in zip(got, single[i][0])] or [0])
                check(d <= TOL, "batched prompt %d differs from alone by %.3g" % (i, d))
    # n = 2 carries prompt_logprobs on both choices
    st, b = post(srv, "/v1/completions", {"model": "tiny-e2e", "prompt": prompts[0], "prompt_logprobs": 1, "n": 2,
                                          "max_tokens": 2, "temperature": 0})
    check(st == 200 and all(c.get("prompt_logprobs") and len(c["prompt_logprobs"]) == len(prompts[0])
                            for c in b.get("choices", [])), "n = 2 prompt_logprobs: %d %s" % (st, str(b)[:300]))
    # streamed: one chunk with prompt_logprobs per choice, before its tokens
    st, data, _ = srv.request("POST", "/v1/completions", {"model": "tiny-e2e", "prompt": prompts[1], "stream": True,
                                                          "prompt_logprobs": 2, "max_tokens": 2, "temperature": 0},
                              timeout=300)
    chunks = [json.loads(l[6:]) for l in data.decode().split("\n") if l.startswith("data: {")]
    firsts = [c["choices"][0] for c in chunks if c.get("choices") and "prompt_logprobs" in c["choices"][0]]
    if check(st == 200 and len(firsts) == 1 and chunks and "prompt_logprobs" in chunks[0]["choices"][0],
             "streamed prompt_logprobs: %d, %d chunks carry them" % (st, len(firsts))) and single[1]:
        got = [e[str(prompts[1][p])]["logprob"] for p, e in enumerate(firsts[0]["prompt_logprobs"]) if p]
        d = max([abs(x - y) for x, y in zip(got, single[1][0])] or [0])
        check(len(got) == len(prompts[1]) - 1 and d <= TOL, "streamed prompt_logprobs differ by %.3g" % d)
    # chat: beside choices
    st, b = post(srv, "/v1/chat/completions", {"model": "tiny-e2e", "messages": [{"role": "user", "content": "hi"}],
                                               "prompt_logprobs": 0, "max_tokens": 2})
    check(st == 200 and isinstance(b.get("prompt_logprobs"), list) and b["prompt_logprobs"][0] is None and
          b["prompt_logprobs"][1], "chat prompt_logprobs: %d %s" % (st, str(b)[:300]))


def part_direct(srv, check, seen):
    """The forward pass run directly: `dsv4 generate --prompt-logprobs` (no scheduler, no token_logprobs op,
    log-softmax in double on the host) on the served checkpoint, the same prompts."""
    m = re.search(r"serving '[^']*' from (\S+) on", srv.logtext())
    if not check(m, "no model directory in the server log"):
        return
    worst = 0.0
    for i, (ids, tl) in enumerate(seen):
        p = subprocess.run([serverproc.BIN, "generate", m.group(1), "--prompt-ids", ",".join(map(str, ids)),
                            "--prompt-logprobs", "--precision", "fp32"], capture_output=True, text=True, timeout=300)
        line = [l for l in p.stdout.splitlines() if l.startswith("prompt_logprobs:")]
        if not check(p.returncode == 0 and line, "dsv4 generate --prompt-logprobs: %d %s" % (p.returncode,
                                                                                          p.stderr[-500:])):
            continue
        vals = line[0].split()[1:]
        check(vals[0] == "null" and len(vals) == len(ids), "generate printed %d values for %d tokens"
              % (len(vals), len(ids)))
        worst = max([worst] + [abs(float(a) - b) for a, b in zip(vals[1:], tl)])
    check(worst <= TOL, "server prompt logprobs differ from the direct forward pass by %.3g" % worst)
    print("direct forward (dsv4 generate): %d prompts, largest difference %.3g" % (len(seen), worst), flush=True)


def part_tp(check, seen):
    """TP=2 (ranks as threads) against TP=1: the same prompt log-probabilities."""
    srv = serverproc.Server("--precision", "fp32", "--max-model-len", "1024", "--tensor-parallel-size", "2",
                            executor="model")
    try:
        worst = 0.0
        for i, (ids, tl) in enumerate(seen):
            r = scored(srv, ids, 2, check, "TP=2 prompt %d" % i)
            if r:
                # the all-reduces sum in another order: 1e-5 plus a few float32 ulps of the value
                worst = max([worst] + [abs(a - b) / (1 + 0.1 * abs(b)) for a, b in zip(r[0], tl)])
        check(worst <= TOL, "TP=2 prompt logprobs differ from TP=1 by %.3g (scaled)" % worst)
        print("TP=2: %d prompts, largest difference from TP=1 %.3g" % (len(seen), worst), flush=True)
    finally:
        serverproc.stop_and_check(srv, check, "TP=2 server")


def part_errors(srv, check):
    for body, param in (({"prompt": [1, 2], "echo": True, "logprobs": 6}, "logprobs"),
                        ({"prompt": [1, 2], "prompt_logprobs": 6, "max_tokens": 0}, "prompt_logprobs"),
                        ({"prompt": [1, 2], "prompt_logprobs": 21}, "prompt_logprobs"),
                        ({"prompt": [1, 2], "max_tokens": 0}, "max_tokens")):
        body["model"] = "tiny-e2e"
        st, b = post(srv, "/v1/completions", body)
        err = b.get("error", {})
        check(st == 400 and err.get("param") == param, "%s: %d %s" % (body, st, b))
        if param != "max_tokens":
            check(("5" in err.get("message", "") or "20" in err.get("message", "")),
                  "%s: message names no limit: %s" % (body, err.get("message")))
    st, data, _ = srv.get("/tokenizer_info")
    info = json.loads(data) if st == 200 else {}
    check(st == 200 and info.get("eos_token") and info.get("bos_token") and info.get("model_max_length") == 1024,
          "/tokenizer_info: %d %s" % (st, info))


def part_harness(srv, check, tmp):
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        print("lm_eval is not installed: harness part skipped", flush=True)
        return False
    ll = [{"question": "The capital of France is", "choices": ["Paris", "Rome", "Berlin"], "answer": 0},
          {"question": "Two plus two equals", "choices": ["four", "five"], "answer": 0},
          {"question": "Water is", "choices": ["wet", "dry", "a kind of bird"], "answer": 0}]
    gen = [{"question": "Say hello.", "answer": "hello"}, {"question": "What is 2+2?", "answer": "4"}]
    for name, rows in (("ll", ll), ("gen", gen)):
        with open(os.path.join(tmp, name + ".jsonl"), "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    with open(os.path.join(tmp, "dsv4_e2e_ll.yaml"), "w") as f:
        f.write("task: dsv4_e2e_ll\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: %s\n"
                "test_split: test\noutput_type: multiple_choice\ndoc_to_text: \"{{question}}\"\n"
                "doc_to_choice: \"{{choices}}\"\ndoc_to_target: \"{{answer}}\"\nmetric_list:\n  - metric: acc\n"
                % os.path.join(tmp, "ll.jsonl"))
    with open(os.path.join(tmp, "dsv4_e2e_gen.yaml"), "w") as f:
        f.write("task: dsv4_e2e_gen\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: %s\n"
                "test_split: test\noutput_type: generate_until\ndoc_to_text: \"{{question}}\"\n"
                "doc_to_target: \"{{answer}}\"\ngeneration_kwargs:\n  until: [\"\\n\\n\"]\n  max_gen_toks: 6\n"
                "  do_sample: false\nmetric_list:\n  - metric: exact_match\n" % os.path.join(tmp, "gen.jsonl"))
    out = os.path.join(tmp, "out")
    env = dict(os.environ, HF_HOME=os.path.join(tmp, "hf"))
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "eval"), "--url", srv.url, "--tasks", "dsv4_e2e_ll",
           "--gen-tasks", "dsv4_e2e_gen", "--include-path", tmp, "--output", out, "--offline",
           "--num-concurrent", "2", "--batch-size", "2", "--max-gen-toks", "6"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if not check(p.returncode == 0, "scripts/eval exit %d:\n%s" % (p.returncode, (p.stdout + p.stderr)[-4000:])):
        return True
    print("\n".join(l for l in p.stdout.splitlines() if l.startswith("|")), flush=True)
    samples = {}
    for dirpath, _, files in os.walk(out):
        for fn in files:
            if fn.startswith("samples_"):
                task = fn[len("samples_"):].rsplit("_", 1)[0]
                samples[task] = [json.loads(l) for l in open(os.path.join(dirpath, fn))]
    check(set(samples) == {"dsv4_e2e_ll", "dsv4_e2e_gen"}, "harness samples: %s" % sorted(samples))
    tokz = lambda text: post(srv, "/tokenize", {"prompt": text, "add_special_tokens": False})[1]["tokens"]
    worst, n = 0.0, 0
    for s in samples.get("dsv4_e2e_ll", []):
        for j, (args, resp) in enumerate(zip(s["arguments"].values(), s["resps"])):
            ctx, cont = args["arg_0"], args["arg_1"]
            ll_h, greedy_h = float(resp[0][0]), resp[0][1] == "True"
            # what the harness sends: context tokens, then the continuation's tokens cut from the whole
            cenc, whole = tokz(ctx), tokz(ctx + cont)
            cont_ids = whole[len(cenc):]
            ids = cenc + cont_ids
            st, b = post(srv, "/v1/completions", {"model": "tiny-e2e", "prompt": ids, "prompt_logprobs": 1,
                                                  "max_tokens": 0})
            if not check(st == 200, "direct scoring: %d %s" % (st, b)):
                continue
            pl = b["choices"][0]["prompt_logprobs"]
            direct = sum(pl[p][str(ids[p])]["logprob"] for p in range(len(cenc), len(ids)))
            greedy = all(pl[p][str(ids[p])]["rank"] == 1 for p in range(len(cenc), len(ids)))
            worst = max(worst, abs(direct - ll_h))
            check(greedy == greedy_h, "doc %d choice %d: is_greedy %s, direct %s" % (s["doc_id"], j, greedy_h, greedy))
            n += 1
    check(n == 8 and worst <= TOL, "harness log-likelihoods (%d) differ from the direct ones by %.3g" % (n, worst))
    print("harness: %d log-likelihoods, largest difference from direct scoring %.3g" % (n, worst), flush=True)
    for s in samples.get("dsv4_e2e_gen", []):
        q = s["doc"]["question"]
        st, b = post(srv, "/v1/chat/completions", {"model": "tiny-e2e", "messages": [{"role": "user", "content": q}],
                                                   "max_tokens": 6, "temperature": 0, "stop": ["\n\n"],
                                                   "seed": 1234})
        want = b["choices"][0]["message"]["content"] if st == 200 else None
        got = s["resps"][0][0]
        check(want is not None and (got == want or got == (want or "").split("\n\n")[0]),
              "generative doc %d: harness %r, server %r" % (s["doc_id"], got, want))
    return True


def main():
    check = serverproc.Check()
    srv = serverproc.Server("--precision", "fp32", "--max-model-len", "1024", "--max-logprobs", "5",
                            executor="model")
    seen = []
    try:
        part_logprobs(srv, check, seen)
        part_direct(srv, check, seen)
        part_errors(srv, check)
        with tempfile.TemporaryDirectory() as tmp:
            ran = part_harness(srv, check, tmp)
    finally:
        serverproc.stop_and_check(srv, check)
    part_tp(check, seen)
    rc = check.finish()
    if rc == 0 and not ran:
        return 77
    return rc


if __name__ == "__main__":
    sys.exit(main())
