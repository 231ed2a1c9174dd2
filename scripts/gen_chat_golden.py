#!/usr/bin/env python3
"""Generate tests/model/data/chat_golden.json: DeepSeek-V4 prompt strings.

The expected strings come from DeepSeek's own encoder (encoding_dsv4.py of
the DeepSeek-V4 release; SGLang and vLLM carry copies). That file is not
part of this repository: fetch it yourself and pass its path:

    .venv/bin/python scripts/gen_chat_golden.py --encoder /tmp/encoding_dsv4.py

Each case holds the inputs the way model_chat_encode() takes them (OpenAI
messages, the tools array as JSON text, options) and the prompt the encoder
renders for them. Request-level tools and response_format are attached to
the first message, inserting an empty system message in front when the
first message is not a system one (what SGLang's server does). The C test
tests/model/test_chat.c must reproduce every "expected" byte for byte.
"""

import argparse
import copy
import importlib.util
import json
import os
import random
import sys

OUT_DEFAULT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "model",
                           "data", "chat_golden.json")


def load_encoder(path):
    spec = importlib.util.spec_from_file_location("dsv4_encoder", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---- building blocks ----

def fn_tool(name, description, parameters):
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": parameters}}


WEATHER = fn_tool("get_weather", "Get the current weather for a city.", {
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "City name, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city"],
})

SEARCH = fn_tool("web_search", "Search the web and return the top results.", {
    "type": "object",
    "properties": {
        "query": {"type": "string"},
        "top_k": {"type": "integer", "minimum": 1, "maximum": 50, "default": 5},
        "filters": {
            "type": "object",
            "properties": {
                "site": {"type": "array", "items": {"type": "string"}},
                "date_range": {"type": "object", "properties": {
                    "from": {"type": "string", "format": "date"},
                    "to": {"type": "string", "format": "date"}}},
                "safe": {"type": "boolean"},
            },
        },
    },
    "required": ["query"],
    "additionalProperties": False,
})

CALC = fn_tool("calculator", "Evaluate an arithmetic expression.\nSupports + - * / and ^.", {
    "type": "object",
    "properties": {"expression": {"type": "string"},
                   "precision": {"type": "number", "minimum": 0.0, "maximum": 1e-3,
                                 "multipleOf": 0.5}},
    "required": ["expression"],
})

UNICODE_TOOL = fn_tool("翻译", "把文本翻译成目标语言 🌐 — «quoted» \"double\" \\ back\tslash", {
    "type": "object",
    "properties": {"文本": {"type": "string", "description": "要翻译的内容"},
                   "目标": {"type": "string", "enum": ["英语", "日本語", "한국어", "Ελληνικά"]}},
})

NO_PARAMS = {"type": "function", "function": {"name": "get_time"}}

DEEP = fn_tool("create_event", "Create a calendar event.", {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "attendees": {"type": "array", "items": {"type": "object", "properties": {
            "email": {"type": "string"}, "optional": {"type": "boolean", "default": False},
            "roles": {"type": "array", "items": {"type": "string"}, "minItems": 0}}}},
        "when": {"oneOf": [{"type": "string"}, {"type": "object", "properties": {
            "start": {"type": "number"}, "duration_h": {"type": "number", "default": 1.5}}}]},
        "meta": {"type": ["object", "null"], "properties": {}},
        "priority": {"type": "integer", "default": -3},
        "ratio": {"type": "number", "default": 1e-07},
        "big": {"type": "number", "default": 1e+22},
        "exact": {"type": "number", "default": 12345678901234567.0},
    },
    "required": ["title", "when"],
})


def call(cid, name, args):
    """An OpenAI tool call; args is a dict (dumped) or a raw string."""
    if not isinstance(args, str):
        args = json.dumps(args, ensure_ascii=False)
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def sys_(c):
    return {"role": "system", "content": c}


def user(c):
    return {"role": "user", "content": c}


def asst(c, reasoning=None, calls=None):
    m = {"role": "assistant", "content": c}
    if reasoning is not None:
        m["reasoning_content"] = reasoning
    if calls:
        m["tool_calls"] = calls
    return m


def tool(cid, c, name=None):
    m = {"role": "tool", "tool_call_id": cid, "content": c}
    if name:
        m["name"] = name
    return m


# ---- the hand-written cases ----

def case_adder(C):
    """add(name, messages, ...): appends one case, with the options model_chat_encode() takes, to C."""
    def add(name, messages, tools=None, thinking=False, effort="none", keep=False,
            response_format=None, tools_indent=None, continue_final=False):
        C.append(dict(name=name, messages=messages, tools=tools, thinking=thinking,
                      effort=effort, keep_thinking=keep, response_format=response_format,
                      tools_indent=tools_indent, continue_final=continue_final))

    return add


# The multi-turn conversation several cases render under different options.
MULTI = [sys_("S"), user("u1"), asst("a1", reasoning="r1"), user("u2"),
         asst("a2", reasoning="r2"), user("u3")]


def chat_cases(add):
    """Plain chat and thinking: systems, efforts, multi-turn histories, where the conversation ends."""
    add("single_user_chat", [user("Hello!")])
    add("single_user_thinking", [user("Hello!")], thinking=True)
    add("system_user_chat", [sys_("You are a helpful assistant."), user("What is 2+2?")])
    add("system_user_thinking", [sys_("You are a helpful assistant."), user("What is 2+2?")],
        thinking=True)
    add("empty_messages", [])
    add("empty_system_and_user", [sys_(""), user("")], thinking=True)
    add("null_system_content", [{"role": "system", "content": None}, user("hi")])
    add("effort_max_thinking", [sys_("Be precise."), user("Prove it.")], thinking=True,
        effort="max")
    add("effort_max_chat_ignored", [sys_("Be precise."), user("Prove it.")], effort="max")
    add("effort_high_thinking", [user("Think hard.")], thinking=True, effort="high")
    add("effort_max_no_system", [user("x")], thinking=True, effort="max")
    add("multiturn_chat", MULTI)
    add("multiturn_thinking_drop", MULTI, thinking=True)
    add("multiturn_thinking_keep", MULTI, thinking=True, keep=True)
    add("multiturn_thinking_no_reasoning", [user("u1"), asst("a1"), user("u2")], thinking=True)
    add("ends_with_assistant_thinking",
        [user("u1"), asst("a1", reasoning="r1"), user("u2"), asst("a2", reasoning="r2")],
        thinking=True)
    add("ends_with_assistant_chat", [user("u1"), asst("a1", reasoning="r1")])
    add("assistant_null_content", [user("u"), asst(None, reasoning="only thinking")],
        thinking=True)
    add("consecutive_users", [user("first"), user("second"), asst("ok"), user("third")])


def tool_cases(add):
    """Tools: definitions, calls and results in every order and form the encoder accepts."""
    add("tools_basic_chat", [sys_("You can use tools."), user("Weather in Paris?")],
        tools=[WEATHER])
    add("tools_basic_thinking", [sys_("You can use tools."), user("Weather in Paris?")],
        tools=[WEATHER], thinking=True)
    add("tools_no_system", [user("Weather in Paris?")], tools=[WEATHER, SEARCH], thinking=True)
    add("tools_nested_schemas", [sys_("Agent."), user("plan")], tools=[SEARCH, DEEP, CALC],
        tools_indent=2)
    add("tools_unicode", [user("翻译这句话：你好，世界！")], tools=[UNICODE_TOOL, NO_PARAMS],
        thinking=True)
    add("tools_empty_list", [user("no tools")], tools=[], thinking=True)
    add("tool_roundtrip_thinking", [
        sys_("You are a weather bot."), user("Weather in Beijing and Tokyo?"),
        asst("", reasoning="Need two lookups.", calls=[
            call("call_1", "get_weather", {"city": "Beijing"}),
            call("call_2", "get_weather", {"city": "Tokyo", "unit": "celsius"})]),
        tool("call_1", "{\"temp\": 21, \"sky\": \"clear\"}"),
        tool("call_2", "{\"temp\": 18, \"sky\": \"rain\"}"),
    ], tools=[WEATHER], thinking=True)
    add("tool_results_out_of_order", [
        user("Do three things."),
        asst("Working on it.", reasoning="three calls", calls=[
            call("a", "get_weather", {"city": "A"}),
            call("b", "web_search", {"query": "B", "top_k": 3}),
            call("c", "calculator", {"expression": "1+1"})]),
        tool("c", "2"), tool("a", "sunny"), tool("b", "results for B"),
        asst("All done.", reasoning="summarise"), user("thanks"),
    ], tools=[WEATHER, SEARCH, CALC], thinking=True)
    add("tool_results_out_of_order_chat", [
        user("Do three things."),
        asst(None, calls=[call("x1", "get_weather", {"city": "A"}),
                          call("x2", "get_weather", {"city": "B"})]),
        tool("x2", "B result"), tool("x1", "A result"),
    ], tools=[WEATHER])
    add("tool_result_unknown_id", [
        user("go"),
        asst("", calls=[call("k1", "get_weather", {"city": "A"}),
                        call("k2", "get_weather", {"city": "B"}),
                        call("k3", "get_weather", {"city": "C"})]),
        tool("k3", "C"), tool("zzz", "unknown"), tool("k2", "B"), tool("k1", "A"),
    ], tools=[WEATHER], thinking=True)
    add("tool_result_then_user_text", [
        user("go"), asst("", calls=[call("t1", "get_time", {}), call("t2", "get_time", "")]),
        tool("t2", "12:00"), tool("t1", "11:00"), user("and also this"),
    ], tools=[NO_PARAMS], thinking=True)
    add("tool_args_non_string", [
        user("make an event"),
        asst("", reasoning="filling fields", calls=[call("e1", "create_event", {
            "title": "Sync \"weekly\"\nline2",
            "attendees": [{"email": "a@b.c", "optional": True, "roles": []},
                          {"email": "d@e.f", "optional": False, "roles": ["host", "主持"]}],
            "when": {"start": 1.5, "duration_h": 0.25},
            "meta": None, "priority": -7, "ratio": 1e-07, "big": 1e+22,
            "tiny": 5e-324, "third": 0.1 + 0.2, "neg_zero": -0.0, "i": 0, "f": 100.0,
            "e16": 1e16, "e15": 1e15, "flag": False, "empty_obj": {}, "empty_arr": [],
            "unicode": "😀 naïve café", "ctrl": "a\u0001b\u001fc\u007fd"})]),
        tool("e1", "created"),
    ], tools=[DEEP], thinking=True)
    add("tool_args_raw_json_spacing", [
        user("x"),
        asst("", calls=[call("r1", "calculator",
                             '{ "expression" : "2*3",\n  "precision":1.0E2 , "n": 12 }')]),
    ], tools=[CALC])
    add("tool_args_invalid_json", [
        user("x"),
        asst("", calls=[call("bad", "calculator", "not json {")]),
        tool("bad", "error: bad arguments"),
    ], tools=[CALC], thinking=True)
    add("tool_args_empty_string", [
        user("time?"), asst("", calls=[call("t", "get_time", "")]), tool("t", "noon"),
    ], tools=[NO_PARAMS])
    add("tool_call_without_ids", [
        user("x"),
        asst("", calls=[{"type": "function", "function": {"name": "get_weather",
                                                           "arguments": "{\"city\": \"Q\"}"}},
                        {"type": "function", "function": {"name": "get_weather",
                                                           "arguments": "{\"city\": \"R\"}"}}]),
        {"role": "tool", "content": "R"}, {"role": "tool", "content": "Q"},
    ], tools=[WEATHER], thinking=True)
    add("multi_round_tools_thinking", [
        sys_("Agent"), user("Find X then compute."),
        asst("", reasoning="search first", calls=[call("s1", "web_search", {"query": "X"})]),
        tool("s1", "X = 42"),
        asst("", reasoning="now compute", calls=[call("c1", "calculator",
                                                      {"expression": "42*2"})]),
        tool("c1", "84"),
        asst("The answer is 84.", reasoning="done"),
        user("And half of it?"),
    ], tools=[SEARCH, CALC], thinking=True, effort="max")
    add("tools_with_content_and_calls", [
        user("x"), asst("Let me check.", reasoning="r", calls=[
            call("w", "get_weather", {"city": "Oslo"})]), tool("w", "cold"),
        asst("It is cold in Oslo.", reasoning="r2"),
    ], tools=[WEATHER], thinking=True)


def text_role_and_format_cases(add):
    """Unicode and tag-like text, the developer and latest_reminder roles, response_format, odd orders, long content, continue_final."""
    add("unicode_everywhere", [
        sys_("Ты — помощник. 你是助手。"), user("مرحبا 👋🏽 — ｜full-width｜ \u200b zero width"),
        asst("こんにちは", reasoning="思考中…"), user("e\u0301 vs é; tab\there\nnewline"),
    ], thinking=True, keep=True)
    add("special_looking_text", [
        user("what does </think> mean? and <think>? and <｜User｜>"),
        asst("It is a tag.", reasoning="the user types tags"), user("ok <tool_result>x"),
    ], thinking=True)
    add("developer_role_thinking", [
        sys_("sys"), user("u1"), asst("a1", reasoning="r1"),
        {"role": "developer", "content": "search-agent instructions"}, user("u2"),
    ], thinking=True)
    add("developer_last_thinking", [
        sys_("sys"), user("u1"), {"role": "developer", "content": "dev instructions"},
    ], thinking=True)
    add("developer_keep_chat", [
        {"role": "developer", "content": "dev"}, asst("a"), user("u"),
    ])
    add("latest_reminder", [
        sys_("sys"), {"role": "latest_reminder", "content": "Today is 2026-12-02."},
        user("What day is it?"),
    ], thinking=True)
    add("latest_reminder_after_user", [
        user("What day is it?"),
        {"role": "latest_reminder", "content": "Today is Wednesday."},
    ], thinking=True)
    add("latest_reminder_history", [
        user("u1"), {"role": "latest_reminder", "content": "rem"}, asst("a1", reasoning="r1"),
        user("u2"),
    ], thinking=True)
    add("response_format", [sys_("Reply in JSON."), user("Give me a person.")],
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": {
            "type": "object", "properties": {"name": {"type": "string"},
                                             "age": {"type": "integer"}}}}})
    add("response_format_and_tools_no_system", [user("x")], tools=[WEATHER], thinking=True,
        response_format={"type": "json_object"})
    add("assistant_first", [asst("I start."), user("ok")], thinking=True)
    add("system_last", [user("u"), asst("a"), sys_("late system")], thinking=True)
    add("long_content", [user("word " * 500), asst("y" * 1000, reasoning="z" * 700),
                         user("more " * 300)], thinking=True, keep=True)
    add("keep_thinking_chat_mode", MULTI, keep=True)
    add("continue_final_thinking", [user("u1"), asst("a1", reasoning="r1"), user("u2"),
                                    asst("The answer starts", reasoning="partial")],
        thinking=True, continue_final=True)
    add("continue_final_chat_tools", [user("x"), asst("Calling", calls=[
        call("z", "get_weather", {"city": "Rome"})])], tools=[WEATHER], continue_final=True)


def hand_cases():
    C = []
    add = case_adder(C)
    chat_cases(add)
    tool_cases(add)
    text_role_and_format_cases(add)
    return C


# ---- random conversations (fixed seed, so the file is reproducible) ----

WORDS = ["alpha", "beta", "gamma", "δέλτα", "日本", "😀", "x\ny", "\"q\"", "back\\slash", "",
         "tab\t", "<b>", "{json}", "  spaced  ", "end."]


def rnd_text(r, n=None):
    n = r.randint(0, 6) if n is None else n
    return " ".join(r.choice(WORDS) for _ in range(n))


def rnd_value(r, depth=0):
    k = r.randint(0, 7 if depth < 2 else 4)
    if k == 0:
        return rnd_text(r)
    if k == 1:
        return r.randint(-10**12, 10**12)
    if k == 2:
        return r.choice([0.5, -2.25, 3.14159, 1e-9, 6.02e23, 1e16, 123456.789, 2.0])
    if k == 3:
        return r.choice([True, False, None])
    if k == 4:
        return r.random() * 10 ** r.randint(-8, 20)
    if k == 5:
        return [rnd_value(r, depth + 1) for _ in range(r.randint(0, 3))]
    return {rnd_text(r, 1) or "k": rnd_value(r, depth + 1) for _ in range(r.randint(0, 3))}


def random_cases(n, seed):
    r = random.Random(seed)
    tools_pool = [WEATHER, SEARCH, CALC, UNICODE_TOOL, NO_PARAMS, DEEP]
    out = []
    for ci in range(n):
        msgs = []
        if r.random() < 0.7:
            msgs.append(sys_(rnd_text(r)))
        use_tools = r.random() < 0.6
        tools = r.sample(tools_pool, r.randint(1, 3)) if use_tools else None
        n_turns = r.randint(1, 4)
        for t in range(n_turns):
            if r.random() < 0.15:
                msgs.append({"role": "latest_reminder", "content": rnd_text(r) or "r"})
            msgs.append(user(rnd_text(r)))
            if r.random() < 0.1:
                msgs.append(user(rnd_text(r)))
            last = t == n_turns - 1
            if last and r.random() < 0.6:
                break
            steps = r.randint(1, 3) if use_tools else 1
            for s in range(steps):
                rc = rnd_text(r) if r.random() < 0.8 else None
                if use_tools and s < steps - 1 or (use_tools and r.random() < 0.3):
                    n_calls = r.randint(1, 3)
                    calls = []
                    for k in range(n_calls):
                        args = {rnd_text(r, 1) or "arg": rnd_value(r)
                                for _ in range(r.randint(0, 4))}
                        if r.random() < 0.1:
                            args = rnd_text(r) + "{"  # not JSON
                        calls.append(call(f"call_{ci}_{t}_{s}_{k}",
                                          r.choice(tools)["function"]["name"], args))
                    msgs.append(asst(rnd_text(r) if r.random() < 0.3 else "", rc, calls))
                    ids = [c["id"] for c in calls]
                    r.shuffle(ids)
                    for cid in ids:
                        msgs.append(tool(cid, rnd_text(r)))
                else:
                    msgs.append(asst(rnd_text(r), rc))
                    break
        out.append(dict(name=f"random_{ci:02d}", messages=msgs, tools=tools,
                        thinking=r.random() < 0.6, effort=r.choice(["none", "high", "max"]),
                        keep_thinking=r.random() < 0.2, response_format=None,
                        tools_indent=r.choice([None, 2]), continue_final=False))
    return out


def encode_case(enc, case):
    messages = copy.deepcopy(case["messages"])
    if case["tools"] or case["response_format"]:
        if not messages or messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": ""})
        if case["tools"]:
            messages[0]["tools"] = copy.deepcopy(case["tools"])
        if case["response_format"]:
            messages[0]["response_format"] = case["response_format"]
    if case["continue_final"]:
        messages[-1]["wo_eos"] = True
    effort = None if case["effort"] == "none" else case["effort"]
    return enc.encode_messages(messages, thinking_mode="thinking" if case["thinking"] else "chat",
                               drop_thinking=not case["keep_thinking"], reasoning_effort=effort)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--encoder", help="path to DeepSeek's encoding_dsv4.py; without it only the cases' "
                    "inputs are written (no \"expected\": what tests/model/test_chat_golden.py checks in CI)")
    ap.add_argument("--out", default=OUT_DEFAULT)
    ap.add_argument("--n-random", type=int, default=30)
    ap.add_argument("--seed", type=int, default=20261202)
    args = ap.parse_args()
    enc = load_encoder(args.encoder) if args.encoder else None

    cases = hand_cases() + random_cases(args.n_random, args.seed)
    out = []
    for c in cases:
        tools_json = None
        if c["tools"] is not None:
            tools_json = json.dumps(c["tools"], ensure_ascii=(c["tools_indent"] is None),
                                    indent=c["tools_indent"])
        out.append({
            "name": c["name"],
            "messages": c["messages"],
            "tools_json": tools_json,
            "response_format_json": (json.dumps(c["response_format"])
                                     if c["response_format"] is not None else None),
            "thinking": c["thinking"],
            "effort": c["effort"],
            "keep_thinking": c["keep_thinking"],
            "continue_final": c["continue_final"],
        })
        if enc:
            out[-1]["expected"] = encode_case(enc, c)
    names = [c["name"] for c in out]
    assert len(names) == len(set(names)), "duplicate case names"
    doc = {
        "comment": "autogenerated by scripts/gen_chat_golden.py from DeepSeek's encoding_dsv4.py; "
                   "do not edit",
        "cases": out,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(out)} cases to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
