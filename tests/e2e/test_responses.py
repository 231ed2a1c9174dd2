#!/usr/bin/env python3
"""tests/e2e/test_responses.py: the OpenAI Responses API (/v1/responses) with
the official `openai` SDK's responses client against `dsv4 serve --executor
test`: responses.create, responses.stream (typed events with increasing
sequence_number, text deltas joining to the final text), retrieve / delete,
previous_response_id (the stored conversation continues; the prefix cache
serves the shared history), store: false, errors as the SDK's typed
exceptions, and the bounded store evicting its oldest answers (404 naming
the id). On a server scripted to emit reasoning and a DSML tool call:
reasoning / message / function_call items, function_call_arguments deltas
joining to the arguments (valid against the tool's schema), and a
function-call round trip through function_call_output, with and without
previous_response_id. Random inputs are seeded (DSV4_TEST_SEED)."""
import functools
import json
import os
import random
import sys

import openai

try:
    import jsonschema
except ImportError:
    jsonschema = None

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serverproc import (DSML_WEATHER_ANSWER, Check, Server, check_abandoned_stream, expect_raises,  # noqa: E402
                        script_ids, sse_events, stop_and_check, stream_cut_by_shutdown)

seed = int(os.environ.get("DSV4_TEST_SEED", random.randrange(1 << 30)))
print("seed", seed)
rng = random.Random(seed)
check = Check()
expect = functools.partial(expect_raises, check)
KEY = "sk-resp-%d" % rng.randrange(1 << 30)
MODEL = "tiny-e2e"
STORE_BYTES = 24000


def rand_text(n):
    words = ["alpha", "beta", "gamma", "файл", "函数", "λ", "x = 1;", "\"q\"", "🙂", "the", "of"]
    return " ".join(rng.choice(words) for _ in range(n))


WEATHER = {"type": "function", "name": "get_weather", "description": "Weather for a city", "strict": False,
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                          "required": ["city"]}}

srv = Server("--api-key", KEY, "--max-model-len", "4096", "--served-model-name", MODEL,
             "--responses-store-bytes", str(STORE_BYTES), "--shutdown-timeout", "1", env={"DSV4_TEST_EXEC_STEP_MS": "1"})
try:
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key=KEY, max_retries=0, timeout=60)
    q = "Hello " + rand_text(4)

    # ---- create ----
    r = client.responses.create(model=MODEL, input=q, max_output_tokens=8)
    check(r.object == "response" and r.id.startswith("resp_"), "a response object: %r" % r.id)
    check(r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens",
          "status incomplete at max_output_tokens: %r %r" % (r.status, r.incomplete_details))
    check(r.output and r.output[0].type == "message" and r.output[0].role == "assistant", "a message item")
    check(r.output_text and r.output_text == r.output[0].content[0].text, "output_text: %r" % r.output_text)
    check(r.usage.output_tokens == 8 and r.usage.input_tokens > 0 and r.usage.total_tokens == 8 + r.usage.input_tokens,
          "usage: %r" % r.usage)
    check(r.usage.input_tokens_details.cached_tokens >= 0, "usage.input_tokens_details.cached_tokens")
    check(r.model == MODEL and r.max_output_tokens == 8 and r.store is True, "fields repeated")
    ri = client.responses.create(model=MODEL, input=q, max_output_tokens=2, instructions="Answer in French. " * 3,
                                 metadata={"k": "v"})
    check(ri.usage.input_tokens > r.usage.input_tokens, "instructions are part of the prompt")
    check(ri.instructions.startswith("Answer in French") and ri.metadata == {"k": "v"}, "instructions / metadata echoed")
    t0 = client.responses.create(model=MODEL, input=q, max_output_tokens=6, temperature=0)
    t1 = client.responses.create(model=MODEL, input=[{"role": "user", "content": [{"type": "input_text", "text": q}]}],
                                 max_output_tokens=6, temperature=0)
    check(t0.output_text == t1.output_text, "string input = an input_text message (temperature 0)")

    # ---- retrieve / delete ----
    g = client.responses.retrieve(r.id)
    check(g.id == r.id and g.output_text == r.output_text and g.usage.output_tokens == 8, "retrieve returns it")
    d = client.responses.delete(ri.id)
    check(d is None or True, "delete answered")
    expect(openai.NotFoundError, "retrieve after delete", lambda: client.responses.retrieve(ri.id), ri.id)
    expect(openai.NotFoundError, "delete twice", lambda: client.responses.delete(ri.id), ri.id)
    ns = client.responses.create(model=MODEL, input=q, max_output_tokens=2, store=False)
    expect(openai.NotFoundError, "store: false keeps nothing", lambda: client.responses.retrieve(ns.id), ns.id)

    # ---- previous_response_id ----
    long_q = rand_text(120)
    p1 = client.responses.create(model=MODEL, input=long_q, max_output_tokens=4, instructions="Be brief.")
    p2 = client.responses.create(model=MODEL, previous_response_id=p1.id, input="and then?", max_output_tokens=4,
                                 instructions="Be brief.")
    check(p2.previous_response_id == p1.id, "previous_response_id echoed")
    check(p2.usage.input_tokens > p1.usage.input_tokens + p1.usage.output_tokens,
          "the history is in the prompt: %d > %d + %d" % (p2.usage.input_tokens, p1.usage.input_tokens,
                                                          p1.usage.output_tokens))
    check(p2.usage.input_tokens_details.cached_tokens > 0, "the prefix cache serves the shared history: %r" % p2.usage)
    p3 = client.responses.create(model=MODEL, previous_response_id=p2.id, input="more", max_output_tokens=2,
                                 instructions="Be brief.")
    check(p3.usage.input_tokens > p2.usage.input_tokens + 2, "chains of three")
    expect(openai.NotFoundError, "unknown previous_response_id", lambda: client.responses.create(
        model=MODEL, previous_response_id="resp_nope", input="x", max_output_tokens=2), "resp_nope")

    # ---- streaming ----
    evs = []
    with client.responses.stream(model=MODEL, input=q, max_output_tokens=7) as st:
        for ev in st:
            evs.append(ev)
    types = [e.type for e in evs]
    seqs = [e.sequence_number for e in evs]
    check(types[:2] == ["response.created", "response.in_progress"], "created, in_progress first: %r" % types[:3])
    check(seqs == list(range(len(seqs))), "sequence_number 0, 1, 2, ...")
    check(types[-1] == "response.incomplete", "ends response.incomplete at the token limit: %r" % types[-1])
    deltas = "".join(e.delta for e in evs if e.type == "response.output_text.delta")
    done = [e for e in evs if e.type == "response.output_text.done"]
    check(done and done[0].text == deltas and deltas, "output_text deltas join to .done")
    check(evs[-1].response.output_text == deltas, "the final response carries the text")
    check(client.responses.retrieve(evs[-1].response.id).output_text == deltas, "a streamed response is stored too")
    for name in ("response.output_item.added", "response.content_part.added", "response.content_part.done",
                 "response.output_item.done"):
        check(name in types, "event %s" % name)
    # (reasoning at temperature 0 on a fixed input: a sampled answer of random logits opens with </think>,
    # no reasoning at all, once in ~1e5 draws; the test executor's greedy answer to a fixed input is fixed)
    tq = "Think it over."
    st_, raw, _ = srv.request("POST", "/v1/responses", {"model": MODEL, "input": tq, "max_output_tokens": 3,
                                                         "stream": True, "reasoning": {"effort": "high"},
                                                         "temperature": 0},
                              headers={"Authorization": "Bearer " + KEY})
    raw_evs = sse_events(raw)
    check(st_ == 200 and all(e == d["type"] for e, d in raw_evs), "SSE event names equal data types")
    check("response.reasoning_summary_text.delta" in [e for e, _ in raw_evs], "reasoning summary deltas streamed")

    # ---- reasoning ----
    rr = client.responses.create(model=MODEL, input=tq, max_output_tokens=6, reasoning={"effort": "high"},
                                 temperature=0)
    check(rr.output[0].type == "reasoning" and rr.output[0].summary and rr.output[0].summary[0].text,
          "reasoning.effort high -> a reasoning item: %r" % rr.output[:1])
    rn = client.responses.create(model=MODEL, input=q, max_output_tokens=4, reasoning={"effort": "none"})
    check(rn.output[0].type == "message", "reasoning.effort none -> a message")

    # ---- a client that goes away mid-stream: the request is aborted, its blocks freed ----
    check_abandoned_stream(srv, check, "/v1/responses",
                           {"model": MODEL, "max_output_tokens": 3000, "stream": True, "input": q},
                           {"Authorization": "Bearer " + KEY})

    # ---- errors ----
    bad = openai.OpenAI(base_url=srv.url + "/v1", api_key="wrong", max_retries=0)
    expect(openai.AuthenticationError, "wrong key", lambda: bad.responses.create(model=MODEL, input=q))
    expect(openai.BadRequestError, "image input", lambda: client.responses.create(model=MODEL, input=[
        {"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]), "text only")
    expect(openai.BadRequestError, "unknown parameter", lambda: client.responses.create(
        model=MODEL, input=q, extra_body={"frobnicate": 1}), "frobnicate")
    expect(openai.BadRequestError, "hosted tools", lambda: client.responses.create(
        model=MODEL, input=q, tools=[{"type": "web_search"}]), "web_search")
    expect(openai.NotFoundError, "unknown model", lambda: client.responses.create(model="gpt-x", input=q), "gpt-x")
    expect(openai.BadRequestError, "too long", lambda: client.responses.create(
        model=MODEL, input=q, max_output_tokens=9000), "4096")
    expect(openai.BadRequestError, "missing input", lambda: client.responses.create(model=MODEL), "input")
    # JSON formats and tool_choice required: constrained (structured outputs), so outputs validate against
    # their schemas with random weights; or a 400 naming the field where the server has none
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"enum": ["x", "y"]}},
              "required": ["a", "b"], "additionalProperties": False}
    for fmt in ({"type": "json_schema", "name": "w", "schema": schema, "strict": True}, {"type": "json_object"}):
        try:
            j = client.responses.create(model=MODEL, input=q, max_output_tokens=300, text={"format": fmt})
            if j.status == "completed":
                out = json.loads(j.output_text)
                ok = isinstance(out, dict) and (fmt["type"] == "json_object" or not jsonschema or
                                                jsonschema.Draft202012Validator(schema).is_valid(out))
                check(ok, "text.format %s: the output validates: %r" % (fmt["type"], out))
        except openai.BadRequestError as e:
            check("response_format" in str(e), "text.format %s refused naming it: %s" % (fmt["type"], e))
    CITY = dict(WEATHER, parameters={"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]},
                                                                     "days": {"type": "integer"}},
                                     "required": ["city", "days"], "additionalProperties": False})
    for tc in ("required", {"type": "function", "name": "get_weather"}):
        try:
            tr = client.responses.create(model=MODEL, input=q, max_output_tokens=300, tools=[CITY], tool_choice=tc)
            calls = [o for o in tr.output if o.type == "function_call"]
            check(len(calls) >= 1, "tool_choice %r -> a function_call" % (tc,))
            if calls and tr.status == "completed" and jsonschema:
                check(jsonschema.Draft202012Validator(CITY["parameters"]).is_valid(json.loads(calls[0].arguments)),
                      "tool_choice %r: arguments validate: %s" % (tc, calls[0].arguments))
        except openai.BadRequestError as e:
            check("tool_choice" in str(e), "tool_choice %r refused naming it: %s" % (tc, e))

    # ---- the bounded store evicts its oldest answers ----
    ids = []
    for i in range(40):
        x = client.responses.create(model=MODEL, input=rand_text(rng.randrange(5, 60)), max_output_tokens=4)
        ids.append(x.id)
    expect(openai.NotFoundError, "the oldest answer was evicted", lambda: client.responses.retrieve(ids[0]), ids[0])
    check(client.responses.retrieve(ids[-1]).id == ids[-1], "the newest answer is kept")
    held = []
    for i in ids:
        try:
            client.responses.retrieve(i)
            held.append(True)
        except openai.NotFoundError:
            held.append(False)
    first = held.index(True)
    check(all(held[first:]) and not any(held[:first]), "evicted oldest first: %r" % held)
    expect(openai.NotFoundError, "previous_response_id of an evicted answer", lambda: client.responses.create(
        model=MODEL, previous_response_id=ids[0], input="x", max_output_tokens=2), ids[0])

    scripted = script_ids(srv, DSML_WEATHER_ANSWER, KEY)

    # ---- a stream that fails midway (the server stops; its drain time passes): it ends with response.failed ----
    raw = stream_cut_by_shutdown(srv, "/v1/responses",
                                 {"model": MODEL, "max_output_tokens": 3500, "stream": True, "input": q},
                                 {"Authorization": "Bearer " + KEY})
    evs = sse_events(raw)
    last = evs[-1][1] if evs else {}
    check(evs and evs[-1][0] == "response.failed" and last["response"]["status"] == "failed" and
          last["response"]["error"]["message"],
          "a stream cut by shutdown ends with response.failed: %r" % (evs[-1:] if evs else raw))
finally:
    stop_and_check(srv, check)

srv = Server("--max-model-len", "8192", "--served-model-name", MODEL,
             env={"DSV4_TEST_EXEC_SCRIPT": " ".join(map(str, scripted))})
try:
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    ask = "Weather in Paris?"
    r = client.responses.create(model=MODEL, input=ask, tools=[WEATHER], reasoning={"effort": "high"},
                                max_output_tokens=200)
    types = [o.type for o in r.output]
    check(types == ["reasoning", "message", "function_call", "function_call"],
          "items reasoning, message, 2 function_call: %r" % types)
    check(r.status == "completed", "status completed: %r" % r.status)
    fc = r.output[2]
    check(json.loads(r.output[3].arguments) == {"city": "Oslo", "days": 1} and r.output[3].call_id != fc.call_id,
          "the second call")
    one = client.responses.create(model=MODEL, input=ask, tools=[WEATHER], reasoning={"effort": "high"},
                                  max_output_tokens=200, parallel_tool_calls=False)
    check([o.type for o in one.output] == ["reasoning", "message", "function_call"] and
          one.output[2].arguments == fc.arguments and one.parallel_tool_calls is False,
          "parallel_tool_calls false keeps the first call: %r" % [o.type for o in one.output])
    args = json.loads(fc.arguments)
    check(fc.name == "get_weather" and args == {"city": "Paris", "days": 3} and fc.call_id, "function_call: %r" % fc)
    check(isinstance(args["city"], str) and isinstance(args["days"], int) and
          set(args) <= set(WEATHER["parameters"]["properties"]), "arguments validate against the schema")
    check(r.output[0].summary[0].text == "I should look it up." and r.output_text.startswith("Let me check."),
          "reasoning summary and text")

    with client.responses.stream(model=MODEL, input=ask, tools=[WEATHER], reasoning={"effort": "high"},
                                 max_output_tokens=200) as st:
        evs = list(st)
        final = st.get_final_response()
    frag = "".join(e.delta for e in evs if e.type == "response.function_call_arguments.delta" and e.output_index == 2)
    adone = [e for e in evs if e.type == "response.function_call_arguments.done"]
    check(json.loads(frag) == args and adone and adone[0].arguments == frag, "arguments deltas join to .done")
    check([o.type for o in final.output] == types and json.loads(final.output[2].arguments) == args and
          final.output[3].arguments == r.output[3].arguments,
          "get_final_response equals the non-streamed items")
    check(evs[-1].type == "response.completed", "ends response.completed")

    # round trip through function_call_output: continuing the stored response ...
    r2 = client.responses.create(model=MODEL, previous_response_id=r.id, tools=[WEATHER], max_output_tokens=3,
                                 reasoning={"effort": "high"},
                                 input=[{"type": "function_call_output", "call_id": fc.call_id, "output": "21 C"},
                                        {"type": "function_call_output", "call_id": r.output[3].call_id,
                                         "output": [{"type": "input_text", "text": "5 C"}]}])
    check(r2.status in ("completed", "incomplete") and r2.output, "function_call_output round trip (stored)")
    # ... and with the whole history in input (items fed back, as a client with store: false does)
    items = [{"role": "user", "content": ask}] + [o.model_dump(exclude_none=True) for o in r.output] + [
        {"type": "function_call_output", "call_id": fc.call_id, "output": "21 C"},
        {"type": "function_call_output", "call_id": r.output[3].call_id, "output": "5 C"}]
    r3 = client.responses.create(model=MODEL, input=items, tools=[WEATHER], max_output_tokens=3, store=False,
                                 parallel_tool_calls=False, include=["reasoning.encrypted_content"],
                                 reasoning={"effort": "high"}, extra_body={"prompt_cache_key": "k"})
    check(r3.usage.input_tokens == r2.usage.input_tokens,
          "fed-back items render like the stored conversation: %d vs %d" % (r3.usage.input_tokens,
                                                                            r2.usage.input_tokens))
finally:
    stop_and_check(srv, check, "scripted server")
sys.exit(check.finish())
