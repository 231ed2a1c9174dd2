"""scripts/bench_serve against `dsv4 serve --executor test` (scripted tokens, so the
server is fast): a tiny sweep gives well-formed per-run JSON with the right counts.

Two workloads (random IN/OUT token-id prompts on /v1/completions with fresh random
lengths, and the chat mix), two concurrencies and one Poisson rate: every run's JSON
exists, every request completed, input and output token totals are exactly what was
asked (ignore_eos + min_tokens), percentiles are ordered, the client's own overhead is
reported, summary.json lists every run and summary.png is a PNG.
"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serverproc  # noqa: E402

SRC = os.environ.get("DSV4_SOURCE_ROOT", os.path.join(os.path.dirname(__file__), "..", ".."))


def main():
    chk = serverproc.Check()
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    n_in, n_out, n_req = rng.randint(8, 96), rng.randint(2, 24), rng.randint(4, 9)
    script = " ".join(str(rng.randrange(1000, 5000)) for _ in range(300))
    srv = serverproc.Server("--shutdown-timeout", "1", env={"DSV4_TEST_EXEC_SCRIPT": script})
    out = tempfile.mkdtemp(prefix="bench_serve_")
    try:
        cmd = [sys.executable, os.path.join(SRC, "scripts", "bench_serve"), "--url", srv.url,
               "--workloads", "%d/%d,chat" % (n_in, n_out), "--concurrency", "1,3", "--request-rates", "50",
               "--num-prompts", str(n_req), "--out", out, "--seed", str(seed), "--label", "e2e"]
        print("seed %d: %d/%d x %d requests" % (seed, n_in, n_out, n_req), flush=True)
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        print(p.stdout[-3000:])
        chk(p.returncode == 0, "bench_serve exit %d: %s" % (p.returncode, p.stderr[-2000:]))
        names = ["%d-%d_c1" % (n_in, n_out), "%d-%d_c3" % (n_in, n_out), "%d-%d_r50" % (n_in, n_out),
                 "chat_c1", "chat_c3", "chat_r50"]
        for name in names:
            path = os.path.join(out, name + ".json")
            if not chk(os.path.exists(path), "missing " + path):
                continue
            r = json.load(open(path))
            chk(r["num_prompts"] == n_req and r["completed"] == n_req and r["failed"] == 0,
                "%s: %d/%d completed, %d failed %r" % (name, r["completed"], r["num_prompts"], r["failed"], r["errors"]))
            chk(r["output_len_mismatches"] == 0 and r["input_len_mismatches"] == 0, name + ": length mismatches")
            if not name.startswith("chat"):
                chk(r["total_input_tokens"] == n_req * n_in, "%s: input tokens %d" % (name, r["total_input_tokens"]))
                chk(r["total_output_tokens"] == n_req * n_out, "%s: output tokens %d" % (name, r["total_output_tokens"]))
                chk(r["output_lens"] == [n_out] * n_req, name + ": output lens")
            else:
                chk(all(16 <= x <= 256 for x in r["output_lens"]), name + ": chat output lens")
                chk(r["total_output_tokens"] == sum(r["output_lens"]), name + ": chat totals")
            for m in ("ttft", "e2el", "itl") + (("tpot",) if n_out > 1 or name.startswith("chat") else ()):
                v = [r["median_%s_ms" % m], r["p90_%s_ms" % m], r["p99_%s_ms" % m]]
                chk(None not in v and 0 <= v[0] <= v[1] <= v[2], "%s: %s percentiles %r" % (name, m, v))
            chk(r["median_ttft_ms"] <= r["median_e2el_ms"], name + ": ttft <= e2e")
            chk(r["duration"] > 0 and abs(r["request_throughput"] - n_req / r["duration"]) < 1e-6 * n_req / r["duration"],
                name + ": request throughput")
            chk(abs(r["output_throughput"] - r["total_output_tokens"] / r["duration"]) < 1e-3, name + ": output throughput")
            c = r["client"]
            chk(c["cpu_s"] >= 0 and c["chunks"] > 0 and c["cpu_us_per_chunk"] is not None, name + ": client overhead %r" % c)
            chk((r["request_rate"] == "inf") == ("_c" in name), name + ": rate field %r" % r["request_rate"])
        s = json.load(open(os.path.join(out, "summary.json")))
        chk(len(s["runs"]) == len(names), "summary runs %d" % len(s["runs"]))
        png = os.path.join(out, "summary.png")
        try:
            import matplotlib  # noqa: F401  (scripts/requirements.txt; the GPU machine's bare Python has none)
            chk(os.path.exists(png) and open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n", "summary.png")
        except ImportError:
            chk(not os.path.exists(png) and "no matplotlib" in p.stderr, "without matplotlib: no plot, said so")
        # a bad workload is a usage error, not a run
        q = subprocess.run([sys.executable, os.path.join(SRC, "scripts", "bench_serve"), "--url", srv.url,
                            "--workloads", "abc", "--out", out], capture_output=True, text=True, timeout=60)
        chk(q.returncode != 0 and "workload" in q.stderr, "bad workload: %d %s" % (q.returncode, q.stderr[-200:]))
    finally:
        serverproc.stop_and_check(srv, chk)
        shutil.rmtree(out, ignore_errors=True)
    return chk.finish()


if __name__ == "__main__":
    sys.exit(main())
