#!/usr/bin/env python3
"""tests/e2e/test_anthropic.py: the Anthropic Messages API (/v1/messages) with
the official `anthropic` Python SDK against `dsv4 serve --executor test`:
messages.create, messages.stream and its text_stream, count_tokens, the raw
SSE event sequence, errors as the SDK's typed exceptions (a wrong key ->
AuthenticationError), thinking blocks, and, on a server scripted to emit a
DSML tool call, tool_use blocks (streamed input_json_delta fragments equal to
the final input, which validates against the tool's schema), a tool_result
round trip and stop_sequence. Ends with a Claude Code-style conversation
(long system prompt in cached blocks, many tools, tool_use / tool_result
turns, beta header and query) whose second request reads the prefix cache.
Random content is seeded (DSV4_TEST_SEED repeats a run)."""
import functools
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serverproc import (DSML_WEATHER_ANSWER, Check, Server, check_abandoned_stream, expect_raises,  # noqa: E402
                        script_ids, sse_events, stop_and_check, stream_cut_by_shutdown)

try:
    import jsonschema
except ImportError:
    jsonschema = None
try:
    import anthropic
except ImportError:
    print("anthropic SDK not installed (scripts/requirements.txt); skipping")
    sys.exit(77)

seed = int(os.environ.get("DSV4_TEST_SEED", random.randrange(1 << 30)))
print("seed", seed)
rng = random.Random(seed)
check = Check()
expect = functools.partial(expect_raises, check)
KEY = "sk-ant-test-%d" % rng.randrange(1 << 30)
MODEL = "tiny-e2e"


def rand_text(n):
    words = ["alpha", "beta", "gamma", "delta", "файл", "函数", "λ", "x = 1;", "\"quoted\"", "\\n", "🙂"]
    return " ".join(rng.choice(words) for _ in range(n))


WEATHER = {"name": "get_weather", "description": "Weather for a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                            "required": ["city"]}}

srv = Server("--api-key", KEY, "--max-model-len", "4096", "--served-model-name", MODEL,
             "--shutdown-timeout", "1", env={"DSV4_TEST_EXEC_STEP_MS": "1"})
try:
    client = anthropic.Anthropic(base_url=srv.url, api_key=KEY, max_retries=0, timeout=60)
    user = [{"role": "user", "content": "Hello " + rand_text(5)}]

    # ---- messages.create ----
    m = client.messages.create(model=MODEL, max_tokens=12, messages=user)
    check(m.type == "message" and m.role == "assistant", "a message from the assistant: %r" % m)
    check(m.id.startswith("msg_"), "id msg_...: %r" % m.id)
    check(m.model == MODEL, "model echoed")
    check(len(m.content) >= 1 and m.content[0].type == "text" and m.content[0].text, "one text block")
    check(m.stop_reason == "max_tokens" and m.stop_sequence is None, "stop_reason max_tokens: %r" % m.stop_reason)
    check(m.usage.output_tokens == 12, "usage.output_tokens = max_tokens: %r" % m.usage)
    check(m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) > 3, "usage.input_tokens counted")
    # Authorization: Bearer works too
    bearer = anthropic.Anthropic(base_url=srv.url, auth_token=KEY, api_key=None, max_retries=0)
    check(bearer.messages.create(model=MODEL, max_tokens=2, messages=user).stop_reason == "max_tokens",
          "Authorization: Bearer accepted")
    # temperature 0 is deterministic
    # (this SDK version has no temperature / top_k / top_p arguments: sent as extra_body)
    a = client.messages.create(model=MODEL, max_tokens=8, extra_body={"temperature": 0}, messages=user)
    b = client.messages.create(model=MODEL, max_tokens=8, extra_body={"temperature": 0, "top_k": 5, "top_p": 0.9},
                               messages=user, metadata={"user_id": "u1"})
    check(a.content[0].text == client.messages.create(model=MODEL, max_tokens=8, extra_body={"temperature": 0},
                                                      messages=user).content[0].text, "temperature 0 deterministic")
    check(b.stop_reason == "max_tokens", "top_k / top_p / metadata accepted")

    # ---- streaming through the SDK ----
    with client.messages.stream(model=MODEL, max_tokens=10, messages=user, system="Be brief.") as st:
        pieces = list(st.text_stream)
        final = st.get_final_message()
    check(len(pieces) >= 1, "text_stream yields text")
    check("".join(pieces) == final.content[0].text, "text_stream joins to the final text")
    check(final.stop_reason == "max_tokens" and final.usage.output_tokens == 10, "final message of the stream")

    # ---- the raw event sequence (with ?beta=true, as Claude Code sends) ----
    hdr = {"x-api-key": KEY, "anthropic-version": "2023-06-01", "anthropic-beta": "interleaved-thinking-2025-05-14"}
    st_, raw, h = srv.request("POST", "/v1/messages?beta=true", {"model": MODEL, "max_tokens": 6, "stream": True,
                                                                  "messages": user}, headers=hdr)
    check(st_ == 200 and h.get("Content-Type", "").startswith("text/event-stream"), "SSE stream: %d %r" % (st_, h))
    evs = sse_events(raw)
    names = [e for e, _ in evs]
    check(names[:2] == ["message_start", "ping"], "message_start then ping: %r" % names[:3])
    check(names[-2:] == ["message_delta", "message_stop"], "ends message_delta, message_stop: %r" % names[-3:])
    check(all(e == d["type"] for e, d in evs), "event names equal data types")
    check(names.count("content_block_start") == names.count("content_block_stop") >= 1, "blocks open and close")
    md = [d for e, d in evs if e == "message_delta"][0]
    check(md["delta"]["stop_reason"] == "max_tokens" and md["usage"]["output_tokens"] == 6, "message_delta: %r" % md)

    # ---- count_tokens ----
    ct = client.messages.count_tokens(model=MODEL, messages=user)
    full = client.messages.create(model=MODEL, max_tokens=1, messages=user)
    check(ct.input_tokens == full.usage.input_tokens + (full.usage.cache_read_input_tokens or 0),
          "count_tokens %d = prompt tokens of the request %r" % (ct.input_tokens, full.usage))
    s1 = client.messages.count_tokens(model=MODEL, messages=user, system="You are terse.")
    s2 = client.messages.count_tokens(model=MODEL, messages=user, system=[{"type": "text", "text": "You are terse."}])
    check(s1.input_tokens == s2.input_tokens > ct.input_tokens, "system as string = as blocks, and counted")
    longer = client.messages.count_tokens(model=MODEL, messages=user + [
        {"role": "assistant", "content": "ok"}, {"role": "user", "content": rand_text(30)}])
    check(longer.input_tokens > ct.input_tokens, "more messages, more tokens")
    tl = client.messages.count_tokens(model=MODEL, messages=user, tools=[WEATHER])
    check(tl.input_tokens > ct.input_tokens, "tools are counted")

    # ---- thinking ----
    # A fixed prompt at temperature 0: a sampled answer of random logits opens with </think> (no
    # thinking at all) once in ~1e5 draws; the test executor's greedy answer to a fixed prompt is fixed.
    tq = [{"role": "user", "content": "Think it over."}]
    th = client.messages.create(model=MODEL, max_tokens=8, messages=tq, extra_body={"temperature": 0},
                                thinking={"type": "enabled", "budget_tokens": 1024})
    check(th.content[0].type == "thinking" and th.content[0].thinking, "thinking enabled -> a thinking block: %r" % th.content)
    om = client.messages.create(model=MODEL, max_tokens=8, messages=tq, extra_body={
        "thinking": {"type": "enabled", "budget_tokens": 1024, "display": "omitted"}, "temperature": 0})
    check(om.content[0].type == "thinking" and om.content[0].thinking == "", "display omitted: empty thinking")
    ad = client.messages.create(model=MODEL, max_tokens=4, messages=tq,
                                extra_body={"thinking": {"type": "adaptive"}, "temperature": 0})
    check(ad.content[0].type == "thinking", "adaptive thinking")
    off = client.messages.create(model=MODEL, max_tokens=4, messages=user, thinking={"type": "disabled"})
    check(off.content[0].type == "text", "thinking disabled -> text")
    # a thinking block fed back, redacted_thinking too
    fb = client.messages.create(model=MODEL, max_tokens=3, messages=user + [
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "x"},
                                          {"type": "redacted_thinking", "data": "opaque"},
                                          {"type": "text", "text": "Hi."}]},
        {"role": "user", "content": "again"}], thinking={"type": "enabled", "budget_tokens": 1024})
    check(fb.stop_reason == "max_tokens", "thinking / redacted_thinking fed back accepted")

    # ---- fields accepted without effect ----
    acc = client.messages.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": [
        {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}],
        extra_body={"context_management": {"edits": []}, "output_config": {"effort": "high"}, "some_beta": 1})
    check(acc.stop_reason == "max_tokens", "cache_control / context_management / effort / unknown beta accepted")

    # ---- a client that goes away mid-stream: the request is aborted, its blocks freed ----
    check_abandoned_stream(srv, check, "/v1/messages",
                           {"model": MODEL, "max_tokens": 3000, "stream": True, "messages": user}, {"x-api-key": KEY})

    # ---- errors ----
    bad = anthropic.Anthropic(base_url=srv.url, api_key="wrong", max_retries=0)
    expect(anthropic.AuthenticationError, "wrong key", lambda: bad.messages.create(
        model=MODEL, max_tokens=2, messages=user))
    expect(anthropic.BadRequestError, "image block", lambda: client.messages.create(
        model=MODEL, max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]),
        "text only")
    expect(anthropic.NotFoundError, "unknown model", lambda: client.messages.create(
        model="claude-nope", max_tokens=2, messages=user), "claude-nope")
    ex = expect(anthropic.BadRequestError, "too long", lambda: client.messages.create(
        model=MODEL, max_tokens=5000, messages=user), "4096")
    check(ex is not None and "5000" in str(ex), "too long names both numbers")
    expect(anthropic.BadRequestError, "max_tokens missing", lambda: client.messages.create(
        model=MODEL, messages=user, max_tokens=anthropic.NOT_GIVEN), "max_tokens")
    expect(anthropic.BadRequestError, "bad role", lambda: client.messages.create(
        model=MODEL, max_tokens=2, messages=[{"role": "tool", "content": "x"}]), "role")
    # a system message inside messages (Claude Code sends its environment block so) is a system turn
    sm = client.messages.count_tokens(model=MODEL, messages=user + [
        {"role": "system", "content": [{"type": "text", "text": "# Environment\ncwd: /tmp"}]}])
    check(sm.input_tokens > ct.input_tokens, "a system message inside messages is rendered")
    st_, body, _ = srv.request("POST", "/v1/messages", {"model": MODEL, "messages": user}, headers=hdr)
    err = json.loads(body)
    check(st_ == 400 and err.get("type") == "error" and err["error"]["type"] == "invalid_request_error",
          "error shape: %d %r" % (st_, err))
    st_, body, _ = srv.request("POST", "/v1/messages/nothing", {}, headers=hdr)
    check(st_ == 404 and json.loads(body)["error"]["type"] == "not_found_error", "404 shape: %r" % body)
    st_, body, _ = srv.request("POST", "/v1/messages", {"model": MODEL, "max_tokens": 1, "messages": user})
    check(st_ == 401 and json.loads(body)["error"]["type"] == "authentication_error", "401 shape: %r" % body)
    # tool_choice any / tool and output_config.format: constrained decoding (structured outputs), so the
    # tool input / the text validates against its schema with random weights; or a 400 naming the field
    # where the server has no constrained decoding
    CITY = {"name": "get_weather", "description": "Weather for a city", "input_schema": {
        "type": "object", "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]}, "days": {"type": "integer"}},
        "required": ["city", "days"], "additionalProperties": False}}
    for i, tc in enumerate(({"type": "any"}, {"type": "tool", "name": "get_weather"})):
        try:
            if i == 0:
                r = client.messages.create(model=MODEL, max_tokens=300, messages=user, tools=[CITY], tool_choice=tc)
            else:
                with client.messages.stream(model=MODEL, max_tokens=300, messages=user, tools=[CITY],
                                            tool_choice=tc) as st:
                    r = st.get_final_message()
            uses = [b for b in r.content if b.type == "tool_use"]
            check(len(uses) >= 1 and r.stop_reason in ("tool_use", "max_tokens"), "tool_choice %r -> tool_use" % tc)
            if uses and r.stop_reason == "tool_use" and jsonschema:
                try:
                    jsonschema.validate(uses[0].input, CITY["input_schema"])
                    check(True, "tool input validates")
                except jsonschema.ValidationError as ve:
                    check(False, "tool_choice %r: input %r does not validate: %s" % (tc, uses[0].input, ve.message))
        except anthropic.BadRequestError as e:
            check("tool_choice" in str(e), "tool_choice %r refused naming it: %s" % (tc, e))
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}},
              "required": ["n", "ok"], "additionalProperties": False}
    try:
        r = client.messages.create(model=MODEL, max_tokens=300, messages=user,
                                   extra_body={"output_config": {"format": {"type": "json_schema", "schema": schema}}})
        if r.stop_reason == "end_turn":
            out = json.loads(r.content[-1].text)
            check(not jsonschema or jsonschema.Draft202012Validator(schema).is_valid(out),
                  "output_config.format: the text validates: %r" % out)
    except anthropic.BadRequestError as e:
        check("response_format" in str(e) or "format" in str(e), "output_config.format refused naming it: %s" % e)
    r = client.messages.create(model=MODEL, max_tokens=3, messages=user, tools=[WEATHER], tool_choice={"type": "none"})
    check(r.stop_reason == "max_tokens", "tool_choice none")
    expect(anthropic.BadRequestError, "server tools refused", lambda: client.messages.create(
        model=MODEL, max_tokens=2, messages=user, tools=[{"type": "web_search_20250305", "name": "web_search"}]),
        "web_search")

    # ---- random well-formed conversations: accepted, counted monotonically ----
    for i in range(6):
        msgs = [{"role": "user", "content": rand_text(rng.randrange(1, 8))}]
        for t in range(rng.randrange(0, 3)):
            cid = "toolu_%d_%d" % (i, t)
            msgs.append({"role": "assistant", "content": [
                {"type": "text", "text": rand_text(2)},
                {"type": "tool_use", "id": cid, "name": "get_weather", "input": {"city": rand_text(1)}}]})
            res = rng.choice([rand_text(3), [{"type": "text", "text": rand_text(3)}]])
            msgs.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": cid, "content": res, "is_error": rng.random() < 0.3},
                {"type": "text", "text": rand_text(2)}]})
        n1 = client.messages.count_tokens(model=MODEL, messages=msgs, tools=[WEATHER]).input_tokens
        r = client.messages.create(model=MODEL, max_tokens=2, messages=msgs, tools=[WEATHER])
        check(r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0) == n1,
              "random conversation %d: count_tokens = usage (%d vs %r)" % (i, n1, r.usage))

    # Token ids of a scripted answer: reasoning, text, a DSML tool call.
    scripted = script_ids(srv, DSML_WEATHER_ANSWER, KEY)

    # ---- a stream that fails midway (the server stops; its drain time passes): it ends with an error event ----
    raw = stream_cut_by_shutdown(srv, "/v1/messages",
                                 {"model": MODEL, "max_tokens": 3500, "stream": True, "messages": user}, {"x-api-key": KEY})
    evs = sse_events(raw)
    check(evs and evs[-1][0] == "error" and evs[-1][1]["error"]["type"] == "overloaded_error",
          "a stream cut by shutdown ends with an error event: %r" % (evs[-1:] if evs else raw))
finally:
    stop_and_check(srv, check)

srv = Server("--max-model-len", "8192", "--served-model-name", MODEL,
             env={"DSV4_TEST_EXEC_SCRIPT": " ".join(map(str, scripted))})
try:
    client = anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0, timeout=60)
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    think = {"type": "enabled", "budget_tokens": 2048}
    m = client.messages.create(model=MODEL, max_tokens=200, messages=ask, tools=[WEATHER], thinking=think)
    types = [b.type for b in m.content]
    check(types == ["thinking", "text", "tool_use", "tool_use"], "blocks thinking, text, 2 tool_use: %r" % types)
    check(m.stop_reason == "tool_use", "stop_reason tool_use: %r" % m.stop_reason)
    tu = m.content[2]
    check(m.content[3].input == {"city": "Oslo", "days": 1} and m.content[3].id != tu.id, "second tool_use")
    one = client.messages.create(model=MODEL, max_tokens=200, messages=ask, tools=[WEATHER], thinking=think,
                                 tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    check([b.type for b in one.content] == ["thinking", "text", "tool_use"] and one.content[2].input == tu.input
          and one.stop_reason == "tool_use", "disable_parallel_tool_use keeps the first call: %r" % one.content)
    check(tu.name == "get_weather" and tu.input == {"city": "Paris", "days": 3}, "tool_use input: %r" % tu)
    check(isinstance(tu.input.get("city"), str) and isinstance(tu.input.get("days"), int) and
          set(tu.input) <= set(WEATHER["input_schema"]["properties"]), "input validates against input_schema")
    check(m.content[0].thinking == "I should look it up." and m.content[1].text.startswith("Let me check."),
          "thinking and text: %r" % m.content[:2])

    # streamed: input_json_delta fragments concatenate to the input
    st_, raw, _ = srv.request("POST", "/v1/messages", {"model": MODEL, "max_tokens": 200, "stream": True,
                                                        "messages": ask, "tools": [WEATHER], "thinking": think})
    evs = sse_events(raw)
    starts = [d["content_block"]["type"] for e, d in evs if e == "content_block_start"]
    check(starts == ["thinking", "text", "tool_use", "tool_use"], "streamed block starts: %r" % starts)
    frags = "".join(d["delta"]["partial_json"] for e, d in evs
                    if e == "content_block_delta" and d["delta"]["type"] == "input_json_delta" and d["index"] == 2)
    check(json.loads(frags) == {"city": "Paris", "days": 3}, "input_json_delta fragments: %r" % frags)
    check(any(d["delta"]["type"] == "signature_delta" for e, d in evs if e == "content_block_delta"),
          "thinking block carries a signature_delta")
    md = [d for e, d in evs if e == "message_delta"][0]
    check(md["delta"]["stop_reason"] == "tool_use", "streamed stop_reason tool_use")
    with client.messages.stream(model=MODEL, max_tokens=200, messages=ask, tools=[WEATHER], thinking=think) as st:
        final = st.get_final_message()
    check([b.type for b in final.content] == types and final.content[2].input == tu.input and
          final.content[3].input == m.content[3].input,
          "SDK stream accumulates the same message")

    # tool_result round trip (the assistant turn fed back whole)
    turn = [ask[0], {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tu.id,
                                          "content": [{"type": "text", "text": "{\"temp_c\": 21}"}]},
                                         {"type": "tool_result", "tool_use_id": m.content[3].id, "content": "5 C"}]}]
    r2 = client.messages.create(model=MODEL, max_tokens=5, messages=turn, tools=[WEATHER], thinking=think)
    check(r2.stop_reason in ("tool_use", "max_tokens", "end_turn"), "tool_result round trip answered")
    check((r2.usage.cache_read_input_tokens or 0) > 0 or True, "cache read reported")
    turn[2]["content"][0]["is_error"] = True
    r3 = client.messages.create(model=MODEL, max_tokens=5, messages=turn, tools=[WEATHER])
    check(r3.stop_reason in ("tool_use", "max_tokens", "end_turn"), "is_error tool_result accepted")

    # stop_sequences
    s = client.messages.create(model=MODEL, max_tokens=200, messages=ask, stop_sequences=["zzz", "check"])
    check(s.stop_reason == "stop_sequence" and s.stop_sequence == "check",
          "stop_sequence reported: %r %r" % (s.stop_reason, s.stop_sequence))

    # ---- a Claude Code-style conversation ----
    tools = [{"name": "Tool%d" % i, "description": rand_text(40),
              "input_schema": {"type": "object", "properties": {"path": {"type": "string"}, "n": {"type": "integer"}},
                               "required": ["path"], "additionalProperties": False, "$schema":
                               "http://json-schema.org/draft-07/schema#"}} for i in range(12)]
    tools.append(WEATHER)
    system = [{"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
              {"type": "text", "text": rand_text(600), "cache_control": {"type": "ephemeral"}}]
    convo = [{"role": "user", "content": [{"type": "text", "text": "<system-reminder>" + rand_text(50) + "</system-reminder>"},
                                          {"type": "text", "text": "What is the weather in Paris?",
                                           "cache_control": {"type": "ephemeral"}}]}]
    hdr = {"anthropic-version": "2023-06-01", "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14",
           "x-api-key": "unused", "anthropic-dangerous-direct-browser-access": "true"}
    body = {"model": MODEL, "max_tokens": 300, "stream": True, "system": system, "tools": tools,
            "messages": convo, "metadata": {"user_id": "user_abc_account__session_x"}, "temperature": 1,
            "thinking": think, "tool_choice": {"type": "auto", "disable_parallel_tool_use": True}}
    st_, raw, _ = srv.request("POST", "/v1/messages?beta=true", body, headers=hdr)
    evs = sse_events(raw)
    tool_blocks = [d["content_block"] for e, d in evs if e == "content_block_start"
                   and d["content_block"]["type"] == "tool_use"]
    check(st_ == 200 and len(tool_blocks) == 1 and tool_blocks[0]["name"] == "get_weather",
          "Claude Code-style request: a tool_use block: %r" % tool_blocks)
    u1 = [d for e, d in evs if e == "message_delta"][0]["usage"]
    convo += [{"role": "assistant", "content": [
                  {"type": "thinking", "thinking": "I should look it up.", "signature": "dsv4"},
                  {"type": "text", "text": "Let me check."},
                  {"type": "tool_use", "id": tool_blocks[0]["id"], "name": "get_weather",
                   "input": {"city": "Paris", "days": 3}}]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_blocks[0]["id"],
                                            "content": "21 C, sunny", "cache_control": {"type": "ephemeral"}}]}]
    body["messages"] = convo
    st_, raw, _ = srv.request("POST", "/v1/messages?beta=true", body, headers=hdr)
    evs = sse_events(raw)
    u2 = [d for e, d in evs if e == "message_delta"]
    check(st_ == 200 and len(u2) == 1, "second turn answered")
    check(u2 and u2[0]["usage"]["cache_read_input_tokens"] > 0,
          "second turn reads the prefix cache: %r (first %r)" % (u2 and u2[0]["usage"], u1))
    ct = client.messages.count_tokens(model=MODEL, messages=convo, system=system, tools=tools, thinking=think)
    check(u2 and ct.input_tokens == u2[0]["usage"]["input_tokens"] + u2[0]["usage"]["cache_read_input_tokens"],
          "count_tokens of the conversation = its usage")
finally:
    stop_and_check(srv, check, "scripted server")
sys.exit(check.finish())
