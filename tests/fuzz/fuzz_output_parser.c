/*
 * tests/fuzz/fuzz_output_parser.c: libFuzzer target for the DSML / reasoning
 * output parser (model/output_parser.h). The first byte sets thinking mode
 * and a split seed; the rest is generated text. Checked, besides memory
 * safety: the text fed in one piece and fed in random small pieces gives the
 * same reasoning, content, tool names and arguments (the header's promise),
 * and every tool call's arguments are a valid JSON object. A violation
 * aborts (a libFuzzer finding).
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/output_parser.h"

#define MAX_CALLS 64

struct buf {
	char *p;
	size_t n, cap;
};

struct out {
	struct buf reasoning, content, args[MAX_CALLS], names;
	size_t n_calls;
	int finished;
};

static void buf_add(struct buf *b, const char *s, size_t n)
{
	if (b->n + n + 1 > b->cap) {
		size_t cap = (b->n + n + 1) * 2;
		char *p = realloc(b->p, cap);
		if (!p)
			abort();
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->n, s, n);
	b->n += n;
	b->p[b->n] = '\0';
}

static void emit(void *user, const struct model_oparse_event *ev)
{
	struct out *o = user;
	switch (ev->kind) {
	case MODEL_OPARSE_REASONING:
		buf_add(&o->reasoning, ev->text, ev->len);
		break;
	case MODEL_OPARSE_CONTENT:
		buf_add(&o->content, ev->text, ev->len);
		break;
	case MODEL_OPARSE_TOOL_CALL_START:
		if (ev->tool_index != o->n_calls) {
			fprintf(stderr, "tool index %zu, expected %zu\n", ev->tool_index, o->n_calls);
			abort();
		}
		buf_add(&o->names, ev->tool_name, strlen(ev->tool_name) + 1);
		o->n_calls++;
		break;
	case MODEL_OPARSE_TOOL_CALL_ARGS:
		if (ev->tool_index >= o->n_calls) {
			fprintf(stderr, "arguments for tool %zu before its start\n", ev->tool_index);
			abort();
		}
		if (ev->tool_index < MAX_CALLS)
			buf_add(&o->args[ev->tool_index], ev->text, ev->len);
		break;
	case MODEL_OPARSE_FINISH:
		o->finished++;
		break;
	}
}

static void run(const char *text, size_t n, int in_reasoning, uint32_t seed, struct out *o)
{
	memset(o, 0, sizeof *o);
	struct model_oparse_options opt = {.emit = emit, .user = o, .in_reasoning = in_reasoning != 0,
					   .max_tag_bytes = 64, .max_value_bytes = 256, .call_id_seed = 1};
	struct model_oparse *p = NULL;
	struct err e = {0};
	if (model_oparse_create(&p, &opt, &e) != ST_OK)
		abort();
	size_t at = 0;
	while (at < n) {
		size_t take = n - at;
		if (seed) {
			seed = seed * 1103515245u + 12345u;
			take = 1 + (seed >> 16) % 9;
			if (take > n - at)
				take = n - at;
		}
		if (model_oparse_feed(p, text + at, take) != ST_OK)
			abort();
		at += take;
	}
	if (model_oparse_finish(p) != ST_OK)
		abort();
	model_oparse_destroy(p);
	if (o->finished != 1)
		abort();
}

static int same(const struct buf *a, const struct buf *b)
{
	return a->n == b->n && (a->n == 0 || !memcmp(a->p, b->p, a->n));
}

static void out_free(struct out *o)
{
	free(o->reasoning.p);
	free(o->content.p);
	free(o->names.p);
	for (int i = 0; i < MAX_CALLS; i++)
		free(o->args[i].p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	int in_reasoning = data[0] & 1;
	uint32_t seed = (uint32_t)data[0] | 0x100u;
	const char *text = (const char *)data + 1;
	size_t n = size - 1;
	static struct out whole, split;
	run(text, n, in_reasoning, 0, &whole);
	run(text, n, in_reasoning, seed, &split);
	if (!same(&whole.reasoning, &split.reasoning) || !same(&whole.content, &split.content) ||
	    whole.n_calls != split.n_calls || !same(&whole.names, &split.names)) {
		fprintf(stderr, "split input changed the output: reasoning %zu/%zu content %zu/%zu calls %zu/%zu\n",
			whole.reasoning.n, split.reasoning.n, whole.content.n, split.content.n, whole.n_calls,
			split.n_calls);
		abort();
	}
	for (size_t i = 0; i < whole.n_calls && i < MAX_CALLS; i++) {
		if (!same(&whole.args[i], &split.args[i])) {
			fprintf(stderr, "split input changed tool %zu's arguments:\n%.*s\nvs\n%.*s\n", i,
				(int)whole.args[i].n, whole.args[i].p ? whole.args[i].p : "", (int)split.args[i].n,
				split.args[i].p ? split.args[i].p : "");
			abort();
		}
		json_error_t je;
		/* Integers beyond 64 bits and reals beyond double are valid JSON
		 * that jansson cannot hold: read the first as reals, accept the
		 * second's error (the syntax was fine up to it). */
		json_t *j = json_loadb(whole.args[i].p ? whole.args[i].p : "", whole.args[i].n,
				       JSON_DECODE_ANY | JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &je);
		if (!j && strstr(je.text, "overflow"))
			continue;
		if (!j || !json_is_object(j)) {
			fprintf(stderr, "tool %zu's arguments are not a JSON object (%s): %.*s\n", i, je.text,
				(int)whole.args[i].n, whole.args[i].p ? whole.args[i].p : "");
			abort();
		}
		json_decref(j);
	}
	out_free(&whole);
	out_free(&split);
	return 0;
}
