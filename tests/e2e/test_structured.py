"""tests/e2e/test_structured.py: structured outputs and forced tool calls end to end (docs/api.md).

Random logits make unconstrained output gibberish, so every valid answer here comes from the
grammar alone (model/gram.h). Against `dsv4 serve --executor test` (random sparse logits, fast):
  1. >= 200 generated JSON Schemas (objects with required / optional properties and
     additionalProperties false, arrays with items / minItems / maxItems, string enums, const,
     integer / number / boolean / null, anyOf, $ref to $defs incl. recursion, nesting) at
     temperature 1, chat and completions, streamed and not: finish_reason "stop" -> the text
     parses and validates (jsonschema); "length" -> the text is a prefix of valid JSON.
  2. json_object (parses to an object), guided_choice, structured_outputs.
  3. 50 generated tool sets: tool_choice "required" and a named function, streamed and not:
     finish_reason "tool_calls" with >= 1 call (exactly one, of the named function, when named)
     whose arguments validate against the tool's parameters; nothing in content.
  4. Refusals: unsupported keywords are a 400 naming them; a schema nested 1000 deep is a 400;
     a named function missing from tools is a 400.
  5. The OpenAI SDK: client.beta.chat.completions.parse with a Pydantic model.
Then the same checks on a smaller sample against the CPU executor on the tiny checkpoint.
DSV4_TEST_SEED repeats a run.
"""
import concurrent.futures as cf
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serverproc  # noqa: E402

try:
    import jsonschema
except ImportError:
    print("jsonschema not installed (scripts/requirements.txt)")
    sys.exit(77)

SEED = int(os.environ.get("DSV4_TEST_SEED", random.randrange(1 << 30)))
print("seed", SEED, flush=True)
rng = random.Random(SEED)
check = serverproc.Check()


# ---- a JSON prefix checker (for answers cut by max_tokens) ----

class _End(Exception):
    pass


def json_prefix_ok(s):
    """True when s is a prefix of some valid JSON text (or valid JSON itself)."""
    i = 0

    def ws():
        nonlocal i
        while i < len(s) and s[i] in " \t\n\r":
            i += 1

    def need():
        if i >= len(s):
            raise _End

    def lit(word):
        nonlocal i
        for ch in word:
            need()
            if s[i] != ch:
                raise ValueError
            i += 1

    def string():
        nonlocal i
        lit('"')
        while True:
            need()
            c = s[i]
            i += 1
            if c == '"':
                return
            if c == "\\":
                need()
                e = s[i]
                i += 1
                if e == "u":
                    for _ in range(4):
                        need()
                        if s[i] not in "0123456789abcdefABCDEF":
                            raise ValueError
                        i += 1
                elif e not in '"\\/bfnrt':
                    raise ValueError
            elif ord(c) < 0x20:
                raise ValueError

    def number():
        nonlocal i
        j = i
        while i < len(s) and s[i] in "+-0123456789.eE":
            i += 1
        t = s[j:i]
        if i >= len(s):
            return  # may go on
        try:
            json.loads(t)
        except ValueError:
            raise ValueError

    def value():
        nonlocal i
        ws()
        need()
        c = s[i]
        if c == "{":
            i += 1
            ws()
            need()
            if s[i] == "}":
                i += 1
                return
            while True:
                ws()
                string()
                ws()
                lit(":")
                value()
                ws()
                need()
                if s[i] == ",":
                    i += 1
                    continue
                lit("}")
                return
        if c == "[":
            i += 1
            ws()
            need()
            if s[i] == "]":
                i += 1
                return
            while True:
                value()
                ws()
                need()
                if s[i] == ",":
                    i += 1
                    continue
                lit("]")
                return
        if c == '"':
            return string()
        if c in "-0123456789":
            return number()
        for w in ("true", "false", "null"):
            if s[i] == w[0]:
                return lit(w)
        raise ValueError

    try:
        value()
        ws()
        return i == len(s)
    except _End:
        return True
    except ValueError:
        return False


# ---- schema generator ----

def gen_schema(depth, defs):
    kinds = ["string", "integer", "number", "boolean", "null", "enum", "const", "anyOf"]
    if depth < 3:
        kinds += ["object", "object", "array", "array"]
    if defs and depth < 4:
        kinds.append("ref")
    k = rng.choice(kinds)
    if k in ("integer", "number", "boolean", "null"):
        return {"type": k}
    if k == "string":
        return {"type": "string", "description": "free text"}
    if k == "enum":
        vals = rng.sample(["red", "green", "blue", "a\"b", "x y", "é", 1, 2.5, None, True], rng.randint(1, 5))
        return {"enum": vals}
    if k == "const":
        return {"const": rng.choice(["fixed", 7, False, None])}
    if k == "anyOf":
        return {"anyOf": [gen_schema(depth + 1, defs), {"type": "null"}]}
    if k == "ref":
        return {"$ref": "#/$defs/" + rng.choice(sorted(defs))}
    if k == "array":
        a = {"type": "array", "items": gen_schema(depth + 1, defs)}
        if rng.random() < 0.6:
            a["maxItems"] = rng.randint(0, 3)
        if rng.random() < 0.3:
            a["minItems"] = min(1, a.get("maxItems", 1))
        return a
    props = {}
    for j in range(rng.randint(0, 4)):
        props["k%d_%s" % (j, rng.choice(["id", "name", "v", "é"]))] = gen_schema(depth + 1, defs)
    req = [p for p in props if rng.random() < 0.7]
    return {"type": "object", "properties": props, "required": req, "additionalProperties": False}


def gen_root():
    defs = {}
    if rng.random() < 0.3:
        defs["node"] = {"type": "object", "properties": {"v": {"type": "integer"},
                                                         "next": {"anyOf": [{"$ref": "#/$defs/node"},
                                                                            {"type": "null"}]}},
                        "required": ["v", "next"], "additionalProperties": False}
        defs["leaf"] = {"enum": ["a", "b"]}
    s = gen_schema(0, defs)
    if defs:
        s = dict(s)
        s["$defs"] = defs
    return s


# ---- requests ----

def post(srv, path, body):
    st, data, _ = srv.request("POST", path, body, timeout=600)
    try:
        return st, json.loads(data)
    except ValueError:
        return st, {"raw": data.decode(errors="replace")}


def stream_post(srv, path, body):
    """SSE: (status, list of chunk objects)."""
    st, data, _ = srv.request("POST", path, dict(body, stream=True), timeout=600)
    chunks = []
    for line in data.decode(errors="replace").split("\n"):
        if line.startswith("data: ") and line[6:].strip() != "[DONE]":
            chunks.append(json.loads(line[6:]))
    return st, chunks


def generate(srv, kind, body, stream):
    """(text, finish_reason, tool_calls) of choice 0, streamed or not."""
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    if kind == "chat":
        body = dict(body, messages=[{"role": "user", "content": "answer in JSON"}])
    else:
        body = dict(body, prompt="JSON:")
    if not stream:
        st, d = post(srv, path, body)
        if st != 200 or "choices" not in d:
            return None, "http %d %s" % (st, str(d)[:300]), None
        c = d["choices"][0]
        if kind == "chat":
            return c["message"]["content"] or "", c["finish_reason"], c["message"].get("tool_calls") or []
        return c["text"], c["finish_reason"], []
    st, chunks = stream_post(srv, path, body)
    if st != 200:
        return None, "http %d" % st, None
    text, finish, calls = "", None, {}
    for ch in chunks:
        if "error" in ch:
            return None, "stream error %r" % ch["error"], None
        for c in ch.get("choices", []):
            if kind == "chat":
                delta = c.get("delta", {})
                text += delta.get("content") or ""
                for tc in delta.get("tool_calls") or []:
                    t = calls.setdefault(tc["index"], {"function": {"name": "", "arguments": ""}})
                    f = tc.get("function", {})
                    t["function"]["name"] += f.get("name") or ""
                    t["function"]["arguments"] += f.get("arguments") or ""
            else:
                text += c.get("text") or ""
            finish = c.get("finish_reason") or finish
    return text, finish, [calls[k] for k in sorted(calls)]


def check_json_answer(schema, text, finish, what):
    if text is None:
        check(False, "%s: request failed: %s" % (what, finish))
        return None
    if finish == "stop":
        try:
            v = json.loads(text)
        except ValueError:
            check(False, "%s: stop but not JSON: %r" % (what, text[:400]))
            return None
        try:
            if schema is not None:
                jsonschema.validate(v, schema)
            check(True, what)
        except jsonschema.ValidationError as e:
            check(False, "%s: invalid: %s\nschema %s\noutput %r" % (what, e.message, json.dumps(schema), text[:400]))
        return "stop"
    check(finish == "length", "%s: finish_reason %r" % (what, finish))
    check(json_prefix_ok(text), "%s: cut answer is not a JSON prefix: %r" % (what, text[:400]))
    return "length"


def schema_job(i, max_tokens):
    s = gen_root()
    kind = "chat" if i % 2 == 0 else "completions"
    stream = i % 4 >= 2
    if kind == "chat" and i % 3 == 0:
        body = {"response_format": {"type": "json_schema", "json_schema": {"name": "s%d" % i, "schema": s,
                                                                          "strict": True}}}
    elif i % 3 == 1:
        body = {"guided_json": s}
    else:
        body = {"structured_outputs": {"json": s}} if kind == "completions" else \
            {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": s}}}
    body.update(max_tokens=max_tokens, temperature=1.0, seed=rng.randrange(1 << 30))
    return (s, kind, body, stream, "schema %d (%s%s)" % (i, kind, ", stream" if stream else ""))


def batches(ex, n_min, n_max, workers, enough, make_job, run_job):
    """Sequential sampling: n_min jobs, then batches of `workers` more while enough() is false, n_max at
    most. A threshold on what random logits produce (complete answers, closed calls) then fails only when
    the code is wrong: a correct grammar reaches it long before n_max (the binomial bounds at the calls),
    a grammar that never completes fails after n_max. Jobs are made in order in this thread (a seed
    repeats a run)."""
    i = 0
    while i < n_max and (i < n_min or not enough()):
        n = min(n_max, max(n_min, i + workers)) - i
        jobs = [make_job(i + k) for k in range(n)]
        futs = [(j, ex.submit(generate, *j[0])) for j in jobs]
        for j, f in futs:
            run_job(j[1], f.result())
        i += n
    return i


def schema_round(srv, n_min, n_max, need, max_tokens, workers):
    """Schemas until need answers finished with "stop" (n_min at least, n_max at most)."""
    counts = {"stop": 0, "length": 0, None: 0}

    def make(i):
        s, kind, body, stream, what = schema_job(i, max_tokens)
        return (srv, kind, body, stream), (s, what)

    def run(meta, res):
        text, finish, _ = res
        counts[check_json_answer(meta[0], text, finish, meta[1])] += 1

    with cf.ThreadPoolExecutor(workers) as ex:
        n = batches(ex, n_min, n_max, workers, lambda: counts["stop"] >= need, make, run)
    return n, counts


def gen_tools():
    tools = []
    for t in range(rng.randint(1, 3)):
        props = {}
        for j in range(rng.randint(0, 3)):
            props["p%d" % j] = gen_schema(1, {})
        req = [p for p in props if rng.random() < 0.7]
        params = {"type": "object", "properties": props, "required": req, "additionalProperties": False}
        tools.append({"type": "function", "function": {"name": "fn_%d_%d" % (t, rng.randrange(1000)),
                                                       "description": "tool", "parameters": params}})
    return tools


def tool_round(srv, n_min, n_max, need, max_tokens, workers):
    """Tool sets until need calls closed and validated (n_min sets at least, n_max at most); returns the
    number of sets and the valid calls of each."""
    per_set = []

    def make(i):
        tools = gen_tools()
        named = i % 2 == 1
        choice = {"type": "function", "function": {"name": rng.choice(tools)["function"]["name"]}} if named \
            else "required"
        body = {"tools": tools, "tool_choice": choice, "max_tokens": max_tokens, "temperature": 1.0,
                "seed": rng.randrange(1 << 30)}
        stream = i % 4 >= 2
        return (srv, "chat", body, stream), (tools, choice, "tool set %d (%s%s)" % (
            i, "named" if named else "required", ", stream" if stream else ""))

    def run(meta, res):
        tools, choice, what = meta
        text, finish, calls = res
        per_set.append(0)
        if text is None:
            check(False, "%s: request failed: %s" % (what, finish))
            return
        check(text.strip() == "", "%s: content beside the calls: %r" % (what, text[:200]))
        by_name = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
        complete = calls
        if finish == "length":
            for c in calls:
                try:
                    json.loads(c["function"]["arguments"])
                except ValueError:
                    check(False, "%s: cut call's arguments are not JSON" % what)
            # Every call but the last closed before the cut ("required" lets the model go on
            # calling), so it is held to its schema like a call of a finished answer.
            complete = calls[:-1]
        else:
            check(finish == "tool_calls", "%s: finish_reason %r" % (what, finish))
            check(len(calls) >= 1, "%s: no tool call" % what)
            if isinstance(choice, dict):
                check(len(calls) == 1 and calls[0]["function"]["name"] == choice["function"]["name"],
                      "%s: not exactly the named call: %r" % (what, calls))
        for c in complete:
            name = c["function"]["name"]
            if not check(name in by_name, "%s: unknown function %r" % (what, name)):
                continue
            try:
                args = json.loads(c["function"]["arguments"])
                jsonschema.validate(args, by_name[name])
                per_set[-1] += 1
            except (ValueError, jsonschema.ValidationError) as e:
                check(False, "%s: arguments %r invalid: %s\nschema %s" % (
                    what, c["function"]["arguments"][:300], e, json.dumps(by_name[name])))

    with cf.ThreadPoolExecutor(workers) as ex:
        n = batches(ex, n_min, n_max, workers, lambda: sum(per_set) >= need, make, run)
    return n, per_set


def misc_round(srv):
    with cf.ThreadPoolExecutor(6) as ex:  # at once: one batch of decode steps (the CPU executor is slow)
        futs = [ex.submit(generate, srv, "chat", {"response_format": {"type": "json_object"}, "max_tokens": 200,
                                                  "temperature": 1.0}, i % 2 == 1) for i in range(6)]
        for i, f in enumerate(futs):
            text, finish, _ = f.result()
            if check_json_answer({"type": "object"}, text, finish, "json_object %d" % i) == "stop":
                check(isinstance(json.loads(text), dict), "json_object is an object")
    text, finish, _ = generate(srv, "completions", {"guided_choice": ["yes", "no", "no way"], "max_tokens": 10}, False)
    check(text in ("yes", "no", "no way") and finish == "stop", "guided_choice: %r %r" % (text, finish))
    text, finish, _ = generate(srv, "completions", {"structured_outputs": {"choice": ["α", "β"]}, "max_tokens": 10},
                               True)
    check(text in ("α", "β") and finish == "stop", "structured_outputs choice: %r %r" % (text, finish))
    # refusals
    msgs = [{"role": "user", "content": "x"}]
    for bad, word in [({"type": "string", "pattern": "a+"}, "pattern"), ({"type": "integer", "minimum": 1}, "minimum"),
                      ({"not": {}}, "not")]:
        st, d = post(srv, "/v1/chat/completions", {"messages": msgs, "response_format": {
            "type": "json_schema", "json_schema": {"name": "b", "schema": bad}}})
        check(st == 400 and word in d.get("error", {}).get("message", "") and
              d["error"].get("param") == "response_format", "unsupported %s: 400 naming it: %r" % (word, d))
    deep = '{"type":"array","items":' * 1000 + '{"type":"null"}' + "}" * 1000
    st, d = post(srv, "/v1/completions", ('{"prompt":"x","guided_json":%s}' % deep).encode())
    check(st == 400, "1000-deep schema refused: %r" % (str(d)[:200],))
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    st, d = post(srv, "/v1/chat/completions", {"messages": msgs, "tools": tools,
                                              "tool_choice": {"type": "function", "function": {"name": "g"}}})
    check(st == 400 and d["error"].get("param") == "tool_choice", "unknown named function: 400: %r" % d)


def sdk_round(srv):
    try:
        import openai
        import pydantic
        from typing import Literal, Optional
    except ImportError:
        print("openai / pydantic missing: SDK round skipped")
        return

    class Item(pydantic.BaseModel):
        qty: int
        ok: bool

    class Order(pydantic.BaseModel):
        status: Literal["open", "closed"]
        count: int
        items: list[Item]
        note: Optional[Literal["rush"]]

    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)

    def parse(i):
        try:
            return client.beta.chat.completions.parse(model="tiny-e2e", messages=[{"role": "user", "content": "order"}],
                                                      response_format=Order, max_tokens=400, temperature=1.0, seed=i)
        except openai.LengthFinishReasonError:
            return None

    # 4 answers at once, then 4 more while none completed (12 at most: items is an unbounded array, so an
    # answer can run past max_tokens; a grammar that never lets one end still fails)
    n_ok, n = 0, 0
    with cf.ThreadPoolExecutor(4) as ex:
        while n < 12 and n_ok == 0:
            for r in ex.map(parse, range(n, n + 4)):
                if r is not None:
                    msg = r.choices[0].message
                    check(isinstance(msg.parsed, Order), "SDK parse: %r" % (msg.content,))
                    n_ok += 1
            n += 4
    check(n_ok >= 1, "SDK parse: at least one complete answer of %d" % n)


def run(srv, schemas, tools, max_tokens, tool_max_tokens, workers, label):
    """schemas, tools: (n_min, n_max, need) of schema_round and tool_round."""
    n, counts = schema_round(srv, *schemas, max_tokens, workers)
    print("%s: %d schemas: %d complete and valid, %d cut by max_tokens (valid prefixes)" % (
        label, n, counts["stop"], counts["length"]), flush=True)
    check(counts["stop"] >= schemas[2], "%s: too few complete answers: %r of %d" % (label, counts, n))
    n, per_set = tool_round(srv, *tools, tool_max_tokens, workers)
    n_calls = sum(per_set)
    print("%s: %d tool sets: %d valid calls %r" % (label, n, n_calls, per_set), flush=True)
    check(n_calls >= tools[2], "%s: too few complete tool calls: %d in %d sets" % (label, n_calls, n))
    misc_round(srv)
    sdk_round(srv)


# Thresholds on what random logits produce are checked by sequential sampling (batches()); the
# false-failure bound of each is beside its call, from the rates its generator shows.
srv = serverproc.Server("--max-model-len", "4096", executor="test", name="tiny-e2e")
try:
    # Rates seen (3 seeds): 195-199 of 220 schemas complete in 400 tokens, 74-90% of tool sets close a
    # call. At p = 0.6 and 0.7 (far below) P(< 73 of 220) < 1e-15 and P(< 16 sets of 50) < 1e-8: fixed sizes.
    run(srv, (220, 220, 220 // 3), (50, 50, 50 // 3), 400, 400, 8, "test executor")
finally:
    serverproc.stop_and_check(srv, check, "test-executor server")

if os.environ.get("DSV4_STRUCTURED_CPU", "1") != "0":
    cpu = serverproc.Server("--max-model-len", "4096", executor="cpu", name="tiny-e2e")
    try:
        # The tiny model's random strings run long: max_tokens cuts a share of its answers and calls.
        # Rates seen: 81 of 96 schemas complete in 150 tokens (p = 0.84), 53 of 64 tool sets close a call in
        # 300 (p = 0.83); a fixed 12 schemas / 6 sets fail "4 complete" / "2 calls" with probability 1e-5 /
        # 7e-4 at those rates (seed 423995612's 4 sets at 150 tokens made none). So: 12 schemas, then 4 at a
        # time until 4 completed (48 at most: P(fail) < 1e-10 even at p = 0.5); 4 tool sets, then 4 at a time
        # until 2 calls closed (16 at most: P(fail) < 1e-7 at p = 0.71, the lower 95% bound of the rate seen,
        # 1e-5 at p = 0.6; ~2% of runs need a second batch, and the cap bounds the time a broken grammar takes).
        run(cpu, (12, 48, 4), (4, 16, 2), 150, 300, 4, "cpu executor (tiny checkpoint)")
    finally:
        serverproc.stop_and_check(cpu, check, "cpu-executor server")
sys.exit(check.finish())
