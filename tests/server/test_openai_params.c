/*
 * tests/server/test_openai_params.c: request parsing and validation at the
 * edge: every parameter's accepted form lands in the typed struct, and every
 * refusal is a 400 naming the parameter. Also random-byte bodies (must be
 * refused or parsed, never crash) built from a fresh seed each run.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/openai_params.h"
#include "tests/test.h"

#define VOCAB 1000

static const char *MSG = "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]";

static bool parse(enum oai_kind kind, const char *body, struct oai_request *r, struct oai_error *why)
{
	return oai_parse_request(kind, body, strlen(body), VOCAB, r, why) == ST_OK;
}

/* Chat body with MSG plus extra fields. */
static char *chat(const char *extra)
{
	static char buf[8192];
	snprintf(buf, sizeof buf, "{%s%s%s}", MSG, extra[0] ? "," : "", extra);
	return buf;
}

static void expect_refused(enum oai_kind kind, const char *body, const char *param)
{
	struct oai_request r;
	struct oai_error why;
	bool ok = parse(kind, body, &r, &why);
	T_CHECKF(!ok, "accepted: %s", body);
	if (ok) {
		oai_request_free(&r);
		return;
	}
	T_CHECKF(why.status == 400, "status %d for %s", why.status, body);
	T_CHECKF(!strcmp(why.param, param), "param '%s' (want '%s') for %s: %s", why.param, param, body, why.message);
	T_CHECKF(why.message[0] != '\0', "empty message for %s", body);
}

static void test_defaults(void)
{
	struct oai_request r;
	struct oai_error why;
	T_CHECK(parse(OAI_CHAT, chat(""), &r, &why));
	T_CHECK(r.kind == OAI_CHAT && r.n == 1 && !r.stream && !r.include_usage && r.max_tokens == 0);
	T_CHECK(r.sampling.temperature == 1.0f && r.sampling.top_p == 1.0f && r.sampling.top_k == 0);
	T_CHECK(r.sampling.min_p == 0 && r.sampling.presence_penalty == 0 && r.sampling.frequency_penalty == 0);
	T_CHECK(r.sampling.repetition_penalty == 1.0f && !r.has_seed && !r.logprobs && !r.thinking);
	T_CHECK(r.n_messages == 1 && r.messages[0].role == MODEL_CHAT_ROLE_USER && !strcmp(r.messages[0].content, "hi"));
	T_CHECK(r.tools_json == NULL && r.n_stop == 0 && r.model == NULL && r.include_reasoning);
	oai_request_free(&r);
}

static void test_every_parameter(void)
{
	struct oai_request r;
	struct oai_error why;
	const char *body = chat(
		"\"model\":\"m\",\"stream\":true,\"stream_options\":{\"include_usage\":true},\"n\":3,"
		"\"max_tokens\":7,\"max_completion_tokens\":9,\"temperature\":0.5,\"top_p\":0.25,\"top_k\":40,"
		"\"min_p\":0.1,\"seed\":-5,\"presence_penalty\":1.5,\"frequency_penalty\":-1,\"repetition_penalty\":1.2,"
		"\"logit_bias\":{\"5\":-100,\"999\":2.5},\"stop\":[\"a\",\"bc\"],\"stop_token_ids\":[1,2],"
		"\"ignore_eos\":true,\"logprobs\":true,\"top_logprobs\":4,\"priority\":0,\"cache_salt\":\"t1\","
		"\"min_tokens\":5,\"include_stop_str_in_output\":true,\"skip_special_tokens\":false,\"parallel_tool_calls\":true,"
		"\"response_format\":{\"type\":\"text\"},\"user\":\"u\",\"metadata\":{},\"store\":false,"
		"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}],"
		"\"tool_choice\":\"auto\",\"reasoning_effort\":\"max\",\"include_reasoning\":false");
	T_CHECKF(parse(OAI_CHAT, body, &r, &why), "%s", why.message);
	T_CHECK(r.model && !strcmp(r.model, "m") && r.stream && r.include_usage && r.n == 3);
	T_CHECK(r.max_tokens == 9); /* max_completion_tokens wins */
	T_CHECK(!r.skip_special_tokens);
	T_CHECK(r.sampling.temperature == 0.5f && r.sampling.top_p == 0.25f && r.sampling.top_k == 40);
	T_CLOSE(r.sampling.min_p, 0.1, 1e-6, 0);
	T_CHECK(r.has_seed && r.sampling.seed == (uint64_t)(int64_t)-5);
	T_CHECK(r.sampling.presence_penalty == 1.5f && r.sampling.frequency_penalty == -1.0f);
	T_CLOSE(r.sampling.repetition_penalty, 1.2, 1e-6, 0);
	T_CHECK(r.sampling.n_logit_bias == 2 && r.sampling.logit_bias[0].token_id == 5 &&
		r.sampling.logit_bias[0].bias == -100.0f && r.sampling.logit_bias[1].token_id == 999);
	T_CHECK(r.n_stop == 2 && !strcmp(r.stop[0], "a") && !strcmp(r.stop[1], "bc"));
	T_CHECK(r.n_stop_token_ids == 2 && r.stop_token_ids[1] == 2 && r.ignore_eos);
	T_CHECK(r.logprobs && r.top_logprobs == 4 && r.sampling.logprobs && r.sampling.top_logprobs == 4);
	T_CHECK(r.cache_salt != 0 && r.min_tokens == 5 && r.include_stop_str_in_output);
	T_CHECK(r.tools_json && strstr(r.tools_json, "\"name\":\"f\"") && r.n_tools == 1);
	T_CHECK(r.thinking && r.effort == MODEL_CHAT_EFFORT_MAX && !r.include_reasoning);
	oai_request_free(&r);

	/* max_tokens alone; thinking switches. */
	T_CHECK(parse(OAI_CHAT, chat("\"max_tokens\":11,\"chat_template_kwargs\":{\"thinking\":true}"), &r, &why));
	T_CHECK(r.max_tokens == 11 && r.thinking && r.effort == MODEL_CHAT_EFFORT_NONE);
	oai_request_free(&r);
	T_CHECK(parse(OAI_CHAT, chat("\"reasoning_effort\":\"high\",\"chat_template_kwargs\":{\"enable_thinking\":false}"),
		      &r, &why));
	T_CHECK(!r.thinking && r.effort == MODEL_CHAT_EFFORT_NONE); /* the explicit switch wins */
	oai_request_free(&r);
	T_CHECK(parse(OAI_CHAT, chat("\"thinking\":{\"type\":\"enabled\"},\"reasoning_effort\":\"low\""), &r, &why));
	T_CHECK(r.thinking && r.effort == MODEL_CHAT_EFFORT_HIGH);
	oai_request_free(&r);
	T_CHECK(parse(OAI_CHAT, chat("\"reasoning_effort\":\"none\""), &r, &why));
	T_CHECK(!r.thinking);
	oai_request_free(&r);
	T_CHECK(parse(OAI_CHAT, chat("\"stop\":\"END\",\"tool_choice\":\"none\",\"top_k\":-1,\"temperature\":0"), &r, &why));
	T_CHECK(r.n_stop == 1 && !strcmp(r.stop[0], "END") && r.tool_choice == OAI_TOOL_NONE && r.sampling.top_k == 0);
	T_CHECK(r.sampling.temperature == 0.0f);
	oai_request_free(&r);
	/* null means absent */
	T_CHECK(parse(OAI_CHAT, chat("\"temperature\":null,\"stop\":null,\"tools\":null,\"seed\":null"), &r, &why));
	T_CHECK(r.sampling.temperature == 1.0f && !r.has_seed && !r.n_stop);
	oai_request_free(&r);
	/* integers written as 2.0 */
	T_CHECK(parse(OAI_CHAT, chat("\"n\":2.0"), &r, &why) && r.n == 2);
	oai_request_free(&r);
}

static void test_messages(void)
{
	struct oai_request r;
	struct oai_error why;
	const char *body =
		"{\"messages\":["
		"{\"role\":\"system\",\"content\":\"sys\"},"
		"{\"role\":\"developer\",\"content\":[{\"type\":\"text\",\"text\":\"d1\"},{\"type\":\"text\",\"text\":\"d2\"}]},"
		"{\"role\":\"user\",\"content\":\"u\",\"name\":\"bob\"},"
		"{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"why\",\"refusal\":null,\"tool_calls\":["
		"{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}},"
		"{\"id\":\"c2\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":{\"b\":2}}}]},"
		"{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"r1\"},"
		"{\"role\":\"assistant\",\"content\":\"ok\",\"reasoning\":\"alias\"}]}";
	T_CHECKF(parse(OAI_CHAT, body, &r, &why), "%s", why.message);
	T_CHECK(r.n_messages == 6);
	T_CHECK(r.messages[0].role == MODEL_CHAT_ROLE_SYSTEM && r.messages[1].role == MODEL_CHAT_ROLE_SYSTEM);
	T_CHECK(!strcmp(r.messages[1].content, "d1\nd2"));
	T_CHECK(r.messages[2].name && !strcmp(r.messages[2].name, "bob"));
	T_CHECK(r.messages[3].role == MODEL_CHAT_ROLE_ASSISTANT && r.messages[3].content == NULL);
	T_CHECK(!strcmp(r.messages[3].reasoning_content, "why") && r.messages[3].n_tool_calls == 2);
	T_CHECK(!strcmp(r.messages[3].tool_calls[0].arguments_json, "{\"a\":1}"));
	T_CHECK(!strcmp(r.messages[3].tool_calls[1].arguments_json, "{\"b\":2}"));
	T_CHECK(!strcmp(r.messages[3].tool_calls[1].id, "c2") && !strcmp(r.messages[3].tool_calls[1].name, "g"));
	T_CHECK(r.messages[4].role == MODEL_CHAT_ROLE_TOOL && !strcmp(r.messages[4].tool_call_id, "c1"));
	T_CHECK(!strcmp(r.messages[5].reasoning_content, "alias"));
	oai_request_free(&r);

	T_CHECK(parse(OAI_CHAT,
		      "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"par\"}],"
		      "\"continue_final_message\":true,\"add_generation_prompt\":false}",
		      &r, &why));
	T_CHECK(r.continue_final);
	oai_request_free(&r);
}

static void test_completions(void)
{
	struct oai_request r;
	struct oai_error why;
	T_CHECK(parse(OAI_COMPLETION, "{\"prompt\":\"abc\",\"echo\":true,\"max_tokens\":3,\"best_of\":1}", &r, &why));
	T_CHECK(r.n_prompts == 1 && r.prompts[0].text && r.prompts[0].text_len == 3 && r.echo);
	oai_request_free(&r);
	T_CHECK(parse(OAI_COMPLETION, "{\"prompt\":[1,2,3],\"logprobs\":5}", &r, &why));
	T_CHECK(r.n_prompts == 1 && r.prompts[0].n_ids == 3 && r.prompts[0].ids[2] == 3);
	T_CHECK(r.logprobs && r.top_logprobs == 5);
	oai_request_free(&r);
	T_CHECK(parse(OAI_COMPLETION, "{\"prompt\":[\"a\",\"b\",\"c\"],\"n\":2,\"best_of\":2}", &r, &why));
	T_CHECK(r.n_prompts == 3 && r.n == 2 && !strcmp(r.prompts[2].text, "c"));
	oai_request_free(&r);
	T_CHECK(parse(OAI_COMPLETION, "{\"prompt\":[[1],[2,3]],\"logprobs\":0}", &r, &why));
	T_CHECK(r.n_prompts == 2 && r.prompts[1].n_ids == 2 && r.logprobs && r.top_logprobs == 0);
	oai_request_free(&r);
	T_CHECK(parse(OAI_COMPLETION, "{\"prompt\":\"a\\u0000b\"}", &r, &why));
	T_CHECK(r.prompts[0].text_len == 3);
	oai_request_free(&r);
}

/* Bodies that are no JSON object, and fields unknown or unimplemented, by name. */
static void test_refusals_body(void)
{
	expect_refused(OAI_CHAT, "", "");
	expect_refused(OAI_CHAT, "{", "");
	expect_refused(OAI_CHAT, "[1]", "");
	expect_refused(OAI_CHAT, "{\"messages\":[],\"messages\":[]}", "");
	/* Unknown and unimplemented fields, by name. */
	expect_refused(OAI_CHAT, chat("\"frobnicate\":1"), "frobnicate");
	expect_refused(OAI_CHAT, chat("\"use_beam_search\":true"), "use_beam_search");
	expect_refused(OAI_CHAT, chat("\"functions\":[]"), "functions");
	expect_refused(OAI_CHAT, chat("\"prompt\":\"x\""), "prompt");
	expect_refused(OAI_CHAT, chat("\"echo\":true"), "echo");
	expect_refused(OAI_CHAT, chat("\"response_format\":{\"type\":\"xml\"}"), "response_format");
	expect_refused(OAI_CHAT, chat("\"guided_regex\":\"a+\""), "guided_regex");
	expect_refused(OAI_CHAT, chat("\"guided_choice\":[]"), "guided_choice");
}

/* Structured outputs and tool choices that are accepted (server/openai_structured.c compiles them). */
static void test_structured_accepted(void)
{
	struct oai_request r;
	struct oai_error why;
	T_CHECK(parse(OAI_CHAT, chat("\"response_format\":{\"type\":\"json_object\"}"), &r, &why));
	T_CHECK(r.format == OAI_FORMAT_JSON_OBJECT && r.response_format_json);
	oai_request_free(&r);
	T_CHECK(parse(OAI_CHAT, chat("\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\","
				     "\"schema\":{\"type\":\"integer\"},\"strict\":true}}"), &r, &why));
	T_CHECK(r.format == OAI_FORMAT_JSON_SCHEMA && strstr(r.format_schema, "integer"));
	oai_request_free(&r);
	T_CHECK(parse(OAI_COMPLETION, "{\"prompt\":\"x\",\"guided_choice\":[\"a\",\"b\"]}", &r, &why));
	T_CHECK(r.format == OAI_FORMAT_CHOICE && r.n_format_choices == 2 && !strcmp(r.format_choices[1], "b"));
	oai_request_free(&r);
	T_CHECK(parse(OAI_CHAT, chat("\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
				     "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}"), &r, &why));
	T_CHECK(r.tool_choice == OAI_TOOL_NAMED && !strcmp(r.tool_choice_name, "f"));
	oai_request_free(&r);
	T_CHECK(parse(OAI_CHAT, chat("\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
				     "\"tool_choice\":\"required\""), &r, &why));
	T_CHECK(r.tool_choice == OAI_TOOL_REQUIRED);
	oai_request_free(&r);
}

/* Output options in a form or combination that is refused. */
static void test_refusals_options(void)
{
	expect_refused(OAI_CHAT, chat("\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{}}"), "response_format");
	expect_refused(OAI_CHAT, chat("\"response_format\":\"text\""), "response_format");
	expect_refused(OAI_CHAT, chat("\"tool_choice\":\"required\""), "tool_choice");
	expect_refused(OAI_CHAT, chat("\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}"), "tool_choice");
	expect_refused(OAI_CHAT, chat("\"tool_choice\":\"sometimes\""), "tool_choice");
	expect_refused(OAI_CHAT, chat("\"parallel_tool_calls\":false"), "parallel_tool_calls");
	expect_refused(OAI_CHAT, chat("\"min_tokens\":3,\"max_tokens\":2"), "min_tokens");
	expect_refused(OAI_CHAT, chat("\"min_tokens\":-1"), "min_tokens");
	expect_refused(OAI_CHAT, chat("\"include_stop_str_in_output\":1"), "include_stop_str_in_output");
	expect_refused(OAI_CHAT, chat("\"skip_special_tokens\":0"), "skip_special_tokens");
	expect_refused(OAI_CHAT, chat("\"spaces_between_special_tokens\":\"yes\""), "spaces_between_special_tokens");
	expect_refused(OAI_CHAT, chat("\"modalities\":[\"text\",\"audio\"]"), "modalities");
	expect_refused(OAI_CHAT, chat("\"stream_options\":{\"include_usage\":true}"), "stream_options");
	expect_refused(OAI_CHAT, chat("\"stream\":true,\"stream_options\":{\"continuous_usage_stats\":true}"),
		       "stream_options.continuous_usage_stats");
	expect_refused(OAI_CHAT, chat("\"stream\":true,\"stream_options\":{\"x\":1}"), "stream_options");
	expect_refused(OAI_CHAT, chat("\"stream\":true,\"stream_options\":3"), "stream_options");
	expect_refused(OAI_CHAT, chat("\"chat_template_kwargs\":{\"other\":1}"), "chat_template_kwargs");
	expect_refused(OAI_CHAT, chat("\"chat_template_kwargs\":[]"), "chat_template_kwargs");
	expect_refused(OAI_CHAT, chat("\"add_generation_prompt\":false"), "add_generation_prompt");
	expect_refused(OAI_CHAT, chat("\"continue_final_message\":true"), "continue_final_message");
}

/* Sampling and length parameters of the wrong type or out of range. */
static void test_refusals_ranges(void)
{
	expect_refused(OAI_CHAT, chat("\"model\":3"), "model");
	expect_refused(OAI_CHAT, chat("\"stream\":\"yes\""), "stream");
	expect_refused(OAI_CHAT, chat("\"n\":0"), "n");
	expect_refused(OAI_CHAT, chat("\"n\":129"), "n");
	expect_refused(OAI_CHAT, chat("\"n\":1.5"), "n");
	expect_refused(OAI_CHAT, chat("\"max_tokens\":0"), "max_tokens");
	expect_refused(OAI_CHAT, chat("\"max_tokens\":-1"), "max_tokens");
	expect_refused(OAI_CHAT, chat("\"max_tokens\":100000000"), "max_tokens");
	expect_refused(OAI_CHAT, chat("\"max_completion_tokens\":\"5\""), "max_completion_tokens");
	expect_refused(OAI_CHAT, chat("\"temperature\":-0.1"), "temperature");
	expect_refused(OAI_CHAT, chat("\"temperature\":2.5"), "temperature");
	expect_refused(OAI_CHAT, chat("\"temperature\":\"hot\""), "temperature");
	expect_refused(OAI_CHAT, chat("\"top_p\":0"), "top_p");
	expect_refused(OAI_CHAT, chat("\"top_p\":1.5"), "top_p");
	expect_refused(OAI_CHAT, chat("\"top_k\":-2"), "top_k");
	expect_refused(OAI_CHAT, chat("\"min_p\":1.5"), "min_p");
	expect_refused(OAI_CHAT, chat("\"seed\":\"x\""), "seed");
	expect_refused(OAI_CHAT, chat("\"presence_penalty\":3"), "presence_penalty");
	expect_refused(OAI_CHAT, chat("\"frequency_penalty\":-3"), "frequency_penalty");
	expect_refused(OAI_CHAT, chat("\"repetition_penalty\":0"), "repetition_penalty");
	expect_refused(OAI_CHAT, chat("\"repetition_penalty\":3"), "repetition_penalty");
}

/* Logit bias, stop lists, log-probabilities, reasoning and tool fields refused. */
static void test_refusals_lists(void)
{
	expect_refused(OAI_CHAT, chat("\"logit_bias\":[]"), "logit_bias");
	expect_refused(OAI_CHAT, chat("\"logit_bias\":{\"x\":1}"), "logit_bias");
	expect_refused(OAI_CHAT, chat("\"logit_bias\":{\"1000\":1}"), "logit_bias");
	expect_refused(OAI_CHAT, chat("\"logit_bias\":{\"-1\":1}"), "logit_bias");
	expect_refused(OAI_CHAT, chat("\"logit_bias\":{\"1\":101}"), "logit_bias");
	expect_refused(OAI_CHAT, chat("\"stop\":3"), "stop");
	expect_refused(OAI_CHAT, chat("\"stop\":[\"\"]"), "stop");
	expect_refused(OAI_CHAT, chat("\"stop\":[1]"), "stop");
	expect_refused(OAI_CHAT,
		       chat("\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\",\"11\",\"12\",\"13\","
			    "\"14\",\"15\",\"16\",\"17\"]"),
		       "stop");
	expect_refused(OAI_CHAT, chat("\"stop_token_ids\":[1000]"), "stop_token_ids");
	expect_refused(OAI_CHAT, chat("\"stop_token_ids\":\"1\""), "stop_token_ids");
	expect_refused(OAI_CHAT, chat("\"ignore_eos\":1"), "ignore_eos");
	expect_refused(OAI_CHAT, chat("\"logprobs\":3"), "logprobs");
	expect_refused(OAI_CHAT, chat("\"top_logprobs\":2"), "top_logprobs");
	expect_refused(OAI_CHAT, chat("\"logprobs\":true,\"top_logprobs\":21"), "top_logprobs");
	expect_refused(OAI_CHAT, chat("\"priority\":\"high\""), "priority");
	expect_refused(OAI_CHAT, chat("\"cache_salt\":5"), "cache_salt");
	expect_refused(OAI_CHAT, chat("\"reasoning_effort\":\"extreme\""), "reasoning_effort");
	expect_refused(OAI_CHAT, chat("\"reasoning_effort\":1"), "reasoning_effort");
	expect_refused(OAI_CHAT, chat("\"thinking\":{\"type\":\"maybe\"}"), "thinking");
	expect_refused(OAI_CHAT, chat("\"include_reasoning\":\"no\""), "include_reasoning");
	expect_refused(OAI_CHAT, chat("\"tools\":{}"), "tools");
	expect_refused(OAI_CHAT, chat("\"tools\":[{\"type\":\"code_interpreter\"}]"), "tools");
	expect_refused(OAI_CHAT, chat("\"tools\":[{\"type\":\"function\",\"function\":{}}]"), "tools");
	expect_refused(OAI_CHAT,
		       chat("\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":3}}]"), "tools");
}

/* Malformed messages, naming the field inside the message. */
static void test_refusals_messages(void)
{
	expect_refused(OAI_CHAT, "{}", "messages");
	expect_refused(OAI_CHAT, "{\"messages\":[]}", "messages");
	expect_refused(OAI_CHAT, "{\"messages\":{}}", "messages");
	expect_refused(OAI_CHAT, "{\"messages\":[3]}", "messages");
	expect_refused(OAI_CHAT, "{\"messages\":[{\"content\":\"x\"}]}", "messages.role");
	expect_refused(OAI_CHAT, "{\"messages\":[{\"role\":\"function\",\"content\":\"x\"}]}", "messages.role");
	expect_refused(OAI_CHAT, "{\"messages\":[{\"role\":\"user\"}]}", "messages.content");
	expect_refused(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":3}]}", "messages.content");
	expect_refused(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]}", "messages.content");
	expect_refused(OAI_CHAT,
		       "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{}}]}]}",
		       "messages.content");
	expect_refused(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}",
		       "messages.content");
	expect_refused(OAI_CHAT, "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":3}]}", "messages.tool_calls");
	expect_refused(OAI_CHAT, "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"type\":\"function\"}]}]}",
		       "messages.tool_calls");
	expect_refused(OAI_CHAT,
		       "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\","
		       "\"arguments\":5}}]}]}",
		       "messages.tool_calls.function.arguments");
	expect_refused(OAI_CHAT, "{\"messages\":[{\"role\":\"tool\",\"content\":\"x\",\"tool_call_id\":1}]}",
		       "messages.tool_call_id");
}

/* Completion-only refusals. */
static void test_refusals_completion(void)
{
	expect_refused(OAI_COMPLETION, "{}", "prompt");
	expect_refused(OAI_COMPLETION, "{\"prompt\":3}", "prompt");
	expect_refused(OAI_COMPLETION, "{\"prompt\":[[]]}", "prompt");
	expect_refused(OAI_COMPLETION, "{\"prompt\":[1000]}", "prompt");
	expect_refused(OAI_COMPLETION, "{\"prompt\":[\"a\",3]}", "prompt");
	expect_refused(OAI_COMPLETION, "{\"prompt\":\"x\",\"messages\":[]}", "messages");
	expect_refused(OAI_COMPLETION, "{\"prompt\":\"x\",\"suffix\":\"y\"}", "suffix");
	expect_refused(OAI_COMPLETION, "{\"prompt\":\"x\",\"best_of\":3}", "best_of");
	expect_refused(OAI_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":true}", "logprobs");
	expect_refused(OAI_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":21}", "logprobs");
}

/* Prompt log-probabilities (evaluation): echo + logprobs, max_tokens 0,
 * prompt_logprobs, accepted and refused; then the chat-only fields and too
 * many prompts refused on completions. */
static void test_prompt_logprobs(void)
{
	struct oai_request r;
	struct oai_error why;
	T_CHECK(parse(OAI_COMPLETION, "{\"prompt\":[1,2],\"echo\":true,\"logprobs\":1,\"max_tokens\":0}", &r, &why));
	T_CHECK(r.echo && r.logprobs && r.top_logprobs == 1 && r.score_only && !r.max_tokens && !r.prompt_logprobs);
	oai_request_free(&r);
	T_CHECK(parse(OAI_COMPLETION, "{\"prompt\":\"x\",\"prompt_logprobs\":5}", &r, &why));
	T_CHECK(r.prompt_logprobs && r.prompt_top_logprobs == 5 && !r.score_only);
	oai_request_free(&r);
	T_CHECK(parse(OAI_COMPLETION, "{\"prompt\":\"x\",\"prompt_logprobs\":null}", &r, &why));
	T_CHECK(!r.prompt_logprobs);
	oai_request_free(&r);
	T_CHECK(parse(OAI_CHAT, chat("\"prompt_logprobs\":0,\"max_tokens\":0"), &r, &why));
	T_CHECK(r.prompt_logprobs && !r.prompt_top_logprobs && r.score_only);
	oai_request_free(&r);
	expect_refused(OAI_COMPLETION, "{\"prompt\":\"x\",\"max_tokens\":0}", "max_tokens");
	expect_refused(OAI_COMPLETION, "{\"prompt\":\"x\",\"prompt_logprobs\":21}", "prompt_logprobs");
	expect_refused(OAI_COMPLETION, "{\"prompt\":\"x\",\"prompt_logprobs\":-1}", "prompt_logprobs");
	expect_refused(OAI_CHAT, chat("\"prompt_logprobs\":1,\"stream\":true"), "prompt_logprobs");
	expect_refused(OAI_CHAT, chat("\"prompt_logprobs\":true"), "prompt_logprobs");
	expect_refused(OAI_COMPLETION, "{\"prompt\":\"x\",\"max_completion_tokens\":3}", "max_completion_tokens");
	expect_refused(OAI_COMPLETION, "{\"prompt\":\"x\",\"top_logprobs\":3}", "top_logprobs");
	{
		char big[1024] = "{\"prompt\":[";
		for (int i = 0; i < OAI_MAX_PROMPTS + 1; i++)
			strcat(big, i ? ",\"p\"" : "\"p\"");
		strcat(big, "]}");
		expect_refused(OAI_COMPLETION, big, "prompt");
	}
}

static void test_tokenize(void)
{
	struct oai_tokenize_request t;
	struct oai_error why;
	const char *b = "{\"model\":\"m\",\"prompt\":\"hello\",\"add_special_tokens\":false,\"return_token_strs\":true}";
	T_CHECK(oai_parse_tokenize(b, strlen(b), &t, &why) == ST_OK);
	T_CHECK(!t.is_chat && t.prompt_len == 5 && !t.add_special_tokens && t.return_token_strs && !strcmp(t.model, "m"));
	oai_tokenize_request_free(&t);
	b = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":{\"thinking\":true}}";
	T_CHECK(oai_parse_tokenize(b, strlen(b), &t, &why) == ST_OK);
	T_CHECK(t.is_chat && t.chat.n_messages == 1 && t.chat.thinking);
	oai_tokenize_request_free(&t);
	const char *bad[] = {"{}", "{\"prompt\":1}", "{\"prompt\":\"x\",\"n\":2}",
			     "{\"prompt\":\"x\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		T_CHECKF(oai_parse_tokenize(bad[i], strlen(bad[i]), &t, &why) != ST_OK, "%s", bad[i]);
		T_CHECK(why.status == 400);
	}

	struct oai_detokenize_request d;
	b = "{\"tokens\":[1,2,999],\"model\":\"m\"}";
	T_CHECK(oai_parse_detokenize(b, strlen(b), VOCAB, &d, &why) == ST_OK);
	T_CHECK(d.n_tokens == 3 && d.tokens[2] == 999 && !strcmp(d.model, "m"));
	oai_detokenize_request_free(&d);
	const char *dbad[] = {"{}", "{\"tokens\":[1000]}", "{\"tokens\":\"1\"}", "{\"tokens\":[1],\"x\":1}",
			      "{\"tokens\":[-1]}", "[]"};
	for (size_t i = 0; i < sizeof dbad / sizeof dbad[0]; i++) {
		T_CHECKF(oai_parse_detokenize(dbad[i], strlen(dbad[i]), VOCAB, &d, &why) != ST_OK, "%s", dbad[i]);
		T_CHECK(why.status == 400);
	}
}

/* Random mutations of valid bodies: every outcome is fine except a crash or leak (ASan). */
static void test_fuzz(uint64_t seed)
{
	const char *bases[] = {
		"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi\"}]}],\"n\":2,"
		"\"stop\":[\"x\"],\"logit_bias\":{\"3\":1},\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}",
		"{\"prompt\":[[1,2],[3]],\"logprobs\":2,\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
	};
	uint64_t x = seed;
	int n_ok = 0;
	for (int it = 0; it < 3000; it++) {
		const char *base = bases[it & 1];
		size_t n = strlen(base);
		char buf[512];
		memcpy(buf, base, n + 1);
		int muts = 1 + (int)(x % 3);
		for (int m = 0; m < muts; m++) {
			x = x * 6364136223846793005ull + 1442695040888963407ull;
			size_t pos = (size_t)(x >> 33) % n;
			buf[pos] = "{}[]\",:0 9a-\\\x80\xff"[(x >> 20) % 16];
		}
		struct oai_request r;
		struct oai_error why;
		if (oai_parse_request((it & 1) ? OAI_COMPLETION : OAI_CHAT, buf, n, VOCAB, &r, &why) == ST_OK) {
			n_ok++;
			oai_request_free(&r);
		} else {
			T_CHECK(why.status == 400 && why.message[0]);
		}
	}
	T_CHECK(n_ok < 3000);
}

int main(void)
{
	uint64_t seed = (uint64_t)time(NULL) ^ (uint64_t)clock();
	fprintf(stderr, "seed %llu\n", (unsigned long long)seed);
	test_defaults();
	test_every_parameter();
	test_messages();
	test_completions();
	test_refusals_body();
	test_structured_accepted();
	test_refusals_options();
	test_refusals_ranges();
	test_refusals_lists();
	test_refusals_messages();
	test_refusals_completion();
	test_prompt_logprobs();
	test_tokenize();
	test_fuzz(seed);
	return test_exit();
}
