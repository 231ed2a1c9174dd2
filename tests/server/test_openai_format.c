/*
 * tests/server/test_openai_format.c: the exact bytes of SSE chunks and
 * response fragments (server/openai_format.h): chat deltas of every kind,
 * completion chunks, the usage chunk, [DONE], error events, invalid UTF-8
 * replaced, logprob numbers, completions logprobs arrays, prompt
 * log-probabilities (echo's leading entries, vLLM's prompt_logprobs).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/exec.h"
#include "server/openai_format.h"
#include "tests/test.h"

#define HEAD_CHAT "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":42,\"model\":\"m\"," \
		  "\"system_fingerprint\":null,\"choices\":["

static void expect(struct strbuf *b, const char *want)
{
	const char *got = strbuf_cstr(b);
	T_CHECKF(!strcmp(got, want), "\n got: %s\nwant: %s", got, want);
	strbuf_reset(b);
}

static void test_chat_chunks(void)
{
	struct strbuf b;
	strbuf_init(&b);
	struct oai_head h = {.id = "chatcmpl-1", .created = 42, .model = "m", .chat = true};
	struct oai_delta d = {.kind = OAI_DELTA_ROLE};
	oai_sse_chat_chunk(&b, &h, 0, &d);
	expect(&b, HEAD_CHAT "{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,"
			     "\"finish_reason\":null}]}\n\n");
	d = (struct oai_delta){.kind = OAI_DELTA_CONTENT, .text = "a\"b\n", .len = 4};
	oai_sse_chat_chunk(&b, &h, 1, &d);
	expect(&b, HEAD_CHAT "{\"index\":1,\"delta\":{\"content\":\"a\\\"b\\n\"},\"logprobs\":null,"
			     "\"finish_reason\":null}]}\n\n");
	d = (struct oai_delta){.kind = OAI_DELTA_REASONING, .text = "th", .len = 2};
	oai_sse_chat_chunk(&b, &h, 0, &d);
	expect(&b, HEAD_CHAT "{\"index\":0,\"delta\":{\"reasoning_content\":\"th\",\"reasoning\":\"th\"},"
			     "\"logprobs\":null,\"finish_reason\":null}]}\n\n");
	d = (struct oai_delta){.kind = OAI_DELTA_TOOL_START, .tool_index = 2, .tool_id = "call_x", .tool_name = "f"};
	oai_sse_chat_chunk(&b, &h, 0, &d);
	expect(&b, HEAD_CHAT "{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":2,\"id\":\"call_x\",\"type\":\"function\","
			     "\"function\":{\"name\":\"f\",\"arguments\":\"\"}}]},\"logprobs\":null,\"finish_reason\":null}]}\n\n");
	d = (struct oai_delta){.kind = OAI_DELTA_TOOL_ARGS, .tool_index = 2, .text = "{\"a\":", .len = 5};
	oai_sse_chat_chunk(&b, &h, 0, &d);
	expect(&b, HEAD_CHAT "{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":2,\"function\":{\"arguments\":"
			     "\"{\\\"a\\\":\"}}]},\"logprobs\":null,\"finish_reason\":null}]}\n\n");
	h.usage_null = true;
	d = (struct oai_delta){.kind = OAI_DELTA_EMPTY, .finish_reason = "stop", .logprobs_json = "{\"content\":[]}"};
	oai_sse_chat_chunk(&b, &h, 0, &d);
	expect(&b, HEAD_CHAT "{\"index\":0,\"delta\":{},\"logprobs\":{\"content\":[]},\"finish_reason\":\"stop\"}],"
			     "\"usage\":null}\n\n");
	struct oai_usage u = {.prompt_tokens = 5, .completion_tokens = 3, .cached_tokens = 2};
	oai_sse_usage_chunk(&b, &h, &u);
	expect(&b, HEAD_CHAT "],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3,\"total_tokens\":8,"
			     "\"prompt_tokens_details\":{\"cached_tokens\":2}}}\n\n");
	oai_sse_done(&b);
	expect(&b, "data: [DONE]\n\n");
	oai_sse_error(&b, 500, NULL, "boom \"x\"");
	expect(&b, "data: {\"error\":{\"message\":\"boom \\\"x\\\"\",\"type\":\"server_error\",\"param\":null,"
		   "\"code\":null}}\n\n");
	oai_sse_error(&b, 400, "invalid_value", "x");
	expect(&b, "data: {\"error\":{\"message\":\"x\",\"type\":\"invalid_request_error\",\"param\":null,"
		   "\"code\":\"invalid_value\"}}\n\n");
	T_CHECK(!strbuf_failed(&b));
	strbuf_free(&b);
}

static void test_completion_chunks(void)
{
	struct strbuf b;
	strbuf_init(&b);
	struct oai_head h = {.id = "cmpl-9", .created = 1, .model = "tiny", .chat = false};
	oai_sse_completion_chunk(&b, &h, 3, "xy", 2, NULL, NULL);
	expect(&b, "data: {\"id\":\"cmpl-9\",\"object\":\"text_completion\",\"created\":1,\"model\":\"tiny\","
		   "\"system_fingerprint\":null,\"choices\":[{\"index\":3,\"text\":\"xy\",\"logprobs\":null,"
		   "\"finish_reason\":null}]}\n\n");
	oai_sse_completion_chunk(&b, &h, 0, "", 0, NULL, "length");
	expect(&b, "data: {\"id\":\"cmpl-9\",\"object\":\"text_completion\",\"created\":1,\"model\":\"tiny\","
		   "\"system_fingerprint\":null,\"choices\":[{\"index\":0,\"text\":\"\",\"logprobs\":null,"
		   "\"finish_reason\":\"length\"}]}\n\n");
	strbuf_free(&b);
}

static void test_text_and_numbers(void)
{
	struct strbuf b;
	strbuf_init(&b);
	oai_json_text(&b, "ok \xC3\xA9", 5);
	expect(&b, "\"ok \xC3\xA9\"");
	oai_json_text(&b, "a\xC3" "b", 3); /* truncated 2-byte sequence */
	expect(&b, "\"a\xEF\xBF\xBD" "b\"");
	oai_json_text(&b, "\xFF\xFE", 2);
	expect(&b, "\"\xEF\xBF\xBD\xEF\xBF\xBD\"");
	oai_json_text(&b, "\xE2\x82", 2); /* one maximal subpart -> one U+FFFD */
	expect(&b, "\"\xEF\xBF\xBD\"");
	oai_json_text(&b, "\x01\t", 2);
	expect(&b, "\"\\u0001\\t\"");
	oai_json_logprob(&b, -INFINITY);
	expect(&b, "-9999.0");
	oai_json_logprob(&b, NAN);
	expect(&b, "-9999.0");
	oai_json_logprob(&b, -0.5f);
	expect(&b, "-0.5");
	oai_json_logprob(&b, 0.0f);
	expect(&b, "0");
	strbuf_free(&b);
}

static void test_logprobs(void)
{
	struct strbuf b;
	strbuf_init(&b);
	/* Without a tokenizer tokens render as "" with no bytes (shape only). */
	struct kern_sample_out s = {.token_id = 7, .logprob = -1.25f, .n_top = 2, .top_ids = {7, 3},
				    .top_logprobs = {-1.25f, -2.5f}};
	oai_chat_logprob_entry(&b, NULL, 7, &s, 2);
	expect(&b, "{\"token\":\"\",\"logprob\":-1.25,\"bytes\":[],\"top_logprobs\":[{\"token\":\"\",\"logprob\":-1.25,"
		   "\"bytes\":[]},{\"token\":\"\",\"logprob\":-2.5,\"bytes\":[]}]}");
	oai_chat_logprob_entry(&b, NULL, 7, &s, 0);
	expect(&b, "{\"token\":\"\",\"logprob\":-1.25,\"bytes\":[],\"top_logprobs\":[]}");

	struct oai_compl_logprobs c;
	oai_compl_logprobs_init(&c);
	oai_compl_logprobs_add(&c, NULL, 7, &s, 1, 0);
	oai_compl_logprobs_add(&c, NULL, 3, &s, 0, 4);
	oai_compl_logprobs_render(&c, &b, false);
	expect(&b, "{\"tokens\":[\"\",\"\"],\"token_logprobs\":[-1.25,-1.25],\"top_logprobs\":[{\"\":-1.25},{}],"
		   "\"text_offset\":[0,4]}");
	oai_compl_logprobs_render(&c, &b, true);
	strbuf_reset(&b);
	oai_compl_logprobs_render(&c, &b, false);
	expect(&b, "{\"tokens\":[],\"token_logprobs\":[],\"top_logprobs\":[],\"text_offset\":[]}");
	oai_compl_logprobs_free(&c);
	strbuf_free(&b);
}

/* Without a tokenizer: the shapes (pieces render as ""). */
static void test_prompt_logprobs(void)
{
	struct strbuf b;
	strbuf_init(&b);
	int32_t prompt[3] = {5, 9, 2};
	float lp[3] = {0, -1.5f, -0.25f}, top_lp[6] = {0, 0, -0.5f, -1.5f, -0.25f, -3.0f};
	int32_t rank[3] = {0, 2, 1}, top_ids[6] = {0, 0, 4, 9, 2, 7};
	struct exec_prompt_lp p = {.n_top = 2, .logprob = lp, .rank = rank, .top_ids = top_ids, .top_logprobs = top_lp};
	oai_prompt_logprobs_json(&b, NULL, prompt, 3, &p);
	/* the prompt token first with its rank, then the top entries other than it */
	expect(&b, "[null,{\"9\":{\"logprob\":-1.5,\"rank\":2,\"decoded_token\":\"\"},\"4\":{\"logprob\":-0.5,"
		   "\"rank\":1,\"decoded_token\":\"\"}},{\"2\":{\"logprob\":-0.25,\"rank\":1,\"decoded_token\":\"\"},"
		   "\"7\":{\"logprob\":-3,\"rank\":2,\"decoded_token\":\"\"}}]");
	struct oai_compl_logprobs c;
	oai_compl_logprobs_init(&c);
	T_CHECK(oai_compl_logprobs_add_prompt(&c, NULL, prompt, 3, &p, 1) == 0);
	struct kern_sample_out s = {.token_id = 8, .logprob = -2.0f, .n_top = 1, .top_ids = {8},
				    .top_logprobs = {-2.0f}};
	oai_compl_logprobs_add(&c, NULL, 8, &s, 1, 0);
	oai_compl_logprobs_render(&c, &b, false);
	expect(&b, "{\"tokens\":[\"\",\"\",\"\",\"\"],\"token_logprobs\":[null,-1.5,-0.25,-2],"
		   "\"top_logprobs\":[null,{\"\":-0.5},{\"\":-0.25},{\"\":-2}],\"text_offset\":[0,0,0,0]}");
	oai_compl_logprobs_free(&c);
	strbuf_free(&b);
}

int main(void)
{
	test_prompt_logprobs();
	test_chat_chunks();
	test_completion_chunks();
	test_text_and_numbers();
	test_logprobs();
	return test_exit();
}
