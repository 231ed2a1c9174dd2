"""tests/e2e/test_vllm_cli.py: a vLLM command line starts dsv4 unchanged (issue 18).

1. A busy port: `dsv4 serve` on a port another socket holds exits 1 naming the address before it
   loads anything (the time it took is printed, not asserted).
2. `dsv4 serve MODEL_DIR` (positional, the tiny checkpoint, the model executor) with vLLM's common
   flags for DeepSeek-V4 (--host localhost, --trust-remote-code, --dtype auto,
   --enable-auto-tool-choice, --tool-call-parser deepseek_v4, --reasoning-parser deepseek_v4,
   --tokenizer-mode deepseek_v4, --kv-cache-dtype fp8_ds_mla, --enable-prefix-caching,
   --disable-log-requests, --uvicorn-log-level, --enforce-eager, -tp 1, ...): it starts, says in one
   log line per flag why a flag has no effect, and answers the OpenAI SDK (models, chat, streamed
   chat, tools with tool_choice auto, completions); SIGTERM ends it with exit 0.
3. The same with --host ::1 (IPv6), --no-enable-prefix-caching (which reaches the scheduler) and the
   key from vLLM's $VLLM_API_KEY.
4. Values dsv4 cannot honour are usage errors (exit 2) naming the flag.
"""
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serverproc import Check  # noqa: E402

import openai  # noqa: E402

BIN = os.environ.get("DSV4_BIN", "build/server/dsv4")
SRC = os.environ.get("DSV4_SOURCE_ROOT", ".")
check = Check()


def tiny_model():
    """The tiny bf16 checkpoint of the build (tests/tiny_dir.h builds it), else serve's own."""
    d = os.environ.get("DSV4_TINY_DIR") or os.path.join(os.environ.get("DSV4_BUILD_ROOT", "/tmp"), "tiny-models")
    p = os.path.join(d, "tiny-bf16")
    if os.path.exists(os.path.join(p, ".make_tiny_model.stamp")):
        return p
    out = tempfile.mkdtemp(prefix="dsv4-vllm-cli-tiny-")
    subprocess.run([sys.executable, os.path.join(SRC, "scripts", "make_tiny_model"), "--variant", "bf16",
                    "--out", out], check=True, stdout=subprocess.DEVNULL)
    return out


class Serve:
    def __init__(self, *args, env=None):
        fd, self.log_path = tempfile.mkstemp(prefix="dsv4-vllm-cli-", suffix=".log")
        os.close(fd)
        self.log = open(self.log_path, "w+")
        self.cmd = [BIN, "serve", *args]
        self.p = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  env=dict(os.environ, **(env or {})))
        self.port = None
        t0 = time.time()
        while time.time() - t0 < 120 and self.p.poll() is None:
            m = re.search(r"serving '.*' from .* on http://(.+):(\d+) ", self.text())
            if m:
                self.port = int(m.group(2))
                break
            time.sleep(0.05)
        if not self.port:
            self.stop()
            sys.exit("server did not start: %s\n%s" % (" ".join(self.cmd), self.text()[-4000:]))

    def text(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        return self.p.returncode


def busy_port(model):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    t0 = time.time()
    p = subprocess.run([BIN, "serve", model, "--port", str(port)], capture_output=True, text=True, timeout=120)
    dt = time.time() - t0
    print("busy port %d: exit %d after %.3f s: %s" % (port, p.returncode, dt, p.stderr.strip()[-200:]), flush=True)
    check(p.returncode == 1 and ("127.0.0.1:%d" % port) in p.stderr and "in use" in p.stderr,
          "a busy port fails naming the address (exit %d: %r)" % (p.returncode, p.stderr[-300:]))
    check("executor on" not in p.stderr and "kernels:" not in p.stderr,
          "a busy port fails before the model loads: %r" % p.stderr[-300:])
    s.close()


VLLM_FLAGS = ["--trust-remote-code", "--dtype", "auto", "--enable-auto-tool-choice", "--tool-call-parser",
              "deepseek_v4", "--reasoning-parser", "deepseek_v4", "--tokenizer-mode", "deepseek_v4",
              "--kv-cache-dtype", "fp8_ds_mla", "--enable-prefix-caching", "--disable-log-requests",
              "--uvicorn-log-level", "warning", "--enforce-eager", "-tp", "1", "--enable-expert-parallel",
              "--gpu-memory-utilization", "0.9", "--max-model-len", "2048", "--max-num-seqs", "8",
              "--swap-space", "4", "--seed", "1234"]
NO_EFFECT = ["--trust-remote-code", "--dtype", "--enable-auto-tool-choice", "--tool-call-parser",
             "--reasoning-parser", "--tokenizer-mode", "--kv-cache-dtype", "--uvicorn-log-level",
             "--enable-expert-parallel", "--swap-space", "--seed"]

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather in a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]


def vllm_command_line(model):
    name = "deepseek-ai/DeepSeek-V4-Flash"
    s = Serve(model, "--host", "localhost", "--port", "0", "--served-model-name", name, *VLLM_FLAGS)
    log = s.text()
    for f in NO_EFFECT:
        n = len(re.findall(r"serve: %s: no effect: \S" % re.escape(f), log))
        check(n == 1, "%s: one log line saying why it has no effect (%d)" % (f, n))
    check("device: the CPU" in log or "device: GPU" in log, "the log says where the model runs")
    if "device: the CPU" in log:
        check("--gpu-memory-utilization: no effect on the CPU" in log, "--gpu-memory-utilization on the CPU: said")
    client = openai.OpenAI(base_url="http://localhost:%d/v1" % s.port, api_key="EMPTY", timeout=120, max_retries=0)
    models = [m.id for m in client.models.list().data]
    check(models == [name], "models.list: %r" % models)
    r = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "What is 17*19?"}],
                                       max_tokens=8, temperature=0)
    check(r.choices[0].finish_reason in ("length", "stop") and r.usage.completion_tokens >= 1,
          "chat: %s, %d tokens" % (r.choices[0].finish_reason, r.usage.completion_tokens))
    n_chunks, text = 0, ""
    for ch in client.chat.completions.create(model=name, messages=[{"role": "user", "content": "Hi"}],
                                             max_tokens=6, stream=True, temperature=0):
        n_chunks += 1
        if ch.choices and ch.choices[0].delta.content:
            text += ch.choices[0].delta.content
    check(n_chunks >= 2, "streamed chat: %d chunks" % n_chunks)
    r = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "Weather in Paris?"}],
                                       tools=TOOLS, tool_choice="auto", max_tokens=8)
    check(r.choices[0].finish_reason in ("length", "stop", "tool_calls"), "tools, tool_choice auto: answered (%s)"
          % r.choices[0].finish_reason)
    r = client.completions.create(model=name, prompt="Once upon a time", max_tokens=5, temperature=0)
    check(len(r.choices) == 1 and r.usage.completion_tokens >= 1, "completions: %r" % r.choices[0].text)
    try:
        client.chat.completions.create(model="not-" + name, messages=[{"role": "user", "content": "x"}], max_tokens=2)
        check(False, "a wrong model name is refused")
    except openai.NotFoundError:
        pass
    rc = s.stop()
    check(rc == 0, "SIGTERM: exit 0 (got %s)" % rc)


def ipv6_no_prefix_cache(model):
    s = Serve("--model", model, "--host", "::1", "--port", "0", "--no-enable-prefix-caching", "--executor", "test",
              env={"DSV4_API_KEY": "", "VLLM_API_KEY": "sk-vllm-env"})
    log = s.text()
    check("prefix caching off" in log, "--no-enable-prefix-caching reaches the scheduler")
    check("on http://::1:" in log, "bound on ::1")
    client = openai.OpenAI(base_url="http://[::1]:%d/v1" % s.port, api_key="sk-vllm-env", timeout=60, max_retries=0)
    check(len(client.models.list().data) == 1, "IPv6: models.list answers")
    try:
        openai.OpenAI(base_url="http://[::1]:%d/v1" % s.port, api_key="wrong", max_retries=0).models.list()
        check(False, "$VLLM_API_KEY is the server's key: a wrong key is refused")
    except openai.AuthenticationError:
        pass
    check(s.stop() == 0, "IPv6 server: SIGTERM exits 0")


def refused_values(model):
    for args, flag in ((["--dtype", "float16"], "--dtype"), (["--kv-cache-dtype", "fp4_e2m1"], "--kv-cache-dtype"),
                       (["--tool-call-parser", "hermes"], "--tool-call-parser"),
                       (["--reasoning-parser", "qwen3"], "--reasoning-parser"),
                       (["--pipeline-parallel-size", "2"], "--pipeline-parallel-size"),
                       (["-pp", "2"], "--pipeline-parallel-size"),
                       (["--tensor-parallel-size", "3"], "--tensor-parallel-size"),
                       (["--uvicorn-log-level", "loud"], "--uvicorn-log-level"),
                       (["--host", "no-such-host.invalid", "--allow-unauthenticated"], "--host")):
        p = subprocess.run([BIN, "serve", model, "--port", "0", *args], capture_output=True, text=True, timeout=60)
        want = 1 if flag == "--host" else 2
        check(p.returncode == want and flag in p.stderr, "serve %s: exit %d naming %s (got %d: %r)" % (
            " ".join(args), want, flag, p.returncode, p.stderr.strip()[-200:]))
    p = subprocess.run([BIN, "serve", model, "--model", model + "-other"], capture_output=True, text=True, timeout=60)
    check(p.returncode == 2 and "two models" in p.stderr, "positional and --model disagree: exit 2")
    p = subprocess.run([BIN, "serve", "--help"], capture_output=True, text=True, timeout=60)
    check(p.returncode == 0 and "MODEL_DIR" in p.stdout and "(default 64)" in p.stdout and "(default 512)" in p.stdout
          and "--tensor-parallel-size" in p.stdout and "CPU: no effect" in p.stdout,
          "serve --help: positional model, the defaults really used, CPU/GPU meaning of the memory flag")


model = tiny_model()
busy_port(model)
refused_values(model)
vllm_command_line(model)
ipv6_no_prefix_cache(model)
sys.exit(check.finish())
