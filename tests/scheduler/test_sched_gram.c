/*
 * tests/scheduler/test_sched_gram.c: structured outputs through the
 * scheduler (sched_request_params.grammar) over the fake executor, whose
 * random logits make unconstrained output gibberish. Token i >= 2 is byte i;
 * 1 is eos. Every choice that stops must be complete JSON of the schema's
 * shape; one cut by max_tokens must be a prefix the grammar accepts. A small
 * KV cache forces preemption (the grammar state must survive recompute), and
 * n = 2 gives each choice its own state.
 */
#include <jansson.h>
#include <stdio.h>
#include <time.h>

#include "harness.h"
#include "model/gram.h"

static const char *piece(void *ctx, int32_t id, size_t *len)
{
	static char bytes[256];
	(void)ctx;
	if (id < 0x20 && id != '\n')
		return NULL;
	if (id == 0x7f || id > 255)
		return NULL;
	bytes[id] = (char)id;
	*len = 1;
	return &bytes[id];
}

static const char schema[] =
	"{\"type\":\"object\",\"properties\":{\"a\":{\"enum\":[\"x\",\"yy\",3]},\"b\":{\"type\":\"boolean\"},"
	"\"c\":{\"type\":\"integer\"},\"d\":{\"type\":\"array\",\"items\":{\"type\":\"null\"},\"maxItems\":3}},"
	"\"required\":[\"a\",\"b\",\"c\",\"d\"],\"additionalProperties\":false}";

static void text_of(const struct h_choice *c, char *out, size_t *len)
{
	*len = 0;
	for (uint32_t i = 0; i < c->n; i++)
		if (c->toks[i] != 1)
			out[(*len)++] = (char)c->toks[i];
	out[*len] = 0;
}

int main(void)
{
	uint64_t seed = h_seed();
	struct fake_exec_options fo = h_default_fake();
	fo.n_blocks = 14;
	fo.block_tokens = 16;
	fo.eos_bias = 2.0f; /* eos is likely wherever the grammar allows it */
	struct harness h;
	if (h_open(&h, &fo, NULL))
		return 1;
	struct gram_vocab *v = NULL;
	struct err e = {0};
	struct gram_vocab_options vo = {.n_tokens = 256, .piece = piece, .eos_id = 1};
	T_CHECK(gram_vocab_create(&v, &vo, &e) == ST_OK);
	struct gram *gs = NULL, *go = NULL;
	T_CHECK(gram_compile_json_schema(&gs, schema, strlen(schema), &e) == ST_OK);
	T_CHECK(gram_compile_json_object(&go, &e) == ST_OK);
	enum { NR = 8 };
	struct h_req *r[NR];
	uint64_t rng = seed;
	for (int i = 0; i < NR; i++) {
		int32_t prompt[40];
		h_rand_tokens(prompt, 20 + i, 256, &rng);
		r[i] = h_req_new(prompt, 20 + i, 2, i % 2 ? 60 : 180, h_sp(1.0f, seed + (uint64_t)i));
		if (i == 3)
			r[i]->min_tokens = 5;
		struct sched_request_params p = h_params(r[i]);
		p.grammar = i % 4 == 1 ? go : gs;
		p.gram_vocab = v;
		enum sched_refusal why;
		T_CHECK(sched_submit(h.s, &p, &r[i]->id, &why, &e) == ST_OK);
	}
	h_run(&h, 5000);
	T_CHECK(h.f.error[0] == 0);
	int n_stop = 0, n_len = 0;
	for (int i = 0; i < NR; i++) {
		bool object = i % 4 == 1;
		for (uint32_t c = 0; c < r[i]->n; c++) {
			const struct h_choice *ch = &r[i]->ch[c];
			char text[H_MAX_OUT + 1];
			size_t len;
			text_of(ch, text, &len);
			T_CHECK(ch->finished);
			if (ch->fin.finish == SCHED_FINISH_STOP) {
				n_stop++;
				json_t *x = json_loadb(text, len, 0, NULL);
				T_CHECK(x && json_is_object(x));
				if (!object && x) {
					T_CHECK(json_is_boolean(json_object_get(x, "b")));
					T_CHECK(json_is_integer(json_object_get(x, "c")));
					T_CHECK(json_is_array(json_object_get(x, "d")) &&
						json_array_size(json_object_get(x, "d")) <= 3);
					json_t *a = json_object_get(x, "a");
					T_CHECK(a && (json_is_string(a) || json_integer_value(a) == 3));
				}
				if (!x)
					printf("request %d choice %u: not JSON: %s\n", i, c, text);
				json_decref(x);
			} else {
				T_CHECKF(ch->fin.finish == SCHED_FINISH_LENGTH, "request %d choice %u finish %s n %u", i, c,
					 sched_finish_reason_str(ch->fin.finish), ch->n);
				n_len++;
				struct gram_state *st = NULL;
				T_CHECK(gram_state_create(&st, object ? go : gs, v, &e) == ST_OK);
				if (st)
					T_CHECK(gram_state_accept_bytes(st, text, len) == ST_OK);
				gram_state_destroy(st);
			}
		}
	}
	struct sched_stats stats;
	sched_stats_get(h.s, &stats);
	printf("seed %llu: %d stopped (complete JSON), %d cut by length, %llu preemptions\n",
	       (unsigned long long)seed, n_stop, n_len, (unsigned long long)stats.n_preemptions);
	T_CHECK(n_stop >= 4);
	for (int i = 0; i < NR; i++)
		h_req_free(r[i]);
	h_close(&h);
	gram_release(gs);
	gram_release(go);
	gram_vocab_destroy(v);
	return test_exit();
}
